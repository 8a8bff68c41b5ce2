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
//!
//! The optimizer objects in `options.rs`, the per-weight state and the update in `state.rs`;
//! [`Optimizer`], the one a model is compiled with, here.

use std::fmt;

use crate::error::{Error, Result};

// ---- loss scaling on the device ----
mod device_scale;
mod options;
mod state;
pub use options::{Adam, AdamW, BaseOptions, LossScaleOptimizer, RmsProp, Sgd};
pub(crate) use state::{slot_names, LossScale, OptimizerState};

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
            // Keras' own range, 1 included (a momentum that never decays).
            Optimizer::Sgd(s) if !(0.0..=1.0).contains(&s.momentum) => {
                Err(Error::InvalidArgument(format!(
                    "SGD: `momentum` must be a float between [0, 1]. Received: momentum={}",
                    s.momentum
                )))
            }
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

/// As Keras lists an optimizer's config: `SGD(learning_rate=0.01, momentum=0,
/// nesterov=false)`, then the options that are set; a schedule shows in place of the rate.
///
/// ```
/// use anygpu::nn::{ExponentialDecay, Optimizer, Sgd};
/// let sgd: Optimizer = Sgd::new(0.01).into();
/// assert_eq!(sgd.to_string(), "SGD(learning_rate=0.01, momentum=0, nesterov=false)");
/// let decayed: Optimizer = Sgd::new(0.01)
///     .learning_rate_schedule(ExponentialDecay::new(0.1, 100, 0.9))
///     .into();
/// assert_eq!(
///     decayed.to_string(),
///     "SGD(learning_rate=ExponentialDecay(initial_learning_rate=0.1, decay_steps=100, \
///      decay_rate=0.9, staircase=false), momentum=0, nesterov=false)"
/// );
/// ```
impl fmt::Display for Optimizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Optimizer::Sgd(s) => write!(
                f,
                "SGD(learning_rate={}, momentum={}, nesterov={}{})",
                s.options.shown_rate(s.learning_rate),
                s.momentum,
                s.nesterov,
                s.options.describe()
            ),
            Optimizer::Adam(a) => write!(
                f,
                "Adam(learning_rate={}, beta_1={}, beta_2={}, epsilon={}{})",
                a.options.shown_rate(a.learning_rate),
                a.beta_1,
                a.beta_2,
                a.epsilon,
                a.options.describe()
            ),
            Optimizer::AdamW(a) => write!(
                f,
                "AdamW(learning_rate={}, beta_1={}, beta_2={}, epsilon={}{})",
                a.options.shown_rate(a.learning_rate),
                a.beta_1,
                a.beta_2,
                a.epsilon,
                a.options.describe()
            ),
            Optimizer::RmsProp(r) => write!(
                f,
                "RMSprop(learning_rate={}, rho={}, momentum={}, epsilon={}, centered={}{})",
                r.options.shown_rate(r.learning_rate),
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
