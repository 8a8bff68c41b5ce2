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
}

impl Optimizer {
    /// Keras' class name: `SGD`, `Adam`.
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd(_) => "SGD",
            Optimizer::Adam(_) => "Adam",
        }
    }

    /// The learning rate.
    pub fn learning_rate(&self) -> f32 {
        match self {
            Optimizer::Sgd(s) => s.learning_rate,
            Optimizer::Adam(a) => a.learning_rate,
        }
    }

    /// Checks the hyper-parameters (Keras raises `ValueError` on the same).
    pub(crate) fn validate(&self) -> Result<()> {
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

/// An optimizer with its state: slots per layer and weight, and the iteration count.
#[derive(Debug)]
pub(crate) struct OptimizerState {
    pub(crate) config: Optimizer,
    slots: Vec<Vec<Slots>>,
    /// Completed steps (Keras' `optimizer.iterations`).
    pub(crate) iterations: u64,
}

impl OptimizerState {
    pub(crate) fn new(config: Optimizer, layers: usize) -> OptimizerState {
        OptimizerState {
            config,
            slots: (0..layers).map(|_| Vec::new()).collect(),
            iterations: 0,
        }
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
            match (&self.config, slot) {
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

    /// Counts a finished step.
    pub(crate) fn finish_step(&mut self) {
        self.iterations += 1;
    }
}

/// The slot names of each weight under `config`, in [`OptimizerState::named_slots`] order.
pub(crate) fn slot_names(config: &Optimizer) -> &'static [&'static str] {
    match config {
        Optimizer::Sgd(s) if s.momentum != 0.0 => &["momentum"],
        Optimizer::Sgd(_) => &[],
        Optimizer::Adam(_) => &["momentum", "velocity"],
    }
}

fn new_slots(config: &Optimizer, w: &Tensor) -> Result<Slots> {
    let zeros = || Tensor::zeros_on(w.shape(), DType::F32, w.device_handle());
    Ok(match config {
        Optimizer::Sgd(s) if s.momentum != 0.0 => Slots::Velocity(zeros()?),
        Optimizer::Sgd(_) => Slots::None,
        Optimizer::Adam(_) => Slots::Moments(zeros()?, zeros()?),
    })
}
