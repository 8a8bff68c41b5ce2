//! Depthwise convolutions (`DepthwiseConv2D`): forward, input and kernel gradients.

use crate::error::Result;
use crate::ops::gpu::nn as gn;
use crate::ops::spec::{Activation, ConvOptions, DepthwiseShape, Padding};
use crate::ops::{run, with_kernels};
use crate::placement::OpInfo;
use crate::shape;
use crate::tensor::{DType, Tensor};

use super::{check_options, float_dtype, mismatch, op, rank4, GradDType};

const DEPTHWISE: OpInfo = op("DepthwiseConv2dNative", gn::DEPTHWISE);
const DEPTHWISE_BACKWARD_INPUT: OpInfo = op("DepthwiseConv2dNativeBackpropInput", gn::DEPTHWISE);
const DEPTHWISE_BACKWARD_KERNEL: OpInfo = op(
    "DepthwiseConv2dNativeBackpropFilter",
    gn::DEPTHWISE_BACKWARD_KERNEL,
);

/// A depthwise convolution's shape from `x` `[n, h, w, c]` and the kernel
/// `[kh, kw, c, multiplier]`.
pub(super) fn depthwise_shape(
    op: &'static str,
    x: &[usize],
    k: &[usize],
    options: ConvOptions,
) -> Result<DepthwiseShape> {
    check_options(op, &options)?;
    let [n, h, w, c] = rank4(op, x, k, "the input (NHWC)")?;
    let [kh, kw, kc, multiplier] = rank4(op, k, x, "the kernel ([kh, kw, c, multiplier])")?;
    if kc != c || multiplier == 0 {
        return Err(mismatch(
            op,
            x,
            k,
            format!(": the kernel must be [kh, kw, {c}, multiplier >= 1] for {c} channels"),
        ));
    }
    if kh == 0 || kw == 0 {
        return Err(mismatch(op, x, k, ": the kernel must be at least 1x1"));
    }
    Ok(DepthwiseShape {
        n,
        h,
        w,
        c,
        kh,
        kw,
        multiplier,
        padding: options.padding,
        strides: options.strides,
        dilation: options.dilation,
    })
}

/// Depthwise 2-D convolution, 'same' padding, stride 1, depth multiplier 1, no bias: the first
/// half of Keras' `SeparableConv2D` (`tf.nn.depthwise_conv2d(x, kernel, [1, 1, 1, 1], "SAME")`).
/// [`depthwise_conv2d_with`] takes strides, dilation, padding and a depth multiplier.
///
/// `x` `[n, h, w, c]`, `kernel` `[kh, kw, c, 1]`; the output has `x`'s shape.
///
/// # Errors
/// Tensors not all float32 or all float16; shapes that do not fit together.
pub fn depthwise_conv2d(x: &Tensor, kernel: &Tensor) -> Result<Tensor> {
    if kernel.shape().get(3).is_some_and(|&m| m != 1) {
        return Err(mismatch(
            DEPTHWISE.name,
            x.shape(),
            kernel.shape(),
            ": the kernel must be [kh, kw, c, 1] (depth multiplier 1; depthwise_conv2d_with \
             takes others)",
        ));
    }
    depthwise_conv2d_with(x, kernel, None, Padding::Same, Activation::Linear)
}

/// Depthwise 2-D convolution with bias and activation fused (Keras' `DepthwiseConv2D`:
/// `tf.nn.depthwise_conv2d(x, kernel, strides, padding, dilations)` + `tf.nn.bias_add` + the
/// activation): `x` `[n, h, w, c]`, `kernel` `[kh, kw, c, multiplier]`, `bias`
/// `[c * multiplier]`, output `[n, oh, ow, c * multiplier]`, channel `c * multiplier + q` being
/// input channel `c` correlated with `kernel[.., c, q]`; `options` as [`conv2d`](crate::ops::conv2d)'s.
///
/// ```
/// use anygpu::ops::{self, spec::{Activation, ConvOptions, Padding}};
/// use anygpu::Tensor;
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let x = Tensor::from_vec(vec![1.0f32, 10.0, 2.0, 20.0], &[1, 1, 2, 2])?;
/// let k = Tensor::from_vec(vec![1.0f32, -1.0, 0.5, 2.0], &[1, 1, 2, 2])?; // multiplier 2
/// let opts = ConvOptions::new(Padding::Valid).strides(2);
/// let y = ops::depthwise_conv2d_with(&x, &k, None, opts, Activation::Linear)?;
/// assert_eq!(y.shape(), [1, 1, 1, 4]);
/// assert_eq!(y.to_vec::<f32>()?, [1.0, -1.0, 5.0, 20.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// Tensors not all float32 or all float16; shapes that do not fit together; bad strides or dilation (as
/// [`conv2d`](crate::ops::conv2d)).
pub fn depthwise_conv2d_with(
    x: &Tensor,
    kernel: &Tensor,
    bias: Option<&Tensor>,
    options: impl Into<ConvOptions>,
    act: Activation,
) -> Result<Tensor> {
    let name = DEPTHWISE.name;
    let dtype = float_dtype(name, &[x, kernel])?;
    let s = depthwise_shape(name, x.shape(), kernel.shape(), options.into())?;
    if let Some(b) = bias {
        b.expect_dtype("BiasAdd", dtype)?;
        if b.shape() != [s.c_out()] {
            return Err(mismatch(
                "BiasAdd",
                kernel.shape(),
                b.shape(),
                format!(": the bias must have shape [{}]", s.c_out()),
            ));
        }
    }
    let (oh, ow) = s.out_hw();
    let mut inputs = vec![x, kernel];
    inputs.extend(bias);
    run(&DEPTHWISE, &inputs, |device, moved| {
        let y = Tensor::uninit(&[s.n, oh, ow, s.c_out()], dtype, device)?;
        with_kernels(device, |_, nk| {
            if moved.len() == 2 && act == Activation::Linear {
                nk.depthwise(&moved[0], &moved[1], &y, &s)
            } else {
                nk.depthwise_bias_act(&moved[0], &moved[1], moved.get(2), &y, &s, act)
            }
        })?;
        Ok(y)
    })
}

/// Gradient of [`depthwise_conv2d`] w.r.t. its input
/// (`tf.raw_ops.DepthwiseConv2dNativeBackpropInput`); `dy` has the input's shape.
///
/// # Errors
/// Tensors not all float32 or all float16; shapes that do not fit together.
pub fn depthwise_conv2d_backward_input(dy: &Tensor, kernel: &Tensor) -> Result<Tensor> {
    depthwise_conv2d_backward_input_with(dy, kernel, dy.shape(), Padding::Same)
}

/// Gradient of [`depthwise_conv2d_with`] w.r.t. its input
/// (`tf.raw_ops.DepthwiseConv2dNativeBackpropInput`): `dy` `[n, oh, ow, c * multiplier]`,
/// `input_shape` the forward input's `[n, h, w, c]`, `options` the forward pass's.
///
/// # Errors
/// Tensors not all float32 or all float16; shapes that do not fit together.
pub fn depthwise_conv2d_backward_input_with(
    dy: &Tensor,
    kernel: &Tensor,
    input_shape: &[usize],
    options: impl Into<ConvOptions>,
) -> Result<Tensor> {
    let name = DEPTHWISE_BACKWARD_INPUT.name;
    let dtype = float_dtype(name, &[dy, kernel])?;
    shape::num_elements(input_shape, DType::F32)?;
    let s = depthwise_shape(name, input_shape, kernel.shape(), options.into())?;
    check_depthwise_dy(name, &s, dy.shape())?;
    run(&DEPTHWISE_BACKWARD_INPUT, &[dy, kernel], |device, moved| {
        let dx = Tensor::uninit(input_shape, dtype, device)?;
        with_kernels(device, |_, nk| {
            nk.depthwise_backward_input(&moved[0], &moved[1], &dx, &s)
        })?;
        Ok(dx)
    })
}

/// `dy` must have the forward output's shape.
fn check_depthwise_dy(name: &'static str, s: &DepthwiseShape, dy: &[usize]) -> Result<()> {
    let (oh, ow) = s.out_hw();
    let expected = [s.n, oh, ow, s.c_out()];
    if dy != expected {
        return Err(mismatch(
            name,
            dy,
            &expected,
            format!(": dy must have the forward output's shape {expected:?}"),
        ));
    }
    Ok(())
}

/// Gradient of [`depthwise_conv2d`] w.r.t. its kernel
/// (`tf.raw_ops.DepthwiseConv2dNativeBackpropFilter`); `kernel_shape` is `[kh, kw, c, 1]`.
///
/// # Errors
/// Tensors not all float32 or all float16; `x` and `dy` of different shapes; a kernel shape that does not fit.
pub fn depthwise_conv2d_backward_kernel(
    x: &Tensor,
    dy: &Tensor,
    kernel_shape: &[usize],
) -> Result<Tensor> {
    depthwise_conv2d_backward_kernel_with(x, dy, kernel_shape, Padding::Same)
}

/// Gradient of [`depthwise_conv2d_with`] w.r.t. its kernel `[kh, kw, c, multiplier]`
/// (`tf.raw_ops.DepthwiseConv2dNativeBackpropFilter`); `options` the forward pass's.
///
/// # Errors
/// Tensors not all float32 or all float16; shapes that do not fit together.
pub fn depthwise_conv2d_backward_kernel_with(
    x: &Tensor,
    dy: &Tensor,
    kernel_shape: &[usize],
    options: impl Into<ConvOptions>,
) -> Result<Tensor> {
    depthwise_conv2d_backward_kernel_as(x, dy, kernel_shape, options, GradDType::Inputs)
}

/// [`depthwise_conv2d_backward_kernel_with`] with the gradient in `grads`' dtype.
pub fn depthwise_conv2d_backward_kernel_as(
    x: &Tensor,
    dy: &Tensor,
    kernel_shape: &[usize],
    options: impl Into<ConvOptions>,
    grads: GradDType,
) -> Result<Tensor> {
    let name = DEPTHWISE_BACKWARD_KERNEL.name;
    let dtype = grads.of(float_dtype(name, &[x, dy])?);
    shape::num_elements(kernel_shape, DType::F32)?;
    let s = depthwise_shape(name, x.shape(), kernel_shape, options.into())?;
    check_depthwise_dy(name, &s, dy.shape())?;
    run(&DEPTHWISE_BACKWARD_KERNEL, &[x, dy], |device, moved| {
        let dk = Tensor::uninit(kernel_shape, dtype, device)?;
        with_kernels(device, |_, nk| {
            nk.depthwise_backward_kernel(&moved[0], &moved[1], &dk, &s)
        })?;
        Ok(dk)
    })
}
