//! The per-user directory processes publish into: `$ANYGPU_SMI_DIR`, else
//! `$XDG_RUNTIME_DIR/anygpu-smi`, else `<temp dir>/anygpu-smi-<uid>`. Created 0700; a directory
//! owned by another user or writable by others is refused (anyone could plant or replace files
//! a reader trusts), by the publisher and by `anygpu-smi` alike ([`crate::private_fs`] checks).

use std::path::{Path, PathBuf};

#[cfg(unix)]
use crate::private_fs::current_uid;
pub(crate) use crate::private_fs::{check_private, ensure_private};

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
    current_uid().to_string()
}

#[cfg(not(unix))]
fn uid_label() -> String {
    std::env::var("USERNAME").unwrap_or_else(|_| "user".into())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

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
