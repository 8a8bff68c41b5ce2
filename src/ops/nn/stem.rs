//! A model's stem in one op: a stride-1 convolution, the separable convolution after it and a
//! 2×2 max-pool after that (the tutorial CNN's first three layers), and its gradients.
//!
//! Run as separate ops, the convolution's output (12.8 MB for the tutorial at batch 128) is
//! written, read by the separable convolution's forward and backward passes, and its gradient
//! is written and read back: four passes over the largest activation of the model. Here, on
//! the CPU, each block of images goes through the convolution in cache, and the backward pass
//! recomputes it from the stem's small input; a GPU runs the separate kernels.

use crate::error::{Error, Result};
use crate::ops::gpu::nn as gn;
use crate::ops::spec::{Activation, ConvOptions};
use crate::placement::OpInfo;
use crate::tensor::Tensor;

use super::conv::conv_shape;
use super::separable::{
    separable_forward, separable_grads, Kept, Pool, SeparableBackwardOptions, Stem,
};
use super::{float_dtype, mismatch, op};

const STEM_MAX_POOL: OpInfo = op("FusedConv2DSeparableConv2DMaxPool", gn::SEPARABLE_MAX_POOL);
const STEM_MAX_POOL_BACKWARD: OpInfo = op(
    "FusedConv2DSeparableConv2DMaxPoolGrad",
    gn::SEPARABLE_MAX_POOL_BACKWARD,
);

/// The convolution in front of a separable one in [`conv2d_separable_conv2d_max_pool`]:
/// `act(conv2d(x, kernel, options) + bias)`, as [`conv2d`](crate::ops::conv2d) takes it, with
/// strides and dilation 1.
#[derive(Clone, Copy, Debug)]
pub struct ConvStem<'a> {
    /// Kernel `[kh, kw, c_in, c]`.
    pub kernel: &'a Tensor,
    /// Bias `[c]`.
    pub bias: Option<&'a Tensor>,
    /// Padding (strides and dilation must be 1).
    pub options: ConvOptions,
    /// Activation.
    pub act: Activation,
}

impl<'a> ConvStem<'a> {
    /// The stem's shape from its input `x`, checked.
    pub(super) fn checked(&self, op: &'static str, x: &Tensor) -> Result<Stem<'a>> {
        let dtype = float_dtype(op, &[x, self.kernel])?;
        let s = conv_shape(op, x.shape(), self.kernel.shape(), self.options)?;
        if !s.is_unit_stride() {
            return Err(Error::InvalidArgument(format!(
                "{op}: the convolution in front must have strides and dilation 1, got \
                 strides {:?} and dilation {:?} (run conv2d, then the separable convolution)",
                s.strides, s.dilation
            )));
        }
        if let Some(b) = self.bias {
            b.expect_dtype("BiasAdd", dtype)?;
            if b.shape() != [s.c_out] {
                return Err(mismatch(
                    "BiasAdd",
                    self.kernel.shape(),
                    b.shape(),
                    format!(": the bias must have shape [{}]", s.c_out),
                ));
            }
        }
        let (oh, ow) = s.out_hw();
        Ok(Stem {
            kernel: self.kernel,
            bias: self.bias,
            s,
            act: self.act,
            out: [s.n, oh, ow, s.c_out],
        })
    }
}

/// [`separable_conv2d_max_pool`](crate::ops::separable_conv2d_max_pool) of the convolution
/// `stem` of `x`, in one op: returns `(y, pooled)`, the separable convolution's output (the
/// pool's backward pass needs it) and its 2×2 max-pool. The convolution's own output is not
/// returned: on the CPU it never leaves the cache (see
/// [`conv2d_separable_conv2d_max_pool_backward`]).
///
/// ```
/// use anygpu::ops::{self, spec::{Activation, Padding}, ConvStem};
/// use anygpu::Tensor;
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, 0.5], &[1, 2, 2, 1])?;
/// let kernel = Tensor::from_vec(vec![2.0f32, -1.0], &[1, 1, 1, 2])?;
/// let stem = ConvStem { kernel: &kernel, bias: None, options: Padding::Same.into(), act: Activation::Relu };
/// let depthwise = Tensor::from_vec(vec![1.0f32, 1.0], &[1, 1, 2, 1])?;
/// let pointwise = Tensor::from_vec(vec![1.0f32, 1.0], &[1, 1, 2, 1])?;
/// let (y, pooled) = ops::conv2d_separable_conv2d_max_pool(
///     &x, stem, &depthwise, &pointwise, None, Activation::Linear)?;
/// // relu(2x) + relu(-x) per pixel.
/// assert_eq!(y.to_vec::<f32>()?, [2.0, 2.0, 6.0, 1.0]);
/// assert_eq!(pooled.to_vec::<f32>()?, [6.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// Non-float tensors or mixed dtypes; shapes that do not fit together (named in the
/// message); a strided or dilated convolution.
pub fn conv2d_separable_conv2d_max_pool(
    x: &Tensor,
    stem: ConvStem<'_>,
    depthwise: &Tensor,
    pointwise: &Tensor,
    bias: Option<&Tensor>,
    act: Activation,
) -> Result<(Tensor, Tensor)> {
    let checked = stem.checked(STEM_MAX_POOL.name, x)?;
    let info = (&STEM_MAX_POOL, Pool::Pooled);
    let out = separable_forward(info, x, Some(&checked), [depthwise, pointwise], bias, act)?;
    Ok(out.y_and_pooled())
}

/// The weight gradients of [`conv2d_separable_conv2d_max_pool`].
#[derive(Debug)]
pub struct ConvSeparableGrads {
    /// W.r.t. the convolution's kernel.
    pub conv_kernel: Tensor,
    /// W.r.t. the convolution's bias `[c]` (given even when it has none).
    pub conv_bias: Tensor,
    /// W.r.t. the depthwise kernel `[kh, kw, c, 1]`.
    pub depthwise: Tensor,
    /// W.r.t. the pointwise kernel `[1, 1, c, filters]`.
    pub pointwise: Tensor,
    /// W.r.t. the separable convolution's bias `[filters]`.
    pub bias: Tensor,
}

/// The weight gradients of [`conv2d_separable_conv2d_max_pool`] from `dpooled`, the gradient
/// w.r.t. the pooled output; `y` is the separable convolution's output the forward op
/// returned. What [`conv2d`](crate::ops::conv2d)'s weight gradients after
/// [`separable_conv2d_max_pool_backward`](crate::ops::separable_conv2d_max_pool_backward)
/// give, without the gradient w.r.t. `x` (a model's first layer needs none).
///
/// On the CPU each block of images recomputes the convolution's output from `x`, goes through
/// the separable convolution's gradients and gives the convolution's from the gradient of its
/// pre-activation output, all in cache: neither that output nor its gradient is ever written
/// to memory.
///
/// ```
/// use anygpu::ops::{self, spec::{Activation, Padding}, ConvStem};
/// use anygpu::Tensor;
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, 0.5], &[1, 2, 2, 1])?;
/// let kernel = Tensor::from_vec(vec![2.0f32], &[1, 1, 1, 1])?;
/// let stem = ConvStem { kernel: &kernel, bias: None, options: Padding::Same.into(), act: Activation::Linear };
/// let depthwise = Tensor::from_vec(vec![1.0f32], &[1, 1, 1, 1])?;
/// let pointwise = Tensor::from_vec(vec![1.0f32], &[1, 1, 1, 1])?;
/// let (y, _) = ops::conv2d_separable_conv2d_max_pool(
///     &x, stem, &depthwise, &pointwise, None, Activation::Linear)?;
/// let dpooled = Tensor::from_vec(vec![1.0f32], &[1, 1, 1, 1])?;
/// let g = ops::conv2d_separable_conv2d_max_pool_backward(
///     &x, stem, [&depthwise, &pointwise], &y, &dpooled, Activation::Linear)?;
/// // Only the window's maximum (x = 3) passes the gradient back.
/// assert_eq!(g.conv_kernel.to_vec::<f32>()?, [3.0]);
/// assert_eq!(g.conv_bias.to_vec::<f32>()?, [1.0]);
/// assert_eq!(g.pointwise.to_vec::<f32>()?, [6.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// As [`conv2d_separable_conv2d_max_pool`]; `y` or `dpooled` of the wrong shape.
pub fn conv2d_separable_conv2d_max_pool_backward(
    x: &Tensor,
    stem: ConvStem<'_>,
    [depthwise, pointwise]: [&Tensor; 2],
    y: &Tensor,
    dpooled: &Tensor,
    act: Activation,
) -> Result<ConvSeparableGrads> {
    let kept = (Kept::Output(y), dpooled);
    stem_grads(
        &STEM_MAX_POOL_BACKWARD,
        x,
        stem,
        [depthwise, pointwise],
        kept,
        act,
    )
}

/// The gradients of the stem op `info` from what its forward pass `kept` and `dpooled`.
pub(super) fn stem_grads(
    info: &OpInfo,
    x: &Tensor,
    stem: ConvStem<'_>,
    weights: [&Tensor; 2],
    (kept, dpooled): (Kept<'_>, &Tensor),
    act: Activation,
) -> Result<ConvSeparableGrads> {
    let checked = stem.checked(info.name, x)?;
    let options = SeparableBackwardOptions {
        pooled: true,
        need_dx: false,
        input_activation: Activation::Linear,
    };
    let (g, d_stem) = separable_grads(
        (info, options),
        x,
        Some(&checked),
        weights,
        (kept, dpooled),
        act,
    )?;
    let Some([conv_kernel, conv_bias]) = d_stem else {
        unreachable!("separable_grads returns a stem's gradients")
    };
    Ok(ConvSeparableGrads {
        conv_kernel,
        conv_bias,
        depthwise: g.depthwise,
        pointwise: g.pointwise,
        bias: g.bias,
    })
}
