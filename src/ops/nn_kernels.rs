//! [`NnKernels`], the CNN kernels both devices implement (`ops/host.rs`, `ops/gpu/nn.rs`), and
//! the argument bundles of its fused kernels. Below the front-ends (`ops/nn`) and the devices'
//! kernels alike: it imports neither.

use crate::error::Result;
use crate::ops::spec::{
    Activation, AdamParams, Conv2dShape, DepthwiseShape, Padding, PoolShape, SgdParams,
};
use crate::ops::spec::{ActivationFn, Pool2dShape};
use crate::ops::spec::{BatchNormParams, ClipMode, RmspropParams, ScaleRules};
use crate::tensor::Tensor;

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
    /// The kernel and bias gradients of a convolution whose output a batch normalization
    /// takes, and that normalization's own gradients (see
    /// [`conv2d_backward_weights_normalized`](crate::ops::nn::conv2d_backward_weights_normalized)).
    fn conv2d_backward_weights_normalized(&self, g: &ConvNormGrads<'_>) -> Result<()>;
    /// A convolution of a batch normalization's output through a ReLU, from the
    /// normalization's input (see
    /// [`conv2d_normalized_input`](crate::ops::nn::conv2d_normalized_input)).
    fn conv2d_normalized_input(
        &self,
        x: &NormalizedInput<'_>,
        weights: (&Tensor, Option<&Tensor>),
        y: &Tensor,
        s: &Conv2dShape,
        act: Activation,
    ) -> Result<()>;
    /// Its gradient w.r.t. the kernel.
    fn conv2d_backward_kernel_normalized_input(
        &self,
        x: &NormalizedInput<'_>,
        dz: &Tensor,
        dk: &Tensor,
        s: &Conv2dShape,
    ) -> Result<()>;
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
    fn batch_norm(&self, a: &BatchNormArgs<'_>) -> Result<()>;
    /// Its gradients.
    fn batch_norm_backward(&self, g: &BatchNormGradArgs<'_>) -> Result<()>;
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
        p: &LossParams,
    ) -> Result<()>;
    /// Each row's metric value, see [`crate::ops::loss::metric_rows`].
    fn metric_rows(
        &self,
        z: &Tensor,
        targets: &Tensor,
        out: &Tensor,
        rows_cols: (usize, usize),
        kind: MetricKind,
        act: OutputActivation,
    ) -> Result<()>;
    /// `y = sigmoid(x)` element-wise.
    fn sigmoid(&self, x: &Tensor, y: &Tensor) -> Result<()>;

    // ---- fused optimizer update ----
    /// Every variable of `f.vars` updated in place by `f.rule`, after the decoupled weight
    /// decay when `f.weight_decay` is set, with exactly the per-variable kernels' results. The
    /// default runs those kernels one variable after another (the CPU's update is one pass per
    /// variable already); a GPU overrides it with one dispatch over all of them.
    fn fused_update(&self, f: &FusedUpdate<'_>) -> Result<()> {
        if let Some(scaled) = f.scaled {
            // Resolved against the state here, then this update again without it.
            return resolved_update(self, f, scaled);
        }
        if let Some(c) = f.clip_value {
            // Every clipped copy before any variable changes, then this update on them.
            let clipped = f
                .vars
                .iter()
                .map(|v| {
                    let out = Tensor::uninit(v.g.shape(), v.g.dtype(), v.g.device_handle())?;
                    self.clip(v.g, None, &out, crate::ops::spec::ClipMode::Value(c))?;
                    Ok(out)
                })
                .collect::<Result<Vec<_>>>()?;
            let vars: Vec<UpdateVar<'_>> = f
                .vars
                .iter()
                .zip(&clipped)
                .map(|(v, g)| UpdateVar { g, ..*v })
                .collect();
            return self.fused_update(&FusedUpdate {
                vars: &vars,
                clip_value: None,
                ..*f
            });
        }
        for v in f.vars {
            if let Some(wd) = f.weight_decay {
                self.weight_decay(v.w, wd, f.rule.learning_rate())?;
            }
            let missing = || {
                crate::error::Error::InvalidArgument(format!(
                    "FusedApplyGradients: a slot of the {} update is missing",
                    f.rule.name()
                ))
            };
            match &f.rule {
                UpdateRule::Sgd(p) => match v.slots[0] {
                    None => self.sgd(v.w, v.g, p)?,
                    Some(velocity) => self.sgd_momentum(v.w, v.g, velocity, p)?,
                },
                UpdateRule::Adam(p) => {
                    let (Some(m), Some(s)) = (v.slots[0], v.slots[1]) else {
                        return Err(missing());
                    };
                    self.adam(v.w, v.g, m, s, p)?;
                }
                UpdateRule::RmsProp(p) => {
                    let Some(velocity) = v.slots[0] else {
                        return Err(missing());
                    };
                    self.rmsprop(v.w, v.g, velocity, v.slots[1], v.slots[2], p)?;
                }
            }
        }
        Ok(())
    }

    // ---- loss scaling on the device ----
    /// Sets the flag of the loss-scale `state` (see [`ScaledUpdate::state`]) when some element
    /// of some gradient of `f.vars` is infinite or NaN; leaves it otherwise.
    fn loss_scale_check(&self, f: &FusedUpdate<'_>, state: &Tensor) -> Result<()>;
    /// `x = x * factor * 2^e` in place, `e` the exponent of the loss-scale `state`: the loss
    /// gradient's seed.
    fn loss_scale_seed(&self, x: &Tensor, factor: f32, state: &Tensor) -> Result<()>;
    /// `out = g * inverse_base * 2^-e` (`g` unscaled by the state's scale), setting the
    /// state's flag when some element of `g` is infinite or NaN.
    fn loss_scale_unscale(
        &self,
        g: &Tensor,
        out: &Tensor,
        inverse_base: f32,
        state: &Tensor,
    ) -> Result<()>;
    /// Moves the loss-scale `state` after a step's update by Keras' rules (a skipped step
    /// halves the scale and restarts the count; an applied one counts, in `iterations` too,
    /// and doubles the scale after `growth_steps` in a row) and clears the flag.
    fn loss_scale_advance(&self, state: &Tensor, rules: ScaleRules) -> Result<()>;
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
    /// The output; `None` with `argmax`.
    pub(crate) y: Option<&'a Tensor>,
    /// When given, also `max_pool2d(y)` (2×2, stride 2, 'valid').
    pub(crate) pooled: Option<&'a Tensor>,
    /// With `pooled` and without `y` (the CPU only): where each window's maximum is, 0 (top
    /// left) to 3 (bottom right), as int32 `[n, h / 2, w / 2, filters]`.
    pub(crate) argmax: Option<&'a Tensor>,
    pub(crate) s: DepthwiseShape,
    pub(crate) filters: usize,
    pub(crate) act: Activation,
    /// A convolution whose output is the separable convolution's input; `x` is then the
    /// convolution's input.
    pub(crate) stem: Option<StemConv<'a>>,
}

/// A stride-1 convolution in front of a separable one (see
/// [`conv2d_separable_conv2d_max_pool`](crate::ops::conv2d_separable_conv2d_max_pool)):
/// `act(conv2d(x, kernel) + bias)`, the separable convolution's input.
#[derive(Clone, Copy)]
pub(crate) struct StemConv<'a> {
    pub(crate) kernel: &'a Tensor,
    pub(crate) bias: Option<&'a Tensor>,
    pub(crate) s: Conv2dShape,
    pub(crate) act: Activation,
}

/// The tensors of [`NnKernels::separable_backward`]: the forward tensors (`y` the activated
/// output) and `dy`; outputs `dx` (optional) and the three weight gradients.
pub(crate) struct SeparableBackward<'a> {
    pub(crate) x: &'a Tensor,
    pub(crate) depthwise: &'a Tensor,
    pub(crate) pointwise: &'a Tensor,
    /// The activated output; with `argmax`, its 2×2 max-pool.
    pub(crate) y: &'a Tensor,
    /// Where each pooled maximum is (see [`SeparableForward::argmax`]; the CPU only).
    pub(crate) argmax: Option<&'a Tensor>,
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
    /// The activation whose output `x` is: `dx` is multiplied by its gradient (`Linear`: not).
    pub(crate) input_act: Activation,
    /// The stem convolution (see [`SeparableForward::stem`]), whose output is recomputed, and
    /// its kernel's and bias' gradients; `dx` is then `None` and `input_act` unused.
    pub(crate) stem: Option<(StemConv<'a>, [&'a Tensor; 2])>,
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

/// The tensors of [`NnKernels::conv2d_backward_weights_normalized`]: the convolution's input
/// `x` and output `z`, the gradient `dy` w.r.t. the normalization's output, its `gamma`, the
/// forward pass's `stats` and, with a fused ReLU, `relu_beta`; outputs `dk`, `db` (with a
/// bias), `dgamma` and `dbeta`.
pub(crate) struct ConvNormGrads<'a> {
    pub(crate) x: &'a Tensor,
    pub(crate) z: &'a Tensor,
    pub(crate) dy: &'a Tensor,
    pub(crate) gamma: &'a Tensor,
    pub(crate) stats: &'a Tensor,
    pub(crate) relu_beta: Option<&'a Tensor>,
    pub(crate) dk: &'a Tensor,
    pub(crate) db: Option<&'a Tensor>,
    pub(crate) dgamma: &'a Tensor,
    pub(crate) dbeta: &'a Tensor,
    pub(crate) s: Conv2dShape,
}

/// A convolution's input as a batch normalization in training left it, followed by a ReLU:
/// `max((z - mean) · inv · gamma + beta, 0)`, never written whole.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NormalizedInput<'a> {
    /// The normalization's input.
    pub z: &'a Tensor,
    /// Its scale.
    pub gamma: &'a Tensor,
    /// Its offset.
    pub beta: &'a Tensor,
    /// The training pass's batch statistics (`[2, c]`: mean, inverse deviation).
    pub stats: &'a Tensor,
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

// ---- batch normalization ----

/// A batch normalization's variables: `gamma` and `beta` (`[c]`; ones and zeros stand in for
/// `scale=False` and `center=False`), and the moving statistics (`[c]`), all float32 whatever
/// the input's dtype (Keras does not autocast them).
#[derive(Clone, Copy, Debug)]
pub struct BatchNormVariables<'a> {
    /// Scale.
    pub gamma: &'a Tensor,
    /// Offset.
    pub beta: &'a Tensor,
    /// Moving mean (updated in place by a training pass).
    pub moving_mean: &'a Tensor,
    /// Moving variance (likewise).
    pub moving_variance: &'a Tensor,
}

/// What a device's batch normalization kernel gets: `stats` (`[mean; inv]`, `2c` float32) is
/// `Some` for a training pass, which also updates the moving statistics in place; `relu`: `y`
/// goes through a ReLU too (TensorFlow's `_FusedBatchNormEx`).
pub(crate) struct BatchNormArgs<'a> {
    pub(crate) x: &'a Tensor,
    pub(crate) v: BatchNormVariables<'a>,
    pub(crate) y: &'a Tensor,
    pub(crate) stats: Option<&'a Tensor>,
    pub(crate) p: BatchNormParams,
    pub(crate) relu: bool,
    /// What goes into `y`.
    pub(crate) writes: NormWrites,
}

/// What a batch normalization's forward kernel writes into its `y`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NormWrites {
    /// The normalized values, `x`'s shape.
    Values,
    /// Their mean over each image's `pixels` rows (`[rows / pixels, c]`, a global average
    /// pooling after the layer; the CPU only).
    ImageMeans(usize),
    /// Nothing (`y` is empty): the statistics only, for a reader that normalizes `x` as it
    /// reads it (a convolution after the layer; the CPU only).
    Nothing,
}

impl NormWrites {
    /// The pixels of each image a mean goes over, for [`NormWrites::ImageMeans`].
    pub(crate) fn image_means(self) -> Option<usize> {
        match self {
            NormWrites::ImageMeans(pixels) => Some(pixels),
            _ => None,
        }
    }
}

/// What a device's batch normalization gradient kernel gets; `relu_beta` (`beta`) when the
/// forward pass went through a ReLU, whose gradient the kernel applies to `dy` first.
pub(crate) struct BatchNormGradArgs<'a> {
    pub(crate) x: &'a Tensor,
    pub(crate) dy: &'a Tensor,
    pub(crate) gamma: &'a Tensor,
    pub(crate) relu_beta: Option<&'a Tensor>,
    pub(crate) stats: &'a Tensor,
    pub(crate) dx: &'a Tensor,
    pub(crate) dgamma: &'a Tensor,
    pub(crate) dbeta: &'a Tensor,
    pub(crate) p: BatchNormParams,
    /// `Some(pixels)`: `dy` is the gradient w.r.t. the per-image means of
    /// [`NormWrites::ImageMeans`] (the CPU only).
    pub(crate) image_means: Option<usize>,
}

// ---- losses on float targets and metrics (front-ends in `ops/loss.rs`) ----

/// What a loss kernel computes per row (see [`dense_loss`](crate::ops::loss::dense_loss)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum LossKind {
    /// `Σ_c −y_c log softmax(z)_c`; gradient `softmax(z) − y` (TensorFlow's, exact for targets
    /// that sum to 1).
    CategoricalLogits = 0,
    /// Keras on probabilities: `p / Σ p`, clipped to `[1e-7, 1 − 1e-7]`, `−Σ y log p`.
    CategoricalProbs = 1,
    /// Mean over the row of `max(z, 0) − z y + log1p(exp(−|z|))`.
    BinaryLogits = 2,
    /// Mean over the row of `−(y log p + (1 − y) log(1 − p))`, `p` clipped to
    /// `[1e-7, 1 − 1e-7]`.
    BinaryProbs = 3,
    /// Mean over the row of `(o − y)²`.
    MeanSquared = 4,
    /// Mean over the row of `|o − y|` (gradient `sign(o − y)`, 0 at 0 as TensorFlow's).
    MeanAbsolute = 5,
}

/// The activation between the kernel's input `z` and the model's output `o`: what the
/// regression losses and the metrics apply before they compare with the targets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum OutputActivation {
    /// `o = z`.
    #[default]
    Identity = 0,
    /// `o = softmax(z)` over the row.
    Softmax = 1,
    /// `o = sigmoid(z)`.
    Sigmoid = 2,
}

/// The options of a loss kernel over `[rows, cols]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossParams {
    /// Rows of the output (examples, times the positions of an output of rank > 2).
    pub rows: usize,
    /// The last axis.
    pub cols: usize,
    /// The loss.
    pub kind: LossKind,
    /// The activation the regression losses apply to `z` first (ignored by the
    /// cross-entropies, which read logits or probabilities by their kind).
    pub act: OutputActivation,
    /// Keras' `label_smoothing` (cross-entropies only): `y (1 − ls) + ls / cols` for the
    /// categorical, `y (1 − ls) + ls / 2` for the binary one.
    pub label_smoothing: f32,
    /// Multiplies each row's loss as written (`examples / rows`: the per-example mean over
    /// positions).
    pub row_scale: f32,
    /// Multiplies the gradient of the row's loss (`1 / rows` for the batch mean, times the
    /// loss scale).
    pub grad_scale: f32,
}

/// What a metric kernel counts per row (see [`metric_rows`](crate::ops::loss::metric_rows)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MetricKind {
    /// 1 when the integer label is among the `k` largest outputs, TensorFlow's `in_top_k`: ties
    /// at the boundary count as in, a label out of range or a non-finite output in the row
    /// counts 0.
    SparseTopK(usize),
    /// 1 when the row's first arg max equals the targets' first arg max.
    Categorical,
    /// Mean over the row of `[o > threshold] == y`.
    Binary(f32),
    /// Mean over the row of `(o − y)²`.
    MeanSquared,
}

// ---- fused optimizer update ----

/// An optimizer's update rule with the step's hyper-parameters, for
/// [`fused_update`](crate::ops::fused_update).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UpdateRule {
    /// SGD; with momentum when the variables carry a velocity slot.
    Sgd(SgdParams),
    /// Adam (and AdamW, whose decay is the update's `weight_decay`).
    Adam(AdamParams),
    /// RMSprop.
    RmsProp(RmspropParams),
}

impl UpdateRule {
    /// The step's learning rate, which the weight decay uses too.
    pub fn learning_rate(&self) -> f32 {
        match self {
            UpdateRule::Sgd(p) => p.lr,
            UpdateRule::Adam(p) => p.lr,
            UpdateRule::RmsProp(p) => p.lr,
        }
    }

    /// TensorFlow's name of the per-variable op.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            UpdateRule::Sgd(p) if p.momentum != 0.0 => "ResourceApplyKerasMomentum",
            UpdateRule::Sgd(_) => "ResourceApplyGradientDescent",
            UpdateRule::Adam(_) => "ResourceApplyAdam",
            UpdateRule::RmsProp(p) if p.centered => "ResourceApplyCenteredRMSProp",
            UpdateRule::RmsProp(_) => "ResourceApplyRMSProp",
        }
    }
}

/// One variable of a fused update: the variable, its float32 gradient (same shape, same
/// device), and its slots in the rule's order — SGD `[velocity]`; Adam `[m, v]`; RMSprop
/// `[velocity, average gradient (centered), momentum]` — `None` where the rule has none.
#[derive(Clone, Copy, Debug)]
pub struct UpdateVar<'a> {
    /// The variable, updated in place.
    pub w: &'a Tensor,
    /// Its gradient.
    pub g: &'a Tensor,
    /// Its slots, updated in place.
    pub slots: [Option<&'a Tensor>; 3],
}

/// A fused update as the kernels take it: the variables of one device, and on a GPU the table
/// describing them (see `fused_update` in `shaders/optim.wgsl`).
pub(crate) struct FusedUpdate<'a> {
    pub(crate) rule: UpdateRule,
    pub(crate) weight_decay: Option<f32>,
    pub(crate) vars: &'a [UpdateVar<'a>],
    pub(crate) table: Option<&'a Tensor>,
    /// Keras' `clipvalue`: each gradient element clipped to `[-c, c]` first (after unscaling),
    /// exactly as [`NnKernels::clip`] clips it.
    pub(crate) clip_value: Option<f32>,
    /// Under dynamic loss scaling decided on the device: the state the update reads (`rule` is
    /// then ignored for the rules of the table).
    pub(crate) scaled: Option<ScaledUpdate<'a>>,
}

// ---- loss scaling on the device ----

/// What a fused update under dynamic loss scaling reads on the device besides its variables:
/// nothing applies while the state's flag is set, the gradients are unscaled by the state's
/// scale, and the rule (learning rate, Adam's bias correction) is the one of the device's
/// iteration count.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScaledUpdate<'a> {
    /// Four int32 words on the variables' device: the step's flag (non-zero: some gradient
    /// element is not finite), the exponent `e` of the scale `base * 2^e`, the finite steps in
    /// a row, and the applied steps (`optimizer.iterations`, low 32 bits).
    pub(crate) state: &'a Tensor,
    /// `rules[j]`: the update when the state's iteration count is `t_base + j` (at most 16).
    pub(crate) rules: &'a [UpdateRule],
    pub(crate) t_base: u32,
    /// `1 / base`: each gradient is multiplied by `inverse_base * 2^-e`, exactly the inverse of
    /// the scale.
    pub(crate) inverse_base: f32,
    /// Whether the update unscales the gradients (`false`: they were unscaled, and clipped,
    /// before).
    pub(crate) unscale: bool,
}

/// Rules a [`ScaledUpdate`] may carry (a GPU passes them in its uniform params).
pub(crate) const SCALED_RULES: usize = 16;

/// A loss-scaled fused update resolved against its state, read here (the default
/// [`NnKernels::fused_update`]'s: on the CPU the state is host memory, nothing waits): nothing
/// when the flag is set; otherwise the gradients unscaled by the state's scale
/// ([`NnKernels::loss_scale_unscale`]) in new tensors made before any variable changes, then
/// the update of the state's iteration count, one variable after another.
///
/// # Errors
/// A state that is not four words, an iteration count the rules do not cover; what the update
/// refuses; out of memory.
fn resolved_update<K: NnKernels + ?Sized>(
    k: &K,
    f: &FusedUpdate<'_>,
    s: ScaledUpdate<'_>,
) -> Result<()> {
    use crate::error::Error;
    let words = s.state.to_vec::<i32>()?;
    let &[flag, _, _, iterations] = words.as_slice() else {
        return Err(Error::InvalidArgument(format!(
            "FusedApplyGradients: the loss-scale state must be four words, got {}",
            words.len()
        )));
    };
    if flag != 0 {
        return Ok(());
    }
    let j = (iterations as u32).wrapping_sub(s.t_base) as usize;
    let Some(&rule) = s.rules.get(j) else {
        return Err(Error::InvalidArgument(format!(
            "FusedApplyGradients: the device counts {j} iterations past the last the host read, \
             but the update carries rules for {} only",
            s.rules.len()
        )));
    };
    if !s.unscale {
        return k.fused_update(&FusedUpdate {
            rule,
            scaled: None,
            ..*f
        });
    }
    let grads = f
        .vars
        .iter()
        .map(|v| {
            let out = Tensor::uninit(v.g.shape(), v.g.dtype(), v.g.device_handle())?;
            k.loss_scale_unscale(v.g, &out, s.inverse_base, s.state)?;
            Ok(out)
        })
        .collect::<Result<Vec<_>>>()?;
    let vars: Vec<UpdateVar<'_>> = f
        .vars
        .iter()
        .zip(&grads)
        .map(|(v, g)| UpdateVar { g, ..*v })
        .collect();
    k.fused_update(&FusedUpdate {
        rule,
        vars: &vars,
        scaled: None,
        ..*f
    })
}
