//! What the training benchmarks share: one criterion group timing whole training steps.

use std::time::{Duration, Instant};

use anygpu::nn::Sequential;
use anygpu::Tensor;
use criterion::{Criterion, SamplingMode, Throughput};

/// Benchmarks `model.train_step(x, y)` in group `group` (function `function`), each step
/// followed by `model.synchronize()` so GPU work is inside the timing, with the batch as the
/// throughput (criterion's `elem/s` is images/s). Flat sampling and 10 samples keep software
/// adapters, at seconds per step, affordable.
pub fn time_train_steps(
    c: &mut Criterion,
    group: &str,
    function: &str,
    measurement: Duration,
    model: &mut Sequential,
    (x, y): (&Tensor, &Tensor),
) {
    // Warm up: pipelines compiled, arenas grown.
    for _ in 0..2 {
        model.train_step(x, y).expect("a training step runs");
    }
    model.synchronize().expect("the devices finish");
    let mut group = c.benchmark_group(group);
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(measurement)
        .throughput(Throughput::Elements(x.shape()[0] as u64));
    group.bench_function(function, |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                model.train_step(x, y).expect("a training step runs");
                model.synchronize().expect("the devices finish");
            }
            start.elapsed()
        })
    });
    group.finish();
}
