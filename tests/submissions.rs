//! How an adapter's commands reach its queue: after the host waited for the queue to drain
//! (`synchronize`, a read of the last work), the first command buffer goes out after 8
//! commands on a hardware GPU, each next one after twice as many, up to 64; software adapters
//! submit 64 at a time from the first; `ANYGPU_FIRST_SUBMIT` sets the first everywhere (64:
//! no ramp). (That a read with later work behind it leaves the ramp alone is a unit test of
//! `stream::Batching`.)

mod common;

use anygpu::{DeviceKind, LogicalDevice, Runtime, Tensor};

fn gpus(rt: &Runtime) -> Vec<LogicalDevice> {
    let gpus = rt.list_logical_devices(DeviceKind::Gpu).expect("devices");
    let gpus = common::available(gpus);
    if gpus.is_empty() {
        assert!(!common::adapter_required(), "no GPU adapter");
        eprintln!("SKIPPED: no GPU adapter");
    }
    gpus
}

fn submits(dev: &LogicalDevice) -> u64 {
    dev.stream_stats().expect("a GPU").submits
}

fn dispatches(dev: &LogicalDevice) -> u64 {
    dev.stream_stats().expect("a GPU").dispatches
}

/// Runs `count` one-dispatch ops on `dev` and returns, for each submission they caused, how
/// many of them had been recorded when it went out.
fn submitted_after(dev: &LogicalDevice, x: &Tensor, count: usize) -> Vec<usize> {
    let mut at = Vec::new();
    let mut kept = Vec::with_capacity(count);
    for i in 1..=count {
        let (s0, d0) = (submits(dev), dispatches(dev));
        kept.push(x.add(x).expect("add"));
        assert_eq!(
            dispatches(dev) - d0,
            1,
            "{}: add is one dispatch",
            dev.name()
        );
        if submits(dev) > s0 {
            at.push(i);
        }
    }
    at
}

fn on_device(dev: &LogicalDevice) -> Tensor {
    let values: Vec<f32> = common::values(1024, 3);
    let x = Tensor::from_slice_on(&values, &[1024], dev).expect("upload");
    dev.synchronize().expect("synchronize");
    x
}

#[test]
fn after_a_drained_queue_submissions_ramp_up_from_eight_commands() {
    let rt = common::builder()
        .env("ANYGPU_FIRST_SUBMIT", Some("8"))
        .build()
        .expect("runtime");
    for dev in gpus(&rt) {
        let x = on_device(&dev);
        // 8, then 16 more, 32, 64, 64.
        assert_eq!(
            submitted_after(&dev, &x, 200),
            [8, 24, 56, 120, 184],
            "{}",
            dev.name()
        );
        dev.synchronize().expect("synchronize");
        assert_eq!(submitted_after(&dev, &x, 30), [8, 24], "{}", dev.name());

        // A read of the last work drains the queue too.
        let sum = x.add(&x).expect("add").to_vec::<f32>().expect("read");
        assert_eq!(sum.len(), 1024);
        assert_eq!(submitted_after(&dev, &x, 10), [8], "{}", dev.name());
        dev.synchronize().expect("synchronize");
    }
}

#[test]
fn hardware_gpus_ramp_by_default_and_software_adapters_do_not() {
    let rt = common::builder()
        .env("ANYGPU_FIRST_SUBMIT", None)
        .build()
        .expect("runtime");
    for dev in gpus(&rt) {
        let x = on_device(&dev);
        let want: &[usize] = if dev.is_software() {
            &[64, 128]
        } else {
            &[8, 24, 56, 120]
        };
        assert_eq!(submitted_after(&dev, &x, 130), want, "{}", dev.name());
    }
}

#[test]
fn first_submit_comes_from_the_environment() {
    for (value, want) in [
        ("64", vec![64, 128]),
        ("3", vec![3, 9, 21, 45, 93]),
        // Above the usual batch: the usual batch.
        ("500", vec![64, 128]),
    ] {
        let rt = common::builder()
            .env("ANYGPU_FIRST_SUBMIT", Some(value))
            .build()
            .expect("runtime");
        for dev in gpus(&rt) {
            let x = on_device(&dev);
            assert_eq!(
                submitted_after(&dev, &x, 130),
                want,
                "ANYGPU_FIRST_SUBMIT={value} on {}",
                dev.name()
            );
        }
    }
}
