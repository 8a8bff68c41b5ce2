//! 2×2 max-pooling (`MaxPool2D()`): forward, gradient, and the gradient fused with the
//! activation and bias gradient of the layer before it.

use crate::error::Result;
use crate::ops::gpu::nn as gn;
use crate::ops::spec::{Activation, PoolShape};
use crate::ops::{run, with_kernels};
use crate::placement::OpInfo;
use crate::tensor::Tensor;

use super::{float_dtype, mismatch, op, rank4, GradDType};

const MAXPOOL_ACTIVATION_BIAS_GRAD: OpInfo = op(
    "FusedMaxPoolActivationBiasGrad",
    gn::MAXPOOL_ACTIVATION_BIAS_GRAD,
);
const MAXPOOL: OpInfo = op("MaxPool", gn::MAXPOOL);
const MAXPOOL_BACKWARD: OpInfo = op("MaxPoolGrad", gn::MAXPOOL_BACKWARD);

fn pool_shape(op: &'static str, x: &Tensor, other: &[usize]) -> Result<PoolShape> {
    let [n, h, w, c] = rank4(op, x.shape(), other, "the input (NHWC)")?;
    Ok(PoolShape { n, h, w, c })
}

/// 2×2 max-pooling, stride 2, 'valid' (Keras `MaxPooling2D()` defaults,
/// `tf.nn.max_pool2d(x, 2, 2, "VALID")`): `[n, h, w, c] → [n, h / 2, w / 2, c]` (an odd last
/// row or column is dropped).
///
/// # Errors
/// A non-f32 or non-rank-4 input.
pub fn max_pool2d(x: &Tensor) -> Result<Tensor> {
    let name = MAXPOOL.name;
    let dtype = float_dtype(name, &[x])?;
    let s = pool_shape(name, x, &[2, 2])?;
    let (oh, ow) = s.out_hw();
    run(&MAXPOOL, &[x], |device, moved| {
        let y = Tensor::uninit(&[s.n, oh, ow, s.c], dtype, device)?;
        with_kernels(device, |_, nk| nk.maxpool(&moved[0], &y, &s))?;
        Ok(y)
    })
}

/// Gradient of [`max_pool2d`] (`tf.raw_ops.MaxPoolGrad`): each `dy` element goes to the first
/// maximum of its window (row-major order, recomputed from `x`), everything else is 0.
///
/// # Errors
/// Tensors not all float32 or all float16; a `dy` whose shape is not the pooled output's.
pub fn max_pool2d_backward(x: &Tensor, dy: &Tensor) -> Result<Tensor> {
    let name = MAXPOOL_BACKWARD.name;
    let dtype = float_dtype(name, &[x, dy])?;
    let s = pool_shape(name, x, dy.shape())?;
    let (oh, ow) = s.out_hw();
    if dy.shape() != [s.n, oh, ow, s.c] {
        return Err(mismatch(
            name,
            x.shape(),
            dy.shape(),
            format!(": dy must have the pooled shape {:?}", [s.n, oh, ow, s.c]),
        ));
    }
    run(&MAXPOOL_BACKWARD, &[x, dy], |device, moved| {
        let dx = Tensor::uninit(x.shape(), dtype, device)?;
        with_kernels(device, |_, nk| {
            nk.maxpool_backward(&moved[0], &moved[1], &dx, &s)
        })?;
        Ok(dx)
    })
}

/// The gradient through a 2×2 max-pool and the activation before it, and the bias gradient,
/// in one op: `dz = maxpool_backward(y, dpooled) · act'` (through the activation's output `y`,
/// the pool's input) and `db = Σ dz` over every axis but the last. `dz` is the gradient w.r.t.
/// the pre-activation output of the layer whose activated output `y` the pool read (a
/// `SeparableConv2D` before a `MaxPool2D`); a GPU does it in one pass over `y`.
///
/// ```
/// use anygpu::ops::{self, spec::Activation};
/// use anygpu::Tensor;
/// let rt = anygpu::Runtime::builder().build()?;
/// let _cpu = rt.cpu()?.scope();
/// // One 2×2 window of one channel: the gradient goes to its maximum, 3.0 (relu' = 1 there).
/// let y = Tensor::from_slice(&[1.0f32, 3.0, 0.0, 2.0], &[1, 2, 2, 1])?;
/// let dpooled = Tensor::from_slice(&[0.5f32], &[1, 1, 1, 1])?;
/// let (dz, db) = ops::max_pool2d_activation_bias_grad(&y, &dpooled, Activation::Relu)?;
/// assert_eq!(dz.to_vec::<f32>()?, [0.0, 0.5, 0.0, 0.0]);
/// assert_eq!(db.to_vec::<f32>()?, [0.5]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// Tensors not all float32 or all float16; a `y` that is not rank 4; a `dpooled` that is not `y`'s pooled shape.
pub fn max_pool2d_activation_bias_grad(
    y: &Tensor,
    dpooled: &Tensor,
    act: Activation,
) -> Result<(Tensor, Tensor)> {
    max_pool2d_activation_bias_grad_as(y, dpooled, act, GradDType::Inputs)
}

/// [`max_pool2d_activation_bias_grad`] with the bias gradient in `grads`' dtype.
pub fn max_pool2d_activation_bias_grad_as(
    y: &Tensor,
    dpooled: &Tensor,
    act: Activation,
    grads: GradDType,
) -> Result<(Tensor, Tensor)> {
    let name = MAXPOOL_ACTIVATION_BIAS_GRAD.name;
    let dtype = float_dtype(name, &[y, dpooled])?;
    let s = pool_shape(name, y, dpooled.shape())?;
    let (oh, ow) = s.out_hw();
    if dpooled.shape() != [s.n, oh, ow, s.c] {
        return Err(mismatch(
            name,
            y.shape(),
            dpooled.shape(),
            format!(
                ": dpooled must have the pooled shape {:?}",
                [s.n, oh, ow, s.c]
            ),
        ));
    }
    run(
        &MAXPOOL_ACTIVATION_BIAS_GRAD,
        &[y, dpooled],
        |device, moved| {
            let dz = Tensor::uninit(y.shape(), dtype, device)?;
            let db = Tensor::uninit(&[s.c], grads.of(dtype), device)?;
            if s.c > 0 {
                with_kernels(device, |_, nk| {
                    nk.maxpool_activation_bias_grad(&moved[0], &moved[1], (&dz, &db), &s, act)
                })?;
            }
            Ok((dz, db))
        },
    )
}
