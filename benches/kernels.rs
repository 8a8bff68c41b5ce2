//! The CNN kernels at the Keras Fashion-MNIST tutorial's shapes (batch 128), and the modern
//! CNN's 3×3 convolutions (`fashion_mnist --model modern`, stride 1 and 2), forward and
//! forward + backward, on every device.
//!
//! Benchmark ids are `{kernel}/{fwd|fwd+bwd}/{device}`, e.g. `conv2d_1x32_28/fwd/gpu0-lavapipe`
//! or `sepconv_32x64_14/fwd+bwd/cpu0`; throughput is in flops (`Throughput::Elements`, so
//! criterion's "elem/s" reads as FLOP/s) or, for pooling, bytes of input. Each timed region ends
//! with `device.synchronize()`, so GPU times include the work, not just its recording.
//!
//! Each benchmark runs the ops the layer runs on that device (`nn/layers/`), and its runtime
//! has soft placement off: an op the device cannot run (no kernel, a shader the adapter
//! rejects) fails the benchmark with TensorFlow's placement error before anything is timed,
//! instead of reporting CPU numbers under a GPU's name.
//!
//! ```text
//! cargo bench --bench kernels                              # everything, every device
//! ANYGPU_BENCH_DEVICES=cpu,gpu0 cargo bench --bench kernels  # only CPU:0 and GPU:0
//! cargo bench --bench kernels -- 'conv2d_1x32_28/fwd/'       # criterion's own filter
//! WGPU_BACKEND=vulkan cargo bench --bench kernels -- --quick
//! ```

#[path = "common/devices.rs"]
mod devices;

use std::time::{Duration, Instant};

use anygpu::ops::reference::random_vec;
use anygpu::ops::spec::{Activation, AdamParams, ConvOptions, Padding};
use anygpu::ops::{self};
use anygpu::{DeviceKind, LogicalDevice, Runtime, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const BATCH: usize = 128;
const ACT: Activation = Activation::Relu;

fn put(dev: &LogicalDevice, shape: &[usize], seed: u64, scale: f32) -> Tensor {
    let len: usize = shape.iter().product();
    let data: Vec<f32> = random_vec(len, seed).iter().map(|v| v * scale).collect();
    Tensor::from_slice_on(&data, shape, dev).expect("upload")
}

/// Times `iters` runs of `f` on `dev`, waiting for the device at the end.
fn timed(dev: &LogicalDevice, iters: u64, mut f: impl FnMut()) -> Duration {
    dev.synchronize().expect("device");
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    dev.synchronize().expect("device");
    start.elapsed()
}

/// One benchmark: `name/mode/device` with `throughput`, running `f` in `dev`'s scope.
fn bench(
    c: &mut Criterion,
    name: &str,
    mode: &str,
    throughput: Throughput,
    dev: &LogicalDevice,
    mut f: impl FnMut(),
) {
    // Once before timing: an op that cannot run on `dev` fails here, loudly (soft placement is
    // off), rather than being timed on another device.
    {
        let _s = dev.scope();
        f();
        dev.synchronize().expect("device");
    }
    let mut group = c.benchmark_group(name);
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .throughput(throughput);
    group.bench_function(BenchmarkId::new(mode, devices::tag(dev)), |b| {
        b.iter_custom(|iters| {
            let _s = dev.scope();
            timed(dev, iters, &mut f)
        })
    });
    group.finish();
}

fn conv2d_first_layer(c: &mut Criterion, dev: &LogicalDevice) {
    let (h, cin, cout) = (28, 1, 32);
    let x = put(dev, &[BATCH, h, h, cin], 1, 1.0);
    let k = put(dev, &[3, 3, cin, cout], 2, 0.3);
    let b = put(dev, &[cout], 3, 0.1);
    let dy = put(dev, &[BATCH, h, h, cout], 4, 1.0);
    let name = "conv2d_1x32_28";
    let flops = (2 * BATCH * h * h * cout * 9 * cin) as u64;
    let fwd = || ops::conv2d(&x, &k, Some(&b), Padding::Same, ACT).unwrap();
    bench(c, name, "fwd", Throughput::Elements(flops), dev, || {
        fwd();
    });
    // The first layer's backward pass needs no input gradient (Keras skips it): the layer runs
    // one op for the kernel and bias gradients (`Conv2D::backward` without `need_dx`).
    bench(
        c,
        name,
        "fwd+bwd",
        Throughput::Elements(2 * flops),
        dev,
        || {
            let y = fwd();
            let _grads =
                ops::conv2d_backward_weights(&x, &y, &dy, &[3, 3, cin, cout], Padding::Same, ACT)
                    .unwrap();
        },
    );
}

/// A 3×3 'same' convolution of the modern CNN from `h`×`h`, `cin` → `cout` channels at
/// `strides` (1 or 2), its forward pass, then with both gradients (`Conv2D::backward` with
/// `need_dx`). Ids `conv2d_3x3_{cin}x{cout}_{h}` at stride 1, `conv2d_s2_...` at 2.
fn conv3x3(
    c: &mut Criterion,
    dev: &LogicalDevice,
    (cin, cout, h): (usize, usize, usize),
    strides: usize,
) {
    let o = h.div_ceil(strides);
    let options = ConvOptions::new(Padding::Same).strides(strides);
    let x = put(dev, &[BATCH, h, h, cin], 61, 1.0);
    let k = put(dev, &[3, 3, cin, cout], 62, 0.3);
    let b = put(dev, &[cout], 63, 0.1);
    let dy = put(dev, &[BATCH, o, o, cout], 64, 1.0);
    let kind = if strides == 1 { "3x3" } else { "s2" };
    let name = format!("conv2d_{kind}_{cin}x{cout}_{h}");
    let flops = (2 * BATCH * o * o * cout * 9 * cin) as u64;
    let fwd = || ops::conv2d(&x, &k, Some(&b), options, ACT).unwrap();
    bench(c, &name, "fwd", Throughput::Elements(flops), dev, || {
        fwd();
    });
    let kshape = [3, 3, cin, cout];
    bench(
        c,
        &name,
        "fwd+bwd",
        Throughput::Elements(3 * flops),
        dev,
        || {
            let y = fwd();
            let _grads = ops::conv2d_backward_weights(&x, &y, &dy, &kshape, options, ACT).unwrap();
            let _dx = ops::conv2d_backward_input(&dy, &k, x.shape(), options).unwrap();
        },
    );
}

fn sepconv(c: &mut Criterion, dev: &LogicalDevice, cin: usize, cout: usize, h: usize) {
    let x = put(dev, &[BATCH, h, h, cin], 11, 1.0);
    let kd = put(dev, &[3, 3, cin, 1], 12, 0.3);
    let kp = put(dev, &[1, 1, cin, cout], 13, 0.2);
    let b = put(dev, &[cout], 14, 0.1);
    let dy = put(dev, &[BATCH, h, h, cout], 15, 1.0);
    let name = format!("sepconv_{cin}x{cout}_{h}");
    let rows = BATCH * h * h;
    let flops = (2 * rows * cin * 9 + 2 * rows * cin * cout) as u64;
    let fwd = || {
        let d = ops::depthwise_conv2d(&x, &kd).unwrap();
        let y = ops::pointwise_conv2d(&d, &kp, Some(&b), ACT).unwrap();
        (d, y)
    };
    let cpu = dev.device_type() == DeviceKind::Cpu;
    if cpu {
        // The layer's path on the CPU: the fused ops, `d` recomputed in the backward pass.
        let fused = || ops::separable_conv2d(&x, &kd, &kp, Some(&b), ACT).unwrap();
        bench(c, &name, "fwd", Throughput::Elements(flops), dev, || {
            fused();
        });
        bench(
            c,
            &name,
            "fwd+bwd",
            Throughput::Elements(3 * flops),
            dev,
            || {
                let y = fused();
                ops::separable_conv2d_backward(&x, &kd, &kp, &y, &dy, ACT, true).unwrap();
            },
        );
    }
    // The separate ops (the layer's path on a GPU; on the CPU, for comparison with the fused
    // ones).
    let unfused = |what: &str| {
        if cpu {
            format!("{what}-unfused")
        } else {
            what.to_string()
        }
    };
    bench(
        c,
        &name,
        &unfused("fwd"),
        Throughput::Elements(flops),
        dev,
        || {
            fwd();
        },
    );
    bench(
        c,
        &name,
        &unfused("fwd+bwd"),
        Throughput::Elements(3 * flops),
        dev,
        || {
            let (d, y) = fwd();
            // The pointwise gradients: on a GPU as the layer computes them, 1×1 convolution
            // gradients (several times faster there than the products on the [rows, c]
            // reshapes); on the CPU, for comparison, one fused dense-layer gradient over the
            // pixels.
            let dd = if !cpu {
                let dz = ops::activation_backward(&dy, &y, ACT).unwrap();
                let _dkp = ops::conv2d_backward_kernel(&d, &dz, &[1, 1, cin, cout], Padding::Same)
                    .unwrap();
                let dd = ops::conv2d_backward_input(&dz, &kp, d.shape(), Padding::Same).unwrap();
                let _db = ops::bias_grad(&dz).unwrap();
                dd
            } else {
                let flat = |t: &Tensor, c: usize| t.reshape(&[rows, c]).unwrap();
                let kp2 = kp.reshape(&[cin, cout]).unwrap();
                let (dd, _dkp, _db) = ops::dense_backward(
                    &flat(&d, cin),
                    &kp2,
                    &flat(&y, cout),
                    &flat(&dy, cout),
                    ACT,
                    true,
                )
                .unwrap();
                dd.unwrap().reshape(d.shape()).unwrap()
            };
            let _dkd = ops::depthwise_conv2d_backward_kernel(&x, &dd, &[3, 3, cin, 1]).unwrap();
            let _dx = ops::depthwise_conv2d_backward_input(&dd, &kd).unwrap();
        },
    );
}

fn maxpool(c: &mut Criterion, dev: &LogicalDevice) {
    let (h, ch) = (28, 32);
    let x = put(dev, &[BATCH, h, h, ch], 21, 1.0);
    let dy = put(dev, &[BATCH, h / 2, h / 2, ch], 22, 1.0);
    let bytes = (BATCH * h * h * ch * 4) as u64;
    let name = "maxpool_32x28";
    bench(c, name, "fwd", Throughput::Bytes(bytes), dev, || {
        ops::max_pool2d(&x).unwrap();
    });
    bench(
        c,
        name,
        "fwd+bwd",
        Throughput::Bytes(2 * bytes),
        dev,
        || {
            let _y = ops::max_pool2d(&x).unwrap();
            let _dx = ops::max_pool2d_backward(&x, &dy).unwrap();
        },
    );
}

fn dense(c: &mut Criterion, dev: &LogicalDevice) {
    let (n_in, n_out) = (1152, 128);
    let x = put(dev, &[BATCH, n_in], 31, 1.0);
    let w = put(dev, &[n_in, n_out], 32, 0.05);
    let b = put(dev, &[n_out], 33, 0.1);
    let dy = put(dev, &[BATCH, n_out], 34, 1.0);
    let name = "dense_1152x128";
    let flops = (2 * BATCH * n_in * n_out) as u64;
    bench(c, name, "fwd", Throughput::Elements(flops), dev, || {
        ops::dense(&x, &w, Some(&b), ACT).unwrap();
    });
    bench(
        c,
        name,
        "fwd+bwd",
        Throughput::Elements(3 * flops),
        dev,
        || {
            // As the layer computes it: one fused op for dz, db, dw and dx.
            let y = ops::dense(&x, &w, Some(&b), ACT).unwrap();
            let _grads = ops::dense_backward(&x, &w, &y, &dy, ACT, true).unwrap();
        },
    );
}

fn head_and_update(c: &mut Criterion, dev: &LogicalDevice) {
    // The loss and accuracy of a batch, and one Adam step on the Dense kernel.
    let logits = put(dev, &[BATCH, 10], 41, 4.0);
    let labels: Vec<i32> = (0..BATCH as i32).map(|i| i % 10).collect();
    let labels = Tensor::from_slice_on(&labels, &[BATCH], dev).unwrap();
    bench(
        c,
        "xent_128x10",
        "fwd+bwd",
        Throughput::Elements((BATCH * 10) as u64),
        dev,
        || {
            // As `nn/pass.rs` computes a batch's loss terms.
            let (per_example, _dlogits) =
                ops::sparse_softmax_cross_entropy(&logits, &labels).unwrap();
            let _loss_sum = per_example.reduce_sum(None).unwrap();
            let _a = ops::accuracy_count(&logits, &labels).unwrap();
        },
    );
    let len = 1152 * 128;
    let w = put(dev, &[len], 42, 0.05);
    let g = put(dev, &[len], 43, 0.01);
    let m = put(dev, &[len], 44, 0.0);
    let v = put(dev, &[len], 45, 0.0);
    let mut step = 0;
    bench(
        c,
        "adam_147456",
        "step",
        Throughput::Elements(len as u64),
        dev,
        || {
            step += 1;
            let p = AdamParams {
                lr: 1e-3,
                beta1: 0.9,
                beta2: 0.999,
                epsilon: 1e-7,
                step,
            };
            ops::adam_update(&w, &g, &m, &v, &p).unwrap();
        },
    );
}

fn matmul(c: &mut Criterion, dev: &LogicalDevice) {
    let n = 1024;
    let a = put(dev, &[n, n], 51, 1.0);
    let b = put(dev, &[n, n], 52, 1.0);
    bench(
        c,
        "matmul_1024",
        "fwd",
        Throughput::Elements(2 * (n * n * n) as u64),
        dev,
        || {
            a.matmul(&b).unwrap();
        },
    );
}

fn kernels(c: &mut Criterion) {
    let rt = Runtime::builder()
        .memory_growth(true)
        .soft_device_placement(false)
        .build()
        .expect("runtime");
    for dev in devices::selected(&rt) {
        eprintln!(
            "benchmarking {} as {} ({})",
            dev.name(),
            devices::tag(&dev),
            dev.adapter_name()
        );
        conv2d_first_layer(c, &dev);
        for (cin, cout, h) in [
            (32, 32, 28),
            (32, 64, 14),
            (64, 64, 14),
            (64, 128, 7),
            (128, 128, 7),
        ] {
            sepconv(c, &dev, cin, cout, h);
        }
        conv3x3(c, &dev, (32, 64, 14), 1);
        conv3x3(c, &dev, (64, 128, 7), 1);
        conv3x3(c, &dev, (32, 32, 28), 2);
        conv3x3(c, &dev, (64, 64, 14), 2);
        maxpool(c, &dev);
        dense(c, &dev);
        head_and_update(c, &dev);
        matmul(c, &dev);
    }
}

criterion_group! {
    name = benches;
    // No plots: they need system fonts (plotters' text rendering panics without them), and the
    // numbers are what these runs are for.
    config = Criterion::default().without_plots();
    targets = kernels
}
criterion_main!(benches);
