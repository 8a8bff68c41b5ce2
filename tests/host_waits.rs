//! The host waits of a training step, as the profiler names them: a plain `fit` step on a GPU
//! waits only where `fit` reads its logs (every `log_every` steps and at the epoch's end),
//! `log_every(1)` makes that one read per step, loss scaling adds none (the device decides
//! whether a step applies, and the host reads the scale late, without waiting), and the
//! optimizer's update is one fused dispatch per step. Its own binary: the profiler is one per
//! process.

mod common;

use common::{compiled, small_cnn, synthetic};

use anygpu::data::Dataset;
use anygpu::mixed_precision::{self, Policy};
use anygpu::nn::{Optimizer, Sgd};
use anygpu::profiler::{self, Report};
use anygpu::{DeviceKind, KindFilter};

const LOG_CAUSE: &str = "fit: logs (log_every, epoch end)";
/// What loss scaling's waits are named after (the host path's finiteness check among them).
const LOSS_SCALE_CAUSE: &str = "LossScaleOptimizer";
/// Batches an epoch.
const STEPS: u64 = 4;
/// Host reads of one log read: the loss sum and the accuracy sum.
const READS: u64 = 2;

fn waits(report: &Report, cause: &str) -> u64 {
    report
        .host_waits()
        .iter()
        .filter(|w| w.cause == cause)
        .map(|w| w.waits)
        .sum()
}

/// Waits whose cause starts with `prefix`.
fn waits_named(report: &Report, prefix: &str) -> u64 {
    report
        .host_waits()
        .iter()
        .filter(|w| w.cause.starts_with(prefix))
        .map(|w| w.waits)
        .sum()
}

fn profiled_epoch(
    model: &mut anygpu::nn::Sequential,
    data: &Dataset,
    tag: &str,
) -> (Report, serde_json::Value) {
    let dir = std::env::temp_dir().join(format!("anygpu-waits-{tag}-{}", std::process::id()));
    profiler::start(&dir).expect("profiler");
    let fitted = model.fit(data, 1, None, None);
    let report = profiler::stop().expect("report");
    fitted.expect("fit");
    let top = std::fs::read_to_string(dir.join("top_ops.txt")).expect("top_ops.txt");
    let trace = std::fs::read_to_string(dir.join("trace.json")).expect("trace.json");
    std::fs::remove_dir_all(&dir).ok();
    if report.host_wait_count() > 0 {
        assert!(
            top.contains("host wait"),
            "{tag}: top_ops.txt lists the waits:\n{top}"
        );
        assert!(
            trace.contains("\"cat\":\"wait\""),
            "{tag}: trace.json shows them"
        );
    }
    let trace = serde_json::from_str(&trace).expect("trace.json is JSON");
    (report, trace)
}

/// The (start, end) in µs of the trace events of category `cat` whose name is `name`.
fn events(trace: &serde_json::Value, cat: &str, name: &str) -> Vec<(f64, f64)> {
    trace["traceEvents"]
        .as_array()
        .expect("traceEvents")
        .iter()
        .filter(|e| e["cat"] == cat && e["name"] == name)
        .map(|e| {
            let ts = e["ts"].as_f64().expect("ts");
            (ts, ts + e["dur"].as_f64().expect("dur"))
        })
        .collect()
}

#[test]
fn a_fit_step_waits_for_the_host_only_where_it_reads_its_logs() {
    if common::gpus_at_least(1, "host_waits").is_none() {
        return;
    }
    let rt = common::builder()
        .env("ANYGPU_AUTOTUNE", Some("off"))
        .build()
        .expect("a runtime");
    let gpu = rt
        .list_logical_devices(KindFilter::Kind(DeviceKind::Gpu))
        .expect("GPUs")[0]
        .clone();
    let _scope = gpu.scope();
    let (x, y) = synthetic(16 * STEPS as usize, 3);
    let data = Dataset::from_tensor_slices(x, &[8, 8, 1], y)
        .expect("dataset")
        .batch(16, false);
    for (tag, optimizer, policy) in [
        (
            "sgd",
            Optimizer::from(Sgd::new(0.01).momentum(0.9)),
            Policy::FLOAT32,
        ),
        // compile wraps the optimizer in a LossScaleOptimizer, as Keras does.
        ("loss scaling", Sgd::new(0.01).into(), Policy::MIXED_FLOAT16),
    ] {
        mixed_precision::set_global_policy(policy).expect("policy");
        let built = small_cnn(1);
        mixed_precision::set_global_policy(Policy::FLOAT32).expect("policy");
        let mut model = compiled(built.expect("model"), optimizer).expect("compile");
        assert_eq!(
            model.optimizer().map(Optimizer::name) == Some("LossScaleOptimizer"),
            tag == "loss scaling"
        );
        // Warm-up: kernels compiled, slots and update tables allocated.
        model.fit(&data, 1, None, None).expect("warm-up fit");

        model.set_log_every(1000);
        let (report, _) = profiled_epoch(&mut model, &data, tag);
        let listed = format!("{tag}: {:?}", report.host_waits());
        assert_eq!(
            waits(&report, LOG_CAUSE),
            READS,
            "one log read, at the end: {listed}"
        );
        assert_eq!(
            waits_named(&report, LOSS_SCALE_CAUSE),
            0,
            "no wait for loss scaling: {listed}"
        );
        assert_eq!(report.host_wait_count(), READS, "no other wait: {listed}");
        let update = report
            .ops()
            .iter()
            .find(|o| o.op == "FusedApplyGradients")
            .unwrap_or_else(|| panic!("{tag}: the fused update runs: {report}"));
        assert_eq!(update.calls, STEPS, "{tag}: one update per step");
        assert_eq!(update.kernels, STEPS, "{tag}: one dispatch per update");
        assert!(
            report
                .ops()
                .iter()
                .all(|o| !o.op.starts_with("ResourceApply")),
            "{tag}: no per-variable update: {report}"
        );
        if tag == "loss scaling" {
            // One finiteness check over every gradient and one step of Keras' rules a step.
            for op in ["IsFinite", "LossScaleUpdate"] {
                let o = report
                    .ops()
                    .iter()
                    .find(|o| o.op == op)
                    .unwrap_or_else(|| panic!("{tag}: {op} runs: {report}"));
                assert_eq!((o.calls, o.kernels), (STEPS, STEPS), "{tag}: {op}");
            }
        }

        // A log step's read is finished once the next step is recorded: the host waits for
        // step 2 inside step 3, while the device has step 3 to run.
        model.set_log_every(2);
        let (report, trace) = profiled_epoch(&mut model, &data, tag);
        let listed = format!("{tag}: {:?}", report.host_waits());
        assert_eq!(
            waits(&report, LOG_CAUSE),
            2 * READS,
            "steps 2 and 4: {listed}"
        );
        let step3 = events(&trace, "span", "train step 3");
        let log_waits = events(&trace, "wait", &format!("host wait: {LOG_CAUSE}"));
        assert_eq!(step3.len(), 1, "{tag}: one span per step");
        let inside = |w: &(f64, f64)| w.0 >= step3[0].0 && w.1 <= step3[0].1;
        assert_eq!(
            log_waits.iter().filter(|w| inside(w)).count() as u64,
            READS,
            "{tag}: step 2's logs are read during step 3: {log_waits:?} vs {step3:?}"
        );

        model.set_log_every(1);
        let (report, _) = profiled_epoch(&mut model, &data, tag);
        let listed = format!("{tag}: {:?}", report.host_waits());
        assert_eq!(
            waits(&report, LOG_CAUSE),
            STEPS * READS,
            "a log read per step: {listed}"
        );
        assert_eq!(
            report.host_wait_count(),
            STEPS * READS,
            "no other wait: {listed}"
        );
        if tag == "loss scaling" {
            // The device decided every step; the host learns the outcome when it asks.
            assert_eq!(model.iterations(), 4 * STEPS, "{tag}: every step applied");
            assert_eq!(model.loss_scale(), Some(32768.0), "{tag}");
        }
    }
}
