//! Files that are replaced whole or not at all: weights and checkpoints are written to a
//! temporary file in the target's directory, flushed to disk, then renamed over the target, so
//! a full disk, a quota or a crash half-way leaves the previous file as it was.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Tells apart the temporary files of one process (threads may save at once).
static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

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
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    parent_dir(path).join(format!(".{name}.tmp-{}-{n}-{ns}", std::process::id()))
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, `fsync`ed, then
/// renamed over `path` (and, on Unix, the directory `fsync`ed so the rename itself survives a
/// crash). On error the temporary file is removed and `path` is untouched.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let temp = temp_path(path);
    let written =
        write_and_sync(&temp, bytes).and_then(|()| fs::rename(&temp, path).map_err(io_error(path)));
    if written.is_err() {
        // Best effort: the temporary file may not exist (create failed) or be unremovable.
        let _ = fs::remove_file(&temp);
        return written;
    }
    sync_dir(parent_dir(path))
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
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error(dir))
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<()> {
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
}
