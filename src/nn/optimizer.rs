//! Optimizers (`keras.optimizers.SGD`, `keras.optimizers.Adam`) and their per-weight state.
//!
//! Each weight's slots (SGD's velocity, Adam's moments) are created on the weight's device the
//! first time it is updated, and the update runs there: a model split over devices keeps every
//! weight and its optimizer state on the device of its layer.

use std::fmt;

use crate::error::{Error, Result};
use crate::ops;
use crate::ops::spec::{AdamParams, SgdParams};
use crate::tensor::{DType, Tensor};

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
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sgd {
    /// `learning_rate`.
    pub learning_rate: f32,
    /// `momentum` (0 = plain SGD, no velocity slot).
    pub momentum: f32,
    /// `nesterov`.
    pub nesterov: bool,
}

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
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adam {
    /// `learning_rate`.
    pub learning_rate: f32,
    /// `beta_1`, the first moment's decay.
    pub beta_1: f32,
    /// `beta_2`, the second moment's decay.
    pub beta_2: f32,
    /// `epsilon`, added outside the square root as in Keras.
    pub epsilon: f32,
}

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
        }
    }
}

/// Dynamic loss scaling around another optimizer (`keras.optimizers.LossScaleOptimizer`),
/// Keras' rules and defaults: the loss is multiplied by the scale (initially `2^15`) before
/// the backward pass, so that small float16 gradients do not flush to zero; the gradients are
/// divided by it before the inner optimizer's update. A step whose gradients hold an infinity
/// or a NaN updates nothing (the inner optimizer's `iterations` do not count it) and halves the
/// scale; after `dynamic_growth_steps` finite steps in a row the scale doubles. Keras puts no
/// floor under the scale, and neither do we.
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
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScaleOptimizer {
    inner: Base,
    /// `initial_scale`: the first step's scale.
    pub initial_scale: f32,
    /// `dynamic_growth_steps`: finite steps in a row before the scale doubles.
    pub dynamic_growth_steps: u64,
}

/// The optimizers a [`LossScaleOptimizer`] can wrap.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Base {
    Sgd(Sgd),
    Adam(Adam),
}

impl LossScaleOptimizer {
    /// Wraps `inner` with Keras' defaults (`initial_scale=2**15, dynamic_growth_steps=2000`).
    /// Wrapping a `LossScaleOptimizer` again wraps its inner optimizer.
    pub fn new(inner: impl Into<Optimizer>) -> LossScaleOptimizer {
        let inner = match inner.into() {
            Optimizer::Sgd(s) => Base::Sgd(s),
            Optimizer::Adam(a) => Base::Adam(a),
            Optimizer::LossScale(l) => l.inner,
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
    pub fn inner(&self) -> Optimizer {
        match self.inner {
            Base::Sgd(s) => Optimizer::Sgd(s),
            Base::Adam(a) => Optimizer::Adam(a),
        }
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
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    /// [`Sgd`].
    Sgd(Sgd),
    /// [`Adam`].
    Adam(Adam),
    /// [`LossScaleOptimizer`] around SGD or Adam.
    LossScale(LossScaleOptimizer),
}

impl Optimizer {
    /// Keras' class name: `SGD`, `Adam`, `LossScaleOptimizer`.
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd(_) => "SGD",
            Optimizer::Adam(_) => "Adam",
            Optimizer::LossScale(_) => "LossScaleOptimizer",
        }
    }

    /// The learning rate (the inner optimizer's, under loss scaling).
    pub fn learning_rate(&self) -> f32 {
        match self {
            Optimizer::Sgd(s) => s.learning_rate,
            Optimizer::Adam(a) => a.learning_rate,
            Optimizer::LossScale(l) => l.inner().learning_rate(),
        }
    }

    /// The optimizer that updates the weights: this one, or the one loss scaling wraps.
    pub(crate) fn base(&self) -> Optimizer {
        match self {
            Optimizer::LossScale(l) => l.inner(),
            other => *other,
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
        let bad = |what: &str, v: f32| {
            Err(Error::InvalidArgument(format!(
                "{}: {what} must be {}, got {v}",
                self.name(),
                if what == "learning_rate" {
                    "a finite number >= 0"
                } else {
                    "in [0, 1)"
                }
            )))
        };
        let lr = self.learning_rate();
        if !lr.is_finite() || lr < 0.0 {
            return bad("learning_rate", lr);
        }
        let unit = |v: f32| (0.0..1.0).contains(&v);
        match self {
            Optimizer::Sgd(s) if !unit(s.momentum) => bad("momentum", s.momentum),
            Optimizer::Adam(a) if !unit(a.beta_1) => bad("beta_1", a.beta_1),
            Optimizer::Adam(a) if !unit(a.beta_2) => bad("beta_2", a.beta_2),
            Optimizer::Adam(a) if !(a.epsilon.is_finite() && a.epsilon > 0.0) => Err(
                Error::InvalidArgument(format!("Adam: epsilon must be > 0, got {}", a.epsilon)),
            ),
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
                "SGD(learning_rate={}, momentum={}, nesterov={})",
                s.learning_rate, s.momentum, s.nesterov
            ),
            Optimizer::Adam(a) => write!(
                f,
                "Adam(learning_rate={}, beta_1={}, beta_2={}, epsilon={})",
                a.learning_rate, a.beta_1, a.beta_2, a.epsilon
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
}

/// Where dynamic loss scaling stands (Keras' `dynamic_scale` and `step_counter` variables).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LossScale {
    /// The factor the loss is multiplied by.
    pub(crate) scale: f32,
    /// Finite steps in a row since the scale last changed.
    pub(crate) counter: u64,
}

/// An optimizer with its state: slots per layer and weight, the iteration count, and the loss
/// scale.
#[derive(Debug)]
pub(crate) struct OptimizerState {
    pub(crate) config: Optimizer,
    slots: Vec<Vec<Slots>>,
    /// Completed steps (Keras' `optimizer.iterations`; steps that loss scaling skipped are not
    /// counted).
    pub(crate) iterations: u64,
    /// The loss scale, under a [`LossScaleOptimizer`].
    pub(crate) loss_scale: Option<LossScale>,
}

impl OptimizerState {
    pub(crate) fn new(config: Optimizer, layers: usize) -> OptimizerState {
        OptimizerState {
            config,
            slots: (0..layers).map(|_| Vec::new()).collect(),
            iterations: 0,
            loss_scale: config.loss_scaling().map(|l| LossScale {
                scale: l.initial_scale,
                counter: 0,
            }),
        }
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

    /// Updates the weights of layer `layer` in place with their gradients, on each weight's
    /// device. Call once per layer per step, then [`OptimizerState::finish_step`].
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
        for ((w, g), slot) in weights.iter().zip(grads).zip(self.slots[layer].iter()) {
            let _scope = w.device_handle().scope();
            match (&self.config.base(), slot) {
                (Optimizer::Sgd(s), slot) => {
                    let p = SgdParams {
                        lr: s.learning_rate,
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
                    let p = AdamParams {
                        lr: a.learning_rate,
                        beta1: a.beta_1,
                        beta2: a.beta_2,
                        epsilon: a.epsilon,
                        step: u32::try_from(self.iterations + 1).unwrap_or(u32::MAX),
                    };
                    ops::adam_update(w, g, m, v, &p)?;
                }
                (Optimizer::Adam(_), _) => {
                    return Err(Error::Model("optimizer: Adam slots missing".into()))
                }
                (Optimizer::LossScale(_), _) => {
                    return Err(Error::Model("optimizer: nested loss scaling".into()))
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

    /// The slot tensors of layer `layer` (velocities, or Adam's moments), in a fixed order.
    pub(crate) fn slot_tensors(&self, layer: usize) -> Vec<&Tensor> {
        let Some(slots) = self.slots.get(layer) else {
            return Vec::new();
        };
        slots
            .iter()
            .flat_map(|s| match s {
                Slots::None => vec![],
                Slots::Velocity(v) => vec![v],
                Slots::Moments(m, v) => vec![m, v],
            })
            .collect()
    }

    /// The slot tensors of layer `layer` with their weight's index and Keras 3's slot name:
    /// `momentum` (SGD's velocity, Adam's first moment) and `velocity` (Adam's second moment).
    pub(crate) fn named_slots(&self, layer: usize) -> Vec<(usize, &'static str, &Tensor)> {
        let Some(slots) = self.slots.get(layer) else {
            return Vec::new();
        };
        slots
            .iter()
            .enumerate()
            .flat_map(|(w, s)| match s {
                Slots::None => vec![],
                Slots::Velocity(v) => vec![(w, "momentum", v)],
                Slots::Moments(m, v) => vec![(w, "momentum", m), (w, "velocity", v)],
            })
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
        Optimizer::Adam(_) | Optimizer::LossScale(_) => &["momentum", "velocity"],
    }
}

fn new_slots(config: &Optimizer, w: &Tensor) -> Result<Slots> {
    let zeros = || Tensor::zeros_on(w.shape(), DType::F32, w.device_handle());
    Ok(match config.base() {
        Optimizer::Sgd(s) if s.momentum != 0.0 => Slots::Velocity(zeros()?),
        Optimizer::Sgd(_) => Slots::None,
        Optimizer::Adam(_) | Optimizer::LossScale(_) => Slots::Moments(zeros()?, zeros()?),
    })
}
