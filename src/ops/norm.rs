//! The ops of Keras' `BatchNormalization` and `Dropout` layers: front-ends that check dtypes
//! and shapes, place the op and call the kernels (`ops::cpu::batchnorm`, `ops::cpu::dropout`,
//! `shaders/batchnorm.wgsl`, `shaders/dropout.wgsl`).

use crate::error::{Error, Result};
use crate::ops::gpu::norm as gn;
use crate::ops::spec::{BatchNormParams, DropoutMask};
use crate::ops::{run, with_kernels};
use crate::placement::OpInfo;
use crate::tensor::{DType, Tensor};

const BATCH_NORM: OpInfo = OpInfo {
    name: "FusedBatchNormV3",
    gpu: Some(gn::BATCH_NORM),
};
const BATCH_NORM_GRAD: OpInfo = OpInfo {
    name: "FusedBatchNormGradV3",
    gpu: Some(gn::BATCH_NORM_GRAD),
};
/// Batch normalization with a fused ReLU (TensorFlow's names for its fused pair).
const BATCH_NORM_RELU: OpInfo = OpInfo {
    name: "_FusedBatchNormEx",
    gpu: Some(gn::BATCH_NORM_RELU),
};
const BATCH_NORM_RELU_GRAD: OpInfo = OpInfo {
    name: "_FusedBatchNormGradEx",
    gpu: Some(gn::BATCH_NORM_RELU_GRAD),
};
/// Batch normalization, a ReLU and the mean over each image's pixels (a global average
/// pooling): no GPU kernels, placement runs it on the CPU.
const BATCH_NORM_RELU_MEAN: OpInfo = OpInfo {
    name: "FusedBatchNormReluMean",
    gpu: None,
};
const BATCH_NORM_RELU_MEAN_GRAD: OpInfo = OpInfo {
    name: "FusedBatchNormReluMeanGrad",
    gpu: None,
};
/// The statistics of a training pass whose normalized values a convolution after it forms
/// as it reads them ([`batch_normalization_statistics_training`]).
const BATCH_NORM_STATISTICS: OpInfo = OpInfo {
    name: "FusedBatchNormStatistics",
    gpu: None,
};
const DROPOUT: OpInfo = OpInfo {
    name: "Dropout",
    gpu: Some(gn::DROPOUT),
};
const DROPOUT_GRAD: OpInfo = OpInfo {
    name: "DropoutGrad",
    gpu: Some(gn::DROPOUT_GRAD),
};

pub use crate::ops::nn_kernels::BatchNormVariables;
pub(crate) use crate::ops::nn_kernels::{BatchNormArgs, BatchNormGradArgs, NormWrites};

/// What follows the normalization inside its op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// Nothing.
    Plain,
    /// A ReLU.
    Relu,
    /// A ReLU, then the mean over each image's pixels (`[n, h, w, c]` → `[n, c]`).
    ReluMean,
    /// Nothing written: the statistics only (training).
    Statistics,
}

impl Form {
    fn op(self) -> &'static OpInfo {
        match self {
            Form::Plain => &BATCH_NORM,
            Form::Relu => &BATCH_NORM_RELU,
            Form::ReluMean => &BATCH_NORM_RELU_MEAN,
            Form::Statistics => &BATCH_NORM_STATISTICS,
        }
    }

    fn grad_op(self) -> &'static OpInfo {
        match self {
            Form::Plain => &BATCH_NORM_GRAD,
            Form::Relu => &BATCH_NORM_RELU_GRAD,
            Form::ReluMean => &BATCH_NORM_RELU_MEAN_GRAD,
            // The convolution that read the values gives their gradient: the ReLU form's.
            Form::Statistics => &BATCH_NORM_RELU_GRAD,
        }
    }

    /// The output's shape for an input `x` (checked), and what goes into it.
    fn output(self, x: &Tensor) -> Result<(Vec<usize>, NormWrites)> {
        let name = self.op().name;
        match self {
            Form::Plain | Form::Relu => return Ok((x.shape().to_vec(), NormWrites::Values)),
            Form::Statistics => {
                x.expect_dtype(name, DType::F32)?;
                return Ok((vec![0], NormWrites::Nothing));
            }
            Form::ReluMean => x.expect_dtype(name, DType::F32)?,
        }
        match *x.shape() {
            [n, h, w, c] if h * w > 0 => Ok((vec![n, c], NormWrites::ImageMeans(h * w))),
            _ => Err(Error::InvalidArgument(format!(
                "{name}: the input must be [batch, height, width, channels] with pixels, got \
                 shape {:?}",
                x.shape()
            ))),
        }
    }
}

/// `(rows, channels)` of `x` for a per-channel statistic over its last axis.
fn rows_channels(op: &'static str, x: &Tensor) -> Result<(usize, usize)> {
    match x.shape().split_last() {
        Some((&c, rest)) if c > 0 && !rest.is_empty() => Ok((rest.iter().product(), c)),
        _ => Err(Error::InvalidArgument(format!(
            "{op}: the input must have a batch axis and a non-empty channel axis, got shape {:?}",
            x.shape()
        ))),
    }
}

/// The input's float dtype (float32, or float16 under mixed precision).
fn activation_dtype(op: &'static str, x: &Tensor) -> Result<DType> {
    match x.dtype() {
        DType::F16 => Ok(DType::F16),
        _ => x.expect_dtype(op, DType::F32).map(|()| DType::F32),
    }
}

/// Each variable float32 of shape `[c]`.
fn check_variables(op: &'static str, c: usize, vars: &[(&str, &Tensor)]) -> Result<()> {
    for (name, t) in vars {
        t.expect_dtype(op, DType::F32)?;
        if t.shape() != [c] {
            return Err(Error::ShapeMismatch {
                op,
                lhs: vec![c],
                rhs: t.shape().to_vec(),
                hint: format!(": {name} must have one value per channel ({c})"),
            });
        }
    }
    Ok(())
}

/// Batch normalization in training mode over the last axis (what Keras'
/// `BatchNormalization(axis=-1)(x, training=True)` computes): the batch's mean and biased
/// variance per channel (over every axis but the last), `y = (x - mean) / sqrt(var + epsilon)
/// * gamma + beta`, and the moving statistics updated in place on their device,
/// `moving = moving * momentum + batch * (1 - momentum)`. Returns `y` (in `x`'s dtype) and the
/// batch statistics `[mean; 1 / sqrt(var + epsilon)]` (`[2, c]`, float32) that
/// [`batch_normalization_backward`] takes. A float16 `x` is normalized in float32 (as Keras
/// does), only `y` is float16.
///
/// ```
/// use anygpu::ops::{self, BatchNormVariables};
/// use anygpu::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32, 10.0, 3.0, 30.0], &[2, 2])?;
/// let (gamma, beta) = (Tensor::from_vec(vec![1.0f32; 2], &[2])?, Tensor::zeros(&[2])?);
/// let (mm, mv) = (Tensor::zeros(&[2])?, Tensor::from_vec(vec![1.0f32; 2], &[2])?);
/// let v = BatchNormVariables { gamma: &gamma, beta: &beta, moving_mean: &mm, moving_variance: &mv };
/// let (y, _stats) = ops::batch_normalization_training(&x, v, 0.5, 0.0)?;
/// assert_eq!(y.to_vec::<f32>()?, [-1.0, -1.0, 1.0, 1.0]);
/// assert_eq!(mm.to_vec::<f32>()?, [1.0, 10.0]); // 0 * 0.5 + mean * 0.5
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// A non-float input or an input without a batch and a channel axis; variables that are not
/// float32 `[c]`; moving statistics on another device than the op (they are updated where
/// they live, like an optimizer's variables).
pub fn batch_normalization_training(
    x: &Tensor,
    v: BatchNormVariables<'_>,
    momentum: f32,
    epsilon: f32,
) -> Result<(Tensor, Tensor)> {
    training_pass(x, v, (momentum, epsilon), Form::Plain)
}

/// [`batch_normalization_training`] followed by a ReLU, `max(y, 0)`, in one pass
/// (`BatchNormalization()` then `ReLU()` in training); [`batch_normalization_relu_backward`]
/// differentiates both.
pub(crate) fn batch_normalization_relu_training(
    x: &Tensor,
    v: BatchNormVariables<'_>,
    momentum: f32,
    epsilon: f32,
) -> Result<(Tensor, Tensor)> {
    training_pass(x, v, (momentum, epsilon), Form::Relu)
}

/// [`batch_normalization_relu_training`] followed by the mean over each image's pixels (a
/// global average pooling), in one pass that never writes the normalized values: returns the
/// means (`[n, c]` from `x` `[n, h, w, c]`, float32) and the batch statistics;
/// [`batch_normalization_relu_mean_backward`] differentiates the three. The CPU only.
pub(crate) fn batch_normalization_relu_mean_training(
    x: &Tensor,
    v: BatchNormVariables<'_>,
    momentum: f32,
    epsilon: f32,
) -> Result<(Tensor, Tensor)> {
    training_pass(x, v, (momentum, epsilon), Form::ReluMean)
}

/// [`batch_normalization_training`]'s statistics (returned) and moving statistics' update,
/// without the normalized values: for a convolution that forms them, through a ReLU, as it
/// reads `x` ([`conv2d_normalized_input`](crate::ops::nn::conv2d_normalized_input)). The CPU
/// only, float32.
pub(crate) fn batch_normalization_statistics_training(
    x: &Tensor,
    v: BatchNormVariables<'_>,
    momentum: f32,
    epsilon: f32,
) -> Result<Tensor> {
    training_pass(x, v, (momentum, epsilon), Form::Statistics).map(|(_, stats)| stats)
}

/// The training pass, in `form`.
fn training_pass(
    x: &Tensor,
    v: BatchNormVariables<'_>,
    (momentum, epsilon): (f32, f32),
    form: Form,
) -> Result<(Tensor, Tensor)> {
    let op = form.op();
    let name = op.name;
    let dtype = activation_dtype(name, x)?;
    let (out_shape, writes) = form.output(x)?;
    let (rows, c) = rows_channels(name, x)?;
    check_variables(name, c, &variables(&v))?;
    if rows == 0 {
        // No statistics to take: nothing is updated (Keras would divide by zero).
        return Err(Error::InvalidArgument(format!(
            "{name}: a training pass needs at least one example, got shape {:?}",
            x.shape()
        )));
    }
    let p = BatchNormParams {
        rows,
        channels: c,
        momentum,
        epsilon,
    };
    let home = v.moving_mean.device_handle().clone();
    let _scope = home.scope();
    let inputs = [x, v.gamma, v.beta, v.moving_mean, v.moving_variance];
    run(op, &inputs, |device, moved| {
        if !device.same_device(&home) || !moved[4].device_handle().same_device(&home) {
            return Err(Error::Unsupported {
                op: name,
                device: home.full_name().to_string(),
                missing: format!(
                    "the moving statistics are updated where they live; the op was placed on {}",
                    device.name()
                ),
            });
        }
        let y = Tensor::uninit(&out_shape, dtype, device)?;
        let stats = Tensor::uninit(&[2, c], DType::F32, device)?;
        let args = BatchNormArgs {
            x: &moved[0],
            v: moved_variables(moved),
            y: &y,
            stats: Some(&stats),
            p,
            relu: form != Form::Plain,
            writes,
        };
        with_kernels(device, |_, nk| nk.batch_norm(&args))?;
        Ok((y, stats))
    })
}

/// Batch normalization in inference mode: `y = (x - moving_mean) / sqrt(moving_variance +
/// epsilon) * gamma + beta` (Keras' `BatchNormalization(x, training=False)`); nothing is
/// updated.
///
/// # Errors
/// As [`batch_normalization_training`].
pub fn batch_normalization_inference(
    x: &Tensor,
    v: BatchNormVariables<'_>,
    epsilon: f32,
) -> Result<Tensor> {
    inference_pass(x, v, epsilon, Form::Plain)
}

/// [`batch_normalization_inference`] followed by a ReLU, in one pass.
pub(crate) fn batch_normalization_relu_inference(
    x: &Tensor,
    v: BatchNormVariables<'_>,
    epsilon: f32,
) -> Result<Tensor> {
    inference_pass(x, v, epsilon, Form::Relu)
}

/// [`batch_normalization_relu_inference`] followed by the mean over each image's pixels, as
/// [`batch_normalization_relu_mean_training`]. The CPU only.
pub(crate) fn batch_normalization_relu_mean_inference(
    x: &Tensor,
    v: BatchNormVariables<'_>,
    epsilon: f32,
) -> Result<Tensor> {
    inference_pass(x, v, epsilon, Form::ReluMean)
}

/// The inference pass, in `form`.
fn inference_pass(
    x: &Tensor,
    v: BatchNormVariables<'_>,
    epsilon: f32,
    form: Form,
) -> Result<Tensor> {
    let op = form.op();
    let name = op.name;
    let dtype = activation_dtype(name, x)?;
    let (out_shape, writes) = form.output(x)?;
    let (rows, c) = rows_channels(name, x)?;
    check_variables(name, c, &variables(&v))?;
    let p = BatchNormParams {
        rows,
        channels: c,
        momentum: 0.0,
        epsilon,
    };
    let inputs = [x, v.gamma, v.beta, v.moving_mean, v.moving_variance];
    run(op, &inputs, |device, moved| {
        let y = Tensor::uninit(&out_shape, dtype, device)?;
        if rows > 0 {
            let args = BatchNormArgs {
                x: &moved[0],
                v: moved_variables(moved),
                y: &y,
                stats: None,
                p,
                relu: form != Form::Plain,
                writes,
            };
            with_kernels(device, |_, nk| nk.batch_norm(&args))?;
        }
        Ok(y)
    })
}

/// The gradients of [`batch_normalization_training`] from `dy`: `(dx, dgamma, dbeta)` with
/// `x̂ = (x - mean) · inv`, `dbeta = Σ dy`, `dgamma = Σ dy · x̂` and
/// `dx = gamma · inv / N · (N · dy - dbeta - x̂ · dgamma)` (the fused batch-norm gradient; `N`
/// values per channel). `stats` is what the forward pass returned. `dx` has `x`'s dtype,
/// `dgamma` and `dbeta` are float32.
///
/// # Errors
/// Dtypes or shapes that do not fit together.
pub fn batch_normalization_backward(
    x: &Tensor,
    dy: &Tensor,
    gamma: &Tensor,
    stats: &Tensor,
    epsilon: f32,
) -> Result<(Tensor, Tensor, Tensor)> {
    backward_pass(x, dy, (gamma, None), stats, epsilon)
}

/// The gradients of [`batch_normalization_relu_mean_training`] from `dy`, the gradient w.r.t.
/// the means (`[n, c]`): [`batch_normalization_relu_backward`] of the gradient the mean
/// spreads over each image's pixels (`dy / (h w)`), formed where it is read.
pub(crate) fn batch_normalization_relu_mean_backward(
    x: &Tensor,
    dy: &Tensor,
    (gamma, beta): (&Tensor, &Tensor),
    stats: &Tensor,
    epsilon: f32,
) -> Result<(Tensor, Tensor, Tensor)> {
    backward_in(x, dy, (gamma, Some(beta)), stats, epsilon, Form::ReluMean)
}

/// The gradients of [`batch_normalization_relu_training`] from `dy`, the gradient w.r.t. the
/// ReLU's output: [`batch_normalization_backward`] of ReLU's gradient, whose mask (where
/// `x̂ · gamma + beta > 0`) comes from `x` and the layer's `beta`, as the forward pass
/// computed it.
pub(crate) fn batch_normalization_relu_backward(
    x: &Tensor,
    dy: &Tensor,
    (gamma, beta): (&Tensor, &Tensor),
    stats: &Tensor,
    epsilon: f32,
) -> Result<(Tensor, Tensor, Tensor)> {
    backward_pass(x, dy, (gamma, Some(beta)), stats, epsilon)
}

/// The gradient pass, through a fused ReLU when `relu_beta` is given.
fn backward_pass(
    x: &Tensor,
    dy: &Tensor,
    (gamma, relu_beta): (&Tensor, Option<&Tensor>),
    stats: &Tensor,
    epsilon: f32,
) -> Result<(Tensor, Tensor, Tensor)> {
    let form = match relu_beta {
        Some(_) => Form::Relu,
        None => Form::Plain,
    };
    backward_in(x, dy, (gamma, relu_beta), stats, epsilon, form)
}

/// The gradient pass of `form` (`relu_beta` given for the forms with a ReLU).
fn backward_in(
    x: &Tensor,
    dy: &Tensor,
    (gamma, relu_beta): (&Tensor, Option<&Tensor>),
    stats: &Tensor,
    epsilon: f32,
    form: Form,
) -> Result<(Tensor, Tensor, Tensor)> {
    let op = form.grad_op();
    let name = op.name;
    let (out_shape, writes) = form.output(x)?;
    let image_means = writes.image_means();
    // `dy` has the forward output's shape; the checks below compare it with `x`'s.
    let dy_as_x = match image_means {
        Some(_) if dy.shape() == out_shape => x,
        Some(_) => {
            return Err(Error::ShapeMismatch {
                op: name,
                lhs: out_shape,
                rhs: dy.shape().to_vec(),
                hint: ": the gradient must have the means' shape".into(),
            })
        }
        None => dy,
    };
    let (dtype, rows, c) = check_grad_inputs(name, x, dy_as_x, (gamma, relu_beta), stats)?;
    dy.expect_dtype(name, dtype)?;
    let p = BatchNormParams {
        rows,
        channels: c,
        momentum: 0.0,
        epsilon,
    };
    let mut inputs = vec![x, dy, gamma, stats];
    inputs.extend(relu_beta);
    run(op, &inputs, |device, moved| {
        let dx = Tensor::uninit(x.shape(), dtype, device)?;
        let dgamma = Tensor::uninit(&[c], DType::F32, device)?;
        let dbeta = Tensor::uninit(&[c], DType::F32, device)?;
        let args = BatchNormGradArgs {
            x: &moved[0],
            dy: &moved[1],
            gamma: &moved[2],
            relu_beta: moved.get(4),
            stats: &moved[3],
            dx: &dx,
            dgamma: &dgamma,
            dbeta: &dbeta,
            p,
            image_means,
        };
        with_kernels(device, |_, nk| nk.batch_norm_backward(&args))?;
        Ok((dx, dgamma, dbeta))
    })
}

/// The checks of a gradient pass's inputs (see [`batch_normalization_backward`]) for the op
/// `name`: `(dtype, rows, channels)` of `x`.
pub(crate) fn check_grad_inputs(
    name: &'static str,
    x: &Tensor,
    dy: &Tensor,
    (gamma, relu_beta): (&Tensor, Option<&Tensor>),
    stats: &Tensor,
) -> Result<(DType, usize, usize)> {
    let dtype = activation_dtype(name, x)?;
    dy.expect_dtype(name, dtype)?;
    let (rows, c) = rows_channels(name, x)?;
    if dy.shape() != x.shape() {
        return Err(Error::ShapeMismatch {
            op: name,
            lhs: x.shape().to_vec(),
            rhs: dy.shape().to_vec(),
            hint: ": the gradient must have the input's shape".into(),
        });
    }
    check_normalization(name, c, (gamma, relu_beta), stats)?;
    Ok((dtype, rows, c))
}

/// The checks of what a training pass over `c` channels left for the op `name`: `gamma` (and
/// `beta`) float32 `[c]`, its batch statistics float32 `[2, c]`.
pub(crate) fn check_normalization(
    name: &'static str,
    c: usize,
    (gamma, beta): (&Tensor, Option<&Tensor>),
    stats: &Tensor,
) -> Result<()> {
    check_variables(name, c, &[("gamma", gamma)])?;
    if let Some(beta) = beta {
        check_variables(name, c, &[("beta", beta)])?;
    }
    stats.expect_dtype(name, DType::F32)?;
    if stats.shape() != [2, c] {
        return Err(Error::ShapeMismatch {
            op: name,
            lhs: vec![2, c],
            rhs: stats.shape().to_vec(),
            hint: ": the batch statistics of the forward pass".into(),
        });
    }
    Ok(())
}

fn variables<'a>(v: &BatchNormVariables<'a>) -> [(&'static str, &'a Tensor); 4] {
    [
        ("gamma", v.gamma),
        ("beta", v.beta),
        ("moving_mean", v.moving_mean),
        ("moving_variance", v.moving_variance),
    ]
}

fn moved_variables(moved: &[Tensor]) -> BatchNormVariables<'_> {
    BatchNormVariables {
        gamma: &moved[1],
        beta: &moved[2],
        moving_mean: &moved[3],
        moving_variance: &moved[4],
    }
}

/// Inverted dropout with the counter-based mask `m` (see [`DropoutMask`]): `(y, mask)` with
/// `mask = scale` where the mask keeps an element and 0 elsewhere, `y = x · mask`, both in
/// `x`'s dtype; [`dropout_backward`] applies `mask` to a gradient (TensorFlow keeps its
/// keep-mask the same way). One `(seed, step)` gives the same mask on every device.
///
/// ```
/// use anygpu::ops::{self, spec::DropoutMask};
/// use anygpu::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32; 1000], &[1000])?;
/// let (y, mask) = ops::dropout(&x, &DropoutMask::new(0.5, 42, 0))?;
/// let y = y.to_vec::<f32>()?;
/// assert!(y.iter().all(|&v| v == 0.0 || v == 2.0));
/// assert_eq!(y, mask.to_vec::<f32>()?);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// A non-float tensor.
pub fn dropout(x: &Tensor, m: &DropoutMask) -> Result<(Tensor, Tensor)> {
    let dtype = activation_dtype(DROPOUT.name, x)?;
    run(&DROPOUT, &[x], |device, moved| {
        let y = Tensor::uninit(x.shape(), dtype, device)?;
        let mask = Tensor::uninit(x.shape(), dtype, device)?;
        if !x.is_empty() {
            with_kernels(device, |_, nk| nk.dropout(&moved[0], (&y, &mask), m))?;
        }
        Ok((y, mask))
    })
}

/// The gradient of [`dropout`]: `dx = dy · mask`.
///
/// # Errors
/// Dtypes or shapes that differ.
pub fn dropout_backward(dy: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let name = DROPOUT_GRAD.name;
    let dtype = activation_dtype(name, dy)?;
    mask.expect_dtype(name, dtype)?;
    if dy.shape() != mask.shape() {
        return Err(Error::ShapeMismatch {
            op: name,
            lhs: mask.shape().to_vec(),
            rhs: dy.shape().to_vec(),
            hint: ": the gradient must have the mask's shape".into(),
        });
    }
    run(&DROPOUT_GRAD, &[dy, mask], |device, moved| {
        let dx = Tensor::uninit(dy.shape(), dtype, device)?;
        if !dy.is_empty() {
            with_kernels(device, |_, nk| nk.dropout_grad(&moved[0], &moved[1], &dx))?;
        }
        Ok(dx)
    })
}
