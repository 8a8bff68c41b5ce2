//! Each weight's optimizer state: its slots (SGD's velocity, Adam's moments, RMSprop's
//! averages), created on the weight's device at its first update, the loss scale, and the update
//! step itself (unscaling, clipping, weight decay, the optimizer's kernel).

use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::ops;
use crate::ops::spec::{AdamParams, ClipMode, RmspropParams, SgdParams};
use crate::tensor::{DType, Tensor};

use super::device_scale::{DeviceScale, SCALED_RULES};
use super::{Adam, Optimizer};

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
    /// The tensors in a fused update's order: SGD `[velocity]`, Adam `[m, v]`, RMSprop
    /// `[velocity, average, momentum]`.
    fn in_update_order(&self) -> [Option<&Tensor>; 3] {
        match self {
            Slots::None => [None; 3],
            Slots::Velocity(v) => [Some(v), None, None],
            Slots::Moments(m, v) => [Some(m), Some(v), None],
            Slots::Rms {
                velocity,
                momentum,
                average,
            } => [Some(velocity), average.as_ref(), momentum.as_ref()],
        }
    }

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
    /// counted); while `device` holds the loss scale, as of when it took it.
    iterations: u64,
    /// The loss scale, under a [`LossScaleOptimizer`]; while `device` holds it, as of when it
    /// took it.
    loss_scale: Option<LossScale>,
    /// The loss scale and iteration count kept on the device, when the steps decide there.
    device: Option<DeviceScale>,
    /// Whether the host decides loss scaling even where the device could (the reference the
    /// device's decisions are tested against).
    pub(crate) host_decides: bool,
    /// The constant learning rate (Keras' `learning_rate` variable, which callbacks assign);
    /// unused under a schedule.
    learning_rate: f32,
    /// The fused update's table per device group (see [`ops::UpdateTable`]).
    tables: Vec<ops::UpdateTable>,
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
            tables: Vec::new(),
            device: None,
            host_decides: false,
            config,
        }
    }

    /// The learning rate of the next step: the schedule's value at `iterations`, or the
    /// constant rate (Keras' `optimizer.learning_rate`).
    pub(crate) fn learning_rate(&self) -> f32 {
        // Only a schedule needs the count (read from the device, waiting, under loss scaling
        // decided there).
        match &self.config.options().schedule {
            Some(s) => s.value(self.iterations()),
            None => self.learning_rate,
        }
    }

    /// The learning rate of a step after `iterations` applied ones.
    fn learning_rate_at(&self, iterations: u64) -> f32 {
        match &self.config.options().schedule {
            Some(s) => s.value(iterations),
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

    /// The factor the next step multiplies its loss by: the loss scale, or 1 (read from the
    /// device, waiting for it, while the device holds the scale).
    pub(crate) fn loss_factor(&self) -> f32 {
        self.loss_scale_state().map_or(1.0, |l| l.scale)
    }

    /// Completed steps (Keras' `optimizer.iterations`): read from the device, waiting for the
    /// steps recorded so far, while it holds the count and the host has not read them all.
    pub(crate) fn iterations(&self) -> u64 {
        self.synced().0
    }

    /// The loss scale and its counter (`None` without loss scaling); read as
    /// [`OptimizerState::iterations`] is.
    pub(crate) fn loss_scale_state(&self) -> Option<LossScale> {
        self.synced().1
    }

    /// The iteration count and loss scale as of the last step recorded. A device that fails
    /// to answer leaves the last values the host read (logged): reporting never fails a step;
    /// what must not be stale (a checkpoint) reads [`OptimizerState::training_state`].
    fn synced(&self) -> (u64, Option<LossScale>) {
        self.training_state().unwrap_or_else(|e| {
            log::warn!("LossScaleOptimizer: reading the loss scale failed ({e})");
            (self.iterations, self.loss_scale)
        })
    }

    /// The iteration count and loss scale as of the last step recorded, read from the device
    /// while it holds them (waiting for it).
    ///
    /// # Errors
    /// The device's, reading the state back.
    pub(crate) fn training_state(&self) -> Result<(u64, Option<LossScale>)> {
        let Some(d) = &self.device else {
            return Ok((self.iterations, self.loss_scale));
        };
        let k = d.read_now()?;
        Ok((k.iterations, Some(d.loss_scale(k))))
    }

    /// Puts back a checkpoint's iteration count and loss scale (on the host: the next step
    /// takes them to its device).
    pub(crate) fn set_training_state(&mut self, iterations: u64, loss_scale: Option<LossScale>) {
        self.device = None;
        self.iterations = iterations;
        self.loss_scale = loss_scale;
    }

    // ---- loss scaling on the device ----

    /// Whether steps may decide loss scaling on the device: under a [`LossScaleOptimizer`],
    /// unless the host was asked to.
    pub(crate) fn scales_on_device(&self) -> bool {
        !self.host_decides && self.loss_scale.is_some()
    }

    /// The loss factor of the next step as the device reads it: `(base, state)`, the gradient
    /// seed multiplied by `base * 2^e` with `e` the state's exponent. Moves the loss scale to
    /// `device` first if it is elsewhere (reading it back from another device waits).
    ///
    /// # Errors
    /// Device errors, out of memory.
    pub(crate) fn device_seed(&mut self, device: &LogicalDevice) -> Result<(f32, Tensor)> {
        let d = self.device_scale_on(device)?;
        Ok((d.base, d.state.clone()))
    }

    /// The device's loss scale on `device`, made from the host's if there is none there.
    fn device_scale_on(&mut self, device: &LogicalDevice) -> Result<&mut DeviceScale> {
        if self
            .device
            .as_ref()
            .is_some_and(|d| !d.device().same_device(device))
        {
            self.sync_to_host()?;
        }
        if self.device.is_none() {
            let Some(ls) = self.loss_scale else {
                return Err(Error::Model(
                    "LossScaleOptimizer: no loss scale to keep on the device".into(),
                ));
            };
            self.device = Some(DeviceScale::new(device, ls, self.iterations)?);
        }
        self.device
            .as_mut()
            .ok_or_else(|| Error::Model("LossScaleOptimizer: the device state is gone".into()))
    }

    /// Brings the loss scale and iteration count back to the host (waiting for the steps
    /// recorded so far): the host decides the next steps.
    ///
    /// # Errors
    /// Device errors (the state stays on the device).
    pub(crate) fn sync_to_host(&mut self) -> Result<()> {
        if let Some(d) = &self.device {
            let k = d.read_now()?;
            self.iterations = k.iterations;
            self.loss_scale = Some(d.loss_scale(k));
            self.device = None;
        }
        Ok(())
    }

    /// One optimizer step from every layer's gradients (`weights[i]` and `grads[i]` are layer
    /// `i`'s): under loss scaling the gradients are checked and unscaled first, and a step
    /// whose gradients are not all finite updates nothing and only moves the scale; then
    /// clipping, weight decay, the update, the count. With `on_device`, a model whose weights
    /// all lie on one device decides loss scaling there, and nothing waits; otherwise the host
    /// reads the finiteness flags.
    ///
    /// # Errors
    /// Device errors, out of memory: every weight is as it was unless a device fails
    /// mid-update.
    pub(crate) fn apply_step(
        &mut self,
        weights: &[Vec<&Tensor>],
        grads: &[Vec<Tensor>],
        on_device: bool,
    ) -> Result<()> {
        if on_device && self.scales_on_device() && self.apply_on_device(weights, grads)? {
            return Ok(());
        }
        self.sync_to_host()?;
        let Some(grads) = self.unscaled(grads)? else {
            self.finish_step(false);
            return Ok(());
        };
        // Clipped after unscaling and after the pipeline's per-layer sums, as Keras clips; by
        // value in the update where every weight is on a GPU (one dispatch fewer a gradient).
        let all_on_gpus = weights.iter().flatten().all(|w| on_gpu(w.device_handle()));
        let clip_value = self.clip_value().filter(|_| all_on_gpus);
        let grads = if clip_value.is_some() {
            grads
        } else {
            self.clipped(&grads)?
        };
        self.apply_all_clipped(weights, &grads, clip_value)?;
        self.finish_step(true);
        Ok(())
    }

    /// The step of [`OptimizerState::apply_step`] with loss scaling decided on the device:
    /// the check, the update (one dispatch each on a GPU) and Keras' rules, reading the
    /// device's state. Under clipping, each gradient is unscaled (and checked) on the device
    /// first and clipped as the host path clips it. `false` (nothing done) when the weights
    /// lie on several devices.
    fn apply_on_device(&mut self, weights: &[Vec<&Tensor>], grads: &[Vec<Tensor>]) -> Result<bool> {
        let moved = self.prepare(weights, grads, false)?;
        let home = {
            let groups = update_groups(&self.slots, &self.config, weights, &moved)?;
            match groups.as_slice() {
                [one] => one[0].w.device_handle().clone(),
                _ => return Ok(false),
            }
        };
        let growth = self
            .config
            .loss_scaling()
            .map_or(u64::MAX, |l| l.dynamic_growth_steps);
        let d = self.device_scale_on(&home)?;
        d.poll()?;
        d.read_until(SCALED_RULES - 1)?;
        let (known, unread) = d.known_iterations();
        let (state, inverse_base) = (d.state.clone(), d.inverse_base());
        let scale_rules = ops::ScaleRules::new(growth, d.base);
        // One rule per iteration count the device may be at when it runs this step.
        let rules = (0..=unread as u64)
            .map(|j| self.rule_at(known + j))
            .collect::<Result<Vec<_>>>()?;
        let decay = self.config.base().options().weight_decay;
        // A GPU's update clips each element by value as it reads it (after unscaling). Other
        // clipping takes the unscaled gradients: those are made first, each checked as it is
        // unscaled, and clipped as the host path clips them.
        let clip_value = self.clip_value().filter(|_| on_gpu(&home));
        let clip = self.config.options().clip().is_some() && clip_value.is_none();
        let grads = if clip {
            let unscaled = moved
                .iter()
                .map(|layer| {
                    layer
                        .iter()
                        .map(|g| ops::loss_scale_unscale(g, inverse_base, &state))
                        .collect::<Result<Vec<_>>>()
                })
                .collect::<Result<Vec<_>>>()?;
            // Clipped after unscaling, as Keras clips.
            self.clipped(&unscaled)?
        } else {
            moved
        };
        let groups = update_groups(&self.slots, &self.config, weights, &grads)?;
        self.tables.resize_with(1, ops::UpdateTable::default);
        if let (Some(vars), Some(table)) = (groups.first(), self.tables.first_mut()) {
            ops::fused_update_scaled(
                vars,
                (&rules, known),
                (decay, clip_value),
                table,
                (&state, inverse_base),
                clip,
            )?;
        }
        ops::loss_scale_advance(&state, scale_rules)?;
        if let Some(d) = self.device.as_mut() {
            d.recorded();
            d.snapshot()?;
        }
        Ok(true)
    }

    /// The gradients the update applies: without loss scaling, `grads` as they are; under it,
    /// `grads` divided by the scale (new tensors, so an allocation: call before any weight
    /// changes), or `None` when some element is not finite and the step is skipped. One kernel
    /// per gradient unscales and checks; one flag per device is read.
    ///
    /// # Errors
    /// Device errors, out of memory.
    pub(crate) fn unscaled(&self, grads: &[Vec<Tensor>]) -> Result<Option<Vec<Vec<Tensor>>>> {
        debug_assert!(
            self.device.is_none(),
            "the device holds the loss-scale state"
        );
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

    /// Updates every weight in place with its gradient (`weights[i]` and `grads[i]` are layer
    /// `i`'s): the weight decay first (Keras' `_apply_weight_decay`), then the optimizer's
    /// step, both at the step's learning rate, as one fused update per device (one dispatch
    /// on a GPU). Everything it allocates — the slots, gradients moved to their weight's
    /// device, the update tables — comes before the first weight changes, so an error leaves
    /// every weight as it was unless a device fails mid-update. Then call
    /// [`OptimizerState::finish_step`].
    pub(crate) fn apply_all(
        &mut self,
        weights: &[Vec<&Tensor>],
        grads: &[Vec<Tensor>],
    ) -> Result<()> {
        self.apply_all_clipped(weights, grads, None)
    }

    /// [`OptimizerState::apply_all`] with each gradient element clipped to
    /// `[-clip_value, clip_value]` in the fused update (Keras' `clipvalue`, exactly as
    /// [`OptimizerState::clipped`] clips it).
    fn apply_all_clipped(
        &mut self,
        weights: &[Vec<&Tensor>],
        grads: &[Vec<Tensor>],
        clip_value: Option<f32>,
    ) -> Result<()> {
        let moved = self.prepare_all(weights, grads)?;
        let rule = self.rule_at(self.iterations)?;
        let decay = self.config.base().options().weight_decay;
        let groups = update_groups(&self.slots, &self.config, weights, &moved)?;
        for (vars, table) in groups.iter().zip(self.tables.iter_mut()) {
            ops::fused_update_clipped(vars, rule, (decay, clip_value), table)?;
        }
        Ok(())
    }

    /// What [`OptimizerState::apply_all`] allocates, made now: the slots, the gradients on
    /// their weights' devices (returned), the update tables. A mirrored step calls it in its
    /// allocation phase so that its update phase allocates nothing.
    pub(crate) fn prepare_all(
        &mut self,
        weights: &[Vec<&Tensor>],
        grads: &[Vec<Tensor>],
    ) -> Result<Vec<Vec<Tensor>>> {
        self.prepare(weights, grads, true)
    }

    /// [`OptimizerState::prepare_all`], with the plain update's `tables` or without (the
    /// update that decides loss scaling on the device makes its own, for the gradients it
    /// takes: clipping makes them anew).
    fn prepare(
        &mut self,
        weights: &[Vec<&Tensor>],
        grads: &[Vec<Tensor>],
        tables: bool,
    ) -> Result<Vec<Vec<Tensor>>> {
        if weights.len() != grads.len() {
            return Err(Error::Model(format!(
                "optimizer: gradients of {} layers for {} layers",
                grads.len(),
                weights.len()
            )));
        }
        for (i, (w, g)) in weights.iter().zip(grads).enumerate() {
            if w.len() != g.len() {
                return Err(Error::Model(format!(
                    "optimizer: {} gradients for {} weights",
                    g.len(),
                    w.len()
                )));
            }
            self.ensure_slots(i, w)?;
        }
        let moved = weights
            .iter()
            .zip(grads)
            .map(|(ws, gs)| {
                ws.iter()
                    .zip(gs)
                    .map(|(w, g)| g.to_device(w.device_handle()))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        if !tables {
            return Ok(moved);
        }
        let rule = self.rule_at(self.iterations)?;
        let groups = update_groups(&self.slots, &self.config, weights, &moved)?;
        self.tables
            .resize_with(groups.len(), ops::UpdateTable::default);
        for (vars, table) in groups.iter().zip(self.tables.iter_mut()) {
            ops::prepare_fused_update(vars, &rule, table)?;
        }
        drop(groups);
        Ok(moved)
    }

    /// Keras' `clipvalue`, which the fused update applies to each gradient element.
    fn clip_value(&self) -> Option<f32> {
        match self.config.options().clip() {
            Some(ClipMode::Value(c)) => Some(c),
            _ => None,
        }
    }

    /// The update rule of a step after `iterations` applied ones, at its learning rate and
    /// step count.
    fn rule_at(&self, iterations: u64) -> Result<ops::UpdateRule> {
        let lr = self.learning_rate_at(iterations);
        let step = u32::try_from(iterations + 1).unwrap_or(u32::MAX);
        let adam = |a: &Adam| AdamParams {
            lr,
            beta1: a.beta_1,
            beta2: a.beta_2,
            epsilon: a.epsilon,
            step,
        };
        Ok(match self.config.base() {
            Optimizer::Sgd(s) => ops::UpdateRule::Sgd(SgdParams {
                lr,
                momentum: s.momentum,
                nesterov: s.nesterov,
            }),
            Optimizer::Adam(a) => ops::UpdateRule::Adam(adam(a)),
            Optimizer::AdamW(a) => ops::UpdateRule::Adam(adam(&a.adam())),
            Optimizer::RmsProp(r) => ops::UpdateRule::RmsProp(RmspropParams {
                lr,
                rho: r.rho,
                momentum: r.momentum,
                epsilon: r.epsilon,
                centered: r.centered,
            }),
            Optimizer::LossScale(_) => {
                return Err(Error::Model("optimizer: nested loss scaling".into()))
            }
        })
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
        debug_assert!(
            self.device.is_none(),
            "the device holds the loss-scale state"
        );
        if applied {
            self.iterations += 1;
        }
        let growth = self
            .config
            .loss_scaling()
            .map_or(u64::MAX, |l| l.dynamic_growth_steps);
        if let Some(ls) = self.loss_scale.as_mut() {
            // The scale stays a normal float, as on the device (`ops::ScaleRules`).
            if !applied {
                if ls.scale * 0.5 >= f32::MIN_POSITIVE {
                    ls.scale *= 0.5;
                }
                ls.counter = 0;
            } else if ls.counter + 1 >= growth {
                if (ls.scale * 2.0).is_finite() {
                    ls.scale *= 2.0;
                }
                ls.counter = 0;
            } else {
                ls.counter += 1;
            }
        }
    }
}

/// Whether `device` is a GPU, whose fused update clips by value as it reads each gradient.
fn on_gpu(device: &LogicalDevice) -> bool {
    device.device_type() == crate::device::DeviceKind::Gpu
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

/// The variables of a step grouped by device, in order of first appearance, each with its
/// gradient and slots in [`ops::UpdateVar`]'s order.
fn update_groups<'a>(
    slots: &'a [Vec<Slots>],
    config: &Optimizer,
    weights: &'a [Vec<&'a Tensor>],
    grads: &'a [Vec<Tensor>],
) -> Result<Vec<Vec<ops::UpdateVar<'a>>>> {
    let mut groups: Vec<Vec<ops::UpdateVar<'a>>> = Vec::new();
    for (layer, (ws, gs)) in weights.iter().zip(grads).enumerate() {
        let layer_slots = slots.get(layer).map_or(&[][..], Vec::as_slice);
        if layer_slots.len() != ws.len() {
            return Err(Error::Model(format!(
                "optimizer: {} slots missing",
                config.base().name()
            )));
        }
        for ((w, g), slot) in ws.iter().zip(gs).zip(layer_slots) {
            let var = ops::UpdateVar {
                w,
                g,
                slots: slot.in_update_order(),
            };
            let device = w.device_handle();
            match groups
                .iter_mut()
                .find(|group| group[0].w.device_handle().same_device(device))
            {
                Some(group) => group.push(var),
                None => groups.push(vec![var]),
            }
        }
    }
    Ok(groups)
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
