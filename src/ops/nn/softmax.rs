//! Softmax, the sparse softmax cross-entropy with its gradient, and the accuracy count.

use crate::error::{Error, Result};
use crate::ops::gpu::nn as gn;
use crate::ops::{run, with_kernels};
use crate::placement::OpInfo;
use crate::tensor::{DType, Tensor};
use crate::DeviceKind;

use super::{mismatch, op};

const SOFTMAX: OpInfo = op("Softmax", gn::SOFTMAX);
const SPARSE_XENT: OpInfo = op("SparseSoftmaxCrossEntropyWithLogits", gn::SPARSE_XENT);
const ACCURACY_COUNT: OpInfo = op("AccuracyCount", gn::ACCURACY_COUNT);

/// `[rows, cols]` of a tensor whose last axis holds the classes.
fn rows_cols(op: &'static str, logits: &Tensor) -> Result<(usize, usize)> {
    let Some(&cols) = logits.shape().last() else {
        return Err(Error::InvalidArgument(format!(
            "{op}: logits must have at least one axis, got a scalar"
        )));
    };
    Ok((logits.len().checked_div(cols).unwrap_or(0), cols))
}

/// Softmax over the last axis (`tf.nn.softmax(logits, axis=-1)`), shifted by each row's
/// maximum so any magnitude is safe.
///
/// # Errors
/// A non-f32 tensor or a scalar.
pub fn softmax(logits: &Tensor) -> Result<Tensor> {
    let name = SOFTMAX.name;
    logits.expect_dtype(name, DType::F32)?;
    let (rows, cols) = rows_cols(name, logits)?;
    run(&SOFTMAX, &[logits], |device, moved| {
        let probs = Tensor::uninit(logits.shape(), DType::F32, device)?;
        with_kernels(device, |_, nk| nk.softmax(&moved[0], &probs, rows, cols))?;
        Ok(probs)
    })
}

/// Checks `[rows, cols]` logits (f32) against `[rows]` labels (i32).
fn logits_labels(op: &'static str, logits: &Tensor, labels: &Tensor) -> Result<(usize, usize)> {
    logits.expect_dtype(op, DType::F32)?;
    labels.expect_dtype(op, DType::I32)?;
    let &[rows, cols] = logits.shape() else {
        return Err(mismatch(
            op,
            logits.shape(),
            labels.shape(),
            ": logits must be [batch, classes] and labels [batch]",
        ));
    };
    if labels.shape() != [rows] {
        return Err(mismatch(
            op,
            logits.shape(),
            labels.shape(),
            format!(": labels must have shape [{rows}], one class index per row"),
        ));
    }
    Ok((rows, cols))
}

/// Labels outside `[0, classes)`, in TensorFlow's words (checked where labels are on the host).
fn check_labels(labels: &Tensor, cols: usize) -> Result<()> {
    let values = labels.to_vec::<i32>()?;
    if let Some(&bad) = values
        .iter()
        .find(|&&l| usize::try_from(l).map_or(true, |l| l >= cols))
    {
        let shown: Vec<String> = values.iter().take(16).map(i32::to_string).collect();
        return Err(Error::InvalidArgument(format!(
            "Received a label value of {bad} which is outside the valid range of [0, {cols}).  \
             Label values: {}{}",
            shown.join(" "),
            if values.len() > 16 { " ..." } else { "" }
        )));
    }
    Ok(())
}

/// Sparse categorical cross-entropy on logits, fused with softmax
/// (`tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)`; Keras'
/// `SparseCategoricalCrossentropy(from_logits=True)` is the mean of the loss).
///
/// `logits` `[batch, classes]` f32, `labels` `[batch]` i32. Returns `(loss, dlogits)`: the
/// per-row loss `[batch]` and the gradient of the MEAN loss w.r.t. the logits,
/// `(softmax − onehot) / batch`.
///
/// Out-of-range labels behave as in TensorFlow: where the op runs on the CPU they are an
/// `InvalidArgument` error (the labels are checked on the host before the kernel runs); on a GPU
/// they are not read back (that would stall the device), and the affected rows' loss and
/// gradient are NaN.
///
/// # Errors
/// Wrong dtypes; shapes that do not fit together; no classes with a non-empty batch; on the
/// CPU, labels outside `[0, classes)`.
pub fn sparse_softmax_cross_entropy(logits: &Tensor, labels: &Tensor) -> Result<(Tensor, Tensor)> {
    let name = SPARSE_XENT.name;
    let (rows, cols) = logits_labels(name, logits, labels)?;
    if cols == 0 && rows > 0 {
        return Err(Error::InvalidArgument(format!(
            "{name}: logits of shape {:?} have no classes",
            logits.shape()
        )));
    }
    run(&SPARSE_XENT, &[logits, labels], |device, moved| {
        if device.device_type() == DeviceKind::Cpu {
            check_labels(&moved[1], cols)?;
        }
        let loss = Tensor::uninit(&[rows], DType::F32, device)?;
        let dlogits = Tensor::uninit(&[rows, cols], DType::F32, device)?;
        with_kernels(device, |_, nk| {
            nk.softmax_cross_entropy(&moved[0], &moved[1], &loss, &dlogits, rows, cols)
        })?;
        Ok((loss, dlogits))
    })
}

/// How many rows' arg max (the first maximum on ties) equals the label, as a `[1]` f32 tensor
/// that stays on the device (Keras' `sparse_categorical_accuracy` times the batch size; sum it
/// over batches and read it once per epoch). Labels outside `[0, classes)` never match.
///
/// # Errors
/// Wrong dtypes; shapes that do not fit together.
pub fn accuracy_count(logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
    let name = ACCURACY_COUNT.name;
    let (rows, cols) = logits_labels(name, logits, labels)?;
    run(&ACCURACY_COUNT, &[logits, labels], |device, moved| {
        let out = Tensor::uninit(&[1], DType::F32, device)?;
        with_kernels(device, |_, nk| {
            nk.accuracy_count(&moved[0], &moved[1], &out, rows, cols)
        })?;
        Ok(out)
    })
}
