//! Shared test helpers: runtimes on the software adapters, and the rule that a missing GPU is a
//! failure under `ANYGPU_REQUIRE_ADAPTER=1` (CI) and a loud skip elsewhere.
#![allow(dead_code)]

pub mod golden;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anygpu::nn::{
    Activation, Conv2D, Dense, Flatten, Layer, Loss, MaxPool2D, Metric, Optimizer, SeparableConv2D,
    Sequential, Verbosity,
};
use anygpu::ops::spec::Padding;
use anygpu::{Error, LogicalDevice, Result, Runtime, RuntimeBuilder, Tensor};

/// A [`Dense`] layer with injected faults: its backward pass fails while `fail_backward` is
/// set (the stand-in for a device running out of memory half-way through it), and its forward
/// pass panics while `panic_forward` is set.
#[derive(Debug, Clone)]
pub struct Flaky {
    pub inner: Dense,
    pub fail_backward: Arc<AtomicBool>,
    pub panic_forward: Arc<AtomicBool>,
}

impl Flaky {
    /// `inner` with both faults off.
    pub fn new(inner: Dense) -> Flaky {
        Flaky {
            inner,
            fail_backward: Arc::default(),
            panic_forward: Arc::default(),
        }
    }
}

impl Layer for Flaky {
    fn class_name(&self) -> &'static str {
        self.inner.class_name()
    }
    fn base_name(&self) -> &'static str {
        self.inner.base_name()
    }
    fn declared_input_shape(&self) -> Option<&[usize]> {
        self.inner.declared_input_shape()
    }
    fn activation(&self) -> Activation {
        Layer::activation(&self.inner)
    }
    fn compute_output_shape(&self, input_shape: &[usize]) -> Result<Vec<usize>> {
        self.inner.compute_output_shape(input_shape)
    }
    fn build(&mut self, input_shape: &[usize], seed: u64, device: &LogicalDevice) -> Result<()> {
        self.inner.build(input_shape, seed, device)
    }
    fn weights(&self) -> Vec<(&'static str, &Tensor)> {
        self.inner.weights()
    }
    fn set_weight(&mut self, index: usize, value: Tensor) -> Result<()> {
        self.inner.set_weight(index, value)
    }
    fn forward(&self, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        if self.panic_forward.load(Ordering::SeqCst) {
            panic!("injected: forward panics");
        }
        self.inner.forward(x)
    }
    fn backward(
        &self,
        saved: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Vec<Tensor>)> {
        if self.fail_backward.load(Ordering::SeqCst) {
            return Err(Error::Model("injected: out of memory in backward".into()));
        }
        self.inner.backward(saved, dy, need_dx)
    }
    fn boxed_clone(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }
}

/// The backends tests search: `WGPU_BACKEND` if set, else Vulkan and GL (lavapipe + llvmpipe).
pub fn backends() -> String {
    std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "vulkan,gl".to_string())
}

/// A builder searching [`backends`], with no other environment overrides.
pub fn builder() -> RuntimeBuilder {
    Runtime::builder()
        .env("WGPU_BACKEND", Some(&backends()))
        .env("ANYGPU_VISIBLE_DEVICES", None)
        .env("ANYGPU_FORCE_GPU_ALLOW_GROWTH", None)
        .env("ANYGPU_GPU_MEMORY_LIMIT_MB", None)
        .env("ANYGPU_SOFTWARE_ADAPTERS_AS_GPUS", None)
}

/// Whether CI demands a GPU.
pub fn adapter_required() -> bool {
    std::env::var("ANYGPU_REQUIRE_ADAPTER").as_deref() == Ok("1")
}

/// Number of physical GPUs; at least `min`, or the test is skipped (returns `None`) — unless
/// `ANYGPU_REQUIRE_ADAPTER=1`, where too few GPUs fail the test.
pub fn gpus_at_least(min: usize, test: &str) -> Option<usize> {
    let n = builder()
        .configure()
        .expect("a runtime without settings configures")
        .list_physical_devices("GPU")
        .len();
    if n >= min {
        return Some(n);
    }
    if adapter_required() && min <= 1 {
        panic!(
            "{test}: ANYGPU_REQUIRE_ADAPTER=1 but no GPU adapter was found (backends {})",
            backends()
        );
    }
    if adapter_required() && backends().contains("vulkan") && backends().contains("gl") {
        panic!("{test}: needs {min} GPUs; with Mesa and WGPU_BACKEND=vulkan,gl there should be lavapipe and llvmpipe, found {n}");
    }
    eprintln!("SKIPPED {test}: needs {min} GPU(s), found {n}");
    None
}

/// CPU:0 and every GPU of `rt` the runtime could open; a missing GPU fails `test` under
/// `ANYGPU_REQUIRE_ADAPTER=1`.
pub fn all_devices(rt: &Runtime, test: &str) -> Vec<LogicalDevice> {
    gpus_at_least(1, test);
    available(
        rt.list_logical_devices(anygpu::KindFilter::All)
            .expect("devices"),
    )
}

/// The devices the runtime could open: an adapter the driver refused stays listed, unavailable
/// (NVIDIA's OpenGL adapter on a machine without a display: "Parent device is lost"), and runs
/// no op.
pub fn available(devices: Vec<LogicalDevice>) -> Vec<LogicalDevice> {
    devices
        .into_iter()
        .filter(LogicalDevice::is_available)
        .collect()
}

/// `ops::dense` of random `m×k` and `k×n` matrices and a bias (from `seed`) on `dev`, checked
/// against the f64 oracle within `tol`.
pub fn dense_checked(
    dev: &LogicalDevice,
    (m, k, n): (usize, usize, usize),
    act: anygpu::ops::spec::Activation,
    seed: u64,
    tol: f64,
) {
    use anygpu::ops::reference::{self, random_vec, to_f64};
    let (a, w, b) = (
        random_vec(m * k, seed),
        random_vec(k * n, seed + 1),
        random_vec(n, seed + 2),
    );
    let put = |data: &[f32], shape: &[usize]| Tensor::from_slice_on(data, shape, dev).unwrap();
    let y = {
        let _s = dev.scope();
        anygpu::ops::dense(
            &put(&a, &[m, k]),
            &put(&w, &[k, n]),
            Some(&put(&b, &[n])),
            act,
        )
        .unwrap()
    };
    let (a, w, b) = (to_f64(&a), to_f64(&w), to_f64(&b));
    let expected = reference::matmul_bias_act(&a, &w, Some(&b), m, k, n, act);
    let what = format!("dense on {} ({})", dev.name(), dev.adapter_name());
    reference::assert_close(&y.to_vec::<f32>().unwrap(), &expected, tol, &what);
}

/// Deterministic values in [-1, 1).
pub fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `n` examples of 8×8×1: class `k` brightens band `k` of rows, plus noise.
pub fn synthetic(n: usize, seed: u64) -> (Vec<f32>, Vec<i32>) {
    let noise = values(n * 64, seed);
    let mut x = Vec::with_capacity(n * 64);
    let mut y = Vec::with_capacity(n);
    for i in 0..n {
        let class = (i * 7 + seed as usize) % 3;
        for p in 0..64 {
            let row = p / 8;
            let signal = if row / 3 == class { 1.0 } else { -0.3 };
            x.push(signal + 0.3 * noise[i * 64 + p]);
        }
        y.push(class as i32);
    }
    (x, y)
}

/// A small CNN with every layer type: input 8×8×1, 3 classes, built with `add` (so on the
/// current scope's device, or mirrored under a strategy).
pub fn small_cnn(seed: u64) -> anygpu::Result<Sequential> {
    let mut m = Sequential::with_seed(seed);
    let selu = Activation::Selu;
    m.add(
        Conv2D::new(4, 3)
            .padding(Padding::Same)
            .activation(selu)
            .input_shape(&[8, 8, 1]),
    )?;
    m.add(
        SeparableConv2D::new(6, 3)
            .padding(Padding::Same)
            .activation(selu),
    )?;
    m.add(MaxPool2D::new())?;
    m.add(Flatten::new())?;
    m.add(Dense::new(12).activation(selu))?;
    m.add(Dense::new(3).activation(Activation::Softmax))?;
    Ok(m)
}

/// `m` compiled for the 3 classes with accuracy, silent.
pub fn compiled(mut m: Sequential, optimizer: Optimizer) -> anygpu::Result<Sequential> {
    m.compile(
        Loss::sparse_categorical_crossentropy(),
        optimizer,
        &[Metric::Accuracy],
    )?;
    m.set_verbose(Verbosity::Silent);
    Ok(m)
}

/// Each of `got` within `tol` of `want`, relative to max(1, |want|).
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / w.abs().max(1.0);
        assert!(err <= tol, "{what}[{i}]: {g} vs {w} (error {err:e})");
    }
}

/// Every candidate the autotuner can pick (`ANYGPU_AUTOTUNE_FORCE` names), for the tests that
/// force each in turn.
pub const TUNING_CANDIDATES: [&str; 28] = [
    "tile64_v4",
    "tall_16x8",
    "tall_16x4",
    "splitk_v4",
    "smem64_v4",
    "smem128_v4",
    "ubo8",
    "tile64",
    "tall",
    "splitk",
    "untransposed",
    "rows_v4",
    "rows_wg",
    "rows_sg",
    "rows4x4",
    "tile8x8",
    "smem64",
    "ubo_c1",
    "co8",
    "co16",
    "fused",
    "separate",
    "direct",
    "product",
    "chunks_2k",
    "chunks_8k",
    "chunks_32k",
    "chunks_128k",
];

/// The candidates that keep float32 values in uniform windows: never offered for float16.
pub const FLOAT32_ONLY_CANDIDATES: [&str; 2] = ["ubo8", "ubo_c1"];
