//! Keras' losses on float targets and the metrics beyond accuracy: the kernels against the f64
//! oracle on CPU:0 and every GPU adapter, then models compiled with each loss training on
//! CPU:0 and the GPUs, mirrored and pipelined, and the errors for targets of the wrong kind.

mod common;

use anygpu::data::Dataset;
use anygpu::distribute::MirroredStrategy;
use anygpu::nn::{Activation, Dense, Loss, Metric, Pipeline, Sequential, Sgd, Verbosity};
use anygpu::ops::loss::{self as ol, LossKind, LossParams, MetricKind, OutputActivation};
use anygpu::ops::reference::{self as r, assert_close, to_f64};
use anygpu::{Runtime, Tensor};

use common::values;

fn runtime() -> Runtime {
    common::builder()
        .memory_growth(true)
        .build()
        .expect("the runtime initializes")
}

const KINDS: [LossKind; 6] = [
    LossKind::CategoricalLogits,
    LossKind::CategoricalProbs,
    LossKind::BinaryLogits,
    LossKind::BinaryProbs,
    LossKind::MeanSquared,
    LossKind::MeanAbsolute,
];
const ACTS: [OutputActivation; 3] = [
    OutputActivation::Identity,
    OutputActivation::Softmax,
    OutputActivation::Sigmoid,
];

/// Inputs a loss kind reads: logits, or probabilities (some on and past the clip bounds).
fn inputs(kind: LossKind, rows: usize, cols: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let raw = values(rows * cols, seed);
    let z: Vec<f32> = match kind {
        LossKind::CategoricalProbs => raw.iter().map(|v| 0.5 * v + 0.55).collect(),
        LossKind::BinaryProbs => raw
            .iter()
            .enumerate()
            .map(|(i, v)| match i % 11 {
                0 => 0.0,
                5 => 1.0,
                _ => 0.5 * v + 0.5,
            })
            .collect(),
        _ => raw.iter().map(|v| 4.0 * v).collect(),
    };
    let y: Vec<f32> = match kind {
        LossKind::CategoricalLogits | LossKind::CategoricalProbs => (0..rows * cols)
            .map(|i| f32::from(u8::from(i % cols == (i / cols * 7) % cols)))
            .collect(),
        LossKind::BinaryLogits | LossKind::BinaryProbs => values(rows * cols, seed + 1)
            .iter()
            .map(|v| if *v > 0.0 { 1.0 } else { 0.0 })
            .collect(),
        _ => values(rows * cols, seed + 1),
    };
    (z, y)
}

#[test]
fn loss_kernels_match_the_oracle_on_every_device() {
    let rt = runtime();
    for dev in common::all_devices(&rt, "loss_kernels_match_the_oracle_on_every_device") {
        let _on = dev.scope();
        for (i, kind) in KINDS.into_iter().enumerate() {
            for act in ACTS {
                for (rows, cols, ls) in [(5, 4, 0.0), (67, 10, 0.1), (3, 1, 0.2)] {
                    let (z, y) = inputs(kind, rows, cols, 10 + i as u64);
                    let p = LossParams {
                        rows,
                        cols,
                        kind,
                        act,
                        label_smoothing: ls,
                        row_scale: 0.5,
                        grad_scale: 1.0 / rows as f32,
                    };
                    let zt = Tensor::from_slice_on(&z, &[rows, cols], &dev).expect("z");
                    let yt = Tensor::from_slice_on(&y, &[rows, cols], &dev).expect("y");
                    let (loss, dz) = ol::dense_loss(&zt, &yt, p).expect("dense_loss");
                    let (want_loss, want_dz) = r::dense_loss(&to_f64(&z), &to_f64(&y), &p);
                    let what = format!("{kind:?} {act:?} {rows}x{cols} ls {ls} on {dev}");
                    assert_close(
                        &loss.to_vec::<f32>().expect("loss"),
                        &want_loss,
                        1e-4,
                        &what,
                    );
                    assert_close(&dz.to_vec::<f32>().expect("dz"), &want_dz, 1e-4, &what);
                }
            }
        }
    }
}

#[test]
fn metric_kernels_match_the_oracle_on_every_device() {
    let rt = runtime();
    let (rows, cols) = (37, 6);
    let z: Vec<f32> = values(rows * cols, 3).iter().map(|v| 3.0 * v).collect();
    let onehot: Vec<f32> = (0..rows * cols)
        .map(|i| f32::from(u8::from(i % cols == (i / cols * 5) % cols)))
        .collect();
    let labels: Vec<i32> = (0..rows as i32).map(|i| (i * 5) % cols as i32).collect();
    for dev in common::all_devices(&rt, "metric_kernels_match_the_oracle_on_every_device") {
        let _on = dev.scope();
        let zt = Tensor::from_slice_on(&z, &[rows, cols], &dev).expect("z");
        let yt = Tensor::from_slice_on(&onehot, &[rows, cols], &dev).expect("y");
        let lt = Tensor::from_slice_on(&labels, &[rows], &dev).expect("labels");
        for act in ACTS {
            for kind in [
                MetricKind::SparseTopK(1),
                MetricKind::SparseTopK(3),
                MetricKind::Categorical,
                MetricKind::Binary(0.5),
                MetricKind::Binary(0.0),
                MetricKind::MeanSquared,
            ] {
                let targets = match kind {
                    MetricKind::SparseTopK(_) => &lt,
                    _ => &yt,
                };
                let got = ol::metric_rows(&zt, targets, kind, act).expect("metric_rows");
                let want = r::metric_rows(
                    &to_f64(&z),
                    &to_f64(&onehot),
                    &labels,
                    (rows, cols),
                    kind,
                    act,
                );
                let what = format!("{kind:?} {act:?} on {dev}");
                assert_close(&got.to_vec::<f32>().expect("read"), &want, 1e-6, &what);
            }
        }
    }
}

/// TF's `in_top_k`: classes tied at the k-th value are all in; out-of-range labels and rows with
/// a non-finite score are never in — on every device.
#[test]
fn top_k_follows_in_top_k_ties_on_every_device() {
    let rt = runtime();
    let z = [
        0.3f32,
        0.3,
        0.3,
        0.1, // three-way tie for first
        0.1,
        0.2,
        0.3,
        0.4, // distinct
        f32::NAN,
        0.2,
        0.3,
        0.4, // a NaN in the row
        0.1,
        0.2,
        0.3,
        0.4, // label out of range
    ];
    let labels = [2i32, 1, 3, 4];
    for dev in common::all_devices(&rt, "top_k_follows_in_top_k_ties_on_every_device") {
        let _on = dev.scope();
        let zt = Tensor::from_slice_on(&z, &[4, 4], &dev).expect("z");
        let lt = Tensor::from_slice_on(&labels, &[4], &dev).expect("labels");
        let top = |k| {
            ol::metric_rows(
                &zt,
                &lt,
                MetricKind::SparseTopK(k),
                OutputActivation::Identity,
            )
            .and_then(|t| t.to_vec::<f32>())
            .expect("top k")
        };
        assert_eq!(top(1), [1.0, 0.0, 0.0, 0.0], "k = 1 on {dev}");
        assert_eq!(top(3), [1.0, 1.0, 0.0, 0.0], "k = 3 on {dev}");
        assert_eq!(top(2), [1.0, 0.0, 0.0, 0.0], "k = 2 on {dev}");
    }
}

#[test]
fn sigmoid_matches_the_oracle_on_every_device() {
    let rt = runtime();
    let x: Vec<f32> = values(300, 5).iter().map(|v| 30.0 * v).collect();
    let want: Vec<f64> = x
        .iter()
        .map(|&v| 1.0 / (1.0 + (-f64::from(v)).exp()))
        .collect();
    for dev in common::all_devices(&rt, "sigmoid_matches_the_oracle_on_every_device") {
        let _on = dev.scope();
        let t = Tensor::from_slice_on(&x, &[300], &dev).expect("x");
        let y = ol::sigmoid(&t)
            .and_then(|y| y.to_vec::<f32>())
            .expect("sigmoid");
        assert_close(&y, &want, 1e-6, &format!("sigmoid on {dev}"));
    }
}

/// A regression/classification problem for a 4-feature input: one-hot classes by the sign
/// pattern of the first two features, and a smooth target.
fn problem(n: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let x = values(n * 4, 21);
    let mut onehot = Vec::with_capacity(n * 3);
    let mut binary = Vec::with_capacity(n * 2);
    let mut regression = Vec::with_capacity(n * 2);
    for i in 0..n {
        let f = &x[i * 4..i * 4 + 4];
        let class = usize::from(f[0] > 0.0) + usize::from(f[1] > 0.3);
        onehot.extend((0..3).map(|c| f32::from(u8::from(c == class))));
        binary.extend([
            f32::from(u8::from(f[0] > 0.0)),
            f32::from(u8::from(f[2] > f[3])),
        ]);
        regression.extend([0.5 * f[0] - f[1], f[2] * 0.8 + 0.1]);
    }
    (x, onehot, binary, regression)
}

/// A model for `loss`: two dense layers, the last with `units` and `last`.
fn model(units: usize, last: Activation) -> Sequential {
    let mut m = Sequential::with_seed(5);
    m.add(
        Dense::new(16)
            .activation(Activation::Relu)
            .input_shape(&[4]),
    )
    .expect("dense");
    m.add(Dense::new(units).activation(last)).expect("dense");
    m.set_verbose(Verbosity::Silent);
    m
}

struct Setup {
    loss: Loss,
    last: Activation,
    metrics: Vec<Metric>,
    /// 0 one-hot, 1 binary, 2 regression.
    targets: usize,
}

fn setups() -> Vec<Setup> {
    let cce = |from_logits, label_smoothing| Loss::CategoricalCrossentropy {
        from_logits,
        label_smoothing,
    };
    let bce = |from_logits, label_smoothing| Loss::BinaryCrossentropy {
        from_logits,
        label_smoothing,
    };
    vec![
        Setup {
            loss: cce(false, 0.0),
            last: Activation::Softmax,
            metrics: vec![Metric::Accuracy, Metric::CategoricalAccuracy],
            targets: 0,
        },
        Setup {
            loss: cce(true, 0.1),
            last: Activation::Linear,
            metrics: vec![Metric::CategoricalAccuracy],
            targets: 0,
        },
        Setup {
            loss: bce(false, 0.0),
            last: Activation::Sigmoid,
            metrics: vec![Metric::BinaryAccuracy { threshold: 0.5 }],
            targets: 1,
        },
        Setup {
            loss: bce(true, 0.1),
            last: Activation::Linear,
            metrics: vec![Metric::BinaryAccuracy { threshold: 0.0 }],
            targets: 1,
        },
        Setup {
            loss: Loss::MeanSquaredError,
            last: Activation::Linear,
            metrics: vec![Metric::MeanSquaredError],
            targets: 2,
        },
        Setup {
            loss: Loss::MeanAbsoluteError,
            last: Activation::Linear,
            metrics: vec![Metric::MeanSquaredError],
            targets: 2,
        },
    ]
}

fn dataset(s: &Setup, n: usize) -> Dataset {
    let (x, onehot, binary, regression) = problem(n);
    let (y, shape) = match s.targets {
        0 => (onehot, [3]),
        1 => (binary, [2]),
        _ => (regression, [2]),
    };
    Dataset::from_tensor_slices_with_targets(x, &[4], y, &shape)
        .expect("dataset")
        .batch(16, false)
}

#[test]
fn every_loss_trains_on_cpu_and_every_gpu() {
    let rt = runtime();
    for dev in common::all_devices(&rt, "every_loss_trains_on_cpu_and_every_gpu") {
        let _on = dev.scope();
        for s in setups() {
            let units = [3, 2, 2][s.targets];
            let mut m = model(units, s.last);
            m.compile(s.loss, Sgd::new(0.2), &s.metrics)
                .expect("compile");
            let data = dataset(&s, 96);
            let before = m.evaluate(&data, None).expect("evaluate");
            let h = m.fit(&data, 12, None, None).expect("fit");
            let after = m.evaluate(&data, None).expect("evaluate");
            let what = format!("{} ({}) on {dev}", s.loss, s.last);
            assert!(
                after.loss < 0.8 * before.loss,
                "{what}: loss {} -> {}",
                before.loss,
                after.loss
            );
            for metric in &s.metrics {
                let name = metric.name();
                let series = h.get(name).unwrap_or_else(|| panic!("{what}: no {name}"));
                assert_eq!(series.len(), 12, "{what}: {name}");
                assert!(series.iter().all(|v| v.is_finite()), "{what}: {name}");
            }
            if s.targets < 2 {
                let last = h.get(s.metrics[0].name()).and_then(|v| v.last().copied());
                assert!(last > Some(0.7), "{what}: {:?} {last:?}", s.metrics[0]);
            }
            let probs = m
                .predict(&Tensor::from_vec(values(8, 3), &[2, 4]).expect("x"))
                .and_then(|p| p.to_vec::<f32>())
                .expect("predict");
            if s.last == Activation::Sigmoid {
                assert!(probs.iter().all(|p| (0.0..=1.0).contains(p)), "{what}");
            }
        }
    }
}

/// `fit` with one loss gives Keras' numbers: the mean of per-example losses, the metrics
/// averaged over examples, and the step's gradient through the folded sigmoid.
#[test]
fn history_reports_metrics_under_keras_names() {
    let rt = runtime();
    let cpu = rt.cpu().expect("cpu");
    let _on = cpu.scope();
    let mut m = model(3, Activation::Softmax);
    let s = &setups()[0];
    m.compile(
        s.loss,
        Sgd::new(0.1),
        &[
            Metric::Accuracy,
            Metric::CategoricalAccuracy,
            Metric::MeanSquaredError,
        ],
    )
    .expect("compile");
    assert_eq!(
        m.metrics_names(),
        ["accuracy", "categorical_accuracy", "mean_squared_error"]
    );
    let data = dataset(s, 40);
    let h = m.fit(&data, 2, None, Some(&data)).expect("fit");
    assert_eq!(h.accuracy.len(), 2);
    for key in [
        "categorical_accuracy",
        "mean_squared_error",
        "val_categorical_accuracy",
        "val_mean_squared_error",
    ] {
        assert_eq!(h.get(key).map(<[f64]>::len), Some(2), "{key}");
    }
    // "accuracy" resolves to categorical accuracy with one-hot targets.
    let e = m.evaluate(&data, None).expect("evaluate");
    assert_eq!(e.accuracy, e.metrics.get("categorical_accuracy").copied());
}

#[test]
fn targets_of_the_wrong_kind_are_refused_with_the_loss_that_fits() {
    let rt = runtime();
    let cpu = rt.cpu().expect("cpu");
    let _on = cpu.scope();
    let mut m = model(3, Activation::Softmax);
    m.compile(Loss::categorical_crossentropy(), Sgd::default(), &[])
        .expect("compile");
    let x = Tensor::from_vec(values(8, 1), &[2, 4]).expect("x");
    let labels = Tensor::from_vec(vec![0i32, 2], &[2]).expect("labels");
    let err = m
        .train_step(&x, &labels)
        .expect_err("int labels")
        .to_string();
    assert!(err.contains("sparse_categorical_crossentropy"), "{err}");
    assert!(err.contains("one-hot"), "{err}");
    let wrong = Tensor::from_vec(vec![0.0f32; 4], &[2, 2]).expect("y");
    assert!(m.train_step(&x, &wrong).is_err());

    let mut sparse = model(3, Activation::Softmax);
    sparse
        .compile(Loss::sparse_categorical_crossentropy(), Sgd::default(), &[])
        .expect("compile");
    let onehot = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 0.0, 0.0, 1.0], &[2, 3]).expect("y");
    let err = sparse
        .train_step(&x, &onehot)
        .expect_err("float")
        .to_string();
    assert!(err.contains("categorical_crossentropy"), "{err}");

    // Metrics need the loss's kind of targets; from_logits needs a last layer without sigmoid.
    let mut b = model(1, Activation::Sigmoid);
    assert!(b
        .compile(
            Loss::binary_crossentropy(),
            Sgd::default(),
            &[Metric::SparseTopKCategoricalAccuracy { k: 5 }]
        )
        .is_err());
    let err = b
        .compile(
            Loss::BinaryCrossentropy {
                from_logits: true,
                label_smoothing: 0.0,
            },
            Sgd::default(),
            &[],
        )
        .expect_err("from_logits with a sigmoid")
        .to_string();
    assert!(err.contains("from_logits=false"), "{err}");
    // A [n] target against one sigmoid unit is Keras' squeeze.
    b.compile(
        Loss::binary_crossentropy(),
        Sgd::default(),
        &[Metric::Accuracy],
    )
    .expect("compile");
    let y = Tensor::from_vec(vec![1.0f32, 0.0], &[2]).expect("y");
    assert!(b.train_on_batch(&x, &y).expect("step").is_finite());
}

/// Float targets are cut among the replicas of a MirroredStrategy like labels: MSE on two
/// devices trains, and every replica keeps the same weights.
#[test]
fn mirrored_fit_with_mean_squared_error() {
    let rt = Runtime::builder().virtual_cpus(2).build().expect("runtime");
    let cpus = rt.list_logical_devices("CPU").expect("cpus");
    let strategy = MirroredStrategy::with_devices(&cpus).expect("strategy");
    let s = &setups()[4];
    let mut m = strategy
        .scope(|| -> anygpu::Result<Sequential> {
            let mut m = model(2, Activation::Linear);
            m.compile(s.loss, Sgd::new(0.2), &[Metric::MeanSquaredError])?;
            Ok(m)
        })
        .expect("scope")
        .expect("model");
    let data = dataset(s, 96);
    let before = m.evaluate(&data, None).expect("evaluate").loss;
    let h = m.fit(&data, 10, None, None).expect("fit");
    assert!(h.loss[9] < 0.8 * before, "{before} -> {:?}", h.loss);
    assert_eq!(m.replica_weights(0).ok(), m.replica_weights(1).ok());
    // The mirrored step's loss is the plain model's on the same batch.
    let _on = cpus[0].scope();
    let mut plain = model(2, Activation::Linear);
    plain
        .compile(s.loss, Sgd::new(0.2), &[Metric::MeanSquaredError])
        .expect("compile");
    plain
        .set_weights(&m.get_weights().expect("w"))
        .expect("set");
    let batch = data.iter().next().expect("batch");
    let x = Tensor::from_vec(batch.x.clone(), &batch.x_shape).expect("x");
    let y = Tensor::from_vec(batch.y_values.clone(), &[16, 2]).expect("y");
    let a = plain.train_on_batch(&x, &y).expect("plain");
    let b = m.train_on_batch(&x, &y).expect("mirrored");
    assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{a} vs {b}");
}

/// A pipelined step over two devices with float targets gives the serial step's loss.
#[test]
fn pipelined_fit_with_binary_crossentropy() {
    let rt = Runtime::builder().virtual_cpus(2).build().expect("runtime");
    let cpus = rt.list_logical_devices("CPU").expect("cpus");
    let s = &setups()[2];
    let build = || {
        let mut m = Sequential::with_seed(5);
        m.add_on(
            &cpus[0],
            Dense::new(16)
                .activation(Activation::Relu)
                .input_shape(&[4]),
        )?;
        m.add_on(&cpus[1], Dense::new(2).activation(Activation::Sigmoid))?;
        m.compile(s.loss, Sgd::new(0.2), &s.metrics)?;
        m.set_verbose(Verbosity::Silent);
        Ok::<_, anygpu::Error>(m)
    };
    let mut serial = build().expect("serial");
    let mut piped = build().expect("piped");
    piped.set_pipeline(Pipeline::gpipe(3)).expect("pipeline");
    let data = dataset(s, 48);
    let a = serial.fit(&data, 3, None, None).expect("serial fit");
    let b = piped.fit(&data, 3, None, None).expect("pipelined fit");
    for (x, y) in a.loss.iter().zip(&b.loss) {
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "{x} vs {y}");
    }
    assert_eq!(a.get("binary_accuracy"), b.get("binary_accuracy"));
}
