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
mod conv_norm;
mod dense;
mod depthwise;
mod max_pool;
mod normalized_input;
mod optimizer;
mod separable;
mod softmax;
mod stem;
pub use argmax::*;
pub use bias_act::*;
pub use conv::*;
pub(crate) use conv_norm::*;
pub use dense::*;
pub use depthwise::*;
pub use max_pool::*;
pub(crate) use normalized_input::*;
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

/// The dtype of the weight gradients an op writes (a kernel's or a bias' gradient): the `_as`
/// variants of the weight-gradient ops take one.
///
/// Keras' `mixed_float16` computes in float16 on float32 variables, so the gradients the
/// optimizer applies are float32. The sums behind these gradients run in float32 on every
/// device anyway: asking for [`GradDType::Float32`] keeps them there, where the plain ops
/// round them to float16 (TensorFlow's ops give their inputs' dtype) and the optimizer casts
/// them back (one rounding and, on a GPU, two dispatches per gradient). The layers ask for it.
///
/// ```
/// use anygpu::ops::{self, GradDType};
/// use anygpu::{DType, Tensor};
/// let rt = anygpu::Runtime::builder().build()?;
/// let _cpu = rt.cpu()?.scope();
/// let dz = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
/// let db = ops::bias_grad_as(&dz, GradDType::Float32)?;
/// assert_eq!(db.dtype(), DType::F32);
/// assert_eq!(db.to_vec::<f32>()?, [4.0, 6.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradDType {
    /// The inputs' own, as TensorFlow's ops give them.
    Inputs,
    /// Float32, whatever the inputs' float dtype.
    Float32,
}

impl GradDType {
    /// The gradients' dtype for inputs of `dtype`.
    fn of(self, dtype: DType) -> DType {
        match self {
            GradDType::Inputs => dtype,
            GradDType::Float32 => DType::F32,
        }
    }
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
