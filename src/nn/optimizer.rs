//! Optimizers (`keras.optimizers.SGD`, `Adam`, `AdamW`, `RMSprop`) and their per-weight state.
//!
//! Every optimizer takes Keras 3's base options ([`BaseOptions`]): a learning-rate schedule,
//! `weight_decay` (decoupled, `w -= w * wd * lr` before the update), and one of `clipnorm`,
//! `global_clipnorm`, `clipvalue`, applied to the gradients the update sees (after loss-scale
//! unscaling and after the cross-replica sums).
//!
//! Each weight's slots (SGD's velocity, Adam's moments) are created on the weight's device the
//! first time it is updated, and the update runs there: a model split over devices keeps every
//! weight and its optimizer state on the device of its layer.

use std::fmt;

use crate::error::{Error, Result};
use crate::nn::schedules::LearningRateSchedule;
use crate::ops;
use crate::ops::spec::{AdamParams, ClipMode, RmspropParams, SgdParams};
use crate::tensor::{DType, Tensor};

/// Keras 3's options of every optimizer (`keras.optimizers.Optimizer`'s keyword arguments),
/// set through the builder methods each optimizer has: `learning_rate_schedule`,
/// `weight_decay`, `clipnorm`, `global_clipnorm`, `clipvalue`.
///
/// ```
/// use anygpu::nn::{ExponentialDecay, Sgd};
/// let sgd = Sgd::new(0.1).weight_decay(1e-4).clipnorm(1.0);
/// assert_eq!((sgd.options.weight_decay, sgd.options.clipnorm), (Some(1e-4), Some(1.0)));
/// let scheduled = Sgd::default().learning_rate_schedule(ExponentialDecay::new(0.1, 100, 0.5));
/// assert!(scheduled.options.schedule.is_some());
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BaseOptions {
    /// A schedule evaluated at `optimizer.iterations` (steps applied so far) in place of the
    /// constant `learning_rate`.
    pub schedule: Option<LearningRateSchedule>,
    /// `weight_decay`: before each update, `w -= w * weight_decay * learning_rate`.
    pub weight_decay: Option<f32>,
    /// `clipnorm`: each gradient is scaled to an L2 norm of at most this.
    pub clipnorm: Option<f32>,
    /// `global_clipnorm`: all gradients together are scaled to an L2 norm of at most this.
    pub global_clipnorm: Option<f32>,
    /// `clipvalue`: each element is clipped to `[-clipvalue, clipvalue]`.
    pub clipvalue: Option<f32>,
}

impl BaseOptions {
    /// The clipping, if any (Keras: `clipnorm`, then `global_clipnorm`, then `clipvalue`,
    /// each only when > 0; at most one may be set).
    pub(crate) fn clip(&self) -> Option<ClipMode> {
        let positive = |v: Option<f32>| v.filter(|&c| c > 0.0);
        positive(self.clipnorm)
            .map(ClipMode::Norm)
            .or(positive(self.global_clipnorm).map(ClipMode::GlobalNorm))
            .or(positive(self.clipvalue).map(ClipMode::Value))
    }

    fn validate(&self, name: &str) -> Result<()> {
        let set = [self.clipnorm, self.clipvalue, self.global_clipnorm]
            .iter()
            .filter(|c| c.is_some())
            .count();
        if set > 1 {
            let show = |v: Option<f32>| v.map_or("None".to_string(), |v| v.to_string());
            return Err(Error::InvalidArgument(format!(
                "{name}: Only one of `clipnorm`, `clipvalue` and `global_clipnorm` can be set. \
                 Received: clipnorm={}, clipvalue={}, global_clipnorm={}",
                show(self.clipnorm),
                show(self.clipvalue),
                show(self.global_clipnorm)
            )));
        }
        for (what, v) in [
            ("weight_decay", self.weight_decay),
            ("clipnorm", self.clipnorm),
            ("clipvalue", self.clipvalue),
            ("global_clipnorm", self.global_clipnorm),
        ] {
            if let Some(v) = v {
                if !v.is_finite() || v < 0.0 {
                    return Err(Error::InvalidArgument(format!(
                        "{name}: {what} must be a finite number >= 0, got {v}"
                    )));
                }
            }
        }
        if let Some(s) = &self.schedule {
            s.validate()?;
        }
        Ok(())
    }

    /// The options after the hyper-parameters in `Display`, only those set.
    fn describe(&self) -> String {
        let mut out = String::new();
        if let Some(s) = &self.schedule {
            out += &format!(", learning_rate={s}");
        }
        for (what, v) in [
            ("weight_decay", self.weight_decay),
            ("clipnorm", self.clipnorm),
            ("global_clipnorm", self.global_clipnorm),
            ("clipvalue", self.clipvalue),
        ] {
            if let Some(v) = v {
                out += &format!(", {what}={v}");
            }
        }
        out
    }
}

/// The builder methods of [`BaseOptions`] on an optimizer.
macro_rules! base_options {
    ($t:ident) => {
        impl $t {
            /// `learning_rate=schedule`: the rate at each step is the schedule's value at
            /// `optimizer.iterations`.
            pub fn learning_rate_schedule(
                mut self,
                schedule: impl Into<LearningRateSchedule>,
            ) -> $t {
                self.options.schedule = Some(schedule.into());
                self
            }

            /// `weight_decay=`: decoupled decay `w -= w * weight_decay * learning_rate` before
            /// every update.
            pub fn weight_decay(mut self, weight_decay: f32) -> $t {
                self.options.weight_decay = Some(weight_decay);
                self
            }

            /// `clipnorm=`: each gradient's L2 norm is clipped to this.
            pub fn clipnorm(mut self, clipnorm: f32) -> $t {
                self.options.clipnorm = Some(clipnorm);
                self
            }

            /// `global_clipnorm=`: the L2 norm of all gradients together is clipped to this.
            pub fn global_clipnorm(mut self, global_clipnorm: f32) -> $t {
                self.options.global_clipnorm = Some(global_clipnorm);
                self
            }

            /// `clipvalue=`: each gradient element is clipped to `[-clipvalue, clipvalue]`.
            pub fn clipvalue(mut self, clipvalue: f32) -> $t {
                self.options.clipvalue = Some(clipvalue);
                self
            }
        }
    };
}

/// Stochastic gradient descent (`keras.optimizers.SGD`), Keras' defaults:
/// `learning_rate=0.01, momentum=0.0, nesterov=False`.
///
/// With momentum `m`, Keras' update: `v = m * v - lr * g`, then `w += v` (or, Nesterov,
/// `w += m * v - lr * g`).
///
/// ```
/// use anygpu::nn::Sgd;
/// let sgd = Sgd::default();
/// assert_eq!((sgd.learning_rate, sgd.momentum, sgd.nesterov), (0.01, 0.0, false));
/// let nesterov = Sgd::new(0.01).momentum(0.9).nesterov(true);
/// assert!(nesterov.nesterov);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Sgd {
    /// `learning_rate`.
    pub learning_rate: f32,
    /// `momentum` (0 = plain SGD, no velocity slot).
    pub momentum: f32,
    /// `nesterov`.
    pub nesterov: bool,
    /// Schedule, weight decay, clipping.
    pub options: BaseOptions,
}

base_options!(Sgd);

impl Sgd {
    /// SGD with this learning rate, no momentum.
    pub fn new(learning_rate: f32) -> Sgd {
        Sgd {
            learning_rate,
            ..Sgd::default()
        }
    }

    /// `momentum=`.
    pub fn momentum(mut self, momentum: f32) -> Sgd {
        self.momentum = momentum;
        self
    }

    /// `nesterov=`.
    pub fn nesterov(mut self, nesterov: bool) -> Sgd {
        self.nesterov = nesterov;
        self
    }
}

impl Default for Sgd {
    fn default() -> Self {
        Sgd {
            learning_rate: 0.01,
            momentum: 0.0,
            nesterov: false,
            options: BaseOptions::default(),
        }
    }
}

/// Adam (`keras.optimizers.Adam`), Keras' defaults: `learning_rate=0.001, beta_1=0.9,
/// beta_2=0.999, epsilon=1e-7`.
///
/// ```
/// use anygpu::nn::Adam;
/// let adam = Adam::default();
/// assert_eq!((adam.learning_rate, adam.beta_1, adam.beta_2, adam.epsilon), (1e-3, 0.9, 0.999, 1e-7));
/// assert_eq!(Adam::new(3e-4).learning_rate, 3e-4);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Adam {
    /// `learning_rate`.
    pub learning_rate: f32,
    /// `beta_1`, the first moment's decay.
    pub beta_1: f32,
    /// `beta_2`, the second moment's decay.
    pub beta_2: f32,
    /// `epsilon`, added outside the square root as in Keras.
    pub epsilon: f32,
    /// Schedule, weight decay, clipping.
    pub options: BaseOptions,
}

base_options!(Adam);

impl Adam {
    /// Adam with this learning rate and Keras' other defaults.
    pub fn new(learning_rate: f32) -> Adam {
        Adam {
            learning_rate,
            ..Adam::default()
        }
    }
}

impl Default for Adam {
    fn default() -> Self {
        Adam {
            learning_rate: 1e-3,
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-7,
            options: BaseOptions::default(),
        }
    }
}

/// Adam with decoupled weight decay (`keras.optimizers.AdamW`), Keras' defaults:
/// `learning_rate=0.001, weight_decay=0.004, beta_1=0.9, beta_2=0.999, epsilon=1e-7`. As in
/// Keras 3, it is [`Adam`] whose `weight_decay` must be set: before each update
/// `w -= w * weight_decay * learning_rate`, then Adam's step.
///
/// ```
/// use anygpu::nn::{AdamW, Optimizer};
/// let adamw = AdamW::default();
/// assert_eq!((adamw.learning_rate, adamw.options.weight_decay), (1e-3, Some(0.004)));
/// assert_eq!(Optimizer::from(AdamW::new(3e-4)).name(), "AdamW");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct AdamW {
    /// `learning_rate`.
    pub learning_rate: f32,
    /// `beta_1`, the first moment's decay.
    pub beta_1: f32,
    /// `beta_2`, the second moment's decay.
    pub beta_2: f32,
    /// `epsilon`, added outside the square root as in Keras.
    pub epsilon: f32,
    /// Schedule, weight decay (required: Keras raises `ValueError` without it), clipping.
    pub options: BaseOptions,
}

base_options!(AdamW);

impl AdamW {
    /// AdamW with this learning rate and Keras' other defaults.
    pub fn new(learning_rate: f32) -> AdamW {
        AdamW {
            learning_rate,
            ..AdamW::default()
        }
    }

    /// The Adam it runs.
    fn adam(&self) -> Adam {
        Adam {
            learning_rate: self.learning_rate,
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            options: self.options.clone(),
        }
    }
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW {
            learning_rate: 1e-3,
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-7,
            options: BaseOptions {
                weight_decay: Some(0.004),
                ..BaseOptions::default()
            },
        }
    }
}

/// RMSprop (`keras.optimizers.RMSprop`), Keras' defaults: `learning_rate=0.001, rho=0.9,
/// momentum=0.0, epsilon=1e-7, centered=False`.
///
/// Keras 3's update: `v = rho v + (1 - rho) g²`; centered, also `a = rho a + (1 - rho) g` and
/// the denominator `sqrt(v - a² + epsilon)`, else `sqrt(v + epsilon)` (epsilon inside the
/// root); `increment = lr g / denominator`; with momentum `m = momentum m + increment`,
/// `w -= m`, else `w -= increment`. Slots: `velocity`, `momentum` (when momentum > 0),
/// `average_gradient` (when centered).
///
/// ```
/// use anygpu::nn::RmsProp;
/// let rms = RmsProp::default();
/// assert_eq!((rms.learning_rate, rms.rho, rms.momentum, rms.epsilon, rms.centered), (1e-3, 0.9, 0.0, 1e-7, false));
/// let centered = RmsProp::new(0.01).momentum(0.9).centered(true);
/// assert!(centered.centered);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RmsProp {
    /// `learning_rate`.
    pub learning_rate: f32,
    /// `rho`, the discount of the squared-gradient average.
    pub rho: f32,
    /// `momentum` (0: no momentum slot).
    pub momentum: f32,
    /// `epsilon`, inside the square root as in Keras.
    pub epsilon: f32,
    /// `centered`: normalize by the estimated variance of the gradient.
    pub centered: bool,
    /// Schedule, weight decay, clipping.
    pub options: BaseOptions,
}

base_options!(RmsProp);

impl RmsProp {
    /// RMSprop with this learning rate and Keras' other defaults.
    pub fn new(learning_rate: f32) -> RmsProp {
        RmsProp {
            learning_rate,
            ..RmsProp::default()
        }
    }

    /// `rho=`.
    pub fn rho(mut self, rho: f32) -> RmsProp {
        self.rho = rho;
        self
    }

    /// `momentum=`.
    pub fn momentum(mut self, momentum: f32) -> RmsProp {
        self.momentum = momentum;
        self
    }

    /// `epsilon=`.
    pub fn epsilon(mut self, epsilon: f32) -> RmsProp {
        self.epsilon = epsilon;
        self
    }

    /// `centered=`.
    pub fn centered(mut self, centered: bool) -> RmsProp {
        self.centered = centered;
        self
    }
}

impl Default for RmsProp {
    fn default() -> Self {
        RmsProp {
            learning_rate: 1e-3,
            rho: 0.9,
            momentum: 0.0,
            epsilon: 1e-7,
            centered: false,
            options: BaseOptions::default(),
        }
    }
}

/// Dynamic loss scaling around another optimizer (`keras.optimizers.LossScaleOptimizer`),
/// Keras' rules and defaults: the loss is multiplied by the scale (initially `2^15`) before
/// the backward pass, so that small float16 gradients do not flush to zero; the gradients are
/// divided by it before the inner optimizer's update (and its clipping). A step whose gradients
/// hold an infinity or a NaN updates nothing (the inner optimizer's `iterations` do not count
/// it) and halves the scale; after `dynamic_growth_steps` finite steps in a row the scale
/// doubles. Keras puts no floor under the scale, and neither do we.
///
/// Under `mixed_float16`, [`Sequential::compile`](crate::nn::Sequential::compile) wraps its
/// optimizer in one by itself, as Keras 3 does. Under a [`MirroredStrategy`](crate::distribute::MirroredStrategy),
/// across workers and in a pipeline, the check runs on the summed gradients, which every
/// replica holds alike: one replica's overflow skips the step everywhere.
///
/// ```
/// use anygpu::nn::{Adam, LossScaleOptimizer, Optimizer};
/// let opt = LossScaleOptimizer::new(Adam::default());
/// assert_eq!((opt.initial_scale, opt.dynamic_growth_steps), (32768.0, 2000));
/// assert_eq!(opt.inner().name(), "Adam");
/// assert_eq!(Optimizer::from(opt).name(), "LossScaleOptimizer");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct LossScaleOptimizer {
    /// Never a `LossScale` itself.
    inner: Box<Optimizer>,
    /// `initial_scale`: the first step's scale.
    pub initial_scale: f32,
    /// `dynamic_growth_steps`: finite steps in a row before the scale doubles.
    pub dynamic_growth_steps: u64,
}

impl LossScaleOptimizer {
    /// Wraps `inner` with Keras' defaults (`initial_scale=2**15, dynamic_growth_steps=2000`).
    /// Wrapping a `LossScaleOptimizer` again wraps its inner optimizer.
    pub fn new(inner: impl Into<Optimizer>) -> LossScaleOptimizer {
        let inner = match inner.into() {
            Optimizer::LossScale(l) => l.inner,
            other => Box::new(other),
        };
        LossScaleOptimizer {
            inner,
            initial_scale: 32768.0,
            dynamic_growth_steps: 2000,
        }
    }

    /// `initial_scale=`.
    pub fn initial_scale(mut self, scale: f32) -> LossScaleOptimizer {
        self.initial_scale = scale;
        self
    }

    /// `dynamic_growth_steps=`.
    pub fn dynamic_growth_steps(mut self, steps: u64) -> LossScaleOptimizer {
        self.dynamic_growth_steps = steps;
        self
    }

    /// The wrapped optimizer.
    pub fn inner(&self) -> &Optimizer {
        &self.inner
    }
}

/// An optimizer for [`crate::nn::Sequential::compile`].
///
/// ```
/// use anygpu::nn::{Adam, Optimizer, Sgd};
/// let sgd: Optimizer = Sgd::default().into();
/// assert_eq!(sgd.name(), "SGD");
/// assert_eq!(Optimizer::from(Adam::default()).learning_rate(), 1e-3);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum Optimizer {
    /// [`Sgd`].
    Sgd(Sgd),
    /// [`Adam`].
    Adam(Adam),
    /// [`AdamW`].
    AdamW(AdamW),
    /// [`RmsProp`].
    RmsProp(RmsProp),
    /// [`LossScaleOptimizer`] around another.
    LossScale(LossScaleOptimizer),
}

impl Optimizer {
    /// Keras' class name: `SGD`, `Adam`, `AdamW`, `RMSprop`, `LossScaleOptimizer`.
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd(_) => "SGD",
            Optimizer::Adam(_) => "Adam",
            Optimizer::AdamW(_) => "AdamW",
            Optimizer::RmsProp(_) => "RMSprop",
            Optimizer::LossScale(_) => "LossScaleOptimizer",
        }
    }

    /// The learning rate it was built with (the inner optimizer's, under loss scaling; a
    /// schedule's value at step 0). [`Sequential::learning_rate`](crate::nn::Sequential::learning_rate)
    /// is the one the next step uses.
    pub fn learning_rate(&self) -> f32 {
        match self.options().schedule.as_ref() {
            Some(s) => s.value(0),
            None => self.constant_learning_rate(),
        }
    }

    /// The `learning_rate` field, schedule or not.
    fn constant_learning_rate(&self) -> f32 {
        match self {
            Optimizer::Sgd(s) => s.learning_rate,
            Optimizer::Adam(a) => a.learning_rate,
            Optimizer::AdamW(a) => a.learning_rate,
            Optimizer::RmsProp(r) => r.learning_rate,
            Optimizer::LossScale(l) => l.inner.constant_learning_rate(),
        }
    }

    /// The base options (the inner optimizer's, under loss scaling).
    pub fn options(&self) -> &BaseOptions {
        match self {
            Optimizer::Sgd(s) => &s.options,
            Optimizer::Adam(a) => &a.options,
            Optimizer::AdamW(a) => &a.options,
            Optimizer::RmsProp(r) => &r.options,
            Optimizer::LossScale(l) => l.inner.options(),
        }
    }

    /// The optimizer that updates the weights: this one, or the one loss scaling wraps.
    pub(crate) fn base(&self) -> &Optimizer {
        match self {
            Optimizer::LossScale(l) => &l.inner,
            other => other,
        }
    }

    /// The loss scaling, if any.
    pub(crate) fn loss_scaling(&self) -> Option<&LossScaleOptimizer> {
        match self {
            Optimizer::LossScale(l) => Some(l),
            _ => None,
        }
    }

    /// Checks the hyper-parameters (Keras raises `ValueError` on the same).
    pub(crate) fn validate(&self) -> Result<()> {
        if let Optimizer::LossScale(l) = self {
            if !(l.initial_scale.is_finite() && l.initial_scale > 0.0) {
                return Err(Error::InvalidArgument(format!(
                    "LossScaleOptimizer: initial_scale must be a finite number > 0, got {}",
                    l.initial_scale
                )));
            }
            if l.dynamic_growth_steps == 0 {
                return Err(Error::InvalidArgument(
                    "LossScaleOptimizer: dynamic_growth_steps must be >= 1, got 0".into(),
                ));
            }
            return l.inner().validate();
        }
        let name = self.name();
        let bad = |what: &str, v: f32| {
            Err(Error::InvalidArgument(format!(
                "{name}: {what} must be {}, got {v}",
                if what == "learning_rate" {
                    "a finite number >= 0"
                } else {
                    "in [0, 1)"
                }
            )))
        };
        let lr = self.constant_learning_rate();
        if !lr.is_finite() || lr < 0.0 {
            return bad("learning_rate", lr);
        }
        self.options().validate(name)?;
        let unit = |v: f32| (0.0..1.0).contains(&v);
        let epsilon = |e: f32| {
            if e.is_finite() && e > 0.0 {
                Ok(())
            } else {
                Err(Error::InvalidArgument(format!(
                    "{name}: epsilon must be > 0, got {e}"
                )))
            }
        };
        match self {
            Optimizer::Sgd(s) if !unit(s.momentum) => Err(Error::InvalidArgument(format!(
                "SGD: `momentum` must be a float between [0, 1]. Received: momentum={}",
                s.momentum
            ))),
            Optimizer::Adam(a) if !unit(a.beta_1) => bad("beta_1", a.beta_1),
            Optimizer::Adam(a) if !unit(a.beta_2) => bad("beta_2", a.beta_2),
            Optimizer::Adam(a) => epsilon(a.epsilon),
            Optimizer::AdamW(a) if a.options.weight_decay.is_none() => Err(Error::InvalidArgument(
                "AdamW: Argument `weight_decay` must be a float. Received: weight_decay=None"
                    .into(),
            )),
            Optimizer::AdamW(a) => Optimizer::Adam(a.adam()).validate(),
            Optimizer::RmsProp(r) if !unit(r.rho) => bad("rho", r.rho),
            Optimizer::RmsProp(r) if !unit(r.momentum) => bad("momentum", r.momentum),
            Optimizer::RmsProp(r) => epsilon(r.epsilon),
            _ => Ok(()),
        }
    }
}

impl Default for Optimizer {
    /// Keras' `optimizer="sgd"`.
    fn default() -> Self {
        Optimizer::Sgd(Sgd::default())
    }
}

impl From<Sgd> for Optimizer {
    fn from(s: Sgd) -> Self {
        Optimizer::Sgd(s)
    }
}

impl From<Adam> for Optimizer {
    fn from(a: Adam) -> Self {
        Optimizer::Adam(a)
    }
}

impl From<AdamW> for Optimizer {
    fn from(a: AdamW) -> Self {
        Optimizer::AdamW(a)
    }
}

impl From<RmsProp> for Optimizer {
    fn from(r: RmsProp) -> Self {
        Optimizer::RmsProp(r)
    }
}

impl From<LossScaleOptimizer> for Optimizer {
    fn from(l: LossScaleOptimizer) -> Self {
        Optimizer::LossScale(l)
    }
}

impl fmt::Display for Optimizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Optimizer::Sgd(s) => write!(
                f,
                "SGD(learning_rate={}, momentum={}, nesterov={}{})",
                s.learning_rate,
                s.momentum,
                s.nesterov,
                s.options.describe()
            ),
            Optimizer::Adam(a) => write!(
                f,
                "Adam(learning_rate={}, beta_1={}, beta_2={}, epsilon={}{})",
                a.learning_rate,
                a.beta_1,
                a.beta_2,
                a.epsilon,
                a.options.describe()
            ),
            Optimizer::AdamW(a) => write!(
                f,
                "AdamW(learning_rate={}, beta_1={}, beta_2={}, epsilon={}{})",
                a.learning_rate,
                a.beta_1,
                a.beta_2,
                a.epsilon,
                a.options.describe()
            ),
            Optimizer::RmsProp(r) => write!(
                f,
                "RMSprop(learning_rate={}, rho={}, momentum={}, epsilon={}, centered={}{})",
                r.learning_rate,
                r.rho,
                r.momentum,
                r.epsilon,
                r.centered,
                r.options.describe()
            ),
            Optimizer::LossScale(l) => write!(
                f,
                "LossScaleOptimizer({}, initial_scale={}, dynamic_growth_steps={})",
                l.inner(),
                l.initial_scale,
                l.dynamic_growth_steps
            ),
        }
    }
}

/// The slots of one weight.
#[derive(Debug)]
enum Slots {
    /// Plain SGD.
    None,
    /// SGD with momentum.
    Velocity(Tensor),
    /// Adam's first and second moments.
    Moments(Tensor, Tensor),
    /// RMSprop's velocity, momentum (momentum > 0) and average gradient (centered).
    Rms {
        velocity: Tensor,
        momentum: Option<Tensor>,
        average: Option<Tensor>,
    },
}

impl Slots {
    /// The tensors with Keras 3's slot names, in [`slot_names`] order.
    fn named(&self) -> Vec<(&'static str, &Tensor)> {
        match self {
            Slots::None => vec![],
            Slots::Velocity(v) => vec![("momentum", v)],
            Slots::Moments(m, v) => vec![("momentum", m), ("velocity", v)],
            Slots::Rms {
                velocity,
                momentum,
                average,
            } => std::iter::once(("velocity", velocity))
                .chain(momentum.as_ref().map(|m| ("momentum", m)))
                .chain(average.as_ref().map(|a| ("average_gradient", a)))
                .collect(),
        }
    }
}

/// Where dynamic loss scaling stands (Keras' `dynamic_scale` and `step_counter` variables).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LossScale {
    /// The factor the loss is multiplied by.
    pub(crate) scale: f32,
    /// Finite steps in a row since the scale last changed.
    pub(crate) counter: u64,
}

/// An optimizer with its state: slots per layer and weight, the iteration count, the loss
/// scale, and the learning rate when a callback set it.
#[derive(Debug)]
pub(crate) struct OptimizerState {
    pub(crate) config: Optimizer,
    slots: Vec<Vec<Slots>>,
    /// Completed steps (Keras' `optimizer.iterations`; steps that loss scaling skipped are not
    /// counted).
    pub(crate) iterations: u64,
    /// The loss scale, under a [`LossScaleOptimizer`].
    pub(crate) loss_scale: Option<LossScale>,
    /// The constant learning rate (Keras' `learning_rate` variable, which callbacks assign);
    /// unused under a schedule.
    learning_rate: f32,
}

impl OptimizerState {
    pub(crate) fn new(config: Optimizer, layers: usize) -> OptimizerState {
        OptimizerState {
            slots: (0..layers).map(|_| Vec::new()).collect(),
            iterations: 0,
            loss_scale: config.loss_scaling().map(|l| LossScale {
                scale: l.initial_scale,
                counter: 0,
            }),
            learning_rate: config.constant_learning_rate(),
            config,
        }
    }

    /// The learning rate of the next step: the schedule's value at `iterations`, or the
    /// constant rate (Keras' `optimizer.learning_rate`).
    pub(crate) fn learning_rate(&self) -> f32 {
        match &self.config.options().schedule {
            Some(s) => s.value(self.iterations),
            None => self.learning_rate,
        }
    }

    /// Sets the constant learning rate (`optimizer.learning_rate = lr`).
    ///
    /// # Errors
    /// Under a schedule (Keras' `TypeError`), or a rate that is not a finite number >= 0.
    pub(crate) fn set_learning_rate(&mut self, lr: f32) -> Result<()> {
        if self.config.options().schedule.is_some() {
            return Err(Error::InvalidArgument(format!(
                "{}: This optimizer was created with a `LearningRateSchedule` object as its \
                 `learning_rate` constructor argument, hence its learning rate is not settable. \
                 If you need the learning rate to be settable, you should instantiate the \
                 optimizer with a float `learning_rate` argument.",
                self.config.base().name()
            )));
        }
        if !lr.is_finite() || lr < 0.0 {
            return Err(Error::InvalidArgument(format!(
                "{}: learning_rate must be a finite number >= 0, got {lr}",
                self.config.base().name()
            )));
        }
        self.learning_rate = lr;
        Ok(())
    }

    /// The factor the next step multiplies its loss by: the loss scale, or 1.
    pub(crate) fn loss_factor(&self) -> f32 {
        self.loss_scale.map_or(1.0, |l| l.scale)
    }

    /// The gradients the update applies: without loss scaling, `grads` as they are; under it,
    /// `grads` divided by the scale (new tensors, so an allocation: call before any weight
    /// changes), or `None` when some element is not finite and the step is skipped. One kernel
    /// per gradient unscales and checks; one flag per device is read.
    ///
    /// # Errors
    /// Device errors, out of memory.
    pub(crate) fn unscaled(&self, grads: &[Vec<Tensor>]) -> Result<Option<Vec<Vec<Tensor>>>> {
        let Some(ls) = self.loss_scale else {
            return Ok(Some(grads.to_vec()));
        };
        // Keras divides by the scale; for a power of two multiplying by its inverse is exact.
        let inverse = 1.0 / ls.scale;
        let lens: Vec<usize> = grads.iter().map(Vec::len).collect();
        let flat: Vec<Tensor> = grads.iter().flatten().cloned().collect();
        let (unscaled, finite) = ops::unscale_checked(&flat, inverse)?;
        if !finite {
            return Ok(None);
        }
        let mut rest = unscaled.into_iter();
        Ok(Some(
            lens.iter()
                .map(|&n| rest.by_ref().take(n).collect())
                .collect(),
        ))
    }

    /// Every gradient of one copy of the model (all its layers' gradients, in any grouping),
    /// clipped as the optimizer's `clipnorm`, `global_clipnorm` or `clipvalue` asks (Keras'
    /// `_clip_gradients`): new tensors, so call before any weight changes. The norms are sums
    /// of squares on each gradient's device (the global one summed on the first gradient's
    /// device and read there by every clip kernel): nothing waits for a device.
    ///
    /// # Errors
    /// Device errors, out of memory.
    pub(crate) fn clipped(&self, grads: &[Vec<Tensor>]) -> Result<Vec<Vec<Tensor>>> {
        let Some(mode) = self.config.options().clip() else {
            return Ok(grads.to_vec());
        };
        let sum_squares = |g: &Tensor| -> Result<Tensor> {
            let _scope = g.device_handle().scope();
            g.mul(g)?.reduce_sum(None)
        };
        let global = match mode {
            ClipMode::GlobalNorm(_) => {
                let sums = grads
                    .iter()
                    .flatten()
                    .map(&sum_squares)
                    .collect::<Result<Vec<_>>>()?;
                match sums.first() {
                    Some(first) => {
                        let _scope = first.device_handle().scope();
                        let refs: Vec<&Tensor> = sums.iter().collect();
                        Some(Tensor::add_n(&refs)?)
                    }
                    None => None,
                }
            }
            _ => None,
        };
        grads
            .iter()
            .map(|layer| {
                layer
                    .iter()
                    .map(|g| match mode {
                        ClipMode::Norm(_) => {
                            ops::clip_gradient(g, Some(&sum_squares(g)?.reshape(&[1])?), mode)
                        }
                        ClipMode::GlobalNorm(_) => {
                            let total = global.as_ref().map(|t| t.reshape(&[1])).transpose()?;
                            ops::clip_gradient(g, total.as_ref(), mode)
                        }
                        ClipMode::Value(_) => ops::clip_gradient(g, None, mode),
                    })
                    .collect()
            })
            .collect()
    }

    /// Updates the weights of layer `layer` in place with their gradients, on each weight's
    /// device: the weight decay first (Keras' `_apply_weight_decay`), then the optimizer's
    /// step, both at the step's learning rate. Call once per layer per step, then
    /// [`OptimizerState::finish_step`].
    pub(crate) fn apply(
        &mut self,
        layer: usize,
        weights: &[&Tensor],
        grads: &[Tensor],
    ) -> Result<()> {
        if weights.len() != grads.len() {
            return Err(Error::Model(format!(
                "optimizer: {} gradients for {} weights",
                grads.len(),
                weights.len()
            )));
        }
        self.ensure_slots(layer, weights)?;
        let lr = self.learning_rate();
        let step = u32::try_from(self.iterations + 1).unwrap_or(u32::MAX);
        let base = self.config.base();
        let decay = base.options().weight_decay;
        for ((w, g), slot) in weights.iter().zip(grads).zip(self.slots[layer].iter()) {
            let _scope = w.device_handle().scope();
            if let Some(wd) = decay {
                ops::weight_decay_update(w, wd, lr)?;
            }
            let adam = |a: &Adam| AdamParams {
                lr,
                beta1: a.beta_1,
                beta2: a.beta_2,
                epsilon: a.epsilon,
                step,
            };
            match (base, slot) {
                (Optimizer::Sgd(s), slot) => {
                    let p = SgdParams {
                        lr,
                        momentum: s.momentum,
                        nesterov: s.nesterov,
                    };
                    let velocity = match slot {
                        Slots::Velocity(v) => Some(v),
                        _ => None,
                    };
                    ops::sgd_update(w, g, velocity, &p)?;
                }
                (Optimizer::Adam(a), Slots::Moments(m, v)) => {
                    ops::adam_update(w, g, m, v, &adam(a))?;
                }
                (Optimizer::AdamW(a), Slots::Moments(m, v)) => {
                    ops::adam_update(w, g, m, v, &adam(&a.adam()))?;
                }
                (
                    Optimizer::RmsProp(r),
                    Slots::Rms {
                        velocity,
                        momentum,
                        average,
                    },
                ) => {
                    let p = RmspropParams {
                        lr,
                        rho: r.rho,
                        momentum: r.momentum,
                        epsilon: r.epsilon,
                        centered: r.centered,
                    };
                    ops::rmsprop_update(w, g, velocity, average.as_ref(), momentum.as_ref(), &p)?;
                }
                (Optimizer::LossScale(_), _) => {
                    return Err(Error::Model("optimizer: nested loss scaling".into()))
                }
                (other, _) => {
                    return Err(Error::Model(format!(
                        "optimizer: {} slots missing",
                        other.name()
                    )))
                }
            }
        }
        Ok(())
    }

    /// Creates the slots of layer `layer` (zeros on each weight's device) unless they exist:
    /// the only allocation of an update, so a caller can make it before touching any weight.
    pub(crate) fn ensure_slots(&mut self, layer: usize, weights: &[&Tensor]) -> Result<()> {
        if self.slots.len() <= layer {
            self.slots.resize_with(layer + 1, Vec::new);
        }
        let slots = &mut self.slots[layer];
        if slots.len() != weights.len() {
            *slots = weights
                .iter()
                .map(|w| new_slots(&self.config, w))
                .collect::<Result<_>>()?;
        }
        Ok(())
    }

    /// The slot tensors of layer `layer`, in a fixed order.
    pub(crate) fn slot_tensors(&self, layer: usize) -> Vec<&Tensor> {
        self.named_slots(layer)
            .into_iter()
            .map(|(_, _, t)| t)
            .collect()
    }

    /// The slot tensors of layer `layer` with their weight's index and Keras 3's slot name:
    /// `momentum` (SGD's velocity, Adam's first moment, RMSprop's momentum), `velocity`
    /// (Adam's second moment, RMSprop's squared-gradient average), `average_gradient`
    /// (centered RMSprop).
    pub(crate) fn named_slots(&self, layer: usize) -> Vec<(usize, &'static str, &Tensor)> {
        let Some(slots) = self.slots.get(layer) else {
            return Vec::new();
        };
        slots
            .iter()
            .enumerate()
            .flat_map(|(w, s)| s.named().into_iter().map(move |(n, t)| (w, n, t)))
            .collect()
    }

    /// Ends a step: counts it when it `applied` its update, and moves the loss scale by
    /// Keras' rules (halved after a skipped step; doubled after `dynamic_growth_steps` applied
    /// ones in a row).
    pub(crate) fn finish_step(&mut self, applied: bool) {
        if applied {
            self.iterations += 1;
        }
        let growth = self
            .config
            .loss_scaling()
            .map_or(u64::MAX, |l| l.dynamic_growth_steps);
        if let Some(ls) = self.loss_scale.as_mut() {
            if !applied {
                ls.scale *= 0.5;
                ls.counter = 0;
            } else if ls.counter + 1 >= growth {
                ls.scale *= 2.0;
                ls.counter = 0;
            } else {
                ls.counter += 1;
            }
        }
    }
}

/// The slot names of each weight under `config`, in [`OptimizerState::named_slots`] order.
pub(crate) fn slot_names(config: &Optimizer) -> &'static [&'static str] {
    match config.base() {
        Optimizer::Sgd(s) if s.momentum != 0.0 => &["momentum"],
        Optimizer::Sgd(_) => &[],
        Optimizer::Adam(_) | Optimizer::AdamW(_) | Optimizer::LossScale(_) => {
            &["momentum", "velocity"]
        }
        Optimizer::RmsProp(r) => match (r.momentum > 0.0, r.centered) {
            (false, false) => &["velocity"],
            (true, false) => &["velocity", "momentum"],
            (false, true) => &["velocity", "average_gradient"],
            (true, true) => &["velocity", "momentum", "average_gradient"],
        },
    }
}

fn new_slots(config: &Optimizer, w: &Tensor) -> Result<Slots> {
    let zeros = || Tensor::zeros_on(w.shape(), DType::F32, w.device_handle());
    Ok(match config.base() {
        Optimizer::Sgd(s) if s.momentum != 0.0 => Slots::Velocity(zeros()?),
        Optimizer::Sgd(_) => Slots::None,
        Optimizer::Adam(_) | Optimizer::AdamW(_) | Optimizer::LossScale(_) => {
            Slots::Moments(zeros()?, zeros()?)
        }
        Optimizer::RmsProp(r) => Slots::Rms {
            velocity: zeros()?,
            momentum: (r.momentum > 0.0).then(zeros).transpose()?,
            average: r.centered.then(zeros).transpose()?,
        },
    })
}
