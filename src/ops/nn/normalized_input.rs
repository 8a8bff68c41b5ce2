//! A convolution of a batch normalization's output through a ReLU, read from the
//! normalization's input: the normalized values are formed where a strided convolution copies
//! its input anyway (its zero-padded images, or its patch matrix's source in scratch memory),
//! in the forward pass and again in the kernel gradient, instead of written whole by the
//! normalization and read back (12.8 MB each way for the modern CNN's first block at batch
//! 128). The normalization's own passes take the statistics only
//! ([`batch_normalization_statistics_training`](crate::ops::norm::batch_normalization_statistics_training))
//! and its usual ReLU gradient. The CPU only, float32.

use crate::error::Result;
use crate::ops::cpu::normalized_input::reads_in_place;
use crate::ops::norm::check_normalization;
use crate::ops::spec::{Activation, Conv2dShape, ConvOptions};
use crate::ops::{run, with_kernels, NormalizedInput};
use crate::placement::OpInfo;
use crate::tensor::{DType, Tensor};

use super::conv::conv_shape;
use super::mismatch;

/// No GPU kernels: placement runs them on the CPU.
const CONV_NORMALIZED: OpInfo = OpInfo {
    name: "FusedBatchNormReluConv2D",
    gpu: None,
};
const CONV_NORMALIZED_KERNEL_GRAD: OpInfo = OpInfo {
    name: "FusedBatchNormReluConv2DBackpropFilter",
    gpu: None,
};

/// Whether a convolution with `kernel_shape` and `options` of an `[n, h, w, c]` input forms
/// the normalized values where it copies its input anyway (a strided or dilated one). Other
/// shapes run [`conv2d_normalized_input`] too, normalizing into memory first, which saves
/// nothing.
pub(crate) fn conv2d_reads_normalized_input(
    input_shape: &[usize],
    kernel_shape: &[usize],
    options: ConvOptions,
) -> bool {
    let name = CONV_NORMALIZED.name;
    conv_shape(name, input_shape, kernel_shape, options).is_ok_and(|s| reads_in_place(&s))
}

/// The shape of a convolution of `x` with a `kernel_shape` kernel, `x`'s tensors checked
/// (float32, the normalization's variables and statistics over its channels).
fn checked_shape(
    name: &'static str,
    x: &NormalizedInput<'_>,
    kernel_shape: &[usize],
    options: ConvOptions,
) -> Result<Conv2dShape> {
    x.z.expect_dtype(name, DType::F32)?;
    let s = conv_shape(name, x.z.shape(), kernel_shape, options)?;
    check_normalization(name, s.c_in, (x.gamma, Some(x.beta)), x.stats)?;
    Ok(s)
}

/// `act(conv2d(max(normalized z, 0), kernel) + bias)`: what
/// [`conv2d`](crate::ops::conv2d) gives for the output of
/// [`batch_normalization_relu_training`](crate::ops::norm::batch_normalization_relu_training)
/// of `x.z`, to the bit, from `z` and the training pass's statistics.
///
/// # Errors
/// Tensors not all float32; shapes that do not fit together (the kernel's input channels
/// must be `z`'s, `gamma` and `beta` `[c]`, `stats` `[2, c]`).
pub(crate) fn conv2d_normalized_input(
    x: NormalizedInput<'_>,
    kernel: &Tensor,
    bias: Option<&Tensor>,
    options: ConvOptions,
    act: Activation,
) -> Result<Tensor> {
    let name = CONV_NORMALIZED.name;
    let s = checked_shape(name, &x, kernel.shape(), options)?;
    kernel.expect_dtype(name, DType::F32)?;
    if let Some(b) = bias {
        b.expect_dtype(name, DType::F32)?;
        if b.shape() != [s.c_out] {
            let hint = format!(": the bias must have shape [{}]", s.c_out);
            return Err(mismatch(name, kernel.shape(), b.shape(), hint));
        }
    }
    let (oh, ow) = s.out_hw();
    let mut inputs = vec![x.z, x.gamma, x.beta, x.stats, kernel];
    inputs.extend(bias);
    run(&CONV_NORMALIZED, &inputs, |device, moved| {
        let y = Tensor::uninit(&[s.n, oh, ow, s.c_out], DType::F32, device)?;
        let x = moved_input(moved);
        let weights = (&moved[4], moved.get(5));
        with_kernels(device, |_, nk| {
            nk.conv2d_normalized_input(&x, weights, &y, &s, act)
        })?;
        Ok(y)
    })
}

/// The kernel gradient of [`conv2d_normalized_input`] from `dz`, the gradient w.r.t. its
/// pre-activation output: what
/// [`conv2d_backward_kernel_as`](crate::ops::conv2d_backward_kernel_as) gives (float32) for
/// the normalized input.
///
/// # Errors
/// As [`conv2d_normalized_input`]; a `dz` whose shape is not the forward output's.
pub(crate) fn conv2d_backward_kernel_normalized_input(
    x: NormalizedInput<'_>,
    dz: &Tensor,
    kernel_shape: &[usize],
    options: ConvOptions,
) -> Result<Tensor> {
    let name = CONV_NORMALIZED_KERNEL_GRAD.name;
    let s = checked_shape(name, &x, kernel_shape, options)?;
    dz.expect_dtype(name, DType::F32)?;
    let (oh, ow) = s.out_hw();
    let expected = [s.n, oh, ow, s.c_out];
    if dz.shape() != expected {
        let hint = format!(": dz must have the forward output's shape (kernel {kernel_shape:?})");
        return Err(mismatch(name, &expected, dz.shape(), hint));
    }
    let inputs = [x.z, x.gamma, x.beta, x.stats, dz];
    run(&CONV_NORMALIZED_KERNEL_GRAD, &inputs, |device, moved| {
        let dk = Tensor::uninit(kernel_shape, DType::F32, device)?;
        let x = moved_input(moved);
        with_kernels(device, |_, nk| {
            nk.conv2d_backward_kernel_normalized_input(&x, &moved[4], &dk, &s)
        })?;
        Ok(dk)
    })
}

/// The [`NormalizedInput`] of the first four moved inputs.
fn moved_input(moved: &[Tensor]) -> NormalizedInput<'_> {
    NormalizedInput {
        z: &moved[0],
        gamma: &moved[1],
        beta: &moved[2],
        stats: &moved[3],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::spec::Padding;

    fn filled(value: f32, shape: &[usize]) -> Tensor {
        let len = shape.iter().product();
        Tensor::from_vec(vec![value; len], shape).expect("a host tensor")
    }

    /// Statistics over other channels than `z`'s, and a `dz` of another shape than the
    /// output's, are refused with the op's name and both shapes.
    #[test]
    fn operands_that_do_not_fit_are_refused() {
        let (z, gamma, beta) = (
            filled(0.5, &[2, 6, 6, 8]),
            filled(1.0, &[8]),
            filled(0.0, &[8]),
        );
        let stats = filled(1.0, &[2, 4]);
        let kernel = filled(0.1, &[3, 3, 8, 16]);
        let opts = ConvOptions::new(Padding::Same).strides(2);
        let x = NormalizedInput {
            z: &z,
            gamma: &gamma,
            beta: &beta,
            stats: &stats,
        };
        let err = conv2d_normalized_input(x, &kernel, None, opts, Activation::Linear)
            .expect_err("statistics of 4 channels");
        let msg = err.to_string();
        assert!(
            msg.contains("FusedBatchNormReluConv2D") && msg.contains("[2, 8]"),
            "{msg}"
        );

        let stats = filled(1.0, &[2, 8]);
        let x = NormalizedInput { stats: &stats, ..x };
        let y = conv2d_normalized_input(x, &kernel, None, opts, Activation::Linear).expect("fits");
        assert_eq!(y.shape(), [2, 3, 3, 16]);
        let dz = filled(1.0, &[2, 6, 6, 16]);
        let err = conv2d_backward_kernel_normalized_input(x, &dz, kernel.shape(), opts)
            .expect_err("dz of the input's size");
        let msg = err.to_string();
        assert!(
            msg.contains("BackpropFilter") && msg.contains("[2, 3, 3, 16]"),
            "{msg}"
        );
    }
}
