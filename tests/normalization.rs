//! BatchNormalization and Dropout: their kernels against the f64 oracle on CPU:0 and every
//! GPU, Dropout's mask (the same on every device, the kept fraction, the scaling, the
//! gradient), the `training` flag, and models with both layers training on one device, under
//! MirroredStrategy and in a pipeline, with their moving statistics saved and restored; a
//! BatchNormalization with the ReLU after it run as one op each way, against the two layers,
//! a first convolution's kernel gradient through them in one op, and the two with a global
//! average pooling after them in one op.
//! (TensorFlow's own numbers for BatchNormalization: `tests/golden/normalization.rs`.)

mod common;

use common::{compiled, synthetic};

use anygpu::distribute::MirroredStrategy;
use anygpu::mixed_precision::Policy;
use anygpu::nn::{
    Activation, ActivationLayer, BatchNormalization, Conv2D, Dense, Dropout, Flatten,
    GlobalAveragePooling2D, Layer, Pipeline, ReLU, Sequential, Sgd,
};
use anygpu::ops::reference::{self as oracle, assert_close, to_f64};
use anygpu::ops::spec::{ActivationFn, DropoutMask, Padding};
use anygpu::ops::{self, BatchNormVariables};
use anygpu::{DType, DeviceKind, LogicalDevice, PlacementRecord, Runtime, Tensor};
use std::sync::{Arc, Mutex};

fn runtime() -> Runtime {
    common::builder()
        .memory_growth(true)
        .build()
        .expect("the runtime initializes")
}

/// `f` inside `dev`'s device scope.
fn scoped<T>(dev: &LogicalDevice, f: impl FnOnce() -> anygpu::Result<T>) -> anygpu::Result<T> {
    let _scope = dev.scope();
    f()
}

fn on(dev: &LogicalDevice, values: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice_on(values, shape, dev).expect("upload")
}

fn read(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().expect("readback")
}

/// Values with a per-channel offset and spread, so that the statistics are not trivial.
fn activations(shape: &[usize], seed: u64) -> Vec<f32> {
    let c = shape[shape.len() - 1];
    oracle::random_vec(shape.iter().product(), seed)
        .iter()
        .enumerate()
        .map(|(i, v)| v * (0.5 + (i % c) as f32 * 0.3) + (i % c) as f32 * 0.25 - 1.0)
        .collect()
}

#[test]
fn batch_norm_kernels_match_the_oracle_on_every_device() {
    let rt = runtime();
    // Rank 2, rank 4 with vec4-sized channels and several partial-sum chunks (1600 rows),
    // an odd channel count, and partial sums over several workgroups whose channels straddle
    // them (8 chunks, the last short, × 40 channels); 32 and 48 channels over row counts
    // that CPU:0's stretches of 2 and 4 rows do not divide.
    let shapes: [&[usize]; 6] = [
        &[37, 5],
        &[4, 20, 20, 8],
        &[3, 7, 5, 3],
        &[2, 30, 30, 40],
        &[3, 9, 11, 32],
        &[1, 13, 7, 48],
    ];
    let (momentum, epsilon) = (0.9f32, 1e-3f32);
    for dev in common::all_devices(&rt, "batch_norm_kernels_match_the_oracle_on_every_device") {
        for shape in shapes {
            let c = shape[shape.len() - 1];
            let rows = shape.iter().product::<usize>() / c;
            let what = format!("{dev} {shape:?}");
            let x = activations(shape, 1);
            let gamma: Vec<f32> = oracle::random_vec(c, 2)
                .iter()
                .map(|v| 1.0 + 0.5 * v)
                .collect();
            let beta = oracle::random_vec(c, 3);
            let mm = oracle::random_vec(c, 4);
            let mv: Vec<f32> = oracle::random_vec(c, 5).iter().map(|v| 1.5 + v).collect();
            let dy = oracle::random_vec(x.len(), 6);
            let (tg, tb) = (on(&dev, &gamma, &[c]), on(&dev, &beta, &[c]));
            let (tm, tv) = (on(&dev, &mm, &[c]), on(&dev, &mv, &[c]));
            let v = BatchNormVariables {
                gamma: &tg,
                beta: &tb,
                moving_mean: &tm,
                moving_variance: &tv,
            };
            let tx = on(&dev, &x, shape);

            // Inference first: the moving statistics as given.
            let y = ops::batch_normalization_inference(&tx, v, epsilon).expect("inference");
            let want = oracle::batch_norm_with(
                &to_f64(&x),
                &to_f64(&gamma),
                &to_f64(&beta),
                (&to_f64(&mm), &to_f64(&mv)),
                c,
                f64::from(epsilon),
            );
            assert_close(&read(&y), &want, 1e-5, &format!("{what}: inference y"));

            let (y, stats) =
                ops::batch_normalization_training(&tx, v, momentum, epsilon).expect("training");
            let (want_y, mean, var) = oracle::batch_norm_train(
                &to_f64(&x),
                &to_f64(&gamma),
                &to_f64(&beta),
                (rows, c),
                f64::from(epsilon),
            );
            assert_close(&read(&y), &want_y, 1e-4, &format!("{what}: training y"));
            let m = f64::from(momentum);
            let want_mm = oracle::moving_update(&to_f64(&mm), &mean, m);
            let want_mv = oracle::moving_update(&to_f64(&mv), &var, m);
            assert_close(&read(&tm), &want_mm, 1e-5, &format!("{what}: moving mean"));
            assert_close(
                &read(&tv),
                &want_mv,
                1e-5,
                &format!("{what}: moving variance"),
            );

            let tdy = on(&dev, &dy, shape);
            let (dx, dgamma, dbeta) =
                ops::batch_normalization_backward(&tx, &tdy, &tg, &stats, epsilon)
                    .expect("backward");
            let (want_dx, want_dgamma, want_dbeta) = oracle::batch_norm_backward(
                &to_f64(&x),
                &to_f64(&dy),
                &to_f64(&gamma),
                (rows, c),
                f64::from(epsilon),
            );
            assert_close(&read(&dx), &want_dx, 1e-3, &format!("{what}: dx"));
            assert_close(
                &read(&dgamma),
                &want_dgamma,
                1e-4,
                &format!("{what}: dgamma"),
            );
            assert_close(&read(&dbeta), &want_dbeta, 1e-4, &format!("{what}: dbeta"));
        }
    }
}

#[test]
fn batch_norm_in_float16_computes_its_statistics_in_float32() {
    let rt = runtime();
    let shape = [2, 6, 6, 8];
    let c = 8;
    let x = activations(&shape, 11);
    let mut tested = 0;
    for dev in common::all_devices(
        &rt,
        "batch_norm_in_float16_computes_its_statistics_in_float32",
    ) {
        if !dev.has_f16() || dev.device_type() != DeviceKind::Gpu {
            continue;
        }
        let _scope = dev.scope();
        let half = on(&dev, &x, &shape).cast(DType::F16).expect("cast");
        let probe = half.cast(DType::F32).expect("cast back");
        // The input as float16 rounded it: the reference's input.
        let rounded = read(&probe);
        let ones = on(&dev, &[1.0; 8], &[c]);
        let zeros = on(&dev, &[0.0; 8], &[c]);
        let (mm, mv) = (on(&dev, &[0.0; 8], &[c]), on(&dev, &[1.0; 8], &[c]));
        let v = BatchNormVariables {
            gamma: &ones,
            beta: &zeros,
            moving_mean: &mm,
            moving_variance: &mv,
        };
        let (y, stats) = match ops::batch_normalization_training(&half, v, 0.99, 1e-3) {
            Ok(out) => out,
            Err(e) => panic!("{dev}: float16 batch norm: {e}"),
        };
        assert_eq!(y.dtype(), DType::F16);
        assert_eq!(stats.dtype(), DType::F32, "statistics stay float32");
        let y = read(&y.cast(DType::F32).expect("cast"));
        let (want, mean, _) =
            oracle::batch_norm_train(&to_f64(&rounded), &[1.0; 8], &[0.0; 8], (72, c), 1e-3);
        // float16 output: half a unit in the last place of values of a few units.
        assert_close(&y, &want, 4e-3, &format!("{dev}: float16 y"));
        assert_close(
            &read(&stats)[..c],
            &mean,
            1e-5,
            &format!("{dev}: float32 mean"),
        );
        tested += 1;
    }
    if tested == 0 {
        eprintln!("no float16 adapter: float16 batch normalization not exercised");
    }
}

#[test]
fn dropout_draws_one_mask_on_every_device_and_scales_what_it_keeps() {
    let rt = runtime();
    let n = 100_003;
    let x = oracle::random_vec(n, 21);
    let dy = oracle::random_vec(n, 22);
    let rate = 0.3f32;
    let mask = DropoutMask::new(rate, 9, 4);
    let want = oracle::dropout(&to_f64(&x), &mask);
    let want_dx = oracle::dropout(&to_f64(&dy), &mask);
    let mut first: Option<Vec<f32>> = None;
    for dev in common::all_devices(&rt, "dropout_draws_one_mask_on_every_device") {
        let (y, m) = ops::dropout(&on(&dev, &x, &[n]), &mask).expect("dropout");
        let y = read(&y);
        // Exactly the oracle's: x * scale in f32 where kept, 0 elsewhere.
        for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
            assert_eq!(g, w as f32, "{dev}: element {i}");
        }
        match &first {
            None => first = Some(y.clone()),
            Some(f) => assert_eq!(f, &y, "{dev}: another mask than CPU:0's"),
        }
        let kept = y.iter().filter(|&&v| v != 0.0).count() as f64;
        // Binomial(n, 0.7): five standard deviations.
        let sd = (n as f64 * 0.7 * 0.3).sqrt();
        assert!(
            (kept - 0.7 * n as f64).abs() < 5.0 * sd,
            "{dev}: kept {kept} of {n}"
        );
        let dx = ops::dropout_backward(&on(&dev, &dy, &[n]), &m).expect("gradient");
        for (i, (&g, &w)) in read(&dx).iter().zip(&want_dx).enumerate() {
            assert_eq!(g, w as f32, "{dev}: gradient element {i}");
        }
    }
}

#[test]
fn dropout_is_the_identity_in_inference_and_new_every_training_step() {
    let rt = runtime();
    let cpu = rt.cpu().expect("CPU:0");
    let x = on(&cpu, &oracle::random_vec(4096, 3), &[64, 64]);
    let mut layer = Dropout::new(0.5).seed(5);
    layer.build(&[64], 0, &cpu).expect("build");
    let (y, saved) = layer.call(&x, false).expect("inference");
    assert_eq!(read(&y), read(&x));
    assert!(saved.is_empty(), "inference keeps nothing");
    let (a, _) = layer.call(&x, true).expect("step 0");
    let (b, saved) = layer.call(&x, true).expect("step 1");
    assert_ne!(read(&a), read(&b), "each step draws a new mask");
    assert_eq!(layer.steps(), 2);
    // The same seed replays the same masks; the gradient applies the step's mask.
    let mut again = Dropout::new(0.5).seed(5);
    again.build(&[64], 0, &cpu).expect("build");
    assert_eq!(read(&again.call(&x, true).expect("step 0").0), read(&a));
    let (dx, grads) = layer.backward(&saved, &x, true).expect("backward");
    assert_eq!(read(&dx.expect("dx")), read(&b));
    assert!(grads.is_empty());
    // rate 0 is the identity in training too.
    let mut none = Dropout::new(0.0);
    none.build(&[64], 0, &cpu).expect("build");
    assert_eq!(read(&none.call(&x, true).expect("rate 0").0), read(&x));
    for bad in [1.0f32, -0.1, f32::NAN] {
        let err = Dropout::new(bad).compute_output_shape(&[64]).unwrap_err();
        assert!(err.to_string().contains("rate"), "{bad}: {err}");
    }
}

#[test]
fn batch_norm_refuses_other_ranks_and_axes_naming_the_value() {
    let err = BatchNormalization::new()
        .compute_output_shape(&[4, 4])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("BatchNormalization") && err.contains("rank 3"),
        "{err}"
    );
    let err = BatchNormalization::new()
        .axis(1)
        .compute_output_shape(&[4, 4, 2])
        .unwrap_err()
        .to_string();
    assert!(err.contains("axis=1"), "{err}");
    assert!(BatchNormalization::new()
        .axis(3)
        .compute_output_shape(&[4, 4, 2])
        .is_ok());
    assert!(BatchNormalization::new()
        .axis(1)
        .compute_output_shape(&[7])
        .is_ok());
}

/// Conv2D (ReLU) → `bn` → Dropout (with `dropout`) → Flatten → Dense (softmax), 8×8×1 → 3.
fn conv_bn(seed: u64, bn: BatchNormalization, dropout: bool) -> anygpu::Result<Sequential> {
    let mut m = Sequential::with_seed(seed);
    m.add(
        Conv2D::new(4, 3)
            .padding(Padding::Same)
            .activation(Activation::Relu)
            .input_shape(&[8, 8, 1]),
    )?;
    m.add(bn)?;
    if dropout {
        m.add(Dropout::new(0.2))?;
    }
    m.add(Flatten::new())?;
    m.add(Dense::new(3).activation(Activation::Softmax))?;
    Ok(m)
}

fn conv_bn_dropout_model(seed: u64) -> anygpu::Result<Sequential> {
    conv_bn(seed, BatchNormalization::new().momentum(0.9), true)
}

fn batches(n: usize, batch: usize, dev: &LogicalDevice) -> Vec<(Tensor, Tensor)> {
    let (x, y) = synthetic(n, 5);
    (0..n / batch)
        .map(|s| {
            let rows = s * batch..(s + 1) * batch;
            (
                on(dev, &x[rows.start * 64..rows.end * 64], &[batch, 8, 8, 1]),
                Tensor::from_slice_on(&y[rows], &[batch], dev).expect("labels"),
            )
        })
        .collect()
}

/// Mean loss of the first and the last `k` of `losses`.
fn falls(what: &str, losses: &[f32]) {
    let k = 3;
    let first: f32 = losses[..k].iter().sum::<f32>() / k as f32;
    let last: f32 = losses[losses.len() - k..].iter().sum::<f32>() / k as f32;
    assert!(
        losses.iter().all(|l| l.is_finite()) && last < 0.8 * first,
        "{what}: the loss does not fall: {losses:?}"
    );
}

#[test]
fn a_conv_bn_dropout_model_trains_on_every_device() {
    let rt = runtime();
    for dev in common::all_devices(&rt, "a_conv_bn_dropout_model_trains_on_every_device") {
        let mut model = scoped(&dev, || {
            compiled(conv_bn_dropout_model(1)?, Sgd::new(0.1).into())
        })
        .expect("the model builds");
        let summary = model.summary();
        assert!(summary.contains("Non-trainable params: 8"), "{summary}");
        assert!(summary.contains("Trainable params: 819"), "{summary}");
        let data = batches(16 * 20, 16, &dev);
        let losses: Vec<f32> = data
            .iter()
            .map(|(x, y)| model.train_on_batch(x, y).expect("a step"))
            .collect();
        falls(&dev.to_string(), &losses);
        let named: Vec<String> = model.named_weights().into_iter().map(|(n, _)| n).collect();
        assert!(
            named.contains(&"batch_normalization/moving_mean".to_string()),
            "{named:?}"
        );
        let moved = read(model.named_weights()[4].1);
        assert!(
            moved.iter().any(|&v| v != 0.0),
            "{dev}: the moving mean moved"
        );
    }
}

#[test]
fn save_and_load_weights_keep_the_moving_statistics() {
    let rt = runtime();
    let dir = std::env::temp_dir().join(format!("anygpu-bn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    for dev in common::all_devices(&rt, "save_and_load_weights_keep_the_moving_statistics") {
        let path = dir.join(format!(
            "{}.safetensors",
            dev.name().replace([':', '/'], "_")
        ));
        let mut model = scoped(&dev, || {
            compiled(conv_bn_dropout_model(2)?, Sgd::new(0.05).into())
        })
        .expect("the model builds");
        let data = batches(16 * 4, 16, &dev);
        for (x, y) in &data {
            model.train_on_batch(x, y).expect("a step");
        }
        model.save_weights(&path).expect("save");
        let mut other = scoped(&dev, || conv_bn_dropout_model(99)).expect("the other model builds");
        let fresh = read(&other.predict(&data[0].0).expect("predict"));
        other.load_weights(&path).expect("load");
        let want = read(&model.predict(&data[0].0).expect("predict"));
        let got = read(&other.predict(&data[0].0).expect("predict"));
        assert_eq!(got, want, "{dev}: predictions after load_weights");
        assert_ne!(
            fresh, want,
            "{dev}: the moving statistics matter to predict"
        );
        assert_eq!(
            other.get_weights().expect("weights"),
            model.get_weights().expect("weights")
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn mirrored_replicas_average_their_moving_statistics() {
    let rt = common::builder().virtual_cpus(2).build().expect("2 CPUs");
    let cpus = rt.list_logical_devices("CPU").expect("CPUs");
    let mut sets = vec![cpus.clone()];
    if let Some(gpu) = rt.list_logical_devices("GPU").expect("GPUs").first() {
        sets.push(vec![cpus[0].clone(), gpu.clone()]);
    }
    for replicas in sets {
        let strategy = MirroredStrategy::with_devices(&replicas).expect("a strategy");
        let mut model = strategy
            .scope(|| compiled(conv_bn_dropout_model(3)?, Sgd::new(0.1).into()))
            .expect("one scope")
            .expect("the model builds");
        let data = batches(16 * 12, 16, &replicas[0]);
        let mut losses = Vec::new();
        for (step, (x, y)) in data.iter().enumerate() {
            losses.push(model.train_on_batch(x, y).expect("a mirrored step"));
            let primary = model.replica_weights(0).expect("primary");
            let other = model.replica_weights(1).expect("replica 1");
            assert_eq!(primary.len(), other.len());
            assert!(
                primary
                    .iter()
                    .flatten()
                    .zip(other.iter().flatten())
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{replicas:?} step {step}: the replicas differ (moving statistics included)"
            );
        }
        falls(&format!("mirrored {replicas:?}"), &losses);
        // The moving mean is the mean of the replicas' updates: the moving mean after one step
        // from zeros is (1 - momentum) times the mean of the two halves' batch means.
        let mut fresh = strategy
            .scope(|| compiled(conv_bn_dropout_model(3)?, Sgd::new(0.1).into()))
            .expect("one scope")
            .expect("the model builds");
        fresh
            .train_on_batch(&data[0].0, &data[0].1)
            .expect("a step");
        let mut single = scoped(&replicas[0], || {
            compiled(conv_bn_dropout_model(3)?, Sgd::new(0.1).into())
        })
        .expect("the model builds");
        single
            .train_on_batch(&data[0].0, &data[0].1)
            .expect("a step");
        let mm = |m: &Sequential| read(m.named_weights()[4].1);
        // With halves of equal size the mean of the two batch means is the batch's mean.
        common::assert_close("moving mean", &mm(&fresh), &mm(&single), 1e-5);
    }
}

fn conv_bn_model(seed: u64, synchronized: bool) -> anygpu::Result<Sequential> {
    let bn = BatchNormalization::new()
        .momentum(0.9)
        .synchronized(synchronized);
    compiled(conv_bn(seed, bn, false)?, Sgd::new(0.1).into())
}

/// Every weight of `m` (moving statistics included), flattened.
fn all_weights(m: &Sequential) -> Vec<f32> {
    m.named_weights()
        .iter()
        .flat_map(|(_, t)| read(t))
        .collect()
}

#[test]
fn synchronized_batch_norm_makes_a_mirrored_step_the_whole_batch_step() {
    let rt = common::builder().virtual_cpus(2).build().expect("2 CPUs");
    let cpus = rt.list_logical_devices("CPU").expect("CPUs");
    let mut sets = vec![cpus.clone()];
    if let Some(gpu) = rt.list_logical_devices("GPU").expect("GPUs").first() {
        sets.push(vec![cpus[0].clone(), gpu.clone()]);
    }
    // Halves with different statistics: the first half's pixels tripled.
    let data: Vec<(Tensor, Tensor)> = batches(16 * 3, 16, &cpus[0])
        .into_iter()
        .map(|(x, y)| {
            let mut v = read(&x);
            let half = v.len() / 2;
            v[..half].iter_mut().for_each(|p| *p *= 3.0);
            (on(&cpus[0], &v, x.shape()), y)
        })
        .collect();
    for replicas in sets {
        let mut single = scoped(&replicas[0], || conv_bn_model(5, true)).expect("builds");
        let strategy = MirroredStrategy::with_devices(&replicas).expect("a strategy");
        let mirrored = |synchronized| {
            strategy
                .scope(|| conv_bn_model(5, synchronized))
                .expect("one scope")
                .expect("builds")
        };
        let (mut synced, mut unsynced) = (mirrored(true), mirrored(false));
        for (step, (x, y)) in data.iter().enumerate() {
            let want = single.train_on_batch(x, y).expect("one device");
            let got = synced.train_on_batch(x, y).expect("synchronized");
            unsynced.train_on_batch(x, y).expect("unsynchronized");
            let what = format!("{replicas:?} step {step}");
            common::assert_close(&format!("{what}: loss"), &[got], &[want], 1e-5);
            common::assert_close(
                &format!("{what}: weights and moving statistics"),
                &all_weights(&synced),
                &all_weights(&single),
                1e-5,
            );
        }
        // The test tells the two apart: each replica's own statistics give other weights.
        let apart = all_weights(&unsynced)
            .iter()
            .zip(all_weights(&single))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            apart > 1e-3,
            "{replicas:?}: unsynchronized is as close ({apart})"
        );
    }
}

#[test]
fn a_pipelined_model_normalizes_per_device() {
    let rt = common::builder().virtual_cpus(2).build().expect("2 CPUs");
    let mut devs = rt.list_logical_devices("CPU").expect("CPUs");
    if let Some(gpu) = rt.list_logical_devices("GPU").expect("GPUs").first() {
        devs[1] = gpu.clone();
    }
    let mut m = Sequential::with_seed(4);
    m.add_on(
        &devs[0],
        Conv2D::new(4, 3)
            .padding(Padding::Same)
            .activation(Activation::Relu)
            .input_shape(&[8, 8, 1]),
    )
    .expect("conv");
    m.add_on(&devs[0], BatchNormalization::new().momentum(0.9))
        .expect("bn");
    m.add_on(&devs[1], Flatten::new()).expect("flatten");
    m.add_on(&devs[1], Dense::new(8).activation(Activation::Relu))
        .expect("dense");
    m.add_on(&devs[1], BatchNormalization::new()).expect("bn 2");
    m.add_on(&devs[1], Dropout::new(0.1)).expect("dropout");
    m.add_on(&devs[1], Dense::new(3).activation(Activation::Softmax))
        .expect("out");
    let mut m = compiled(m, Sgd::new(0.1).into()).expect("compile");
    m.set_pipeline(Pipeline::gpipe(2)).expect("pipeline");
    let data = batches(16 * 20, 16, &devs[0]);
    let losses: Vec<f32> = data
        .iter()
        .map(|(x, y)| m.train_on_batch(x, y).expect("a pipelined step"))
        .collect();
    falls("pipeline", &losses);
    for (name, t) in m.named_weights() {
        if name.ends_with("moving_variance") {
            assert!(
                read(t).iter().all(|v| v.is_finite() && *v != 1.0),
                "{name} moved"
            );
        }
    }
    let eval = m.predict(&data[0].0).expect("predict");
    assert!(read(&eval).iter().all(|v| v.is_finite()));
}

#[test]
fn a_mixed_float16_model_with_batch_norm_and_dropout_trains_on_float16_gpus() {
    let rt = runtime();
    let mut tested = 0;
    for dev in common::all_devices(
        &rt,
        "a_mixed_float16_model_with_batch_norm_and_dropout_trains",
    ) {
        if !dev.has_f16() || dev.device_type() != DeviceKind::Gpu {
            continue;
        }
        let mixed = Policy::MIXED_FLOAT16;
        let mut m = Sequential::with_seed(6);
        let _scope = dev.scope();
        m.add(
            Conv2D::new(4, 3)
                .padding(Padding::Same)
                .activation(Activation::Relu)
                .dtype_policy(mixed)
                .input_shape(&[8, 8, 1]),
        )
        .expect("conv");
        m.add(BatchNormalization::new().momentum(0.9).dtype_policy(mixed))
            .expect("bn");
        m.add(Dropout::new(0.2).dtype_policy(mixed))
            .expect("dropout");
        m.add(Flatten::new().dtype_policy(mixed)).expect("flatten");
        m.add(
            Dense::new(3)
                .activation(Activation::Softmax)
                .dtype_policy(Policy::FLOAT32),
        )
        .expect("out");
        let mut m = compiled(m, Sgd::new(0.1).into()).expect("compile");
        let data = batches(16 * 20, 16, &dev);
        let losses: Vec<f32> = data
            .iter()
            .map(|(x, y)| m.train_on_batch(x, y).expect("a mixed step"))
            .collect();
        falls(&format!("{dev} mixed_float16"), &losses);
        // The moving statistics stay float32 variables.
        assert_eq!(m.named_weights()[4].1.dtype(), DType::F32);
        tested += 1;
    }
    if tested == 0 {
        eprintln!("no float16 adapter: the mixed_float16 model was not trained");
    }
}

#[test]
fn synchronized_batch_norm_trains_in_mixed_float16_on_two_virtual_gpus() {
    let probe = runtime();
    let physical = probe
        .list_logical_devices("GPU")
        .expect("GPUs")
        .into_iter()
        .position(|d| d.has_f16());
    let Some(index) = physical else {
        eprintln!("no float16 adapter: synchronized mixed_float16 batch norm was not trained");
        return;
    };
    drop(probe);
    let rt = common::builder()
        .virtual_gpus(index, &[256, 256])
        .build()
        .expect("two virtual GPUs");
    let gpus: Vec<LogicalDevice> = rt
        .list_logical_devices("GPU")
        .expect("GPUs")
        .into_iter()
        .filter(|d| d.has_f16())
        .take(2)
        .collect();
    assert_eq!(gpus.len(), 2, "two float16 logical GPUs");
    let mixed = Policy::MIXED_FLOAT16;
    let model = || {
        let bn = BatchNormalization::new()
            .momentum(0.9)
            .synchronized(true)
            .dtype_policy(mixed);
        let mut m = Sequential::with_seed(9);
        m.add(
            Conv2D::new(4, 3)
                .padding(Padding::Same)
                .activation(Activation::Relu)
                .dtype_policy(mixed)
                .input_shape(&[8, 8, 1]),
        )?;
        m.add(bn)?;
        m.add(Flatten::new().dtype_policy(mixed))?;
        m.add(
            Dense::new(3)
                .activation(Activation::Softmax)
                .dtype_policy(Policy::FLOAT32),
        )?;
        compiled(m, Sgd::new(0.1).into())
    };
    let strategy = MirroredStrategy::with_devices(&gpus).expect("a strategy");
    let mut mirrored = strategy.scope(model).expect("scope").expect("builds");
    let mut single = scoped(&gpus[0], model).expect("builds");
    for (step, (x, y)) in batches(16 * 6, 16, &gpus[0]).iter().enumerate() {
        let got = mirrored
            .train_on_batch(x, y)
            .expect("a synchronized float16 step");
        let want = single.train_on_batch(x, y).expect("one device");
        // float16 activations: the two sum in different orders.
        common::assert_close(&format!("step {step}: loss"), &[got], &[want], 2e-2);
    }
}

#[test]
fn backup_and_restore_brings_back_the_moving_statistics() {
    let rt = runtime();
    let cpu = rt.cpu().expect("CPU:0");
    let dir = std::env::temp_dir().join(format!("anygpu-bn-backup-{}", std::process::id()));
    let (x, y) = synthetic(64, 8);
    let data = || {
        anygpu::data::Dataset::from_tensor_slices(x.clone(), &[8, 8, 1], y.clone())
            .expect("a dataset")
            .batch(16, false)
    };
    let mut first = scoped(&cpu, || {
        compiled(conv_bn_dropout_model(7)?, Sgd::new(0.1).into())
    })
    .expect("the model builds");
    let mut backup = anygpu::nn::BackupAndRestore::new(&dir).delete_checkpoint(false);
    first
        .fit_with_callbacks(&data(), 1, None, None, &mut [&mut backup])
        .expect("fit");
    let mut resumed = scoped(&cpu, || {
        compiled(conv_bn_dropout_model(8)?, Sgd::new(0.1).into())
    })
    .expect("the model builds");
    let mut backup = anygpu::nn::BackupAndRestore::new(&dir).delete_checkpoint(false);
    resumed
        .fit_with_callbacks(&data(), 1, None, None, &mut [&mut backup])
        .expect("the restore");
    assert_eq!(backup.restored_epochs(), Some(1));
    // Every weight, the moving statistics included.
    assert_eq!(
        resumed.get_weights().expect("weights"),
        first.get_weights().expect("weights")
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Conv2D (no activation) → `bn` → `act` → Flatten → Dense (softmax), 8×8×1 → 3, every layer
/// but the last under `policy`.
fn conv_bn_act(
    dev: &LogicalDevice,
    policy: Policy,
    bn: BatchNormalization,
    act: Box<dyn Layer>,
) -> Sequential {
    conv_bias_bn_act(dev, policy, false, bn, act)
}

/// [`conv_bn_act`] with a bias in the convolution or not.
fn conv_bias_bn_act(
    dev: &LogicalDevice,
    policy: Policy,
    use_bias: bool,
    bn: BatchNormalization,
    act: Box<dyn Layer>,
) -> Sequential {
    let mut m = Sequential::with_seed(3);
    let conv = Conv2D::new(4, 3)
        .padding(Padding::Same)
        .use_bias(use_bias)
        .dtype_policy(policy)
        .input_shape(&[8, 8, 1]);
    let layers: [Box<dyn Layer>; 5] = [
        Box::new(conv),
        Box::new(bn.dtype_policy(policy)),
        act,
        Box::new(Flatten::new().dtype_policy(policy)),
        Box::new(Dense::new(3).activation(Activation::Softmax)),
    ];
    for layer in layers {
        m.add_boxed(dev, layer).expect("add");
    }
    compiled(m, Sgd::new(0.1).into()).expect("compile")
}

/// A ReLU after a BatchNormalization runs inside it (one pass each way, the mask recomputed
/// from the input); a ReLU with a clip it never reaches is the same function but runs as its
/// own layer. Trained side by side, the two give the same losses, weights, moving statistics
/// and predictions on every device, with and without gamma and beta, and under
/// mixed_float16 on float16 GPUs.
#[test]
fn a_relu_after_batch_norm_trains_as_its_own_layer_does() {
    let rt = runtime();
    let bns = || {
        [
            BatchNormalization::new().momentum(0.9),
            BatchNormalization::new().center(false).scale(false),
        ]
    };
    for dev in common::all_devices(&rt, "a_relu_after_batch_norm_trains_as_its_own_layer_does") {
        let data = batches(16 * 4, 16, &dev);
        let mut policies = vec![(Policy::FLOAT32, 1e-6)];
        if dev.has_f16() && dev.device_type() == DeviceKind::Gpu {
            policies.push((Policy::MIXED_FLOAT16, 1e-3));
        }
        for (policy, tol) in policies {
            for (i, (bn, twin)) in bns().into_iter().zip(bns()).enumerate() {
                let fused: Box<dyn Layer> = match i {
                    0 => Box::new(ReLU::new().dtype_policy(policy)),
                    _ => Box::new(ActivationLayer::new(Activation::Relu).dtype_policy(policy)),
                };
                let separate = Box::new(ReLU::new().max_value(f32::MAX).dtype_policy(policy));
                let mut a = conv_bn_act(&dev, policy, bn, fused);
                let mut b = conv_bn_act(&dev, policy, twin, separate);
                for (step, (x, y)) in data.iter().enumerate() {
                    let what = format!("{dev} {policy:?} case {i} step {step}");
                    let (la, lb) = (a.train_on_batch(x, y), b.train_on_batch(x, y));
                    common::assert_close(&what, &[la.expect("fused")], &[lb.expect("twin")], tol);
                    common::assert_close(&what, &all_weights(&a), &all_weights(&b), tol);
                }
                let (x, _) = &data[0];
                let (pa, pb) = (a.predict(x).expect("fused"), b.predict(x).expect("twin"));
                let what = format!("{dev} {policy:?} case {i}: predict");
                common::assert_close(&what, &read(&pa), &read(&pb), tol);
            }
        }
    }
}

/// The ops a runtime places, by the placement log's names, from [`OpLog::on`] on.
struct OpLog(Arc<Mutex<Vec<&'static str>>>);

impl OpLog {
    /// Logs every op `rt` places (until its callback is replaced).
    fn on(rt: &Runtime) -> OpLog {
        let ops = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&ops);
        rt.set_placement_callback(Some(move |r: &PlacementRecord| {
            sink.lock().expect("the log").push(r.op)
        }));
        rt.set_log_device_placement(true);
        OpLog(ops)
    }

    /// How many times each of `names` was placed since the last call; the log starts afresh.
    fn take<const N: usize>(&self, names: &[&str; N]) -> [usize; N] {
        let ops = std::mem::take(&mut *self.0.lock().expect("the log"));
        names.map(|name| ops.iter().filter(|&&op| op == name).count())
    }
}

/// On CPU:0, a first Conv2D under a BatchNormalization and its ReLU takes its kernel (and
/// bias) gradient in one op with the normalization's (`dz` formed where the kernel gradient
/// reads it, never written whole); with the ReLU as its own layer the three run as their own
/// ops. Both give the same loss and gradients, with and without the convolution's bias, and
/// with and without gamma and beta.
#[test]
fn a_first_conv_takes_its_kernel_gradient_through_the_batch_norm_after_it() {
    let rt = runtime();
    let cpu = rt.cpu().expect("CPU:0");
    let (x, y) = batches(16, 16, &cpu).remove(0);
    let ops = OpLog::on(&rt);
    let bns = || {
        [
            BatchNormalization::new(),
            BatchNormalization::new().center(false).scale(false),
        ]
    };
    for use_bias in [false, true] {
        for (i, (bn, twin)) in bns().into_iter().zip(bns()).enumerate() {
            let fused = Box::new(ReLU::new());
            let separate = Box::new(ReLU::new().max_value(f32::MAX));
            let f32_ = Policy::FLOAT32;
            let mut a = conv_bias_bn_act(&cpu, f32_, use_bias, bn, fused);
            let mut b = conv_bias_bn_act(&cpu, f32_, use_bias, twin, separate);
            let ran = |m: &mut Sequential| {
                ops.take(&[]);
                let out = m.loss_and_gradients(&x, &y).expect("gradients");
                (
                    out,
                    ops.take(&["FusedBatchNormGradConv2DBackpropFilter"])[0],
                )
            };
            let what = format!("bias {use_bias}, case {i}");
            let ((loss_a, grads_a), fused_a) = ran(&mut a);
            let ((loss_b, grads_b), fused_b) = ran(&mut b);
            assert_eq!((fused_a, fused_b), (1, 0), "{what}: the fused op ran once");
            common::assert_close(&what, &[loss_a], &[loss_b], 1e-6);
            assert_eq!(grads_a.len(), grads_b.len(), "{what}");
            for (g, (ga, gb)) in grads_a.iter().zip(&grads_b).enumerate() {
                let (ga, gb) = (read(ga), read(gb));
                assert!(
                    ga.iter().any(|&v| v != 0.0),
                    "{what}: gradient {g} all zeros"
                );
                common::assert_close(&format!("{what}: gradient {g}"), &ga, &gb, 1e-5);
            }
        }
    }
    rt.set_log_device_placement(false);
}

/// On CPU:0, a BatchNormalization with a ReLU and a GlobalAveragePooling2D after it runs the
/// three as one op each way (the normalized values never written); with the ReLU as its own
/// layer they run as their own ops. Both give the same losses, weights, moving statistics and
/// predictions, with and without gamma and beta.
#[test]
fn a_batch_norm_relu_and_global_average_pooling_train_as_one_op() {
    let rt = runtime();
    let cpu = rt.cpu().expect("CPU:0");
    let data = batches(16 * 3, 16, &cpu);
    let ops = OpLog::on(&rt);
    let model = |bn: BatchNormalization, act: Box<dyn Layer>| {
        let mut m = Sequential::with_seed(4);
        let conv = Conv2D::new(6, 3)
            .padding(Padding::Same)
            .use_bias(false)
            .input_shape(&[8, 8, 1]);
        let layers: [Box<dyn Layer>; 5] = [
            Box::new(conv),
            Box::new(bn),
            act,
            Box::new(GlobalAveragePooling2D::new()),
            Box::new(Dense::new(3).activation(Activation::Softmax)),
        ];
        for layer in layers {
            m.add_boxed(&cpu, layer).expect("add");
        }
        compiled(m, Sgd::new(0.1).into()).expect("compile")
    };
    let bns = || {
        [
            BatchNormalization::new().momentum(0.9),
            BatchNormalization::new().center(false).scale(false),
        ]
    };
    let fused_ops = || ops.take(&["FusedBatchNormReluMean", "FusedBatchNormReluMeanGrad"]);
    for (i, (bn, twin)) in bns().into_iter().zip(bns()).enumerate() {
        let mut a = model(bn, Box::new(ReLU::new()));
        let mut b = model(twin, Box::new(ReLU::new().max_value(f32::MAX)));
        for (step, (x, y)) in data.iter().enumerate() {
            let what = format!("case {i} step {step}");
            fused_ops();
            let la = a.train_on_batch(x, y).expect("fused");
            assert_eq!(fused_ops(), [1, 1], "{what}: one op each way");
            let lb = b.train_on_batch(x, y).expect("twin");
            assert_eq!(fused_ops(), [0, 0], "{what}: the layers' own ops");
            common::assert_close(&what, &[la], &[lb], 1e-6);
            common::assert_close(&what, &all_weights(&a), &all_weights(&b), 1e-6);
        }
        let (x, _) = &data[0];
        let (pa, pb) = (a.predict(x).expect("fused"), b.predict(x).expect("twin"));
        common::assert_close(&format!("case {i}: predict"), &read(&pa), &read(&pb), 1e-6);
    }
    rt.set_log_device_placement(false);
}

/// On CPU:0, a BatchNormalization and a ReLU before a strided Conv2D: the normalization takes
/// its statistics only and the convolution normalizes its input where it copies it, in its
/// forward pass and its kernel gradient (whichever kernels run); with the ReLU as a layer of
/// its own the layers run their own ops. Both give the same losses,
/// weights, moving statistics and predictions, for a convolution with a bias and an
/// activation and for one with a BatchNormalization after it.
#[test]
fn a_strided_conv_normalizes_the_batch_norm_before_it_as_it_reads_it() {
    let rt = runtime();
    let cpu = rt.cpu().expect("CPU:0");
    let data = batches(16 * 3, 16, &cpu);
    let ops = OpLog::on(&rt);
    let model = |head: usize, act: Box<dyn Layer>| {
        let mut m = Sequential::with_seed(5);
        let stem = Conv2D::new(8, 3)
            .padding(Padding::Same)
            .use_bias(false)
            .input_shape(&[8, 8, 1]);
        let strided = Conv2D::new(16, 3).strides(2).padding(Padding::Same);
        let mut layers: Vec<Box<dyn Layer>> = vec![
            Box::new(stem),
            Box::new(BatchNormalization::new().momentum(0.9)),
            act,
        ];
        if head == 0 {
            layers.push(Box::new(strided.activation(Activation::Relu)));
            layers.push(Box::new(Flatten::new()));
        } else {
            layers.push(Box::new(strided.use_bias(false)));
            layers.push(Box::new(BatchNormalization::new()));
            layers.push(Box::new(ReLU::new()));
            layers.push(Box::new(GlobalAveragePooling2D::new()));
        }
        layers.push(Box::new(Dense::new(3).activation(Activation::Softmax)));
        for layer in layers {
            m.add_boxed(&cpu, layer).expect("add");
        }
        compiled(m, Sgd::new(0.1).into()).expect("compile")
    };
    let fused_ops = || {
        ops.take(&[
            "FusedBatchNormStatistics",
            "FusedBatchNormReluConv2D",
            "FusedBatchNormReluConv2DBackpropFilter",
        ])
    };
    for head in 0..2 {
        let mut a = model(head, Box::new(ReLU::new()));
        let mut b = model(head, Box::new(ReLU::new().max_value(f32::MAX)));
        for (step, (x, y)) in data.iter().enumerate() {
            let what = format!("head {head} step {step}");
            fused_ops();
            let la = a.train_on_batch(x, y).expect("fused");
            assert_eq!(fused_ops(), [1; 3], "{what}: the convolution normalizes");
            let lb = b.train_on_batch(x, y).expect("twin");
            assert_eq!(fused_ops(), [0; 3], "{what}: the layers' own ops");
            assert_eq!(la, lb, "{what}: the same loss");
            assert_eq!(all_weights(&a), all_weights(&b), "{what}: the same weights");
        }
        let (x, _) = &data[0];
        let (pa, pb) = (a.predict(x).expect("fused"), b.predict(x).expect("twin"));
        assert_eq!(read(&pa), read(&pb), "head {head}: predict");
    }
    rt.set_log_device_placement(false);
}

/// A custom identity layer that names itself an activation and keeps nothing for its
/// backward pass (which needs nothing).
#[derive(Debug, Clone)]
struct Identity;

impl Layer for Identity {
    fn class_name(&self) -> &'static str {
        "Identity"
    }
    fn base_name(&self) -> &'static str {
        "identity"
    }
    fn compute_output_shape(&self, input_shape: &[usize]) -> anygpu::Result<Vec<usize>> {
        Ok(input_shape.to_vec())
    }
    fn build(&mut self, _: &[usize], _: u64, _: &LogicalDevice) -> anygpu::Result<()> {
        Ok(())
    }
    fn weights(&self) -> Vec<(&'static str, &Tensor)> {
        Vec::new()
    }
    fn set_weight(&mut self, index: usize, _: Tensor) -> anygpu::Result<()> {
        Err(anygpu::Error::InvalidArgument(format!("no weight {index}")))
    }
    fn as_activation(&self) -> Option<ActivationFn> {
        Some(ActivationFn::Linear)
    }
    fn forward(&self, x: &Tensor) -> anygpu::Result<(Tensor, Vec<Tensor>)> {
        Ok((x.clone(), Vec::new()))
    }
    fn backward(
        &self,
        _: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> anygpu::Result<(Option<Tensor>, Vec<Tensor>)> {
        Ok((need_dx.then(|| dy.clone()), Vec::new()))
    }
    fn boxed_clone(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }
}

/// An activation layer that keeps nothing after a layer that does not run it (a
/// BatchNormalization runs only a ReLU) goes backward on its own: the model trains as it does
/// with a linear activation layer there.
#[test]
fn an_activation_layer_that_keeps_nothing_goes_backward_on_its_own() {
    let rt = runtime();
    let cpu = rt.list_logical_devices("CPU").expect("CPUs").remove(0);
    let bn = || BatchNormalization::new().momentum(0.9);
    let mut a = conv_bn_act(&cpu, Policy::FLOAT32, bn(), Box::new(Identity));
    let linear = Box::new(ActivationLayer::new(Activation::Linear));
    let mut b = conv_bn_act(&cpu, Policy::FLOAT32, bn(), linear);
    for (step, (x, y)) in batches(16 * 3, 16, &cpu).iter().enumerate() {
        let la = a
            .train_on_batch(x, y)
            .expect("a step through the identity layer");
        let lb = b
            .train_on_batch(x, y)
            .expect("a step through a linear activation");
        let what = format!("step {step}");
        common::assert_close(&what, &[la], &[lb], 0.0);
        common::assert_close(&what, &all_weights(&a), &all_weights(&b), 0.0);
    }
}
