//! `compile` and what it holds: the loss and metrics resolved against the last layer, the
//! optimizer with its loss scale, learning rate and iterations, and the optimizer's variables as
//! checkpoints save and restore them.

use crate::distribute;
use crate::error::{Error, Result};
use crate::nn::history::History;
use crate::nn::loss::Loss;
use crate::nn::metrics::Metric;
use crate::nn::objective::Objective;
use crate::nn::optimizer::{self, LossScale, LossScaleOptimizer, Optimizer, OptimizerState};
use crate::tensor::Tensor;

use super::{Compiled, Sequential};

impl Sequential {
    /// Configures training (`model.compile(loss, optimizer, metrics)`); resets the optimizer
    /// state. When a layer computes under `mixed_float16`, the optimizer is wrapped in a
    /// [`LossScaleOptimizer`] unless it is one already, as Keras 3 does.
    ///
    /// ```
    /// use anygpu::nn::{Activation, Dense, Loss, Metric, Sequential, Sgd};
    /// let mut model = Sequential::new();
    /// model.add(Dense::new(3).activation(Activation::Softmax).input_shape(&[4]))?;
    /// model.compile(Loss::sparse_categorical_crossentropy(), Sgd::new(0.01).momentum(0.9), &[Metric::Accuracy])?;
    /// assert_eq!(model.optimizer().map(|o| o.name()), Some("SGD"));
    /// // from_logits=true needs a linear last layer.
    /// assert!(model.compile(Loss::SparseCategoricalCrossentropy { from_logits: true }, Sgd::default(), &[]).is_err());
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bad optimizer hyper-parameters, a loss that does not fit
    /// the last layer (see [`Loss::SparseCategoricalCrossentropy`]), or a call inside a
    /// strategy's scope for a model created outside it.
    pub fn compile(
        &mut self,
        loss: Loss,
        optimizer: impl Into<Optimizer>,
        metrics: &[Metric],
    ) -> Result<()> {
        let mut optimizer = optimizer.into();
        optimizer.validate()?;
        // Keras 3 wraps the optimizer of a mixed_float16 model in loss scaling by itself.
        if self.entries.iter().any(|e| e.policy.is_mixed()) && optimizer.loss_scaling().is_none() {
            optimizer = LossScaleOptimizer::new(optimizer).into();
        }
        if let Some(current) = distribute::get_strategy() {
            if self.strategy() != Some(&current) {
                return Err(Error::InvalidArgument(format!(
                    "compile: this model was not created in the scope of the MirroredStrategy \
                     being used ({:?}), so its weights are not mirrored. Create the model \
                     inside the scope too: strategy.scope(|| {{ build the model; \
                     model.compile(...) }})",
                    current
                        .devices()
                        .iter()
                        .map(|d| d.name())
                        .collect::<Vec<_>>()
                )));
            }
        }
        loss.validate()?;
        self.resolve_objective(loss, metrics)?;
        if let Some(m) = self.mirrors.as_mut() {
            m.compile(&optimizer, self.entries.len());
        }
        self.compiled = Some(Compiled {
            loss,
            optimizer: OptimizerState::new(optimizer, self.entries.len()),
            metrics: metrics.to_vec(),
        });
        Ok(())
    }

    /// The compiled optimizer, if any.
    pub fn optimizer(&self) -> Option<&Optimizer> {
        self.compiled.as_ref().map(|c| &c.optimizer.config)
    }

    /// The history of the last [`fit`](Sequential::fit) (Keras' `model.history`), updated as
    /// each epoch finishes: after a `fit` that failed in epoch 9, it holds epochs 1–8; after a
    /// resumed one, the restored epochs too.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// The current loss scale under a [`LossScaleOptimizer`] (Keras' `optimizer.dynamic_scale`):
    /// what the next step multiplies its loss by. `None` without loss scaling. Where the steps
    /// decide loss scaling on their device, this reads it there (waiting for the steps
    /// recorded so far; the steps themselves never wait for it).
    pub fn loss_scale(&self) -> Option<f32> {
        self.compiled
            .as_ref()
            .and_then(|c| c.optimizer.loss_scale_state().map(|l| l.scale))
    }

    /// The counter of the loss scale (Keras' `step_counter`: finite steps in a row since the
    /// scale last changed), read as [`loss_scale`](Sequential::loss_scale) is. For tests.
    #[doc(hidden)]
    pub fn loss_scale_counter(&self) -> Option<u64> {
        self.loss_scale_state().map(|l| l.counter)
    }

    /// Makes the training steps decide dynamic loss scaling on the host, reading each step's
    /// finiteness flags back (`true`), or on the device where they can (`false`, the default):
    /// the reference the device's decisions are tested against. For tests.
    ///
    /// # Errors
    /// [`Error::Model`] before `compile`; a device error bringing the scale back to the host.
    #[doc(hidden)]
    pub fn set_loss_scaling_on_host(&mut self, on_host: bool) -> Result<()> {
        let compiled = self.compiled.as_mut().ok_or_else(|| {
            Error::Model("set_loss_scaling_on_host: the model is not compiled".into())
        })?;
        compiled.optimizer.sync_to_host()?;
        compiled.optimizer.host_decides = on_host;
        Ok(())
    }

    /// The loss scale and its counter.
    pub(crate) fn loss_scale_state(&self) -> Option<LossScale> {
        self.compiled
            .as_ref()
            .and_then(|c| c.optimizer.loss_scale_state())
    }

    /// The iteration count and the loss scale for a checkpoint: read from the device where
    /// it holds them, an error rather than a stale value.
    ///
    /// # Errors
    /// The device's, reading them back.
    pub(crate) fn training_state(&self) -> Result<(u64, Option<LossScale>)> {
        match &self.compiled {
            Some(c) => c.optimizer.training_state(),
            None => Ok((0, None)),
        }
    }

    /// The learning rate the next training step uses (Keras' `optimizer.learning_rate`): a
    /// schedule's value at [`iterations`](Sequential::iterations), or the constant rate (as
    /// compiled, or as [`set_learning_rate`](Sequential::set_learning_rate) left it); `None`
    /// before `compile`.
    ///
    /// ```
    /// use anygpu::nn::{Dense, ExponentialDecay, Loss, Sequential, Sgd};
    /// let mut model = Sequential::new();
    /// model.add(Dense::new(2).input_shape(&[3]))?;
    /// let loss = Loss::SparseCategoricalCrossentropy { from_logits: true };
    /// model.compile(loss, Sgd::new(0.1), &[])?;
    /// model.set_learning_rate(0.05)?;
    /// assert_eq!(model.learning_rate(), Some(0.05));
    /// let schedule = ExponentialDecay::new(0.1, 10, 0.5);
    /// model.compile(loss, Sgd::default().learning_rate_schedule(schedule), &[])?;
    /// assert_eq!(model.learning_rate(), Some(0.1));
    /// assert!(model.set_learning_rate(0.05).is_err()); // a schedule's rate is not settable
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn learning_rate(&self) -> Option<f32> {
        self.compiled.as_ref().map(|c| c.optimizer.learning_rate())
    }

    /// Sets the constant learning rate (`model.optimizer.learning_rate = lr`), on every
    /// replica: what `ReduceLROnPlateau` and `LearningRateScheduler` do.
    ///
    /// # Errors
    /// [`Error::Model`] before `compile`; [`Error::InvalidArgument`] when the optimizer has a
    /// schedule (Keras' `TypeError`) or for a rate that is not a finite number >= 0.
    pub fn set_learning_rate(&mut self, lr: f32) -> Result<()> {
        let compiled = self
            .compiled
            .as_mut()
            .ok_or_else(|| Error::Model("set_learning_rate: the model is not compiled".into()))?;
        compiled.optimizer.set_learning_rate(lr)?;
        if let Some(m) = self.mirrors.as_mut() {
            for r in m.replicas.iter_mut() {
                if let Some(opt) = r.optimizer.as_mut() {
                    opt.set_learning_rate(lr)?;
                }
            }
        }
        Ok(())
    }

    /// Keras' `model.stop_training`: whether a callback asked `fit` to stop (it stops once
    /// the current epoch is done; `fit` clears it when it starts).
    pub fn stop_training(&self) -> bool {
        self.stop_training
    }

    /// Sets `model.stop_training` (what [`EarlyStopping`](crate::nn::EarlyStopping) does).
    pub fn set_stop_training(&mut self, stop: bool) {
        self.stop_training = stop;
    }

    /// Training steps run since `compile` (Keras' `optimizer.iterations`; steps that loss
    /// scaling skipped are not counted). Under loss scaling decided on the device, read there
    /// as [`loss_scale`](Sequential::loss_scale) is.
    pub fn iterations(&self) -> u64 {
        self.compiled
            .as_ref()
            .map_or(0, |c| c.optimizer.iterations())
    }

    /// The optimizer's slot variables (Keras' `optimizer.variables` without `iterations`),
    /// named `layer_name/weight_name/slot`: `momentum` for SGD with momentum and Adam's first
    /// moment, `velocity` for Adam's second. A slot exists once its weight has been updated;
    /// plain SGD has none. Under a strategy, the primary replica's.
    ///
    /// ```
    /// use anygpu::nn::{Activation, Dense, Loss, Sequential, Sgd};
    /// use anygpu::Tensor;
    /// let _cpu = anygpu::with_device("/cpu:0")?;
    /// let mut model = Sequential::new();
    /// model.add(Dense::new(2).activation(Activation::Softmax).input_shape(&[3]))?;
    /// model.compile(Loss::sparse_categorical_crossentropy(), Sgd::new(0.1).momentum(0.9), &[])?;
    /// assert!(model.optimizer_variables().is_empty());
    /// let x = Tensor::from_vec(vec![1.0f32, 0.0, 0.0], &[1, 3])?;
    /// model.train_step(&x, &Tensor::from_vec(vec![1i32], &[1])?)?;
    /// let names: Vec<String> = model.optimizer_variables().into_iter().map(|(n, _)| n).collect();
    /// assert_eq!(names, ["dense/kernel/momentum", "dense/bias/momentum"]);
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn optimizer_variables(&self) -> Vec<(String, &Tensor)> {
        let Some(compiled) = &self.compiled else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, e) in self.entries.iter().enumerate() {
            let names = e.layer.weights();
            for (w, slot, t) in compiled.optimizer.named_slots(i) {
                let weight = names.get(w).map_or("?", |(n, _)| n);
                out.push((format!("{}/{weight}/{slot}", e.name), t));
            }
        }
        out
    }

    /// `(name, shape)` of every slot the optimizer has once each weight was updated, in
    /// [`optimizer_variables`](Sequential::optimizer_variables) order; empty before `compile`.
    pub(crate) fn optimizer_layout(&self) -> Vec<(String, Vec<usize>)> {
        let Some(compiled) = &self.compiled else {
            return Vec::new();
        };
        let names = optimizer::slot_names(&compiled.optimizer.config);
        self.entries
            .iter()
            .flat_map(|e| {
                e.layer
                    .weights()
                    .into_iter()
                    .map(move |(n, t)| (format!("{}/{n}", e.name), t.shape().to_vec()))
            })
            .flat_map(|(weight, shape)| {
                names
                    .iter()
                    .map(move |slot| (format!("{weight}/{slot}"), shape.clone()))
            })
            .collect()
    }

    /// Puts back a training state checked against [`weight_layout`](Sequential::weight_layout)
    /// and [`optimizer_layout`](Sequential::optimizer_layout): the weights, the optimizer
    /// slots, the iteration count and the loss scale, on every replica. Every slot is
    /// allocated before anything is written.
    pub(crate) fn restore_training_state(
        &mut self,
        weights: &[Vec<f32>],
        slots: &[Vec<f32>],
        (iterations, loss_scale): (u64, Option<LossScale>),
    ) -> Result<()> {
        for view in self.replica_views() {
            let opt = view.optimizer.ok_or_else(|| {
                Error::Model("restore: the model is not compiled; compile it first".into())
            })?;
            let mut count = 0;
            for (i, layer) in view.layers.iter().enumerate() {
                let ws: Vec<&Tensor> = layer.weights().into_iter().map(|(_, t)| t).collect();
                opt.ensure_slots(i, &ws)?;
                count += opt.slot_tensors(i).len();
            }
            // Checked before anything is written: all or nothing.
            if count != slots.len() {
                return Err(Error::Model(format!(
                    "restore: {} optimizer slots for {count} in the model",
                    slots.len()
                )));
            }
        }
        self.write_weights(weights)?;
        for view in self.replica_views() {
            let layers = view.layers.len();
            let Some(opt) = view.optimizer else { continue };
            let tensors: Vec<&Tensor> = (0..layers)
                .flat_map(|i| opt.named_slots(i).into_iter().map(|(_, _, t)| t))
                .collect();
            if tensors.len() != slots.len() {
                return Err(Error::Model(format!(
                    "restore: {} optimizer slots for {} in the model",
                    slots.len(),
                    tensors.len()
                )));
            }
            for (t, v) in tensors.into_iter().zip(slots) {
                t.write_words(bytemuck::cast_slice(v))?;
            }
            opt.set_training_state(iterations, loss_scale);
        }
        Ok(())
    }

    /// `loss` and `metrics` resolved against the last layer (`Ok(None)` without layers).
    fn resolve_objective(&self, loss: Loss, metrics: &[Metric]) -> Result<Option<Objective>> {
        let Some(last) = self.entries.last() else {
            return Ok(None);
        };
        let act = last.layer.activation();
        Objective::resolve(
            loss,
            metrics,
            (&last.name, act, last.output_shape.as_deref()),
        )
        .map(Some)
    }

    pub(in crate::nn) fn compiled(&self, what: &str) -> Result<&Compiled> {
        let compiled = self.compiled.as_ref().ok_or_else(|| {
            Error::Model(format!(
                "{what}: you must compile your model before training/testing. Use \
                 `model.compile(loss, optimizer, metrics)`"
            ))
        })?;
        self.resolve_objective(compiled.loss, &compiled.metrics)?;
        Ok(compiled)
    }

    /// The compiled loss and metrics, resolved against the model as it is now.
    ///
    /// # Errors
    /// [`Error::Model`] before `compile` or without layers; a loss that does not fit the last
    /// layer.
    pub(in crate::nn) fn objective(&self, what: &str) -> Result<Objective> {
        let compiled = self.compiled(what)?;
        self.resolve_objective(compiled.loss, &compiled.metrics)?
            .ok_or_else(|| Error::Model(format!("{what}: the model has no layers")))
    }

    /// The compiled loss (`model.loss`), if any.
    pub fn loss(&self) -> Option<Loss> {
        self.compiled.as_ref().map(|c| c.loss)
    }

    /// The compiled metrics' names as the history reports them, in `compile` order.
    pub fn metrics_names(&self) -> Vec<&'static str> {
        self.objective("metrics_names")
            .map(|o| o.metric_names())
            .unwrap_or_default()
    }

    /// The metrics given to `compile` (empty before).
    pub(in crate::nn) fn compiled_metrics(&self) -> &[Metric] {
        self.compiled.as_ref().map_or(&[], |c| &c.metrics)
    }
}
