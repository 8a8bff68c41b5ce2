//! Keras 3's optimizer objects and their options: [`BaseOptions`] (schedule, weight decay,
//! clipping), [`Sgd`], [`Adam`], [`AdamW`], [`RmsProp`] and [`LossScaleOptimizer`].

use crate::error::{Error, Result};
use crate::nn::schedules::LearningRateSchedule;
use crate::ops::spec::ClipMode;

use super::Optimizer;

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

    pub(super) fn validate(&self, name: &str) -> Result<()> {
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

    /// `learning_rate` as the optimizer shows it: the schedule when there is one, else the
    /// constant `rate`.
    pub(super) fn shown_rate(&self, rate: f32) -> String {
        match &self.schedule {
            Some(s) => s.to_string(),
            None => rate.to_string(),
        }
    }

    /// The options after the hyper-parameters in `Display`, only those set, as `, name=value`.
    pub(super) fn describe(&self) -> String {
        let mut out = String::new();
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
    pub(super) fn adam(&self) -> Adam {
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
/// doubles. Unlike Keras, the scale stays a normal float: it does not double past the largest
/// one (Keras' would become infinite, every step would be skipped and the scale stay infinite)
/// nor halve below the smallest (Keras' would go through subnormals to zero, where no gradient
/// is left).
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
    pub(super) inner: Box<Optimizer>,
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
