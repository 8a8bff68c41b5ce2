//! When the driver refuses device memory, the device says so and nothing else breaks.
//!
//! A real GPU refuses an allocation when its memory is full; Mesa's software adapters refuse
//! one when the process may not map more, so the refusal is staged in a child process — this
//! test binary again, filtered to one `child_*` test — under an address-space limit
//! (`ulimit -v`), on lavapipe (Vulkan; GL drivers abort rather than report). The limit touches
//! no other test.

#![cfg(unix)]

mod common;

use std::process::Command;

use anygpu::{DType, DeviceKind, Error, LogicalDeviceConfiguration, Runtime, Tensor};

/// Set in the child: run the staged refusal.
const CHILD_VAR: &str = "ANYGPU_DRIVER_REFUSAL_CHILD";
/// The child's address space, in KiB: room for the process and Mesa, not for 8 GiB of arena.
const ADDRESS_SPACE_KIB: u64 = 3_000_000;
/// A memory limit far above what the child may map.
const LIMIT_MIB: u64 = 8192;
/// Elements of one tensor in the growth child: 64 MiB of f32.
const BIG: usize = 16 << 20;

/// Runs the child test `name` under the address-space limit and returns its output; `None`
/// (the test skipped) when there is no Vulkan adapter, which fails under
/// `ANYGPU_REQUIRE_ADAPTER=1`.
fn run_child(name: &str) -> Option<String> {
    let vulkan = Runtime::builder()
        .env("WGPU_BACKEND", Some("vulkan"))
        .env("ANYGPU_VISIBLE_DEVICES", None)
        .configure()
        .expect("a runtime configures")
        .list_physical_devices(DeviceKind::Gpu)
        .len();
    if vulkan == 0 {
        assert!(
            !common::adapter_required(),
            "{name}: ANYGPU_REQUIRE_ADAPTER=1 but there is no Vulkan adapter (lavapipe)"
        );
        eprintln!("SKIPPED {name}: needs a Vulkan adapter");
        return None;
    }
    let exe = std::env::current_exe().expect("the test binary knows its path");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {ADDRESS_SPACE_KIB} && exec \"$0\" --exact {name} --nocapture --test-threads 1"
        ))
        .arg(exe)
        .env(CHILD_VAR, "1")
        .output()
        .expect("sh runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the child failed: {text}");
    assert!(
        text.contains("CHILD DONE"),
        "the child ran no checks: {text}"
    );
    Some(text)
}

/// A runtime on lavapipe alone with GPU:0 capped at [`LIMIT_MIB`]: a logical device of that
/// size (reserved whole at initialization, TF's default), or under memory growth the
/// `ANYGPU_GPU_MEMORY_LIMIT_MB` budget.
fn runtime(growth: bool) -> Runtime {
    let limit = LIMIT_MIB.to_string();
    let rt = Runtime::builder()
        .env("WGPU_BACKEND", Some("vulkan"))
        .env("ANYGPU_VISIBLE_DEVICES", None)
        .env("ANYGPU_FORCE_GPU_ALLOW_GROWTH", None)
        .env(
            "ANYGPU_GPU_MEMORY_LIMIT_MB",
            growth.then_some(limit.as_str()),
        )
        .configure()
        .expect("a runtime configures");
    let gpu = rt.list_physical_devices(DeviceKind::Gpu)[0].clone();
    if growth {
        rt.set_memory_growth(&gpu, true).unwrap();
    } else {
        let capped = LogicalDeviceConfiguration::new().memory_limit(LIMIT_MIB);
        rt.set_logical_device_configuration(&gpu, &[capped])
            .unwrap();
    }
    rt.initialize()
        .expect("one refused device does not fail the runtime");
    rt
}

#[test]
fn a_reservation_the_driver_refuses_leaves_the_gpu_unavailable_and_the_cpu_working() {
    if let Some(child) = run_child("child_reserves_more_than_it_may_map") {
        eprintln!("{child}");
    }
}

#[test]
fn growth_the_driver_refuses_is_an_error_and_the_arena_still_serves() {
    if let Some(child) = run_child("child_grows_until_refused") {
        eprintln!("{child}");
    }
}

#[test]
fn child_reserves_more_than_it_may_map() {
    if std::env::var_os(CHILD_VAR).is_none() {
        return;
    }
    // Without growth the whole limit is reserved at initialization (TF's default).
    let rt = runtime(false);
    let gpu = rt.list_logical_devices(DeviceKind::Gpu).unwrap()[0].clone();
    assert!(
        !gpu.is_available(),
        "8 GiB cannot be reserved under the limit"
    );
    let err = Tensor::zeros_on(&[4], DType::F32, &gpu).unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("the driver refused a region of") && text.contains("device:GPU:0"),
        "the error says why and names the device: {text}"
    );
    let cpu = rt.cpu().unwrap();
    let x = Tensor::from_slice_on(&[1.0f32, 2.0, 3.0], &[3], &cpu).unwrap();
    assert_eq!(x.add(&x).unwrap().to_vec::<f32>().unwrap(), [2.0, 4.0, 6.0]);
    println!("CHILD DONE");
}

#[test]
fn child_grows_until_refused() {
    if std::env::var_os(CHILD_VAR).is_none() {
        return;
    }
    let rt = runtime(true);
    let gpu = rt.list_logical_devices(DeviceKind::Gpu).unwrap()[0].clone();
    assert!(
        gpu.is_available(),
        "with growth nothing is reserved up front"
    );
    // Host memory first: under the address-space limit, once the arena has taken what may be
    // mapped, the child's own allocations would fail too.
    let halves: Vec<f32> = (0..BIG).map(|i| (i % 2) as f32).collect();
    let kept = Tensor::from_slice_on(&halves, &[BIG], &gpu).unwrap();
    drop(halves);
    let mut held = Vec::new();
    let err = loop {
        match Tensor::zeros_on(&[BIG], DType::F32, &gpu) {
            Ok(t) => held.push(t),
            Err(e) => break e,
        }
        assert!(held.len() < 128, "the child maps 8 GiB under a 3 GB limit?");
    };
    assert!(matches!(err, Error::ResourceExhausted(_)), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("the driver refused a region of") && text.contains("device:GPU:0"),
        "{text}"
    );
    // What was allocated before is intact (its sum is exact in f32: 2^23 ones), and freed
    // blocks serve new tensors without growing.
    held.clear();
    let sum = kept.reduce_sum(None).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(sum, [(BIG / 2) as f32], "a refused growth corrupts nothing");
    let again = Tensor::zeros_on(&[BIG], DType::F32, &gpu).expect("a freed block serves");
    let info = rt.get_memory_info(gpu.name()).unwrap();
    assert_eq!(
        info.current,
        2 * (BIG * 4) as u64,
        "only the two tensors are live"
    );
    drop((kept, again));
    println!("CHILD DONE");
}
