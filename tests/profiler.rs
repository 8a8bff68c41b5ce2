//! The profiler on every device: ops recorded with their device, calls, bytes and time; GPU
//! kernels timed on the device; results unchanged; the trace readable; TF's errors.

mod common;

use std::sync::Mutex;
use std::time::Instant;

use anygpu::ops::reference::{assert_close, matmul, random_vec, to_f64};
use anygpu::profiler::{self, Timing};
use anygpu::{DeviceKind, Error, KindFilter, LogicalDevice, Runtime, Tensor};

/// One profiler per process: the tests take turns.
static PROFILER: Mutex<()> = Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    PROFILER.lock().unwrap_or_else(|e| e.into_inner())
}

fn logdir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("anygpu-profiler-{name}-{}", std::process::id()))
}

/// CPU:0 and every GPU, with their runtime (scopes place ops through it: keep it alive).
fn devices() -> (Runtime, Vec<LogicalDevice>) {
    let gpus = common::gpus_at_least(1, "profiler").unwrap_or(0);
    let rt = common::builder().build().expect("runtime");
    let devices = rt.list_logical_devices(KindFilter::All).expect("devices");
    assert_eq!(devices.len(), gpus + 1, "CPU:0 and every GPU");
    (rt, common::available(devices))
}

#[test]
fn stop_without_start_and_a_second_start_give_tensorflows_errors() {
    let _turn = turn();
    let err = profiler::stop().unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "Cannot export profiling results. No profiler is running."
    );
    let dir = logdir("errors");
    profiler::start(&dir).unwrap();
    let err = profiler::start(&dir).unwrap_err();
    assert!(matches!(err, Error::AlreadyExists(_)), "{err:?}");
    assert_eq!(err.to_string(), "Another profiler is running.");
    assert!(profiler::is_running());
    profiler::stop().unwrap();
    assert!(!profiler::is_running());
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn every_op_is_recorded_with_its_device_calls_bytes_and_time() {
    let _turn = turn();
    let (m, k, n) = (48, 40, 56);
    let a = random_vec(m * k, 1);
    let b = random_vec(k * n, 2);
    let expected = matmul(&to_f64(&a), &to_f64(&b), m, k, n, false, false);
    let (_rt, devices) = devices();
    for dev in devices {
        let what = format!("MatMul on {} ({})", dev.name(), dev.adapter_name());
        let ta = Tensor::from_slice_on(&a, &[m, k], &dev).unwrap();
        let tb = Tensor::from_slice_on(&b, &[k, n], &dev).unwrap();
        dev.synchronize().unwrap();
        let dir = logdir(&format!("ops-{}", dev.name().replace(['/', ':'], "_")));
        let wall = Instant::now();
        profiler::start(&dir).unwrap();
        let outs: Vec<Tensor> = {
            let _s = dev.scope();
            let _span = profiler::Trace::new("three products");
            (0..3).map(|_| ta.matmul(&tb).unwrap()).collect()
        };
        dev.synchronize().unwrap();
        let report = profiler::stop().unwrap();
        let wall_ms = wall.elapsed().as_secs_f64() * 1e3;

        // Profiling changes no result.
        for out in &outs {
            assert_close(&out.to_vec::<f32>().unwrap(), &expected, 1e-4, &what);
        }
        let row = report
            .ops()
            .iter()
            .find(|o| o.op == "MatMul" && o.device == dev.name())
            .unwrap_or_else(|| panic!("{what}: no MatMul row in\n{report}"));
        assert_eq!(row.calls, 3, "{what}");
        // The outputs at least; a GPU kernel may take scratch memory too.
        let outputs = 3 * (m * n * 4) as u64;
        assert!(row.bytes_allocated >= outputs, "{what}: {row:?}");
        assert!(row.total_ms > 0.0, "{what}: no time in\n{report}");
        assert!(
            row.total_ms <= wall_ms,
            "{what}: {} ms of op time within {wall_ms} ms of wall time (units?)",
            row.total_ms
        );
        match dev.device_type() {
            DeviceKind::Cpu => {
                assert_eq!(row.timing, Timing::Host, "{what}");
                assert_eq!(row.bytes_allocated, outputs, "{what}");
                assert_eq!(row.kernels, 0, "{what}");
            }
            DeviceKind::Gpu => {
                // Mesa's lavapipe and llvmpipe both have timestamp queries.
                assert_eq!(row.timing, Timing::Device, "{what}");
                assert!(row.kernels >= 3, "{what}: {} kernels", row.kernels);
                assert!(report.kernels_timed() >= 3, "{what}");
            }
        }
        let table = std::fs::read_to_string(dir.join("top_ops.txt")).unwrap();
        assert_eq!(table, report.to_string());
        assert!(table.contains("MatMul"), "{table}");

        let trace: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("trace.json")).unwrap())
                .expect("trace.json is JSON");
        let events = trace["traceEvents"].as_array().expect("traceEvents");
        let of = |cat: &str| {
            events
                .iter()
                .filter(|e| e["ph"] == "X" && e["cat"] == cat)
                .count()
        };
        assert!(of("op") >= 3, "{what}: op events");
        assert_eq!(of("span"), 1, "{what}: the Trace span");
        if dev.device_type() == DeviceKind::Gpu {
            assert!(of("kernel") >= 3, "{what}: kernel events");
            let kernel = events.iter().find(|e| e["cat"] == "kernel").unwrap();
            assert_eq!(kernel["args"]["op"], "MatMul", "{what}: {kernel}");
            assert!(kernel["dur"].as_f64().unwrap() >= 0.0);
        }
        for e in events.iter().filter(|e| e["ph"] == "X") {
            assert!(
                e["ts"].as_f64().is_some() && e["dur"].as_f64().is_some(),
                "{e}"
            );
        }
        std::fs::remove_dir_all(dir).ok();
    }
}

#[test]
fn nothing_is_recorded_while_the_profiler_is_off() {
    let _turn = turn();
    let (_rt, mut devices) = devices();
    let dev = devices.pop().expect("a device");
    let a = Tensor::from_slice_on(&random_vec(64, 3), &[8, 8], &dev).unwrap();
    let _before = a.matmul(&a).unwrap();
    let dir = logdir("off");
    profiler::start(&dir).unwrap();
    let report = profiler::stop().unwrap();
    let _after = a.matmul(&a).unwrap();
    assert!(
        report
            .ops()
            .iter()
            .all(|o| !(o.op == "MatMul" && o.device == dev.name())),
        "ops outside the session were recorded:\n{report}"
    );
    std::fs::remove_dir_all(dir).ok();
}
