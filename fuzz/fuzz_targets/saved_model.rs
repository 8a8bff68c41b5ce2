//! Fuzzes `anygpu::nn::load_model` on a file of fuzzed bytes: any bytes load whole (and the
//! model predicts) or are an error naming the file; nothing panics or allocates without bound
//! (a config asking for more weights than the file holds is refused before building).
//!
//! Run from the repository root with
//! `cargo +nightly fuzz run saved_model fuzz/corpus/saved_model fuzz/seeds/saved_model`
//! (the seeds, small saved models, are committed; the corpus it grows is not).
//! Set `ASAN_OPTIONS=detect_leaks=0`: Mesa's Vulkan driver, which the runtime's adapter discovery
//! loads, leaks 96 bytes at exit.

#![no_main]

use anygpu::nn;
use anygpu::Tensor;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let _cpu = anygpu::with_device("/cpu:0").expect("CPU:0");
    let path = std::env::temp_dir().join(format!("anygpu-fuzz-model-{}", std::process::id()));
    std::fs::write(&path, bytes).expect("write");
    match nn::load_model(&path) {
        Ok(model) => {
            // A model that loads is whole: it predicts on its input shape.
            let shape = model.input_shape().expect("a loaded model is built").to_vec();
            let len: usize = shape.iter().product();
            if len <= 1 << 16 {
                let mut batch = vec![1];
                batch.extend_from_slice(&shape);
                let x = Tensor::from_vec(vec![0.5f32; len], &batch).expect("x");
                let _ = model.predict(&x);
            }
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains("anygpu-fuzz-model"),
                "the error names the file: {message}"
            );
        }
    }
    let _ = std::fs::remove_file(&path);
});
