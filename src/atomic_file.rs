//! Files that are replaced whole or not at all: weights, checkpoints and the autotune cache
//! are written to a temporary file in the target's directory, flushed to disk, then renamed
//! over the target, so a full disk, a quota or a crash half-way leaves the previous file as it
//! was. A save that was killed leaves its temporary file behind; the next save to the same
//! target removes it.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};

/// Tells apart the temporary files of one process (threads may save at once).
static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

/// How long a dead process's temporary file must have gone unwritten before a save removes it.
/// A process in another PID namespace (a container sharing the directory) may be saving right
/// now under a PID that this one's `/proc` does not show; an hour outlasts any write and `fsync`
/// of a checkpoint, and a killed save's file is still gone by the first save after that.
const STALE_AFTER: Duration = Duration::from_secs(60 * 60);

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The directory holding `path` (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// `dir/.name.tmp-<pid>-<n>-<ns>`: hidden, beside the target (a rename is atomic only within
/// one file system), and unique to this process and call. The clock's nanoseconds tell apart
/// processes of one PID in different PID namespaces (containers sharing a directory); the file
/// is created exclusively anyway, so a name taken or planted fails the write, never follows.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = NEXT_TEMP.fetch_add(1, Ordering::Relaxed);
    let ns = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let prefix = temp_prefix(&name);
    parent_dir(path).join(format!("{prefix}{}-{n}-{ns}", std::process::id()))
}

/// What every temporary file of a save to the target named `name` starts with.
fn temp_prefix(name: &str) -> String {
    format!(".{name}.tmp-")
}

/// The PID in `file_name` when it is a temporary file of a save to the target named `target`:
/// exactly [`temp_path`]'s `.<target>.tmp-<pid>-<n>-<ns>`, the three numbers in plain digits (so
/// no other target's temporary file, nor any other file, matches).
fn temp_owner(file_name: &str, target: &str) -> Option<u32> {
    let rest = file_name.strip_prefix(&temp_prefix(target))?;
    let parts: Vec<&str> = rest.split('-').collect();
    let decimal = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    match parts[..] {
        [pid, _, _] if parts.iter().all(decimal) => pid.parse().ok(),
        _ => None,
    }
}

/// Removes the temporary files that killed saves to `path` left behind: those named for this
/// target (see [`temp_owner`]) whose process has ended and that went unwritten for
/// [`STALE_AFTER`]. A file of a live process, this one included, is never touched (nor one
/// whose PID a new process has taken: it waits until that one ends); where liveness cannot be
/// told (no `/proc`) nothing is. Best effort: what cannot be removed is logged and left.
fn remove_stale_temps(path: &Path) {
    // A name that is not UTF-8 reached temp_path lossily, so several targets could share its
    // temporary names: leave them all.
    let Some(target) = path.file_name().and_then(|n| n.to_str()) else {
        return;
    };
    let dir = parent_dir(path);
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            log::debug!(
                "not looking for stale temporary files in {}: {e}",
                dir.display()
            );
            return;
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| temp_owner(n, target)) else {
            continue;
        };
        if !crate::process::has_ended(pid) || !unwritten_for(&entry, STALE_AFTER) {
            continue;
        }
        match fs::remove_file(entry.path()) {
            Ok(()) => log::debug!(
                "removed {}, left by a save of process {pid}, which has ended",
                entry.path().display()
            ),
            // Another save removed it first.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => log::warn!(
                "cannot remove {}, left by a save of process {pid}, which has ended: {e}",
                entry.path().display()
            ),
        }
    }
}

/// Whether `entry` is a regular file (not a link or a directory) last modified `age` or more
/// ago; a time that cannot be read, or lies in the future, is not old.
fn unwritten_for(entry: &fs::DirEntry, age: Duration) -> bool {
    entry
        .metadata()
        .ok()
        .filter(fs::Metadata::is_file)
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|elapsed| elapsed >= age)
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, `fsync`ed, then
/// renamed over `path` (and, on Unix, the directory `fsync`ed so the rename itself survives a
/// crash). [`Sequential::save_weights`](crate::nn::Sequential::save_weights), the checkpoints
/// and [`CsvLogger`](crate::nn::CsvLogger) save through it; a program's own result files
/// (a run's summary, a chart) can too, so that a run killed or out of disk space never leaves
/// a torn file: readers see the previous file or the new one.
///
/// Temporary files that earlier, killed saves to `path` left behind are removed first (those
/// of processes that have ended, unwritten for an hour).
///
/// `Ok` means `path` now holds `bytes`. On error the temporary file is removed and `path` is
/// untouched. A failed `fsync` of the directory after the rename is not an error, since the file
/// was replaced; it is logged as a warning, because the rename may not survive a power loss.
///
/// ```
/// let dir = std::env::temp_dir().join(format!("anygpu-doc-atomic-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let path = dir.join("history.json");
/// anygpu::nn::write_atomically(&path, br#"{"loss": [0.5]}"#)?;
/// anygpu::nn::write_atomically(&path, br#"{"loss": [0.5, 0.4]}"#)?;
/// assert_eq!(std::fs::read(&path)?, br#"{"loss": [0.5, 0.4]}"#);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`Error::Io`] naming the file that could not be written or renamed (a missing directory,
/// no permission, a full disk).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomically_with(path, bytes, sync_dir)
}

/// [`write_atomically`], with the directory's `fsync` passed in so that a test can fail it.
fn write_atomically_with(
    path: &Path,
    bytes: &[u8],
    sync_dir: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<()> {
    // Before writing: on a full disk, the space a killed save held may be what this one needs.
    remove_stale_temps(path);
    let temp = temp_path(path);
    let written =
        write_and_sync(&temp, bytes).and_then(|()| fs::rename(&temp, path).map_err(io_error(path)));
    if written.is_err() {
        // Best effort: the temporary file may not exist (create failed) or be unremovable.
        let _ = fs::remove_file(&temp);
        return written;
    }
    let dir = parent_dir(path);
    if let Err(e) = sync_dir(dir) {
        // Readers already see the new file: an error would tell callers the save failed (a
        // retry, a lost checkpoint reported) when only its durability is in doubt.
        log::warn!(
            "saved {}, but syncing its directory {} failed ({e}): the rename may not survive a \
             power loss",
            path.display(),
            dir.display()
        );
    }
    Ok(())
}

fn write_and_sync(temp: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(temp)
        .map_err(io_error(temp))?;
    file.write_all(bytes).map_err(io_error(temp))?;
    file.sync_all().map_err(io_error(temp))
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir).and_then(|d| d.sync_all())
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> std::io::Result<()> {
    // Windows cannot open a directory as a file; its rename is flushed with the file system.
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("anygpu-atomic-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("the temp dir is writable");
        dir
    }

    #[test]
    fn a_save_replaces_the_file_and_leaves_no_temporary_behind() {
        let dir = scratch("replace");
        let target = dir.join("w.bin");
        fs::write(&target, b"old").unwrap();
        write_atomically(&target, b"new contents").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"new contents");
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["w.bin"], "only the target is left in the directory");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failed_rename_keeps_the_old_target_and_removes_the_temporary() {
        // A directory where the file should go: the rename fails (as root too), after the
        // temporary file was fully written.
        let dir = scratch("rename-fails");
        let target = dir.join("w.bin");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("inside"), b"keep").unwrap();
        let err = write_atomically(&target, b"new").unwrap_err();
        assert!(err.to_string().contains("w.bin"), "{err}");
        assert_eq!(fs::read(target.join("inside")).unwrap(), b"keep");
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["w.bin"], "the temporary file is removed on failure");
        let _ = fs::remove_dir_all(&dir);
    }

    /// Above Linux's `PID_MAX_LIMIT` (2^22), which bounds `/proc/sys/kernel/pid_max`: no
    /// process has this PID, now or later.
    #[cfg(target_os = "linux")]
    const DEAD_PID: u32 = (1 << 22) + 1;

    /// Writes `path` and dates it `age` back, as a killed save's temporary file would be.
    fn planted(path: &Path, age: Duration) {
        fs::write(path, b"half a checkpoint").unwrap();
        let file = File::options().write(true).open(path).unwrap();
        file.set_modified(SystemTime::now() - age).unwrap();
    }

    fn sorted_names(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_killed_saves_temporary_file_is_removed_by_the_next_save() {
        assert!(!Path::new("/proc").join(DEAD_PID.to_string()).exists());
        let dir = scratch("stale");
        let target = dir.join("w.bin");
        planted(
            &dir.join(format!(".w.bin.tmp-{DEAD_PID}-3-123456789")),
            2 * STALE_AFTER,
        );
        write_atomically(&target, b"new").unwrap();
        assert_eq!(sorted_names(&dir), ["w.bin"]);
        let _ = fs::remove_dir_all(&dir);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_save_leaves_temporaries_of_live_processes_other_targets_and_recent_writes() {
        let dir = scratch("kept");
        let target = dir.join("w.bin");
        let own = std::process::id();
        let old = 2 * STALE_AFTER;
        let kept = [
            // This process's own (a save on another thread, say).
            format!(".w.bin.tmp-{own}-7-0"),
            // A dead process's, but for another target, or not in the temporary files' form.
            format!(".other.bin.tmp-{DEAD_PID}-0-0"),
            format!(".w.bin.tmp-{DEAD_PID}-0"),
            format!(".w.bin.tmp-+{DEAD_PID}-0-0"),
            format!("w.bin.tmp-{DEAD_PID}-0-0"),
        ];
        for name in &kept {
            planted(&dir.join(name), old);
        }
        // A dead PID's, but written just now: maybe a live process in another PID namespace.
        let recent = format!(".w.bin.tmp-{DEAD_PID}-1-0");
        planted(&dir.join(&recent), Duration::ZERO);
        // The one that goes, so this save is seen to clean up.
        planted(&dir.join(format!(".w.bin.tmp-{DEAD_PID}-2-0")), old);

        write_atomically(&target, b"new").unwrap();
        let mut expected: Vec<String> = kept.into_iter().chain([recent, "w.bin".into()]).collect();
        expected.sort();
        assert_eq!(sorted_names(&dir), expected);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failed_directory_sync_after_the_rename_still_reports_the_save() {
        let dir = scratch("dir-sync-fails");
        let target = dir.join("w.bin");
        fs::write(&target, b"old").unwrap();
        let failing_sync = |_: &Path| Err(std::io::Error::other("injected fsync failure"));
        write_atomically_with(&target, b"new", failing_sync)
            .expect("the file was replaced, so the save succeeded");
        assert_eq!(fs::read(&target).unwrap(), b"new");
        assert_eq!(sorted_names(&dir), ["w.bin"]);
        let _ = fs::remove_dir_all(&dir);
    }
}
