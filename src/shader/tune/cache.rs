//! The autotune cache file: one per adapter under the cache directory (checked private with
//! `private_fs`), read bounded, parsed strictly (entries of this build only), saved by merging
//! with what other processes saved, under a lock file, through `atomic_file`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::Error;
use crate::private_fs;

use super::{DecisionSource, Tuner, TunerState, TuningDecision};

impl Tuner {
    /// Writes every measured choice of this build to the cache file, with the entries of this
    /// build other processes saved there meanwhile (theirs where this process has none);
    /// failures are a warning, once.
    pub(super) fn save(&self) {
        let Some(path) = &self.file else { return };
        if let Err(e) = self.merge_into(path) {
            let mut state = self.lock();
            if !state.warned {
                state.warned = true;
                log::warn!(
                    "autotune cache {} not written ({e}); choices are kept in memory",
                    path.display()
                );
            }
        }
    }

    /// Reads `path`, adds this process's choices and replaces it: through a new temporary file
    /// renamed over it (a reader never sees half a file; a link planted in the directory is
    /// never followed), under a lock file so that processes saving at once each add to the
    /// other's file rather than overwrite it.
    fn merge_into(&self, path: &Path) -> std::result::Result<(), String> {
        let dir = path.parent().unwrap_or(Path::new("."));
        private_fs::ensure_private(dir).map_err(|e| e.to_string())?;
        let lock = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.with_extension("lock"))
            .map_err(|e| format!("lock file: {e}"))?;
        // Held until `lock` is dropped (closed) at the end. File systems without locks (some
        // network ones) still get a whole file, only perhaps without the other's entries.
        if let Err(e) = lock.lock() {
            log::debug!("autotune cache {} not locked: {e}", path.display());
        }
        // A corrupt file is replaced: its entries are lost either way.
        let on_disk = load(path, &self.build).unwrap_or_default();
        let mut entries: BTreeMap<(String, String), String> = on_disk
            .into_iter()
            .map(|(op, class, candidate)| ((op, class), candidate))
            .collect();
        {
            let state = self.lock();
            for (op, by_class) in &state.choices {
                for (class, known) in by_class.iter().filter(|(_, k)| k.persist) {
                    entries.insert((op.clone(), class.clone()), known.candidate.clone());
                }
            }
        }
        let mut text = format!("{HEADER}\n");
        for ((op, class), candidate) in &entries {
            text.push_str(&format!("{}|{op}|{class}\t{candidate}\n", self.build));
        }
        crate::atomic_file::write_atomically(path, text.as_bytes()).map_err(|e| e.to_string())
    }
}

/// The known choice for (op, class) if it is among `candidates`, listed as cached on its first
/// use.
pub(super) fn cached_in(
    state: &mut TunerState,
    op: &'static str,
    class: &str,
    candidates: &[&'static str],
) -> Option<&'static str> {
    let known = state.choices.get_mut(op)?.get_mut(class)?;
    let pick = candidates
        .iter()
        .find(|c| **c == known.candidate)
        .copied()?;
    if !known.listed {
        known.listed = true;
        state.decisions.push(TuningDecision {
            op,
            class: class.to_string(),
            candidate: pick.to_string(),
            timings_ms: Vec::new(),
            source: DecisionSource::Cached,
        });
    }
    Some(pick)
}

/// Whether the cache directory `dir` may be used: missing (it is created private on the first
/// save), or a directory of this user that no one else can write to. A refusal is a warning.
pub(super) fn usable_dir(dir: &Path) -> bool {
    match private_fs::check_private(dir) {
        Ok(()) => true,
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => {
            log::warn!("autotune cache not used ({e}); tuning in memory");
            false
        }
    }
}

/// The largest cache file read: a few kilobytes are usual, a larger file is not ours.
pub(super) const MAX_CACHE_BYTES: u64 = 4 << 20;

/// The first line of a cache file.
pub(super) const HEADER: &str = "# anygpu autotune cache v1: key<TAB>candidate";

/// Reads a cache file: the (op, class, candidate) entries of this build only. A missing file is
/// empty; anything that is not our format is an error (the caller warns and tunes in memory).
pub(super) fn load(
    path: &std::path::Path,
    build: &str,
) -> std::io::Result<Vec<(String, String, String)>> {
    let Some(text) = private_fs::read_regular(path, MAX_CACHE_BYTES)? else {
        return Ok(Vec::new());
    };
    parse_cache(&text, build)
}

/// The (op, class, candidate) entries of build `build` in the bytes of a cache file; anything
/// that is not our format (not UTF-8, another header, a malformed line) is an error. Public for
/// the fuzz targets only.
///
/// # Errors
/// An error saying what is not our format.
#[doc(hidden)]
pub fn parse_cache(bytes: &[u8], build: &str) -> std::io::Result<Vec<(String, String, String)>> {
    let text = std::str::from_utf8(bytes).map_err(|_| std::io::Error::other("not UTF-8"))?;
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err(std::io::Error::other("not an anygpu autotune cache"));
    }
    let mut entries = Vec::new();
    for (i, line) in lines.enumerate() {
        let (key, candidate) = line
            .split_once('\t')
            .filter(|(k, c)| !k.is_empty() && !c.is_empty() && !c.contains('\t'))
            .ok_or_else(|| std::io::Error::other(format!("line {} is malformed", i + 2)))?;
        let ours = key.strip_prefix(build).and_then(|k| k.strip_prefix('|'));
        if let Some((op, class)) = ours.and_then(|k| k.split_once('|')) {
            entries.push((op.to_string(), class.to_string(), candidate.to_string()));
        }
    }
    Ok(entries)
}

/// FNV-1a's starting state.
pub(super) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// 64-bit FNV-1a of `bytes` continuing from state `h`: a stable hash for file names and build
/// keys (std's hasher is seeded per process).
pub(super) fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Letters, digits and `-` of an adapter name, for a file name.
pub(super) fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    s.split('-')
        .filter(|p| !p.is_empty())
        .take(4)
        .collect::<Vec<_>>()
        .join("-")
        .to_lowercase()
}
