//! The CNN ops: convolutions, pooling, activations, the loss, and optimizer updates, forward and
//! backward, on every device. Layout NHWC, kernels HWIO (Keras), f32.

use crate::error::{Error, Result};
use crate::ops::gpu::Kernel;
use crate::ops::spec::{
    Activation, AdamParams, Conv2dShape, ConvOptions, DepthwiseShape, Padding, PoolShape, SgdParams,
};
use crate::ops::spec::{ActivationFn, Pool2dShape};
use crate::ops::spec::{ClipMode, RmspropParams};
use crate::ops::{run, with_kernels};
use crate::placement::OpInfo;
use crate::shape;
use crate::tensor::{DType, Tensor};

/// Kernels of the CNN ops, on one device (see [`crate::ops::Kernels`]). Shapes are validated by
/// the front-ends before these are called; tensors are on the kernel's device.
pub(crate) trait NnKernels {
    /// `y = act(conv2d(x, kernel) + bias)`.
    fn conv2d(
        &self,
        x: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        y: &Tensor,
        s: &Conv2dShape,
        act: Activation,
    ) -> Result<()>;
    /// Gradient w.r.t. the input, from `dz` (w.r.t. the pre-activation output).
    fn conv2d_backward_input(
        &self,
        dz: &Tensor,
        kernel: &Tensor,
        dx: &Tensor,
        s: &Conv2dShape,
    ) -> Result<()>;
    /// Gradient w.r.t. the kernel.
    fn conv2d_backward_kernel(
        &self,
        x: &Tensor,
        dz: &Tensor,
        dk: &Tensor,
        s: &Conv2dShape,
    ) -> Result<()>;
    /// The kernel and bias gradients from the activated output's gradient (see
    /// [`conv2d_backward_weights`]).
    fn conv2d_backward_weights(&self, g: &ConvWeightGrads<'_>) -> Result<()>;
    /// Depthwise 'same' convolution.
    fn depthwise(&self, x: &Tensor, kernel: &Tensor, y: &Tensor, s: &DepthwiseShape) -> Result<()>;
    /// Its gradient w.r.t. the input.
    fn depthwise_backward_input(
        &self,
        dy: &Tensor,
        kernel: &Tensor,
        dx: &Tensor,
        s: &DepthwiseShape,
    ) -> Result<()>;
    /// Its gradient w.r.t. the kernel.
    fn depthwise_backward_kernel(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dk: &Tensor,
        s: &DepthwiseShape,
    ) -> Result<()>;
    /// 2×2 stride-2 max-pool.
    fn maxpool(&self, x: &Tensor, y: &Tensor, s: &PoolShape) -> Result<()>;
    /// Routes each output gradient to the first max of its window.
    fn maxpool_backward(&self, x: &Tensor, dy: &Tensor, dx: &Tensor, s: &PoolShape) -> Result<()>;
    /// `y = act(x)`.
    fn activation(&self, x: &Tensor, y: &Tensor, act: Activation) -> Result<()>;
    /// `dz = dy * act'(z)`, computed from the activation's output `y`.
    fn activation_backward(
        &self,
        dy: &Tensor,
        y: &Tensor,
        dz: &Tensor,
        act: Activation,
    ) -> Result<()>;
    /// `dz = dy * act'(z)` (`[rows, cols]`) and the bias gradient `db = Σ_rows dz` in one call,
    /// which a device may fuse.
    fn activation_bias_grad(
        &self,
        dy: &Tensor,
        y: &Tensor,
        dz: &Tensor,
        db: &Tensor,
        rows_cols: (usize, usize),
        act: Activation,
    ) -> Result<()>;
    /// The max-pool's gradient, then the activation's and the bias's (see
    /// [`max_pool2d_activation_bias_grad`]): `y` is the activation's output (the pool's
    /// input), `dpooled` the pooled gradient. Unfused unless a device has a kernel for it.
    fn maxpool_activation_bias_grad(
        &self,
        y: &Tensor,
        dpooled: &Tensor,
        (dz, db): (&Tensor, &Tensor),
        s: &PoolShape,
        act: Activation,
    ) -> Result<()> {
        unfused_maxpool_activation_bias_grad(self, y, dpooled, (dz, db), s, act)
    }
    /// Row-wise softmax of `[rows, cols]`.
    fn softmax(&self, logits: &Tensor, probs: &Tensor, rows: usize, cols: usize) -> Result<()>;
    /// Sparse categorical cross-entropy fused with softmax: per-row loss and the gradient of
    /// the mean loss w.r.t. the logits.
    fn softmax_cross_entropy(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        loss: &Tensor,
        dlogits: &Tensor,
        rows: usize,
        cols: usize,
    ) -> Result<()>;
    /// Number of rows whose arg max equals the label, as an f32 in `out[0]`.
    fn accuracy_count(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        out: &Tensor,
        rows: usize,
        cols: usize,
    ) -> Result<()>;
    /// `w -= lr * g`.
    fn sgd(&self, w: &Tensor, g: &Tensor, p: &SgdParams) -> Result<()>;
    /// Keras' momentum / Nesterov update with velocity `v`.
    fn sgd_momentum(&self, w: &Tensor, g: &Tensor, v: &Tensor, p: &SgdParams) -> Result<()>;
    /// Keras' Adam update with moments `m`, `v`.
    fn adam(&self, w: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, p: &AdamParams) -> Result<()>;
    /// The gradients of a dense layer (see [`dense_backward`]).
    fn dense_backward(&self, g: &DenseGrads<'_>) -> Result<()>;
    /// `y = act(pointwise(depthwise(x)) + bias)` (see [`separable_conv2d`]).
    fn separable(&self, f: &SeparableForward<'_>) -> Result<()>;
    /// Its gradients (see [`separable_conv2d_backward`]).
    fn separable_backward(&self, g: &SeparableBackward<'_>) -> Result<()>;

    // ---- batch normalization and dropout (front-ends in `ops::norm`) ----
    /// Batch normalization's forward pass: in training (`a.stats` given) the batch statistics
    /// into `stats` and the moving statistics updated in place; else from the moving ones.
    fn batch_norm(&self, a: &crate::ops::norm::BatchNormArgs<'_>) -> Result<()>;
    /// Its gradients.
    fn batch_norm_backward(&self, g: &crate::ops::norm::BatchNormGradArgs<'_>) -> Result<()>;
    /// `mask = keeps(i) ? scale : 0`, `y = x * mask`.
    fn dropout(
        &self,
        x: &Tensor,
        y_mask: (&Tensor, &Tensor),
        m: &crate::ops::spec::DropoutMask,
    ) -> Result<()>;
    /// `dx = dy * mask`.
    fn dropout_grad(&self, dy: &Tensor, mask: &Tensor, dx: &Tensor) -> Result<()>;

    // ---- activations and pooling layers ----
    /// `y = act(x)` for an activation with its own kernel.
    fn activation_fn(&self, x: &Tensor, y: &Tensor, act: ActivationFn) -> Result<()>;
    /// `dz = dy * act'(.)` from `t`, the activation's input, or its output when `from_output`
    /// (only where [`ActivationFn::grad_from_output`] holds).
    fn activation_fn_backward(
        &self,
        dy: &Tensor,
        t: &Tensor,
        dz: &Tensor,
        act: ActivationFn,
        from_output: bool,
    ) -> Result<()>;
    /// Average pooling over the windows of `s`.
    fn avg_pool2d(&self, x: &Tensor, y: &Tensor, s: &Pool2dShape) -> Result<()>;
    /// Its gradient w.r.t. the input.
    fn avg_pool2d_backward(&self, dy: &Tensor, dx: &Tensor, s: &Pool2dShape) -> Result<()>;
    /// Max pooling over the windows of `s` (the 2×2 'valid' one has [`NnKernels::maxpool`]).
    fn max_pool2d_window(&self, x: &Tensor, y: &Tensor, s: &Pool2dShape) -> Result<()>;
    /// Its gradient: each `dy` added at its window's first maximum in `x`.
    fn max_pool2d_window_backward(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dx: &Tensor,
        s: &Pool2dShape,
    ) -> Result<()>;
    /// `y[n, c]`: the mean (or, `max`, the maximum) over each image's pixels (`s.h`×`s.w`).
    fn global_pool(&self, max: bool, x: &Tensor, y: &Tensor, s: &PoolShape) -> Result<()>;
    /// The global average's gradient: `dy[n, c] / (h w)` at every pixel.
    fn global_avg_pool_backward(&self, dy: &Tensor, dx: &Tensor, s: &PoolShape) -> Result<()>;
    /// The global maximum's gradient: `dy` shared by the pixels equal to the maximum.
    fn global_max_pool_backward(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dx: &Tensor,
        s: &PoolShape,
    ) -> Result<()>;

    // ---- general convolutions ----
    /// `y = act(depthwise(x, kernel) + bias)` for any depthwise shape (Keras'
    /// `DepthwiseConv2D`; see [`depthwise_conv2d_with`]).
    fn depthwise_bias_act(
        &self,
        x: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        y: &Tensor,
        s: &DepthwiseShape,
        act: Activation,
    ) -> Result<()>;

    // ---- optimizers: RMSprop, weight decay, gradient clipping ----
    /// Keras' RMSprop update with velocity `v` and the optional average gradient
    /// (`centered`) and momentum slots.
    fn rmsprop(
        &self,
        w: &Tensor,
        g: &Tensor,
        v: &Tensor,
        average: Option<&Tensor>,
        momentum: Option<&Tensor>,
        p: &RmspropParams,
    ) -> Result<()>;
    /// `w -= w * wd * lr`.
    fn weight_decay(&self, w: &Tensor, wd: f32, lr: f32) -> Result<()>;
    /// `out` = `g` clipped by `mode`; norms come from `sum_squares[0]` (see [`clip_gradient`]).
    fn clip(
        &self,
        g: &Tensor,
        sum_squares: Option<&Tensor>,
        out: &Tensor,
        mode: ClipMode,
    ) -> Result<()>;

    // ---- losses on float targets, metrics (ops/loss.rs) ----
    /// Per-row loss (times `p.row_scale`) and its gradient w.r.t. `z` (times `p.grad_scale`),
    /// see [`crate::ops::loss::dense_loss`].
    fn dense_loss(
        &self,
        z: &Tensor,
        targets: &Tensor,
        loss: &Tensor,
        dz: &Tensor,
        p: &crate::ops::loss::LossParams,
    ) -> Result<()>;
    /// Each row's metric value, see [`crate::ops::loss::metric_rows`].
    fn metric_rows(
        &self,
        z: &Tensor,
        targets: &Tensor,
        out: &Tensor,
        rows_cols: (usize, usize),
        kind: crate::ops::loss::MetricKind,
        act: crate::ops::loss::OutputActivation,
    ) -> Result<()>;
    /// `y = sigmoid(x)` element-wise.
    fn sigmoid(&self, x: &Tensor, y: &Tensor) -> Result<()>;
}

/// [`NnKernels::maxpool_activation_bias_grad`] as two kernels: the max-pool's gradient into a
/// scratch tensor, then the activation's and the bias's.
pub(crate) fn unfused_maxpool_activation_bias_grad<K: NnKernels + ?Sized>(
    nk: &K,
    y: &Tensor,
    dpooled: &Tensor,
    (dz, db): (&Tensor, &Tensor),
    s: &PoolShape,
    act: Activation,
) -> Result<()> {
    let dy = Tensor::uninit(y.shape(), y.dtype(), y.device_handle())?;
    nk.maxpool_backward(y, dpooled, &dy, s)?;
    let rows_cols = (s.n * s.h * s.w, s.c);
    nk.activation_bias_grad(&dy, y, dz, db, rows_cols, act)
}

/// The tensors of [`NnKernels::separable`]: input `x` `[n, h, w, c]`, `depthwise` `[kh, kw, c,
/// 1]`, `pointwise` `[1, 1, c, filters]`, `bias` `[filters]`; output `y` `[n, h, w, filters]`.
pub(crate) struct SeparableForward<'a> {
    pub(crate) x: &'a Tensor,
    pub(crate) depthwise: &'a Tensor,
    pub(crate) pointwise: &'a Tensor,
    pub(crate) bias: Option<&'a Tensor>,
    pub(crate) y: &'a Tensor,
    pub(crate) s: DepthwiseShape,
    pub(crate) filters: usize,
    pub(crate) act: Activation,
}

/// The tensors of [`NnKernels::separable_backward`]: the forward tensors (`y` the activated
/// output) and `dy`; outputs `dx` (optional) and the three weight gradients.
pub(crate) struct SeparableBackward<'a> {
    pub(crate) x: &'a Tensor,
    pub(crate) depthwise: &'a Tensor,
    pub(crate) pointwise: &'a Tensor,
    pub(crate) y: &'a Tensor,
    pub(crate) dy: &'a Tensor,
    /// Whether `dy` is the gradient w.r.t. `max_pool2d(y)` rather than `y`.
    pub(crate) pooled: bool,
    pub(crate) dx: Option<&'a Tensor>,
    pub(crate) d_depthwise: &'a Tensor,
    pub(crate) d_pointwise: &'a Tensor,
    pub(crate) d_bias: &'a Tensor,
    pub(crate) s: DepthwiseShape,
    pub(crate) filters: usize,
    pub(crate) act: Activation,
}

/// The 1×1 convolution after a depthwise one of shape `s` (the pointwise half of a separable
/// convolution).
pub(crate) fn pointwise_shape(s: &DepthwiseShape, filters: usize) -> Conv2dShape {
    Conv2dShape {
        n: s.n,
        h: s.h,
        w: s.w,
        c_in: s.c,
        c_out: filters,
        kh: 1,
        kw: 1,
        padding: Padding::Same,
        strides: [1, 1],
        dilation: [1, 1],
    }
}

/// The tensors of [`NnKernels::conv2d_backward_weights`]: the input `x`, the activated output
/// `y` and its gradient `dy`; outputs `dk` and `db`.
pub(crate) struct ConvWeightGrads<'a> {
    pub(crate) x: &'a Tensor,
    pub(crate) y: &'a Tensor,
    pub(crate) dy: &'a Tensor,
    pub(crate) dk: &'a Tensor,
    pub(crate) db: &'a Tensor,
    pub(crate) s: Conv2dShape,
    pub(crate) act: Activation,
}

/// The tensors of [`NnKernels::dense_backward`]: inputs `x` `[m, k]`, `w` `[k, n]`, the
/// activated output `y` and its gradient `dy` `[m, n]`; outputs `dx` (optional), `dw`, `db`.
pub(crate) struct DenseGrads<'a> {
    pub(crate) x: &'a Tensor,
    pub(crate) w: &'a Tensor,
    pub(crate) y: &'a Tensor,
    pub(crate) dy: &'a Tensor,
    pub(crate) dx: Option<&'a Tensor>,
    pub(crate) dw: &'a Tensor,
    pub(crate) db: &'a Tensor,
    pub(crate) m: usize,
    pub(crate) k: usize,
    pub(crate) n: usize,
    pub(crate) act: Activation,
}

// ---- activations and pooling layers ----
mod activations;
mod pooling;
pub use activations::*;
pub use pooling::*;

// ---------------------------------------------------------------------------------------------
// Front-ends: check dtypes and shapes, place the op, allocate the output on its device (always
// before any scratch, so an output takes the arena chunk freed last), call the kernels.

use crate::ops::basic::matmul_ex;
use crate::ops::gpu::nn as gn;
use crate::DeviceKind;

const fn op(name: &'static str, gpu: &'static [Kernel]) -> OpInfo {
    OpInfo {
        name,
        gpu: Some(gpu),
    }
}

const CONV2D: OpInfo = op("Conv2D", gn::CONV2D);
const CONV2D_BACKWARD_INPUT: OpInfo = op("Conv2DBackpropInput", gn::CONV2D_BACKWARD_INPUT);
const CONV2D_BACKWARD_KERNEL: OpInfo = op("Conv2DBackpropFilter", gn::CONV2D_BACKWARD_KERNEL);
const BIAS_GRAD: OpInfo = op("BiasAddGrad", gn::BIAS_GRAD);
const ACTIVATION_BIAS_GRAD: OpInfo = op("FusedActivationBiasGrad", gn::ACTIVATION_BIAS_GRAD);
const MAXPOOL_ACTIVATION_BIAS_GRAD: OpInfo = op(
    "FusedMaxPoolActivationBiasGrad",
    gn::MAXPOOL_ACTIVATION_BIAS_GRAD,
);
const CONV2D_BACKWARD_WEIGHTS: OpInfo = op("FusedConv2DWeightGrad", gn::CONV2D_BACKWARD_WEIGHTS);
const DENSE_BACKWARD: OpInfo = op("FusedDenseGrad", gn::DENSE_BACKWARD);
const DEPTHWISE: OpInfo = op("DepthwiseConv2dNative", gn::DEPTHWISE);
const SEPARABLE: OpInfo = op("FusedSeparableConv2D", gn::SEPARABLE);
const SEPARABLE_BACKWARD: OpInfo = op("FusedSeparableConv2DGrad", gn::SEPARABLE_BACKWARD);
const SEPARABLE_MAX_POOL_BACKWARD: OpInfo = op(
    "FusedSeparableConv2DMaxPoolGrad",
    gn::SEPARABLE_MAX_POOL_BACKWARD,
);
const DEPTHWISE_BACKWARD_INPUT: OpInfo = op("DepthwiseConv2dNativeBackpropInput", gn::DEPTHWISE);
const DEPTHWISE_BACKWARD_KERNEL: OpInfo = op(
    "DepthwiseConv2dNativeBackpropFilter",
    gn::DEPTHWISE_BACKWARD_KERNEL,
);
const MAXPOOL: OpInfo = op("MaxPool", gn::MAXPOOL);
const MAXPOOL_BACKWARD: OpInfo = op("MaxPoolGrad", gn::MAXPOOL_BACKWARD);
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
const SOFTMAX: OpInfo = op("Softmax", gn::SOFTMAX);
const SPARSE_XENT: OpInfo = op("SparseSoftmaxCrossEntropyWithLogits", gn::SPARSE_XENT);
const ACCURACY_COUNT: OpInfo = op("AccuracyCount", gn::ACCURACY_COUNT);
const SGD_UPDATE: OpInfo = op("ResourceApplyGradientDescent", gn::SGD_UPDATE);
const MOMENTUM_UPDATE: OpInfo = op("ResourceApplyKerasMomentum", gn::MOMENTUM_UPDATE);
const ADAM_UPDATE: OpInfo = op("ResourceApplyAdam", gn::ADAM_UPDATE);
// ---- optimizers: RMSprop, weight decay, gradient clipping ----
const RMSPROP_UPDATE: OpInfo = op("ResourceApplyRMSProp", gn::RMSPROP_UPDATE);
const CENTERED_RMSPROP_UPDATE: OpInfo = op("ResourceApplyCenteredRMSProp", gn::RMSPROP_UPDATE);
const WEIGHT_DECAY: OpInfo = op("AssignSubVariableOp", gn::WEIGHT_DECAY_UPDATE);
const CLIP_BY_NORM: OpInfo = op("ClipByNorm", gn::CLIP);
const CLIP_BY_VALUE: OpInfo = op("ClipByValue", gn::CLIP);

/// The op's placement-log entry for `act` (forward or gradient).
fn act_info(act: Activation, grad: bool) -> &'static OpInfo {
    let table = if grad {
        &ACTIVATION_GRADS
    } else {
        &ACTIVATIONS
    };
    &table[act.code() as usize]
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

/// A convolution's shape from its input `[n, h, w, c_in]` and kernel `[kh, kw, c_in, c_out]`
/// shapes, checked.
fn conv_shape(
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

/// A depthwise convolution's shape from `x` `[n, h, w, c]` and the kernel
/// `[kh, kw, c, multiplier]`.
fn depthwise_shape(
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
/// Non-f32 tensors; shapes that do not fit together (named in the message); a stride or
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
/// pre-activation output `[n, oh, ow, c_out]` (apply [`activation_backward`] first).
///
/// `input_shape` is the forward input's `[n, h, w, c_in]`; `kernel` `[kh, kw, c_in, c_out]`;
/// `options` the forward pass's.
///
/// # Errors
/// Non-f32 tensors; a `dz` whose shape is not the forward output's.
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
/// Non-f32 tensors; shapes that do not fit together.
pub fn conv2d_backward_kernel(
    x: &Tensor,
    dz: &Tensor,
    kernel_shape: &[usize],
    options: impl Into<ConvOptions>,
) -> Result<Tensor> {
    let name = CONV2D_BACKWARD_KERNEL.name;
    let dtype = float_dtype(name, &[x, dz])?;
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
/// and [`bias_grad`] give for `dz`, returned as `(kernel gradient, bias gradient)`.
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
/// Non-f32 tensors; shapes that do not fit together.
pub fn conv2d_backward_weights(
    x: &Tensor,
    y: &Tensor,
    dy: &Tensor,
    kernel_shape: &[usize],
    options: impl Into<ConvOptions>,
    act: Activation,
) -> Result<(Tensor, Tensor)> {
    let name = CONV2D_BACKWARD_WEIGHTS.name;
    let dtype = float_dtype(name, &[x, y, dy])?;
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

/// Bias gradient: the sum of `dz` over every axis but the last (`tf.raw_ops.BiasAddGrad`,
/// NHWC), e.g. `[n, h, w, c] → [c]` or `[batch, units] → [units]`.
///
/// # Errors
/// A non-f32 tensor or a scalar.
pub fn bias_grad(dz: &Tensor) -> Result<Tensor> {
    let name = BIAS_GRAD.name;
    let dtype = float_dtype(name, &[dz])?;
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

/// Depthwise 2-D convolution, 'same' padding, stride 1, depth multiplier 1, no bias: the first
/// half of Keras' `SeparableConv2D` (`tf.nn.depthwise_conv2d(x, kernel, [1, 1, 1, 1], "SAME")`).
/// [`depthwise_conv2d_with`] takes strides, dilation, padding and a depth multiplier.
///
/// `x` `[n, h, w, c]`, `kernel` `[kh, kw, c, 1]`; the output has `x`'s shape.
///
/// # Errors
/// Non-f32 tensors; shapes that do not fit together.
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
/// input channel `c` correlated with `kernel[.., c, q]`; `options` as [`conv2d`]'s.
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
/// Non-f32 tensors; shapes that do not fit together; bad strides or dilation (as
/// [`conv2d`]).
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
/// Non-f32 tensors; shapes that do not fit together.
pub fn depthwise_conv2d_backward_input(dy: &Tensor, kernel: &Tensor) -> Result<Tensor> {
    depthwise_conv2d_backward_input_with(dy, kernel, dy.shape(), Padding::Same)
}

/// Gradient of [`depthwise_conv2d_with`] w.r.t. its input
/// (`tf.raw_ops.DepthwiseConv2dNativeBackpropInput`): `dy` `[n, oh, ow, c * multiplier]`,
/// `input_shape` the forward input's `[n, h, w, c]`, `options` the forward pass's.
///
/// # Errors
/// Non-f32 tensors; shapes that do not fit together.
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
/// Non-f32 tensors; `x` and `dy` of different shapes; a kernel shape that does not fit.
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
/// Non-f32 tensors; shapes that do not fit together.
pub fn depthwise_conv2d_backward_kernel_with(
    x: &Tensor,
    dy: &Tensor,
    kernel_shape: &[usize],
    options: impl Into<ConvOptions>,
) -> Result<Tensor> {
    let name = DEPTHWISE_BACKWARD_KERNEL.name;
    let dtype = float_dtype(name, &[x, dy])?;
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

/// Pointwise (1×1) convolution with bias and activation: the second half of Keras'
/// `SeparableConv2D` (`tf.nn.conv2d(x, kernel, 1, "VALID")` with a `[1, 1, c_in, c_out]`
/// kernel), i.e. the matrix product `[n*h*w, c_in] · [c_in, c_out]`. It runs the convolution
/// kernels (logged as `Conv2D`): on GPUs their register blocking makes them several times faster
/// than the general matrix product. Its gradients are [`conv2d_backward_input`] and
/// [`conv2d_backward_kernel`] with the `[1, 1, c_in, c_out]` kernel shape (or, equivalently,
/// [`matmul_transposed`] on the `[n*h*w, c]` reshapes).
///
/// # Errors
/// Non-f32 tensors; shapes that do not fit together.
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
/// Non-f32 tensors; a `dy` whose shape is not the pooled output's.
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
/// Non-f32 tensors; `dy` and `y` of different shapes.
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
/// Non-f32 tensors; `dy` and `y` of different shapes, or scalars.
pub fn activation_bias_grad(dy: &Tensor, y: &Tensor, act: Activation) -> Result<(Tensor, Tensor)> {
    if act == Activation::Linear {
        return Ok((dy.clone(), bias_grad(dy)?));
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
        let db = Tensor::uninit(&[cols], dtype, device)?;
        if cols > 0 {
            with_kernels(device, |_, nk| {
                nk.activation_bias_grad(&moved[0], &moved[1], &dz, &db, (rows, cols), act)
            })?;
        }
        Ok((dz, db))
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
/// Non-f32 tensors; a `y` that is not rank 4; a `dpooled` that is not `y`'s pooled shape.
pub fn max_pool2d_activation_bias_grad(
    y: &Tensor,
    dpooled: &Tensor,
    act: Activation,
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
            let db = Tensor::uninit(&[s.c], dtype, device)?;
            if s.c > 0 {
                with_kernels(device, |_, nk| {
                    nk.maxpool_activation_bias_grad(&moved[0], &moved[1], (&dz, &db), &s, act)
                })?;
            }
            Ok((dz, db))
        },
    )
}

/// A dense layer, `act(x · w + b)` (Keras `Dense(units, activation=...)`): `x` `[batch, in]`,
/// `w` `[in, units]`, `b` `[units]`. Logged as `MatMul` (bias and activation are fused).
///
/// # Errors
/// Non-f32 tensors; shapes that do not fit together.
pub fn dense(x: &Tensor, w: &Tensor, b: Option<&Tensor>, act: Activation) -> Result<Tensor> {
    matmul_ex(x, w, false, false, b, act)
}

/// `op(a) · op(b)` with optional transposes (`tf.linalg.matmul(a, b, transpose_a, transpose_b)`),
/// for gradients: a dense layer's `dx = dz · wᵀ` is `matmul_transposed(dz, w, false, true)` and
/// `dw = xᵀ · dz` is `matmul_transposed(x, dz, true, false)`.
///
/// # Errors
/// Non-f32 or non-2-D tensors; inner dimensions that differ.
pub fn matmul_transposed(a: &Tensor, b: &Tensor, trans_a: bool, trans_b: bool) -> Result<Tensor> {
    matmul_ex(a, b, trans_a, trans_b, None, Activation::Linear)
}

/// The gradients of a dense layer `y = act(x · w + b)` from `dy`, the gradient w.r.t. its
/// activated output `y`: with `dz = dy * act'(y)`, returns `(dx, dw, db)` = `(dz · wᵀ, xᵀ · dz,
/// Σ_rows dz)`, `dx` only when `need_dx`. `x` is `[m, k]`, `w` `[k, n]`, `y` and `dy` `[m, n]`.
///
/// One op for what is otherwise an activation gradient, a bias gradient and two matrix
/// products: on the CPU it runs block by block over the rows, so `dz` never goes through
/// memory (TensorFlow fuses the forward direction the same way, `_FusedMatMul`).
///
/// ```
/// use anygpu::ops::{self, spec::Activation};
/// use anygpu::Tensor;
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2])?;
/// let w = Tensor::from_vec(vec![0.5f32, -1.0], &[2, 1])?;
/// let y = Tensor::from_vec(vec![3.0f32], &[1, 1])?; // relu output, positive
/// let dy = Tensor::from_vec(vec![2.0f32], &[1, 1])?;
/// let (dx, dw, db) = ops::dense_backward(&x, &w, &y, &dy, Activation::Relu, true)?;
/// assert_eq!(dx.unwrap().to_vec::<f32>()?, [1.0, -2.0]);
/// assert_eq!(dw.to_vec::<f32>()?, [2.0, 4.0]);
/// assert_eq!(db.to_vec::<f32>()?, [2.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// Non-f32 tensors; shapes that do not fit together.
pub fn dense_backward(
    x: &Tensor,
    w: &Tensor,
    y: &Tensor,
    dy: &Tensor,
    act: Activation,
    need_dx: bool,
) -> Result<(Option<Tensor>, Tensor, Tensor)> {
    let name = DENSE_BACKWARD.name;
    let dtype = float_dtype(name, &[x, w, y, dy])?;
    let (m, k, n) = match (x.shape(), w.shape()) {
        (&[m, k], &[k2, n]) if k == k2 => (m, k, n),
        _ => {
            return Err(mismatch(
                name,
                x.shape(),
                w.shape(),
                ": x must be [m, k] and the kernel [k, n]",
            ))
        }
    };
    for t in [y, dy] {
        if t.shape() != [m, n] {
            return Err(mismatch(
                name,
                t.shape(),
                &[m, n],
                ": the output and its gradient must be [m, n]",
            ));
        }
    }
    run(&DENSE_BACKWARD, &[x, w, y, dy], |device, moved| {
        let dx = if need_dx {
            Some(Tensor::uninit(&[m, k], dtype, device)?)
        } else {
            None
        };
        let dw = Tensor::uninit(&[k, n], dtype, device)?;
        let db = Tensor::uninit(&[n], dtype, device)?;
        let grads = DenseGrads {
            x: &moved[0],
            w: &moved[1],
            y: &moved[2],
            dy: &moved[3],
            dx: dx.as_ref(),
            dw: &dw,
            db: &db,
            m,
            k,
            n,
            act,
        };
        with_kernels(device, |_, nk| nk.dense_backward(&grads))?;
        Ok((dx, dw, db))
    })
}

/// The shapes of a separable convolution: the depthwise shape and the filter count, from `x`,
/// the depthwise kernel and the pointwise kernel.
fn separable_shape(
    op: &'static str,
    x: &Tensor,
    depthwise: &Tensor,
    pointwise: &Tensor,
) -> Result<(DepthwiseShape, usize)> {
    let s = depthwise_shape(op, x.shape(), depthwise.shape(), Padding::Same.into())?;
    if s.multiplier != 1 {
        return Err(mismatch(
            op,
            x.shape(),
            depthwise.shape(),
            ": the fused separable convolution takes depth multiplier 1 (run \
             depthwise_conv2d_with and pointwise_conv2d for others)",
        ));
    }
    if s.c == 0 {
        return Err(mismatch(
            op,
            x.shape(),
            depthwise.shape(),
            ": the input has no channels",
        ));
    }
    match *pointwise.shape() {
        [1, 1, c, filters] if c == s.c => Ok((s, filters)),
        _ => Err(mismatch(
            op,
            x.shape(),
            pointwise.shape(),
            format!(
                ": the pointwise kernel must be [1, 1, {}, filters] for {} channels",
                s.c, s.c
            ),
        )),
    }
}

/// Keras' `SeparableConv2D` in one op: `act(pointwise(depthwise(x)) + bias)`, i.e.
/// `tf.nn.separable_conv2d(x, depthwise, pointwise, [1, 1, 1, 1], "SAME")` + `tf.nn.bias_add`
/// + the activation.
///
/// `x` is `[n, h, w, c]`, `depthwise` `[kh, kw, c, 1]`, `pointwise` `[1, 1, c, filters]`,
/// `bias` `[filters]`; the output is `[n, h, w, filters]`. On the CPU a few images at a time go
/// through both halves while in cache, so the depthwise output never goes through memory; a
/// GPU runs [`depthwise_conv2d`] and [`pointwise_conv2d`].
///
/// ```
/// use anygpu::ops::{self, spec::Activation};
/// use anygpu::Tensor;
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 1, 1, 2])?;
/// let depthwise = Tensor::from_vec(vec![2.0f32, 3.0], &[1, 1, 2, 1])?;
/// let pointwise = Tensor::from_vec(vec![1.0f32, -1.0], &[1, 1, 2, 1])?;
/// let bias = Tensor::from_vec(vec![0.5f32], &[1])?;
/// let y = ops::separable_conv2d(&x, &depthwise, &pointwise, Some(&bias), Activation::Linear)?;
/// assert_eq!(y.to_vec::<f32>()?, [1.0 * 2.0 - 2.0 * 3.0 + 0.5]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// Non-f32 tensors; shapes that do not fit together (named in the message).
pub fn separable_conv2d(
    x: &Tensor,
    depthwise: &Tensor,
    pointwise: &Tensor,
    bias: Option<&Tensor>,
    act: Activation,
) -> Result<Tensor> {
    let name = SEPARABLE.name;
    let dtype = float_dtype(name, &[x, depthwise, pointwise])?;
    let (s, filters) = separable_shape(name, x, depthwise, pointwise)?;
    if let Some(b) = bias {
        b.expect_dtype("BiasAdd", dtype)?;
        if b.shape() != [filters] {
            return Err(mismatch(
                "BiasAdd",
                pointwise.shape(),
                b.shape(),
                format!(": the bias must have shape [{filters}]"),
            ));
        }
    }
    let mut inputs = vec![x, depthwise, pointwise];
    inputs.extend(bias);
    run(&SEPARABLE, &inputs, |device, moved| {
        let y = Tensor::uninit(&[s.n, s.h, s.w, filters], dtype, device)?;
        let f = SeparableForward {
            x: &moved[0],
            depthwise: &moved[1],
            pointwise: &moved[2],
            bias: moved.get(3),
            y: &y,
            s,
            filters,
            act,
        };
        with_kernels(device, |_, nk| nk.separable(&f))?;
        Ok(y)
    })
}

/// The gradients of [`separable_conv2d`], from what [`separable_conv2d_backward`] returns.
#[derive(Debug)]
pub struct SeparableConv2dGrads {
    /// W.r.t. the input (`None` unless asked for).
    pub dx: Option<Tensor>,
    /// W.r.t. the depthwise kernel `[kh, kw, c, 1]`.
    pub depthwise: Tensor,
    /// W.r.t. the pointwise kernel `[1, 1, c, filters]`.
    pub pointwise: Tensor,
    /// W.r.t. the bias `[filters]`.
    pub bias: Tensor,
}

/// The gradients of [`separable_conv2d`] from `dy`, the gradient w.r.t. its activated output
/// `y`: with `dz = dy * act'(y)` and `d` the depthwise output, the pointwise kernel's is
/// `dᵀ · dz`, the bias' `Σ dz`, and the depthwise kernel's and the input's those of
/// [`depthwise_conv2d`] from `dz · pointwiseᵀ`; the input's only when `need_dx`.
///
/// `d` is recomputed from `x` (the forward op does not keep it). On the CPU this runs a few
/// images at a time with every intermediate in cache; a GPU runs the unfused ops.
///
/// ```
/// use anygpu::ops::{self, spec::Activation};
/// use anygpu::Tensor;
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 1, 1, 2])?;
/// let depthwise = Tensor::from_vec(vec![2.0f32, 3.0], &[1, 1, 2, 1])?;
/// let pointwise = Tensor::from_vec(vec![1.0f32, -1.0], &[1, 1, 2, 1])?;
/// let y = ops::separable_conv2d(&x, &depthwise, &pointwise, None, Activation::Linear)?;
/// let dy = Tensor::from_vec(vec![1.0f32], &[1, 1, 1, 1])?;
/// let g = ops::separable_conv2d_backward(&x, &depthwise, &pointwise, &y, &dy, Activation::Linear, true)?;
/// assert_eq!(g.pointwise.to_vec::<f32>()?, [2.0, 6.0]); // d = [2, 6]
/// assert_eq!(g.depthwise.to_vec::<f32>()?, [1.0, -2.0]); // x * (dz · pointwiseᵀ)
/// assert_eq!(g.dx.unwrap().to_vec::<f32>()?, [2.0, -3.0]);
/// assert_eq!(g.bias.to_vec::<f32>()?, [1.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// Non-f32 tensors; shapes that do not fit together.
pub fn separable_conv2d_backward(
    x: &Tensor,
    depthwise: &Tensor,
    pointwise: &Tensor,
    y: &Tensor,
    dy: &Tensor,
    act: Activation,
    need_dx: bool,
) -> Result<SeparableConv2dGrads> {
    let weights = [depthwise, pointwise];
    separable_grads(false, x, weights, y, dy, act, need_dx)
}

/// The gradients of `max_pool2d(separable_conv2d(x, ...))` from `dpooled`, the gradient w.r.t.
/// the pooled output: what [`max_pool2d_backward`] of `y` followed by
/// [`separable_conv2d_backward`] gives, in one op. `y` is the separable convolution's activated
/// output (the pool's input).
///
/// On the CPU each block of images routes `dpooled` to its windows' maxima and applies the
/// activation's gradient while `y` is in cache, so the full-size gradient of `y` (12.8 MB for
/// the tutorial's first separable layer at batch 128) is never written or read back; a GPU
/// runs the two ops.
///
/// ```
/// use anygpu::ops::{self, spec::Activation};
/// use anygpu::Tensor;
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, 0.5], &[1, 2, 2, 1])?;
/// let depthwise = Tensor::from_vec(vec![1.0f32], &[1, 1, 1, 1])?;
/// let pointwise = Tensor::from_vec(vec![2.0f32], &[1, 1, 1, 1])?;
/// let y = ops::separable_conv2d(&x, &depthwise, &pointwise, None, Activation::Linear)?;
/// let dpooled = Tensor::from_vec(vec![1.0f32], &[1, 1, 1, 1])?;
/// let g = ops::separable_conv2d_max_pool_backward(
///     &x, &depthwise, &pointwise, &y, &dpooled, Activation::Linear, true)?;
/// // The window's maximum is y = 6 (x = 3): only that pixel gets a gradient.
/// assert_eq!(g.dx.unwrap().to_vec::<f32>()?, [0.0, 0.0, 2.0, 0.0]);
/// assert_eq!(g.pointwise.to_vec::<f32>()?, [3.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// Non-f32 tensors; shapes that do not fit together.
pub fn separable_conv2d_max_pool_backward(
    x: &Tensor,
    depthwise: &Tensor,
    pointwise: &Tensor,
    y: &Tensor,
    dpooled: &Tensor,
    act: Activation,
    need_dx: bool,
) -> Result<SeparableConv2dGrads> {
    let weights = [depthwise, pointwise];
    separable_grads(true, x, weights, y, dpooled, act, need_dx)
}

/// [`separable_conv2d_backward`] (`dy` w.r.t. `y`) or, when `pooled`,
/// [`separable_conv2d_max_pool_backward`] (`dy` w.r.t. the max-pool of `y`).
fn separable_grads(
    pooled: bool,
    x: &Tensor,
    [depthwise, pointwise]: [&Tensor; 2],
    y: &Tensor,
    dy: &Tensor,
    act: Activation,
    need_dx: bool,
) -> Result<SeparableConv2dGrads> {
    let info = if pooled {
        &SEPARABLE_MAX_POOL_BACKWARD
    } else {
        &SEPARABLE_BACKWARD
    };
    let name = info.name;
    let dtype = float_dtype(name, &[x, depthwise, pointwise, y, dy])?;
    let (s, filters) = separable_shape(name, x, depthwise, pointwise)?;
    let out_shape = [s.n, s.h, s.w, filters];
    if y.shape() != out_shape {
        return Err(mismatch(
            name,
            y.shape(),
            &out_shape,
            ": the output must have the forward output's shape",
        ));
    }
    let dy_shape = if pooled {
        [s.n, s.h / 2, s.w / 2, filters]
    } else {
        out_shape
    };
    if dy.shape() != dy_shape {
        let hint = if pooled {
            ": the gradient must have the pooled output's shape"
        } else {
            ": the gradient must have the forward output's shape"
        };
        return Err(mismatch(name, dy.shape(), &dy_shape, hint));
    }
    run(info, &[x, depthwise, pointwise, y, dy], |device, moved| {
        let dx = if need_dx {
            Some(Tensor::uninit(x.shape(), dtype, device)?)
        } else {
            None
        };
        let d_depthwise = Tensor::uninit(depthwise.shape(), dtype, device)?;
        let d_pointwise = Tensor::uninit(pointwise.shape(), dtype, device)?;
        let d_bias = Tensor::uninit(&[filters], dtype, device)?;
        let g = SeparableBackward {
            x: &moved[0],
            depthwise: &moved[1],
            pointwise: &moved[2],
            y: &moved[3],
            dy: &moved[4],
            pooled,
            dx: dx.as_ref(),
            d_depthwise: &d_depthwise,
            d_pointwise: &d_pointwise,
            d_bias: &d_bias,
            s,
            filters,
            act,
        };
        with_kernels(device, |_, nk| nk.separable_backward(&g))?;
        Ok(SeparableConv2dGrads {
            dx,
            depthwise: d_depthwise,
            pointwise: d_pointwise,
            bias: d_bias,
        })
    })
}

/// `[rows, cols]` of a tensor whose last axis holds the classes.
fn rows_cols(op: &'static str, logits: &Tensor) -> Result<(usize, usize)> {
    let Some(&cols) = logits.shape().last() else {
        return Err(Error::InvalidArgument(format!(
            "{op}: logits must have at least one axis, got a scalar"
        )));
    };
    Ok((logits.len().checked_div(cols).unwrap_or(0), cols))
}

/// Softmax over the last axis (`tf.nn.softmax(logits, axis=-1)`), shifted by each row's
/// maximum so any magnitude is safe.
///
/// # Errors
/// A non-f32 tensor or a scalar.
pub fn softmax(logits: &Tensor) -> Result<Tensor> {
    let name = SOFTMAX.name;
    logits.expect_dtype(name, DType::F32)?;
    let (rows, cols) = rows_cols(name, logits)?;
    run(&SOFTMAX, &[logits], |device, moved| {
        let probs = Tensor::uninit(logits.shape(), DType::F32, device)?;
        with_kernels(device, |_, nk| nk.softmax(&moved[0], &probs, rows, cols))?;
        Ok(probs)
    })
}

/// Checks `[rows, cols]` logits (f32) against `[rows]` labels (i32).
fn logits_labels(op: &'static str, logits: &Tensor, labels: &Tensor) -> Result<(usize, usize)> {
    logits.expect_dtype(op, DType::F32)?;
    labels.expect_dtype(op, DType::I32)?;
    let &[rows, cols] = logits.shape() else {
        return Err(mismatch(
            op,
            logits.shape(),
            labels.shape(),
            ": logits must be [batch, classes] and labels [batch]",
        ));
    };
    if labels.shape() != [rows] {
        return Err(mismatch(
            op,
            logits.shape(),
            labels.shape(),
            format!(": labels must have shape [{rows}], one class index per row"),
        ));
    }
    Ok((rows, cols))
}

/// Labels outside `[0, classes)`, in TensorFlow's words (checked where labels are on the host).
fn check_labels(labels: &Tensor, cols: usize) -> Result<()> {
    let values = labels.to_vec::<i32>()?;
    if let Some(&bad) = values
        .iter()
        .find(|&&l| usize::try_from(l).map_or(true, |l| l >= cols))
    {
        let shown: Vec<String> = values.iter().take(16).map(i32::to_string).collect();
        return Err(Error::InvalidArgument(format!(
            "Received a label value of {bad} which is outside the valid range of [0, {cols}).  \
             Label values: {}{}",
            shown.join(" "),
            if values.len() > 16 { " ..." } else { "" }
        )));
    }
    Ok(())
}

/// Sparse categorical cross-entropy on logits, fused with softmax
/// (`tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)`; Keras'
/// `SparseCategoricalCrossentropy(from_logits=True)` is the mean of the loss).
///
/// `logits` `[batch, classes]` f32, `labels` `[batch]` i32. Returns `(loss, dlogits)`: the
/// per-row loss `[batch]` and the gradient of the MEAN loss w.r.t. the logits,
/// `(softmax − onehot) / batch`.
///
/// Out-of-range labels behave as in TensorFlow: where the op runs on the CPU they are an
/// `InvalidArgument` error (the labels are checked on the host before the kernel runs); on a GPU
/// they are not read back (that would stall the device), and the affected rows' loss and
/// gradient are NaN.
///
/// # Errors
/// Wrong dtypes; shapes that do not fit together; no classes with a non-empty batch; on the
/// CPU, labels outside `[0, classes)`.
pub fn sparse_softmax_cross_entropy(logits: &Tensor, labels: &Tensor) -> Result<(Tensor, Tensor)> {
    let name = SPARSE_XENT.name;
    let (rows, cols) = logits_labels(name, logits, labels)?;
    if cols == 0 && rows > 0 {
        return Err(Error::InvalidArgument(format!(
            "{name}: logits of shape {:?} have no classes",
            logits.shape()
        )));
    }
    run(&SPARSE_XENT, &[logits, labels], |device, moved| {
        if device.device_type() == DeviceKind::Cpu {
            check_labels(&moved[1], cols)?;
        }
        let loss = Tensor::uninit(&[rows], DType::F32, device)?;
        let dlogits = Tensor::uninit(&[rows, cols], DType::F32, device)?;
        with_kernels(device, |_, nk| {
            nk.softmax_cross_entropy(&moved[0], &moved[1], &loss, &dlogits, rows, cols)
        })?;
        Ok((loss, dlogits))
    })
}

/// How many rows' arg max (the first maximum on ties) equals the label, as a `[1]` f32 tensor
/// that stays on the device (Keras' `sparse_categorical_accuracy` times the batch size; sum it
/// over batches and read it once per epoch). Labels outside `[0, classes)` never match.
///
/// # Errors
/// Wrong dtypes; shapes that do not fit together.
pub fn accuracy_count(logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
    let name = ACCURACY_COUNT.name;
    let (rows, cols) = logits_labels(name, logits, labels)?;
    run(&ACCURACY_COUNT, &[logits, labels], |device, moved| {
        let out = Tensor::uninit(&[1], DType::F32, device)?;
        with_kernels(device, |_, nk| {
            nk.accuracy_count(&moved[0], &moved[1], &out, rows, cols)
        })?;
        Ok(out)
    })
}

/// Whether two tensors are views of the same memory. Empty ones count too: on the CPU a
/// variable's write guard and its own gradient's read guard would deadlock whatever the size.
fn same_memory(a: &Tensor, b: &Tensor) -> bool {
    a.shares_storage(b)
}

/// Runs an in-place update of `w` (and its `slots`) on `w`'s device, whatever the current
/// scope says: parameters never move (TensorFlow colocates `ResourceApply*` ops with their
/// variable). The gradient is brought to that device; the placement is logged as usual.
fn update_in_place(
    info: &'static OpInfo,
    w: &Tensor,
    g: &Tensor,
    slots: &[&Tensor],
    f: impl FnOnce(&dyn NnKernels, &Tensor) -> Result<()> + Send,
) -> Result<()> {
    let name = info.name;
    expect_f32(name, &[w, g])?;
    expect_f32(name, slots)?;
    for t in std::iter::once(&g).chain(slots) {
        if t.shape() != w.shape() {
            return Err(mismatch(
                name,
                w.shape(),
                t.shape(),
                ": the gradient and the optimizer slots must have the variable's shape",
            ));
        }
    }
    // Every written tensor must own its memory: a write lock and a read of the same storage
    // would deadlock on the CPU, and the kernels read each element once before writing it.
    let written: Vec<&Tensor> = std::iter::once(w).chain(slots.iter().copied()).collect();
    for (i, a) in written.iter().enumerate() {
        for b in written[i + 1..].iter().chain(std::iter::once(&g)) {
            if same_memory(a, b) {
                return Err(Error::InvalidArgument(format!(
                    "{name}: the variable, its gradient and its slots must be distinct tensors"
                )));
            }
        }
    }
    let home = w.device_handle();
    for s in slots {
        if !s.device_handle().same_device(home) {
            return Err(Error::InvalidArgument(format!(
                "{name}: an optimizer slot is on {} but its variable is on {}; slots live with \
                 their variable",
                s.device_handle().name(),
                home.name()
            )));
        }
    }
    if let Err(missing) = crate::placement::can_run(home, info) {
        return Err(Error::Unsupported {
            op: name,
            device: home.full_name().to_string(),
            missing,
        });
    }
    let _scope = home.scope();
    run(info, &[w, g], |device, moved| {
        if !device.same_device(home) {
            return Err(Error::Unsupported {
                op: name,
                device: home.full_name().to_string(),
                missing: format!("the update was placed on {} instead", device.name()),
            });
        }
        with_kernels(device, |_, nk| f(nk, &moved[1]))
    })
}

/// One Keras SGD step on `w`, in place, on `w`'s device (`tf.raw_ops.ResourceApplyGradientDescent`,
/// or `ResourceApplyKerasMomentum` with a velocity): without momentum `w -= lr * g`; with a
/// `velocity` slot `v = momentum * v - lr * g; w += v` (Nesterov: `w += momentum * v - lr * g`).
/// `g` is copied to `w`'s device if it is elsewhere; the velocity must already be there.
///
/// # Errors
/// Wrong dtypes or shapes; a momentum without a velocity slot; a velocity on another device;
/// `w`, `g` and the velocity sharing memory.
pub fn sgd_update(w: &Tensor, g: &Tensor, velocity: Option<&Tensor>, p: &SgdParams) -> Result<()> {
    match velocity {
        None if p.momentum != 0.0 => Err(Error::InvalidArgument(format!(
            "{}: momentum {} needs a velocity slot",
            MOMENTUM_UPDATE.name, p.momentum
        ))),
        None => update_in_place(&SGD_UPDATE, w, g, &[], |nk, g| nk.sgd(w, g, p)),
        Some(v) => update_in_place(&MOMENTUM_UPDATE, w, g, &[v], |nk, g| {
            nk.sgd_momentum(w, g, v, p)
        }),
    }
}

/// One Keras 3 Adam step on `w`, in place, on `w`'s device (`tf.raw_ops.ResourceApplyAdam`):
/// `m += (g - m)(1 - β1); v += (g² - v)(1 - β2); w -= α m / (√v + ε)` with
/// `α = lr √(1 - β2^t) / (1 - β1^t)` (computed in f64), `t = p.step`, 1-based.
///
/// # Errors
/// Wrong dtypes or shapes; step 0; slots on another device; tensors sharing memory.
pub fn adam_update(w: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, p: &AdamParams) -> Result<()> {
    if p.step == 0 {
        return Err(Error::InvalidArgument(format!(
            "{}: the step count is 1-based; step 0 has no bias correction",
            ADAM_UPDATE.name
        )));
    }
    update_in_place(&ADAM_UPDATE, w, g, &[m, v], |nk, g| nk.adam(w, g, m, v, p))
}

// ---- optimizers: RMSprop, weight decay, gradient clipping ----

/// One Keras 3 RMSprop step on `w`, in place, on `w`'s device
/// (`tf.raw_ops.ResourceApplyRMSProp`, or `ResourceApplyCenteredRMSProp` with an `average`
/// slot): `v = ρ v + (1 - ρ) g²`; centered `a = ρ a + (1 - ρ) g` and `d = v - a² + ε`, else
/// `d = v + ε`; `Δ = lr g / √d`; with a `momentum` slot `m = μ m + Δ; w -= m`, else `w -= Δ`.
///
/// # Errors
/// Wrong dtypes or shapes; `centered` without an average slot (or the reverse), a momentum
/// without its slot; slots on another device; tensors sharing memory.
pub fn rmsprop_update(
    w: &Tensor,
    g: &Tensor,
    v: &Tensor,
    average: Option<&Tensor>,
    momentum: Option<&Tensor>,
    p: &RmspropParams,
) -> Result<()> {
    let info = if p.centered {
        &CENTERED_RMSPROP_UPDATE
    } else {
        &RMSPROP_UPDATE
    };
    if p.centered != average.is_some() || (p.momentum != 0.0) != momentum.is_some() {
        return Err(Error::InvalidArgument(format!(
            "{}: centered={} and momentum={} need {} average-gradient and {} momentum slot",
            info.name,
            p.centered,
            p.momentum,
            if p.centered { "an" } else { "no" },
            if p.momentum != 0.0 { "a" } else { "no" },
        )));
    }
    let slots: Vec<&Tensor> = std::iter::once(v).chain(average).chain(momentum).collect();
    update_in_place(info, w, g, &slots, |nk, g| {
        nk.rmsprop(w, g, v, average, momentum, p)
    })
}

/// Keras' decoupled weight decay on `w`, in place, on `w`'s device: `w -= w * wd * lr`
/// (`optimizer._apply_weight_decay`, run before the update with the step's learning rate).
///
/// # Errors
/// A `w` that is not float32; device errors.
pub fn weight_decay_update(w: &Tensor, wd: f32, lr: f32) -> Result<()> {
    let name = WEIGHT_DECAY.name;
    expect_f32(name, &[w])?;
    let home = w.device_handle();
    let _scope = home.scope();
    run(&WEIGHT_DECAY, &[w], |device, _| {
        if !device.same_device(home) {
            return Err(Error::Unsupported {
                op: name,
                device: home.full_name().to_string(),
                missing: format!("the update was placed on {} instead", device.name()),
            });
        }
        with_kernels(device, |_, nk| nk.weight_decay(w, wd, lr))
    })
}

/// `g` clipped as Keras 3's optimizers clip it, in a new tensor on `g`'s device:
/// [`ClipMode::Norm`] (`tf.clip_by_norm`, the norm of `g` itself) and
/// [`ClipMode::GlobalNorm`] (the scale of `clip_by_global_norm`) take their norm from
/// `sum_squares`, a one-element tensor holding the sum of squares (`g`'s own, or every
/// gradient's), read on the device: no host wait. [`ClipMode::Value`] ignores it.
///
/// # Errors
/// A norm mode without `sum_squares`, or one that is not one element; a clip value that is not
/// a finite number > 0; dtypes other than float32.
pub fn clip_gradient(g: &Tensor, sum_squares: Option<&Tensor>, mode: ClipMode) -> Result<Tensor> {
    let (info, c) = match mode {
        ClipMode::Norm(c) | ClipMode::GlobalNorm(c) => (&CLIP_BY_NORM, c),
        ClipMode::Value(c) => (&CLIP_BY_VALUE, c),
    };
    if !(c.is_finite() && c > 0.0) {
        return Err(Error::InvalidArgument(format!(
            "{}: the clip value must be a finite number > 0, got {c}",
            info.name
        )));
    }
    let ss = match (mode, sum_squares) {
        (ClipMode::Value(_), _) => None,
        (_, Some(t)) if t.len() == 1 => Some(t),
        (_, other) => {
            return Err(Error::InvalidArgument(format!(
                "{}: needs the sum of squares as one element, got {}",
                info.name,
                other.map_or("none".to_string(), |t| format!("shape {:?}", t.shape()))
            )))
        }
    };
    let mut inputs = vec![g];
    inputs.extend(ss);
    expect_f32(info.name, &inputs)?;
    let _scope = g.device_handle().scope();
    run(info, &inputs, |device, moved| {
        let out = Tensor::uninit(g.shape(), DType::F32, device)?;
        with_kernels(device, |_, nk| nk.clip(&moved[0], moved.get(1), &out, mode))?;
        Ok(out)
    })
}
