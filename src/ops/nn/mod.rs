//! The CNN ops' front-ends: convolutions, pooling, activations, the loss, and optimizer
//! updates, forward and backward, on every device. Layout NHWC, kernels HWIO (Keras), f32 (or
//! float16 under mixed precision). One file per op family; this one holds the checks they share.
//!
//! Front-ends check dtypes and shapes, place the op, allocate the output on its device (always
//! before any scratch, so an output takes the arena chunk freed last), and call the device's
//! [`NnKernels`](crate::ops::NnKernels).

use crate::error::{Error, Result};
use crate::ops::gpu::Kernel;
use crate::ops::spec::ConvOptions;
use crate::placement::OpInfo;
use crate::tensor::{DType, Tensor};

mod argmax;
mod bias_act;
mod conv;
mod dense;
mod depthwise;
mod max_pool;
mod optimizer;
mod separable;
mod softmax;
mod stem;
pub use argmax::*;
pub use bias_act::*;
pub use conv::*;
pub use dense::*;
pub use depthwise::*;
pub use max_pool::*;
pub use optimizer::*;
pub use separable::*;
pub use softmax::*;
pub use stem::*;

// ---- activations and pooling layers ----
mod activations;
mod pooling;
pub use activations::*;
pub use pooling::*;
// ---- loss scaling on the device ----
mod loss_scale;
pub(crate) use loss_scale::*;

const fn op(name: &'static str, gpu: &'static [Kernel]) -> OpInfo {
    OpInfo {
        name,
        gpu: Some(gpu),
    }
}

fn mismatch(op: &'static str, lhs: &[usize], rhs: &[usize], hint: impl Into<String>) -> Error {
    Error::ShapeMismatch {
        op,
        lhs: lhs.to_vec(),
        rhs: rhs.to_vec(),
        hint: hint.into(),
    }
}

/// `[a, b, c, d]` of a rank-4 tensor shape, or a mismatch naming both operands.
fn rank4(op: &'static str, shape: &[usize], other: &[usize], what: &str) -> Result<[usize; 4]> {
    <[usize; 4]>::try_from(shape).map_err(|_| {
        mismatch(
            op,
            shape,
            other,
            format!(": {what} must be rank 4, got rank {}", shape.len()),
        )
    })
}

/// Checks a convolution's strides and dilation as Keras does: none 0, and not both above 1.
fn check_options(op: &'static str, o: &ConvOptions) -> Result<()> {
    if o.strides.contains(&0) {
        return Err(Error::InvalidArgument(format!(
            "{op}: The argument `strides` cannot contains 0. Received strides={:?}",
            o.strides
        )));
    }
    if o.dilation.contains(&0) {
        return Err(Error::InvalidArgument(format!(
            "{op}: The argument `dilation_rate` cannot contain 0. Received dilation_rate={:?}",
            o.dilation
        )));
    }
    if o.strides.iter().any(|&v| v > 1) && o.dilation.iter().any(|&v| v > 1) {
        return Err(Error::InvalidArgument(format!(
            "{op}: `strides > 1` not supported in conjunction with `dilation_rate > 1`. \
             Received: strides={:?} and dilation_rate={:?}",
            o.strides, o.dilation
        )));
    }
    Ok(())
}

fn expect_f32(op: &'static str, tensors: &[&Tensor]) -> Result<()> {
    tensors
        .iter()
        .try_for_each(|t| t.expect_dtype(op, DType::F32))
}

/// The one float dtype of an op's tensors (float32, or float16 under mixed precision), which
/// is also its outputs'.
fn float_dtype(op: &'static str, tensors: &[&Tensor]) -> Result<DType> {
    let dtype = tensors.first().map_or(DType::F32, |t| t.dtype());
    let expected = if dtype == DType::F16 {
        DType::F16
    } else {
        DType::F32
    };
    tensors
        .iter()
        .try_for_each(|t| t.expect_dtype(op, expected))?;
    Ok(expected)
}
