//! `--time-steps N` and `--profile DIR`: a few training steps timed (or profiled) after a
//! warm-up instead of `fit`; and the reports the end of a run prints (pipeline stages, the
//! autotuner's picks, memory).

use std::time::{Duration, Instant};

use anygpu::data::Dataset;
use anygpu::nn::Sequential;
use anygpu::{config, DeviceKind, LogicalDevice, StreamStats, Tensor};

use crate::args::Args;
use crate::devices::adapter;
use crate::distributed::{self as workers, Workers};
use crate::BoxError;

/// Training steps the profiler records (`--profile`).
const PROFILED_STEPS: usize = 5;

/// The warm-up runs at least 3 steps, and at least this long after the first (which compiles,
/// and may tune, with the GPU mostly idle): a GPU that has idled raises its clocks only after
/// some time busy (an H200 at batch 128 timed 2.1 or 6-7.7 ms a step, depending on the run,
/// when this second included the first step). PyTorch's side times from its first step too.
const WARM_UP: Duration = Duration::from_secs(1);

/// Times `--time-steps` full training steps (forward, backward, update, synchronized) after
/// a warm-up and prints the median; then the same steps back to back, as `fit` runs them (no
/// wait between steps, one at the end); then `--profile` records a few more.
pub fn time_steps(
    model: &mut Sequential,
    train: &Dataset,
    args: &Args,
    multi_worker: Option<&Workers>,
) -> Result<(), BoxError> {
    let (n, batch) = (args.time_steps.unwrap_or(0), args.batch_size);
    let profile = args.profile.as_deref();
    let devices = model.devices();
    // A mirrored model takes each batch from the host and splits it; elsewhere the batch goes
    // to the first layer's device and the labels to the last's.
    let host = config::runtime().cpu()?;
    let (first, last) = match model.strategy() {
        Some(_) => (&host, &host),
        None => (&devices[0], &devices[devices.len() - 1]),
    };
    let mut batches = train.iter();
    let stats = |devices: &[LogicalDevice]| -> StreamStats {
        devices
            .iter()
            .filter_map(LogicalDevice::stream_stats)
            .fold(StreamStats::default(), |a, b| a + b)
    };
    // One step's wall time, the host time until `train_step` returned (recording; a device that
    // runs ops on the host counts them here too), and the stream counters it moved. With
    // `wait` false the step is only recorded: the device may still be running it.
    let mut step =
        |model: &mut Sequential, wait: bool| -> Result<(f64, f64, StreamStats), BoxError> {
            let b = batches.next().ok_or("the training set is empty")?;
            let x = Tensor::from_slice_on(&b.x, &b.x_shape, first)?;
            let y = Tensor::from_slice_on(&b.y, &[b.y.len()], last)?;
            let before = stats(&devices);
            let start = Instant::now();
            model.train_step(&x, &y)?;
            let host = start.elapsed().as_secs_f64() * 1e3;
            if wait {
                model.synchronize()?;
            }
            let wall = start.elapsed().as_secs_f64() * 1e3;
            Ok((wall, host, stats(&devices) - before))
        };
    let (ms, _, first) = step(model, true)?;
    let mut warmup = vec![ms];
    let warm_up = Instant::now();
    while warmup.len() < 3 || warm_up.elapsed() < WARM_UP {
        warmup.push(step(model, true)?.0);
    }
    let shown: Vec<String> = warmup.iter().take(3).map(|ms| format!("{ms:.1}")).collect();
    println!(
        "{}warm-up steps: {} ms{} (the first compiles the kernels and, with ANYGPU_AUTOTUNE on and no cache, tunes them{})",
        workers::tag(multi_worker.map_or(0, workers::rank)),
        shown.join(", "),
        match warmup.len() {
            ..=3 => String::new(),
            more => format!(", then {} more", more - 3),
        },
        match first.pipelines_compiled {
            0 => String::new(),
            n => format!(
                ": {n} pipelines compiled, {:.1} ms of the step waiting for them",
                first.compile_nanos as f64 / 1e6
            ),
        }
    );
    if n > 0 {
        let reduce_before = multi_worker.map(workers::all_reduce_ms);
        // Only GPUs keep memory stats (TF's rule: CPU:0 refuses the reset).
        let gpus: Vec<&LogicalDevice> = devices
            .iter()
            .filter(|d| d.device_type() == DeviceKind::Gpu)
            .collect();
        for d in &gpus {
            config::reset_memory_stats(d.name())?;
        }
        let steps = (0..n)
            .map(|_| step(model, true))
            .collect::<Result<Vec<_>, _>>()?;
        for d in gpus {
            let peak = config::get_memory_info(d.name())?.peak;
            println!(
                "peak memory of a train step on {}: {} ({} bytes)",
                d.name(),
                anygpu::format_bytes(peak),
                peak
            );
        }
        if let (Some(w), Some(before)) = (multi_worker, reduce_before) {
            let after = workers::all_reduce_ms(w);
            println!(
                "{}all-reduce between workers: {:.2} ms per step, of which MPI_Allreduce {:.2} ms \
                 (737 KB of gradients; includes waiting for the slowest worker)",
                workers::tag(workers::rank(w)),
                (after.0 - before.0) / n as f64,
                (after.1 - before.1) / n as f64,
            );
        }
        let mut times: Vec<f64> = steps.iter().map(|s| s.0).collect();
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        let names: Vec<String> = devices
            .iter()
            .map(|d| format!("{} ({})", d.name(), adapter(d)))
            .collect();
        // Across workers `batch` is the global batch: the images/s are the job's.
        println!(
            "{}median train step: {median:.1} ms (batch {batch}, device {}; mean {mean:.1}, min {:.1}, max {:.1} over {} steps; {:.0} images/s)",
            workers::tag(multi_worker.map_or(0, workers::rank)),
            names.join(" + "),
            times[0],
            times[times.len() - 1],
            times.len(),
            batch as f64 * 1e3 / median
        );
        let count = steps.len() as f64;
        let host = steps.iter().map(|s| s.1).sum::<f64>() / count;
        let dispatches = steps.iter().map(|s| s.2.dispatches).sum::<u64>() as f64 / count;
        if dispatches > 0.0 {
            let submits = steps.iter().map(|s| s.2.submits).sum::<u64>() as f64 / count;
            let record = steps.iter().map(|s| s.2.record_nanos).sum::<u64>() as f64 / count / 1e6;
            let hits = steps.iter().map(|s| s.2.bind_group_hits).sum::<u64>() as f64 / count;
            println!(
                "host per step: {host:.2} ms until train_step returned, of which {record:.2} ms recording {dispatches:.0} dispatches in {submits:.1} submissions ({:.1} us per dispatch, {:.0}% of bind groups cached)",
                record * 1e3 / dispatches,
                100.0 * hits / dispatches
            );
        }
        // As `fit` runs: each step recorded while the device runs the one before.
        let start = Instant::now();
        for _ in 0..n {
            step(model, false)?;
        }
        model.synchronize()?;
        let per_step = start.elapsed().as_secs_f64() * 1e3 / n as f64;
        println!(
            "{}back-to-back train step: {per_step:.2} ms ({n} steps, one wait at the end; {:.0} images/s)",
            workers::tag(multi_worker.map_or(0, workers::rank)),
            batch as f64 * 1e3 / per_step
        );
    }
    print_tuning(&devices);
    print_stages(model);
    if let Some(dir) = profile {
        anygpu::profiler::start(dir)?;
        for i in 0..PROFILED_STEPS {
            let _span = anygpu::profiler::Trace::new(format!("train step {i}"));
            step(model, true)?;
        }
        let report = anygpu::profiler::stop()?;
        println!(
            "\nprofile of {PROFILED_STEPS} train steps (batch {batch}), written to {}:\n{report}",
            dir.display()
        );
    }
    Ok(())
}

/// Each pipeline stage's share of the last step (nothing without `--pipeline`).
pub fn print_stages(model: &Sequential) {
    for (i, s) in model.pipeline_stats().iter().enumerate() {
        println!(
            "pipeline stage {i}: layers {}-{} on {}, busy {:.1} ms, waiting {:.1} ms",
            s.layers.start,
            s.layers.end - 1,
            s.device,
            s.busy.as_secs_f64() * 1e3,
            s.waiting.as_secs_f64() * 1e3
        );
    }
}

/// The autotuner's kernel choices on each GPU (`ANYGPU_AUTOTUNE`).
pub fn print_tuning(devices: &[LogicalDevice]) {
    for d in devices {
        for t in d.tuning_decisions() {
            let times: Vec<String> = t
                .timings_ms
                .iter()
                .map(|(c, ms)| format!("{c} {ms:.3} ms"))
                .collect();
            println!(
                "autotune: {} {} [{}] -> {} ({:?}{}{})",
                d.name(),
                t.op,
                t.class,
                t.candidate,
                t.source,
                if times.is_empty() { "" } else { ": " },
                times.join(", ")
            );
        }
    }
}

pub fn print_memory(gpus: &[LogicalDevice]) {
    for d in gpus {
        match config::get_memory_stats(d.name()) {
            Ok(s) => println!(
                "memory: {} reserved {}, in use {}, peak {}",
                d.name(),
                anygpu::format_bytes(s.bytes_reserved),
                anygpu::format_bytes(s.bytes_in_use),
                anygpu::format_bytes(s.peak_bytes_in_use)
            ),
            Err(e) => println!("memory: {}: {e}", d.name()),
        }
    }
    // The host side (CPU:0 tensors, data, and software adapters' buffers): peak RSS on Linux.
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        if let Some(line) = status.lines().find(|l| l.starts_with("VmHWM:")) {
            let kb = line.trim_start_matches("VmHWM:").trim();
            println!("memory: host peak RSS {kb}");
        }
    }
}
