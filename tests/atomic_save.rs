//! `save_weights` replaces its file whole or not at all. A save that fails half-way through
//! writing (here: the file-size limit of `ulimit -f`, which stops root too) must leave the
//! previous file byte for byte.
//!
//! The failing save runs in a child process — this test binary again, filtered to
//! [`child_saves_under_a_file_size_limit`] — so the limit touches no other test.

#![cfg(unix)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use anygpu::nn::{Dense, Sequential};

/// Set in the child: where it saves.
const TARGET_VAR: &str = "ANYGPU_ATOMIC_SAVE_TARGET";

/// 64 → 64 → 64 dense layers: 8,320 f32 weights, about 33 KB on disk.
fn model(seed: u64) -> Sequential {
    let rt = common::builder().build().expect("a runtime builds");
    let cpu = rt.cpu().expect("CPU:0 exists");
    let mut m = Sequential::with_seed(seed);
    m.add_on(&cpu, Dense::new(64).input_shape(&[64])).unwrap();
    m.add_on(&cpu, Dense::new(64)).unwrap();
    m
}

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("anygpu-atomic-save-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the temp dir is writable");
    dir
}

/// Runs [`child_saves_under_a_file_size_limit`] with writes capped at 8 KiB (`ulimit -f 16`,
/// 512-byte blocks in POSIX sh) and SIGXFSZ ignored, so a write past the limit fails with
/// EFBIG instead of killing the child. Returns the child's output.
fn save_in_a_child_under_a_size_limit(target: &Path) -> String {
    let exe = std::env::current_exe().expect("the test binary knows its path");
    let out = Command::new("sh")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 16 && exec \"$0\" --exact child_saves_under_a_file_size_limit --nocapture --test-threads 1")
        .arg(exe)
        .env(TARGET_VAR, target)
        .output()
        .expect("sh runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the child failed: {text}");
    text
}

#[test]
fn a_save_that_fails_half_way_leaves_the_old_file_byte_for_byte() {
    let dir = scratch_dir();
    let target = dir.join("model.safetensors");
    model(1).save_weights(&target).unwrap();
    let before = std::fs::read(&target).unwrap();
    assert!(
        before.len() > 16 * 1024,
        "the file outgrows the child's limit"
    );

    let child = save_in_a_child_under_a_size_limit(&target);
    assert!(
        child.contains("save failed:"),
        "the child's save must fail: {child}"
    );
    let after = std::fs::read(&target).unwrap();
    assert!(
        after == before,
        "the old weights file must be intact after a failed save: {} bytes before, {} after",
        before.len(),
        after.len()
    );
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        ["model.safetensors"],
        "no temporary file is left behind"
    );
    // A save that succeeds replaces the file.
    model(2).save_weights(&target).unwrap();
    assert_ne!(std::fs::read(&target).unwrap(), before);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The child's half: a no-op unless [`TARGET_VAR`] is set.
#[test]
fn child_saves_under_a_file_size_limit() {
    let Some(target) = std::env::var_os(TARGET_VAR) else {
        return;
    };
    match model(2).save_weights(PathBuf::from(target)) {
        Ok(()) => println!("save succeeded"),
        Err(e) => println!("save failed: {e}"),
    }
}
