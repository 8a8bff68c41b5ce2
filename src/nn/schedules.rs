//! Learning-rate schedules (`keras.optimizers.schedules`): `ExponentialDecay`,
//! `PiecewiseConstantDecay`, `CosineDecay`.
//!
//! An optimizer built with one ([`Sgd::learning_rate_schedule`](crate::nn::Sgd::learning_rate_schedule)
//! and the same on every optimizer) evaluates it at `optimizer.iterations`, the count of applied
//! steps (a step that loss scaling skipped does not count), before each update. Values are
//! computed in float32 in Keras' order of operations; the hyper-parameters are kept as Keras
//! keeps them (Python floats, so `f64`) and rounded where Keras rounds them.

use std::fmt;

use crate::error::{Error, Result};

/// `keras.optimizers.schedules.ExponentialDecay`:
/// `initial_learning_rate * decay_rate ^ (step / decay_steps)`, the exponent floored with
/// `staircase`.
///
/// ```
/// use anygpu::nn::ExponentialDecay;
/// let s = ExponentialDecay::new(0.1, 10, 0.5);
/// assert_eq!(s.value(0), 0.1);
/// assert!((s.value(10) - 0.05).abs() < 1e-8);
/// assert_eq!(s.staircase(true).value(9), 0.1);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ExponentialDecay {
    /// `initial_learning_rate`.
    pub initial_learning_rate: f64,
    /// `decay_steps` (> 0).
    pub decay_steps: u64,
    /// `decay_rate`.
    pub decay_rate: f64,
    /// `staircase`: decay at whole multiples of `decay_steps` only.
    pub staircase: bool,
}

impl ExponentialDecay {
    /// Keras' `ExponentialDecay(initial_learning_rate, decay_steps, decay_rate)`.
    pub fn new(initial_learning_rate: f64, decay_steps: u64, decay_rate: f64) -> ExponentialDecay {
        ExponentialDecay {
            initial_learning_rate,
            decay_steps,
            decay_rate,
            staircase: false,
        }
    }

    /// `staircase=`.
    pub fn staircase(mut self, staircase: bool) -> ExponentialDecay {
        self.staircase = staircase;
        self
    }

    /// The learning rate at `step`.
    pub fn value(&self, step: u64) -> f32 {
        let mut p = step as f32 / self.decay_steps as f32;
        if self.staircase {
            p = p.floor();
        }
        self.initial_learning_rate as f32 * (self.decay_rate as f32).powf(p)
    }
}

/// `keras.optimizers.schedules.PiecewiseConstantDecay`: `values[0]` while
/// `step <= boundaries[0]`, `values[i]` for `boundaries[i-1] < step <= boundaries[i]`, and the
/// last value after the last boundary.
///
/// ```
/// use anygpu::nn::PiecewiseConstantDecay;
/// let s = PiecewiseConstantDecay::new(vec![10, 20], vec![1.0, 0.5, 0.1]);
/// assert_eq!([s.value(10), s.value(11), s.value(20), s.value(21)], [1.0, 0.5, 0.5, 0.1]);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct PiecewiseConstantDecay {
    /// `boundaries`, increasing steps.
    pub boundaries: Vec<u64>,
    /// `values`, one more than the boundaries.
    pub values: Vec<f64>,
}

impl PiecewiseConstantDecay {
    /// Keras' `PiecewiseConstantDecay(boundaries, values)`.
    pub fn new(boundaries: Vec<u64>, values: Vec<f64>) -> PiecewiseConstantDecay {
        PiecewiseConstantDecay { boundaries, values }
    }

    /// The learning rate at `step`.
    pub fn value(&self, step: u64) -> f32 {
        let i = self.boundaries.iter().take_while(|&&b| step > b).count();
        self.values.get(i).map_or(f32::NAN, |&v| v as f32)
    }
}

/// `keras.optimizers.schedules.CosineDecay`: with no warm-up,
/// `initial_learning_rate * ((1 - alpha) * 0.5 * (1 + cos(pi * min(step, decay_steps) /
/// decay_steps)) + alpha)`. With `warmup_target`, a linear warm-up from
/// `initial_learning_rate` to `warmup_target` over `warmup_steps` steps, then the cosine decay
/// from `warmup_target` over the next `decay_steps`.
///
/// ```
/// use anygpu::nn::CosineDecay;
/// let s = CosineDecay::new(0.1, 100);
/// assert_eq!(s.value(0), 0.1);
/// assert!(s.value(100).abs() < 1e-9);
/// let warm = CosineDecay::new(0.0, 100).warmup(1.0, 10);
/// assert!((warm.value(5) - 0.5).abs() < 1e-7);
/// assert_eq!(warm.value(10), 1.0);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct CosineDecay {
    /// `initial_learning_rate`.
    pub initial_learning_rate: f64,
    /// `decay_steps` (> 0).
    pub decay_steps: u64,
    /// `alpha`: the floor, as a fraction of the rate decayed from.
    pub alpha: f64,
    /// `warmup_target`: the rate the warm-up ends at (`None`: no warm-up).
    pub warmup_target: Option<f64>,
    /// `warmup_steps`.
    pub warmup_steps: u64,
}

impl CosineDecay {
    /// Keras' `CosineDecay(initial_learning_rate, decay_steps)`, `alpha=0.0`, no warm-up.
    pub fn new(initial_learning_rate: f64, decay_steps: u64) -> CosineDecay {
        CosineDecay {
            initial_learning_rate,
            decay_steps,
            alpha: 0.0,
            warmup_target: None,
            warmup_steps: 0,
        }
    }

    /// `alpha=`.
    pub fn alpha(mut self, alpha: f64) -> CosineDecay {
        self.alpha = alpha;
        self
    }

    /// `warmup_target=, warmup_steps=`.
    pub fn warmup(mut self, warmup_target: f64, warmup_steps: u64) -> CosineDecay {
        self.warmup_target = Some(warmup_target);
        self.warmup_steps = warmup_steps;
        self
    }

    fn decay(&self, step: f32, decay_steps: f32, from: f32) -> f32 {
        let completed = step / decay_steps;
        let cosine = 0.5 * (1.0 + (std::f32::consts::PI * completed).cos());
        let decayed = (1.0 - self.alpha) as f32 * cosine + self.alpha as f32;
        from * decayed
    }

    /// The learning rate at `step`.
    pub fn value(&self, step: u64) -> f32 {
        let initial = self.initial_learning_rate as f32;
        let decay_steps = self.decay_steps as f32;
        let step = step as f32;
        let Some(target) = self.warmup_target else {
            return self.decay(step.min(decay_steps), decay_steps, initial);
        };
        let target = target as f32;
        let warmup_steps = self.warmup_steps as f32;
        let step = step.min(decay_steps + warmup_steps);
        if step < warmup_steps {
            (target - initial) * (step / warmup_steps) + initial
        } else {
            self.decay(step - warmup_steps, decay_steps, target)
        }
    }
}

/// A learning-rate schedule for an optimizer's `learning_rate`.
///
/// ```
/// use anygpu::nn::{ExponentialDecay, LearningRateSchedule};
/// let s: LearningRateSchedule = ExponentialDecay::new(0.1, 10, 0.5).into();
/// assert_eq!(s.value(0), 0.1);
/// assert_eq!(s.name(), "ExponentialDecay");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum LearningRateSchedule {
    /// [`ExponentialDecay`].
    ExponentialDecay(ExponentialDecay),
    /// [`PiecewiseConstantDecay`].
    PiecewiseConstantDecay(PiecewiseConstantDecay),
    /// [`CosineDecay`].
    CosineDecay(CosineDecay),
}

impl LearningRateSchedule {
    /// The learning rate at `step` (Keras' `schedule(step)`), in float32.
    pub fn value(&self, step: u64) -> f32 {
        match self {
            LearningRateSchedule::ExponentialDecay(s) => s.value(step),
            LearningRateSchedule::PiecewiseConstantDecay(s) => s.value(step),
            LearningRateSchedule::CosineDecay(s) => s.value(step),
        }
    }

    /// Keras' class name.
    pub fn name(&self) -> &'static str {
        match self {
            LearningRateSchedule::ExponentialDecay(_) => "ExponentialDecay",
            LearningRateSchedule::PiecewiseConstantDecay(_) => "PiecewiseConstantDecay",
            LearningRateSchedule::CosineDecay(_) => "CosineDecay",
        }
    }

    /// Keras' `ValueError`s of the constructors.
    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::InvalidArgument(format!("{}: {msg}", self.name())));
        match self {
            LearningRateSchedule::ExponentialDecay(ExponentialDecay { decay_steps: 0, .. })
            | LearningRateSchedule::CosineDecay(CosineDecay { decay_steps: 0, .. }) => {
                bad("Argument `decay_steps` must be > 0. Received: decay_steps=0".into())
            }
            LearningRateSchedule::PiecewiseConstantDecay(p)
                if p.boundaries.len() + 1 != p.values.len() =>
            {
                bad(format!(
                    "The length of boundaries should be 1 less than the length of values. \
                     Received: boundaries={:?} of length {}, and values={:?} of length {}.",
                    p.boundaries,
                    p.boundaries.len(),
                    p.values,
                    p.values.len()
                ))
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for LearningRateSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LearningRateSchedule::ExponentialDecay(s) => write!(
                f,
                "ExponentialDecay(initial_learning_rate={}, decay_steps={}, decay_rate={}, \
                 staircase={})",
                s.initial_learning_rate, s.decay_steps, s.decay_rate, s.staircase
            ),
            LearningRateSchedule::PiecewiseConstantDecay(s) => write!(
                f,
                "PiecewiseConstantDecay(boundaries={:?}, values={:?})",
                s.boundaries, s.values
            ),
            LearningRateSchedule::CosineDecay(s) => write!(
                f,
                "CosineDecay(initial_learning_rate={}, decay_steps={}, alpha={}, \
                 warmup_target={}, warmup_steps={})",
                s.initial_learning_rate,
                s.decay_steps,
                s.alpha,
                s.warmup_target
                    .map_or("None".to_string(), |t| t.to_string()),
                s.warmup_steps
            ),
        }
    }
}

impl From<ExponentialDecay> for LearningRateSchedule {
    fn from(s: ExponentialDecay) -> Self {
        LearningRateSchedule::ExponentialDecay(s)
    }
}

impl From<PiecewiseConstantDecay> for LearningRateSchedule {
    fn from(s: PiecewiseConstantDecay) -> Self {
        LearningRateSchedule::PiecewiseConstantDecay(s)
    }
}

impl From<CosineDecay> for LearningRateSchedule {
    fn from(s: CosineDecay) -> Self {
        LearningRateSchedule::CosineDecay(s)
    }
}
