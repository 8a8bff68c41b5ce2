//! The autotuner through the public API, on every GPU adapter: a first runtime measures and
//! writes its choices to the cache directory, a second one (a new process, as far as the tuner
//! can tell) reads them and measures nothing, and a corrupt cache file means tuning again, with
//! a right result, never an error.

mod common;

use anygpu::ops::spec::Activation;
use anygpu::{DecisionSource, LogicalDevice, Runtime, TuningDecision};

fn cache_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("anygpu-tuning-test-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    dir
}

fn runtime(dir: &std::path::Path) -> Runtime {
    common::builder()
        .memory_growth(true)
        .env("ANYGPU_AUTOTUNE", Some("on"))
        .env(
            "ANYGPU_CACHE_DIR",
            Some(dir.to_str().expect("a UTF-8 temp path")),
        )
        .build()
        .expect("runtime")
}

/// A dense layer (a tuned matrix product) on `dev`, checked against the oracle.
fn dense(dev: &LogicalDevice) {
    common::dense_checked(dev, (96, 256, 40), Activation::Selu, 1, 1e-4);
}

fn matmul_decisions(dev: &LogicalDevice) -> Vec<TuningDecision> {
    dev.tuning_decisions()
        .into_iter()
        .filter(|d| d.op == "matmul")
        .collect()
}

#[test]
fn choices_are_measured_once_then_read_from_the_cache_and_survive_corruption() {
    let Some(_) = common::gpus_at_least(1, "tuning") else {
        return;
    };
    let dir = cache_dir();

    let first = runtime(&dir);
    for dev in first.list_logical_devices("GPU").unwrap() {
        dense(&dev);
        let d = matmul_decisions(&dev);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].source, DecisionSource::Measured, "{d:?}");
        assert!(d[0].timings_ms.len() >= 2, "every candidate timed: {d:?}");
        assert!(d[0].timings_ms.iter().any(|(c, _)| *c == d[0].candidate));
    }
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert!(!files.is_empty(), "a cache file per adapter");

    let second = runtime(&dir);
    for dev in second.list_logical_devices("GPU").unwrap() {
        dense(&dev);
        let d = matmul_decisions(&dev);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(
            d[0].source,
            DecisionSource::Cached,
            "no tuning the second time: {d:?}"
        );
    }

    for f in &files {
        std::fs::write(f.path(), b"\x7fELF garbage \x00\xff").unwrap();
    }
    let third = runtime(&dir);
    for dev in third.list_logical_devices("GPU").unwrap() {
        dense(&dev);
        let d = matmul_decisions(&dev);
        assert_eq!(d[0].source, DecisionSource::Measured, "tuned again: {d:?}");
    }
    std::fs::remove_dir_all(dir).ok();
}
