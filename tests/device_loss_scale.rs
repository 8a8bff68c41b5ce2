//! Dynamic loss scaling decided on the device against the host's decisions, bit for bit, on
//! CPU:0 and every GPU: the same weights, optimizer slots, iterations, loss scale and counter
//! after steps that include skipped ones (an infinity in the input makes every gradient NaN),
//! with SGD with momentum, Adam under a learning-rate schedule, AdamW (weight decay) and a
//! dense loss, and each kind of gradient clipping; more unread steps than the update's table of rules holds; growth after
//! `dynamic_growth_steps`; and a checkpoint saved mid-way. Every test name has `loss_scale`.

mod common;

use std::sync::{Mutex, MutexGuard};

use anygpu::mixed_precision::{self, Policy};
use anygpu::nn::{
    Adam, AdamW, ExponentialDecay, Loss, LossScaleOptimizer, Metric, Optimizer,
    PiecewiseConstantDecay, RmsProp, Sequential, Sgd, Verbosity,
};
use anygpu::{KindFilter, LogicalDevice, Runtime, Tensor};

/// One test at a time: the tests set the global policy, which layers read when added.
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

fn label(dev: &LogicalDevice) -> String {
    format!("{} ({})", dev.name(), dev.adapter_name())
}

/// The 8×8 CNN under `mixed_float16` on `dev` (float32 compute where the device has no
/// float16), compiled with `optimizer` under loss scaling.
fn model(dev: &LogicalDevice, optimizer: LossScaleOptimizer, loss: Loss) -> Sequential {
    let _s = dev.scope();
    mixed_precision::set_global_policy(Policy::MIXED_FLOAT16).expect("policy");
    let built = common::small_cnn(17);
    mixed_precision::set_global_policy(Policy::FLOAT32).expect("policy");
    let mut m = built.expect("model");
    m.compile(loss, optimizer, &[Metric::Accuracy])
        .expect("compile");
    m.set_verbose(Verbosity::Silent);
    m
}

/// Batch `i` of 8 examples: synthetic data, with an infinity in the input of the steps
/// `skipped` names. Targets as labels, or one-hot for a dense loss.
fn batch(i: usize, skipped: &[usize], one_hot: bool) -> (Tensor, Tensor) {
    let (mut x, y) = common::synthetic(8, 100 + i as u64);
    if skipped.contains(&i) {
        x[5] = f32::INFINITY;
    }
    let x = Tensor::from_vec(x, &[8, 8, 8, 1]).expect("x");
    let y = if one_hot {
        let mut h = vec![0.0f32; 8 * 3];
        for (r, &c) in y.iter().enumerate() {
            h[3 * r + c as usize] = 1.0;
        }
        Tensor::from_vec(h, &[8, 3]).expect("y")
    } else {
        Tensor::from_vec(y, &[8]).expect("y")
    };
    (x, y)
}

/// Everything the two paths must agree on, as bits.
#[derive(Debug, PartialEq)]
struct Snapshot {
    weights: Vec<Vec<u32>>,
    slots: Vec<(String, Vec<u32>)>,
    iterations: u64,
    scale: Option<u32>,
    counter: Option<u64>,
}

fn snapshot(m: &Sequential) -> Snapshot {
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    Snapshot {
        weights: m
            .get_weights()
            .expect("weights")
            .into_iter()
            .map(bits)
            .collect(),
        slots: m
            .optimizer_variables()
            .into_iter()
            .map(|(n, t)| (n, bits(t.to_vec::<f32>().expect("slot"))))
            .collect(),
        iterations: m.iterations(),
        scale: m.loss_scale().map(f32::to_bits),
        counter: m.loss_scale_counter(),
    }
}

/// Runs `steps` training steps on both models (nothing read back between), then compares.
fn run_both(
    (device, host): (&mut Sequential, &mut Sequential),
    steps: std::ops::Range<usize>,
    skipped: &[usize],
    one_hot: bool,
    what: &str,
) -> Snapshot {
    for i in steps.clone() {
        let (x, y) = batch(i, skipped, one_hot);
        device.train_step(&x, &y).expect("device-side step");
        host.train_step(&x, &y).expect("host-side step");
    }
    let (d, h) = (snapshot(device), snapshot(host));
    assert_eq!(
        d, h,
        "{what}: steps {steps:?}, device-side against host-side"
    );
    d
}

#[test]
fn device_loss_scale_matches_the_host_path_bit_for_bit() {
    let _g = serial();
    let rt = runtime();
    let devices = common::all_devices(&rt, "device_loss_scale_matches_the_host_path_bit_for_bit");
    let sparse = Loss::sparse_categorical_crossentropy();
    let dense = Loss::CategoricalCrossentropy {
        from_logits: false,
        label_smoothing: 0.0,
    };
    let cases: Vec<(&str, Optimizer, Loss, bool)> = vec![
        (
            "sgd momentum",
            Sgd::new(0.05).momentum(0.9).nesterov(true).into(),
            sparse,
            false,
        ),
        (
            "adam schedule",
            Adam::new(1e-2)
                .learning_rate_schedule(ExponentialDecay::new(0.01, 3, 0.5))
                .into(),
            sparse,
            false,
        ),
        (
            "adamw piecewise, dense loss",
            AdamW::new(1e-2)
                .weight_decay(0.01)
                .learning_rate_schedule(PiecewiseConstantDecay::new(
                    vec![4, 9],
                    vec![0.02, 0.01, 0.005],
                ))
                .into(),
            dense,
            true,
        ),
        // Clipping after unscaling: each gradient unscaled (and checked) on the device first.
        (
            "sgd clipnorm",
            Sgd::new(0.05).momentum(0.9).clipnorm(0.5).into(),
            sparse,
            false,
        ),
        (
            "adam global_clipnorm",
            Adam::new(1e-2).global_clipnorm(0.3).into(),
            sparse,
            false,
        ),
        (
            "rmsprop centered momentum clipvalue",
            RmsProp::new(1e-3)
                .centered(true)
                .momentum(0.5)
                .clipvalue(0.01)
                .into(),
            sparse,
            false,
        ),
    ];
    // Skipped steps early and late, two in a row; growth every 3 finite steps in a row.
    let skipped = [1, 6, 7, 15, 31];
    for dev in &devices {
        for (name, inner, loss, one_hot) in &cases {
            let what = format!("{name} on {}", label(dev));
            let opt = || {
                LossScaleOptimizer::new(inner.clone())
                    .initial_scale(2f32.powi(10))
                    .dynamic_growth_steps(3)
            };
            let mut device = model(dev, opt(), *loss);
            let mut host = model(dev, opt(), *loss);
            host.set_loss_scaling_on_host(true).expect("host path");
            let first = run_both((&mut device, &mut host), 0..9, &skipped, *one_hot, &what);
            assert_eq!(first.iterations, 6, "{what}: three of nine skipped");
            // More unread steps than the update's table holds (16): the host catches up.
            let last = run_both((&mut device, &mut host), 9..40, &skipped, *one_hot, &what);
            assert_eq!(last.iterations, 35, "{what}: five of forty skipped");
            assert_ne!(first.weights, last.weights, "{what}: the model trained");
        }
    }
}

#[test]
fn device_loss_scale_follows_keras_rules_without_reading_back() {
    let _g = serial();
    let rt = runtime();
    let devices = common::all_devices(&rt, "device_loss_scale_follows_keras_rules");
    for dev in &devices {
        let what = label(dev);
        let opt = LossScaleOptimizer::new(Sgd::new(0.01))
            .initial_scale(1024.0)
            .dynamic_growth_steps(2);
        let mut m = model(dev, opt, Loss::sparse_categorical_crossentropy());
        // skip (512), finite, finite (1024), finite, skip (512), finite, finite (1024),
        // finite, finite (2048), finite: counter 1, iterations 8.
        let skipped = [0, 4];
        for i in 0..10 {
            let (x, y) = batch(i, &skipped, false);
            m.train_step(&x, &y).expect("step");
        }
        assert_eq!(m.loss_scale(), Some(2048.0), "{what}");
        assert_eq!(m.loss_scale_counter(), Some(1), "{what}");
        assert_eq!(m.iterations(), 8, "{what}");
    }
}

#[test]
fn device_loss_scale_survives_a_checkpoint_mid_way() {
    let _g = serial();
    let rt = runtime();
    let devices = common::all_devices(&rt, "device_loss_scale_survives_a_checkpoint_mid_way");
    for (k, dev) in devices.iter().enumerate() {
        let what = label(dev);
        let dir = std::env::temp_dir().join(format!(
            "anygpu-device-loss-scale-{}-{k}",
            std::process::id()
        ));
        let opt = || {
            LossScaleOptimizer::new(Adam::new(1e-2))
                .initial_scale(3000.0)
                .dynamic_growth_steps(2)
        };
        let loss = Loss::sparse_categorical_crossentropy();
        // Epoch 1: a skipped step and three finite ones (a scale that is no power of two,
        // halved, then doubled), saved by BackupAndRestore at its end.
        let mut x = Vec::new();
        let mut y = Vec::new();
        for i in 0..4 {
            let (mut xi, yi) = common::synthetic(4, 300 + i);
            if i == 0 {
                xi[9] = f32::NEG_INFINITY;
            }
            x.extend(xi);
            y.extend(yi);
        }
        let data = anygpu::data::Dataset::from_tensor_slices(x, &[8, 8, 1], y)
            .expect("data")
            .batch(4, false);
        let mut first = model(dev, opt(), loss);
        let mut backup = anygpu::nn::BackupAndRestore::new(&dir).delete_checkpoint(false);
        first
            .fit_with_callbacks(&data, 1, None, None, &mut [&mut backup])
            .expect("fit");
        let saved = snapshot(&first);
        assert_eq!(saved.iterations, 3, "{what}");
        assert_eq!(saved.scale, Some(3000f32.to_bits()), "{what}");
        assert_eq!(saved.counter, Some(1), "{what}");
        let mut resumed = model(dev, opt(), loss);
        let mut backup = anygpu::nn::BackupAndRestore::new(&dir).delete_checkpoint(false);
        resumed
            .fit_with_callbacks(&data, 1, None, None, &mut [&mut backup])
            .expect("restore");
        assert_eq!(snapshot(&resumed), saved, "{what}: restored exactly");
        // Both go on alike: the counter came back too, so the next finite step doubles (and
        // the third again).
        for m in [&mut first, &mut resumed] {
            for i in 0..3 {
                let (x, y) = batch(50 + i, &[], false);
                m.train_step(&x, &y).expect("step");
            }
        }
        assert_eq!(
            snapshot(&first),
            snapshot(&resumed),
            "{what}: after resuming"
        );
        assert_eq!(first.loss_scale(), Some(12000.0), "{what}");
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn device_loss_scale_needs_no_device_where_the_model_spans_several() {
    let _g = serial();
    let rt = runtime();
    let devices = common::available(rt.list_logical_devices(KindFilter::All).expect("devices"));
    let [a, b, ..] = devices.as_slice() else {
        return;
    };
    // Layers on two devices: the host decides, as before; same numbers as a host-only model.
    let build = || {
        let mut m = Sequential::with_seed(8);
        m.add_on(
            a,
            anygpu::nn::Dense::new(6)
                .activation(anygpu::nn::Activation::Relu)
                .input_shape(&[64]),
        )
        .expect("dense");
        m.add_on(
            b,
            anygpu::nn::Dense::new(3).activation(anygpu::nn::Activation::Softmax),
        )
        .expect("dense");
        m.compile(
            Loss::sparse_categorical_crossentropy(),
            LossScaleOptimizer::new(Sgd::new(0.1)).dynamic_growth_steps(2),
            &[],
        )
        .expect("compile");
        m
    };
    let (mut split, mut host) = (build(), build());
    host.set_loss_scaling_on_host(true).expect("host path");
    for i in 0..6 {
        let (x, y) = batch(i, &[2], false);
        let x = x.reshape(&[8, 64]).expect("flat");
        split.train_step(&x, &y).expect("step");
        host.train_step(&x, &y).expect("step");
    }
    assert_eq!(snapshot(&split), snapshot(&host));
    assert_eq!(split.iterations(), 5);
}

#[test]
fn device_loss_scale_dispatches_of_a_mixed_tutorial_step() {
    let _g = serial();
    if common::gpus_at_least(1, "device_loss_scale_dispatches_of_a_mixed_tutorial_step").is_none() {
        return;
    }
    // One arena region (the default), and several under memory growth: the loss-scaled
    // update takes two regions a dispatch (the state is its fourth storage binding), the plain
    // one three, so spread tensors may cost a dispatch or two more.
    for growth in [false, true] {
        let rt = common::builder()
            .env("ANYGPU_AUTOTUNE", Some("off"))
            .memory_growth(growth)
            .build()
            .expect("runtime");
        let gpus = rt
            .list_logical_devices(KindFilter::Kind(anygpu::DeviceKind::Gpu))
            .expect("GPUs");
        for gpu in &gpus {
            let (counts, weights) = tutorial_step_dispatches(gpu);
            eprintln!(
                "{} (float16 {}, memory growth {growth}): a mixed tutorial step, {weights} trainable \
                 weights: {} dispatches with the host deciding loss scaling, {} with the device",
                label(gpu),
                gpu.has_f16(),
                counts[0],
                counts[1]
            );
            // One unscale per gradient before; one check and one step of Keras' rules now.
            if growth {
                assert!(counts[1] < counts[0], "{}: {counts:?}", label(gpu));
            } else {
                assert_eq!(
                    counts[0] - counts[1],
                    weights as u64 - 2,
                    "{}: {counts:?}",
                    label(gpu)
                );
            }
        }
    }
}

/// Dispatches of one step of the tutorial CNN under mixed_float16 on `gpu`, batch 32, after
/// two to warm up: with the host deciding loss scaling (as before), then the device; and the
/// count of trainable weights.
fn tutorial_step_dispatches(gpu: &LogicalDevice) -> ([u64; 2], usize) {
    let _s = gpu.scope();
    let mut counts = [0; 2];
    let mut weights = 0;
    for (k, on_host) in [true, false].into_iter().enumerate() {
        mixed_precision::set_global_policy(Policy::MIXED_FLOAT16).expect("policy");
        let built = anygpu::nn::tutorial_cnn(3, std::slice::from_ref(gpu));
        mixed_precision::set_global_policy(Policy::FLOAT32).expect("policy");
        let mut m = built.expect("tutorial");
        m.compile(Loss::sparse_categorical_crossentropy(), Sgd::new(0.01), &[])
            .expect("compile");
        m.set_loss_scaling_on_host(on_host).expect("path");
        weights = m.trainable_weights().len();
        let x = Tensor::from_vec(common::values(32 * 784, 4), &[32, 28, 28, 1]).expect("x");
        let y = Tensor::from_vec((0..32).map(|i| i % 10).collect(), &[32]).expect("y");
        for _ in 0..2 {
            m.train_step(&x, &y).expect("warm-up");
        }
        let before = gpu.stream_stats().unwrap_or_default();
        m.train_step(&x, &y).expect("step");
        counts[k] = (gpu.stream_stats().unwrap_or_default() - before).dispatches;
    }
    (counts, weights)
}

#[test]
fn device_loss_scale_and_clipvalue_folded_into_the_update_match_clipping_first() {
    let _g = serial();
    let rt = runtime();
    let devices = common::all_devices(&rt, "clipvalue_folded_into_the_update");
    // Gradients applied directly: a model with `clipvalue` (folded into a GPU's fused update,
    // with and without loss scaling) against one without, given the clipped gradients.
    let build = |dev: &LogicalDevice, opt: Optimizer| {
        let _s = dev.scope();
        let mut m = Sequential::with_seed(12);
        m.add(
            anygpu::nn::Dense::new(5)
                .activation(anygpu::nn::Activation::Relu)
                .input_shape(&[7]),
        )
        .expect("dense");
        m.add(anygpu::nn::Dense::new(3)).expect("dense");
        m.compile(Loss::MeanSquaredError, opt, &[])
            .expect("compile");
        m
    };
    let clip = 0.05f32;
    for dev in &devices {
        let what = label(dev);
        let momentum = || Sgd::new(0.1).momentum(0.9);
        let mut plain = build(dev, momentum().into());
        let mut folded = build(dev, momentum().clipvalue(clip).into());
        let mut scaled = build(
            dev,
            LossScaleOptimizer::new(momentum().clipvalue(clip))
                .initial_scale(8.0)
                .into(),
        );
        for step in 0..3u64 {
            let shapes: Vec<Vec<usize>> =
                plain.weights().iter().map(|w| w.shape().to_vec()).collect();
            let grads: Vec<Vec<f32>> = shapes
                .iter()
                .enumerate()
                .map(|(i, s)| common::values(s.iter().product(), 40 + 10 * step + i as u64))
                .collect();
            let tensors = |f: &dyn Fn(f32) -> f32| -> Vec<Tensor> {
                grads
                    .iter()
                    .zip(&shapes)
                    .map(|(g, s)| {
                        let v: Vec<f32> = g.iter().map(|&x| f(x)).collect();
                        Tensor::from_slice_on(&v, s, dev).expect("gradient")
                    })
                    .collect()
            };
            plain
                .apply_gradients(&tensors(&|x| x.clamp(-clip, clip)))
                .expect("plain");
            folded.apply_gradients(&tensors(&|x| x)).expect("folded");
            // Taken as scaled: 8 g, unscaled exactly.
            scaled
                .apply_gradients(&tensors(&|x| 8.0 * x))
                .expect("scaled");
        }
        let bits = |m: &Sequential| {
            m.get_weights()
                .expect("weights")
                .into_iter()
                .map(|w| w.into_iter().map(f32::to_bits).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&folded), bits(&plain), "{what}: clipvalue");
        assert_eq!(
            bits(&scaled),
            bits(&plain),
            "{what}: loss scale and clipvalue"
        );
        assert_eq!(scaled.iterations(), 3, "{what}");
    }
}
