//! The fused separable ops with a max-pool, in the form that keeps the pool's argmax instead
//! of the separable convolution's output (the CPU only).
//!
//! The backward pass of a pooled layer needs, of the forward pass's output `y`, only each
//! window's maximum and where it was. Kept whole, `y` is written once and read back once per
//! step (12.8 MB each way for the tutorial's first separable layer at batch 128); kept as the
//! pool's output (which the next layer keeps anyway) and an argmax, the forward pass writes a
//! quarter of that and `y` lives in cache block by block. Like TensorFlow's
//! `MaxPoolWithArgmax`, with the position inside the 2×2 window rather than a flat index.

use crate::error::{Error, Result};
use crate::ops::spec::Activation;
use crate::placement::OpInfo;
use crate::tensor::Tensor;

use super::separable::{
    separable_forward, separable_grads, Kept, Pool, SeparableBackwardOptions, SeparableConv2dGrads,
};
use super::stem::{stem_grads, ConvSeparableGrads, ConvStem};

/// No GPU kernels: placement runs these on the CPU.
const fn cpu_op(name: &'static str) -> OpInfo {
    OpInfo { name, gpu: None }
}

const SEPARABLE_ARGMAX: OpInfo = cpu_op("FusedSeparableConv2DMaxPoolWithArgmax");
const SEPARABLE_ARGMAX_BACKWARD: OpInfo = cpu_op("FusedSeparableConv2DMaxPoolGradWithArgmax");
const STEM_ARGMAX: OpInfo = cpu_op("FusedConv2DSeparableConv2DMaxPoolWithArgmax");
const STEM_ARGMAX_BACKWARD: OpInfo = cpu_op("FusedConv2DSeparableConv2DMaxPoolGradWithArgmax");

/// [`separable_conv2d_max_pool`](crate::ops::separable_conv2d_max_pool) returning
/// `(pooled, argmax)` instead of `(y, pooled)`: `argmax` (int32, the pooled output's shape)
/// says where each window's first maximum is, 0 (top left), 1 (top right), 2 (bottom left) or
/// 3 (bottom right). What [`separable_conv2d_max_pool_backward_with_argmax`] reads in place of
/// `y`.
///
/// ```
/// use anygpu::ops::{self, spec::Activation};
/// use anygpu::Tensor;
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, 0.5], &[1, 2, 2, 1])?;
/// let depthwise = Tensor::from_vec(vec![1.0f32], &[1, 1, 1, 1])?;
/// let pointwise = Tensor::from_vec(vec![2.0f32], &[1, 1, 1, 1])?;
/// let (pooled, argmax) = ops::separable_conv2d_max_pool_with_argmax(
///     &x, &depthwise, &pointwise, None, Activation::Linear)?;
/// assert_eq!(pooled.to_vec::<f32>()?, [6.0]);
/// assert_eq!(argmax.to_vec::<i32>()?, [2]); // bottom left
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// As [`separable_conv2d_max_pool`](crate::ops::separable_conv2d_max_pool); the op has no GPU
/// kernel (TensorFlow's placement errors when a GPU is asked for without soft placement).
pub fn separable_conv2d_max_pool_with_argmax(
    x: &Tensor,
    depthwise: &Tensor,
    pointwise: &Tensor,
    bias: Option<&Tensor>,
    act: Activation,
) -> Result<(Tensor, Tensor)> {
    let info = (&SEPARABLE_ARGMAX, Pool::WithArgmax);
    let out = separable_forward(info, x, None, [depthwise, pointwise], bias, act)?;
    Ok(out.pooled_and_argmax())
}

/// The gradients of [`separable_conv2d_max_pool_with_argmax`] from `dpooled`, as `options`
/// asks ([`separable_conv2d_backward_with`](crate::ops::separable_conv2d_backward_with)'s,
/// which must say `pooled`), from the `(pooled, argmax)` the forward op returned.
///
/// ```
/// use anygpu::ops::{self, spec::Activation, SeparableBackwardOptions};
/// use anygpu::Tensor;
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, 0.5], &[1, 2, 2, 1])?;
/// let depthwise = Tensor::from_vec(vec![1.0f32], &[1, 1, 1, 1])?;
/// let pointwise = Tensor::from_vec(vec![2.0f32], &[1, 1, 1, 1])?;
/// let (pooled, argmax) = ops::separable_conv2d_max_pool_with_argmax(
///     &x, &depthwise, &pointwise, None, Activation::Linear)?;
/// let dpooled = Tensor::from_vec(vec![1.0f32], &[1, 1, 1, 1])?;
/// let options = SeparableBackwardOptions { pooled: true, ..Default::default() };
/// let g = ops::separable_conv2d_max_pool_backward_with_argmax(
///     &x, [&depthwise, &pointwise], (&pooled, &argmax), &dpooled, Activation::Linear, options)?;
/// assert_eq!(g.dx.unwrap().to_vec::<f32>()?, [0.0, 0.0, 2.0, 0.0]);
/// assert_eq!(g.pointwise.to_vec::<f32>()?, [3.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// `options.pooled` false; as
/// [`separable_conv2d_max_pool_backward`](crate::ops::separable_conv2d_max_pool_backward),
/// with `pooled` and `argmax` of the pooled output's shape and `argmax` int32.
pub fn separable_conv2d_max_pool_backward_with_argmax(
    x: &Tensor,
    weights: [&Tensor; 2],
    (pooled, argmax): (&Tensor, &Tensor),
    dpooled: &Tensor,
    act: Activation,
    options: SeparableBackwardOptions,
) -> Result<SeparableConv2dGrads> {
    let info = &SEPARABLE_ARGMAX_BACKWARD;
    if !options.pooled {
        return Err(Error::InvalidArgument(format!(
            "{}: the argmax form is the pooled op's (options.pooled must be true)",
            info.name
        )));
    }
    let kept = (Kept::Argmax { pooled, argmax }, dpooled);
    let (grads, _) = separable_grads((info, options), x, None, weights, kept, act)?;
    Ok(grads)
}

/// [`conv2d_separable_conv2d_max_pool`](crate::ops::conv2d_separable_conv2d_max_pool)
/// returning `(pooled, argmax)` as [`separable_conv2d_max_pool_with_argmax`] does.
///
/// ```
/// use anygpu::ops::{self, spec::{Activation, Padding}, ConvStem};
/// use anygpu::Tensor;
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, 0.5], &[1, 2, 2, 1])?;
/// let kernel = Tensor::from_vec(vec![2.0f32], &[1, 1, 1, 1])?;
/// let stem = ConvStem { kernel: &kernel, bias: None, options: Padding::Same.into(), act: Activation::Relu };
/// let depthwise = Tensor::from_vec(vec![1.0f32], &[1, 1, 1, 1])?;
/// let pointwise = Tensor::from_vec(vec![1.0f32], &[1, 1, 1, 1])?;
/// let (pooled, argmax) = ops::conv2d_separable_conv2d_max_pool_with_argmax(
///     &x, stem, &depthwise, &pointwise, None, Activation::Linear)?;
/// assert_eq!((pooled.to_vec::<f32>()?, argmax.to_vec::<i32>()?), (vec![6.0], vec![2]));
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// As [`conv2d_separable_conv2d_max_pool`](crate::ops::conv2d_separable_conv2d_max_pool);
/// the op has no GPU kernel.
pub fn conv2d_separable_conv2d_max_pool_with_argmax(
    x: &Tensor,
    stem: ConvStem<'_>,
    depthwise: &Tensor,
    pointwise: &Tensor,
    bias: Option<&Tensor>,
    act: Activation,
) -> Result<(Tensor, Tensor)> {
    let checked = stem.checked(STEM_ARGMAX.name, x)?;
    let info = (&STEM_ARGMAX, Pool::WithArgmax);
    let weights = [depthwise, pointwise];
    let out = separable_forward(info, x, Some(&checked), weights, bias, act)?;
    Ok(out.pooled_and_argmax())
}

/// The weight gradients of [`conv2d_separable_conv2d_max_pool_with_argmax`] from `dpooled`
/// and the `(pooled, argmax)` it returned, as
/// [`conv2d_separable_conv2d_max_pool_backward`](crate::ops::conv2d_separable_conv2d_max_pool_backward)
/// gives them from `y`.
///
/// # Errors
/// As [`conv2d_separable_conv2d_max_pool_backward`](crate::ops::conv2d_separable_conv2d_max_pool_backward),
/// with `pooled` and `argmax` of the pooled output's shape and `argmax` int32.
pub fn conv2d_separable_conv2d_max_pool_backward_with_argmax(
    x: &Tensor,
    stem: ConvStem<'_>,
    weights: [&Tensor; 2],
    (pooled, argmax): (&Tensor, &Tensor),
    dpooled: &Tensor,
    act: Activation,
) -> Result<ConvSeparableGrads> {
    let kept = (Kept::Argmax { pooled, argmax }, dpooled);
    stem_grads(&STEM_ARGMAX_BACKWARD, x, stem, weights, kept, act)
}
