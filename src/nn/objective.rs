//! What a compiled model computes at its top: the loss, with the last layer's softmax folded
//! in, and the metrics, resolved against the model (Keras' `"accuracy"` becomes
//! sparse, binary or categorical accuracy by the targets and the output). Sees losses, metrics
//! and tensors; `pass.rs` runs it.

use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::nn::activation::Activation;
use crate::nn::loss::Loss;
use crate::nn::metrics::Metric;
use crate::ops;
use crate::ops::loss::{LossKind, LossParams, MetricKind, OutputActivation};
use crate::tensor::{DType, Tensor};

/// How one metric is computed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum MetricImpl {
    /// The arg max of the logits equals the integer label (the fused accuracy count).
    SparseAccuracy,
    /// Per-row values of `ops::loss::metric_rows`, summed.
    Rows(MetricKind),
}

/// The loss and metrics of a compiled model, resolved against its last layer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Objective {
    pub(crate) loss: Loss,
    /// The last layer's activation the loss and metrics apply (the layer outputs logits).
    pub(crate) act: OutputActivation,
    /// Each metric's name (Keras') and computation, in `compile` order.
    pub(crate) metrics: Vec<(&'static str, MetricImpl)>,
}

impl Objective {
    /// Resolves `loss` and `metrics` for a last layer named `layer` with activation `act` and
    /// output shape `output` (per example; `None` before the model is built).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a loss that does not fit the last layer (`from_logits`
    /// against a softmax or sigmoid) or a metric that needs the other kind of targets.
    pub(crate) fn resolve(
        loss: Loss,
        metrics: &[Metric],
        (layer, act, output): (&str, Activation, Option<&[usize]>),
    ) -> Result<Objective> {
        loss.validate()?;
        check_last_layer(loss, layer, act)?;
        let out_act = match act {
            Activation::Softmax => OutputActivation::Softmax,
            // A sigmoid layer applies its activation itself: its outputs are probabilities.
            _ => OutputActivation::Identity,
        };
        let mut resolved = Vec::with_capacity(metrics.len());
        for &m in metrics {
            let how = match m {
                Metric::Accuracy if loss.takes_labels() => MetricImpl::SparseAccuracy,
                Metric::Accuracy if output.and_then(<[usize]>::last) == Some(&1) => {
                    MetricImpl::Rows(MetricKind::Binary(0.5))
                }
                Metric::Accuracy => MetricImpl::Rows(MetricKind::Categorical),
                Metric::SparseTopKCategoricalAccuracy { k } => {
                    if !loss.takes_labels() {
                        return Err(targets_mismatch(m, loss, "integer class indices"));
                    }
                    if k == 0 {
                        return Err(Error::InvalidArgument(
                            "sparse_top_k_categorical_accuracy: k must be at least 1, got 0".into(),
                        ));
                    }
                    MetricImpl::Rows(MetricKind::SparseTopK(k))
                }
                Metric::CategoricalAccuracy => float_metric(m, loss, MetricKind::Categorical)?,
                Metric::BinaryAccuracy { threshold } => {
                    float_metric(m, loss, MetricKind::Binary(threshold))?
                }
                Metric::MeanSquaredError => float_metric(m, loss, MetricKind::MeanSquared)?,
            };
            if !resolved.iter().any(|(name, _)| *name == m.name()) {
                resolved.push((m.name(), how));
            }
        }
        Ok(Objective {
            loss,
            act: out_act,
            metrics: resolved,
        })
    }

    /// The metrics' names, in order.
    pub(crate) fn metric_names(&self) -> Vec<&'static str> {
        self.metrics.iter().map(|(n, _)| *n).collect()
    }

    /// Checks a batch's targets (`shape`, `dtype`) for `n` examples against the loss and the
    /// model's per-example `output` shape.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for targets of the wrong kind (int32 labels for a loss on
    /// float targets, or the reverse), naming the loss that fits them; a shape error otherwise.
    pub(crate) fn check_targets(
        &self,
        what: &str,
        (shape, dtype): (&[usize], DType),
        n: usize,
        output: &[usize],
    ) -> Result<()> {
        let loss = self.loss.name();
        if self.loss.takes_labels() {
            if dtype != DType::I32 {
                return Err(Error::InvalidArgument(format!(
                    "{what}: {loss} takes int32 class indices of shape [{n}], got {dtype} \
                     targets of shape {shape:?}; for one-hot float targets use \
                     categorical_crossentropy"
                )));
            }
            if shape != [n] {
                return Err(Error::ShapeMismatch {
                    op: "Sequential",
                    lhs: vec![n],
                    rhs: shape.to_vec(),
                    hint: format!(": {what} expects {n} integer labels of shape [{n}]"),
                });
            }
            return Ok(());
        }
        let mut want = vec![n];
        want.extend_from_slice(output);
        if dtype != DType::F32 {
            return Err(Error::InvalidArgument(format!(
                "{what}: {loss} takes float32 targets shaped like the model's output \
                 {want:?}, got {dtype} targets of shape {shape:?}; for integer class indices \
                 use sparse_categorical_crossentropy, or one-hot encode the labels"
            )));
        }
        // Keras squeezes `[n]` targets against an output of one unit.
        let squeezed = output.last() == Some(&1) && shape == &want[..want.len() - 1];
        if shape != want && !squeezed {
            return Err(Error::ShapeMismatch {
                op: "Sequential",
                lhs: want.clone(),
                rhs: shape.to_vec(),
                hint: format!(
                    ": {what}: {loss} expects targets shaped like the model's output {want:?}"
                ),
            });
        }
        Ok(())
    }
}

fn targets_mismatch(m: Metric, loss: Loss, needs: &str) -> Error {
    let has = if loss.takes_labels() {
        "integer class indices"
    } else {
        "float targets"
    };
    Error::InvalidArgument(format!(
        "metric {} needs {needs}, but the loss {} takes {has}",
        m.name(),
        loss.name()
    ))
}

fn float_metric(m: Metric, loss: Loss, kind: MetricKind) -> Result<MetricImpl> {
    if loss.takes_labels() {
        return Err(targets_mismatch(
            m,
            loss,
            "float targets shaped like the output",
        ));
    }
    Ok(MetricImpl::Rows(kind))
}

/// `from_logits` against the last layer's activation.
fn check_last_layer(loss: Loss, layer: &str, act: Activation) -> Result<()> {
    let name = loss.name();
    match (loss, loss.logits_flag()) {
        (Loss::SparseCategoricalCrossentropy { from_logits: false }, _)
            if act != Activation::Softmax =>
        {
            Err(Error::InvalidArgument(format!(
                "sparse_categorical_crossentropy with from_logits=false needs a final \
                 softmax, but the last layer '{layer}' has activation '{act}'; add \
                 activation=softmax or use from_logits=true"
            )))
        }
        // Keras warns here; a probability taken for a logit is always a mistake, so refuse it.
        (_, Some(true)) if act.is_folded() || act == Activation::Sigmoid => {
            Err(Error::InvalidArgument(format!(
                "{name} with from_logits=true expects logits, but the last layer '{layer}' \
                 applies {act}; use from_logits=false"
            )))
        }
        _ => Ok(()),
    }
}

/// The loss of a batch, on the device of the last layer.
pub(crate) struct LossTerms {
    /// Sum of the per-example losses, a scalar.
    pub(crate) loss_sum: Tensor,
    /// Gradient of the batch's MEAN loss w.r.t. the last layer's output (its logits when the
    /// loss folds its activation in), times the factor.
    pub(crate) dlogits: Tensor,
    /// Each metric's sum over the examples, in the objective's order.
    pub(crate) metrics: Vec<Tensor>,
}

/// The loss and metrics of `z` (the last layer's output, float32, on the current device)
/// against `y` (on the same device). `factor` multiplies the gradient (the loss scale times
/// this part's share of the batch).
pub(crate) fn loss_terms(
    obj: &Objective,
    z: &Tensor,
    y: &Tensor,
    factor: f32,
) -> Result<LossTerms> {
    let n = z.shape().first().copied().unwrap_or(0);
    let (loss_sum, dlogits) = match obj.loss {
        Loss::SparseCategoricalCrossentropy { .. } => {
            let (per_example, mut dlogits) = ops::sparse_softmax_cross_entropy(z, y)?;
            if factor != 1.0 {
                dlogits = dlogits.scale(factor)?;
            }
            (per_example.reduce_sum(None)?, dlogits)
        }
        loss => {
            let folded = obj.act != OutputActivation::Identity;
            let (kind, label_smoothing) = match loss {
                Loss::CategoricalCrossentropy {
                    from_logits,
                    label_smoothing,
                } => (
                    if from_logits || folded {
                        LossKind::CategoricalLogits
                    } else {
                        LossKind::CategoricalProbs
                    },
                    label_smoothing,
                ),
                Loss::BinaryCrossentropy {
                    from_logits,
                    label_smoothing,
                } => (
                    if from_logits || folded {
                        LossKind::BinaryLogits
                    } else {
                        LossKind::BinaryProbs
                    },
                    label_smoothing,
                ),
                Loss::MeanAbsoluteError => (LossKind::MeanAbsolute, 0.0),
                _ => (LossKind::MeanSquared, 0.0),
            };
            let cols = z.shape().last().copied().unwrap_or(1).max(1);
            let rows = z.len() / cols;
            let p = LossParams {
                rows,
                cols,
                kind,
                act: obj.act,
                label_smoothing,
                // Keras' sum_over_batch_size over every position: per example, the mean.
                row_scale: n as f32 / rows.max(1) as f32,
                grad_scale: factor / rows.max(1) as f32,
            };
            let (per_row, dz) = ops::loss::dense_loss(z, y, p)?;
            (per_row.reduce_sum(None)?, dz)
        }
    };
    let mut metrics = Vec::with_capacity(obj.metrics.len());
    for (_, how) in &obj.metrics {
        metrics.push(match *how {
            MetricImpl::SparseAccuracy => ops::accuracy_count(z, y)?,
            MetricImpl::Rows(kind) => {
                let values = ops::loss::metric_rows(z, y, kind, obj.act)?;
                let rows = values.len().max(1);
                let sum = values.reduce_sum(None)?;
                if rows == n {
                    sum
                } else {
                    sum.scale(n as f32 / rows as f32)?
                }
            }
        });
    }
    Ok(LossTerms {
        loss_sum,
        dlogits,
        metrics,
    })
}

/// `loss_terms` on `device`: `z` cast to float32 and `y` moved there first.
pub(crate) fn loss_terms_on(
    device: &LogicalDevice,
    obj: &Objective,
    z: &Tensor,
    y: &Tensor,
    factor: f32,
) -> Result<LossTerms> {
    let _scope = device.scope();
    let y = y.to_device(device)?;
    let z = z.arrive(DType::F32, device)?;
    loss_terms(obj, &z, &y, factor)
}

// ---- loss scaling on the device ----

/// [`loss_terms_on`] under a loss scale read on the device: the gradient times `base * 2^e`,
/// `e` the exponent of the loss-scale `state` (on `device`), bit for bit what a host factor of
/// that scale gives. The sparse loss multiplies its mean gradient by the factor, the others
/// fold `factor / rows` into theirs; either way one more exact multiplication by `2^e`
/// (a power of two) on the device finishes it, so nothing waits for the scale.
pub(crate) fn loss_terms_scaled(
    device: &LogicalDevice,
    obj: &Objective,
    z: &Tensor,
    y: &Tensor,
    (base, state): (f32, &Tensor),
) -> Result<LossTerms> {
    let sparse = matches!(obj.loss, Loss::SparseCategoricalCrossentropy { .. });
    let (host, seed) = if sparse { (1.0, base) } else { (base, 1.0) };
    let terms = loss_terms_on(device, obj, z, y, host)?;
    let _scope = device.scope();
    ops::loss_scale_seed(&terms.dlogits, seed, state)?;
    Ok(terms)
}
