//! Optimizer hyper-parameters as the kernels take them: [`SgdParams`], [`AdamParams`],
//! [`RmspropParams`], and gradient clipping's [`ClipMode`].

/// Hyper-parameters of Keras' SGD (`learning_rate`, `momentum`, `nesterov`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdParams {
    /// Step size.
    pub lr: f32,
    /// Momentum; 0 means plain SGD (no velocity slot).
    pub momentum: f32,
    /// Nesterov momentum.
    pub nesterov: bool,
}

/// Hyper-parameters of Keras' Adam, plus the 1-based step number the update is for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamParams {
    /// Step size (Keras default 1e-3).
    pub lr: f32,
    /// First-moment decay (0.9).
    pub beta1: f32,
    /// Second-moment decay (0.999).
    pub beta2: f32,
    /// Keras' epsilon (1e-7), added outside the square root.
    pub epsilon: f32,
    /// 1-based step count, for the bias correction.
    pub step: u32,
}

/// Hyper-parameters of Keras' RMSprop (`learning_rate`, `rho`, `momentum`, `epsilon`,
/// `centered`). Which slots the update takes follows from `momentum != 0` and `centered`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmspropParams {
    /// Step size (Keras default 1e-3).
    pub lr: f32,
    /// Discount of the squared-gradient average (0.9).
    pub rho: f32,
    /// Momentum (0: no momentum slot).
    pub momentum: f32,
    /// Keras' epsilon (1e-7), added inside the square root.
    pub epsilon: f32,
    /// Divides by the gradient's estimated variance instead of its second moment.
    pub centered: bool,
}

/// How a gradient is clipped before the update (Keras 3's `clipnorm`, `global_clipnorm`,
/// `clipvalue`: at most one per optimizer).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ClipMode {
    /// `g * c / max(‖g‖, c)` with the gradient's own L2 norm (`tf.clip_by_norm`).
    Norm(f32),
    /// `g * (c * min(1 / n, 1 / c))` with the L2 norm `n` over every gradient of the step
    /// (NaN everywhere when `n` is not finite, as Keras' `clip_by_global_norm`).
    GlobalNorm(f32),
    /// `min(max(g, -c), c)` element-wise (`tf.clip_by_value`).
    Value(f32),
}

/// Keras' rules moving a loss scale `base * 2^e` (see [`NnKernels::loss_scale_advance`]):
/// doubled after `growth_steps` finite steps in a row, halved after a non-finite one, with `e`
/// kept in `[e_min, e_max]`, where the scale is a normal float (Keras would go on to infinity,
/// or through subnormals to zero, where training stops for good).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ScaleRules {
    pub(crate) growth_steps: u64,
    pub(crate) e_min: i32,
    pub(crate) e_max: i32,
}

impl ScaleRules {
    /// The rules for a scale whose exponent 0 is `base` (a normal float).
    pub(crate) fn new(growth_steps: u64, base: f32) -> ScaleRules {
        // base = m * 2^x with m in [1, 2): base * 2^e stays normal for -126 <= x + e <= 127.
        let x = ((base.to_bits() >> 23) & 0xff) as i32 - 127;
        ScaleRules {
            growth_steps,
            e_min: -126 - x,
            e_max: 127 - x,
        }
    }
}
