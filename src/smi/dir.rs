//! The per-user directory processes publish into: `$ANYGPU_SMI_DIR`, else
//! `$XDG_RUNTIME_DIR/anygpu-smi`, else `<temp dir>/anygpu-smi-<uid>`. Created 0700; a directory
//! owned by another user or writable by others is refused (anyone could plant or replace files
//! a reader trusts), by the publisher and by `anygpu-smi` alike.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The directory for this user, from the given environment lookup.
pub(crate) fn default_dir(env: impl Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(dir) = env("ANYGPU_SMI_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    match env("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(runtime) => Path::new(&runtime).join("anygpu-smi"),
        None => std::env::temp_dir().join(format!("anygpu-smi-{}", uid_label())),
    }
}

#[cfg(unix)]
fn uid_label() -> String {
    current_uid().map_or_else(|| "user".into(), |u| u.to_string())
}

#[cfg(not(unix))]
fn uid_label() -> String {
    std::env::var("USERNAME").unwrap_or_else(|_| "user".into())
}

/// This process's user id: the owner of `/proc/self` (Linux), else of a file it creates.
#[cfg(unix)]
pub(crate) fn current_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    if let Ok(m) = std::fs::metadata("/proc/self") {
        return Some(m.uid());
    }
    let probe = std::env::temp_dir().join(format!(".anygpu-uid-{}", std::process::id()));
    let uid = std::fs::write(&probe, b"")
        .and_then(|()| std::fs::metadata(&probe))
        .map(|m| m.uid())
        .ok();
    let _ = std::fs::remove_file(&probe);
    uid
}

fn refused(dir: &Path, why: String) -> Error {
    Error::InvalidArgument(format!(
        "anygpu-smi: refusing directory {}: {why}",
        dir.display()
    ))
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
/// user and writable by no one else.
///
/// # Errors
/// As [`ensure_private`].
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
        if mine.is_some_and(|uid| uid != meta.uid()) {
            return Err(refused(
                dir,
                format!(
                    "owned by uid {}, not by this user (uid {})",
                    meta.uid(),
                    mine.unwrap_or_default()
                ),
            ));
        }
        let mode = meta.mode() & 0o777;
        if mode & 0o022 != 0 {
            return Err(refused(
                dir,
                format!("writable by others (mode {mode:o}); chmod 700 it"),
            ));
        }
    }
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
        let uid = current_uid().unwrap();
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
    fn the_directory_follows_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            default_dir(env(&[("ANYGPU_SMI_DIR", "/x")])),
            Path::new("/x")
        );
        assert_eq!(
            default_dir(env(&[("XDG_RUNTIME_DIR", "/run/user/5")])),
            Path::new("/run/user/5/anygpu-smi")
        );
        let fallback = default_dir(env(&[]));
        assert!(fallback.starts_with(std::env::temp_dir()));
    }
}
