//! The training step: forward, loss and backward layer after layer (or pipelined, or on every
//! replica), then the all-or-nothing optimizer update; `train_step`, `train_on_batch`,
//! `loss_and_gradients`, `apply_gradients`.

use crate::data::Batch;
use crate::distribute::MirroredStrategy;
use crate::error::{Error, Result};
use crate::nn::autocast::StepCasts;
use crate::nn::mirrored::{self, HostBatch};
use crate::nn::objective::{self, Objective};
use crate::nn::pass;
use crate::nn::pipeline::Examples;
use crate::nn::step_output::{StepOutput, StepPart};
use crate::tensor::{DType, Tensor};

use super::Sequential;

impl Sequential {
    /// Forward, loss, backward on the primary replica, then, with `update`, the optimizer
    /// step; without, the gradients are returned.
    ///
    /// The update is all or nothing: it starts only once every layer's gradients exist and
    /// every optimizer slot is allocated, so a failure anywhere before (out of memory on one
    /// device of a split model, say) leaves every weight, every slot and the iteration count
    /// as they were — as the mirrored step does.
    fn step(&mut self, x: &Tensor, y: &Tensor, update: bool) -> Result<(StepOutput, Vec<Tensor>)> {
        let what = if update { "fit" } else { "loss_and_gradients" };
        self.require_built(what)?;
        self.compiled(what)?;
        let objective = self.objective(what)?;
        let n = self.check_batch(what, x, Some(y))?;
        // Gradients handed to the caller are the loss's own, unscaled.
        let factor = if update {
            self.step_loss_factor(what)?
        } else {
            LossFactor::Host(1.0)
        };
        // An empty batch has no micro-batches to pipeline; the serial pass answers for it.
        let (part, grads) = match (self.pipeline.filter(|_| n > 0), factor) {
            (Some(p), LossFactor::Host(factor)) => {
                let out = self.pipelined(p, Examples::Device { x, y }, (&objective, factor))?;
                (out.part, out.grads)
            }
            (Some(_), LossFactor::Device(..)) => {
                // `step_loss_factor` keeps a pipelined model's scale on the host.
                return Err(Error::Model(format!(
                    "{what}: a pipelined step cannot take the loss scale from the device"
                )));
            }
            (None, factor) => self.serial_gradients(x, y, (&objective, factor))?,
        };
        if update {
            self.apply_layer_gradients(&grads)?;
        }
        let out = StepOutput::new(vec![part], n).named(objective.metric_names());
        Ok((out, grads.into_iter().flatten().collect()))
    }

    /// The factor of the loss gradient of a training step (the loss scale): read on the
    /// device, where the step decides loss scaling there (the model on one device, neither
    /// pipelined nor mirrored), else the host's.
    fn step_loss_factor(&mut self, what: &str) -> Result<LossFactor> {
        let home = self.entries.last().map(|e| e.device.clone());
        let on_device = self.decides_on_device();
        let compiled = self
            .compiled
            .as_mut()
            .ok_or_else(|| Error::Model(format!("{what}: the model is not compiled")))?;
        let opt = &mut compiled.optimizer;
        match home {
            Some(home) if on_device && opt.scales_on_device() => {
                let (base, state) = opt.device_seed(&home)?;
                Ok(LossFactor::Device(base, state))
            }
            _ => {
                opt.sync_to_host()?;
                Ok(LossFactor::Host(opt.loss_factor()))
            }
        }
    }

    /// Whether the steps may decide loss scaling on the device: every layer on one device,
    /// neither pipelined nor mirrored (the loss gradient's seed and the update then meet the
    /// state there).
    fn decides_on_device(&self) -> bool {
        let one_device = self.entries.last().is_some_and(|last| {
            self.entries
                .iter()
                .all(|e| e.device.same_device(&last.device))
        });
        one_device && self.pipeline.is_none() && self.mirrors.is_none()
    }

    /// Forward, loss and backward of the whole batch, layer after layer.
    /// `(objective, factor)`: the loss and metrics, and the factor of the loss gradient (the
    /// loss scale).
    fn serial_gradients(
        &self,
        x: &Tensor,
        y: &Tensor,
        (objective, factor): (&Objective, LossFactor),
    ) -> Result<(StepPart, Vec<Vec<Tensor>>)> {
        let stages = self.stages();
        let last = stages[stages.len() - 1].device;
        let _casts = StepCasts::enter();
        let (logits, saved) = pass::forward(&stages, x, true)?;
        let terms = match factor {
            LossFactor::Host(factor) => pass::loss_terms(last, &logits, y, objective, factor)?,
            LossFactor::Device(base, state) => {
                objective::loss_terms_scaled(last, objective, &logits, y, (base, &state))?
            }
        };
        drop(logits);
        let mut grads: Vec<Vec<Tensor>> = vec![Vec::new(); stages.len()];
        pass::backward(&stages, saved, terms.dlogits, |i, g| {
            grads[i] = g;
            Ok(())
        })?;
        let part = StepPart {
            loss_sum: terms.loss_sum,
            metrics: terms.metrics,
        };
        Ok((part, grads))
    }

    /// The optimizer step from every layer's gradients: the slots are allocated first (the only
    /// allocation of an update), then every weight is updated in place and the step counted.
    /// Under loss scaling the gradients are checked and unscaled first; a step whose gradients
    /// are not all finite updates nothing and only moves the scale. A model on one device,
    /// unpipelined, decides that on the device (see `OptimizerState::apply_step`).
    fn apply_layer_gradients(&mut self, grads: &[Vec<Tensor>]) -> Result<()> {
        let on_device = self.decides_on_device();
        let compiled = self
            .compiled
            .as_mut()
            .ok_or_else(|| Error::Model("fit: the model is not compiled".into()))?;
        let layer_weights: Vec<Vec<&Tensor>> = self
            .entries
            .iter()
            .map(|e| e.layer.weights().into_iter().map(|(_, t)| t).collect())
            .collect();
        debug_assert_eq!(grads.len(), layer_weights.len(), "gradients of every layer");
        compiled
            .optimizer
            .apply_step(&layer_weights, grads, on_device)
    }

    /// One optimizer step with the given gradients, one per weight in
    /// [`weights`](Sequential::weights) order (Keras' `model.optimizer.apply_gradients(zip(grads,
    /// model.trainable_variables))`): loss-scale unscaling and its check (the gradients are taken
    /// as scaled, as Keras' `LossScaleOptimizer.apply_gradients` takes them), clipping, weight
    /// decay, the update, `iterations`.
    ///
    /// ```
    /// use anygpu::nn::{Dense, Loss, Sequential, Sgd};
    /// use anygpu::Tensor;
    /// let _cpu = anygpu::with_device("/cpu:0")?;
    /// let mut model = Sequential::new();
    /// model.add(Dense::new(1).input_shape(&[1]))?;
    /// model.compile(Loss::SparseCategoricalCrossentropy { from_logits: true }, Sgd::new(0.5), &[])?;
    /// model.set_weights(&[vec![1.0], vec![0.0]])?;
    /// model.apply_gradients(&[Tensor::from_slice(&[2.0f32], &[1, 1])?, Tensor::from_slice(&[-2.0f32], &[1])?])?;
    /// assert_eq!(model.get_weights()?, vec![vec![0.0], vec![1.0]]);
    /// assert_eq!(model.iterations(), 1);
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Model`] before `compile` or under a [`MirroredStrategy`] (whose replicas update
    /// from their summed gradients in `fit`); [`Error::InvalidArgument`] for a count of
    /// gradients other than the weights'; shape and device errors.
    pub fn apply_gradients(&mut self, grads: &[Tensor]) -> Result<()> {
        if self.mirrors.is_some() {
            return Err(Error::Model(
                "apply_gradients: the model is mirrored by a MirroredStrategy; its replicas \
                 update in fit and train_step"
                    .into(),
            ));
        }
        let counts: Vec<usize> = self
            .entries
            .iter()
            .map(|e| e.layer.weights().len())
            .collect();
        let total: usize = counts.iter().sum();
        if grads.len() != total {
            return Err(Error::InvalidArgument(format!(
                "apply_gradients: {} gradients for {total} weights",
                grads.len()
            )));
        }
        let mut rest = grads.iter().cloned();
        let per_layer: Vec<Vec<Tensor>> = counts
            .iter()
            .map(|&n| rest.by_ref().take(n).collect())
            .collect();
        self.apply_layer_gradients(&per_layer)
    }

    /// A data-parallel step over the strategy's replicas.
    fn mirrored_step(&mut self, batch: HostBatch<'_>) -> Result<StepOutput> {
        let what = "fit";
        let objective =
            self.joined(self.require_built(what).and_then(|()| self.objective(what)))?;
        let Some(strategy) = self.strategy().cloned() else {
            return Err(Error::Model("fit: the model has no strategy".into()));
        };
        let mut views = self.replica_views();
        mirrored::train_step(&strategy, &mut views, batch, &objective)
    }

    /// `local`, the result of what a step checks before its first vote, made every worker's
    /// under a multi-worker strategy: an error joins the step's vote (so the other workers'
    /// steps fail with it instead of waiting for this one), and comes back agreed.
    fn joined<T>(&self, local: Result<T>) -> Result<T> {
        match (local, self.strategy().and_then(MirroredStrategy::workers)) {
            (Err(e), Some(w)) => Err(mirrored::vote_failed_step(w, &e)),
            (local, _) => local,
        }
    }

    /// One training step on a batch: forward, loss, backward, optimizer update. Returns the
    /// batch's loss sum and correct count as device tensors, without waiting for the device
    /// (Keras' `train_step`). Under a [`MirroredStrategy`] the batch is first read to the host
    /// to be split among the replicas (which waits for whatever produced it); `fit` takes its
    /// batches from the host directly.
    ///
    /// `x` is `[batch, ...input_shape]` f32 and `y` `[batch]` i32, on any device: they move to
    /// the first and last layers' devices.
    ///
    /// A step is all or nothing: the update starts only once every gradient exists, on every
    /// device of a split model as on every replica of a mirrored one, so an error in the
    /// forward or backward pass (out of memory on one device, say) leaves every weight, every
    /// optimizer slot and [`iterations`](Sequential::iterations) as they were. A batch of 0
    /// examples changes nothing either — no momentum decay, no Adam step — and its loss reads
    /// NaN.
    ///
    /// ```
    /// use anygpu::nn::{Activation, Dense, Loss, Sequential, Sgd};
    /// use anygpu::Tensor;
    /// let _cpu = anygpu::with_device("/cpu:0")?;
    /// let mut model = Sequential::with_seed(1);
    /// model.add(Dense::new(2).activation(Activation::Softmax).input_shape(&[3]))?;
    /// model.compile(Loss::sparse_categorical_crossentropy(), Sgd::new(0.5), &[])?;
    /// let x = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 0.0, 0.0, 1.0], &[2, 3])?;
    /// let y = Tensor::from_vec(vec![0i32, 1], &[2])?;
    /// let first = model.train_step(&x, &y)?.loss()?;
    /// for _ in 0..20 {
    ///     model.train_step(&x, &y)?; // nothing is read back here
    /// }
    /// assert!(model.train_on_batch(&x, &y)? < first);
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Model`] before `compile` or `build`; a shape error naming the expected batch
    /// shape; device errors.
    pub fn train_step(&mut self, x: &Tensor, y: &Tensor) -> Result<StepOutput> {
        if x.shape().first() == Some(&0) {
            return self.empty_step(x, y);
        }
        if self.mirrors.is_none() {
            return Ok(self.step(x, y, true)?.0);
        }
        let host = self
            .require_built("fit")
            .and_then(|()| self.check_batch("fit", x, Some(y)))
            .and_then(|_| {
                let _cause = crate::profiler::WaitCause::enter(
                    "MirroredStrategy: train_step reads the batch to split it",
                );
                let xs = x.to_vec::<f32>()?;
                Ok(match y.dtype() {
                    DType::I32 => (xs, y.to_vec::<i32>()?, Vec::new()),
                    _ => (xs, Vec::new(), y.to_vec::<f32>()?),
                })
            });
        let (xs, labels, values) = self.joined(host)?;
        self.mirrored_step(HostBatch {
            x: &xs,
            x_shape: x.shape(),
            y: &labels,
            y_values: &values,
            target_shape: &y.shape()[1..],
        })
    }

    /// A batch without examples: checked like any other, then nothing happens. Its gradient
    /// would be zero, but an update with it would still decay SGD's momentum and Adam's
    /// moments and count a step, so there is no update at all.
    fn empty_step(&self, x: &Tensor, y: &Tensor) -> Result<StepOutput> {
        self.require_built("fit")?;
        self.compiled("fit")?;
        self.check_batch("fit", x, Some(y))?;
        Ok(StepOutput::new(Vec::new(), 0))
    }

    /// One training step on a batch from a [`Dataset`]: under a strategy each replica takes
    /// its examples straight from the host batch.
    pub(in crate::nn) fn train_batch(&mut self, batch: &Batch) -> Result<StepOutput> {
        if self.mirrors.is_some() {
            self.joined(self.check_host_batch("fit", batch))?;
            return self.mirrored_step(HostBatch::from(batch));
        }
        if let (Some(p), false) = (self.pipeline, batch.batch_size() == 0) {
            // Each micro-batch goes from the host straight to its stage's device.
            self.require_built("fit")?;
            let optimizer = &mut self
                .compiled
                .as_mut()
                .ok_or_else(|| Error::Model("fit: the model is not compiled".into()))?
                .optimizer;
            // Pipelined steps decide loss scaling on the host.
            optimizer.sync_to_host()?;
            let factor = optimizer.loss_factor();
            let objective = self.objective("fit")?;
            self.check_host_batch("fit", batch)?;
            let examples = Examples::Host(HostBatch::from(batch));
            let out = self.pipelined(p, examples, (&objective, factor))?;
            self.apply_layer_gradients(&out.grads)?;
            return Ok(
                StepOutput::new(vec![out.part], batch.batch_size()).named(objective.metric_names())
            );
        }
        let (x, y) = self.batch_tensors("fit", batch)?;
        self.train_step(&x, &y)
    }

    /// [`train_step`](Sequential::train_step), then reads the batch's mean loss (Keras'
    /// `train_on_batch`).
    ///
    /// # Errors
    /// As [`train_step`](Sequential::train_step).
    pub fn train_on_batch(&mut self, x: &Tensor, y: &Tensor) -> Result<f32> {
        self.train_step(x, y)?.loss()
    }

    /// The mean loss on a batch and its gradient w.r.t. every trainable weight, without
    /// updating them: what `tf.GradientTape` gives for `loss(y, model(x, training=True))`.
    /// Gradients come in [`trainable_weights`](Sequential::trainable_weights) order, each on
    /// its layer's device. Layers run their training pass, so a `BatchNormalization` updates
    /// its moving statistics, as in Keras.
    ///
    /// ```
    /// use anygpu::nn::{Dense, Loss, Sequential, Sgd};
    /// use anygpu::Tensor;
    /// let _cpu = anygpu::with_device("/cpu:0")?;
    /// let mut model = Sequential::new();
    /// model.add(Dense::new(2).input_shape(&[3]))?; // logits
    /// model.compile(Loss::SparseCategoricalCrossentropy { from_logits: true }, Sgd::default(), &[])?;
    /// model.set_weights(&[vec![0.0; 6], vec![0.0; 2]])?;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[1, 3])?;
    /// let (loss, grads) = model.loss_and_gradients(&x, &Tensor::from_vec(vec![1i32], &[1])?)?;
    /// assert!((loss - 2f32.ln()).abs() < 1e-6); // two equal logits
    /// // d loss / d bias = softmax - one_hot = [0.5, -0.5].
    /// assert_eq!(grads[1].to_vec::<f32>()?, [0.5, -0.5]);
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`train_step`](Sequential::train_step).
    pub fn loss_and_gradients(&mut self, x: &Tensor, y: &Tensor) -> Result<(f32, Vec<Tensor>)> {
        let (out, grads) = self.step(x, y, false)?;
        Ok((out.loss()?, grads))
    }
}

/// The factor of a step's loss gradient (the loss scale): a host float, or `(base, state)` read
/// on the device (`base * 2^e`, `e` the state's exponent).
enum LossFactor {
    Host(f32),
    Device(f32, Tensor),
}
