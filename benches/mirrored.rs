//! Images/s of one data-parallel training step of the tutorial CNN (batch 128, SGD) under
//! `MirroredStrategy`, for several sets of replicas:
//!
//! * `cpu0`: CPU:0 alone, the plain model (no strategy) — the baseline;
//! * `1x-gpu0`: one replica on GPU:0;
//! * `2x-gpu0-gpu1`: GPU:0 and GPU:1 (lavapipe and llvmpipe with `WGPU_BACKEND=vulkan,gl`);
//! * `2x-virtual-gpu0`: two virtual GPUs cut from GPU:0;
//! * `2x-virtual-cpu`: two virtual CPUs.
//!
//! Every timed step ends with `model.synchronize()`; the throughput is the global batch, so
//! criterion's `elem/s` is images/s.
//!
//! ```text
//! WGPU_BACKEND=vulkan,gl cargo bench --bench mirrored
//! WGPU_BACKEND=vulkan,gl cargo bench --bench mirrored -- 2x-gpu0-gpu1
//! ```

mod common;

use std::time::Duration;

use anygpu::distribute::MirroredStrategy;
use anygpu::nn::{self, Loss, Metric, Sequential, Sgd, Verbosity};
use anygpu::ops::reference::random_vec;
use anygpu::{LogicalDevice, Runtime, Tensor};
use criterion::{criterion_group, criterion_main, Criterion};

const BATCH: usize = 128;

fn compiled(model: anygpu::Result<Sequential>) -> anygpu::Result<Sequential> {
    let mut model = model?;
    model.compile(
        Loss::sparse_categorical_crossentropy(),
        Sgd::default(),
        &[Metric::Accuracy],
    )?;
    model.set_verbose(Verbosity::Silent);
    Ok(model)
}

/// The tutorial model, mirrored on `replicas` (or plain on `replicas[0]` when `plain`).
fn model(replicas: &[LogicalDevice], plain: bool) -> Sequential {
    let built = if plain {
        compiled(nn::tutorial_cnn(42, &replicas[..1]))
    } else {
        let strategy = MirroredStrategy::with_devices(replicas).expect("a strategy");
        strategy
            .scope(|| compiled(nn::tutorial_cnn(42, &[])))
            .expect("one strategy scope")
    };
    built.expect("the model builds")
}

/// Times training steps of the model mirrored on `replicas` (plain on `replicas[0]` when
/// `plain`), the batch starting on `host` for a mirrored model (as from a `Dataset`: the step
/// splits it there) and on the device for a plain one.
fn bench_step(
    c: &mut Criterion,
    name: &str,
    replicas: &[LogicalDevice],
    plain: bool,
    host: &LogicalDevice,
) {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
        return;
    }
    let mut model = model(replicas, plain);
    let at = if plain { &replicas[0] } else { host };
    let labels: Vec<i32> = (0..BATCH as i32).map(|i| i % 10).collect();
    let x = Tensor::from_slice_on(&random_vec(BATCH * 784, 1), &[BATCH, 28, 28, 1], at)
        .expect("the batch fits");
    let y = Tensor::from_slice_on(&labels, &[BATCH], at).expect("the labels fit");
    common::time_train_steps(
        c,
        &format!("mirrored/{name}"),
        "tutorial_cnn_batch128_sgd",
        Duration::from_secs(20),
        &mut model,
        (&x, &y),
    );
}

fn mirrored(c: &mut Criterion) {
    // Soft placement off: a replica op its device cannot run fails the benchmark instead of
    // being timed on the CPU.
    let rt = Runtime::builder()
        .memory_growth(true)
        .virtual_cpus(2)
        .soft_device_placement(false)
        .build()
        .expect("a runtime");
    let host = rt.cpu().expect("CPU:0");
    let cpus = rt.list_logical_devices("CPU").expect("CPUs");
    let gpus = rt.list_logical_devices("GPU").expect("GPUs");
    bench_step(c, "cpu0", &cpus[..1], true, &host);
    bench_step(c, "2x-virtual-cpu", &cpus, false, &host);
    if !gpus.is_empty() {
        bench_step(c, "1x-gpu0", &gpus[..1], false, &host);
    }
    if gpus.len() >= 2 {
        bench_step(c, "2x-gpu0-gpu1", &gpus[..2], false, &host);
    }
    if gpus.is_empty() {
        return;
    }
    let split = Runtime::builder()
        .soft_device_placement(false)
        .visible_gpus(&[0])
        .virtual_gpus(0, &[1024, 1024])
        .build()
        .expect("a runtime with two virtual GPUs");
    let virtual_gpus = split.list_logical_devices("GPU").expect("GPUs");
    bench_step(
        c,
        "2x-virtual-gpu0",
        &virtual_gpus,
        false,
        &split.cpu().expect("CPU:0"),
    );
}

criterion_group!(benches, mirrored);
criterion_main!(benches);
