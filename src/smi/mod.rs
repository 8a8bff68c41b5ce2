//! `anygpu-smi`'s data: every initialized [`Runtime`](crate::Runtime) publishes its devices and
//! their memory a few times a second, and [`scan`] reads what every live process published (our
//! `nvidia-smi`, over every adapter and over our logical devices and arenas).
//!
//! A runtime writes `<dir>/<pid>-<n>.smi` (a [`Snapshot`]) from a background thread, four times
//! a second, each time to a temporary file renamed over the last, so a reader never sees half
//! a file. The directory ([`default_dir`]) is per user: `$ANYGPU_SMI_DIR`, else
//! `$XDG_RUNTIME_DIR/anygpu-smi`, else `<temp dir>/anygpu-smi-<uid>`, created with mode 0700;
//! one owned by another user or writable by others, or under a parent another user could swap
//! it in, is refused. Only regular files are read, never through a link. The file is removed
//! when the runtime is dropped or the process exits; a killed process's file is removed by the
//! next [`scan`]. `ANYGPU_SMI=0` turns publishing off.
//!
//! ```
//! let dir = std::env::temp_dir().join(format!("anygpu-smi-doc-{}", std::process::id()));
//! let rt = anygpu::Runtime::builder()
//!     .env("ANYGPU_SMI", None)
//!     .env("ANYGPU_SMI_DIR", Some(dir.to_str().unwrap()))
//!     .build()?;
//! // The publisher's first snapshot follows initialization at once.
//! let mut seen = anygpu::smi::scan(&dir)?;
//! for _ in 0..100 {
//!     if !seen.processes.is_empty() { break; }
//!     std::thread::sleep(std::time::Duration::from_millis(20));
//!     seen = anygpu::smi::scan(&dir)?;
//! }
//! let me = &seen.processes[0];
//! assert_eq!(me.pid, std::process::id());
//! assert_eq!(me.devices[0].name, "/device:CPU:0");
//! drop(rt);
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok::<(), anygpu::Error>(())
//! ```

mod dir;
mod publish;
mod snapshot;

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::process;

pub(crate) use publish::{record_step, start, Watched};
pub use snapshot::{DeviceUse, Snapshot, MAX_FILE_BYTES};

/// Where this user's processes publish (see the [module docs](self)), from the process's
/// environment.
///
/// ```
/// let dir = anygpu::smi::default_dir();
/// assert!(dir.is_absolute() || std::env::var_os("ANYGPU_SMI_DIR").is_some());
/// ```
pub fn default_dir() -> PathBuf {
    dir::default_dir(|k| std::env::var(k).ok())
}

/// Seconds since the Unix epoch.
pub(crate) fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What [`scan`] found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scan {
    /// Every live process's snapshot, by PID.
    pub processes: Vec<Snapshot>,
    /// Files skipped (malformed, foreign, too large) or removed (of dead processes), one line
    /// each.
    pub notes: Vec<String>,
}

/// Whether the process that wrote a snapshot (`pid`, started at `started`, last `updated`)
/// still runs: where there is a `/proc`, as [`process::runs`] says; elsewhere, whether it
/// published in the last `STALE_SECONDS`.
fn alive(pid: u32, started: Option<u64>, updated: Option<f64>) -> bool {
    const STALE_SECONDS: f64 = 10.0;
    process::runs(pid, started)
        .unwrap_or_else(|| updated.is_some_and(|t| now() - t < STALE_SECONDS))
}

/// `<pid>-<n>` of a file name `<pid>-<n>.smi` or `.<pid>-<n>.tmp`.
fn pid_of(name: &str) -> Option<(u32, bool)> {
    let (stem, published) = match (name.strip_suffix(".smi"), name.strip_suffix(".tmp")) {
        (Some(stem), _) => (stem, true),
        (_, Some(stem)) => (stem.strip_prefix('.')?, false),
        _ => return None,
    };
    let (pid, n) = stem.split_once('-')?;
    n.parse::<u64>().ok()?;
    Some((pid.parse().ok()?, published))
}

/// Reads a regular file of at most [`MAX_FILE_BYTES`] (a FIFO or a link is refused, not read).
fn read_small(path: &Path) -> std::result::Result<String, String> {
    let bytes = crate::private_fs::read_regular(path, MAX_FILE_BYTES)
        .map_err(|e| e.to_string())?
        .ok_or("removed meanwhile")?;
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text".into())
}

/// Reads every snapshot in `dir`: live processes' are returned, sorted by PID; files of dead
/// processes are removed; anything else is skipped with a note. A missing directory is empty.
///
/// # Errors
/// `InvalidArgument` when `dir` is owned by another user, writable by others, not a directory,
/// or under a parent another user could swap it in (its files could be anyone's); `Io` when it
/// or a parent cannot be looked at.
pub fn scan(dir: &Path) -> Result<Scan> {
    let mut scan = Scan::default();
    if !dir.exists() {
        return Ok(scan);
    }
    dir::check_private(dir)?;
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((pid, published)) = pid_of(&name) else {
            scan.notes
                .push(format!("{name}: not an anygpu-smi file; skipped"));
            continue;
        };
        if !published {
            // A writer's temporary file: only a dead writer's is ours to remove.
            if process::has_ended(pid) {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        let parsed = read_small(&path).and_then(|t| Snapshot::parse(&t));
        let updated = parsed.as_ref().ok().map(|s| s.updated);
        let started = parsed.as_ref().ok().and_then(|s| s.started);
        if !alive(pid, started, updated) {
            match std::fs::remove_file(&path) {
                Ok(()) => scan
                    .notes
                    .push(format!("{name}: process {pid} has ended; removed")),
                Err(e) => scan.notes.push(format!(
                    "{name}: process {pid} has ended; cannot remove: {e}"
                )),
            }
            continue;
        }
        match parsed {
            Ok(s) if s.pid == pid => scan.processes.push(s),
            Ok(s) => scan
                .notes
                .push(format!("{name}: says pid {}, not {pid}; skipped", s.pid)),
            Err(e) => scan.notes.push(format!("{name}: {e}; skipped")),
        }
    }
    scan.processes.sort_by_key(|s| s.pid);
    scan.notes.sort();
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_fifo_or_a_link_under_a_snapshots_name_is_skipped_without_blocking() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("anygpu-smi-scan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let me = std::process::id();
        let fifo = dir.join(format!("{me}-0.smi"));
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", fifo.display());
        // A good snapshot outside the directory, linked in: a link could point anywhere.
        let good = Snapshot {
            pid: me,
            updated: 1.8e9,
            ..Snapshot::default()
        };
        let outside = dir.with_extension("outside");
        std::fs::write(&outside, good.to_text()).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join(format!("{me}-1.smi"))).unwrap();
        std::fs::write(dir.join(format!("{me}-2.smi")), good.to_text()).unwrap();

        // In a thread: were the FIFO opened for a blocking read, this would wait for a writer
        // forever; the test fails after a few seconds instead (the thread is left behind).
        let (tx, rx) = std::sync::mpsc::channel();
        let scanned = dir.clone();
        std::thread::spawn(move || tx.send(scan(&scanned)));
        let scan = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("scan returns though a FIFO is in the directory")
            .unwrap();
        assert_eq!(scan.processes, vec![good], "{scan:?}");
        for n in 0..2 {
            let note = format!("{me}-{n}.smi: not a regular file");
            assert!(
                scan.notes.iter().any(|n| n.starts_with(&note)),
                "{note}: {:?}",
                scan.notes
            );
        }
        std::fs::remove_file(&outside).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn file_names_give_the_writers_pid() {
        assert_eq!(pid_of("42-0.smi"), Some((42, true)));
        assert_eq!(pid_of(".42-3.tmp"), Some((42, false)));
        assert_eq!(pid_of("42.smi"), None);
        assert_eq!(pid_of("x-1.smi"), None);
        assert_eq!(pid_of("notes.txt"), None);
    }
}
