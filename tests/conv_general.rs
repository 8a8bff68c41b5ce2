//! Convolutions beyond stride 1 on every device (`CPU:0` and each GPU adapter) against the f64
//! oracle: strides, dilation, rectangular kernels, TensorFlow's asymmetric 'same' padding (odd
//! sizes such as 7×6 at stride 2 with 3×3 and 4×4 kernels), depthwise convolutions with a depth
//! multiplier, strides or 'valid' padding; their float16 twins on GPUs with float16; and a small
//! model with strided layers that trains on CPU:0 and every GPU, and under `mixed_float16`.
//!
//! With `ANYGPU_REQUIRE_ADAPTER=1`, finding no GPU adapter is a failure, not a CPU-only run.

mod common;

use std::sync::{Mutex, MutexGuard};

use anygpu::mixed_precision::{self, Policy};
use anygpu::nn::{
    Activation as Act, Adam, Conv2D, Dense, DepthwiseConv2D, Flatten, SeparableConv2D, Sequential,
};
use anygpu::ops;
use anygpu::ops::reference::{self as r, assert_close, random_vec, to_f64};
use anygpu::ops::spec::{Activation, Conv2dShape, ConvOptions, DepthwiseShape, Padding};
use anygpu::{DType, DeviceKind, Error, KindFilter, LogicalDevice, Runtime, Tensor};
use half::f16;

const TOL: f64 = 1e-4;
/// Four float16 ulps at 1, relative to max(1, |expected|).
const F16_TOL: f64 = 4.0 * 0.000_976_562_5;

/// One test at a time: the NaN traps rely on nobody else allocating between trap and op, and
/// the training test sets the global dtype policy.
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

fn put(dev: &LogicalDevice, data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice_on(data, shape, dev).expect("upload")
}

fn get(t: &Tensor, dev: &LogicalDevice) -> Vec<f32> {
    assert_eq!(t.device(), dev.full_name(), "the op left {}", dev.name());
    t.to_vec::<f32>().expect("readback")
}

/// NaN-filled chunks of the outputs' sizes, freed right before the op: a GPU kernel that leaves
/// an element unwritten reads as NaN.
fn trap(dev: &LogicalDevice, lens: &[usize]) {
    if dev.device_type() != DeviceKind::Gpu {
        return;
    }
    let traps: Vec<Tensor> = lens
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| put(dev, &vec![f32::NAN; n], &[n]))
        .collect();
    drop(traps);
}

fn label(dev: &LogicalDevice) -> String {
    format!("{} ({})", dev.name(), dev.adapter_name())
}

/// (n, h, w, c_in, c_out, kh, kw, strides, dilation, padding)
type ConvCase = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    [usize; 2],
    [usize; 2],
    Padding,
);

const CONV_CASES: [ConvCase; 12] = [
    // 'same' at stride 2 on 7×6: 3×3 pads (1, 1) × (0, 1), 4×4 pads (1, 2) × (1, 2).
    (2, 7, 6, 3, 5, 3, 3, [2, 2], [1, 1], Padding::Same),
    (2, 7, 6, 3, 5, 4, 4, [2, 2], [1, 1], Padding::Same),
    (2, 7, 6, 3, 5, 3, 3, [2, 2], [1, 1], Padding::Valid),
    (1, 8, 8, 4, 8, 3, 3, [2, 2], [1, 1], Padding::Same),
    (3, 7, 9, 2, 3, 3, 5, [2, 1], [1, 1], Padding::Same),
    (1, 9, 8, 3, 4, 3, 3, [1, 1], [2, 2], Padding::Same),
    (2, 9, 8, 3, 4, 3, 3, [1, 1], [2, 3], Padding::Valid),
    (1, 13, 11, 5, 7, 3, 5, [1, 1], [1, 1], Padding::Valid),
    (1, 5, 5, 1, 2, 5, 5, [3, 3], [1, 1], Padding::Same),
    (2, 28, 28, 8, 16, 3, 3, [2, 2], [1, 1], Padding::Same),
    // A 1×1 strided convolution (a ResNet shortcut), and a kernel larger than the stride.
    (2, 7, 7, 8, 4, 1, 1, [2, 2], [1, 1], Padding::Valid),
    (1, 6, 6, 2, 3, 2, 2, [3, 3], [1, 1], Padding::Valid),
];

fn conv_shape(
    &(n, h, w, c_in, c_out, kh, kw, strides, dilation, padding): &ConvCase,
) -> Conv2dShape {
    Conv2dShape {
        n,
        h,
        w,
        c_in,
        c_out,
        kh,
        kw,
        padding,
        strides,
        dilation,
    }
}

fn options(s: &Conv2dShape) -> ConvOptions {
    ConvOptions::new(s.padding)
        .strides(s.strides)
        .dilation(s.dilation)
}

#[test]
fn strided_and_dilated_conv2d_match_the_oracle_on_every_device() {
    let _g = serial();
    let rt = runtime();
    for dev in common::all_devices(
        &rt,
        "strided_and_dilated_conv2d_match_the_oracle_on_every_device",
    ) {
        let _s = dev.scope();
        for (t, case) in CONV_CASES.iter().enumerate() {
            let s = conv_shape(case);
            let (oh, ow) = s.out_hw();
            let act = [Activation::Linear, Activation::Relu, Activation::Selu][t % 3];
            let with_bias = t % 2 == 0;
            let seed = 31_000 + 10 * t as u64;
            let (x, k, b) = (
                random_vec(s.input_len(), seed),
                random_vec(s.kernel_len(), seed + 1),
                random_vec(s.c_out, seed + 2),
            );
            let dz = random_vec(s.output_len(), seed + 3);
            let (x64, k64, dz64) = (to_f64(&x), to_f64(&k), to_f64(&dz));
            let kshape = [s.kh, s.kw, s.c_in, s.c_out];
            let xt = put(&dev, &x, &[s.n, s.h, s.w, s.c_in]);
            let kt = put(&dev, &k, &kshape);
            let bt = put(&dev, &b, &[s.c_out]);
            let dzt = put(&dev, &dz, &[s.n, oh, ow, s.c_out]);
            let what = format!("{} {s:?} {act:?} bias={with_bias}", label(&dev));
            let o = options(&s);

            trap(&dev, &[s.output_len()]);
            let y = ops::conv2d(&xt, &kt, with_bias.then_some(&bt), o, act).unwrap();
            assert_eq!(y.shape(), [s.n, oh, ow, s.c_out], "{what}");
            let b64 = with_bias.then(|| to_f64(&b));
            let want = r::conv2d_forward(&x64, &k64, b64.as_deref(), &s, act);
            assert_close(&get(&y, &dev), &want, TOL, &format!("conv2d {what}"));

            trap(&dev, &[s.input_len()]);
            let dx = ops::conv2d_backward_input(&dzt, &kt, xt.shape(), o).unwrap();
            let want = r::conv2d_backward_input(&dz64, &k64, &s);
            assert_close(&get(&dx, &dev), &want, TOL, &format!("conv2d dx {what}"));

            trap(&dev, &[s.kernel_len()]);
            let dk = ops::conv2d_backward_kernel(&xt, &dzt, &kshape, o).unwrap();
            let want = r::conv2d_backward_kernel(&x64, &dz64, &s);
            assert_close(&get(&dk, &dev), &want, TOL, &format!("conv2d dk {what}"));

            trap(&dev, &[s.kernel_len(), s.c_out]);
            let (dk, db) = ops::conv2d_backward_weights(&xt, &y, &dzt, &kshape, o, act).unwrap();
            let dz_act = r::activation_backward(&dz64, &to_f64(&get(&y, &dev)), act);
            let want = r::conv2d_backward_kernel(&x64, &dz_act, &s);
            assert_close(&get(&dk, &dev), &want, TOL, &format!("weights dk {what}"));
            let want = r::bias_grad(&dz_act, s.c_out);
            assert_close(&get(&db, &dev), &want, TOL, &format!("weights db {what}"));
        }
    }
}

fn depthwise_cases() -> Vec<DepthwiseShape> {
    let mut v = Vec::new();
    for (t, case) in CONV_CASES.iter().enumerate() {
        let s = conv_shape(case);
        let base = DepthwiseShape {
            n: s.n,
            h: s.h,
            w: s.w,
            c: s.c_in,
            kh: s.kh,
            kw: s.kw,
            multiplier: 1 + t % 3,
            padding: s.padding,
            strides: s.strides,
            dilation: s.dilation,
        };
        v.push(base);
    }
    // Stride 1: 'valid', and 'same' with a multiplier (the fast kernels take neither).
    v.push(DepthwiseShape {
        padding: Padding::Valid,
        ..DepthwiseShape::same(2, 7, 6, 8, 3, 3)
    });
    v.push(DepthwiseShape {
        multiplier: 2,
        ..DepthwiseShape::same(2, 7, 6, 4, 3, 3)
    });
    v
}

#[test]
fn general_depthwise_matches_the_oracle_on_every_device() {
    let _g = serial();
    let rt = runtime();
    for dev in common::all_devices(&rt, "general_depthwise_matches_the_oracle_on_every_device") {
        let _s = dev.scope();
        for (t, s) in depthwise_cases().into_iter().enumerate() {
            let (oh, ow) = s.out_hw();
            let act = [Activation::Linear, Activation::Relu, Activation::Selu][t % 3];
            let seed = 32_000 + 10 * t as u64;
            let kshape = [s.kh, s.kw, s.c, s.multiplier];
            let (x, k, b) = (
                random_vec(s.input_len(), seed),
                random_vec(s.kernel_len(), seed + 1),
                random_vec(s.c_out(), seed + 2),
            );
            let dy = random_vec(s.output_len(), seed + 3);
            let (x64, k64, dy64) = (to_f64(&x), to_f64(&k), to_f64(&dy));
            let xt = put(&dev, &x, &[s.n, s.h, s.w, s.c]);
            let kt = put(&dev, &k, &kshape);
            let bt = put(&dev, &b, &[s.c_out()]);
            let dyt = put(&dev, &dy, &[s.n, oh, ow, s.c_out()]);
            let what = format!("{} {s:?} {act:?}", label(&dev));
            let o = ConvOptions::new(s.padding)
                .strides(s.strides)
                .dilation(s.dilation);

            trap(&dev, &[s.output_len()]);
            let y = ops::depthwise_conv2d_with(&xt, &kt, None, o, Activation::Linear).unwrap();
            let want = r::depthwise_forward(&x64, &k64, &s);
            assert_close(&get(&y, &dev), &want, TOL, &format!("depthwise {what}"));

            trap(&dev, &[s.output_len()]);
            let y = ops::depthwise_conv2d_with(&xt, &kt, Some(&bt), o, act).unwrap();
            let z = r::depthwise_forward(&x64, &k64, &s);
            let want = r::bias_act(&z, Some(&to_f64(&b)), act);
            assert_close(
                &get(&y, &dev),
                &want,
                TOL,
                &format!("depthwise+bias {what}"),
            );

            trap(&dev, &[s.input_len()]);
            let dx = ops::depthwise_conv2d_backward_input_with(&dyt, &kt, xt.shape(), o).unwrap();
            let want = r::depthwise_backward_input(&dy64, &k64, &s);
            assert_close(&get(&dx, &dev), &want, TOL, &format!("depthwise dx {what}"));

            trap(&dev, &[s.kernel_len()]);
            let dk = ops::depthwise_conv2d_backward_kernel_with(&xt, &dyt, &kshape, o).unwrap();
            let want = r::depthwise_backward_kernel(&x64, &dy64, &s);
            assert_close(&get(&dk, &dev), &want, TOL, &format!("depthwise dk {what}"));
        }
    }
}

#[test]
fn strides_with_dilation_are_refused_with_keras_message() {
    let _cpu = anygpu::with_device("/cpu:0").expect("cpu");
    let x = Tensor::from_vec(vec![0.0f32; 81], &[1, 9, 9, 1]).unwrap();
    let k = Tensor::from_vec(vec![0.0f32; 9], &[3, 3, 1, 1]).unwrap();
    let o = ConvOptions::new(Padding::Same).strides(2).dilation(2);
    let err = ops::conv2d(&x, &k, None, o, Activation::Linear).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(
        err.to_string()
            .contains("`strides > 1` not supported in conjunction with `dilation_rate > 1`"),
        "{err}"
    );
    let o = ConvOptions::new(Padding::Same).strides((1, 0));
    assert!(ops::conv2d(&x, &k, None, o, Activation::Linear).is_err());
    let layer = Conv2D::new(2, 3).strides(2).dilation_rate((1, 2));
    let err = anygpu::nn::Layer::compute_output_shape(&layer, &[9, 9, 1]).unwrap_err();
    assert!(err.to_string().contains("dilation_rate > 1"), "{err}");
    // 'valid' with a dilated kernel longer than the input: Keras' error, not an empty output.
    let layer = DepthwiseConv2D::new(3).dilation_rate(4);
    let err = anygpu::nn::Layer::compute_output_shape(&layer, &[7, 9, 1]).unwrap_err();
    assert!(err.to_string().contains("zero or negative"), "{err}");
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
            panic!("{test}: ANYGPU_REQUIRE_ADAPTER=1 but no adapter with float16");
        }
        eprintln!("SKIPPED {test}: no adapter with float16");
    }
    gpus
}

/// Random float16 values in [-1, 1), as float32, and a float16 tensor of them on `dev`.
fn half_input(dev: &LogicalDevice, shape: &[usize], seed: u64) -> (Vec<f32>, Tensor) {
    let len = shape.iter().product();
    let halves: Vec<f16> = random_vec(len, seed)
        .iter()
        .map(|&v| f16::from_f32(v))
        .collect();
    let values = halves.iter().map(|h| h.to_f32()).collect();
    let t = Tensor::from_slice_on(&halves, shape, dev).expect("upload");
    (values, t)
}

fn read_half(t: &Tensor, dev: &LogicalDevice) -> Vec<f32> {
    assert_eq!(t.dtype(), DType::F16, "{t:?} is not float16");
    assert_eq!(t.device(), dev.full_name(), "the op left {}", dev.name());
    let v = t.to_vec::<f16>().expect("readback");
    v.into_iter().map(f16::to_f32).collect()
}

#[test]
fn f16_general_convolutions_match_the_oracle() {
    let _g = serial();
    let rt = runtime();
    for dev in f16_gpus(&rt, "f16_general_convolutions_match_the_oracle") {
        let _s = dev.scope();
        for (t, case) in CONV_CASES.iter().enumerate().take(6) {
            let s = conv_shape(case);
            let (oh, ow) = s.out_hw();
            let act = [Activation::Linear, Activation::Relu, Activation::Selu][t % 3];
            let seed = 33_000 + 10 * t as u64;
            let kshape = [s.kh, s.kw, s.c_in, s.c_out];
            let (x, xt) = half_input(&dev, &[s.n, s.h, s.w, s.c_in], seed);
            let (k, kt) = half_input(&dev, &kshape, seed + 1);
            let (b, bt) = half_input(&dev, &[s.c_out], seed + 2);
            let (dz, dzt) = half_input(&dev, &[s.n, oh, ow, s.c_out], seed + 3);
            let (x64, k64, dz64) = (to_f64(&x), to_f64(&k), to_f64(&dz));
            let what = format!("{} {s:?} {act:?}", label(&dev));
            let o = options(&s);
            let y = ops::conv2d(&xt, &kt, Some(&bt), o, act).unwrap();
            let want = r::conv2d_forward(&x64, &k64, Some(&to_f64(&b)), &s, act);
            assert_close(
                &read_half(&y, &dev),
                &want,
                F16_TOL,
                &format!("f16 conv2d {what}"),
            );
            let dx = ops::conv2d_backward_input(&dzt, &kt, xt.shape(), o).unwrap();
            let want = r::conv2d_backward_input(&dz64, &k64, &s);
            assert_close(
                &read_half(&dx, &dev),
                &want,
                F16_TOL,
                &format!("f16 dx {what}"),
            );
            let dk = ops::conv2d_backward_kernel(&xt, &dzt, &kshape, o).unwrap();
            let want = r::conv2d_backward_kernel(&x64, &dz64, &s);
            assert_close(
                &read_half(&dk, &dev),
                &want,
                F16_TOL,
                &format!("f16 dk {what}"),
            );

            let d = DepthwiseShape {
                n: s.n,
                h: s.h,
                w: s.w,
                c: s.c_in,
                kh: s.kh,
                kw: s.kw,
                multiplier: 2,
                padding: s.padding,
                strides: s.strides,
                dilation: s.dilation,
            };
            let dshape = [d.kh, d.kw, d.c, 2];
            let (dkv, dkt) = half_input(&dev, &dshape, seed + 4);
            let (dy, dyt) = half_input(&dev, &[d.n, oh, ow, d.c_out()], seed + 5);
            let y = ops::depthwise_conv2d_with(&xt, &dkt, None, o, Activation::Linear).unwrap();
            let want = r::depthwise_forward(&x64, &to_f64(&dkv), &d);
            assert_close(
                &read_half(&y, &dev),
                &want,
                F16_TOL,
                &format!("f16 depthwise {what}"),
            );
            let dk = ops::depthwise_conv2d_backward_kernel_with(&xt, &dyt, &dshape, o).unwrap();
            let want = r::depthwise_backward_kernel(&x64, &to_f64(&dy), &d);
            assert_close(
                &read_half(&dk, &dev),
                &want,
                F16_TOL,
                &format!("f16 depthwise dk {what}"),
            );
        }
    }
}

/// A small model whose every convolution is strided or general: input 8×8×1, 3 classes.
fn strided_model(seed: u64) -> anygpu::Result<Sequential> {
    let mut m = Sequential::with_seed(seed);
    m.add(
        Conv2D::new(6, 3)
            .strides(2)
            .padding(Padding::Same)
            .activation(Act::Selu)
            .input_shape(&[8, 8, 1]),
    )?;
    m.add(
        DepthwiseConv2D::new(3)
            .padding(Padding::Same)
            .depth_multiplier(2)
            .activation(Act::Relu),
    )?;
    m.add(
        SeparableConv2D::new(8, 3)
            .strides(2)
            .padding(Padding::Same)
            .activation(Act::Selu),
    )?;
    m.add(Conv2D::new(8, (1, 2)).use_bias(false).activation(Act::Selu))?;
    m.add(Flatten::new())?;
    m.add(Dense::new(3).activation(Act::Softmax))?;
    Ok(m)
}

/// Mean loss of each of `epochs` passes of Adam over the synthetic data, batch 16.
fn train(model: &mut Sequential, epochs: usize) -> Vec<f64> {
    let (x, y) = common::synthetic(96, 3);
    let data = anygpu::data::Dataset::from_tensor_slices(x, &[8, 8, 1], y)
        .expect("data")
        .batch(16, false);
    model.fit(&data, epochs, None, None).expect("fit").loss
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

#[test]
fn a_strided_model_trains_on_every_device_and_under_mixed_float16() {
    let _g = serial();
    let rt = runtime();
    let test = "a_strided_model_trains_on_every_device_and_under_mixed_float16";
    let mut runs = Vec::new();
    for dev in common::all_devices(&rt, test) {
        runs.push((dev.clone(), Policy::FLOAT32));
        if dev.has_f16() {
            runs.push((dev, Policy::MIXED_FLOAT16));
        }
    }
    for (dev, policy) in runs {
        let model = {
            let _s = dev.scope();
            let _p = GlobalPolicy::set(policy);
            strided_model(5).expect("model")
        };
        let mut m = common::compiled(model, Adam::new(1e-2).into()).expect("compile");
        let loss = train(&mut m, 25);
        let what = format!("{} {policy:?}: {loss:?}", label(&dev));
        assert!(loss.iter().all(|l| l.is_finite()), "{what}");
        assert!(loss[24] < 0.3 * loss[0], "the loss falls: {what}");
    }
}
