//! One full training step of the tutorial's Fashion-MNIST CNN (forward, loss, backward, SGD
//! update of all 184,234 weights) at batch 128, on every device.
//!
//! One criterion group per device, `train_step/cpu0`, `train_step/gpu0-lavapipe`, ...; every
//! timed step ends with `model.synchronize()`, so GPU times include the work, not just its
//! recording. Flat sampling and 10 samples keep software adapters (seconds per step)
//! affordable. Soft placement is off, so a step whose op cannot run on the device fails the
//! benchmark rather than timing the CPU. The batch is on the device before timing, as in
//! `scripts/tf_train_step.py` (upload outside the timing on both sides).
//!
//! ```text
//! cargo bench --bench train_step
//! ANYGPU_BENCH_DEVICES=cpu cargo bench --bench train_step        # only CPU:0
//! WGPU_BACKEND=vulkan cargo bench --bench train_step -- gpu0
//! ```

mod common;
#[path = "common/devices.rs"]
mod devices;

use std::time::Duration;

use anygpu::nn::{self, Loss, Metric, Sgd, Verbosity};
use anygpu::ops::reference::random_vec;
use anygpu::{DeviceKind, Runtime, Tensor};
use criterion::{criterion_group, criterion_main, Criterion};

const BATCH: usize = 128;

fn train_step(c: &mut Criterion) {
    // Soft placement off: a layer op the device cannot run fails the benchmark instead of
    // being timed on the CPU under the device's name.
    let rt = Runtime::builder()
        .memory_growth(true)
        .soft_device_placement(false)
        .build()
        .expect("a runtime with memory growth builds");
    for device in devices::selected(&rt) {
        let mut model =
            nn::tutorial_cnn(42, std::slice::from_ref(&device)).expect("the model builds");
        model
            .compile(
                Loss::sparse_categorical_crossentropy(),
                Sgd::default(),
                &[Metric::Accuracy],
            )
            .expect("the model compiles");
        model.set_verbose(Verbosity::Silent);
        let x = Tensor::from_slice_on(
            &random_vec(BATCH * 28 * 28, 1),
            &[BATCH, 28, 28, 1],
            &device,
        )
        .expect("the batch fits");
        let labels: Vec<i32> = (0..BATCH as i32).map(|i| i % 10).collect();
        let y = Tensor::from_slice_on(&labels, &[BATCH], &device).expect("the labels fit");
        let slow = device.device_type() == DeviceKind::Gpu
            && device.adapter_name().to_lowercase().contains("llvmpipe");
        common::time_train_steps(
            c,
            &format!("train_step/{}", devices::tag(&device)),
            "tutorial_cnn_batch128_sgd",
            Duration::from_secs(if slow { 40 } else { 5 }),
            &mut model,
            (&x, &y),
        );
    }
}

criterion_group!(benches, train_step);
criterion_main!(benches);
