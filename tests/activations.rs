//! The activations with their own kernel and the average/global pooling layers: every kernel
//! on every device (`CPU:0` and each GPU adapter: lavapipe and llvmpipe here) against the f64
//! oracle of `anygpu::ops::reference`, forward and backward, over wide ranges and the edge
//! values (±30, ±1e-7, 0, the kinks); their float16 twins; and the layers training in a
//! `Sequential` on every device and under a `MirroredStrategy`.
//!
//! TensorFlow's own numbers for the same layers are in `tests/golden/activations.rs` and
//! `tests/golden/pooling.rs`.

mod common;

use std::sync::{Mutex, MutexGuard, OnceLock};

use anygpu::data::Dataset;
use anygpu::distribute::MirroredStrategy;
use anygpu::nn::{
    Activation, ActivationLayer, Adam, AveragePooling2D, Conv2D, Dense, GlobalAveragePooling2D,
    GlobalMaxPooling2D, Layer, Loss, Metric, ReLU, SeparableConv2D, Sequential, Verbosity,
};
use anygpu::ops;
use anygpu::ops::reference::{self as r, assert_close, random_vec, to_f64};
use anygpu::ops::spec::{ActivationFn, Padding, Pool2dShape, PoolShape};
use anygpu::{DType, DeviceKind, KindFilter, LogicalDevice, Runtime, Tensor};
use half::f16;

/// Relative to max(1, |expected|): a few float32 ulps of the larger values, and for the
/// erfc-based gelu the 1.2e-7 of its Chebyshev fit.
const TOL: f64 = 2e-6;

/// Every activation with its own kernel, the relu family with each of Keras' cases.
fn all_fns() -> Vec<ActivationFn> {
    let relu = |negative_slope, max_value, threshold| ActivationFn::Relu {
        negative_slope,
        max_value,
        threshold,
    };
    vec![
        ActivationFn::Linear,
        ActivationFn::RELU,
        ActivationFn::RELU6,
        ActivationFn::leaky_relu(0.2),
        relu(0.0, Some(5.0), 0.0),
        relu(0.5, Some(5.0), 0.0),
        relu(0.0, None, 1.5),
        relu(0.3, None, 1.5),
        relu(0.0, Some(6.0), 1.0),
        ActivationFn::Elu,
        ActivationFn::Selu,
        ActivationFn::Gelu { approximate: false },
        ActivationFn::Gelu { approximate: true },
        ActivationFn::Sigmoid,
        ActivationFn::Tanh,
        ActivationFn::Swish,
        ActivationFn::Softplus,
    ]
}

struct Env {
    devices: Vec<LogicalDevice>,
    _rt: Runtime,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let rt = common::builder()
            .memory_growth(true)
            .build()
            .expect("the runtime initializes");
        let devices = common::available(
            rt.list_logical_devices(KindFilter::All)
                .expect("devices are listed"),
        );
        let gpus = devices
            .iter()
            .filter(|d| d.device_type() == DeviceKind::Gpu)
            .count();
        assert!(
            gpus > 0 || !common::adapter_required(),
            "ANYGPU_REQUIRE_ADAPTER=1 but no GPU adapter was found"
        );
        Env { devices, _rt: rt }
    })
}

/// One test at a time (the models share the device arenas; a failure names one test).
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn put(dev: &LogicalDevice, data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice_on(data, shape, dev).expect("upload")
}

fn get(t: &Tensor, dev: &LogicalDevice) -> Vec<f32> {
    assert_eq!(t.device(), dev.full_name(), "the op left {}", dev.name());
    t.to_vec::<f32>().expect("readback")
}

fn label(dev: &LogicalDevice) -> String {
    format!("{} ({})", dev.name(), dev.adapter_name())
}

/// Inputs over [-30, 30], the kinks and the edges: 0, ±1e-7, ±1e-3, the relu thresholds,
/// 5 and 6 exactly, ±30, ±80, and random values.
fn inputs() -> Vec<f32> {
    let mut x: Vec<f32> = (0..=600).map(|i| -30.0 + i as f32 * 0.1).collect();
    x.extend([
        0.0, 1e-7, -1e-7, 1e-3, -1e-3, 1.5, 1.0, 5.0, 6.0, -6.0, 30.0, -30.0, 80.0, -80.0, 1e-30,
    ]);
    x.extend(random_vec(257, 3).iter().map(|v| v * 8.0));
    x
}

#[test]
fn activation_fns_match_the_oracle_on_every_device() {
    let _g = serial();
    let x = inputs();
    let dy = random_vec(x.len(), 9);
    for dev in &env().devices {
        let xt = put(dev, &x, &[x.len()]);
        let dyt = put(dev, &dy, &[x.len()]);
        for f in all_fns() {
            let what = format!("{f:?} on {}", label(dev));
            let want = r::activation_fn(&to_f64(&x), f);
            let y = ops::activation_fn(&xt, f).expect("forward");
            assert_close(&get(&y, dev), &want, TOL, &format!("{what}: forward"));
            let dwant = r::activation_fn_backward(&to_f64(&dy), &to_f64(&x), f);
            let dz = ops::activation_fn_backward(&dyt, &xt, f, false).expect("backward");
            assert_close(&get(&dz, dev), &dwant, TOL, &format!("{what}: dx from x"));
            if f.grad_from_output() {
                let dz = ops::activation_fn_backward(&dyt, &y, f, true).expect("backward");
                // From the float32 output: sigmoid's y(1 - y) near y = 1 and softplus'
                // 1 - e^-y carry y's rounding, a float32 ulp of values up to 30.
                assert_close(&get(&dz, dev), &dwant, 4e-6, &format!("{what}: dx from y"));
            }
        }
    }
}

/// Relative accuracy where the values are tiny: gelu's left tail (x Φ(x) down to 1e-30),
/// sigmoid, softplus and swish far left, and everything near 0.
#[test]
fn activation_tails_are_accurate_relative_to_their_size() {
    let _g = serial();
    let mut x: Vec<f32> = (0..=240).map(|i| -12.0 + i as f32 * 0.1).collect();
    x.extend((1..=20).map(|k| 10f32.powi(-k)));
    x.extend((1..=20).map(|k| -(10f32.powi(-k))));
    let fns = [
        ActivationFn::Gelu { approximate: false },
        ActivationFn::Gelu { approximate: true },
        ActivationFn::Sigmoid,
        ActivationFn::Tanh,
        ActivationFn::Swish,
        ActivationFn::Softplus,
        ActivationFn::Elu,
    ];
    for dev in &env().devices {
        let xt = put(dev, &x, &[x.len()]);
        let ones = put(dev, &vec![1.0; x.len()], &[x.len()]);
        for f in fns {
            let y = get(&ops::activation_fn(&xt, f).expect("forward"), dev);
            let g = get(
                &ops::activation_fn_backward(&ones, &xt, f, false).expect("backward"),
                dev,
            );
            for (i, &v) in x.iter().enumerate() {
                for (what, got, want) in [
                    ("f", y[i], r::act_fn(f64::from(v), f)),
                    ("f'", g[i], r::act_fn_grad(f64::from(v), f)),
                ] {
                    // Below float32's normal range a GPU may flush to zero.
                    if want.abs() < 1e-36 {
                        continue;
                    }
                    let rel = (f64::from(got) - want).abs() / want.abs();
                    assert!(
                        rel < 2e-5,
                        "{f:?} {what}({v:e}) on {}: {got:e} vs {want:e} (relative error {rel:e})",
                        label(dev)
                    );
                }
            }
        }
    }
}

#[test]
fn activation_fns_are_exact_at_the_kinks_as_tensorflow() {
    let _g = serial();
    // TF: ReluGrad(0) = 0, Relu6Grad(6) = 0, LeakyReluGrad(0) = slope, clip_by_value passes its
    // bound (max_value=5 at 5: 1), threshold: 0 at the threshold.
    let cases: [(ActivationFn, [f32; 5], [f32; 5]); 5] = [
        (
            ActivationFn::RELU,
            [-1.0, 0.0, 5.0, 6.0, 7.0],
            [0.0, 0.0, 1.0, 1.0, 1.0],
        ),
        (
            ActivationFn::RELU6,
            [-1.0, 0.0, 5.0, 6.0, 7.0],
            [0.0, 0.0, 1.0, 0.0, 0.0],
        ),
        (
            ActivationFn::leaky_relu(0.5),
            [-1.0, 0.0, 5.0, 6.0, 7.0],
            [0.5, 0.5, 1.0, 1.0, 1.0],
        ),
        (
            ActivationFn::Relu {
                negative_slope: 0.5,
                max_value: Some(5.0),
                threshold: 0.0,
            },
            [-1.0, 0.0, 5.0, 6.0, 7.0],
            [0.5, 0.0, 1.0, 0.0, 0.0],
        ),
        (
            ActivationFn::Relu {
                negative_slope: 0.5,
                max_value: None,
                threshold: 5.0,
            },
            [-1.0, 0.0, 5.0, 6.0, 7.0],
            [0.5, 0.5, 0.0, 1.0, 1.0],
        ),
    ];
    for dev in &env().devices {
        for (f, x, want) in cases {
            let xt = put(dev, &x, &[5]);
            let ones = put(dev, &[1.0; 5], &[5]);
            let g = ops::activation_fn_backward(&ones, &xt, f, false).expect("backward");
            assert_eq!(get(&g, dev), want, "{f:?} on {}", label(dev));
            if f.grad_from_output() {
                let y = ops::activation_fn(&xt, f).expect("forward");
                let g = ops::activation_fn_backward(&ones, &y, f, true).expect("backward");
                assert_eq!(get(&g, dev), want, "{f:?} from y on {}", label(dev));
            }
        }
    }
}

#[test]
fn gradient_from_the_output_is_refused_where_it_is_ambiguous() {
    let x = Tensor::from_vec(vec![1.0f32], &[1]).expect("tensor");
    let err = ops::activation_fn_backward(&x, &x, ActivationFn::Swish, true)
        .expect_err("swish is not monotonic");
    assert!(err.to_string().contains("SiluGrad"), "{err}");
}

/// `(n, h, w, c, pool, strides, padding)`.
type PoolCase = (
    usize,
    usize,
    usize,
    usize,
    (usize, usize),
    (usize, usize),
    Padding,
);

const POOL_CASES: [PoolCase; 9] = [
    (1, 4, 4, 1, (2, 2), (2, 2), Padding::Valid),
    (2, 7, 7, 3, (2, 2), (2, 2), Padding::Valid),
    (2, 7, 7, 3, (2, 2), (2, 2), Padding::Same),
    (1, 7, 5, 4, (3, 3), (2, 2), Padding::Same),
    (1, 7, 5, 4, (3, 2), (1, 2), Padding::Valid),
    (3, 6, 6, 5, (3, 3), (1, 1), Padding::Same),
    (1, 5, 5, 2, (5, 5), (1, 1), Padding::Same),
    (1, 3, 3, 1, (4, 4), (1, 1), Padding::Valid),
    (2, 9, 8, 32, (2, 3), (3, 2), Padding::Same),
];

/// [`POOL_CASES`] as shapes, each with its index for a seed.
fn pool_shapes() -> impl Iterator<Item = (u64, Pool2dShape)> {
    POOL_CASES.iter().zip(0..).map(|(&case, seed)| {
        let (n, h, w, c, pool, strides, padding) = case;
        let s = Pool2dShape {
            n,
            h,
            w,
            c,
            pool,
            strides,
            padding,
        };
        (seed, s)
    })
}

#[test]
fn avg_pool2d_matches_the_oracle_on_every_device() {
    let _g = serial();
    for dev in &env().devices {
        for (seed, s) in pool_shapes() {
            let Pool2dShape {
                n,
                h,
                w,
                c,
                pool,
                strides,
                padding,
            } = s;
            let what = format!("avg_pool2d {s:?} on {}", label(dev));
            let x = random_vec(s.input_len(), seed);
            let xt = put(dev, &x, &[n, h, w, c]);
            let y = ops::avg_pool2d(&xt, pool, strides, padding).expect("forward");
            let (oh, ow) = s.out_hw();
            assert_eq!(y.shape(), [n, oh, ow, c], "{what}");
            assert_close(&get(&y, dev), &r::avg_pool2d(&to_f64(&x), &s), 1e-6, &what);
            let dy = random_vec(s.output_len(), seed + 50);
            let dyt = put(dev, &dy, &[n, oh, ow, c]);
            let dx = ops::avg_pool2d_backward(&dyt, &[n, h, w, c], pool, strides, padding)
                .expect("backward");
            assert_close(
                &get(&dx, dev),
                &r::avg_pool2d_backward(&to_f64(&dy), &s),
                1e-6,
                &format!("{what}: dx"),
            );
        }
    }
}

#[test]
fn max_pool2d_window_matches_the_oracle_on_every_device() {
    let _g = serial();
    for dev in &env().devices {
        for (seed, s) in pool_shapes() {
            let Pool2dShape {
                n,
                h,
                w,
                c,
                pool,
                strides,
                padding,
            } = s;
            let what = format!("max_pool2d_window {s:?} on {}", label(dev));
            // Values on a coarse grid: windows hold ties, and the gradient must go to the
            // first maximum of each, as TensorFlow's MaxPoolGrad does.
            let x: Vec<f32> = random_vec(s.input_len(), seed + 100)
                .iter()
                .map(|v| (v * 4.0).round())
                .collect();
            let xt = put(dev, &x, &[n, h, w, c]);
            let y = ops::max_pool2d_window(&xt, pool, strides, padding).expect("forward");
            let (oh, ow) = s.out_hw();
            assert_eq!(y.shape(), [n, oh, ow, c], "{what}");
            assert_close(
                &get(&y, dev),
                &r::max_pool2d_window(&to_f64(&x), &s),
                0.0,
                &what,
            );
            let dy = random_vec(s.output_len(), seed + 150);
            let dyt = put(dev, &dy, &[n, oh, ow, c]);
            let dx = ops::max_pool2d_window_backward(&xt, &dyt, pool, strides, padding)
                .expect("backward");
            assert_close(
                &get(&dx, dev),
                &r::max_pool2d_window_backward(&to_f64(&x), &to_f64(&dy), &s),
                1e-6,
                &format!("{what}: dx"),
            );
        }
    }
}

#[test]
fn global_pools_match_the_oracle_on_every_device() {
    let _g = serial();
    for dev in &env().devices {
        for (seed, (n, h, w, c)) in [(1, 1, 1, 1), (2, 7, 7, 3), (3, 5, 4, 32), (1, 28, 28, 8)]
            .into_iter()
            .enumerate()
        {
            let s = PoolShape { n, h, w, c };
            let mut x = random_vec(s.input_len(), seed as u64);
            // A tie for the maximum: TF shares the gradient between them.
            if h * w > 1 {
                x[c] = 5.0;
                x[0] = 5.0;
            }
            let xt = put(dev, &x, &[n, h, w, c]);
            let dy = random_vec(n * c, seed as u64 + 7);
            let dyt = put(dev, &dy, &[n, c]);
            let (x64, dy64) = (to_f64(&x), to_f64(&dy));
            for max in [false, true] {
                let what = format!("global pool (max {max}) {s:?} on {}", label(dev));
                let y = ops::global_pool2d(&xt, max).expect("forward");
                let want = if max {
                    r::global_max_pool(&x64, n, h * w, c)
                } else {
                    r::global_avg_pool(&x64, n, h * w, c)
                };
                assert_close(&get(&y, dev), &want, 1e-6, &what);
                let dx = ops::global_pool2d_backward(&xt, &dyt, max).expect("backward");
                let dwant = if max {
                    r::global_max_pool_backward(&x64, &dy64, n, h * w, c)
                } else {
                    r::global_avg_pool_backward(&dy64, n, h * w, c)
                };
                assert_close(&get(&dx, dev), &dwant, 1e-6, &format!("{what}: dx"));
            }
        }
    }
}

/// The float16 twins (activation.wgsl, pooling.wgsl) on the adapters with float16: float16
/// inputs and outputs, float32 arithmetic, so each result is the oracle's rounded once.
#[test]
fn f16_activation_and_pooling_kernels_match_the_oracle() {
    let _g = serial();
    let gpus: Vec<&LogicalDevice> = env().devices.iter().filter(|d| d.has_f16()).collect();
    if gpus.is_empty() {
        assert!(
            !(common::adapter_required() && common::backends().contains("vulkan")),
            "ANYGPU_REQUIRE_ADAPTER=1 but no adapter with float16 (lavapipe has it)"
        );
        eprintln!("SKIPPED: no adapter with float16");
        return;
    }
    let half = |v: &[f32]| -> Vec<f16> { v.iter().map(|&v| f16::from_f32(v)).collect() };
    let quantized =
        |v: &[f32]| -> Vec<f32> { v.iter().map(|&v| f16::from_f32(v).to_f32()).collect() };
    let read = |t: &Tensor| -> Vec<f32> {
        assert_eq!(t.dtype(), DType::F16);
        t.to_vec::<f16>()
            .expect("readback")
            .into_iter()
            .map(f16::to_f32)
            .collect()
    };
    // Four float16 ulps at 1, relative to max(1, |expected|).
    let tol = 4.0 * 0.000_976_562_5;
    let x = quantized(
        &random_vec(1000, 5)
            .iter()
            .map(|v| v * 6.0)
            .collect::<Vec<_>>(),
    );
    let dy = quantized(&random_vec(1000, 6));
    for dev in gpus {
        let xt = Tensor::from_slice_on(&half(&x), &[1000], dev).expect("upload");
        let dyt = Tensor::from_slice_on(&half(&dy), &[1000], dev).expect("upload");
        for f in all_fns() {
            let what = format!("f16 {f:?} on {}", label(dev));
            let y = ops::activation_fn(&xt, f).expect("forward");
            assert_close(&read(&y), &r::activation_fn(&to_f64(&x), f), tol, &what);
            let dz = ops::activation_fn_backward(&dyt, &xt, f, false).expect("backward");
            let dwant = r::activation_fn_backward(&to_f64(&dy), &to_f64(&x), f);
            assert_close(&read(&dz), &dwant, tol, &format!("{what}: dx"));
        }
        let s = Pool2dShape {
            n: 2,
            h: 7,
            w: 6,
            c: 4,
            pool: (3, 3),
            strides: (2, 2),
            padding: Padding::Same,
        };
        let px = quantized(&random_vec(s.input_len(), 8));
        let pxt = Tensor::from_slice_on(&half(&px), &[2, 7, 6, 4], dev).expect("upload");
        let y = ops::avg_pool2d(&pxt, s.pool, s.strides, s.padding).expect("avg_pool2d");
        assert_close(
            &read(&y),
            &r::avg_pool2d(&to_f64(&px), &s),
            tol,
            "f16 avg_pool2d",
        );
        let m = ops::max_pool2d_window(&pxt, s.pool, s.strides, s.padding).expect("max pool");
        assert_close(
            &read(&m),
            &r::max_pool2d_window(&to_f64(&px), &s),
            tol,
            "f16 max_pool2d_window",
        );
        let g = ops::global_pool2d(&pxt, true).expect("global max");
        assert_close(
            &read(&g),
            &r::global_max_pool(&to_f64(&px), 2, 42, 4),
            tol,
            "f16 global max",
        );
        let g = ops::global_pool2d(&pxt, false).expect("global avg");
        assert_close(
            &read(&g),
            &r::global_avg_pool(&to_f64(&px), 2, 42, 4),
            tol,
            "f16 global avg",
        );
    }
}

#[test]
fn oracle_gradients_match_finite_differences() {
    for f in all_fns() {
        for x in [-7.3, -2.1, -0.4, 0.3, 1.7, 2.6, 5.5, 6.4, 9.0] {
            let h = 1e-6;
            let numeric = (r::act_fn(x + h, f) - r::act_fn(x - h, f)) / (2.0 * h);
            let analytic = r::act_fn_grad(x, f);
            assert!(
                (numeric - analytic).abs() < 1e-6 * analytic.abs().max(1.0),
                "{f:?}'({x}) = {analytic}, finite differences {numeric}"
            );
        }
    }
    // erfc against known values (Abramowitz & Stegun, table 7.1; erfc(5) from mpmath).
    for (z, want) in [
        (0.5, 0.479_500_122_186_953_5),
        (1.0, 0.157_299_207_050_285_13),
        (3.0, 2.209_049_699_858_544e-5),
        (5.0, 1.537_459_794_428_034_8e-12),
    ] {
        let got = r::erfc(z);
        assert!(
            (got - want).abs() < 1e-13 * want,
            "erfc({z}) = {got:e}, want {want:e}"
        );
    }
}

/// The layers' names, shapes and errors, as Keras gives them.
#[test]
fn layers_are_summarized_and_checked_as_in_keras() {
    let layers: Vec<(Box<dyn Layer>, &str, &str)> = vec![
        (
            Box::new(ActivationLayer::new(Activation::Elu)),
            "Activation",
            "activation",
        ),
        (Box::new(ReLU::new()), "ReLU", "re_lu"),
        (
            Box::new(AveragePooling2D::new((2, 2))),
            "AveragePooling2D",
            "average_pooling2d",
        ),
        (
            Box::new(GlobalAveragePooling2D::new()),
            "GlobalAveragePooling2D",
            "global_average_pooling2d",
        ),
        (
            Box::new(GlobalMaxPooling2D::new()),
            "GlobalMaxPooling2D",
            "global_max_pooling2d",
        ),
    ];
    for (layer, class, base) in layers {
        assert_eq!((layer.class_name(), layer.base_name()), (class, base));
        assert!(layer.weights().is_empty());
    }
    let err = ReLU::new()
        .max_value(-1.0)
        .compute_output_shape(&[3])
        .expect_err("negative max_value");
    assert!(err
        .to_string()
        .contains("max_value of a ReLU layer cannot be a negative value"));
    let err = "mish".parse::<Activation>().expect_err("unknown");
    assert!(err.to_string().contains("gelu"), "{err}");
    assert!(AveragePooling2D::new((3, 3))
        .compute_output_shape(&[2, 2, 1])
        .is_err());
    assert!(AveragePooling2D::new((0, 3))
        .compute_output_shape(&[4, 4, 1])
        .is_err());
}

/// A CNN with every new layer and activation kind: separate activations after Conv2D,
/// SeparableConv2D (before a 2×2 max-pool: the fused pool backward path steps aside) and
/// Dense, the activation layers, and each pooling layer.
fn new_layers_cnn(seed: u64) -> anygpu::Result<Sequential> {
    let mut m = Sequential::with_seed(seed);
    m.add(
        Conv2D::new(4, 3)
            .padding(Padding::Same)
            .activation(Activation::Gelu { approximate: false })
            .input_shape(&[8, 8, 1]),
    )?;
    m.add(ReLU::new().max_value(6.0).negative_slope(0.1))?;
    m.add(
        SeparableConv2D::new(6, 3)
            .padding(Padding::Same)
            .activation(Activation::Swish),
    )?;
    m.add(anygpu::nn::MaxPool2D::new())?;
    m.add(
        AveragePooling2D::new((2, 2))
            .strides((1, 1))
            .padding(Padding::Same),
    )?;
    m.add(ActivationLayer::new(Activation::Tanh))?;
    m.add(GlobalAveragePooling2D::new())?;
    m.add(Dense::new(12).activation(Activation::Softplus))?;
    m.add(Dense::new(3))?;
    m.add(ActivationLayer::new(Activation::Softmax))?;
    Ok(m)
}

fn new_layers_mlp_with_global_max(seed: u64) -> anygpu::Result<Sequential> {
    let mut m = Sequential::with_seed(seed);
    m.add(
        Conv2D::new(6, 3)
            .activation(Activation::Elu)
            .input_shape(&[8, 8, 1]),
    )?;
    m.add(GlobalMaxPooling2D::new())?;
    m.add(Dense::new(8).activation(Activation::LeakyRelu))?;
    m.add(Dense::new(8).activation(Activation::Sigmoid))?;
    m.add(Dense::new(8).activation(Activation::Relu6))?;
    m.add(Dense::new(3).activation(Activation::Softmax))?;
    Ok(m)
}

fn fit_losses(model: &mut Sequential, epochs: usize) -> Vec<f64> {
    let (x, y) = common::synthetic(48, 5);
    let data = Dataset::from_tensor_slices(x, &[8, 8, 1], y)
        .expect("data")
        .batch(16, false);
    model.set_verbose(Verbosity::Silent);
    model
        .compile(
            Loss::sparse_categorical_crossentropy(),
            Adam::new(0.02),
            &[Metric::Accuracy],
        )
        .expect("compile");
    model.fit(&data, epochs, None, None).expect("fit").loss
}

#[test]
fn models_with_the_new_layers_train_on_every_device() {
    let _g = serial();
    for dev in &env().devices {
        for (name, build) in [
            (
                "cnn",
                new_layers_cnn as fn(u64) -> anygpu::Result<Sequential>,
            ),
            ("global max", new_layers_mlp_with_global_max),
        ] {
            let mut model = {
                let _s = dev.scope();
                build(1).expect("the model builds")
            };
            let summary = model.summary();
            let losses = fit_losses(&mut model, 12);
            let (first, last) = (losses[0], losses[losses.len() - 1]);
            assert!(
                last.is_finite() && last < 0.8 * first,
                "{name} on {}: the loss went {first} -> {last}\n{summary}",
                label(dev)
            );
        }
    }
}

#[test]
fn new_layers_train_under_a_mirrored_strategy_like_one_device() {
    let _g = serial();
    let rt = common::builder()
        .virtual_cpus(2)
        .build()
        .expect("the runtime initializes");
    let cpus = rt.list_logical_devices("CPU").expect("cpus");
    let single_dev = cpus[0].clone();
    let mut single = {
        let _s = single_dev.scope();
        new_layers_cnn(4).expect("the model builds")
    };
    let strategy = MirroredStrategy::with_devices(&cpus).expect("a strategy");
    let mut mirrored = strategy
        .scope(|| new_layers_cnn(4))
        .expect("one strategy scope")
        .expect("the mirrored model builds");
    let a = fit_losses(&mut single, 3);
    let b = fit_losses(&mut mirrored, 3);
    for (e, (a, b)) in a.iter().zip(&b).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * a.abs().max(1.0),
            "epoch {e}: one device {a}, mirrored {b}"
        );
    }
    assert!(b[2] < b[0], "the mirrored loss did not fall: {b:?}");
}

/// Under `mixed_float16` the new layers compute in float16 on the adapters with float16 (the
/// twins of activation.wgsl and pooling.wgsl) and in float32 elsewhere, and still train.
#[test]
fn new_layers_train_under_mixed_float16_on_every_device() {
    use anygpu::mixed_precision::{self, Policy};
    let _g = serial();
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = mixed_precision::set_global_policy("float32");
        }
    }
    for dev in &env().devices {
        let mut model = {
            let _s = dev.scope();
            mixed_precision::set_global_policy(Policy::MIXED_FLOAT16).expect("a known policy");
            let _restore = Restore;
            new_layers_cnn(2).expect("the model builds")
        };
        let losses = fit_losses(&mut model, 12);
        let (first, last) = (losses[0], losses[losses.len() - 1]);
        assert!(
            losses.iter().all(|l| l.is_finite()) && last < 0.8 * first,
            "mixed_float16 on {}: the loss went {losses:?}",
            label(dev)
        );
    }
}

/// A first layer (no input gradient) takes another path (`FusedConv2DWeightGrad`, the fused
/// dense and separable gradients): with a separate activation it must give the same weight
/// gradients as the full backward pass.
#[test]
fn first_layer_weight_gradients_match_the_full_backward_pass() {
    let _g = serial();
    let gelu = Activation::Gelu { approximate: false };
    for dev in &env().devices {
        let layers: Vec<(Box<dyn Layer>, Vec<usize>)> = vec![
            (
                Box::new(Conv2D::new(5, 3).padding(Padding::Same).activation(gelu)),
                vec![2, 6, 5, 3],
            ),
            (
                Box::new(Conv2D::new(4, 3).activation(Activation::Elu)),
                vec![2, 6, 5, 3],
            ),
            (
                Box::new(
                    SeparableConv2D::new(6, 3)
                        .padding(Padding::Same)
                        .activation(Activation::Swish),
                ),
                vec![2, 6, 5, 4],
            ),
            (
                Box::new(Dense::new(7).activation(Activation::Tanh)),
                vec![5, 9],
            ),
        ];
        for (seed, (mut layer, shape)) in layers.into_iter().enumerate() {
            let what = format!("{} on {}", layer.class_name(), label(dev));
            layer.build(&shape[1..], seed as u64, dev).expect("build");
            let len = shape.iter().product();
            let x = put(dev, &random_vec(len, seed as u64 + 1), &shape);
            let (y, saved) = layer.forward(&x).expect("forward");
            let dy = put(dev, &random_vec(y.len(), seed as u64 + 2), y.shape());
            let (_, full) = layer.backward(&saved, &dy, true).expect("backward");
            let (dx, first) = layer.backward(&saved, &dy, false).expect("backward");
            assert!(dx.is_none(), "{what}: dx was not asked for");
            for (i, (a, b)) in full.iter().zip(&first).enumerate() {
                let want: Vec<f64> = to_f64(&get(a, dev));
                assert_close(
                    &get(b, dev),
                    &want,
                    1e-5,
                    &format!("{what}: weight gradient {i}"),
                );
            }
        }
    }
}

/// The ReLU layer's kernels over a long input (the CPU's parallel chunks and vectorized loop,
/// the GPUs'): `max(x, 0)`, 0 at `-inf` as in TensorFlow (not `0 - 0·inf`), and the gradient
/// from the output passed where `y > 0` only.
#[test]
fn relu_over_a_long_input_is_tensorflows_on_every_device() {
    let _g = serial();
    let mut x: Vec<f32> = random_vec(100_003, 5).iter().map(|v| v * 50.0).collect();
    x[..4].copy_from_slice(&[f32::NEG_INFINITY, -0.0, 0.0, f32::MIN]);
    let dy = random_vec(x.len(), 6);
    let want: Vec<f32> = x.iter().map(|&v| v.max(0.0)).collect();
    let dwant: Vec<f32> = want
        .iter()
        .zip(&dy)
        .map(|(&y, &d)| if y > 0.0 { d } else { 0.0 })
        .collect();
    for dev in &env().devices {
        let y = ops::activation_fn(&put(dev, &x, &[x.len()]), ActivationFn::RELU).expect("relu");
        assert_eq!(get(&y, dev), want, "relu on {}", label(dev));
        let dyt = put(dev, &dy, &[x.len()]);
        let dz = ops::activation_fn_backward(&dyt, &y, ActivationFn::RELU, true).expect("grad");
        assert_eq!(get(&dz, dev), dwant, "relu's gradient on {}", label(dev));
    }
}
