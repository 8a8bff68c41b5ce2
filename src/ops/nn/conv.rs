//! Convolutions (`Conv2D`): the forward op with bias and activation fused, its input and
//! kernel gradients, the fused weight gradient, and the 1×1 (pointwise) convolution.

use crate::error::Result;
use crate::ops::gpu::nn as gn;
use crate::ops::nn_kernels::ConvWeightGrads;
use crate::ops::spec::{Activation, Conv2dShape, ConvOptions, Padding};
use crate::ops::{run, with_kernels};
use crate::placement::OpInfo;
use crate::shape;
use crate::tensor::{DType, Tensor};

use super::{check_options, float_dtype, mismatch, op, rank4, GradDType};

const CONV2D: OpInfo = op("Conv2D", gn::CONV2D);
const CONV2D_BACKWARD_INPUT: OpInfo = op("Conv2DBackpropInput", gn::CONV2D_BACKWARD_INPUT);
const CONV2D_BACKWARD_KERNEL: OpInfo = op("Conv2DBackpropFilter", gn::CONV2D_BACKWARD_KERNEL);
const CONV2D_BACKWARD_WEIGHTS: OpInfo = op("FusedConv2DWeightGrad", gn::CONV2D_BACKWARD_WEIGHTS);

/// A convolution's shape from its input `[n, h, w, c_in]` and kernel `[kh, kw, c_in, c_out]`
/// shapes, checked.
pub(super) fn conv_shape(
    op: &'static str,
    x: &[usize],
    k: &[usize],
    options: ConvOptions,
) -> Result<Conv2dShape> {
    check_options(op, &options)?;
    let [n, h, w, c_in] = rank4(op, x, k, "the input (NHWC)")?;
    let [kh, kw, kc, c_out] = rank4(op, k, x, "the kernel (HWIO)")?;
    if kc != c_in {
        return Err(mismatch(
            op,
            x,
            k,
            format!(": the input has {c_in} channels but the kernel expects {kc}"),
        ));
    }
    if kh == 0 || kw == 0 {
        return Err(mismatch(op, x, k, ": the kernel must be at least 1x1"));
    }
    if c_in == 0 {
        return Err(mismatch(op, x, k, ": the input has no channels"));
    }
    Ok(Conv2dShape {
        n,
        h,
        w,
        c_in,
        c_out,
        kh,
        kw,
        padding: options.padding,
        strides: options.strides,
        dilation: options.dilation,
    })
}

/// 2-D convolution with bias and activation fused: `act(conv2d(x, kernel) + bias)`.
///
/// Keras `Conv2D(filters, (kh, kw), strides=..., padding=..., dilation_rate=...,
/// activation=...)`, i.e. `tf.nn.conv2d(x, kernel, strides, padding="SAME"|"VALID",
/// dilations)` + `tf.nn.bias_add` + the activation. `x` is `[n, h, w, c_in]` (NHWC), `kernel`
/// `[kh, kw, c_in, c_out]` (HWIO), `bias` `[c_out]`; `options` is a [`Padding`] (stride 1) or
/// a [`ConvOptions`]; the output is `[n, oh, ow, c_out]` with [`crate::ops::spec::Axis`]'s sizes
/// (`[n, h, w, c_out]` for 'same' at stride 1; empty when a 'valid' kernel is larger than the
/// input).
///
/// ```
/// use anygpu::ops::{self, spec::{Activation, ConvOptions, Padding}};
/// use anygpu::Tensor;
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let x = Tensor::from_vec((0..7).map(|v| v as f32).collect(), &[1, 1, 7, 1])?;
/// let k = Tensor::from_vec(vec![1.0f32, 1.0, 1.0], &[1, 3, 1, 1])?;
/// // 'same', stride 2: ceil(7 / 2) = 4 outputs, one zero on each side.
/// let opts = ConvOptions::new(Padding::Same).strides(2);
/// let y = ops::conv2d(&x, &k, None, opts, Activation::Linear)?;
/// assert_eq!(y.to_vec::<f32>()?, [1.0, 6.0, 12.0, 11.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// Tensors not all float32 or all float16; shapes that do not fit together (named in the message); a stride or
/// dilation of 0, or strides and dilation both above 1 (Keras' message).
pub fn conv2d(
    x: &Tensor,
    kernel: &Tensor,
    bias: Option<&Tensor>,
    options: impl Into<ConvOptions>,
    act: Activation,
) -> Result<Tensor> {
    let name = CONV2D.name;
    let dtype = float_dtype(name, &[x, kernel])?;
    let s = conv_shape(name, x.shape(), kernel.shape(), options.into())?;
    if let Some(b) = bias {
        b.expect_dtype("BiasAdd", dtype)?;
        if b.shape() != [s.c_out] {
            return Err(mismatch(
                "BiasAdd",
                kernel.shape(),
                b.shape(),
                format!(": the bias must have shape [{}]", s.c_out),
            ));
        }
    }
    let (oh, ow) = s.out_hw();
    let mut inputs = vec![x, kernel];
    inputs.extend(bias);
    run(&CONV2D, &inputs, |device, moved| {
        let y = Tensor::uninit(&[s.n, oh, ow, s.c_out], dtype, device)?;
        with_kernels(device, |_, nk| {
            nk.conv2d(&moved[0], &moved[1], moved.get(2), &y, &s, act)
        })?;
        Ok(y)
    })
}

/// Gradient of a 2-D convolution w.r.t. its input: `tf.nn.conv2d_transpose`-like
/// (`tf.raw_ops.Conv2DBackpropInput`), from `dz`, the gradient w.r.t. the convolution's
/// pre-activation output `[n, oh, ow, c_out]` (apply [`activation_backward`](crate::ops::activation_backward) first).
///
/// `input_shape` is the forward input's `[n, h, w, c_in]`; `kernel` `[kh, kw, c_in, c_out]`;
/// `options` the forward pass's.
///
/// # Errors
/// Tensors not all float32 or all float16; a `dz` whose shape is not the forward output's.
pub fn conv2d_backward_input(
    dz: &Tensor,
    kernel: &Tensor,
    input_shape: &[usize],
    options: impl Into<ConvOptions>,
) -> Result<Tensor> {
    let name = CONV2D_BACKWARD_INPUT.name;
    let dtype = float_dtype(name, &[dz, kernel])?;
    // A shape argument is checked like a tensor's before any arithmetic on its dimensions.
    shape::num_elements(input_shape, DType::F32)?;
    let s = conv_shape(name, input_shape, kernel.shape(), options.into())?;
    let (oh, ow) = s.out_hw();
    let expected = [s.n, oh, ow, s.c_out];
    if dz.shape() != expected {
        return Err(mismatch(
            name,
            dz.shape(),
            kernel.shape(),
            format!(
                ": dz must have the forward output's shape {expected:?} (input {input_shape:?})"
            ),
        ));
    }
    run(&CONV2D_BACKWARD_INPUT, &[dz, kernel], |device, moved| {
        let dx = Tensor::uninit(input_shape, dtype, device)?;
        with_kernels(device, |_, nk| {
            nk.conv2d_backward_input(&moved[0], &moved[1], &dx, &s)
        })?;
        Ok(dx)
    })
}

/// Gradient of a 2-D convolution w.r.t. its kernel (`tf.raw_ops.Conv2DBackpropFilter`):
/// `dk[a, b, c, o] = Σ_{n, i, j} x[n, i·sh + a·dh - pt, j·sw + b·dw - pl, c] · dz[n, i, j, o]`.
///
/// `kernel_shape` is `[kh, kw, c_in, c_out]`; `dz` the gradient w.r.t. the pre-activation output.
///
/// # Errors
/// Tensors not all float32 or all float16; shapes that do not fit together.
pub fn conv2d_backward_kernel(
    x: &Tensor,
    dz: &Tensor,
    kernel_shape: &[usize],
    options: impl Into<ConvOptions>,
) -> Result<Tensor> {
    conv2d_backward_kernel_as(x, dz, kernel_shape, options, GradDType::Inputs)
}

/// [`conv2d_backward_kernel`] with the gradient in `grads`' dtype.
pub fn conv2d_backward_kernel_as(
    x: &Tensor,
    dz: &Tensor,
    kernel_shape: &[usize],
    options: impl Into<ConvOptions>,
    grads: GradDType,
) -> Result<Tensor> {
    let name = CONV2D_BACKWARD_KERNEL.name;
    let dtype = grads.of(float_dtype(name, &[x, dz])?);
    shape::num_elements(kernel_shape, DType::F32)?;
    let s = conv_shape(name, x.shape(), kernel_shape, options.into())?;
    let (oh, ow) = s.out_hw();
    let expected = [s.n, oh, ow, s.c_out];
    if dz.shape() != expected {
        return Err(mismatch(
            name,
            x.shape(),
            dz.shape(),
            format!(
                ": dz must have the forward output's shape {expected:?} (kernel {kernel_shape:?})"
            ),
        ));
    }
    run(&CONV2D_BACKWARD_KERNEL, &[x, dz], |device, moved| {
        let dk = Tensor::uninit(kernel_shape, dtype, device)?;
        with_kernels(device, |_, nk| {
            nk.conv2d_backward_kernel(&moved[0], &moved[1], &dk, &s)
        })?;
        Ok(dk)
    })
}

/// The kernel and bias gradients of `y = act(conv2d(x, kernel) + bias)` from `dy`, the gradient
/// w.r.t. the activated output `y`: with `dz = dy * act'(y)`, what [`conv2d_backward_kernel`]
/// and [`bias_grad`](crate::ops::bias_grad) give for `dz`, returned as `(kernel gradient, bias gradient)`.
///
/// One op for a model's first layer, which needs no input gradient: on the CPU it forms `dz`
/// block by block in cache, where the three separate ops would write it and read it twice
/// (12.8 MB each way for the tutorial's first layer at batch 128).
///
/// ```
/// use anygpu::ops::{self, spec::{Activation, Padding}};
/// use anygpu::Tensor;
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 1, 2, 1])?;
/// let y = Tensor::from_vec(vec![3.0f32, 0.0], &[1, 1, 2, 1])?; // relu output: the second is cut
/// let dy = Tensor::from_vec(vec![2.0f32, 5.0], &[1, 1, 2, 1])?;
/// let (dk, db) = ops::conv2d_backward_weights(&x, &y, &dy, &[1, 1, 1, 1], Padding::Same, Activation::Relu)?;
/// assert_eq!(dk.to_vec::<f32>()?, [2.0]); // x[0] * dz[0]
/// assert_eq!(db.to_vec::<f32>()?, [2.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// Tensors not all float32 or all float16; shapes that do not fit together.
pub fn conv2d_backward_weights(
    x: &Tensor,
    y: &Tensor,
    dy: &Tensor,
    kernel_shape: &[usize],
    options: impl Into<ConvOptions>,
    act: Activation,
) -> Result<(Tensor, Tensor)> {
    let grads = GradDType::Inputs;
    conv2d_backward_weights_as(x, y, dy, kernel_shape, options, act, grads)
}

/// [`conv2d_backward_weights`] with the gradients in `grads`' dtype.
pub fn conv2d_backward_weights_as(
    x: &Tensor,
    y: &Tensor,
    dy: &Tensor,
    kernel_shape: &[usize],
    options: impl Into<ConvOptions>,
    act: Activation,
    grads: GradDType,
) -> Result<(Tensor, Tensor)> {
    let name = CONV2D_BACKWARD_WEIGHTS.name;
    let dtype = grads.of(float_dtype(name, &[x, y, dy])?);
    shape::num_elements(kernel_shape, DType::F32)?;
    let s = conv_shape(name, x.shape(), kernel_shape, options.into())?;
    let (oh, ow) = s.out_hw();
    let expected = [s.n, oh, ow, s.c_out];
    for t in [y, dy] {
        if t.shape() != expected {
            return Err(mismatch(
                name,
                x.shape(),
                t.shape(),
                format!(
                    ": y and dy must have the forward output's shape {expected:?} (kernel \
                     {kernel_shape:?})"
                ),
            ));
        }
    }
    run(&CONV2D_BACKWARD_WEIGHTS, &[x, y, dy], |device, moved| {
        let dk = Tensor::uninit(kernel_shape, dtype, device)?;
        let db = Tensor::uninit(&[s.c_out], dtype, device)?;
        let g = ConvWeightGrads {
            x: &moved[0],
            y: &moved[1],
            dy: &moved[2],
            dk: &dk,
            db: &db,
            s,
            act,
        };
        with_kernels(device, |_, nk| nk.conv2d_backward_weights(&g))?;
        Ok((dk, db))
    })
}

/// Pointwise (1×1) convolution with bias and activation: the second half of Keras'
/// `SeparableConv2D` (`tf.nn.conv2d(x, kernel, 1, "VALID")` with a `[1, 1, c_in, c_out]`
/// kernel), i.e. the matrix product `[n*h*w, c_in] · [c_in, c_out]`. It runs the convolution
/// kernels (logged as `Conv2D`): on GPUs their register blocking makes them several times faster
/// than the general matrix product. Its gradients are [`conv2d_backward_input`] and
/// [`conv2d_backward_kernel`] with the `[1, 1, c_in, c_out]` kernel shape (or, equivalently,
/// [`matmul_transposed`](crate::ops::matmul_transposed) on the `[n*h*w, c]` reshapes).
///
/// # Errors
/// Tensors not all float32 or all float16; shapes that do not fit together.
pub fn pointwise_conv2d(
    x: &Tensor,
    kernel: &Tensor,
    bias: Option<&Tensor>,
    act: Activation,
) -> Result<Tensor> {
    let name = CONV2D.name;
    float_dtype(name, &[x, kernel])?;
    let s = conv_shape(name, x.shape(), kernel.shape(), Padding::Valid.into())?;
    if s.kh != 1 || s.kw != 1 {
        return Err(mismatch(
            name,
            x.shape(),
            kernel.shape(),
            ": a pointwise kernel must be [1, 1, c_in, c_out]",
        ));
    }
    conv2d(x, kernel, bias, Padding::Valid, act)
}
