//! A convolution's kernel gradient through the batch normalization after it, in one op: the
//! normalization's input gradient `dz` (the convolution's output gradient) is formed block by
//! block where the kernel gradient reads it, instead of written whole and read back (12.8 MB
//! each way for the modern CNN's first layer at batch 128). What a model's first layer needs,
//! which has no input gradient to compute. The CPU only.

use crate::error::{Error, Result};
use crate::ops::nn_kernels::ConvNormGrads;
use crate::ops::norm::check_grad_inputs;
use crate::ops::spec::ConvOptions;
use crate::ops::{run, with_kernels};
use crate::placement::OpInfo;
use crate::tensor::{DType, Tensor};

use super::conv::conv_shape;
use super::mismatch;

/// No GPU kernels: placement runs it on the CPU.
const CONV_NORM_GRAD: OpInfo = OpInfo {
    name: "FusedBatchNormGradConv2DBackpropFilter",
    gpu: None,
};

/// What [`conv2d_backward_weights_normalized`] reads of the batch normalization after the
/// convolution, as its training pass left it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NormalizedOutput<'a> {
    /// The normalization's input: the convolution's output.
    pub z: &'a Tensor,
    /// The gradient w.r.t. the normalization's output (after its fused ReLU, with `beta`).
    pub dy: &'a Tensor,
    /// Its scale.
    pub gamma: &'a Tensor,
    /// Its offset, when a ReLU was fused after it (whose mask the gradient recomputes).
    pub relu_beta: Option<&'a Tensor>,
    /// The forward pass's batch statistics (`[2, c]`: mean, inverse deviation).
    pub stats: &'a Tensor,
}

/// The gradients of a convolution of `x` (no activation, `bias` or not) followed by a batch
/// normalization in training: `(dk, db, dgamma, dbeta)`, `db` with a bias. The same as
/// [`batch_normalization_backward`](crate::ops::batch_normalization_backward) (or its ReLU
/// form) followed by [`conv2d_backward_kernel`](crate::ops::conv2d_backward_kernel) and the
/// bias gradient, without the normalization's input gradient in memory. `dk` and `db` are
/// float32, as [`GradDType::Float32`](crate::ops::GradDType) gives them.
///
/// # Errors
/// Tensors not all float32; shapes that do not fit together (`z` and `dy` must be the
/// convolution's output shape, `gamma`, `beta` and `stats` the normalization's).
pub(crate) fn conv2d_backward_weights_normalized(
    x: &Tensor,
    bn: NormalizedOutput<'_>,
    kernel_shape: &[usize],
    with_bias: bool,
    options: ConvOptions,
) -> Result<(Tensor, Option<Tensor>, Tensor, Tensor)> {
    let name = CONV_NORM_GRAD.name;
    let relu = (bn.gamma, bn.relu_beta);
    let (dtype, _, c) = check_grad_inputs(name, bn.z, bn.dy, relu, bn.stats)?;
    x.expect_dtype(name, DType::F32)?;
    if dtype != DType::F32 {
        return Err(Error::InvalidArgument(format!(
            "{name}: float32 only, got {dtype:?} (run the normalization's gradient, then the \
             convolution's)"
        )));
    }
    let s = conv_shape(name, x.shape(), kernel_shape, options)?;
    let (oh, ow) = s.out_hw();
    let expected = [s.n, oh, ow, s.c_out];
    if bn.z.shape() != expected || c != s.c_out {
        return Err(mismatch(
            name,
            &expected,
            bn.z.shape(),
            format!(
                ": the normalization's input must be the convolution's output (kernel \
                 {kernel_shape:?})"
            ),
        ));
    }
    let mut inputs = vec![x, bn.z, bn.dy, bn.gamma, bn.stats];
    inputs.extend(bn.relu_beta);
    run(&CONV_NORM_GRAD, &inputs, |device, moved| {
        let dk = Tensor::uninit(kernel_shape, DType::F32, device)?;
        let db = if with_bias {
            Some(Tensor::uninit(&[c], DType::F32, device)?)
        } else {
            None
        };
        let dgamma = Tensor::uninit(&[c], DType::F32, device)?;
        let dbeta = Tensor::uninit(&[c], DType::F32, device)?;
        let g = ConvNormGrads {
            x: &moved[0],
            z: &moved[1],
            dy: &moved[2],
            gamma: &moved[3],
            stats: &moved[4],
            relu_beta: moved.get(5),
            dk: &dk,
            db: db.as_ref(),
            dgamma: &dgamma,
            dbeta: &dbeta,
            s,
        };
        with_kernels(device, |_, nk| nk.conv2d_backward_weights_normalized(&g))?;
        Ok((dk, db, dgamma, dbeta))
    })
}
