//! Throughput of the host input pipeline (`anygpu::data::Dataset`) on Fashion-MNIST-sized
//! examples: 28×28×1 `f32` images, batch 128, the tutorial's shuffle → repeat → batch →
//! prefetch chain. Throughput is in images per second; training needs far less than the
//! pipeline delivers (the requirement is ≥ 50,000 images/s).
//!
//! The images are synthetic, so the bench runs without the data files.

use std::hint::black_box;

use anygpu::data::Dataset;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

const N: usize = 60_000;
const EXAMPLE: [usize; 3] = [28, 28, 1];
const BATCH: usize = 128;
/// Batches consumed per measured iteration.
const STEPS: usize = 100;

fn dataset() -> Dataset {
    let len: usize = EXAMPLE.iter().product();
    let x: Vec<f32> = (0..N * len).map(|i| (i % 251) as f32 / 251.0).collect();
    let y: Vec<i32> = (0..N).map(|i| (i % 10) as i32).collect();
    match Dataset::from_tensor_slices(x, &EXAMPLE, y) {
        Ok(ds) => ds,
        Err(e) => panic!("building the bench dataset: {e}"),
    }
}

fn consume(it: impl Iterator<Item = anygpu::data::Batch>) -> usize {
    it.take(STEPS).map(|b| black_box(b).y.len()).sum()
}

fn pipeline(c: &mut Criterion) {
    let mut group = c.benchmark_group("pipeline");
    group.throughput(Throughput::Elements((STEPS * BATCH) as u64));
    group.sample_size(20);

    let plain = dataset().shuffle(N, 42).repeat(None).batch(BATCH, true);
    group.bench_function("shuffle_repeat_batch128", |b| {
        b.iter_batched(|| plain.iter(), consume, BatchSize::PerIteration)
    });

    let prefetched = dataset()
        .shuffle(N, 42)
        .repeat(None)
        .batch(BATCH, true)
        .prefetch(4);
    // One long-lived iterator, so the prefetch thread's start-up is not measured.
    let mut it = prefetched.iter();
    group.bench_function("shuffle_repeat_batch128_prefetch4", |b| {
        b.iter(|| consume(it.by_ref()))
    });

    let small_buffer = dataset().shuffle(1_000, 42).repeat(None).batch(BATCH, true);
    group.bench_function("shuffle1000_repeat_batch128", |b| {
        b.iter_batched(|| small_buffer.iter(), consume, BatchSize::PerIteration)
    });
    group.finish();
}

criterion_group!(benches, pipeline);
criterion_main!(benches);
