//! Background compile threads (`ANYGPU_COMPILE_THREADS`), on every GPU adapter: while the tuner
//! measures, the first kernel used from a shader file sends the file's other kernels to threads
//! that compile them (and outside tuning nothing is compiled ahead), every kernel is compiled
//! once however many threads ask for it, and training with background threads gives the weights
//! it gives without.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anygpu::nn::{Sequential, Sgd};
use anygpu::ops::spec::Activation;
use anygpu::{LogicalDevice, Runtime, Tensor};

/// Pipelines beyond a tuned product's candidates that its file's other kernels add
/// (`shaders/matmul.wgsl` has 14 entry points).
const MORE_THAN_THE_CANDIDATES: u64 = 4;

/// A runtime with `threads` background compile threads per adapter, tuning `on` (from an empty
/// cache of its own, removed with it) or `off`.
struct Cold {
    rt: Runtime,
    cache: std::path::PathBuf,
}

impl Drop for Cold {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.cache).ok();
    }
}

fn runtime(threads: usize, tuning: &str) -> Cold {
    static RUNTIMES: AtomicUsize = AtomicUsize::new(0);
    let cache = std::env::temp_dir().join(format!(
        "anygpu-compile-threads-{}-{}",
        std::process::id(),
        RUNTIMES.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::remove_dir_all(&cache).ok();
    let rt = common::builder()
        .memory_growth(true)
        .env("ANYGPU_AUTOTUNE", Some(tuning))
        .env(
            "ANYGPU_CACHE_DIR",
            Some(cache.to_str().expect("a UTF-8 temp path")),
        )
        .env("ANYGPU_COMPILE_THREADS", Some(&threads.to_string()))
        .build()
        .expect("runtime");
    Cold { rt, cache }
}

fn gpus(cold: &Cold) -> Vec<LogicalDevice> {
    common::available(cold.rt.list_logical_devices("GPU").expect("GPUs"))
}

fn compiled(dev: &LogicalDevice) -> u64 {
    dev.stream_stats().expect("a GPU").pipelines_compiled
}

/// A dense layer on `dev`, checked against the f64 oracle.
fn dense(dev: &LogicalDevice, seed: u64) {
    common::dense_checked(dev, (33, 70, 21), Activation::Relu, seed, 1e-5);
}

#[test]
fn while_the_tuner_measures_a_files_other_kernels_compile_in_the_background() {
    let Some(_) = common::gpus_at_least(1, "compile threads") else {
        return;
    };
    let (plain, threaded) = (runtime(0, "on"), runtime(2, "on"));
    for (without, with) in gpus(&plain).iter().zip(&gpus(&threaded)) {
        let before = compiled(without);
        dense(without, 1);
        let tuned = compiled(without) - before;
        assert!(tuned >= 2, "{}: the candidates compiled", without.name());
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            compiled(without) - before,
            tuned,
            "{}: without threads, only what ran is compiled",
            without.name()
        );

        let before = compiled(with);
        dense(with, 1);
        // The tuner timed its candidates only once the queue had drained: the siblings are
        // compiled by the time the op returns.
        let done = compiled(with) - before;
        assert!(
            done >= tuned + MORE_THAN_THE_CANDIDATES,
            "{} ({}): {done} pipelines compiled when the tuned product returned, expected at least {}",
            with.name(),
            with.adapter_name(),
            tuned + MORE_THAN_THE_CANDIDATES
        );
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            compiled(with) - before,
            done,
            "{}: nothing compiled after",
            with.name()
        );
        // The kernels compiled ahead are the ones ops get: another product is right.
        dense(with, 7);
    }
}

#[test]
fn outside_tuning_nothing_is_compiled_ahead() {
    let Some(_) = common::gpus_at_least(1, "compile threads") else {
        return;
    };
    let rt = runtime(2, "off");
    for dev in gpus(&rt) {
        let before = compiled(&dev);
        dense(&dev, 2);
        let used = compiled(&dev) - before;
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(compiled(&dev) - before, used, "{}", dev.name());
    }
}

#[test]
fn threads_asking_for_one_kernel_at_once_compile_it_once() {
    let Some(_) = common::gpus_at_least(1, "compile threads") else {
        return;
    };
    let once = runtime(0, "off");
    let at_once = runtime(0, "off");
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
    let (plain, threaded) = (runtime(0, "on"), runtime(4, "on"));
    for (without, with) in gpus(&plain).iter().zip(&gpus(&threaded)) {
        let want = trained(without);
        let got = trained(with);
        assert!(
            compiled(with) > compiled(without),
            "{}: the threads compiled more than the steps used ({} vs {})",
            with.name(),
            compiled(with),
            compiled(without)
        );
        // The tuner may pick other kernels in the two runtimes: equal within rounding.
        for (g, w) in got.iter().zip(&want) {
            common::assert_close(
                &format!("{}: weights after two steps", with.name()),
                g,
                w,
                1e-4,
            );
        }
    }
    // Dropped with compiles queued: nothing hangs or panics.
    let busy = runtime(4, "on");
    for dev in gpus(&busy) {
        dense(&dev, 5);
    }
    drop(busy);
}
