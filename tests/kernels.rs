//! Every CNN op on every device — `CPU:0` and each GPU adapter found (`WGPU_BACKEND=vulkan,gl`:
//! lavapipe and llvmpipe here) — against the f64 oracle of `anygpu::ops::reference`, on random
//! data (never zeros) with shapes of 1, 3, 7, 13 and 28, batches 1 and 3, channels 1, 3 and 32,
//! 'same' and 'valid', kernels 1×1 to 5×5, relative tolerance 1e-4.
//!
//! GPU outputs are NaN-trapped: right before each op, the test allocates NaN-filled tensors of
//! the op's output sizes on the device and drops them, so the arena's best fit hands exactly
//! those chunks, stale NaNs included, to the op's outputs (allocated first, in the same order):
//! any element a kernel forgets to write fails the comparison. `nan_trap_reuses_the_chunk`
//! checks that reuse with the allocator's statistics. Tests hold one lock so no other test's
//! allocation can take a trap's chunk in between.
//!
//! With `ANYGPU_REQUIRE_ADAPTER=1`, finding no GPU adapter is a failure, not a CPU-only run.

mod common;

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use anygpu::ops;
use anygpu::ops::reference::{self as r, assert_close, random_vec, to_f64};
use anygpu::ops::spec::{
    Activation, AdamParams, Conv2dShape, ConvOptions, DepthwiseShape, Padding, PoolShape, SgdParams,
};
use anygpu::{DeviceKind, Error, KindFilter, LogicalDevice, Runtime, RuntimeBuilder, Tensor};

const TOL: f64 = 1e-4;
const ACTS: [Activation; 3] = [Activation::Linear, Activation::Relu, Activation::Selu];

fn builder() -> RuntimeBuilder {
    Runtime::builder()
        .env("WGPU_BACKEND", Some("vulkan,gl"))
        .memory_growth(true)
}

struct Env {
    rt: Runtime,
    devices: Vec<LogicalDevice>,
}

/// The runtime every test shares, and its devices (CPU:0 first, then the GPUs).
fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let rt = builder().build().expect("the runtime initializes");
        let devices = common::available(
            rt.list_logical_devices(KindFilter::All)
                .expect("devices are listed"),
        );
        require_gpu(&devices);
        Env { rt, devices }
    })
}

/// Panics when `ANYGPU_REQUIRE_ADAPTER=1` and there is no GPU among `devices`.
fn require_gpu(devices: &[LogicalDevice]) {
    let gpus = devices
        .iter()
        .filter(|d| d.device_type() == DeviceKind::Gpu)
        .count();
    if std::env::var("ANYGPU_REQUIRE_ADAPTER").as_deref() == Ok("1") {
        assert!(
            gpus > 0,
            "ANYGPU_REQUIRE_ADAPTER=1 but no GPU adapter was found (WGPU_BACKEND=vulkan,gl)"
        );
    } else if gpus == 0 {
        eprintln!("no GPU adapter found: only CPU:0 is tested");
    }
}

/// One test at a time: the NaN traps rely on nobody else allocating between trap and op.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn put(dev: &LogicalDevice, data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice_on(data, shape, dev).expect("upload")
}

fn put_i32(dev: &LogicalDevice, data: &[i32], shape: &[usize]) -> Tensor {
    Tensor::from_slice_on(data, shape, dev).expect("upload")
}

fn get(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().expect("readback")
}

/// Allocates NaN-filled tensors of these element counts on a GPU device and drops them: the
/// op's outputs, allocated next in the same order, take these chunks with the NaNs in them.
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

/// Fails unless `t` lives on `dev` (soft placement must not have moved the op elsewhere).
fn on(t: &Tensor, dev: &LogicalDevice) {
    assert_eq!(
        t.device(),
        dev.full_name(),
        "the op ran on {} instead of {}",
        t.device(),
        dev.full_name()
    );
}

fn label(dev: &LogicalDevice) -> String {
    format!("{} ({})", dev.name(), dev.adapter_name())
}

/// Values in [-scale, scale), never zero.
fn scaled(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    random_vec(len, seed).iter().map(|v| v * scale).collect()
}

#[test]
fn devices_are_found() {
    let _g = serial();
    let e = env();
    assert!(e.devices.iter().any(|d| d.device_type() == DeviceKind::Cpu));
    for d in &e.devices {
        eprintln!("testing {}", label(d));
    }
}

#[test]
fn nan_trap_reuses_the_chunk() {
    let _g = serial();
    // A runtime of its own: its arenas start empty, so every placement below is known.
    let rt = builder().build().expect("runtime");
    let gpus = rt.list_logical_devices(DeviceKind::Gpu).expect("devices");
    require_gpu(&gpus);
    for dev in &gpus {
        let _s = dev.scope();
        let name = dev.name();
        let s = PoolShape {
            n: 2,
            h: 8,
            w: 8,
            c: 32,
        };
        let out = s.output_len();
        let x = put(dev, &random_vec(s.input_len(), 1), &[2, 8, 8, 32]);
        // A hole of exactly the output's size, in front of a blocker; the rest of the region
        // is one large free block.
        let filler = put(dev, &vec![1.0; out], &[out]);
        let blocker = put(dev, &[1.0; 64], &[64]);
        drop(filler);
        let largest = || {
            rt.get_memory_stats(name)
                .expect("stats")
                .largest_free_block_bytes
        };
        let before = largest();
        let nan = put(dev, &vec![f32::NAN; out], &[out]);
        assert_eq!(largest(), before, "{name}: the trap did not take the hole");
        drop(nan);
        // The op's output takes the trap's chunk: the large block stays whole ...
        let y = ops::max_pool2d(&x).expect("max_pool2d");
        on(&y, dev);
        assert_eq!(
            largest(),
            before,
            "{name}: the output did not reuse the trap's chunk"
        );
        // ... whereas the same allocation with the hole taken comes out of the large block,
        // so the check above can tell the two apart.
        let other = put(dev, &vec![1.0; out], &[out]);
        assert!(
            largest() < before,
            "{name}: the statistics cannot see placement"
        );
        assert_close(
            &get(&y),
            &r::maxpool_forward(&to_f64(&get(&x)), &s),
            0.0,
            "maxpool after the trap",
        );
        drop((other, blocker));
    }
}

#[test]
fn conv2d_forward_and_gradients() {
    let _g = serial();
    check_conv2d(&env().devices);
}

/// Conv2D forward, input, kernel, bias and fused weight gradients on `devices`, at stride 1,
/// then at strides and dilations above 1 (the same kernels; an input gradient reads dz
/// upsampled by the strides).
fn check_conv2d(devices: &[LogicalDevice]) {
    use Padding::{Same, Valid};
    // (n, h, w, c_in, c_out, kh, kw, padding)
    let unit = [
        (1, 1, 1, 1, 1, 1, 1, Same),
        (1, 7, 7, 3, 32, 3, 3, Same),
        (3, 13, 7, 3, 7, 5, 5, Valid),
        (3, 28, 28, 1, 32, 3, 3, Same),
        (1, 13, 13, 32, 3, 3, 3, Valid),
        (3, 7, 13, 32, 32, 1, 1, Same),
        (1, 3, 28, 32, 13, 5, 3, Same),
        (1, 7, 7, 3, 4, 2, 2, Same),
        (1, 13, 1, 3, 8, 5, 1, Same),
        (3, 28, 28, 32, 32, 3, 3, Valid),
        (1, 2, 3, 3, 4, 3, 3, Valid),
        // One input channel, 3×3 (conv2d_c1_ubo8): valid padding and a ragged last workgroup,
        // then 'same' with a bias and two blocks of 8 output channels.
        (2, 9, 11, 1, 8, 3, 3, Valid),
        (1, 5, 6, 1, 16, 3, 3, Same),
    ];
    // (n, h, w, c_in, c_out, kh, kw, padding, strides, dilation): the vec4 kernels (c_out a
    // multiple of 4, workgroup tiles too) and the scalar ones, uneven strides, TF's uneven
    // 'same' padding at stride 2, a strided 1×1 (a ResNet shortcut), 9 taps on one channel; an
    // input gradient narrower than its stride, and one with several blocks per phase at 3.
    let strided = [
        (2, 14, 14, 32, 32, 3, 3, Same, [2, 2], [1, 1]),
        (2, 7, 6, 8, 12, 3, 3, Same, [2, 2], [1, 1]),
        (3, 9, 11, 5, 7, 3, 3, Valid, [2, 3], [1, 1]),
        (1, 10, 9, 4, 8, 4, 4, Same, [3, 2], [1, 1]),
        (2, 11, 10, 8, 16, 3, 3, Same, [1, 1], [2, 2]),
        (1, 12, 9, 3, 5, 3, 2, Valid, [1, 1], [2, 3]),
        (2, 9, 9, 16, 8, 1, 1, Valid, [2, 2], [1, 1]),
        (2, 13, 12, 1, 8, 3, 3, Same, [2, 2], [1, 1]),
        (2, 5, 2, 4, 8, 3, 3, Same, [2, 3], [1, 1]),
        (1, 7, 31, 4, 7, 3, 3, Valid, [1, 3], [1, 1]),
    ];
    let cases = unit
        .iter()
        .map(|&(n, h, w, ci, co, kh, kw, pad)| (n, h, w, ci, co, kh, kw, pad, [1, 1], [1, 1]))
        .chain(strided);
    for dev in devices {
        let _s = dev.scope();
        for (t, (n, h, w, c_in, c_out, kh, kw, padding, strides, dilation)) in
            cases.clone().enumerate()
        {
            let s = Conv2dShape {
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
            };
            let options = ConvOptions::new(padding)
                .strides(strides)
                .dilation(dilation);
            let (oh, ow) = s.out_hw();
            let act = ACTS[t % 3];
            let with_bias = t % 2 == 0;
            let seed = 100 + 10 * t as u64;
            let x = random_vec(s.input_len(), seed);
            let k = random_vec(s.kernel_len(), seed + 1);
            let b = random_vec(c_out, seed + 2);
            let dz = random_vec(s.output_len(), seed + 3);
            let (x64, k64, dz64) = (to_f64(&x), to_f64(&k), to_f64(&dz));
            let xt = put(dev, &x, &[n, h, w, c_in]);
            let kt = put(dev, &k, &[kh, kw, c_in, c_out]);
            let bt = put(dev, &b, &[c_out]);
            let dzt = put(dev, &dz, &[n, oh, ow, c_out]);
            let what = format!("{} {s:?} {act:?} bias={with_bias}", label(dev));

            trap(dev, &[s.output_len()]);
            let y = ops::conv2d(&xt, &kt, with_bias.then_some(&bt), options, act).unwrap();
            on(&y, dev);
            assert_eq!(y.shape(), [n, oh, ow, c_out]);
            let b64 = with_bias.then(|| to_f64(&b));
            let expected = r::conv2d_forward(&x64, &k64, b64.as_deref(), &s, act);
            assert_close(&get(&y), &expected, TOL, &format!("conv2d {what}"));

            trap(dev, &[s.input_len()]);
            let dx = ops::conv2d_backward_input(&dzt, &kt, &[n, h, w, c_in], options).unwrap();
            on(&dx, dev);
            let expected = r::conv2d_backward_input(&dz64, &k64, &s);
            assert_close(&get(&dx), &expected, TOL, &format!("conv2d dx {what}"));

            trap(dev, &[s.kernel_len()]);
            let dk =
                ops::conv2d_backward_kernel(&xt, &dzt, &[kh, kw, c_in, c_out], options).unwrap();
            on(&dk, dev);
            let expected = r::conv2d_backward_kernel(&x64, &dz64, &s);
            assert_close(&get(&dk), &expected, TOL, &format!("conv2d dk {what}"));

            trap(dev, &[c_out]);
            let db = ops::bias_grad(&dzt).unwrap();
            on(&db, dev);
            let expected = r::bias_grad(&dz64, c_out);
            assert_close(&get(&db), &expected, TOL, &format!("bias grad {what}"));

            // Both weight gradients at once, from the gradient of the activated output `y`
            // (the random `dz` stands in for it).
            trap(dev, &[s.kernel_len(), c_out]);
            let kshape = [kh, kw, c_in, c_out];
            let (dk, db) =
                ops::conv2d_backward_weights(&xt, &y, &dzt, &kshape, options, act).unwrap();
            let dz_act = r::activation_backward(&dz64, &to_f64(&get(&y)), act);
            for (got, expected, name) in [
                (&dk, r::conv2d_backward_kernel(&x64, &dz_act, &s), "dk"),
                (&db, r::bias_grad(&dz_act, c_out), "db"),
            ] {
                on(got, dev);
                assert_close(&get(got), &expected, TOL, &format!("weights {name} {what}"));
            }
        }
    }
}

#[test]
fn activation_and_bias_gradients_in_one_op() {
    let _g = serial();
    check_activation_bias_grad(&env().devices);
}

fn check_activation_bias_grad(devices: &[LogicalDevice]) {
    // Rows in one lane and in many (lanes that do not divide them), columns in vec4s and not,
    // wide and narrow.
    let cases = [(600, 32), (7, 12), (300, 6), (1, 4), (5003, 8), (130, 128)];
    for dev in devices {
        let _s = dev.scope();
        for (t, &(rows, cols)) in cases.iter().enumerate() {
            for act in [Activation::Relu, Activation::Selu, Activation::Linear] {
                let seed = 7600 + 10 * t as u64;
                let (y, dy) = (
                    random_vec(rows * cols, seed),
                    random_vec(rows * cols, seed + 1),
                );
                let (yt, dyt) = (put(dev, &y, &[rows, cols]), put(dev, &dy, &[rows, cols]));
                let (dz, db) = ops::activation_bias_grad(&dyt, &yt, act).unwrap();
                on(&dz, dev);
                let expected = r::activation_backward(&to_f64(&dy), &to_f64(&y), act);
                let what = format!("{rows}x{cols} {act:?} {}", label(dev));
                assert_close(&get(&dz), &expected, TOL, &format!("dz {what}"));
                let expected = r::bias_grad(&expected, cols);
                assert_close(&get(&db), &expected, TOL, &format!("db {what}"));
            }
        }
    }
}

#[test]
fn depthwise_forward_and_gradients() {
    let _g = serial();
    check_depthwise(&env().devices);
}

/// Depthwise forward, input and kernel gradients on `devices`.
fn check_depthwise(devices: &[LogicalDevice]) {
    // (n, h, w, c, kh, kw)
    let cases = [
        (1, 1, 1, 1, 1, 1),
        (1, 7, 7, 3, 3, 3),
        (3, 13, 7, 32, 3, 3),
        (3, 28, 28, 32, 3, 3),
        (1, 7, 13, 32, 5, 5),
        (3, 13, 28, 3, 5, 3),
        (1, 3, 3, 4, 2, 2),
        (1, 2, 1, 8, 3, 3),
        (1, 1, 7, 32, 3, 3),
        (3, 7, 7, 12, 1, 3),
        // Two channel blocks of the 8×8 tiles, the second partial; partial tiles at the edges.
        (2, 9, 11, 40, 3, 3),
    ];
    for dev in devices {
        let _s = dev.scope();
        for (t, &(n, h, w, c, kh, kw)) in cases.iter().enumerate() {
            let s = DepthwiseShape::same(n, h, w, c, kh, kw);
            let seed = 300 + 10 * t as u64;
            let x = random_vec(s.input_len(), seed);
            let k = random_vec(s.kernel_len(), seed + 1);
            let dy = random_vec(s.input_len(), seed + 2);
            let (x64, k64, dy64) = (to_f64(&x), to_f64(&k), to_f64(&dy));
            let xt = put(dev, &x, &[n, h, w, c]);
            let kt = put(dev, &k, &[kh, kw, c, 1]);
            let dyt = put(dev, &dy, &[n, h, w, c]);
            let what = format!("{} {s:?}", label(dev));

            trap(dev, &[s.input_len()]);
            let y = ops::depthwise_conv2d(&xt, &kt).unwrap();
            on(&y, dev);
            let expected = r::depthwise_forward(&x64, &k64, &s);
            assert_close(&get(&y), &expected, TOL, &format!("depthwise {what}"));

            trap(dev, &[s.input_len()]);
            let dx = ops::depthwise_conv2d_backward_input(&dyt, &kt).unwrap();
            on(&dx, dev);
            let expected = r::depthwise_backward_input(&dy64, &k64, &s);
            assert_close(&get(&dx), &expected, TOL, &format!("depthwise dx {what}"));

            trap(dev, &[s.kernel_len()]);
            let dk = ops::depthwise_conv2d_backward_kernel(&xt, &dyt, &[kh, kw, c, 1]).unwrap();
            on(&dk, dev);
            let expected = r::depthwise_backward_kernel(&x64, &dy64, &s);
            assert_close(&get(&dk), &expected, TOL, &format!("depthwise dk {what}"));
        }
    }
}

#[test]
fn fused_separable_conv2d_forward_and_gradients() {
    let _g = serial();
    // (n, h, w, c, filters, k): a batch large enough for the CPU's fused blocks, and odd ones.
    let cases = [
        (1, 1, 1, 1, 1, 1),
        (3, 7, 7, 3, 5, 3),
        (1, 13, 7, 32, 13, 3),
        (9, 14, 14, 32, 64, 3),
        (13, 7, 7, 64, 128, 3),
        (3, 3, 13, 1, 7, 5),
    ];
    for dev in &env().devices {
        let _s = dev.scope();
        for (t, &(n, h, w, c, f, k)) in cases.iter().enumerate() {
            let s = DepthwiseShape::same(n, h, w, c, k, k);
            let act = ACTS[t % ACTS.len()];
            let seed = 350 + 10 * t as u64;
            let x = random_vec(s.input_len(), seed);
            let dk = random_vec(s.kernel_len(), seed + 1);
            let pk = random_vec(c * f, seed + 2);
            let b = random_vec(f, seed + 3);
            let dy = random_vec(n * h * w * f, seed + 4);
            let xt = put(dev, &x, &[n, h, w, c]);
            let dkt = put(dev, &dk, &[k, k, c, 1]);
            let pkt = put(dev, &pk, &[1, 1, c, f]);
            let bt = put(dev, &b, &[f]);
            let dyt = put(dev, &dy, &[n, h, w, f]);
            let what = format!("{} {s:?} filters {f} {act:?}", label(dev));

            let rows = n * h * w;
            trap(dev, &[rows * f]);
            let y = ops::separable_conv2d(&xt, &dkt, &pkt, Some(&bt), act).unwrap();
            on(&y, dev);
            let d64 = r::depthwise_forward(&to_f64(&x), &to_f64(&dk), &s);
            let (pk64, b64) = (to_f64(&pk), to_f64(&b));
            let expected = r::matmul_bias_act(&d64, &pk64, Some(&b64), rows, c, f, act);
            assert_close(&get(&y), &expected, TOL, &format!("separable {what}"));

            trap(dev, &[x.len(), dk.len(), pk.len(), f]);
            let g = ops::separable_conv2d_backward(&xt, &dkt, &pkt, &y, &dyt, act, true).unwrap();
            let dz = r::activation_backward(&to_f64(&dy), &to_f64(&get(&y)), act);
            let dd = r::matmul(&dz, &pk64, rows, f, c, false, true);
            let dx = g.dx.expect("dx was asked for");
            for (got, name) in [(&dx, "dx"), (&g.depthwise, "d depthwise")] {
                on(got, dev);
                let expected = match name {
                    "dx" => r::depthwise_backward_input(&dd, &to_f64(&dk), &s),
                    _ => r::depthwise_backward_kernel(&to_f64(&x), &dd, &s),
                };
                assert_close(&get(got), &expected, TOL, &format!("{name} {what}"));
            }
            let expected = r::matmul(&d64, &dz, c, rows, f, true, false);
            assert_close(
                &get(&g.pointwise),
                &expected,
                TOL,
                &format!("d pointwise {what}"),
            );
            let expected = r::sum_rows(&dz, rows, f);
            assert_close(&get(&g.bias), &expected, TOL, &format!("d bias {what}"));
            assert_eq!(g.depthwise.shape(), [k, k, c, 1]);
            assert_eq!(g.pointwise.shape(), [1, 1, c, f]);

            let no_dx = ops::separable_conv2d_backward(&xt, &dkt, &pkt, &y, &dyt, act, false);
            assert!(no_dx.unwrap().dx.is_none());
        }
    }
}

#[test]
fn fused_separable_conv2d_max_pool_gradients() {
    let _g = serial();
    // (n, h, w, c, filters): even, odd (7 -> 3, a dropped row and column) and too small to pool.
    let cases = [
        (9, 14, 14, 32, 64),
        (13, 7, 7, 64, 128),
        (3, 5, 6, 3, 5),
        (2, 1, 3, 2, 4),
    ];
    for dev in &env().devices {
        let _s = dev.scope();
        for (t, &(n, h, w, c, f)) in cases.iter().enumerate() {
            let s = DepthwiseShape::same(n, h, w, c, 3, 3);
            let pool = PoolShape { n, h, w, c: f };
            let act = ACTS[t % ACTS.len()];
            let seed = 450 + 10 * t as u64;
            let x = random_vec(s.input_len(), seed);
            let dk = random_vec(s.kernel_len(), seed + 1);
            let pk = random_vec(c * f, seed + 2);
            let dp = random_vec(pool.output_len(), seed + 3);
            let xt = put(dev, &x, &[n, h, w, c]);
            let dkt = put(dev, &dk, &[3, 3, c, 1]);
            let pkt = put(dev, &pk, &[1, 1, c, f]);
            let (oh, ow) = pool.out_hw();
            let dpt = put(dev, &dp, &[n, oh, ow, f]);
            let what = format!("{} {s:?} filters {f} {act:?}", label(dev));
            let y = ops::separable_conv2d(&xt, &dkt, &pkt, None, act).unwrap();
            // The forward op with the pool: the same output, and its pool.
            trap(dev, &[y.len(), pool.output_len()]);
            let (y_again, pooled) =
                ops::separable_conv2d_max_pool(&xt, &dkt, &pkt, None, act).unwrap();
            on(&pooled, dev);
            assert_eq!(get(&y_again), get(&y), "{what}: output with the pool");
            assert_eq!(pooled.shape(), [n, oh, ow, f], "{what}");
            let expected = r::maxpool_forward(&to_f64(&get(&y)), &pool);
            assert_close(&get(&pooled), &expected, 0.0, &format!("pooled {what}"));

            trap(dev, &[x.len(), dk.len(), pk.len(), f]);
            let g = ops::separable_conv2d_max_pool_backward(&xt, &dkt, &pkt, &y, &dpt, act, true)
                .unwrap();
            // The reference: the pool's gradient, then the separable layer's.
            let y64 = to_f64(&get(&y));
            let dy = r::maxpool_backward(&y64, &to_f64(&dp), &pool);
            let dz = r::activation_backward(&dy, &y64, act);
            let rows = n * h * w;
            let d64 = r::depthwise_forward(&to_f64(&x), &to_f64(&dk), &s);
            let dd = r::matmul(&dz, &to_f64(&pk), rows, f, c, false, true);
            let checks = [
                (
                    g.dx.expect("dx was asked for"),
                    r::depthwise_backward_input(&dd, &to_f64(&dk), &s),
                    "dx",
                ),
                (
                    g.depthwise,
                    r::depthwise_backward_kernel(&to_f64(&x), &dd, &s),
                    "d depthwise",
                ),
                (
                    g.pointwise,
                    r::matmul(&d64, &dz, c, rows, f, true, false),
                    "d pointwise",
                ),
                (g.bias, r::sum_rows(&dz, rows, f), "d bias"),
            ];
            let dx64 = checks[0].1.clone();
            for (got, expected, name) in checks {
                on(&got, dev);
                assert_close(&get(&got), &expected, TOL, &format!("pooled {name} {what}"));
            }
            // `dx` through the activation whose output `x` would be.
            let input_activation = ACTS[(t + 1) % ACTS.len()];
            let options = ops::SeparableBackwardOptions {
                pooled: true,
                need_dx: true,
                input_activation,
            };
            trap(dev, &[x.len(), dk.len(), pk.len(), f]);
            let g = ops::separable_conv2d_backward_with(&xt, [&dkt, &pkt], &y, &dpt, act, options)
                .unwrap();
            let dx = g.dx.expect("dx was asked for");
            on(&dx, dev);
            let expected = r::activation_backward(&dx64, &to_f64(&x), input_activation);
            let what = format!("dx through {input_activation:?} {what}");
            assert_close(&get(&dx), &expected, TOL, &what);
            // The gradient of the unpooled output is not the pooled one's shape.
            let err = ops::separable_conv2d_max_pool_backward(&xt, &dkt, &pkt, &y, &y, act, true)
                .unwrap_err();
            assert!(err.to_string().contains("pooled output"), "{what}: {err}");
        }
    }
}

#[test]
fn fused_conv2d_separable_conv2d_max_pool_gradients() {
    let _g = serial();
    use Padding::{Same, Valid};
    // (n, h, w, c_in, c, filters, k, padding): the tutorial's stem in enough blocks for the
    // CPU's fused loop; a batch too small for it; a patch too large for the small-K product
    // (im2col) with 'valid' padding; a 1×1 convolution.
    let cases = [
        (9, 28, 28, 1, 32, 32, 3, Same),
        (3, 7, 7, 1, 8, 16, 3, Same),
        (40, 9, 11, 3, 8, 5, 5, Valid),
        (40, 6, 6, 16, 16, 8, 1, Same),
    ];
    for dev in &env().devices {
        let _s = dev.scope();
        for (t, &(n, h, w, c_in, c, f, k, padding)) in cases.iter().enumerate() {
            let cs = Conv2dShape {
                n,
                h,
                w,
                c_in,
                c_out: c,
                kh: k,
                kw: k,
                padding,
                strides: [1, 1],
                dilation: [1, 1],
            };
            let (oh, ow) = cs.out_hw();
            let s = DepthwiseShape::same(n, oh, ow, c, 3, 3);
            let pool = PoolShape {
                n,
                h: oh,
                w: ow,
                c: f,
            };
            let (act0, act) = (ACTS[(t + 2) % 3], ACTS[t % 3]);
            let seed = 480 + 10 * t as u64;
            let x = random_vec(cs.input_len(), seed);
            let ck = random_vec(cs.kernel_len(), seed + 1);
            let cb = random_vec(c, seed + 2);
            let dk = random_vec(s.kernel_len(), seed + 3);
            let pk = random_vec(c * f, seed + 4);
            let b = random_vec(f, seed + 5);
            let dp = random_vec(pool.output_len(), seed + 6);
            let xt = put(dev, &x, &[n, h, w, c_in]);
            let ckt = put(dev, &ck, &[k, k, c_in, c]);
            let cbt = put(dev, &cb, &[c]);
            let dkt = put(dev, &dk, &[3, 3, c, 1]);
            let pkt = put(dev, &pk, &[1, 1, c, f]);
            let bt = put(dev, &b, &[f]);
            let (ph, pw) = pool.out_hw();
            let dpt = put(dev, &dp, &[n, ph, pw, f]);
            let what = format!("{} {cs:?} filters {f} {act0:?} {act:?}", label(dev));
            let stem = ops::ConvStem {
                kernel: &ckt,
                bias: Some(&cbt),
                options: padding.into(),
                act: act0,
            };

            trap(dev, &[n * oh * ow * f, pool.output_len()]);
            let (y, pooled) =
                ops::conv2d_separable_conv2d_max_pool(&xt, stem, &dkt, &pkt, Some(&bt), act)
                    .unwrap();
            on(&y, dev);
            on(&pooled, dev);
            let (x64, dk64, pk64) = (to_f64(&x), to_f64(&dk), to_f64(&pk));
            let a64 = r::conv2d_forward(&x64, &to_f64(&ck), Some(&to_f64(&cb)), &cs, act0);
            let d64 = r::depthwise_forward(&a64, &dk64, &s);
            let rows = n * oh * ow;
            let y64 = r::matmul_bias_act(&d64, &pk64, Some(&to_f64(&b)), rows, c, f, act);
            assert_close(&get(&y), &y64, TOL, &format!("stem y {what}"));
            let expected = r::maxpool_forward(&to_f64(&get(&y)), &pool);
            assert_close(
                &get(&pooled),
                &expected,
                0.0,
                &format!("stem pooled {what}"),
            );

            trap(dev, &[ck.len(), c, dk.len(), pk.len(), f]);
            let g = ops::conv2d_separable_conv2d_max_pool_backward(
                &xt,
                stem,
                [&dkt, &pkt],
                &y,
                &dpt,
                act,
            )
            .unwrap();
            // The reference: the pool's gradient, the separable layer's, the convolution's.
            let y32 = to_f64(&get(&y));
            let dy = r::maxpool_backward(&y32, &to_f64(&dp), &pool);
            let dz = r::activation_backward(&dy, &y32, act);
            let dd = r::matmul(&dz, &pk64, rows, f, c, false, true);
            let da = r::depthwise_backward_input(&dd, &dk64, &s);
            let dza = r::activation_backward(&da, &a64, act0);
            let checks = [
                (
                    g.conv_kernel,
                    r::conv2d_backward_kernel(&x64, &dza, &cs),
                    "conv kernel",
                ),
                (g.conv_bias, r::bias_grad(&dza, c), "conv bias"),
                (
                    g.depthwise,
                    r::depthwise_backward_kernel(&a64, &dd, &s),
                    "depthwise",
                ),
                (
                    g.pointwise,
                    r::matmul(&d64, &dz, c, rows, f, true, false),
                    "pointwise",
                ),
                (g.bias, r::sum_rows(&dz, rows, f), "bias"),
            ];
            for (got, expected, name) in checks {
                on(&got, dev);
                assert_close(&get(&got), &expected, TOL, &format!("stem d {name} {what}"));
            }
        }
        // A strided convolution is refused, naming the op.
        let x = put(dev, &random_vec(2 * 8 * 8, 1), &[2, 8, 8, 1]);
        let kernel = put(dev, &random_vec(9 * 4, 2), &[3, 3, 1, 4]);
        let (dk, pk) = (
            put(dev, &random_vec(9 * 4, 3), &[3, 3, 4, 1]),
            put(dev, &random_vec(4 * 4, 4), &[1, 1, 4, 4]),
        );
        let stem = ops::ConvStem {
            kernel: &kernel,
            bias: None,
            options: ops::spec::ConvOptions::new(Padding::Same).strides(2),
            act: Activation::Relu,
        };
        let err = ops::conv2d_separable_conv2d_max_pool(&x, stem, &dk, &pk, None, Activation::Relu)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("FusedConv2DSeparableConv2DMaxPool"),
            "{err}"
        );
    }
}

/// `op(A) · op(B)` of shape `m × n` over `k`, for the four combinations of transposes.
fn matmul_every_transpose(dev: &LogicalDevice, (m, kk, nn): (usize, usize, usize), seed: u64) {
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let a = random_vec(m * kk, seed);
        let bm = random_vec(kk * nn, seed + 1);
        let ashape = if ta { [kk, m] } else { [m, kk] };
        let bshape = if tb { [nn, kk] } else { [kk, nn] };
        trap(dev, &[m * nn]);
        let y = ops::matmul_transposed(&put(dev, &a, &ashape), &put(dev, &bm, &bshape), ta, tb)
            .unwrap();
        on(&y, dev);
        let expected = r::matmul(&to_f64(&a), &to_f64(&bm), m, kk, nn, ta, tb);
        let what = format!("matmul {m}x{kk}x{nn} {ta} {tb} {}", label(dev));
        assert_close(&get(&y), &expected, TOL, &what);
    }
}

#[test]
fn fused_dense_gradients() {
    // FusedDenseGrad against the oracle's separate steps: dz = dy * act'(y), db = Σ dz,
    // dw = xᵀ dz, dx = dz wᵀ. Shapes from one row to several CPU blocks and parallel ranges.
    let _g = serial();
    for dev in &env().devices {
        let _s = dev.scope();
        for (i, &(m, kk, nn)) in [(1, 3, 2), (7, 13, 5), (300, 32, 32), (2100, 64, 36)]
            .iter()
            .enumerate()
        {
            for act in ACTS {
                let seed = 1000 + 10 * i as u64;
                let x = random_vec(m * kk, seed);
                let w = random_vec(kk * nn, seed + 1);
                // An activation's output: selu's is above -1.76, relu's not negative.
                let y: Vec<f32> = random_vec(m * nn, seed + 2)
                    .iter()
                    .map(|&v| match act {
                        Activation::Relu => v.max(0.0),
                        _ => v,
                    })
                    .collect();
                let dy = random_vec(m * nn, seed + 3);
                let (xt, wt) = (put(dev, &x, &[m, kk]), put(dev, &w, &[kk, nn]));
                let (yt, dyt) = (put(dev, &y, &[m, nn]), put(dev, &dy, &[m, nn]));
                trap(dev, &[m * kk, kk * nn, nn]);
                let (dx, dw, db) = ops::dense_backward(&xt, &wt, &yt, &dyt, act, true).unwrap();
                let dx = dx.expect("dx was asked for");
                on(&dw, dev);
                let dz = r::activation_backward(&to_f64(&dy), &to_f64(&y), act);
                let what = format!("{m}x{kk}x{nn} {act:?} {}", label(dev));
                assert_close(
                    &get(&db),
                    &r::bias_grad(&dz, nn),
                    TOL,
                    &format!("db {what}"),
                );
                let want_dw = r::matmul(&to_f64(&x), &dz, kk, m, nn, true, false);
                assert_close(&get(&dw), &want_dw, TOL, &format!("dw {what}"));
                let want_dx = r::matmul(&dz, &to_f64(&w), m, nn, kk, false, true);
                assert_close(&get(&dx), &want_dx, TOL, &format!("dx {what}"));
                let (none, _, _) = ops::dense_backward(&xt, &wt, &yt, &dyt, act, false).unwrap();
                assert!(none.is_none());
            }
        }
    }
}

/// `ops::dense` with a bias and selu on random data against the oracle; `trapped`: the output
/// is NaN-trapped and checked to be on `dev`.
fn check_dense(
    dev: &LogicalDevice,
    (m, kk, nn): (usize, usize, usize),
    seed: u64,
    trapped: bool,
    what: &str,
) {
    let a = random_vec(m * kk, seed);
    let w = random_vec(kk * nn, seed + 1);
    let b = random_vec(nn, seed + 2);
    let (at, wt, bt) = (
        put(dev, &a, &[m, kk]),
        put(dev, &w, &[kk, nn]),
        put(dev, &b, &[nn]),
    );
    if trapped {
        trap(dev, &[m * nn]);
    }
    let y = ops::dense(&at, &wt, Some(&bt), Activation::Selu).unwrap();
    if trapped {
        on(&y, dev);
    }
    let expected = r::matmul_bias_act(
        &to_f64(&a),
        &to_f64(&w),
        Some(&to_f64(&b)),
        m,
        kk,
        nn,
        Activation::Selu,
    );
    assert_close(
        &get(&y),
        &expected,
        TOL,
        &format!("dense {m}x{kk}x{nn} {what}"),
    );
}

#[test]
fn register_blocked_matmuls_cover_ragged_edges() {
    // n and k multiples of 4 take the vec4 kernels (matmul_16x8 on software adapters, whose
    // workgroups cover 128 × 64 outputs; matmul_v4 elsewhere, 64 × 64), other shapes and the
    // transposed products matmul_tall (128 × 64) or matmul (64 × 64): shapes below, at and past
    // those tiles, with bias and an activation.
    let _g = serial();
    for dev in &env().devices {
        let _s = dev.scope();
        for (i, &(m, kk, nn)) in [
            (1, 4, 4),
            (13, 8, 12),
            (130, 36, 68),
            (257, 4, 132),
            (128, 64, 64),
        ]
        .iter()
        .enumerate()
        {
            check_dense(dev, (m, kk, nn), 900 + 10 * i as u64, true, &label(dev));
        }
        matmul_every_transpose(dev, (130, 37, 70), 950);
    }
}

#[test]
fn separable_pointwise_and_dense() {
    let _g = serial();
    for dev in &env().devices {
        let _s = dev.scope();
        let what = label(dev);
        // Pointwise: [3, 7, 7, 32] · [1, 1, 32, 64] + bias, relu.
        let s = Conv2dShape {
            n: 3,
            h: 7,
            w: 7,
            c_in: 32,
            c_out: 64,
            kh: 1,
            kw: 1,
            padding: Padding::Valid,
            strides: [1, 1],
            dilation: [1, 1],
        };
        let x = random_vec(s.input_len(), 501);
        let k = random_vec(s.kernel_len(), 502);
        let b = random_vec(64, 503);
        let xt = put(dev, &x, &[3, 7, 7, 32]);
        let kt = put(dev, &k, &[1, 1, 32, 64]);
        let bt = put(dev, &b, &[64]);
        trap(dev, &[s.output_len()]);
        let y = ops::pointwise_conv2d(&xt, &kt, Some(&bt), Activation::Relu).unwrap();
        on(&y, dev);
        assert_eq!(y.shape(), [3, 7, 7, 64]);
        let expected = r::conv2d_forward(
            &to_f64(&x),
            &to_f64(&k),
            Some(&to_f64(&b)),
            &s,
            Activation::Relu,
        );
        assert_close(&get(&y), &expected, TOL, &format!("pointwise {what}"));

        // Dense 1152 → 128 (the tutorial's), selu, batch 3.
        let (m, kk, nn) = (3, 1152, 128);
        let a = scaled(m * kk, 504, 0.1);
        let wv = random_vec(kk * nn, 505);
        let bv = random_vec(nn, 506);
        let (at, wt, bt) = (
            put(dev, &a, &[m, kk]),
            put(dev, &wv, &[kk, nn]),
            put(dev, &bv, &[nn]),
        );
        for (t, act) in ACTS.into_iter().enumerate() {
            let bias = (t != 1).then_some(&bt);
            trap(dev, &[m * nn]);
            let y = ops::dense(&at, &wt, bias, act).unwrap();
            on(&y, dev);
            let b64 = bias.map(|_| to_f64(&bv));
            let expected =
                r::matmul_bias_act(&to_f64(&a), &to_f64(&wv), b64.as_deref(), m, kk, nn, act);
            assert_close(&get(&y), &expected, TOL, &format!("dense {act:?} {what}"));
        }

        // The gradient products, every transpose combination.
        matmul_every_transpose(dev, (7, 13, 3), 507);
    }
}

#[test]
fn max_pool_activation_and_bias_gradients_in_one_op() {
    check_max_pool_activation_bias_grad(&env().devices);
}

fn check_max_pool_activation_bias_grad(devices: &[LogicalDevice]) {
    // FusedMaxPoolActivationBiasGrad against the max-pool's gradient, then the activation's
    // (through its output) and the column sums, in f64: whole and odd sizes (the dropped row
    // and column get 0), channels in vec4s and not (the unfused path), windows in one lane
    // and in many, lanes that do not divide the windows, and sizes with no window.
    let cases = [
        (2, 28, 28, 32),
        (3, 7, 7, 8),
        (1, 5, 6, 3),
        (1, 2, 2, 4),
        (2, 1, 3, 4),
        (130, 14, 14, 4),
        (3, 9, 11, 128),
    ];
    for dev in devices {
        let _s = dev.scope();
        for (t, &(n, h, w, c)) in cases.iter().enumerate() {
            let s = PoolShape { n, h, w, c };
            let (oh, ow) = s.out_hw();
            let act = ACTS[t % 3];
            let y = random_vec(s.input_len(), 850 + t as u64);
            let dp = random_vec(s.output_len(), 860 + t as u64);
            let what = format!("{} {s:?} {act:?}", label(dev));
            let (dz, db) = ops::max_pool2d_activation_bias_grad(
                &put(dev, &y, &[n, h, w, c]),
                &put(dev, &dp, &[n, oh, ow, c]),
                act,
            )
            .unwrap();
            on(&dz, dev);
            let y64 = to_f64(&y);
            let routed = r::maxpool_backward(&y64, &to_f64(&dp), &s);
            let expected = r::activation_backward(&routed, &y64, act);
            assert_close(&get(&dz), &expected, TOL, &format!("dz {what}"));
            let sums = r::bias_grad(&expected, c);
            assert_close(&get(&db), &sums, TOL, &format!("db {what}"));
        }
        // Ties go to the first maximum in window order, as the max-pool's own gradient.
        let y = [2.0, 1.0, 2.0, 3.0, 1.0, 3.0, 0.0, 0.0];
        let (dz, db) = ops::max_pool2d_activation_bias_grad(
            &put(dev, &y, &[1, 2, 2, 2]),
            &put(dev, &[10.0, 20.0], &[1, 1, 1, 2]),
            Activation::Relu,
        )
        .unwrap();
        let expected = [10.0, 0.0, 0.0, 20.0, 0.0, 0.0, 0.0, 0.0];
        assert_eq!(get(&dz), expected, "ties {}", label(dev));
        assert_eq!(get(&db), [10.0, 20.0], "ties {}", label(dev));
        assert!(
            ops::max_pool2d_activation_bias_grad(
                &put(dev, &y, &[1, 2, 2, 2]),
                &put(dev, &[1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2]),
                Activation::Relu,
            )
            .is_err(),
            "a gradient that is not the pooled shape"
        );
    }
}

#[test]
fn max_pool_forward_and_gradient() {
    let _g = serial();
    let cases = [
        (1, 1, 1, 1),
        (1, 2, 2, 1),
        (3, 7, 7, 3),
        (1, 13, 28, 32),
        (3, 28, 28, 32),
        (1, 3, 1, 3),
        (1, 1, 7, 3),
        (3, 28, 13, 1),
        (1, 7, 5, 8),
    ];
    for dev in &env().devices {
        let _s = dev.scope();
        for (t, &(n, h, w, c)) in cases.iter().enumerate() {
            let s = PoolShape { n, h, w, c };
            let (oh, ow) = s.out_hw();
            let x = random_vec(s.input_len(), 800 + t as u64);
            let dy = random_vec(s.output_len(), 810 + t as u64);
            let xt = put(dev, &x, &[n, h, w, c]);
            let dyt = put(dev, &dy, &[n, oh, ow, c]);
            let what = format!("{} {s:?}", label(dev));
            trap(dev, &[s.output_len()]);
            let y = ops::max_pool2d(&xt).unwrap();
            on(&y, dev);
            assert_eq!(y.shape(), [n, oh, ow, c]);
            let expected = r::maxpool_forward(&to_f64(&x), &s);
            assert_close(&get(&y), &expected, 0.0, &format!("maxpool {what}"));
            trap(dev, &[s.input_len()]);
            let dx = ops::max_pool2d_backward(&xt, &dyt).unwrap();
            on(&dx, dev);
            let expected = r::maxpool_backward(&to_f64(&x), &to_f64(&dy), &s);
            assert_close(&get(&dx), &expected, 0.0, &format!("maxpool dx {what}"));
        }
        // Ties go to the first maximum in row-major window order.
        #[rustfmt::skip]
        let x = [
            1.0, 0.0,  1.0, 0.0,   0.0, 1.0,  5.0, 2.0,
            1.0, 3.0,  1.0, 3.0,   4.0, 3.0,  5.0, 4.0,
        ];
        #[rustfmt::skip]
        let expected = [
            10.0, 0.0,  0.0, 0.0,   0.0, 0.0,  30.0, 0.0,
            0.0, 20.0,  0.0, 0.0,   0.0, 0.0,  0.0, 40.0,
        ];
        let dx = ops::max_pool2d_backward(
            &put(dev, &x, &[1, 2, 4, 2]),
            &put(dev, &[10.0, 20.0, 30.0, 40.0], &[1, 1, 2, 2]),
        )
        .unwrap();
        assert_eq!(get(&dx), expected, "maxpool ties {}", label(dev));
    }
}

#[test]
fn activations_forward_and_backward() {
    let _g = serial();
    for dev in &env().devices {
        let _s = dev.scope();
        // Lengths that are not a multiple of 4, a multiple of 4 but not of 16 (the vec4 kernel
        // covers 16 per invocation), and a large one.
        for (t, shape) in [vec![1], vec![3, 7], vec![5, 4], vec![3, 13, 28, 32]]
            .iter()
            .enumerate()
        {
            let len: usize = shape.iter().product();
            let x = scaled(len, 900 + t as u64, 3.0);
            let dy = random_vec(len, 950 + t as u64);
            let (xt, dyt) = (put(dev, &x, shape), put(dev, &dy, shape));
            for act in ACTS {
                let what = format!("{} {shape:?} {act:?}", label(dev));
                trap(dev, &[len]);
                let y = ops::activation(&xt, act).unwrap();
                on(&y, dev);
                let y64 = r::activation(&to_f64(&x), act);
                assert_close(&get(&y), &y64, TOL, &format!("activation {what}"));
                trap(dev, &[len]);
                let dz = ops::activation_backward(&dyt, &y, act).unwrap();
                on(&dz, dev);
                let expected = r::activation_backward(&to_f64(&dy), &to_f64(&get(&y)), act);
                assert_close(
                    &get(&dz),
                    &expected,
                    TOL,
                    &format!("activation grad {what}"),
                );
            }
        }
    }
}

#[test]
fn softmax_cross_entropy_and_accuracy() {
    let _g = serial();
    for dev in &env().devices {
        let _s = dev.scope();
        for (rows, cols) in [(1, 1), (3, 7), (13, 10), (128, 10), (3000, 13)] {
            let what = format!("{} [{rows}, {cols}]", label(dev));
            let logits = scaled(rows * cols, rows as u64, 8.0);
            let labels: Vec<i32> = (0..rows).map(|r| ((r * 7 + 3) % cols) as i32).collect();
            let l64 = to_f64(&logits);
            let lt = put(dev, &logits, &[rows, cols]);
            let labt = put_i32(dev, &labels, &[rows]);

            trap(dev, &[rows * cols]);
            let probs = ops::softmax(&lt).unwrap();
            on(&probs, dev);
            let expected = r::softmax(&l64, rows, cols);
            assert_close(&get(&probs), &expected, TOL, &format!("softmax {what}"));

            trap(dev, &[rows, rows * cols]);
            let (loss, grad) = ops::sparse_softmax_cross_entropy(&lt, &labt).unwrap();
            on(&loss, dev);
            on(&grad, dev);
            let (eloss, egrad) = r::softmax_cross_entropy(&l64, &labels, rows, cols);
            assert_close(&get(&loss), &eloss, TOL, &format!("xent loss {what}"));
            // The gradient is divided by rows: compare it scaled back up.
            let scaled_grad: Vec<f32> = get(&grad).iter().map(|g| g * rows as f32).collect();
            let escaled: Vec<f64> = egrad.iter().map(|g| g * rows as f64).collect();
            assert_close(&scaled_grad, &escaled, TOL, &format!("xent grad {what}"));

            trap(dev, &[1]);
            let hits = ops::accuracy_count(&lt, &labt).unwrap();
            on(&hits, dev);
            let expected = r::accuracy_count(&l64, &labels, rows, cols);
            assert_eq!(get(&hits), [expected as f32], "accuracy {what}");
        }

        // Logits of ±1e4 stay finite.
        let logits = [1e4f32, -1e4, 0.0, -1e4, 1e4, 1e4, 3e4, -3e4, 2e4];
        let labels = [1, 0, 2];
        let lt = put(dev, &logits, &[3, 3]);
        let (loss, grad) =
            ops::sparse_softmax_cross_entropy(&lt, &put_i32(dev, &labels, &[3])).unwrap();
        let (eloss, egrad) = r::softmax_cross_entropy(&to_f64(&logits), &labels, 3, 3);
        assert_close(&get(&loss), &eloss, 1e-6, "huge loss");
        assert_close(&get(&grad), &egrad, 1e-6, "huge grad");
        let probs = ops::softmax(&lt).unwrap();
        assert_close(
            &get(&probs),
            &r::softmax(&to_f64(&logits), 3, 3),
            1e-6,
            "huge probs",
        );

        // Accuracy takes the first maximum on ties; empty batches count 0.
        let lt = put(dev, &[1.0, 3.0, 3.0, 0.0, 0.0, 0.0], &[2, 3]);
        let count =
            |labels: &[i32]| get(&ops::accuracy_count(&lt, &put_i32(dev, labels, &[2])).unwrap());
        assert_eq!(count(&[1, 0]), [2.0]);
        assert_eq!(count(&[2, 1]), [0.0]);
        let empty =
            ops::accuracy_count(&put(dev, &[], &[0, 10]), &put_i32(dev, &[], &[0])).unwrap();
        assert_eq!(get(&empty), [0.0]);

        // Out-of-range labels: an error on the CPU, NaN rows on a GPU (as in TensorFlow).
        let lt = put(dev, &random_vec(9, 7), &[3, 3]);
        let bad = put_i32(dev, &[0, 3, -1], &[3]);
        match dev.device_type() {
            DeviceKind::Cpu => {
                let err = ops::sparse_softmax_cross_entropy(&lt, &bad).unwrap_err();
                assert!(
                    err.to_string()
                        .contains("outside the valid range of [0, 3)"),
                    "{err}"
                );
            }
            DeviceKind::Gpu => {
                let (loss, grad) = ops::sparse_softmax_cross_entropy(&lt, &bad).unwrap();
                let (loss, grad) = (get(&loss), get(&grad));
                assert!(loss[0].is_finite() && loss[1].is_nan() && loss[2].is_nan());
                assert!(grad[..3].iter().all(|g| g.is_finite()));
                assert!(grad[3..].iter().all(|g| g.is_nan()));
            }
        }
        assert_eq!(get(&ops::accuracy_count(&lt, &bad).unwrap()).len(), 1);
    }
}

#[test]
fn optimizer_steps() {
    let _g = serial();
    for dev in &env().devices {
        let _s = dev.scope();
        for len in [1, 3, 7, 13, 28, 100_003] {
            let what = format!("{} len {len}", label(dev));
            let w = random_vec(len, 1);
            let g = random_vec(len, 2);
            let v0 = random_vec(len, 3);
            let (w64, g64, v64) = (to_f64(&w), to_f64(&g), to_f64(&v0));
            let gt = put(dev, &g, &[len]);

            let p = SgdParams {
                lr: 0.01,
                momentum: 0.0,
                nesterov: false,
            };
            let wt = put(dev, &w, &[len]);
            ops::sgd_update(&wt, &gt, None, &p).unwrap();
            on(&wt, dev);
            assert_close(
                &get(&wt),
                &r::sgd(&w64, &g64, &p),
                1e-6,
                &format!("sgd {what}"),
            );

            for nesterov in [false, true] {
                let p = SgdParams {
                    lr: 0.01,
                    momentum: 0.9,
                    nesterov,
                };
                let (wt, vt) = (put(dev, &w, &[len]), put(dev, &v0, &[len]));
                ops::sgd_update(&wt, &gt, Some(&vt), &p).unwrap();
                let (ew, ev) = r::sgd_momentum(&w64, &g64, &v64, &p);
                assert_close(
                    &get(&wt),
                    &ew,
                    1e-6,
                    &format!("momentum w {nesterov} {what}"),
                );
                assert_close(
                    &get(&vt),
                    &ev,
                    1e-6,
                    &format!("momentum v {nesterov} {what}"),
                );
            }

            let m0 = scaled(len, 4, 0.1);
            let s0: Vec<f32> = random_vec(len, 5).iter().map(|v| 0.01 * v.abs()).collect();
            for step in [1, 2, 1000] {
                let p = AdamParams {
                    lr: 0.001,
                    beta1: 0.9,
                    beta2: 0.999,
                    epsilon: 1e-7,
                    step,
                };
                let wt = put(dev, &w, &[len]);
                let (mt, vt) = (put(dev, &m0, &[len]), put(dev, &s0, &[len]));
                ops::adam_update(&wt, &gt, &mt, &vt, &p).unwrap();
                let (ew, em, es) = r::adam(&w64, &g64, &to_f64(&m0), &to_f64(&s0), &p);
                assert_close(&get(&wt), &ew, 1e-6, &format!("adam w {step} {what}"));
                assert_close(&get(&mt), &em, 1e-6, &format!("adam m {step} {what}"));
                assert_close(&get(&vt), &es, 1e-6, &format!("adam v {step} {what}"));
            }
        }
    }
}

#[test]
fn optimizer_updates_stay_on_the_variables_device() {
    let _g = serial();
    let e = env();
    let cpu = e.rt.cpu().unwrap();
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let sink = Arc::clone(&seen);
    e.rt.set_placement_callback(Some(move |rec: &anygpu::PlacementRecord| {
        sink.lock()
            .unwrap()
            .push((rec.op.to_string(), rec.device.clone()));
    }));
    e.rt.set_log_device_placement(true);
    for dev in &e.devices {
        let w = random_vec(37, 11);
        let g = random_vec(37, 12);
        let wt = put(dev, &w, &[37]);
        // The gradient on the CPU and a scope that says CPU: the update still runs where the
        // variable is, and writes the variable itself.
        let gt = put(&cpu, &g, &[37]);
        let other = e
            .devices
            .iter()
            .find(|d| !d.same_device(dev))
            .unwrap_or(dev);
        let _s = other.scope();
        seen.lock().unwrap().clear();
        let p = SgdParams {
            lr: 0.5,
            momentum: 0.0,
            nesterov: false,
        };
        ops::sgd_update(&wt, &gt, None, &p).unwrap();
        on(&wt, dev);
        assert_close(
            &get(&wt),
            &r::sgd(&to_f64(&w), &to_f64(&g), &p),
            1e-6,
            "cross-device sgd",
        );
        let log = seen.lock().unwrap().clone();
        assert!(
            log.contains(&(
                "ResourceApplyGradientDescent".to_string(),
                dev.full_name().to_string()
            )),
            "{log:?}"
        );
        // Slots must live with the variable.
        let m = put(other, &[0.0; 37], &[37]);
        let v = put(dev, &[0.0; 37], &[37]);
        let adam = AdamParams {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-7,
            step: 1,
        };
        if !other.same_device(dev) {
            assert!(ops::adam_update(&wt, &gt, &m, &v, &adam).is_err());
        }
    }
    e.rt.set_log_device_placement(false);
    e.rt.set_placement_callback(None::<fn(&anygpu::PlacementRecord)>);
}

#[test]
fn bad_arguments_are_errors() {
    let _g = serial();
    for dev in &env().devices {
        let _s = dev.scope();
        let x = put(dev, &random_vec(2 * 5 * 5 * 3, 1), &[2, 5, 5, 3]);
        let k = put(dev, &random_vec(3 * 3 * 4 * 8, 2), &[3, 3, 4, 8]);
        let shape_error = |e: Error, lhs: &[usize], rhs: &[usize]| match e {
            Error::ShapeMismatch { lhs: l, rhs: r, .. } => {
                assert_eq!((l.as_slice(), r.as_slice()), (lhs, rhs));
            }
            other => panic!("expected a shape mismatch, got {other}"),
        };
        let err = ops::conv2d(&x, &k, None, Padding::Same, Activation::Linear).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("[2, 5, 5, 3]") && text.contains("[3, 3, 4, 8]"),
            "{text}"
        );
        shape_error(err, &[2, 5, 5, 3], &[3, 3, 4, 8]);
        let k3 = put(dev, &random_vec(3 * 3 * 3 * 8, 2), &[3, 3, 3, 8]);
        let bad_bias = put(dev, &[1.0; 7], &[7]);
        assert!(ops::conv2d(&x, &k3, Some(&bad_bias), Padding::Same, Activation::Relu).is_err());
        let dz = put(dev, &random_vec(2 * 5 * 5 * 8, 3), &[2, 5, 5, 8]);
        assert!(ops::conv2d_backward_input(&dz, &k3, &[2, 5, 5, 3], Padding::Valid).is_err());
        assert!(ops::conv2d_backward_kernel(&x, &dz, &[3, 3, 3, 7], Padding::Same).is_err());
        let weights = ops::conv2d_backward_weights(
            &x,
            &dz,
            &x,
            &[3, 3, 3, 8],
            Padding::Same,
            Activation::Relu,
        );
        assert!(weights
            .unwrap_err()
            .to_string()
            .contains("forward output's shape"));
        let no_channels = put(dev, &[], &[2, 5, 5, 0]);
        let k0 = put(dev, &[], &[3, 3, 0, 8]);
        assert!(ops::conv2d(&no_channels, &k0, None, Padding::Same, Activation::Linear).is_err());
        let dw = put(dev, &random_vec(9 * 3 * 2, 4), &[3, 3, 3, 2]);
        shape_error(
            ops::depthwise_conv2d(&x, &dw).unwrap_err(),
            &[2, 5, 5, 3],
            &[3, 3, 3, 2],
        );
        // Separable: a pointwise kernel for 4 channels on a 3-channel input; a wrong bias; a
        // dy of the wrong shape.
        let dk = put(dev, &random_vec(9 * 3, 4), &[3, 3, 3, 1]);
        let pk4 = put(dev, &random_vec(4 * 8, 4), &[1, 1, 4, 8]);
        shape_error(
            ops::separable_conv2d(&x, &dk, &pk4, None, Activation::Relu).unwrap_err(),
            &[2, 5, 5, 3],
            &[1, 1, 4, 8],
        );
        let pk = put(dev, &random_vec(3 * 8, 4), &[1, 1, 3, 8]);
        assert!(ops::separable_conv2d(&x, &dk, &pk, Some(&bad_bias), Activation::Relu).is_err());
        let no_channels_dk = put(dev, &[], &[3, 3, 0, 1]);
        let no_channels_pk = put(dev, &[], &[1, 1, 0, 8]);
        let err = ops::separable_conv2d(
            &no_channels,
            &no_channels_dk,
            &no_channels_pk,
            None,
            Activation::Relu,
        );
        assert!(err.unwrap_err().to_string().contains("no channels"));
        let y = ops::separable_conv2d(&x, &dk, &pk, None, Activation::Relu).unwrap();
        assert!(
            ops::separable_conv2d_backward(&x, &dk, &pk, &y, &x, Activation::Relu, true).is_err()
        );
        let flat = put(dev, &random_vec(6, 5), &[6]);
        assert!(ops::max_pool2d(&flat).is_err());
        assert!(ops::max_pool2d_backward(&x, &x).is_err());
        // dtypes
        let ints = put_i32(dev, &[1, 2, 3, 4], &[1, 2, 2, 1]);
        assert!(matches!(ops::max_pool2d(&ints), Err(Error::DType { .. })));
        let logits = put(dev, &random_vec(6, 6), &[2, 3]);
        let float_labels = put(dev, &[0.0, 1.0], &[2]);
        assert!(matches!(
            ops::sparse_softmax_cross_entropy(&logits, &float_labels),
            Err(Error::DType { .. })
        ));
        let short_labels = put_i32(dev, &[0], &[1]);
        shape_error(
            ops::accuracy_count(&logits, &short_labels).unwrap_err(),
            &[2, 3],
            &[1],
        );
        // optimizers
        let w = put(dev, &[1.0; 4], &[4]);
        let g = put(dev, &[1.0; 5], &[5]);
        let p = SgdParams {
            lr: 0.1,
            momentum: 0.9,
            nesterov: false,
        };
        assert!(ops::sgd_update(&w, &g, None, &p).is_err());
        let g4 = put(dev, &[1.0; 4], &[4]);
        assert!(matches!(
            ops::sgd_update(&w, &g4, None, &p),
            Err(Error::InvalidArgument(_))
        ));
        assert!(ops::sgd_update(&w, &w, Some(&g4), &p).is_err());
        let adam = AdamParams {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-7,
            step: 0,
        };
        let (m, v) = (put(dev, &[0.0; 4], &[4]), put(dev, &[0.0; 4], &[4]));
        assert!(ops::adam_update(&w, &g4, &m, &v, &adam).is_err());
        assert_eq!(
            get(&w),
            [1.0; 4],
            "a rejected update leaves the variable alone"
        );
    }
}

/// A runtime whose every tuned op uses `candidate` where it has one
/// (`ANYGPU_AUTOTUNE_FORCE`), and its GPUs.
fn forced(candidate: &str) -> (Runtime, Vec<LogicalDevice>) {
    let rt = builder()
        .env("ANYGPU_AUTOTUNE_FORCE", Some(candidate))
        .build()
        .expect("runtime");
    let gpus = common::available(
        rt.list_logical_devices(KindFilter::Kind(DeviceKind::Gpu))
            .unwrap(),
    );
    require_gpu(&gpus);
    (rt, gpus)
}

/// Every kernel the autotuner can pick, forced in turn (`ANYGPU_AUTOTUNE_FORCE`), against the
/// oracle on every GPU: products on the vec4 kernels (one of them long enough in k and small
/// enough in output tiles to split k), on the general ones (transposes, ragged n), column sums
/// narrow and wide, with and without vec4 columns, 1×1 convolutions directly and as products,
/// and kernel gradients in few or many partial sums.
#[test]
fn every_tuning_candidate_matches_the_reference() {
    let _g = serial();
    for candidate in common::TUNING_CANDIDATES {
        let (_rt, gpus) = forced(candidate);
        for dev in &gpus {
            let _s = dev.scope();
            // (300, 64, 24): two chunks of k and three column blocks for ubo8.
            for (i, &(m, kk, nn)) in [(128, 1152, 128), (70, 516, 36), (13, 8, 12), (300, 64, 24)]
                .iter()
                .enumerate()
            {
                let what = format!("[{candidate}] {}", label(dev));
                check_dense(dev, (m, kk, nn), 7000 + 10 * i as u64, false, &what);
            }
            matmul_every_transpose(dev, (66, 9, 30), 7100);
            // Long enough in k to split on the scalar kernels.
            matmul_every_transpose(dev, (70, 300, 33), 7150);
            // (400, 64) and (8192, 128): sum_rows_wg's first and second pass add their last
            // few chunks themselves.
            let sums = [
                (5000, 32),
                (300, 1152),
                (77, 12),
                (64, 7),
                (1, 8),
                (400, 64),
                (8192, 128),
            ];
            for (i, &(rows, cols)) in sums.iter().enumerate() {
                let x = random_vec(rows * cols, 7200 + i as u64);
                let db = ops::bias_grad(&put(dev, &x, &[rows, cols])).unwrap();
                let what = format!("column sums {rows}x{cols} [{candidate}] {}", label(dev));
                assert_close(&get(&db), &r::bias_grad(&to_f64(&x), cols), TOL, &what);
            }
        }
        if candidate.starts_with("chunks")
            || matches!(
                candidate,
                "direct"
                    | "product"
                    | "rows4x4"
                    | "tile8x8"
                    | "smem64"
                    | "ubo_c1"
                    | "co8"
                    | "co16"
                    | "fused"
                    | "separate"
            )
        {
            check_conv2d(&gpus);
            check_depthwise(&gpus);
            check_max_pool_activation_bias_grad(&gpus);
            check_activation_bias_grad(&gpus);
        }
    }
}

#[test]
fn sums_longer_than_a_software_adapters_loop_limit_are_whole() {
    // Mesa's software adapters silently stop a shader loop after ~65,000 iterations, and a
    // dispatch may have at most 65,535 workgroups per dimension: a sum of 2^24 + 5 elements
    // (one workgroup looping over all of it: 65,536 iterations per invocation) and column sums
    // over as many rows (65,537 chunks of 256 rows) went past both and came back 0 or failed.
    let _g = serial();
    let n = (1 << 24) + 5;
    let x = random_vec(n, 1201);
    let total: f64 = x.iter().map(|&v| f64::from(v)).sum();
    // Rounding grows with the terms' magnitudes, not with their (cancelling) sum.
    let scale: f64 = x.iter().map(|&v| f64::from(v).abs()).sum();
    for dev in &env().devices {
        let t = put(dev, &x, &[n]);
        let what = label(dev);
        let sum = t.reduce_sum(None).unwrap().to_vec::<f32>().unwrap()[0];
        let cols = t.reshape(&[n, 1]).unwrap().reduce_sum(Some(0)).unwrap();
        let cols = cols.to_vec::<f32>().unwrap()[0];
        for (got, how) in [(sum, "reduce_sum(None)"), (cols, "reduce_sum(Some(0))")] {
            assert!(
                (f64::from(got) - total).abs() <= 1e-6 * scale,
                "{what}: {how} of {n} elements is {got}, the f64 sum {total}"
            );
        }
    }
}

#[test]
fn products_with_more_row_tiles_than_a_grid_dimension_are_whole() {
    // 65,535 workgroups per grid dimension: 64-row tiles stop at 4,194,240 rows (a 1×1
    // convolution of a batch of 128 at 184×184), 128-row tiles at twice that. A 64-row and a
    // 128-row vec4 kernel and a scalar one (all tiled kernels fold rows alike, `row_tile`),
    // forced in turn, each over one row more than its tiles can cover in one dimension (k = n =
    // 4 for the vec4 kernels: just under lavapipe's 128 MiB binding; k = n = 3 for the scalar
    // one); every 1,021st row against the f64 reference.
    let _g = serial();
    let most = 128 * 65_535 + 1;
    let x = random_vec(most * 4, 7400);
    let w = random_vec(16, 7401);
    for (candidate, tile_rows, kn) in [
        ("tile64_v4", 64, 4),
        ("tall_16x8", 128, 4),
        ("tall", 128, 3),
    ] {
        let (_rt, gpus) = forced(candidate);
        let m = tile_rows * 65_535 + 1;
        let (x, w) = (&x[..m * kn], &w[..kn * kn]);
        for dev in &gpus {
            let y = put(dev, x, &[m, kn]).matmul(&put(dev, w, &[kn, kn]));
            let y = get(&y.unwrap());
            let what = format!("[{candidate}] {}", label(dev));
            for row in (0..m).step_by(1021).chain([m - 1]) {
                for c in 0..kn {
                    let want: f64 = (0..kn)
                        .map(|l| f64::from(x[row * kn + l]) * f64::from(w[l * kn + c]))
                        .sum();
                    let got = f64::from(y[row * kn + c]);
                    assert!(
                        (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "{what}: row {row} column {c}: {got}, want {want}"
                    );
                }
            }
        }
    }
}
