//! The matrix products on cooperative matrices (tensor cores, `shaders/matmul_coop.wgsl`)
//! against the f64 oracle: every candidate, forced in turn, on ragged and random shapes in every
//! layout the dense layers and their gradients use. `scripts/gpu_check.sh` runs this before it
//! times anything. On adapters without a matching cooperative-matrix configuration (lavapipe,
//! llvmpipe) there is nothing to check: the test says so and passes.
//!
//! Every test name has `coop` in it.

mod common;

use anygpu::ops;
use anygpu::ops::reference::{self as r, random_vec};
use anygpu::ops::spec::{Activation, Conv2dShape, ConvOptions, Padding};
use anygpu::ops::GradDType;
use anygpu::{DType, DeviceKind, KindFilter, LogicalDevice, Runtime, Tensor};
use half::f16;

/// Four float16 ulps at 1, relative to max(1, |expected|): the products accumulate in float32,
/// and the output is rounded to float16 once (as in tests/mixed_precision.rs).
const F16_TOL: f64 = 4.0 * 0.000_976_562_5;

fn gpus(rt: &Runtime) -> Vec<LogicalDevice> {
    rt.list_logical_devices(KindFilter::Kind(DeviceKind::Gpu))
        .expect("devices")
}

fn label(dev: &LogicalDevice) -> String {
    format!("{} ({})", dev.name(), dev.adapter_name())
}

/// Random float16 values in [-1, 1) as f64, and a float16 tensor of them on `dev`.
fn half_input(dev: &LogicalDevice, shape: &[usize], seed: u64) -> (Vec<f64>, Tensor) {
    let len = shape.iter().product();
    let halves: Vec<f16> = random_vec(len, seed)
        .into_iter()
        .map(f16::from_f32)
        .collect();
    let t = Tensor::from_slice_on(&halves, shape, dev).expect("upload");
    (halves.iter().map(|h| f64::from(h.to_f32())).collect(), t)
}

/// The first element of `got` (a float16 tensor) off `want` by more than [`F16_TOL`].
fn first_wrong(got: &Tensor, want: &[f64], n: usize) -> Option<String> {
    if got.dtype() != DType::F16 {
        return Some(format!("the output is {:?}, not float16", got.dtype()));
    }
    let values = got.to_vec::<f16>().expect("readback");
    values
        .iter()
        .zip(want)
        .enumerate()
        .find(|(_, (g, w))| {
            let close = (f64::from(g.to_f32()) - **w).abs() <= F16_TOL * w.abs().max(1.0);
            !close
        })
        .map(|(i, (g, w))| {
            format!(
                "out[{}, {}] = {g} where the oracle has {w:.5}",
                i / n,
                i % n
            )
        })
}

/// The shapes: each dimension below, at and past a fragment (16) and a tile (32, 64), the
/// tutorial's dense layers, and random ones up to 300 (odd sizes included).
fn shapes() -> Vec<(usize, usize, usize)> {
    let mut shapes = vec![
        (1, 1, 1),
        (16, 16, 16),
        (17, 33, 15),
        (64, 64, 64),
        (65, 97, 130),
        (128, 1152, 128),
        (300, 37, 9),
        // k and n multiples of 4, untransposed: the vec4 candidates' products.
        (33, 36, 20),
        (130, 100, 68),
    ];
    let dims = random_vec(24, 7_700);
    for d in dims.chunks_exact(3) {
        let dim = |x: f32| 1 + ((x + 1.0) * 150.0) as usize;
        shapes.push((dim(d[0]), dim(d[1]), dim(d[2])));
    }
    shapes
}

/// Every product of [`shapes`] on `dev` (whose runtime forces one candidate): a dense layer
/// with bias and activation, and every transpose. The failures, each naming the product. (A
/// vec4 candidate takes the untransposed products with k and n multiples of 4, a scalar one
/// the others; the rest fall back to the default kernels, and are checked all the same.)
fn check_products(dev: &LogicalDevice) -> Vec<String> {
    let _s = dev.scope();
    let mut failures = Vec::new();
    for (t, (m, k, n)) in shapes().into_iter().enumerate() {
        let seed = 77_000 + 10 * t as u64;
        let act = [Activation::Relu, Activation::Linear, Activation::Selu][t % 3];
        let (a, at) = half_input(dev, &[m, k], seed);
        let (w, wt) = half_input(dev, &[k, n], seed + 1);
        let (b, bt) = half_input(dev, &[n], seed + 2);
        let y = ops::dense(&at, &wt, Some(&bt), act).expect("dense");
        let want = r::matmul_bias_act(&a, &w, Some(&b), m, k, n, act);
        if let Some(e) = first_wrong(&y, &want, n) {
            failures.push(format!("dense {m}x{k}x{n} {act:?}: {e}"));
        }
        for (ta, tb) in [(true, false), (false, true), (true, true)] {
            let ashape = if ta { [k, m] } else { [m, k] };
            let bshape = if tb { [n, k] } else { [k, n] };
            let (av, a2) = half_input(dev, &ashape, seed + 3);
            let (bv, b2) = half_input(dev, &bshape, seed + 4);
            let y = ops::matmul_transposed(&a2, &b2, ta, tb).expect("matmul");
            let want = r::matmul(&av, &bv, m, k, n, ta, tb);
            if let Some(e) = first_wrong(&y, &want, n) {
                failures.push(format!("matmul {m}x{k}x{n} ta={ta} tb={tb}: {e}"));
            }
        }
    }
    failures
}

/// The kernel gradients of 1×1 convolutions long enough in pixels for the split-k candidate
/// (`xᵀ · dz` over the pixels on the tensor cores), in float32 as the layers ask for them and
/// in float16 as `Conv2DBackpropFilter` gives them. The failures, each naming the shape.
fn check_pointwise_kernel_grads(dev: &LogicalDevice) -> Vec<String> {
    let _s = dev.scope();
    let mut failures = Vec::new();
    for (t, &(n, h, w, c_in, c_out)) in
        [(2, 28, 28, 32, 32), (3, 14, 14, 64, 128), (5, 9, 11, 16, 8)]
            .iter()
            .enumerate()
    {
        let s = Conv2dShape {
            n,
            h,
            w,
            c_in,
            c_out,
            kh: 1,
            kw: 1,
            padding: Padding::Valid,
            strides: [1, 1],
            dilation: [1, 1],
        };
        let seed = 78_000 + 10 * t as u64;
        let (x, xt) = half_input(dev, &[n, h, w, c_in], seed);
        let (dz, dzt) = half_input(dev, &[n, h, w, c_out], seed + 1);
        let want = r::conv2d_backward_kernel(&x, &dz, &s);
        let kshape = [1, 1, c_in, c_out];
        let what = format!("1x1 kernel gradient {n}x{h}x{w} {c_in}->{c_out}");
        let wide =
            ops::conv2d_backward_kernel_as(&xt, &dzt, &kshape, Padding::Valid, GradDType::Float32)
                .expect("kernel gradient");
        let got = wide.to_vec::<f32>().expect("readback");
        // float16 operands multiply exactly in float32; only the sums round.
        let off = got
            .iter()
            .zip(&want)
            .position(|(g, w)| (f64::from(*g) - w).abs() > 1e-5 * w.abs().max(1.0));
        if wide.dtype() != DType::F32 {
            failures.push(format!("{what}: {:?}, not float32", wide.dtype()));
        } else if let Some(i) = off {
            failures.push(format!(
                "{what} in float32: dk[{i}] = {}, oracle {:.5}",
                got[i], want[i]
            ));
        }
        let half = ops::conv2d_backward_kernel(&xt, &dzt, &kshape, Padding::Valid).expect("dk");
        if let Some(e) = first_wrong(&half, &want, c_out) {
            failures.push(format!("{what} in float16: {e}"));
        }
    }
    failures
}

/// Convolutions as implicit products on the tensor cores (the im2col matrix gathered in the
/// loads): the forward pass with a bias and an activation ('same' and 'valid', strides,
/// dilation, channel counts with and without the vec4 kernels), the input gradients (a
/// correlation of dz, upsampled by the strides, with the flipped kernel), and the kernel gradients
/// long enough in pixels for the split candidate, in float32 as the layers ask for them. The
/// failures, each naming the convolution.
fn check_convolutions(dev: &LogicalDevice) -> Vec<String> {
    let _s = dev.scope();
    let mut failures = Vec::new();
    let shapes = [
        (4, 16, 16, 16, 32, 3, 1, 1, Padding::Same),
        (10, 15, 13, 32, 64, 3, 2, 1, Padding::Same),
        (5, 12, 14, 5, 24, 3, 1, 1, Padding::Valid),
        (3, 17, 11, 8, 40, 3, 1, 2, Padding::Same),
        (13, 13, 11, 6, 20, 3, 2, 1, Padding::Same),
        (3, 14, 14, 64, 128, 3, 1, 1, Padding::Same),
    ];
    for (t, &(n, h, w, c_in, c_out, k, stride, dilation, padding)) in shapes.iter().enumerate() {
        let s = Conv2dShape {
            n,
            h,
            w,
            c_in,
            c_out,
            kh: k,
            kw: k,
            padding,
            strides: [stride, stride],
            dilation: [dilation, dilation],
        };
        let options = ConvOptions::new(padding).strides(stride).dilation(dilation);
        let what =
            format!("{k}x{k} conv {n}x{h}x{w} {c_in}->{c_out} s{stride} d{dilation} {padding:?}");
        let seed = 79_000 + 10 * t as u64;
        let act = [Activation::Relu, Activation::Selu, Activation::Linear][t % 3];
        let (x, xt) = half_input(dev, &[n, h, w, c_in], seed);
        let (kv, kt) = half_input(dev, &[k, k, c_in, c_out], seed + 1);
        let (b, bt) = half_input(dev, &[c_out], seed + 2);
        let y = ops::conv2d(&xt, &kt, Some(&bt), options, act).expect("conv2d");
        let want = r::conv2d_forward(&x, &kv, Some(&b), &s, act);
        if let Some(e) = first_wrong(&y, &want, c_out) {
            failures.push(format!("{what} {act:?}: {e}"));
        }
        let (oh, ow) = s.out_hw();
        let (dz, dzt) = half_input(dev, &[n, oh, ow, c_out], seed + 3);
        let dx = ops::conv2d_backward_input(&dzt, &kt, &[n, h, w, c_in], options)
            .expect("input gradient");
        let want = r::conv2d_backward_input(&dz, &kv, &s);
        if let Some(e) = first_wrong(&dx, &want, c_in) {
            failures.push(format!("input gradient of {what}: {e}"));
        }
        let dk = ops::conv2d_backward_kernel_as(
            &xt,
            &dzt,
            &[k, k, c_in, c_out],
            options,
            GradDType::Float32,
        )
        .expect("kernel gradient");
        let got = dk.to_vec::<f32>().expect("readback");
        let want = r::conv2d_backward_kernel(&x, &dz, &s);
        // float16 operands multiply exactly in float32; only the sums round.
        if let Some(i) = got
            .iter()
            .zip(&want)
            .position(|(g, w)| (f64::from(*g) - w).abs() > 1e-4 * w.abs().max(1.0))
        {
            failures.push(format!(
                "kernel gradient of {what}: dk[{i}] = {}, oracle {:.5}",
                got[i], want[i]
            ));
        }
    }
    failures
}

#[test]
fn coop_matrix_candidates_match_the_oracle() {
    let rt = common::builder()
        .memory_growth(true)
        .build()
        .expect("runtime");
    let mut failures = Vec::new();
    for dev in gpus(&rt) {
        let kernels = dev
            .cooperative_matrix_kernels()
            .expect("the self-check runs");
        if kernels.is_empty() {
            println!(
                "skipped: {} has no cooperative matrices: {}",
                label(&dev),
                dev.cooperative_matrix_missing()
                    .unwrap_or_else(|| "no candidate".into())
            );
            continue;
        }
        println!(
            "{}: cooperative matrices {:?}",
            label(&dev),
            dev.cooperative_matrix_configs()
        );
        for (candidate, self_check) in kernels {
            if let Err(e) = &self_check {
                failures.push(format!(
                    "coop candidate {candidate} on {}: self-check failed (never picked): {e}",
                    label(&dev)
                ));
            }
            let forced = common::builder()
                .memory_growth(true)
                .env("ANYGPU_AUTOTUNE_FORCE", Some(candidate))
                .build()
                .expect("runtime");
            let same = gpus(&forced)
                .into_iter()
                .find(|d| d.full_name() == dev.full_name())
                .expect("the same device in a second runtime");
            let mut wrong = check_products(&same);
            wrong.extend(check_pointwise_kernel_grads(&same));
            wrong.extend(check_convolutions(&same));
            // The candidate runs the products it applies to; the others fall back to the
            // default kernels and are checked all the same.
            println!(
                "{candidate} forced on {}: {} products, 3 kernel gradients and 6 convolutions \
                 checked, {} wrong",
                label(&dev),
                4 * shapes().len(),
                wrong.len()
            );
            for e in wrong {
                failures.push(format!(
                    "coop candidate {candidate} on {}: {e}",
                    label(&dev)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What the tuner makes of the candidates where they exist: a float16 dense layer of the
/// tutorial's size at batch 1024, tuned from an empty cache, and the decision with every
/// candidate's time (printed; it fails only if the product is wrong).
#[test]
fn coop_matrix_candidates_are_tuned_beside_the_others() {
    let dir = std::env::temp_dir().join(format!("anygpu-coop-tune-{}", std::process::id()));
    let rt = common::builder()
        .memory_growth(true)
        .env("ANYGPU_AUTOTUNE", Some("on"))
        .env("ANYGPU_CACHE_DIR", dir.to_str())
        .build()
        .expect("runtime");
    for dev in gpus(&rt) {
        if dev
            .cooperative_matrix_kernels()
            .expect("the self-check runs")
            .is_empty()
        {
            println!(
                "skipped: {} has no cooperative matrices: {}",
                label(&dev),
                dev.cooperative_matrix_missing()
                    .unwrap_or_else(|| "no candidate".into())
            );
            continue;
        }
        let _s = dev.scope();
        for (m, k, n) in [(1024, 1152, 128), (1024, 784, 128), (8192, 64, 128)] {
            let (a, at) = half_input(&dev, &[m, k], 1);
            let (w, wt) = half_input(&dev, &[k, n], 2);
            let y = ops::dense(&at, &wt, None, Activation::Linear).expect("dense");
            let want = r::matmul(&a, &w, m, k, n, false, false);
            assert_eq!(first_wrong(&y, &want, n), None, "{m}x{k}x{n} as tuned");
        }
        for d in dev.tuning_decisions() {
            println!(
                "{}: {} [{}] -> {} {:?}",
                label(&dev),
                d.op,
                d.class,
                d.candidate,
                d.timings_ms
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
