//! Background compile threads (`ANYGPU_COMPILE_THREADS`), on every GPU adapter: the first
//! kernel used from a shader file sends the file's other kernels to threads that compile them,
//! every kernel is compiled once however many threads ask for it, and training with background
//! threads gives the same weights, bit for bit, as without.

mod common;

use std::time::{Duration, Instant};

use anygpu::nn::{Sequential, Sgd};
use anygpu::ops::spec::Activation;
use anygpu::{LogicalDevice, Runtime, Tensor};

/// Entry points of `shaders/matmul.wgsl` besides the one a dense layer runs first: what the
/// background threads should compile after it (the file has 14).
const MATMUL_SIBLINGS_AT_LEAST: u64 = 10;

/// A runtime with `threads` background compile threads per adapter, tuning off (one kernel per
/// op: the counts below are the kernels' own).
fn runtime(threads: usize) -> Runtime {
    common::builder()
        .memory_growth(true)
        .env("ANYGPU_AUTOTUNE", Some("off"))
        .env("ANYGPU_COMPILE_THREADS", Some(&threads.to_string()))
        .build()
        .expect("runtime")
}

fn gpus(rt: &Runtime) -> Vec<LogicalDevice> {
    common::available(rt.list_logical_devices("GPU").expect("GPUs"))
}

fn compiled(dev: &LogicalDevice) -> u64 {
    dev.stream_stats().expect("a GPU").pipelines_compiled
}

/// A dense layer on `dev`, checked against the f64 oracle.
fn dense(dev: &LogicalDevice, seed: u64) {
    common::dense_checked(dev, (33, 70, 21), Activation::Relu, seed, 1e-5);
}

#[test]
fn the_first_kernel_of_a_file_has_its_siblings_compiled_in_the_background() {
    let Some(_) = common::gpus_at_least(1, "compile threads") else {
        return;
    };
    let (plain, threaded) = (runtime(0), runtime(2));
    for (without, with) in gpus(&plain).iter().zip(&gpus(&threaded)) {
        let before = compiled(without);
        dense(without, 1);
        let own = compiled(without) - before;
        assert!(own >= 1, "{}: the product compiled", without.name());
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            compiled(without) - before,
            own,
            "{}: without threads, only what ran is compiled",
            without.name()
        );

        let before = compiled(with);
        dense(with, 1);
        let deadline = Instant::now() + Duration::from_secs(60);
        while compiled(with) - before < own + MATMUL_SIBLINGS_AT_LEAST {
            assert!(
                Instant::now() < deadline,
                "{} ({}): {} pipelines compiled in 60 s, expected at least {}",
                with.name(),
                with.adapter_name(),
                compiled(with) - before,
                own + MATMUL_SIBLINGS_AT_LEAST
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // The kernels compiled ahead are the ones ops get: another product is right.
        dense(with, 7);
    }
}

#[test]
fn threads_asking_for_one_kernel_at_once_compile_it_once() {
    let Some(_) = common::gpus_at_least(1, "compile threads") else {
        return;
    };
    let once = runtime(0);
    let at_once = runtime(0);
    for (one, many) in gpus(&once).iter().zip(&gpus(&at_once)) {
        let before = compiled(one);
        dense(one, 3);
        let own = compiled(one) - before;

        let before = compiled(many);
        std::thread::scope(|s| {
            for t in 0..6 {
                s.spawn(move || dense(many, 10 + t));
            }
        });
        assert_eq!(
            compiled(many) - before,
            own,
            "{}: six threads compiled the product's kernels once",
            many.name()
        );
    }
}

/// Two steps of the small CNN on `dev`; its weights after them.
fn trained(dev: &LogicalDevice) -> Vec<Vec<f32>> {
    let _s = dev.scope();
    let mut model: Sequential =
        common::compiled(common::small_cnn(3).unwrap(), Sgd::new(0.05).into()).unwrap();
    let (x, y) = common::synthetic(16, 4);
    for step in 0..2 {
        let xb = Tensor::from_slice_on(&x[step * 8 * 64..][..8 * 64], &[8, 8, 8, 1], dev).unwrap();
        let yb = Tensor::from_slice_on(&y[step * 8..][..8], &[8], dev).unwrap();
        model.train_on_batch(&xb, &yb).unwrap();
    }
    model.get_weights().unwrap()
}

#[test]
fn training_with_background_compiles_gives_the_same_weights() {
    let Some(_) = common::gpus_at_least(1, "compile threads") else {
        return;
    };
    let (plain, threaded) = (runtime(0), runtime(4));
    for (without, with) in gpus(&plain).iter().zip(&gpus(&threaded)) {
        let want = trained(without);
        let got = trained(with);
        assert!(
            compiled(with) > compiled(without),
            "{}: the threads compiled more than the step used ({} vs {})",
            with.name(),
            compiled(with),
            compiled(without)
        );
        assert_eq!(got, want, "{}: weights after two steps", with.name());
    }
    // Dropped with compiles queued: nothing hangs or panics.
    let busy = runtime(4);
    for dev in gpus(&busy) {
        dense(&dev, 5);
    }
    drop(busy);
}
