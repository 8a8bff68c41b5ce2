//! Mixed precision: float16 casts and kernels against the f64 oracle on every adapter with
//! float16 (lavapipe here), dynamic loss scaling against Keras' rules, and `mixed_float16`
//! training on every device (CPU:0 and llvmpipe compute in float32 under the policy).
//!
//! Every test name has `f16`, `mixed` or `loss_scale` in it: `cargo test --release -- f16 mixed
//! loss_scale` runs them all.
//!
//! Tolerances come from float16's precision: inputs are float16 values (so the oracle sees what
//! the kernel sees) and products and sums accumulate in float32, so what is left is the
//! rounding of each stored result to float16 (half an ulp, `2^-11` relative) and of partial
//! sums kept in float16 between passes; `F16_TOL` allows four ulps (`4 × 2^-10`) relative to
//! max(1, |expected|).

mod common;

use std::sync::{Mutex, MutexGuard};

use anygpu::mixed_precision::{self, Policy};
use anygpu::nn::{
    Adam, Dense, Flatten, Layer, LossScaleOptimizer, Optimizer, Pipeline, Sequential, Sgd,
};
use anygpu::ops;
use anygpu::ops::reference::{self as r, assert_close, random_vec, to_f64};
use anygpu::ops::spec::{Activation, Conv2dShape, ConvOptions, DepthwiseShape, Padding, PoolShape};
use anygpu::ops::GradDType;
use anygpu::{DType, DeviceKind, KindFilter, LogicalDevice, Runtime, Tensor};
use half::f16;

/// Four float16 ulps at 1, relative to max(1, |expected|).
const F16_TOL: f64 = 4.0 * 0.000_976_562_5;

/// One test at a time: some set the global policy, which layers read when added.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn runtime() -> Runtime {
    common::builder()
        .memory_growth(true)
        .build()
        .expect("the runtime initializes")
}

/// Every device the runtime could open (see [`common::available`]).
fn available_devices(rt: &Runtime) -> Vec<LogicalDevice> {
    common::available(rt.list_logical_devices(KindFilter::All).expect("devices"))
}

/// The GPUs with float16 kernels; under `ANYGPU_REQUIRE_ADAPTER=1` with Mesa's Vulkan driver
/// there must be one (lavapipe has `shaderFloat16`).
fn f16_gpus(rt: &Runtime, test: &str) -> Vec<LogicalDevice> {
    let gpus: Vec<LogicalDevice> = rt
        .list_logical_devices(KindFilter::Kind(DeviceKind::Gpu))
        .expect("devices")
        .into_iter()
        .filter(LogicalDevice::has_f16)
        .collect();
    if gpus.is_empty() {
        if common::adapter_required() && common::backends().contains("vulkan") {
            panic!(
                "{test}: ANYGPU_REQUIRE_ADAPTER=1 but no adapter with float16 (lavapipe has it)"
            );
        }
        eprintln!("SKIPPED {test}: no adapter with float16");
    }
    gpus
}

/// `values` rounded to float16 and back: what a float16 tensor of them holds.
fn quantized(values: &[f32]) -> Vec<f32> {
    values.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
}

/// Random float16 values in [-1, 1), as float32, and a float16 tensor of them on `dev`.
fn half_input(dev: &LogicalDevice, shape: &[usize], seed: u64) -> (Vec<f32>, Tensor) {
    let len = shape.iter().product();
    let values = quantized(&random_vec(len, seed));
    let halves: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
    let t = Tensor::from_slice_on(&halves, shape, dev).expect("upload");
    (values, t)
}

/// A float16 tensor's values as float32, checking that it is float16 and on `dev`.
fn read(t: &Tensor, dev: &LogicalDevice) -> Vec<f32> {
    assert_eq!(t.dtype(), DType::F16, "{t:?} is not float16");
    assert_eq!(t.device(), dev.full_name(), "the op left {}", dev.name());
    t.to_vec::<f16>()
        .expect("readback")
        .into_iter()
        .map(f16::to_f32)
        .collect()
}

/// A float32 tensor's values, checking that it is float32 and on `dev`: the weight gradients
/// a layer asks for ([`GradDType::Float32`]).
fn read_f32(t: &Tensor, dev: &LogicalDevice) -> Vec<f32> {
    assert_eq!(t.dtype(), DType::F32, "{t:?} is not float32");
    assert_eq!(t.device(), dev.full_name(), "the op left {}", dev.name());
    t.to_vec::<f32>().expect("readback")
}

/// Float32 sums of float16 inputs (every product of two float16 values is exact in float32).
const SUM_TOL: f64 = 1e-5;

fn label(dev: &LogicalDevice) -> String {
    format!("{} ({})", dev.name(), dev.adapter_name())
}

#[test]
fn f16_casts_round_to_nearest_on_every_device() {
    let _g = serial();
    let rt = runtime();
    let devices = common::available(rt.list_logical_devices(KindFilter::All).expect("devices"));
    // Odd lengths (the last pair half empty), values around float16's range and its
    // subnormals, and past it (→ ±inf).
    let mut values = random_vec(1001, 5);
    values.extend([65504.0, 65520.0, -70000.0, 1.0e-7, 6.0e-5, 0.1, -2.5e-8]);
    for dev in &devices {
        if dev.device_type() == DeviceKind::Gpu && !dev.has_f16() {
            continue;
        }
        let _s = dev.scope();
        let x = Tensor::from_slice_on(&values, &[values.len()], dev).expect("upload");
        let h = x.cast(DType::F16).expect("cast to half");
        assert_eq!(h.dtype(), DType::F16);
        assert_eq!(h.device(), dev.full_name());
        let halves = h.to_vec::<f16>().expect("readback");
        for (i, (&got, &v)) in halves.iter().zip(&values).enumerate() {
            let want = f16::from_f32(v);
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{} element {i}: {v} became {got}, not {want}",
                label(dev)
            );
        }
        let back = h
            .cast(DType::F32)
            .expect("cast back")
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(back, quantized(&values), "{}", label(dev));
        assert!(back.contains(&f32::INFINITY) && back.contains(&f32::NEG_INFINITY));
    }
}

/// `ops::cast_all` gives each tensor what its own cast gives, bit for bit, on every device: a
/// GPU in one dispatch when one arena region holds them all, and in one per pair of regions
/// when memory growth spread them over several.
#[test]
fn f16_cast_all_rounds_like_cast_in_one_dispatch_on_every_device() {
    let _g = serial();
    let mut values = random_vec(5003, 7);
    values.extend([65504.0, 65520.0, -70000.0, 1.0e-7, 6.0e-5, 0.1, -2.5e-8]);
    // Lengths around the kernel's chunk of 1024 and its vec4s, an empty tensor, and five of
    // 1.2 MB: under memory growth (a first region of 2 MiB, then 4, 8, ...) those take three
    // regions, more than one dispatch binds.
    let lengths = [1, 3, 1023, 1024, 1025, 4099, 0, 5010];
    let lengths = lengths.iter().chain(&[300_001; 5]);
    for growth in [false, true] {
        let rt = common::builder()
            .memory_growth(growth)
            .build()
            .expect("runtime");
        for dev in available_devices(&rt) {
            if dev.device_type() == DeviceKind::Gpu && !dev.has_f16() {
                continue;
            }
            let _s = dev.scope();
            let what = format!("{} (memory growth {growth})", label(&dev));
            let mut xs = Vec::new();
            for (i, &n) in lengths.clone().enumerate() {
                let shift = 11 * i;
                let part: Vec<f32> = (0..n).map(|k| values[(k + shift) % values.len()]).collect();
                xs.push(Tensor::from_slice_on(&part, &[n], &dev).expect("upload"));
            }
            // One already float16: it comes back as it is.
            let h = xs[2].cast(DType::F16).expect("cast");
            xs.push(h.clone());
            let before = dev.stream_stats().unwrap_or_default();
            let casts = ops::cast_all(&xs, DType::F16).expect("cast_all");
            let dispatches = (dev.stream_stats().unwrap_or_default() - before).dispatches;
            assert_eq!(casts.len(), xs.len(), "{what}");
            for (i, (x, c)) in xs.iter().zip(&casts).enumerate() {
                assert_eq!(c.dtype(), DType::F16, "{what} tensor {i}");
                assert_eq!(c.shape(), x.shape(), "{what} tensor {i}");
                assert_eq!(c.device(), dev.full_name(), "{what} tensor {i}");
                let one = x
                    .cast(DType::F16)
                    .expect("cast")
                    .to_vec::<f16>()
                    .expect("read");
                let got = c.to_vec::<f16>().expect("read");
                let want: Vec<u16> = match x.dtype() {
                    DType::F16 => one.iter().map(|h| h.to_bits()).collect(),
                    _ => x
                        .to_vec::<f32>()
                        .expect("read")
                        .iter()
                        .map(|&v| f16::from_f32(v).to_bits())
                        .collect(),
                };
                let got: Vec<u16> = got.iter().map(|h| h.to_bits()).collect();
                let one: Vec<u16> = one.iter().map(|h| h.to_bits()).collect();
                assert_eq!(got, want, "{what} tensor {i} ({} elements)", x.len());
                assert_eq!(got, one, "{what} tensor {i}: cast_all differs from cast");
            }
            eprintln!("{what}: {dispatches} dispatches for {} casts", xs.len());
            if dev.device_type() == DeviceKind::Gpu {
                if growth {
                    assert!(dispatches >= 2, "{what}: {dispatches} dispatches");
                } else {
                    assert_eq!(dispatches, 1, "{what}: one dispatch for {} casts", xs.len());
                }
            }
        }
    }
}

/// A mixed_float16 training step casts all its weights at once (`to_f16_table`, one dispatch
/// a step on one GPU), not one `to_f16` each: the tutorial CNN has 21 weights, and what casts
/// are left (the input, a few gradients) are fewer than that.
#[test]
fn mixed_float16_step_casts_its_weights_in_one_dispatch() {
    let _g = serial();
    let rt = runtime();
    for gpu in f16_gpus(&rt, "mixed_float16_step_casts_its_weights_in_one_dispatch") {
        let _s = gpu.scope();
        mixed_precision::set_global_policy(Policy::MIXED_FLOAT16).expect("policy");
        let built = anygpu::nn::tutorial_cnn(3, std::slice::from_ref(&gpu));
        mixed_precision::set_global_policy(Policy::FLOAT32).expect("policy");
        let mut m =
            common::compiled(built.expect("tutorial"), Sgd::new(0.01).into()).expect("compile");
        let weights = m.trainable_weights().len();
        let x = Tensor::from_vec(common::values(16 * 784, 4), &[16, 28, 28, 1]).expect("x");
        let y = Tensor::from_vec((0..16).map(|i| i % 10).collect(), &[16]).expect("y");
        m.train_step(&x, &y).expect("warm-up");
        let dir = std::env::temp_dir().join(format!("anygpu-casts-{}", std::process::id()));
        anygpu::profiler::start(&dir).expect("profiler");
        let steps = 2;
        for _ in 0..steps {
            m.train_step(&x, &y).expect("step");
        }
        let report = anygpu::profiler::stop().expect("report");
        let _ = std::fs::remove_dir_all(&dir);
        let calls = |kernel: &str| {
            report
                .kernels()
                .iter()
                .filter(|k| k.kernel == kernel)
                .map(|k| k.calls)
                .sum::<u64>()
        };
        let what = label(&gpu);
        assert_eq!(
            calls("to_f16_table"),
            steps,
            "{what}: one table cast a step"
        );
        assert!(
            calls("to_f16") < steps * weights as u64,
            "{what}: {} to_f16 dispatches in {steps} steps of a model with {weights} weights",
            calls("to_f16")
        );
    }
}

#[test]
fn f16_tensors_are_refused_by_float32_only_devices_with_a_clear_error() {
    let _g = serial();
    let rt = runtime();
    let cpu = rt.cpu().expect("cpu");
    let _s = cpu.scope();
    let h = Tensor::from_slice_on(&[f16::ONE; 4], &[2, 2], &cpu).expect("upload");
    let err = h.matmul(&h).unwrap_err().to_string();
    assert!(
        err.contains("float16 kernels") && err.contains("CPU:0") && err.contains("cast it"),
        "{err}"
    );
}

#[test]
fn f16_convolution_kernels_match_the_oracle() {
    let _g = serial();
    check_convolutions(&runtime(), "f16_convolution_kernels_match_the_oracle");
}

fn check_convolutions(rt: &Runtime, test: &str) {
    for dev in f16_gpus(rt, test) {
        let _s = dev.scope();
        // (n, h, w, c_in, c_out, k, padding): the tutorial's first layer, a wide one, a
        // 'valid' one with odd sizes, and channels that are not multiples of 4.
        let cases = [
            (3, 28, 28, 1, 32, 3, Padding::Same),
            (2, 7, 7, 32, 64, 3, Padding::Same),
            (3, 13, 7, 3, 7, 5, Padding::Valid),
            (1, 9, 11, 1, 8, 3, Padding::Valid),
        ];
        for (t, &(n, h, w, c_in, c_out, k, padding)) in cases.iter().enumerate() {
            let s = Conv2dShape {
                n,
                h,
                w,
                c_in,
                c_out,
                kh: k,
                kw: k,
                padding,
                strides: [1, 1],
                dilation: [1, 1],
            };
            let (oh, ow) = s.out_hw();
            let act = [Activation::Linear, Activation::Relu, Activation::Selu][t % 3];
            let seed = 23_000 + 10 * t as u64;
            let (x, xt) = half_input(&dev, &[n, h, w, c_in], seed);
            let (kv, kt) = half_input(&dev, &[k, k, c_in, c_out], seed + 1);
            let (b, bt) = half_input(&dev, &[c_out], seed + 2);
            let (dz, dzt) = half_input(&dev, &[n, oh, ow, c_out], seed + 3);
            let (x64, k64, dz64) = (to_f64(&x), to_f64(&kv), to_f64(&dz));
            let what = format!("{} {s:?} {act:?}", label(&dev));

            let y = ops::conv2d(&xt, &kt, Some(&bt), padding, act).unwrap();
            let want = r::conv2d_forward(&x64, &k64, Some(&to_f64(&b)), &s, act);
            assert_close(
                &read(&y, &dev),
                &want,
                F16_TOL,
                &format!("f16 conv2d {what}"),
            );

            let dx = ops::conv2d_backward_input(&dzt, &kt, &[n, h, w, c_in], padding).unwrap();
            let want = r::conv2d_backward_input(&dz64, &k64, &s);
            assert_close(
                &read(&dx, &dev),
                &want,
                F16_TOL,
                &format!("f16 conv2d dx {what}"),
            );

            let kshape = [k, k, c_in, c_out];
            let dk = ops::conv2d_backward_kernel(&xt, &dzt, &kshape, padding).unwrap();
            let want = r::conv2d_backward_kernel(&x64, &dz64, &s);
            assert_close(
                &read(&dk, &dev),
                &want,
                F16_TOL,
                &format!("f16 conv2d dk {what}"),
            );
            let grads = GradDType::Float32;
            let dk = ops::conv2d_backward_kernel_as(&xt, &dzt, &kshape, padding, grads).unwrap();
            let what32 = format!("f16 conv2d dk in float32 {what}");
            assert_close(&read_f32(&dk, &dev), &want, SUM_TOL, &what32);

            let db = ops::bias_grad(&dzt).unwrap();
            let want = r::bias_grad(&dz64, c_out);
            assert_close(
                &read(&db, &dev),
                &want,
                F16_TOL,
                &format!("f16 bias grad {what}"),
            );
            let db = ops::bias_grad_as(&dzt, GradDType::Float32).unwrap();
            let what32 = format!("f16 bias grad in float32 {what}");
            assert_close(&read_f32(&db, &dev), &want, SUM_TOL, &what32);

            // Both weight gradients from the activated output's gradient.
            let (dk, db) =
                ops::conv2d_backward_weights(&xt, &y, &dzt, &kshape, padding, act).unwrap();
            let dz_act = r::activation_backward(&dz64, &to_f64(&read(&y, &dev)), act);
            let want = r::conv2d_backward_kernel(&x64, &dz_act, &s);
            assert_close(
                &read(&dk, &dev),
                &want,
                F16_TOL,
                &format!("f16 weights dk {what}"),
            );
            let want = r::bias_grad(&dz_act, c_out);
            assert_close(
                &read(&db, &dev),
                &want,
                F16_TOL,
                &format!("f16 weights db {what}"),
            );
            // In float32: the same sums, not rounded to float16 at the end (`dz` is rounded to
            // float16 before them, as in the float16 op).
            let (dk, db) =
                ops::conv2d_backward_weights_as(&xt, &y, &dzt, &kshape, padding, act, grads)
                    .unwrap();
            let want = r::conv2d_backward_kernel(&x64, &dz_act, &s);
            let what32 = format!("f16 weights dk in float32 {what}");
            assert_close(&read_f32(&dk, &dev), &want, F16_TOL, &what32);
            let want = r::bias_grad(&dz_act, c_out);
            let what32 = format!("f16 weights db in float32 {what}");
            assert_close(&read_f32(&db, &dev), &want, F16_TOL, &what32);
            let (_, db) = ops::activation_bias_grad_as(&dzt, &y, act, grads).unwrap();
            let what32 = format!("f16 activation and bias grad in float32 {what}");
            assert_close(&read_f32(&db, &dev), &want, F16_TOL, &what32);
        }
    }
}

#[test]
fn f16_depthwise_and_pooling_kernels_match_the_oracle() {
    let _g = serial();
    check_depthwise_and_pooling(
        &runtime(),
        "f16_depthwise_and_pooling_kernels_match_the_oracle",
    );
}

fn check_depthwise_and_pooling(rt: &Runtime, test: &str) {
    for dev in f16_gpus(rt, test) {
        let _s = dev.scope();
        for (t, &(n, h, w, c)) in [(3, 28, 28, 32), (2, 7, 7, 12), (1, 13, 5, 3)]
            .iter()
            .enumerate()
        {
            let s = DepthwiseShape::same(n, h, w, c, 3, 3);
            let seed = 24_000 + 10 * t as u64;
            let (x, xt) = half_input(&dev, &[n, h, w, c], seed);
            let (kv, kt) = half_input(&dev, &[3, 3, c, 1], seed + 1);
            let (dy, dyt) = half_input(&dev, &[n, h, w, c], seed + 2);
            let (x64, k64, dy64) = (to_f64(&x), to_f64(&kv), to_f64(&dy));
            let what = format!("{} {s:?}", label(&dev));

            let y = ops::depthwise_conv2d(&xt, &kt).unwrap();
            let want = r::depthwise_forward(&x64, &k64, &s);
            assert_close(
                &read(&y, &dev),
                &want,
                F16_TOL,
                &format!("f16 depthwise {what}"),
            );
            let dx = ops::depthwise_conv2d_backward_input(&dyt, &kt).unwrap();
            let want = r::depthwise_backward_input(&dy64, &k64, &s);
            assert_close(
                &read(&dx, &dev),
                &want,
                F16_TOL,
                &format!("f16 depthwise dx {what}"),
            );
            let dk = ops::depthwise_conv2d_backward_kernel(&xt, &dyt, &[3, 3, c, 1]).unwrap();
            let want = r::depthwise_backward_kernel(&x64, &dy64, &s);
            assert_close(
                &read(&dk, &dev),
                &want,
                F16_TOL,
                &format!("f16 depthwise dk {what}"),
            );
            let opts = ConvOptions::from(Padding::Same);
            let grads = GradDType::Float32;
            let dk =
                ops::depthwise_conv2d_backward_kernel_as(&xt, &dyt, &[3, 3, c, 1], opts, grads)
                    .unwrap();
            let what32 = format!("f16 depthwise dk in float32 {what}");
            assert_close(&read_f32(&dk, &dev), &want, SUM_TOL, &what32);

            // The 2×2 max-pool, its gradient, and the fused pool + activation + bias gradient.
            let p = PoolShape { n, h, w, c };
            let (oh, ow) = p.out_hw();
            let pooled = ops::max_pool2d(&xt).unwrap();
            let want = r::maxpool_forward(&x64, &p);
            assert_close(
                &read(&pooled, &dev),
                &want,
                0.0,
                &format!("f16 max-pool {what}"),
            );
            let (dp, dpt) = half_input(&dev, &[n, oh, ow, c], seed + 3);
            let dx = ops::max_pool2d_backward(&xt, &dpt).unwrap();
            let routed = r::maxpool_backward(&x64, &to_f64(&dp), &p);
            assert_close(
                &read(&dx, &dev),
                &routed,
                0.0,
                &format!("f16 max-pool dx {what}"),
            );
            let act = [Activation::Relu, Activation::Selu, Activation::Linear][t % 3];
            let (dz, db) = ops::max_pool2d_activation_bias_grad(&xt, &dpt, act).unwrap();
            let want = r::activation_backward(&routed, &x64, act);
            assert_close(
                &read(&dz, &dev),
                &want,
                F16_TOL,
                &format!("f16 pool dz {what}"),
            );
            let want = r::bias_grad(&want, c);
            assert_close(
                &read(&db, &dev),
                &want,
                F16_TOL,
                &format!("f16 pool db {what}"),
            );
            let (_, db) = ops::max_pool2d_activation_bias_grad_as(&xt, &dpt, act, grads).unwrap();
            let what32 = format!("f16 pool db in float32 {what}");
            assert_close(&read_f32(&db, &dev), &want, F16_TOL, &what32);
        }
    }
}

#[test]
fn f16_products_and_activations_match_the_oracle() {
    let _g = serial();
    check_products_and_activations(&runtime(), "f16_products_and_activations_match_the_oracle");
}

fn check_products_and_activations(rt: &Runtime, test: &str) {
    for dev in f16_gpus(rt, test) {
        let _s = dev.scope();
        // The tutorial's dense layers (k = 1152 splits k on GPUs), a ragged one, and every
        // transpose the gradients use.
        for (t, &(m, k, n)) in [(128, 1152, 128), (70, 516, 36), (13, 9, 10)]
            .iter()
            .enumerate()
        {
            let seed = 25_000 + 10 * t as u64;
            let act = [Activation::Selu, Activation::Relu, Activation::Linear][t % 3];
            let (a, at) = half_input(&dev, &[m, k], seed);
            let (wv, wt) = half_input(&dev, &[k, n], seed + 1);
            let (b, bt) = half_input(&dev, &[n], seed + 2);
            let what = format!("{} {m}x{k}x{n} {act:?}", label(&dev));
            let y = ops::dense(&at, &wt, Some(&bt), act).unwrap();
            let want =
                r::matmul_bias_act(&to_f64(&a), &to_f64(&wv), Some(&to_f64(&b)), m, k, n, act);
            assert_close(
                &read(&y, &dev),
                &want,
                F16_TOL,
                &format!("f16 dense {what}"),
            );
            for (ta, tb) in [(true, false), (false, true), (true, true)] {
                let ashape = if ta { [k, m] } else { [m, k] };
                let bshape = if tb { [n, k] } else { [k, n] };
                let (av, a2) = half_input(&dev, &ashape, seed + 3);
                let (bv, b2) = half_input(&dev, &bshape, seed + 4);
                let y = ops::matmul_transposed(&a2, &b2, ta, tb).unwrap();
                let want = r::matmul(&to_f64(&av), &to_f64(&bv), m, k, n, ta, tb);
                let w = format!("f16 matmul ta={ta} tb={tb} {what}");
                assert_close(&read(&y, &dev), &want, F16_TOL, &w);
            }
            let (dy, dyt) = half_input(&dev, &[m, n], seed + 5);
            let (dz, db) = ops::activation_bias_grad(&dyt, &y, act).unwrap();
            let want = r::activation_backward(&to_f64(&dy), &to_f64(&read(&y, &dev)), act);
            assert_close(
                &read(&dz, &dev),
                &want,
                F16_TOL,
                &format!("f16 act grad {what}"),
            );
            let want = r::bias_grad(&want, n);
            assert_close(
                &read(&db, &dev),
                &want,
                F16_TOL,
                &format!("f16 act db {what}"),
            );
            // The dense layer's gradients as it hands them to its optimizer: float32 kernel
            // and bias gradients, the input gradient in float16 (from the float16 `dz` above).
            let (dx, dw, db) =
                ops::dense_backward_as(&at, &wt, &y, &dyt, act, true, GradDType::Float32).unwrap();
            let dx = dx.expect("dx");
            assert_eq!(
                (dx.dtype(), dw.dtype(), db.dtype()),
                (DType::F16, DType::F32, DType::F32),
                "{what}"
            );
            let dz64 = to_f64(&read(&dz, &dev));
            let f32s = |t: &Tensor| t.to_vec::<f32>().expect("readback");
            let grads = [
                (
                    f32s(&dw),
                    r::matmul(&to_f64(&a), &dz64, k, m, n, true, false),
                    "dw",
                ),
                (f32s(&db), r::bias_grad(&dz64, n), "db"),
                (
                    read(&dx, &dev),
                    r::matmul(&dz64, &to_f64(&wv), m, n, k, false, true),
                    "dx",
                ),
            ];
            for (got, want, name) in grads {
                let w = format!("f16 dense_backward_as {name} {what}");
                assert_close(&got, &want, F16_TOL, &w);
            }
            let z = ops::activation(&y, act).unwrap();
            let want = r::activation(&to_f64(&read(&y, &dev)), act);
            assert_close(
                &read(&z, &dev),
                &want,
                F16_TOL,
                &format!("f16 activation {what}"),
            );
        }
    }
}

/// Every kernel the autotuner can pick, forced in turn (`ANYGPU_AUTOTUNE_FORCE`), in float16
/// against the oracle: the float16 twins are tuned like the float32 kernels, and each must be
/// right. (The candidates whose uniform windows or split-k partials hold float32 values,
/// `ubo8`, `ubo_c1`, `splitk*`, are not offered for float16; forcing them falls back.)
#[test]
fn f16_every_tuning_candidate_matches_the_oracle() {
    let _g = serial();
    let candidates = common::TUNING_CANDIDATES
        .into_iter()
        .filter(|c| !common::FLOAT32_ONLY_CANDIDATES.contains(c));
    for candidate in candidates {
        let rt = common::builder()
            .memory_growth(true)
            .env("ANYGPU_AUTOTUNE_FORCE", Some(candidate))
            .build()
            .expect("runtime");
        let test = format!("f16_every_tuning_candidate_matches_the_oracle [{candidate}]");
        check_products_and_activations(&rt, &test);
        check_convolutions(&rt, &test);
        check_depthwise_and_pooling(&rt, &test);
    }
}

/// The 8×8 CNN of the other training tests under `policy`, on `device`.
fn small_model(seed: u64, policy: Policy, device: &LogicalDevice) -> Sequential {
    let _s = device.scope();
    let _restore = GlobalPolicy::set(policy);
    common::small_cnn(seed).expect("model")
}

/// Sets the global policy and restores float32 when dropped.
struct GlobalPolicy;

impl GlobalPolicy {
    fn set(policy: Policy) -> GlobalPolicy {
        mixed_precision::set_global_policy(policy).expect("a known policy");
        GlobalPolicy
    }
}

impl Drop for GlobalPolicy {
    fn drop(&mut self) {
        let _ = mixed_precision::set_global_policy("float32");
    }
}

/// Mean loss of each of `epochs` passes of Adam over the synthetic data, batch 16.
fn train(model: &mut Sequential, epochs: usize) -> Vec<f64> {
    let (x, y) = common::synthetic(96, 3);
    let data = anygpu::data::Dataset::from_tensor_slices(x, &[8, 8, 1], y)
        .expect("data")
        .batch(16, false);
    let history = model.fit(&data, epochs, None, None).expect("fit");
    history.loss
}

#[test]
fn mixed_float16_trains_like_float32_on_every_device() {
    let _g = serial();
    let rt = runtime();
    let devices = available_devices(&rt);
    for dev in &devices {
        let mut f32_model = common::compiled(
            small_model(11, Policy::FLOAT32, dev),
            Adam::new(3e-3).into(),
        )
        .expect("compile");
        let mut mixed = common::compiled(
            small_model(11, Policy::MIXED_FLOAT16, dev),
            Adam::new(3e-3).into(),
        )
        .expect("compile");
        // compile wrapped the optimizer, as Keras 3 does under mixed_float16.
        assert_eq!(
            mixed.optimizer().map(Optimizer::name),
            Some("LossScaleOptimizer")
        );
        let summary = mixed.summary();
        let expected = if dev.has_f16() {
            "mixed_float16".to_string()
        } else {
            let name = dev.name().trim_start_matches("/device:");
            format!("mixed_float16 (float32 on {name})")
        };
        assert!(summary.contains(&expected), "{}: {summary}", label(dev));
        // 36 epochs of 6 steps: a few hundred steps of Adam.
        let base = train(&mut f32_model, 36);
        let half = train(&mut mixed, 36);
        let what = format!("{}: float32 {base:?}, mixed {half:?}", label(dev));
        assert!(half.iter().all(|l| l.is_finite()), "{what}");
        assert!(half[35] < 0.1 * half[0], "the mixed loss falls: {what}");
        for (epoch, (h, b)) in half.iter().zip(&base).enumerate() {
            assert!(
                (h - b).abs() < 0.05 + 0.25 * b,
                "epoch {epoch} like float32's: {what}"
            );
        }
        // Float32 variables throughout; no step skipped at these small gradients.
        for w in mixed.weights() {
            assert_eq!(w.dtype(), DType::F32, "{what}");
        }
        assert_eq!(mixed.iterations(), f32_model.iterations(), "{what}");
    }
}

#[test]
fn mixed_split_model_runs_float16_where_it_can_and_float32_elsewhere() {
    let _g = serial();
    let rt = runtime();
    let gpus = f16_gpus(
        &rt,
        "mixed_split_model_runs_float16_where_it_can_and_float32_elsewhere",
    );
    let Some(half_dev) = gpus.first() else {
        return;
    };
    let cpu = rt.cpu().expect("cpu");
    // An f16 adapter, then a float32-only device, then the f16 adapter again: activations and
    // gradients change dtype twice each way.
    let _policy = GlobalPolicy::set(Policy::MIXED_FLOAT16);
    let mut model = Sequential::with_seed(4);
    model
        .add_on(half_dev, Flatten::new().input_shape(&[8, 8, 1]))
        .unwrap();
    model
        .add_on(
            &cpu,
            Dense::new(16).activation(anygpu::nn::Activation::Relu),
        )
        .unwrap();
    model
        .add_on(
            half_dev,
            Dense::new(3).activation(anygpu::nn::Activation::Softmax),
        )
        .unwrap();
    let infos = model.layer_infos();
    assert_eq!(
        infos.iter().map(|i| i.compute_dtype).collect::<Vec<_>>(),
        [DType::F16, DType::F32, DType::F16]
    );
    let mut model = common::compiled(model, Sgd::new(0.1).into()).expect("compile");
    let losses = train(&mut model, 10);
    assert!(losses[9] < 0.7 * losses[0], "{losses:?}");

    // Pipelined, the stages' summed gradients decide: a micro-batch with an infinity skips the
    // whole step on every stage and halves the scale.
    model.set_pipeline(Pipeline::gpipe(2)).unwrap();
    let (iterations, scale) = (model.iterations(), model.loss_scale().unwrap());
    let before = model.get_weights().unwrap();
    let mut x = vec![0.5f32; 4 * 64];
    x[3 * 64] = f32::INFINITY;
    let xt = Tensor::from_vec(x, &[4, 8, 8, 1]).unwrap();
    let yt = Tensor::from_vec(vec![0i32, 1, 2, 0], &[4]).unwrap();
    model.train_on_batch(&xt, &yt).unwrap();
    assert_eq!(model.iterations(), iterations);
    assert_eq!(model.loss_scale(), Some(scale / 2.0));
    assert_eq!(model.get_weights().unwrap(), before);
    let losses = train(&mut model, 4);
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert!(model.iterations() > iterations);
}

#[test]
fn loss_scale_follows_keras_rules() {
    let _g = serial();
    let rt = runtime();
    let cpu = rt.cpu().expect("cpu");
    let _s = cpu.scope();
    // Inputs with an infinity make every gradient NaN: each step is skipped and halves the
    // scale. Then finite inputs: with growth every 3 finite steps, the scale doubles every
    // third step.
    let mut model = Sequential::with_seed(9);
    model
        .add(
            Dense::new(3)
                .activation(anygpu::nn::Activation::Softmax)
                .input_shape(&[4]),
        )
        .unwrap();
    let x = Tensor::from_vec(
        vec![f32::INFINITY, 1.0, -1.0, 0.5, 0.25, 2.0, 1.0, -3.0],
        &[2, 4],
    )
    .unwrap();
    let y = Tensor::from_vec(vec![0i32, 2], &[2]).unwrap();
    let opt = LossScaleOptimizer::new(Sgd::new(0.1))
        .initial_scale(2.0f32.powi(20))
        .dynamic_growth_steps(3);
    model
        .compile(
            anygpu::nn::Loss::sparse_categorical_crossentropy(),
            opt,
            &[],
        )
        .unwrap();
    let before = model.get_weights().unwrap();
    let mut scales = Vec::new();
    let mut iterations = Vec::new();
    for _ in 0..8 {
        model.train_on_batch(&x, &y).unwrap();
        scales.push(model.loss_scale().expect("loss scaling"));
        iterations.push(model.iterations());
    }
    let halved: Vec<f32> = (1..=8).map(|i| 2.0f32.powi(20 - i)).collect();
    assert_eq!(scales, halved);
    assert_eq!(iterations, [0; 8]);
    assert_eq!(
        model.get_weights().unwrap(),
        before,
        "skipped steps change nothing"
    );

    // Finite gradients: growth after every 3 applied steps, and every step counts.
    let x = Tensor::from_vec(vec![0.5f32, 1.0, -1.0, 0.5, 0.25, 2.0, 1.0, -3.0], &[2, 4]).unwrap();
    let start = scales[7];
    let mut grown = Vec::new();
    for _ in 0..7 {
        model.train_on_batch(&x, &y).unwrap();
        grown.push(model.loss_scale().unwrap() / start);
    }
    assert_eq!(grown, [1.0, 1.0, 2.0, 2.0, 2.0, 4.0, 4.0]);
    assert_eq!(model.iterations(), 7);
}

#[test]
fn loss_scale_gives_the_float32_update() {
    let _g = serial();
    let rt = runtime();
    let devices = available_devices(&rt);
    // In float32 a power-of-two scale and its inverse are exact: the same weights as without.
    for dev in &devices {
        let _s = dev.scope();
        let make = |opt: Optimizer| {
            let m = common::small_cnn(21).expect("model");
            common::compiled(m, opt).expect("compile")
        };
        let mut plain = make(Adam::new(1e-2).into());
        let mut scaled = make(LossScaleOptimizer::new(Adam::new(1e-2)).into());
        let (x, y) = common::synthetic(16, 8);
        let xt = Tensor::from_vec(x, &[16, 8, 8, 1]).unwrap();
        let yt = Tensor::from_vec(y, &[16]).unwrap();
        for _ in 0..3 {
            plain.train_on_batch(&xt, &yt).unwrap();
            scaled.train_on_batch(&xt, &yt).unwrap();
        }
        let (a, b) = (plain.get_weights().unwrap(), scaled.get_weights().unwrap());
        for (wa, wb) in a.iter().zip(&b) {
            common::assert_close(&format!("loss_scale {}", label(dev)), wb, wa, 1e-5);
        }
        assert_eq!(scaled.iterations(), 3);
    }
}

#[test]
fn loss_scale_skips_the_step_on_every_replica() {
    let _g = serial();
    let rt = runtime();
    let devices = common::available(rt.list_logical_devices(KindFilter::All).expect("devices"));
    if devices.len() < 2 {
        return;
    }
    // Two replicas (CPU:0 and the first GPU); one replica's half of the batch overflows.
    let strategy =
        anygpu::distribute::MirroredStrategy::with_devices(&devices[..2]).expect("strategy");
    let mut model = strategy
        .scope(|| {
            let mut m = Sequential::with_seed(2);
            m.add(
                Dense::new(3)
                    .activation(anygpu::nn::Activation::Softmax)
                    .input_shape(&[4]),
            )?;
            m.compile(
                anygpu::nn::Loss::sparse_categorical_crossentropy(),
                LossScaleOptimizer::new(Sgd::new(0.1)).initial_scale(4.0),
                &[],
            )?;
            Ok::<_, anygpu::Error>(m)
        })
        .expect("one strategy scope")
        .expect("mirrored model");
    model.set_verbose(anygpu::nn::Verbosity::Silent);
    let before: Vec<Vec<Vec<f32>>> = (0..2).map(|r| model.replica_weights(r).unwrap()).collect();
    let x = vec![f32::INFINITY, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
    let data = anygpu::data::Dataset::from_tensor_slices(x, &[4], vec![0, 1])
        .unwrap()
        .batch(2, false);
    model.fit(&data, 1, None, None).unwrap();
    for (r, weights) in before.iter().enumerate() {
        assert_eq!(
            &model.replica_weights(r).unwrap(),
            weights,
            "replica {r} changed"
        );
    }
    assert_eq!(model.loss_scale(), Some(2.0));
    assert_eq!(model.iterations(), 0);
}

#[test]
fn mixed_precision_policy_names_follow_keras() {
    let _g = serial();
    assert_eq!(mixed_precision::global_policy(), Policy::FLOAT32);
    assert!(mixed_precision::set_global_policy("mixed_bfloat16").is_err());
    assert_eq!(
        mixed_precision::global_policy(),
        Policy::FLOAT32,
        "unchanged on error"
    );
    {
        let _p = GlobalPolicy::set(Policy::MIXED_FLOAT16);
        assert_eq!(mixed_precision::global_policy().name(), "mixed_float16");
        // A layer's own policy wins over the global one.
        let rt = runtime();
        let cpu = rt.cpu().unwrap();
        let mut m = Sequential::new();
        m.add_on(&cpu, Dense::new(2).input_shape(&[3])).unwrap();
        m.add_on(&cpu, Dense::new(2).dtype_policy(Policy::FLOAT32))
            .unwrap();
        let policies: Vec<Policy> = m.layer_infos().iter().map(|i| i.policy).collect();
        assert_eq!(policies, [Policy::MIXED_FLOAT16, Policy::FLOAT32]);
        let own = Dense::new(1).dtype_policy(Policy::FLOAT32);
        assert_eq!(Layer::dtype_policy(&own), Some(Policy::FLOAT32));
    }
    assert_eq!(mixed_precision::global_policy(), Policy::FLOAT32);
}

#[test]
fn loss_scale_survives_a_checkpoint() {
    let _g = serial();
    let rt = runtime();
    let cpu = rt.cpu().expect("cpu");
    let _s = cpu.scope();
    let dir = std::env::temp_dir().join(format!("anygpu-loss-scale-{}", std::process::id()));
    let model = || {
        let mut m = Sequential::with_seed(5);
        m.add(
            Dense::new(3)
                .activation(anygpu::nn::Activation::Softmax)
                .input_shape(&[4]),
        )
        .unwrap();
        let opt = LossScaleOptimizer::new(Sgd::new(0.1))
            .initial_scale(1024.0)
            .dynamic_growth_steps(2);
        m.compile(
            anygpu::nn::Loss::sparse_categorical_crossentropy(),
            opt,
            &[],
        )
        .unwrap();
        m.set_verbose(anygpu::nn::Verbosity::Silent);
        m
    };
    // A first batch with an infinity (skipped: the scale halves), then three finite ones (the
    // scale doubles after two): each epoch ends with a scale and counter of its own.
    let x = vec![
        f32::INFINITY,
        1.0,
        0.0,
        0.0, //
        0.5,
        0.1,
        0.2,
        0.9, //
        0.3,
        0.3,
        0.1,
        0.0, //
        0.9,
        0.2,
        0.4,
        0.1,
    ];
    let data = || {
        anygpu::data::Dataset::from_tensor_slices(x.clone(), &[4], vec![0, 1, 2, 1])
            .unwrap()
            .batch(1, false)
    };
    let mut first = model();
    let mut backup = anygpu::nn::BackupAndRestore::new(&dir).delete_checkpoint(false);
    first
        .fit_with_callbacks(&data(), 1, None, None, &mut [&mut backup])
        .unwrap();
    // 1024 → 512 (skip) → 512, counter 1 → 1024, counter 0 → 1024, counter 1.
    assert_eq!((first.loss_scale(), first.iterations()), (Some(1024.0), 3));
    let mut resumed = model();
    let mut backup = anygpu::nn::BackupAndRestore::new(&dir).delete_checkpoint(false);
    // Zero epochs left to run: the restore alone.
    resumed
        .fit_with_callbacks(&data(), 1, None, None, &mut [&mut backup])
        .unwrap();
    assert_eq!(backup.restored_epochs(), Some(1));
    assert_eq!(
        (resumed.loss_scale(), resumed.iterations()),
        (Some(1024.0), 3)
    );
    // The counter came back too: one more finite step doubles the scale, as it would have.
    let xt = Tensor::from_vec(vec![0.5f32, 0.1, 0.2, 0.9], &[1, 4]).unwrap();
    let yt = Tensor::from_vec(vec![1i32], &[1]).unwrap();
    for m in [&mut first, &mut resumed] {
        m.train_on_batch(&xt, &yt).unwrap();
    }
    assert_eq!(first.loss_scale(), Some(2048.0));
    assert_eq!(resumed.loss_scale(), Some(2048.0));
    // A model without loss scaling refuses that checkpoint.
    let mut plain = Sequential::with_seed(5);
    plain
        .add(
            Dense::new(3)
                .activation(anygpu::nn::Activation::Softmax)
                .input_shape(&[4]),
        )
        .unwrap();
    plain
        .compile(
            anygpu::nn::Loss::sparse_categorical_crossentropy(),
            Sgd::new(0.1),
            &[],
        )
        .unwrap();
    let mut backup = anygpu::nn::BackupAndRestore::new(&dir);
    let err = plain
        .fit_with_callbacks(&data(), 2, None, None, &mut [&mut backup])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("optimizer") || err.contains("loss scaling"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
