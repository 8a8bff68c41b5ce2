//! Files only this user can have written: a directory owned by this user that no one else can
//! write to, and bounded reads of the regular files in it. `anygpu-smi`'s snapshot directory
//! and the autotune cache both live in such a directory, since anyone who can write there can
//! plant or replace a file a reader trusts, or a link the writer follows.

use std::io::Read as _;
use std::path::Path;

use crate::error::{Error, Result};

/// This process's effective user id: the owner of the files and directories it creates, which
/// is what the ownership checks below compare against.
#[cfg(unix)]
pub(crate) fn current_uid() -> u32 {
    // SAFETY: `geteuid` takes no arguments, touches no memory of ours and cannot fail (POSIX).
    unsafe { libc::geteuid() }
}

fn refused(dir: &Path, why: String) -> Error {
    Error::InvalidArgument(format!("refusing directory {}: {why}", dir.display()))
}

/// Creates `dir` (mode 0700) when missing, then checks it is a directory of this user that no
/// one else can write to.
///
/// # Errors
/// `InvalidArgument` naming the directory and what is wrong; `Io` when it cannot be created.
pub(crate) fn ensure_private(dir: &Path) -> Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    check_private(dir)
}

/// Checks, without creating anything, that `dir` is a real directory (not a link) owned by this
/// user and writable by no one else, under parents no other user can change.
///
/// # Errors
/// As [`ensure_private`]; the error names the parent when a parent is at fault.
pub(crate) fn check_private(dir: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(refused(dir, "not a directory (or a symbolic link)".into()));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let mine = current_uid();
        if meta.uid() != mine {
            return Err(refused(
                dir,
                format!("owned by uid {}, not by this user (uid {mine})", meta.uid()),
            ));
        }
        let mode = meta.mode() & 0o777;
        if mode & 0o022 != 0 {
            return Err(refused(
                dir,
                format!("writable by others (mode {mode:o}); chmod 700 it"),
            ));
        }
        check_ancestors(dir)?;
    }
    Ok(())
}

/// Checks every directory above `dir`, up to the root, both as written and with its symbolic
/// links resolved: whoever can rename entries in one of them can swap `dir` (or a link on the
/// way to it) for a directory of their own, so each must be owned by root or this user and
/// writable by no one else, unless sticky (`/tmp`: others cannot rename what is ours there).
#[cfg(unix)]
fn check_ancestors(dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    let written = std::path::absolute(dir).map_err(io(dir))?;
    let parent = written.parent().unwrap_or(&written);
    let resolved = std::fs::canonicalize(parent).map_err(io(parent))?;
    let mine = current_uid();
    for ancestor in parent.ancestors().chain(resolved.ancestors()) {
        let meta = std::fs::symlink_metadata(ancestor).map_err(io(ancestor))?;
        if meta.uid() != 0 && meta.uid() != mine {
            return Err(refused(
                ancestor,
                format!(
                    "a parent of {} owned by uid {}, neither root nor this user (uid {mine})",
                    dir.display(),
                    meta.uid()
                ),
            ));
        }
        // A link's own mode means nothing (Linux shows 777); its directory is checked too.
        let mode = meta.mode() & 0o7777;
        if meta.is_dir() && mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(refused(
                ancestor,
                format!(
                    "a parent of {} writable by others without the sticky bit (mode {mode:o})",
                    dir.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Reads the regular file `path` when it holds at most `limit` bytes: `Ok(None)` when it does
/// not exist; an error saying why for a link, FIFO, device, directory or larger file. Never
/// reads more than `limit + 1` bytes and never opens what is not a regular file, so a FIFO
/// cannot hang the caller nor a link to `/dev/zero` or a huge sparse file exhaust its memory.
///
/// The type is checked before opening, the file opened without following a final link and
/// without waiting for a FIFO's writer (`O_NOFOLLOW | O_NONBLOCK`), and the opened file compared
/// with what was checked: swapping it in between needs write access to its directory, which
/// [`check_private`] reserves to this user.
pub(crate) fn read_regular(path: &Path, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    let before = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let refuse = |why: String| Err(std::io::Error::other(why));
    if !before.file_type().is_file() {
        return refuse("not a regular file (a link, FIFO, device or directory)".into());
    }
    if before.len() > limit {
        return refuse(format!("larger than {limit} bytes"));
    }
    let file = open_no_wait(path)?;
    let after = file.metadata()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if (after.dev(), after.ino()) != (before.dev(), before.ino()) {
            return refuse("replaced while being opened".into());
        }
    }
    if !after.file_type().is_file() {
        return refuse("not a regular file".into());
    }
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes)?;
    // The file may have grown since it was measured.
    if bytes.len() as u64 > limit {
        return refuse(format!("larger than {limit} bytes"));
    }
    Ok(Some(bytes))
}

/// Opens `path` for reading without following a final link (`O_NOFOLLOW`) and without waiting
/// for a writer should it be a FIFO (`O_NONBLOCK`; a regular file reads the same with it).
#[cfg(unix)]
fn open_no_wait(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

/// Elsewhere: a plain open (the regular-file checks around it still apply).
#[cfg(not(unix))]
fn open_no_wait(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("anygpu-smi-dir-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_new_directory_is_private() {
        let dir = scratch("new");
        ensure_private(&dir.join("inner")).unwrap();
        let mode = std::fs::metadata(dir.join("inner"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_writable_by_others_is_refused() {
        let dir = scratch("open");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = ensure_private(&dir).unwrap_err().to_string();
        assert!(err.contains("writable by others (mode 777)"), "{err}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o720)).unwrap();
        assert!(
            check_private(&dir).is_err(),
            "group-writable is refused too"
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        check_private(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_of_another_user_is_refused() {
        let uid = current_uid();
        let (dir, cleanup) = if uid == 0 {
            // Root can give a directory away; anyone else finds one of root's.
            let dir = scratch("theirs");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(&dir, Some(65534), None).unwrap();
            (dir, true)
        } else {
            (PathBuf::from("/"), false)
        };
        let err = check_private(&dir).unwrap_err().to_string();
        assert!(err.contains("not by this user"), "{err}");
        if cleanup {
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn a_parent_writable_by_others_is_refused_unless_sticky() {
        let top = scratch("parents");
        let open = top.join("open");
        let dir = open.join("state");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = check_private(&dir).unwrap_err().to_string();
        assert!(
            err.contains(&format!("refusing directory {}:", open.display()))
                && err.contains("writable by others without the sticky bit (mode 777)"),
            "{err}"
        );
        // Reached through a link, the real parent is checked as well.
        let link = scratch("parents-link");
        std::os::unix::fs::symlink(&open, &link).unwrap();
        assert!(check_private(&link.join("state")).is_err());
        // Sticky, like /tmp: others cannot rename what is ours there.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        check_private(&dir).unwrap();
        check_private(&link.join("state")).unwrap();
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_dir_all(&top).unwrap();
    }

    #[test]
    fn a_parent_of_another_user_is_refused() {
        if current_uid() != 0 {
            // Only root can make one; the check is the same code as for a user's.
            eprintln!("SKIPPED: needs root to give a directory away");
            return;
        }
        let top = scratch("parents-theirs");
        let dir = top.join("state");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&top, Some(65534), None).unwrap();
        let err = check_private(&dir).unwrap_err().to_string();
        assert!(err.contains("neither root nor this user"), "{err}");
        std::fs::remove_dir_all(&top).unwrap();
    }

    #[test]
    fn the_uid_comes_from_the_os_and_follows_no_planted_link() {
        // Where /proc is missing the old probe wrote `<tmp>/.anygpu-uid-<pid>`, following
        // whatever link another user had put there.
        let victim = scratch("victim");
        std::fs::write(&victim, "precious").unwrap();
        let probe = std::env::temp_dir().join(format!(".anygpu-uid-{}", std::process::id()));
        let _ = std::fs::remove_file(&probe);
        std::os::unix::fs::symlink(&victim, &probe).unwrap();
        let uid = current_uid();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(std::fs::symlink_metadata(&probe).unwrap().is_symlink());
        std::fs::remove_file(&probe).unwrap();
        // The owner of what this process creates.
        let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&victim).unwrap());
        assert_eq!(owner, uid);
        std::fs::remove_file(&victim).unwrap();
    }

    #[test]
    fn a_symbolic_link_is_refused() {
        let dir = scratch("link");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = scratch("link-to");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(check_private(&link)
            .unwrap_err()
            .to_string()
            .contains("symbolic link"));
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_small_regular_files_are_read() {
        let dir = scratch("read");
        ensure_private(&dir).unwrap();
        let file = dir.join("f");
        assert!(read_regular(&file, 4).unwrap().is_none(), "missing: none");
        std::fs::write(&file, b"1234").unwrap();
        assert_eq!(read_regular(&file, 4).unwrap().unwrap(), b"1234");
        let err = read_regular(&file, 3).unwrap_err().to_string();
        assert!(err.contains("larger than 3 bytes"), "{err}");
        let link = dir.join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let err = read_regular(&link, 4).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        assert!(read_regular(&dir, 4).is_err(), "a directory");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
