//! The bias and the activations the products fuse ([`Activation`]: linear, relu, selu) as ops
//! of their own: `activation`, its gradient, the fused activation + bias gradient, `bias_grad`.

use crate::error::{Error, Result};
use crate::ops::gpu::nn as gn;
use crate::ops::spec::Activation;
use crate::ops::{run, with_kernels};
use crate::placement::OpInfo;
use crate::tensor::Tensor;

use super::{float_dtype, mismatch, op, GradDType};

const BIAS_GRAD: OpInfo = op("BiasAddGrad", gn::BIAS_GRAD);
const ACTIVATION_BIAS_GRAD: OpInfo = op("FusedActivationBiasGrad", gn::ACTIVATION_BIAS_GRAD);
const ACTIVATIONS: [OpInfo; 3] = [
    op("Identity", gn::ACTIVATION),
    op("Relu", gn::ACTIVATION),
    op("Selu", gn::ACTIVATION),
];
const ACTIVATION_GRADS: [OpInfo; 3] = [
    op("Identity", gn::ACTIVATION_BACKWARD),
    op("ReluGrad", gn::ACTIVATION_BACKWARD),
    op("SeluGrad", gn::ACTIVATION_BACKWARD),
];

/// The op's placement-log entry for `act` (forward or gradient).
fn act_info(act: Activation, grad: bool) -> &'static OpInfo {
    let table = if grad {
        &ACTIVATION_GRADS
    } else {
        &ACTIVATIONS
    };
    &table[act.code() as usize]
}

/// Bias gradient: the sum of `dz` over every axis but the last (`tf.raw_ops.BiasAddGrad`,
/// NHWC), e.g. `[n, h, w, c] → [c]` or `[batch, units] → [units]`.
///
/// # Errors
/// A non-f32 tensor or a scalar.
pub fn bias_grad(dz: &Tensor) -> Result<Tensor> {
    bias_grad_as(dz, GradDType::Inputs)
}

/// [`bias_grad`] in `grads`' dtype.
pub fn bias_grad_as(dz: &Tensor, grads: GradDType) -> Result<Tensor> {
    let name = BIAS_GRAD.name;
    let dtype = grads.of(float_dtype(name, &[dz])?);
    let Some(&cols) = dz.shape().last() else {
        return Err(Error::InvalidArgument(format!(
            "{name}: the gradient must have at least one axis, got a scalar"
        )));
    };
    let rows = dz.len().checked_div(cols).unwrap_or(0);
    run(&BIAS_GRAD, &[dz], |device, moved| {
        let db = Tensor::uninit(&[cols], dtype, device)?;
        if cols > 0 {
            with_kernels(device, |k, _| k.sum_rows(&moved[0], rows, cols, &db))?;
        }
        Ok(db)
    })
}

/// `act(x)` element-wise (`tf.nn.relu`, `tf.nn.selu`, or the identity for `Linear`; logged as
/// `Relu`, `Selu`, `Identity`).
///
/// # Errors
/// A non-f32 tensor.
pub fn activation(x: &Tensor, act: Activation) -> Result<Tensor> {
    let info = act_info(act, false);
    let dtype = float_dtype(info.name, &[x])?;
    run(info, &[x], |device, moved| {
        let y = Tensor::uninit(x.shape(), dtype, device)?;
        with_kernels(device, |_, nk| nk.activation(&moved[0], &y, act))?;
        Ok(y)
    })
}

/// `dz = dy · act'(z)`, computed from the activation's OUTPUT `y` (`tf.raw_ops.ReluGrad`,
/// `SeluGrad`; `Linear` passes `dy` through, logged as `Identity`).
///
/// # Errors
/// Tensors not all float32 or all float16; `dy` and `y` of different shapes.
pub fn activation_backward(dy: &Tensor, y: &Tensor, act: Activation) -> Result<Tensor> {
    let info = act_info(act, true);
    let dtype = float_dtype(info.name, &[dy, y])?;
    if dy.shape() != y.shape() {
        return Err(mismatch(
            info.name,
            dy.shape(),
            y.shape(),
            ": the gradient and the activation output must have the same shape",
        ));
    }
    run(info, &[dy, y], |device, moved| {
        let dz = Tensor::uninit(dy.shape(), dtype, device)?;
        with_kernels(device, |_, nk| {
            nk.activation_backward(&moved[0], &moved[1], &dz, act)
        })?;
        Ok(dz)
    })
}

/// [`activation_backward`] and [`bias_grad`] of its result in one op: `(dz, db)` with
/// `dz = dy · act'(z)` from the activation's output `y` and `db` the sum of `dz` over every axis
/// but the last. A GPU fuses the bias sum's first pass into the activation's kernel, so `dz` is
/// not read back for it. Logged as `FusedActivationBiasGrad` (`Linear` as `BiasAddGrad`, with
/// `dz` being `dy`).
///
/// ```
/// use anygpu::ops::{self, spec::Activation};
/// use anygpu::Tensor;
/// let y = Tensor::from_vec(vec![1.0f32, -0.5, 2.0, 0.0], &[2, 2])?;
/// let dy = Tensor::from_vec(vec![1.0f32, 1.0, 3.0, 1.0], &[2, 2])?;
/// let (dz, db) = ops::activation_bias_grad(&dy, &y, Activation::Relu)?;
/// assert_eq!(dz.to_vec::<f32>()?, [1.0, 0.0, 3.0, 0.0]);
/// assert_eq!(db.to_vec::<f32>()?, [4.0, 0.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// Tensors not all float32 or all float16; `dy` and `y` of different shapes, or scalars.
pub fn activation_bias_grad(dy: &Tensor, y: &Tensor, act: Activation) -> Result<(Tensor, Tensor)> {
    activation_bias_grad_as(dy, y, act, GradDType::Inputs)
}

/// [`activation_bias_grad`] with the bias gradient in `grads`' dtype.
pub fn activation_bias_grad_as(
    dy: &Tensor,
    y: &Tensor,
    act: Activation,
    grads: GradDType,
) -> Result<(Tensor, Tensor)> {
    if act == Activation::Linear {
        return Ok((dy.clone(), bias_grad_as(dy, grads)?));
    }
    let name = ACTIVATION_BIAS_GRAD.name;
    let dtype = float_dtype(name, &[dy, y])?;
    if dy.shape() != y.shape() {
        return Err(mismatch(
            name,
            dy.shape(),
            y.shape(),
            ": the gradient and the activation output must have the same shape",
        ));
    }
    let Some(&cols) = dy.shape().last() else {
        return Err(Error::InvalidArgument(format!(
            "{name}: the gradient must have at least one axis, got a scalar"
        )));
    };
    let rows = dy.len().checked_div(cols).unwrap_or(0);
    run(&ACTIVATION_BIAS_GRAD, &[dy, y], |device, moved| {
        let dz = Tensor::uninit(dy.shape(), dtype, device)?;
        let db = Tensor::uninit(&[cols], grads.of(dtype), device)?;
        if cols > 0 {
            with_kernels(device, |_, nk| {
                nk.activation_bias_grad(&moved[0], &moved[1], &dz, &db, (rows, cols), act)
            })?;
        }
        Ok((dz, db))
    })
}
