//! Keras' losses and metrics: the mean loss and its gradient w.r.t. the last layer's logits or
//! output (`ops::loss`), a Dense layer trained through each loss (`Sequential`, the softmax
//! and sigmoid folded in), and each metric's value — on CPU:0 and every GPU adapter.

use anygpu::nn::{Dense, Loss, Sequential, Sgd};
use anygpu::ops::loss::{self as ol, LossKind, LossParams, MetricKind, OutputActivation};
use anygpu::Tensor;

use crate::common::golden::{Case, Golden};
use crate::{activation, devices, read, runtime, upload};

fn kind(case: &Case<'_>) -> LossKind {
    match case.str("kind") {
        "categorical_logits" => LossKind::CategoricalLogits,
        "categorical_probs" => LossKind::CategoricalProbs,
        "binary_logits" => LossKind::BinaryLogits,
        "binary_probs" => LossKind::BinaryProbs,
        "mean_squared" => LossKind::MeanSquared,
        "mean_absolute" => LossKind::MeanAbsolute,
        other => panic!("{}: loss kind {other}", case.name),
    }
}

fn output_activation(case: &Case<'_>) -> OutputActivation {
    match case.str("act") {
        "linear" => OutputActivation::Identity,
        "softmax" => OutputActivation::Softmax,
        "sigmoid" => OutputActivation::Sigmoid,
        other => panic!("{}: activation {other}", case.name),
    }
}

#[test]
fn golden_losses_and_their_gradients() {
    let rt = runtime();
    let golden = Golden::load("losses");
    for dev in devices(&rt, "golden_losses_and_their_gradients") {
        let _on = dev.scope();
        let name = dev.to_string();
        for case in golden.cases().into_iter().filter(|c| c.has("dz")) {
            let z = upload(&case, "z", &dev);
            let y = upload(&case, "y", &dev);
            let (rows, cols) = (z.shape()[0], z.shape()[1]);
            let p = LossParams {
                rows,
                cols,
                kind: kind(&case),
                act: output_activation(&case),
                label_smoothing: case.f64("label_smoothing") as f32,
                row_scale: 1.0,
                grad_scale: 1.0 / rows as f32,
            };
            let (per_row, dz) = ol::dense_loss(&z, &y, p).expect("dense_loss");
            let mean = read(&per_row).iter().map(|&v| f64::from(v)).sum::<f64>() / rows as f64;
            case.check(&name, "loss", &[1], &[mean as f32]);
            case.check(&name, "dz", dz.shape(), &read(&dz));
        }
    }
}

/// (TF's scalars are stored as `[1]` by the generator.)
///
/// Dense + loss through `Sequential::loss_and_gradients`: the softmax or sigmoid of the layer
/// folded into the loss as Keras 3 does.
#[test]
fn golden_dense_layer_under_each_loss() {
    let rt = runtime();
    let golden = Golden::load("losses");
    for dev in devices(&rt, "golden_dense_layer_under_each_loss") {
        let _on = dev.scope();
        let name = dev.to_string();
        for case in golden.cases().into_iter().filter(|c| c.has("dkernel")) {
            let ls = case.f64("label_smoothing") as f32;
            let loss = match case.str("loss") {
                "categorical_crossentropy" => Loss::CategoricalCrossentropy {
                    from_logits: false,
                    label_smoothing: ls,
                },
                "binary_crossentropy" => Loss::BinaryCrossentropy {
                    from_logits: false,
                    label_smoothing: ls,
                },
                other => other.parse().expect("a known loss"),
            };
            let mut model = Sequential::new();
            model
                .add_on(
                    &dev,
                    Dense::new(case.usize("units"))
                        .activation(activation(&case))
                        .input_shape(&[5]),
                )
                .expect("dense");
            model.compile(loss, Sgd::default(), &[]).expect("compile");
            let weights = ["kernel", "bias"].map(|k| case.input(k).1).to_vec();
            model.set_weights(&weights).expect("weights");
            let x = upload(&case, "x", &dev);
            let y = upload(&case, "y", &dev);
            let (value, grads) = model.loss_and_gradients(&x, &y).expect("gradients");
            case.check(&name, "loss", &[1], &[value]);
            case.check(&name, "dkernel", grads[0].shape(), &read(&grads[0]));
            case.check(&name, "dbias", grads[1].shape(), &read(&grads[1]));
        }
    }
}

#[test]
fn golden_metrics() {
    let rt = runtime();
    let golden = Golden::load("losses");
    for dev in devices(&rt, "golden_metrics") {
        let _on = dev.scope();
        let name = dev.to_string();
        for case in golden.cases().into_iter().filter(|c| c.has("value")) {
            let p = upload(&case, "p", &dev);
            let (metric, y) = match case.str("metric") {
                "sparse_top_k_categorical_accuracy" => {
                    let (shape, labels) = case.input_i32("y");
                    let y = Tensor::from_slice_on(&labels, &shape, &dev).expect("labels");
                    (MetricKind::SparseTopK(case.usize("k")), y)
                }
                "categorical_accuracy" => (MetricKind::Categorical, upload(&case, "y", &dev)),
                "binary_accuracy" => (
                    MetricKind::Binary(case.f64("threshold") as f32),
                    upload(&case, "y", &dev),
                ),
                "mean_squared_error" => (MetricKind::MeanSquared, upload(&case, "y", &dev)),
                other => panic!("{}: metric {other}", case.name),
            };
            let rows =
                ol::metric_rows(&p, &y, metric, OutputActivation::Identity).expect("metric_rows");
            let values = read(&rows);
            let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / values.len() as f64;
            case.check(&name, "value", &[1], &[mean as f32]);
        }
    }
}
