//! The fused separable convolution (`SeparableConv2D`: depthwise, then pointwise, bias and
//! activation) and its gradients, with or without a 2×2 max-pool after it.

use crate::dtype::DType;
use crate::error::Result;
use crate::ops::gpu::nn as gn;
use crate::ops::nn_kernels::{SeparableBackward, SeparableForward, StemConv};
use crate::ops::spec::{Activation, Conv2dShape, DepthwiseShape, Padding};
use crate::ops::{run, with_kernels};
use crate::placement::OpInfo;
use crate::tensor::Tensor;

use super::depthwise::depthwise_shape;
use super::{float_dtype, mismatch, op};

const SEPARABLE: OpInfo = op("FusedSeparableConv2D", gn::SEPARABLE);
const SEPARABLE_MAX_POOL: OpInfo = op("FusedSeparableConv2DMaxPool", gn::SEPARABLE_MAX_POOL);
const SEPARABLE_BACKWARD: OpInfo = op("FusedSeparableConv2DGrad", gn::SEPARABLE_BACKWARD);
const SEPARABLE_MAX_POOL_BACKWARD: OpInfo = op(
    "FusedSeparableConv2DMaxPoolGrad",
    gn::SEPARABLE_MAX_POOL_BACKWARD,
);

/// The shapes of a separable convolution: the depthwise shape and the filter count, from `x`,
/// the depthwise kernel and the pointwise kernel.
fn separable_shape(
    op: &'static str,
    x: &[usize],
    depthwise: &Tensor,
    pointwise: &Tensor,
) -> Result<(DepthwiseShape, usize)> {
    let s = depthwise_shape(op, x, depthwise.shape(), Padding::Same.into())?;
    if s.multiplier != 1 {
        return Err(mismatch(
            op,
            x,
            depthwise.shape(),
            ": the fused separable convolution takes depth multiplier 1 (run \
             depthwise_conv2d_with and pointwise_conv2d for others)",
        ));
    }
    if s.c == 0 {
        return Err(mismatch(
            op,
            x,
            depthwise.shape(),
            ": the input has no channels",
        ));
    }
    match *pointwise.shape() {
        [1, 1, c, filters] if c == s.c => Ok((s, filters)),
        _ => Err(mismatch(
            op,
            x,
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
/// GPU runs [`depthwise_conv2d`](crate::ops::depthwise_conv2d) and [`pointwise_conv2d`](crate::ops::pointwise_conv2d).
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
/// Tensors not all float32 or all float16; shapes that do not fit together (named in the message).
pub fn separable_conv2d(
    x: &Tensor,
    depthwise: &Tensor,
    pointwise: &Tensor,
    bias: Option<&Tensor>,
    act: Activation,
) -> Result<Tensor> {
    let out = separable_forward(
        (&SEPARABLE, Pool::None),
        x,
        None,
        [depthwise, pointwise],
        bias,
        act,
    )?;
    Ok(out.y.expect("separable_forward(Pool::None) returns y"))
}

/// [`separable_conv2d`] and the 2×2 max-pool of its output
/// ([`max_pool2d`](crate::ops::max_pool2d)) in one op: returns `(y, pooled)`, `pooled` being
/// `[n, h / 2, w / 2, filters]`. The backward pass needs `y`
/// ([`separable_conv2d_max_pool_backward`]).
///
/// On the CPU each block of images is pooled while its output is in cache, so `y` is not read
/// back from memory; a GPU runs the separable convolution, then the pool.
///
/// ```
/// use anygpu::ops::{self, spec::Activation};
/// use anygpu::Tensor;
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, 0.5], &[1, 2, 2, 1])?;
/// let depthwise = Tensor::from_vec(vec![1.0f32], &[1, 1, 1, 1])?;
/// let pointwise = Tensor::from_vec(vec![2.0f32], &[1, 1, 1, 1])?;
/// let (y, pooled) =
///     ops::separable_conv2d_max_pool(&x, &depthwise, &pointwise, None, Activation::Linear)?;
/// assert_eq!(y.to_vec::<f32>()?, [2.0, -4.0, 6.0, 1.0]);
/// assert_eq!(pooled.to_vec::<f32>()?, [6.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// As [`separable_conv2d`].
pub fn separable_conv2d_max_pool(
    x: &Tensor,
    depthwise: &Tensor,
    pointwise: &Tensor,
    bias: Option<&Tensor>,
    act: Activation,
) -> Result<(Tensor, Tensor)> {
    let info = (&SEPARABLE_MAX_POOL, Pool::Pooled);
    Ok(separable_forward(info, x, None, [depthwise, pointwise], bias, act)?.y_and_pooled())
}

/// A stride-1 convolution in front of a separable one, checked: its output has the shape
/// `out` (the separable convolution's input).
pub(super) struct Stem<'a> {
    pub(super) kernel: &'a Tensor,
    pub(super) bias: Option<&'a Tensor>,
    pub(super) s: Conv2dShape,
    pub(super) act: Activation,
    pub(super) out: [usize; 4],
}

/// Which outputs [`separable_forward`] returns.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Pool {
    /// `y`.
    None,
    /// `y` and its 2×2 max-pool.
    Pooled,
    /// The max-pool and its argmax (the CPU only), not `y`.
    WithArgmax,
}

/// What [`separable_forward`] returns, as its [`Pool`] asked.
pub(super) struct Outputs {
    pub(super) y: Option<Tensor>,
    pub(super) pooled: Option<Tensor>,
    pub(super) argmax: Option<Tensor>,
}

impl Outputs {
    /// `(y, pooled)`, from [`Pool::Pooled`].
    pub(super) fn y_and_pooled(self) -> (Tensor, Tensor) {
        match (self.y, self.pooled) {
            (Some(y), Some(pooled)) => (y, pooled),
            _ => unreachable!("separable_forward(Pool::Pooled) returns y and the pool"),
        }
    }

    /// `(pooled, argmax)`, from [`Pool::WithArgmax`].
    pub(super) fn pooled_and_argmax(self) -> (Tensor, Tensor) {
        match (self.pooled, self.argmax) {
            (Some(pooled), Some(argmax)) => (pooled, argmax),
            _ => unreachable!("separable_forward(Pool::WithArgmax) returns the pool and argmax"),
        }
    }
}

/// [`separable_conv2d`] as the op `info`, with its max-pool (and its argmax) as `pool` asks,
/// and behind a `stem` when given (`x` is then the stem's input).
pub(super) fn separable_forward(
    (info, pool): (&OpInfo, Pool),
    x: &Tensor,
    stem: Option<&Stem<'_>>,
    [depthwise, pointwise]: [&Tensor; 2],
    bias: Option<&Tensor>,
    act: Activation,
) -> Result<Outputs> {
    let name = info.name;
    let dtype = float_dtype(name, &[x, depthwise, pointwise])?;
    let x_shape = stem.map_or(x.shape(), |t| &t.out[..]);
    let (s, filters) = separable_shape(name, x_shape, depthwise, pointwise)?;
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
    let stem_at = inputs.len();
    if let Some(t) = stem {
        inputs.push(t.kernel);
        inputs.extend(t.bias);
    }
    run(info, &inputs, |device, moved| {
        let y = match pool {
            Pool::WithArgmax => None,
            _ => Some(Tensor::uninit(&[s.n, s.h, s.w, filters], dtype, device)?),
        };
        let pooled_shape = [s.n, s.h / 2, s.w / 2, filters];
        let pooled = match pool {
            Pool::None => None,
            _ => Some(Tensor::uninit(&pooled_shape, dtype, device)?),
        };
        let argmax = match pool {
            Pool::WithArgmax => Some(Tensor::uninit(&pooled_shape, DType::I32, device)?),
            _ => None,
        };
        let f = SeparableForward {
            x: &moved[0],
            depthwise: &moved[1],
            pointwise: &moved[2],
            bias: bias.map(|_| &moved[3]),
            y: y.as_ref(),
            pooled: pooled.as_ref(),
            argmax: argmax.as_ref(),
            s,
            filters,
            act,
            stem: stem.map(|t| StemConv {
                kernel: &moved[stem_at],
                bias: t.bias.map(|_| &moved[stem_at + 1]),
                s: t.s,
                act: t.act,
            }),
        };
        with_kernels(device, |_, nk| nk.separable(&f))?;
        Ok(Outputs { y, pooled, argmax })
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
/// [`depthwise_conv2d`](crate::ops::depthwise_conv2d) from `dz · pointwiseᵀ`; the input's only when `need_dx`.
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
/// Tensors not all float32 or all float16; shapes that do not fit together.
pub fn separable_conv2d_backward(
    x: &Tensor,
    depthwise: &Tensor,
    pointwise: &Tensor,
    y: &Tensor,
    dy: &Tensor,
    act: Activation,
    need_dx: bool,
) -> Result<SeparableConv2dGrads> {
    let options = SeparableBackwardOptions {
        need_dx,
        ..SeparableBackwardOptions::default()
    };
    separable_conv2d_backward_with(x, [depthwise, pointwise], y, dy, act, options)
}

/// What [`separable_conv2d_backward_with`] computes beyond the weight gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeparableBackwardOptions {
    /// `dy` is the gradient w.r.t. the 2×2 max-pool of `y`
    /// ([`separable_conv2d_max_pool_backward`]).
    pub pooled: bool,
    /// Compute the gradient w.r.t. the input.
    pub need_dx: bool,
    /// The activation whose output the input `x` is (the layer before's): the input's gradient
    /// comes multiplied by its gradient at `x`, which is the gradient w.r.t. that layer's
    /// pre-activation output. On the CPU it is applied while `x` is in cache, saving that
    /// layer a pass over its output. `Linear` (the default): the plain input gradient.
    pub input_activation: Activation,
}

impl Default for SeparableBackwardOptions {
    /// Not pooled, the input's gradient plain.
    fn default() -> Self {
        SeparableBackwardOptions {
            pooled: false,
            need_dx: true,
            input_activation: Activation::Linear,
        }
    }
}

/// The gradients of [`separable_conv2d`] (or, with `options.pooled`, of
/// [`separable_conv2d_max_pool`]) as `options` asks: [`separable_conv2d_backward`] and
/// [`separable_conv2d_max_pool_backward`] are its two common cases.
///
/// ```
/// use anygpu::ops::{self, spec::Activation, SeparableBackwardOptions};
/// use anygpu::Tensor;
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// // `x` is the output of a ReLU: the input gradient stops where it was 0.
/// let x = Tensor::from_vec(vec![1.0f32, 0.0], &[1, 1, 1, 2])?;
/// let depthwise = Tensor::from_vec(vec![2.0f32, 3.0], &[1, 1, 2, 1])?;
/// let pointwise = Tensor::from_vec(vec![1.0f32, -1.0], &[1, 1, 2, 1])?;
/// let y = ops::separable_conv2d(&x, &depthwise, &pointwise, None, Activation::Linear)?;
/// let dy = Tensor::from_vec(vec![1.0f32], &[1, 1, 1, 1])?;
/// let options = SeparableBackwardOptions {
///     input_activation: Activation::Relu,
///     ..SeparableBackwardOptions::default()
/// };
/// let g = ops::separable_conv2d_backward_with(
///     &x, [&depthwise, &pointwise], &y, &dy, Activation::Linear, options)?;
/// assert_eq!(g.dx.unwrap().to_vec::<f32>()?, [2.0, 0.0]); // [2, -3] through ReLU'
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// Tensors not all float32 or all float16; shapes that do not fit together.
pub fn separable_conv2d_backward_with(
    x: &Tensor,
    [depthwise, pointwise]: [&Tensor; 2],
    y: &Tensor,
    dy: &Tensor,
    act: Activation,
    options: SeparableBackwardOptions,
) -> Result<SeparableConv2dGrads> {
    let info = if options.pooled {
        &SEPARABLE_MAX_POOL_BACKWARD
    } else {
        &SEPARABLE_BACKWARD
    };
    let (grads, _) = separable_grads(
        (info, options),
        x,
        None,
        [depthwise, pointwise],
        (Kept::Output(y), dy),
        act,
    )?;
    Ok(grads)
}

/// The gradients of `max_pool2d(separable_conv2d(x, ...))` from `dpooled`, the gradient w.r.t.
/// the pooled output: what [`max_pool2d_backward`](crate::ops::max_pool2d_backward) of `y` followed by
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
/// Tensors not all float32 or all float16; shapes that do not fit together.
pub fn separable_conv2d_max_pool_backward(
    x: &Tensor,
    depthwise: &Tensor,
    pointwise: &Tensor,
    y: &Tensor,
    dpooled: &Tensor,
    act: Activation,
    need_dx: bool,
) -> Result<SeparableConv2dGrads> {
    let options = SeparableBackwardOptions {
        pooled: true,
        need_dx,
        ..SeparableBackwardOptions::default()
    };
    separable_conv2d_backward_with(x, [depthwise, pointwise], y, dpooled, act, options)
}

/// What a separable op's backward pass reads of its forward pass's output.
#[derive(Clone, Copy)]
pub(super) enum Kept<'a> {
    /// The activated output.
    Output(&'a Tensor),
    /// Its 2×2 max-pool and the pool's argmax ([`Pool::WithArgmax`]).
    Argmax {
        pooled: &'a Tensor,
        argmax: &'a Tensor,
    },
}

/// The gradients of the op `info` as `options` asks (see [`separable_conv2d_backward_with`]);
/// with a `stem` (`x` is then its input, and `options.need_dx` must be false) its kernel's and
/// bias' gradients too.
pub(super) fn separable_grads(
    (info, options): (&OpInfo, SeparableBackwardOptions),
    x: &Tensor,
    stem: Option<&Stem<'_>>,
    [depthwise, pointwise]: [&Tensor; 2],
    (kept, dy): (Kept<'_>, &Tensor),
    act: Activation,
) -> Result<(SeparableConv2dGrads, Option<[Tensor; 2]>)> {
    let SeparableBackwardOptions {
        pooled,
        need_dx,
        input_activation,
    } = options;
    let name = info.name;
    let y = match kept {
        Kept::Output(y) => y,
        Kept::Argmax { pooled, .. } => pooled,
    };
    let dtype = float_dtype(name, &[x, depthwise, pointwise, y, dy])?;
    let x_shape = stem.map_or(x.shape(), |t| &t.out[..]);
    let (s, filters) = separable_shape(name, x_shape, depthwise, pointwise)?;
    let out_shape = [s.n, s.h, s.w, filters];
    let pooled_shape = [s.n, s.h / 2, s.w / 2, filters];
    match kept {
        Kept::Output(y) if y.shape() != out_shape => {
            return Err(mismatch(
                name,
                y.shape(),
                &out_shape,
                ": the output must have the forward output's shape",
            ));
        }
        Kept::Output(_) => {}
        Kept::Argmax { pooled, argmax } => {
            argmax.expect_dtype(name, DType::I32)?;
            for t in [pooled, argmax] {
                if t.shape() != pooled_shape {
                    return Err(mismatch(
                        name,
                        t.shape(),
                        &pooled_shape,
                        ": the pool's output and argmax must have the pooled output's shape",
                    ));
                }
            }
        }
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
    let mut inputs = vec![x, depthwise, pointwise, y, dy];
    if let Some(t) = stem {
        inputs.push(t.kernel);
        inputs.extend(t.bias);
    }
    let argmax_at = inputs.len();
    if let Kept::Argmax { argmax, .. } = kept {
        inputs.push(argmax);
    }
    run(info, &inputs, |device, moved| {
        let dx = if need_dx && stem.is_none() {
            Some(Tensor::uninit(x.shape(), dtype, device)?)
        } else {
            None
        };
        let d_depthwise = Tensor::uninit(depthwise.shape(), dtype, device)?;
        let d_pointwise = Tensor::uninit(pointwise.shape(), dtype, device)?;
        let d_bias = Tensor::uninit(&[filters], dtype, device)?;
        let d_stem = match stem {
            Some(t) => Some([
                Tensor::uninit(t.kernel.shape(), dtype, device)?,
                Tensor::uninit(&[t.s.c_out], dtype, device)?,
            ]),
            None => None,
        };
        let g = SeparableBackward {
            x: &moved[0],
            depthwise: &moved[1],
            pointwise: &moved[2],
            y: &moved[3],
            argmax: moved.get(argmax_at),
            dy: &moved[4],
            pooled,
            dx: dx.as_ref(),
            d_depthwise: &d_depthwise,
            d_pointwise: &d_pointwise,
            d_bias: &d_bias,
            s,
            filters,
            act,
            input_act: input_activation,
            stem: stem.zip(d_stem.as_ref()).map(|(t, [dk, db])| {
                let conv = StemConv {
                    kernel: &moved[5],
                    bias: t.bias.map(|_| &moved[6]),
                    s: t.s,
                    act: t.act,
                };
                (conv, [dk, db])
            }),
        };
        with_kernels(device, |_, nk| nk.separable_backward(&g))?;
        let grads = SeparableConv2dGrads {
            dx,
            depthwise: d_depthwise,
            pointwise: d_pointwise,
            bias: d_bias,
        };
        Ok((grads, d_stem))
    })
}
