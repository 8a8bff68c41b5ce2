//! Pipelined model parallelism on two logical CPUs with one thread each (two devices that really
//! run side by side on a 2-core machine), in one process so that every variant sees the same
//! machine: the tutorial CNN's training step at batch 128, split in two stages, serially and
//! pipelined (GPipe and 1F1B at 4 and 8 micro-batches). Throughput is in images per second;
//! the ceiling of two stages is `2M / (M + 1)` (1.78× at M = 8).
//!
//! Before criterion's groups, a side-by-side run prints what the group names cannot carry:
//! - the variants interleaved round by round (so load from other processes hits all alike), as
//!   medians and ratios to the serial split, with the load average;
//! - each stage's busy time (forward + backward) at M = 8, i.e. the imbalance;
//! - every split point of the model: the stages' times in a serial step and the speedup a
//!   pipeline at M = 8 could reach there, `(t0 + t1) / ((t0 + t1) / M + (M − 1) / M · max)`;
//!   then the best split measured like the tutorial's.
//!
//! Criterion's groups (`model_parallel/cpu-1thread-x2/split6`, and `split<N>` for the best
//! split) then time each variant alone, in steady state.
//!
//! ```text
//! cargo bench --bench model_parallel
//! ```
//!
//! The images are synthetic, so the bench runs without the data files.

use std::time::Instant;

use anygpu::nn::{self, Adam, Loss, Pipeline, Sequential, Verbosity};
use anygpu::{DeviceKind, LogicalDevice, LogicalDeviceConfiguration, Runtime, Tensor};
use criterion::{Criterion, Throughput};

const BATCH: usize = 128;
/// The tutorial's split with two devices and the dense layers kept on the second: the
/// convolution blocks up to the 64-filter pool (layers 0–5) on CPU:0, the rest on CPU:1.
const TUTORIAL_SPLIT: usize = 6;
/// Layers of the tutorial CNN.
const LAYERS: usize = 12;

struct Bench {
    _rt: Runtime,
    cpus: Vec<LogicalDevice>,
    x: Tensor,
    y: Tensor,
}

fn setup() -> Bench {
    let rt = Runtime::builder()
        .visible_gpus(&[])
        .configure()
        .expect("a runtime");
    let cpu = rt.list_physical_devices(DeviceKind::Cpu)[0].clone();
    let one = LogicalDeviceConfiguration::new().threads(1);
    rt.set_logical_device_configuration(&cpu, &[one, one])
        .expect("two 1-thread CPUs");
    let cpus = rt.list_logical_devices("CPU").expect("CPUs");
    let x: Vec<f32> = (0..BATCH * 784)
        .map(|i| ((i * 37) % 255) as f32 / 255.0 - 0.5)
        .collect();
    let y: Vec<i32> = (0..BATCH as i32).map(|i| i % 10).collect();
    let x = Tensor::from_slice_on(&x, &[BATCH, 28, 28, 1], &cpus[0]).expect("x");
    let y = Tensor::from_slice_on(&y, &[BATCH], &cpus[1]).expect("y");
    Bench {
        _rt: rt,
        cpus,
        x,
        y,
    }
}

/// The tutorial CNN with layers `0..at` on CPU:0 and the rest on CPU:1.
fn model(b: &Bench, at: usize, pipeline: Option<Pipeline>) -> Sequential {
    let devices: Vec<LogicalDevice> = (0..LAYERS)
        .map(|i| b.cpus[usize::from(i >= at)].clone())
        .collect();
    let mut m = nn::tutorial_cnn_on(42, &devices).expect("the model builds");
    m.compile(
        Loss::sparse_categorical_crossentropy(),
        Adam::default(),
        &[],
    )
    .expect("compiles");
    m.set_verbose(Verbosity::Silent);
    m.set_pipeline(pipeline).expect("a valid pipeline");
    m
}

fn step(m: &mut Sequential, b: &Bench) {
    m.train_step(&b.x, &b.y).expect("a training step");
}

/// The variants measured, by name. `serial_m8` is the control: the whole model on CPU:0 in 8
/// micro-batches (one stage, nothing overlaps), which shows what smaller batches alone change
/// (activations that stay in cache), apart from the overlap.
fn variants() -> Vec<(&'static str, Option<Pipeline>)> {
    vec![
        ("serial", None),
        ("serial_m8", Some(Pipeline::gpipe(8))),
        ("gpipe_m4", Some(Pipeline::gpipe(4))),
        ("gpipe_m8", Some(Pipeline::gpipe(8))),
        ("1f1b_m4", Some(Pipeline::one_f_one_b(4))),
        ("1f1b_m8", Some(Pipeline::one_f_one_b(8))),
    ]
}

/// The split a variant runs at: the control keeps every layer on CPU:0.
fn split_of(name: &str, at: usize) -> usize {
    if name == "serial_m8" {
        LAYERS
    } else {
        at
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The variants at split `at`, interleaved: `rounds` rounds of `steps` steps each.
fn interleaved(b: &Bench, at: usize, rounds: usize, steps: usize) {
    let mut models: Vec<(&str, Sequential, Vec<f64>)> = variants()
        .into_iter()
        .map(|(name, p)| {
            let mut m = model(b, split_of(name, at), p);
            step(&mut m, b); // warm-up: caches, optimizer slots
            (name, m, Vec::new())
        })
        .collect();
    let load_before = load();
    for _ in 0..rounds {
        for (_, m, times) in models.iter_mut() {
            // Untimed: the first step after another model's refills the host buffer cache
            // with this model's sizes.
            step(m, b);
            for _ in 0..steps {
                let start = Instant::now();
                step(m, b);
                times.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    println!(
        "split at layer {at} (layers 0-{} on CPU:0), batch {BATCH}, {rounds} interleaved rounds of {steps} steps; load average {load_before} before, {} after",
        at - 1,
        load()
    );
    let serial = median(&mut models[0].2.clone());
    for (name, m, times) in models.iter_mut() {
        let ms = median(times);
        let stages: Vec<String> = m
            .pipeline_stats()
            .iter()
            .map(|s| {
                format!(
                    "{} busy {:.1} ms, waiting {:.1} ms",
                    s.device,
                    s.busy.as_secs_f64() * 1e3,
                    s.waiting.as_secs_f64() * 1e3
                )
            })
            .collect();
        println!(
            "  {name:9} median {ms:6.1} ms  {:5.0} images/s  {:.2}x serial  {}",
            BATCH as f64 * 1e3 / ms,
            serial / ms,
            stages.join("; ")
        );
    }
}

/// Each split point's stage times in a serial step (a pipeline of one micro-batch times its
/// stages), split points interleaved round by round, and the speedup a pipeline of `m`
/// micro-batches could reach there. Returns the best split point.
fn sweep(b: &Bench, m: usize, rounds: usize) -> usize {
    let mut models: Vec<(usize, Sequential, Vec<f64>, Vec<f64>)> = (1..LAYERS)
        .map(|at| {
            let mut model = model(b, at, Some(Pipeline::gpipe(1)));
            step(&mut model, b);
            (at, model, Vec::new(), Vec::new())
        })
        .collect();
    for _ in 0..rounds {
        for (_, model, t0, t1) in models.iter_mut() {
            step(model, b);
            let stats = model.pipeline_stats();
            t0.push(stats[0].busy.as_secs_f64() * 1e3);
            t1.push(stats[1].busy.as_secs_f64() * 1e3);
        }
    }
    println!(
        "split points (a serial step's stage times, forward + backward, median of {rounds} interleaved rounds; load average {}):",
        load()
    );
    let mut best = (0.0, TUTORIAL_SPLIT);
    for (at, _, t0, t1) in models.iter_mut() {
        let (t0, t1) = (median(t0), median(t1));
        let mf = m as f64;
        let bound = (t0 + t1) / ((t0 + t1) / mf + (mf - 1.0) / mf * t0.max(t1));
        println!(
            "  at {at:2}: CPU:0 {t0:6.1} ms, CPU:1 {t1:6.1} ms, imbalance {:.2}, M = {m} bound {bound:.2}x",
            t0.max(t1) / t0.min(t1)
        );
        if bound > best.0 {
            best = (bound, *at);
        }
    }
    best.1
}

/// The side-by-side runs; returns the split points for criterion: the tutorial's, and the
/// best one the sweep found.
fn side_by_side(b: &Bench, quick: bool) -> Vec<usize> {
    let (rounds, steps) = if quick { (1, 1) } else { (4, 4) };
    interleaved(b, TUTORIAL_SPLIT, rounds, steps);
    if quick {
        return vec![TUTORIAL_SPLIT];
    }
    let best = sweep(b, 8, 7);
    if best == TUTORIAL_SPLIT {
        return vec![TUTORIAL_SPLIT];
    }
    interleaved(b, best, rounds, steps);
    vec![TUTORIAL_SPLIT, best]
}

fn criterion_groups(c: &mut Criterion, b: &Bench, splits: &[usize]) {
    for &at in splits {
        let mut group = c.benchmark_group(format!("model_parallel/cpu-1thread-x2/split{at}"));
        group.throughput(Throughput::Elements(BATCH as u64));
        group.sample_size(10);
        for (name, p) in variants() {
            let mut m = model(b, split_of(name, at), p);
            step(&mut m, b);
            group.bench_function(name, |bench| bench.iter(|| step(&mut m, b)));
        }
        group.finish();
    }
}

fn main() {
    let b = setup();
    // `cargo test --benches` / `cargo bench -- --test` run everything once, quickly.
    let quick = std::env::args().any(|a| a == "--test");
    let splits = side_by_side(&b, quick);
    let mut c = Criterion::default().configure_from_args();
    criterion_groups(&mut c, &b, &splits);
    c.final_summary();
}
