//! Fuzzes the two weight-file readers through the public API: `load_weights` on a file of
//! fuzzed bytes, and `BackupAndRestore` resuming `fit` from a fuzzed checkpoint. Any bytes
//! load whole or are an error; a refused file leaves every weight as it was (nothing
//! half-loaded), and nothing panics.
//!
//! Run from the repository root with
//! `cargo +nightly fuzz run checkpoint fuzz/corpus/checkpoint fuzz/seeds/checkpoint`
//! (the seeds are committed; the corpus it grows is not).
//! Set `ASAN_OPTIONS=detect_leaks=0`: Mesa's Vulkan driver, which the runtime's adapter discovery
//! loads, leaks 96 bytes at exit.

#![no_main]

use anygpu::data::Dataset;
use anygpu::nn::{BackupAndRestore, Callback, Dense, Loss, Sequential, Sgd, Verbosity};
use libfuzzer_sys::fuzz_target;

fn model() -> Sequential {
    let _cpu = anygpu::with_device("/cpu:0").expect("CPU:0");
    let mut m = Sequential::with_seed(1);
    m.add(Dense::new(2).input_shape(&[3])).expect("a layer");
    m.compile(
        Loss::SparseCategoricalCrossentropy { from_logits: true },
        Sgd::new(0.1),
        &[],
    )
    .expect("compile");
    m.set_verbose(Verbosity::Silent);
    m
}

fuzz_target!(|bytes: &[u8]| {
    let dir = std::env::temp_dir().join(format!("anygpu-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");

    let mut m = model();
    let before = m.get_weights().expect("weights");
    let weights = dir.join("weights.safetensors");
    std::fs::write(&weights, bytes).expect("write");
    if m.load_weights(&weights).is_err() {
        assert_eq!(m.get_weights().expect("weights"), before, "half-loaded");
    }

    let mut m = model();
    let before = m.get_weights().expect("weights");
    std::fs::write(dir.join("checkpoint.safetensors"), bytes).expect("write");
    let data = Dataset::from_tensor_slices(vec![0.5f32; 6], &[3], vec![0, 1])
        .expect("data")
        .batch(2, false);
    let mut backup = BackupAndRestore::new(&dir);
    let callbacks: &mut [&mut dyn Callback] = &mut [&mut backup];
    if m.fit_with_callbacks(&data, 1, None, None, callbacks).is_err() {
        assert_eq!(m.get_weights().expect("weights"), before, "half-restored");
    }
    let _ = std::fs::remove_dir_all(&dir);
});
