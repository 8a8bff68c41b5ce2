//! Keras' losses on float targets (categorical and binary cross-entropy, mean squared and mean
//! absolute error) and the metrics beyond sparse accuracy, on every device: one row of the
//! model's output per invocation, the per-row loss and the gradient w.r.t. the layer's
//! pre-activation output in one pass.
//!
//! The last layer's `softmax` or `sigmoid` is folded in as Keras 3 on TensorFlow does it: its
//! output keeps the logits (`_keras_logits`), and `categorical_crossentropy` /
//! `binary_crossentropy` then run on those logits (`tf.nn.softmax_cross_entropy_with_logits`,
//! `tf.nn.sigmoid_cross_entropy_with_logits`) whichever of the two activations produced them.
//! The regression losses and the metrics see the activated output.

use crate::error::{Error, Result};
use crate::ops::gpu::loss as gl;
use crate::ops::{run, with_kernels};
use crate::placement::OpInfo;
use crate::tensor::{DType, Tensor};

pub use crate::ops::nn_kernels::{LossKind, LossParams, MetricKind, OutputActivation};

/// The op names of the placement log.
const DENSE_LOSS: OpInfo = OpInfo {
    name: "DenseLoss",
    gpu: Some(gl::DENSE_LOSS),
};
const METRIC_ROWS: OpInfo = OpInfo {
    name: "MetricRows",
    gpu: Some(gl::METRIC_ROWS),
};
const SIGMOID: OpInfo = OpInfo {
    name: "Sigmoid",
    gpu: Some(gl::SIGMOID),
};

fn mismatch(op: &'static str, lhs: &[usize], rhs: &[usize], hint: String) -> Error {
    Error::ShapeMismatch {
        op,
        lhs: lhs.to_vec(),
        rhs: rhs.to_vec(),
        hint,
    }
}

/// `[rows, cols]` of an output whose last axis is the one a loss reduces, checked against
/// targets of the same element count (Keras squeezes or expands `[n]` against `[n, 1]`).
fn rows_cols(op: &'static str, z: &Tensor, targets: &Tensor) -> Result<(usize, usize)> {
    z.expect_dtype(op, DType::F32)?;
    targets.expect_dtype(op, DType::F32)?;
    let Some(&cols) = z.shape().last() else {
        return Err(Error::InvalidArgument(format!(
            "{op}: the output must have at least one axis, got a scalar"
        )));
    };
    let same = z.shape() == targets.shape()
        || (z.shape().len() == targets.shape().len() + 1
            && cols == 1
            && z.shape()[..targets.shape().len()] == *targets.shape());
    if !same {
        return Err(mismatch(
            op,
            z.shape(),
            targets.shape(),
            ": targets must have the shape of the model's output".into(),
        ));
    }
    Ok((z.len().checked_div(cols).unwrap_or(0), cols))
}

/// The loss of each row of `z` against float `targets` and the gradient of the scaled sum
/// w.r.t. `z` (see [`LossKind`] and [`LossParams`]; `rows`/`cols` are taken from `z`).
/// Returns `(loss [rows], dz like z)`, in float32.
///
/// # Errors
/// Non-f32 tensors; targets of another shape than `z` (`[n]` against `[n, 1]` is accepted).
pub fn dense_loss(z: &Tensor, targets: &Tensor, p: LossParams) -> Result<(Tensor, Tensor)> {
    let name = DENSE_LOSS.name;
    let (rows, cols) = rows_cols(name, z, targets)?;
    let p = LossParams { rows, cols, ..p };
    if cols == 0 {
        let _scope = z.device_handle().scope();
        return Ok((Tensor::zeros(&[rows])?, Tensor::zeros(z.shape())?));
    }
    run(&DENSE_LOSS, &[z, targets], |device, moved| {
        let loss = Tensor::uninit(&[rows], DType::F32, device)?;
        let dz = Tensor::uninit(z.shape(), DType::F32, device)?;
        with_kernels(device, |_, nk| {
            nk.dense_loss(&moved[0], &moved[1], &loss, &dz, &p)
        })?;
        Ok((loss, dz))
    })
}

/// Each row's metric value (`[rows]` f32): `o = act(z)` compared with `targets` (f32 like `z`,
/// or `[rows]` i32 labels for [`MetricKind::SparseTopK`]).
///
/// # Errors
/// Wrong dtypes or shapes; `k = 0`.
pub fn metric_rows(
    z: &Tensor,
    targets: &Tensor,
    kind: MetricKind,
    act: OutputActivation,
) -> Result<Tensor> {
    let name = METRIC_ROWS.name;
    let (rows, cols) = match kind {
        MetricKind::SparseTopK(k) => {
            z.expect_dtype(name, DType::F32)?;
            targets.expect_dtype(name, DType::I32)?;
            if k == 0 {
                return Err(Error::InvalidArgument(format!(
                    "{name}: sparse_top_k_categorical_accuracy needs k >= 1, got 0"
                )));
            }
            let cols = z.shape().last().copied().unwrap_or(0);
            let rows = z.len().checked_div(cols).unwrap_or(0);
            if targets.len() != rows {
                return Err(mismatch(
                    name,
                    z.shape(),
                    targets.shape(),
                    format!(": one integer label per row ({rows}) expected"),
                ));
            }
            (rows, cols)
        }
        _ => rows_cols(name, z, targets)?,
    };
    if cols == 0 {
        let _scope = z.device_handle().scope();
        return Tensor::zeros(&[rows]);
    }
    run(&METRIC_ROWS, &[z, targets], |device, moved| {
        let out = Tensor::uninit(&[rows], DType::F32, device)?;
        with_kernels(device, |_, nk| {
            nk.metric_rows(&moved[0], &moved[1], &out, (rows, cols), kind, act)
        })?;
        Ok(out)
    })
}

/// `sigmoid(x)` element-wise (`tf.math.sigmoid`): what `predict` applies to a last layer
/// whose sigmoid the loss folds in.
///
/// # Errors
/// A non-f32 tensor.
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    x.expect_dtype(SIGMOID.name, DType::F32)?;
    run(&SIGMOID, &[x], |device, moved| {
        let y = Tensor::uninit(x.shape(), DType::F32, device)?;
        with_kernels(device, |_, nk| nk.sigmoid(&moved[0], &y))?;
        Ok(y)
    })
}
