//! `keras.Sequential`: a stack of layers, each on its own device, trained with `fit`.

use std::fmt;

use crate::data::Batch;
use crate::device::LogicalDevice;
use crate::distribute::{self, MirroredStrategy};
use crate::error::{Error, Result};
use crate::mixed_precision::{self, Policy};
use crate::nn::activation::Activation;
use crate::nn::history::History;
use crate::nn::init::derive_seed;
use crate::nn::layers::{count_params, variables, Layer};
use crate::nn::loss::Loss;
use crate::nn::metrics::Metric;
use crate::nn::mirrored::{self, HostBatch, Mirrors, ReplicaView};
use crate::nn::objective::Objective;
use crate::nn::optimizer::{self, LossScale, LossScaleOptimizer, Optimizer, OptimizerState};
use crate::nn::pass::{self, Stage};
use crate::nn::pipeline::{self, Examples, Pipeline, PipelineGradients, StageStats};
use crate::nn::step_output::{StepOutput, StepPart};
use crate::nn::verbosity::Verbosity;
use crate::nn::weights;
use crate::ops;
use crate::tensor::{DType, Tensor};

pub(super) struct Entry {
    pub(super) name: String,
    pub(super) layer: Box<dyn Layer>,
    pub(super) device: LogicalDevice,
    /// The layer's dtype policy: its own, else the global one when it was added.
    pub(super) policy: Policy,
    input_shape: Option<Vec<usize>>,
    pub(super) output_shape: Option<Vec<usize>>,
}

pub(super) struct Compiled {
    loss: Loss,
    pub(super) optimizer: OptimizerState,
    /// The metrics as given to `compile` (resolved against the model by
    /// [`Sequential::objective`]).
    metrics: Vec<Metric>,
}

/// A linear stack of layers (`keras.Sequential`), each running on the device it was added on.
///
/// Layers added inside a device scope live on that device (their weights and optimizer state
/// are created there); [`Sequential::add_on`] names the device explicitly. Between layers on
/// different devices, activations go forward and gradients back by themselves
/// ([`Tensor::to_device`]), so a model split over GPUs trains like one on a single device.
///
/// ```
/// use anygpu::nn::{Activation, Conv2D, Dense, Flatten, Loss, MaxPool2D, Metric, Sequential, Sgd, Verbosity};
/// use anygpu::ops::spec::Padding;
/// use anygpu::{data::Dataset, Runtime};
///
/// let rt = Runtime::builder().build()?;
/// let cpu = rt.cpu()?;
/// let mut model = Sequential::with_seed(42);
/// model.add_on(&cpu, Conv2D::new(4, 3).padding(Padding::Same).activation(Activation::Selu).input_shape(&[8, 8, 1]))?;
/// model.add_on(&cpu, MaxPool2D::new())?;
/// model.add_on(&cpu, Flatten::new())?;
/// model.add_on(&cpu, Dense::new(3).activation(Activation::Softmax))?;
/// assert_eq!(model.count_params(), 4 * 9 + 4 + 64 * 3 + 3);
/// model.compile(Loss::sparse_categorical_crossentropy(), Sgd::new(0.05), &[Metric::Accuracy])?;
/// model.set_verbose(Verbosity::Silent);
///
/// let x: Vec<f32> = (0..16 * 64).map(|i| ((i * 37) % 11) as f32 / 11.0).collect();
/// let y: Vec<i32> = (0..16).map(|i| i % 3).collect();
/// let train = Dataset::from_tensor_slices(x, &[8, 8, 1], y)?.batch(8, false);
/// let history = model.fit(&train, 2, None, None)?;
/// assert_eq!(history.loss.len(), 2);
/// # Ok::<(), anygpu::Error>(())
/// ```
pub struct Sequential {
    pub(super) name: String,
    seed: u64,
    pub(super) entries: Vec<Entry>,
    pub(super) compiled: Option<Compiled>,
    pub(super) verbose: Verbosity,
    pub(super) log_every: usize,
    /// The other replicas' copies, for a model created inside a strategy's scope.
    pub(super) mirrors: Option<Mirrors>,
    /// The last `fit`'s history, epoch by epoch as they finish (Keras' `model.history`).
    pub(super) history: History,
    /// Micro-batch pipelining of the training step, when set.
    pipeline: Option<Pipeline>,
    /// What each stage did in the last pipelined step.
    pipeline_stats: Vec<StageStats>,
    /// Keras' `model.stop_training`: set by a callback, `fit` stops after the epoch.
    pub(super) stop_training: bool,
}

impl fmt::Debug for Sequential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sequential")
            .field("name", &self.name)
            .field("seed", &self.seed)
            .field(
                "layers",
                &self.entries.iter().map(|e| &e.name).collect::<Vec<_>>(),
            )
            .field("compiled", &self.compiled.is_some())
            .field("strategy", &self.strategy())
            .field("pipeline", &self.pipeline)
            .finish()
    }
}

impl Default for Sequential {
    fn default() -> Self {
        Sequential::new()
    }
}

/// The devices a model runs on, each once, in layer order.
fn distinct_devices<'a>(
    devices: impl Iterator<Item = &'a LogicalDevice>,
) -> Vec<&'a LogicalDevice> {
    let mut out: Vec<&LogicalDevice> = Vec::new();
    for d in devices {
        if !out.iter().any(|o| o.same_device(d)) {
            out.push(d);
        }
    }
    out
}

impl Sequential {
    /// An empty model named `sequential`, seed 0.
    pub fn new() -> Sequential {
        Sequential::with_seed(0)
    }

    /// An empty model whose weights are initialized from `seed`: layer `i` derives its own seed
    /// from it, and each weight from its layer's, so the same seed gives the same weights
    /// whatever devices the layers are on.
    pub fn with_seed(seed: u64) -> Sequential {
        Sequential {
            name: "sequential".into(),
            seed,
            entries: Vec::new(),
            compiled: None,
            verbose: Verbosity::default(),
            log_every: 10,
            mirrors: distribute::get_strategy().map(Mirrors::new),
            history: History::default(),
            pipeline: None,
            pipeline_stats: Vec::new(),
            stop_training: false,
        }
    }

    /// The strategy the model was created under ([`MirroredStrategy::scope`]), if any: then
    /// every layer is mirrored on each of its replicas, and `fit`, `evaluate` and `predict`
    /// split each batch among them.
    pub fn strategy(&self) -> Option<&MirroredStrategy> {
        self.mirrors.as_ref().map(|m| &m.strategy)
    }

    /// Whether this process prints `fit`'s progress and writes the callbacks' files: always,
    /// except on the workers of a multi-worker job other than the chief.
    pub(crate) fn is_chief(&self) -> bool {
        self.strategy().is_none_or(MirroredStrategy::is_chief)
    }

    /// What `fit` prints here: nothing on a worker other than the chief.
    pub(super) fn progress(&self) -> Verbosity {
        match self.is_chief() {
            true => self.verbose,
            false => Verbosity::Silent,
        }
    }

    /// Host copies of the weights of replica `replica` (0 is the primary, as
    /// [`get_weights`](Sequential::get_weights)); they equal the primary's bit for bit after
    /// every step.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a replica the model does not have; device errors.
    pub fn replica_weights(&self, replica: usize) -> Result<Vec<Vec<f32>>> {
        if replica == 0 {
            return self.get_weights();
        }
        let mirror = self
            .mirrors
            .as_ref()
            .and_then(|m| m.replicas.get(replica - 1))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "replica {replica}: the model has {} replica(s)",
                    self.mirrors.as_ref().map_or(1, |m| m.replicas.len() + 1)
                ))
            })?;
        mirror
            .layers
            .iter()
            .flat_map(|l| {
                variables(l.as_ref())
                    .into_iter()
                    .map(|(_, t)| t.to_vec::<f32>())
            })
            .collect()
    }

    /// Every replica's layers, the primary first, for passes that update nothing.
    pub(super) fn replica_layers(&self) -> Vec<ReplicaView<'_>> {
        let Some(first) = self.entries.first() else {
            return Vec::new();
        };
        let policies: Vec<Policy> = self.entries.iter().map(|e| e.policy).collect();
        let mut views = vec![ReplicaView {
            device: &first.device,
            layers: self.entries.iter().map(|e| e.layer.as_ref()).collect(),
            policies: policies.clone(),
            optimizer: None,
        }];
        if let Some(m) = &self.mirrors {
            views.extend(m.replicas.iter().map(|r| ReplicaView {
                device: &r.device,
                layers: r.layers.iter().map(AsRef::as_ref).collect(),
                policies: policies.clone(),
                optimizer: None,
            }));
        }
        views
    }

    /// Every replica as a training step sees it, the primary first.
    fn replica_views(&mut self) -> Vec<ReplicaView<'_>> {
        let primary_device = match self.entries.first() {
            Some(e) => &e.device,
            None => return Vec::new(),
        };
        let policies: Vec<Policy> = self.entries.iter().map(|e| e.policy).collect();
        let mut views = vec![ReplicaView {
            device: primary_device,
            layers: self.entries.iter().map(|e| e.layer.as_ref()).collect(),
            policies: policies.clone(),
            optimizer: self.compiled.as_mut().map(|c| &mut c.optimizer),
        }];
        if let Some(m) = self.mirrors.as_mut() {
            views.extend(m.replicas.iter_mut().map(|r| ReplicaView {
                device: &r.device,
                layers: r.layers.iter().map(AsRef::as_ref).collect(),
                policies: policies.clone(),
                optimizer: r.optimizer.as_mut(),
            }));
        }
        views
    }

    /// Renames the model (the summary's `Model: "..."` line).
    pub fn set_name(&mut self, name: &str) {
        self.name = name.to_string();
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The seed weights are initialized from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// What [`fit`](Sequential::fit) prints (Keras' `verbose=`).
    pub fn set_verbose(&mut self, verbose: Verbosity) {
        self.verbose = verbose;
    }

    /// How often, in steps, [`fit`](Sequential::fit) reads the running loss and accuracy back
    /// from the device (default 10). Between reads nothing waits for the device; every read
    /// waits for the steps before it.
    pub fn set_log_every(&mut self, steps: usize) {
        self.log_every = steps.max(1);
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the model has no layers.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds a layer on the device of the current scope (`with tf.device(...)`), or on the
    /// default device (`GPU:0`, else `CPU:0`) outside any scope.
    ///
    /// The scope is resolved now, once: the layer stays on that device. The layer is built
    /// (its weights created) as soon as its input shape is known: from its `input_shape` for
    /// the first layer, from the layer before otherwise.
    ///
    /// ```
    /// use anygpu::nn::{Dense, Sequential};
    /// let mut model = Sequential::new();
    /// {
    ///     let _cpu = anygpu::with_device("/cpu:0")?;
    ///     model.add(Dense::new(4).input_shape(&[3]))?;
    /// }
    /// assert_eq!(model.layer_infos()[0].device, "/device:CPU:0");
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`add_on`](Sequential::add_on).
    pub fn add(&mut self, layer: impl Layer + 'static) -> Result<()> {
        let device = match self.strategy() {
            Some(strategy) => strategy.devices()[0].clone(),
            // Resolve the scope exactly as weight creation would: with a (tiny) constant.
            None => Tensor::zeros(&[1])?.device_handle().clone(),
        };
        self.add_on(&device, layer)
    }

    /// Adds a layer on `device` explicitly, whatever the scope.
    ///
    /// # Errors
    /// A shape error when the layer cannot take the previous layer's output (or its own
    /// `input_shape`); [`Error::InvalidArgument`] when a layer follows a `softmax` layer; the
    /// device's out-of-memory error. The model is unchanged on error.
    pub fn add_on(&mut self, device: &LogicalDevice, layer: impl Layer + 'static) -> Result<()> {
        self.add_boxed(device, Box::new(layer))
    }

    /// [`add_on`](Sequential::add_on) for a boxed layer.
    ///
    /// # Errors
    /// As [`add_on`](Sequential::add_on).
    pub fn add_boxed(&mut self, device: &LogicalDevice, mut layer: Box<dyn Layer>) -> Result<()> {
        if let Some(strategy) = self.strategy() {
            if !strategy.devices()[0].same_device(device) {
                return Err(Error::InvalidArgument(format!(
                    "cannot add {} on {device}: this model was created under a \
                     MirroredStrategy, which mirrors every layer on each of its replicas {:?}; \
                     add layers with add()",
                    layer.class_name(),
                    strategy
                        .devices()
                        .iter()
                        .map(|d| d.name())
                        .collect::<Vec<_>>()
                )));
            }
        }
        if let Some(last) = self.entries.last() {
            let act = last.layer.activation();
            if act.is_folded() {
                return Err(Error::InvalidArgument(format!(
                    "cannot add {} after '{}': a {act} activation is supported on the last \
                     layer only",
                    layer.class_name(),
                    last.name
                )));
            }
        }
        let input_shape = match self.entries.last() {
            None => layer.declared_input_shape().map(<[usize]>::to_vec),
            Some(prev) => {
                if let (Some(declared), Some(prev_out)) =
                    (layer.declared_input_shape(), prev.output_shape.as_deref())
                {
                    if declared != prev_out {
                        return Err(Error::ShapeMismatch {
                            op: "Sequential.add",
                            lhs: prev_out.to_vec(),
                            rhs: declared.to_vec(),
                            hint: format!(
                                ": {} declares input_shape {declared:?} but '{}' outputs \
                                 {prev_out:?}",
                                layer.class_name(),
                                prev.name
                            ),
                        });
                    }
                }
                prev.output_shape.clone()
            }
        };
        let base = layer.base_name();
        let same_kind = self
            .entries
            .iter()
            .filter(|e| e.layer.base_name() == base)
            .count();
        let name = match same_kind {
            0 => base.to_string(),
            n => format!("{base}_{n}"),
        };
        let output_shape = match &input_shape {
            Some(shape) => {
                let seed = derive_seed(self.seed, self.entries.len() as u64);
                layer.build(shape, seed, device)?;
                Some(layer.compute_output_shape(shape)?)
            }
            None => None,
        };
        let policy = layer
            .dtype_policy()
            .unwrap_or_else(mixed_precision::global_policy);
        self.entries.push(Entry {
            name,
            layer,
            device: device.clone(),
            policy,
            input_shape,
            output_shape,
        });
        let index = self.entries.len() - 1;
        if let Err(e) = self.mirror_layer(index) {
            self.entries.pop();
            if let Some(m) = self.mirrors.as_mut() {
                m.truncate(index);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Copies layer `index`, as it is now, to the other replicas (a no-op without a strategy).
    fn mirror_layer(&mut self, index: usize) -> Result<()> {
        match (self.mirrors.as_mut(), self.entries.get(index)) {
            (Some(m), Some(e)) => m.mirror_layer(index, e.layer.as_ref()),
            _ => Ok(()),
        }
    }

    /// Builds the layers not built yet for examples of `input_shape` (Keras'
    /// `model.build((None, *input_shape))`); needed only when the first layer has no
    /// `input_shape`.
    ///
    /// # Errors
    /// A shape error naming the first layer that cannot take its input.
    pub fn build(&mut self, input_shape: &[usize]) -> Result<()> {
        let mut shape = input_shape.to_vec();
        for (i, e) in self.entries.iter_mut().enumerate() {
            if e.input_shape.as_deref() != Some(&shape[..]) || e.output_shape.is_none() {
                // Unbuilt until every replica has the layer: a failure here (a replica out of
                // memory) leaves it to be built again, not half built.
                e.output_shape = None;
                e.layer
                    .build(&shape, derive_seed(self.seed, i as u64), &e.device)?;
                let output = e.layer.compute_output_shape(&shape)?;
                if let Some(m) = self.mirrors.as_mut() {
                    m.mirror_layer(i, e.layer.as_ref())?;
                }
                e.input_shape = Some(shape.clone());
                e.output_shape = Some(output);
            }
            shape = e.output_shape.clone().unwrap_or_default();
        }
        Ok(())
    }

    /// The input shape of one example, once known.
    pub fn input_shape(&self) -> Option<&[usize]> {
        self.entries.first().and_then(|e| e.input_shape.as_deref())
    }

    /// The output shape of one example, once built.
    pub fn output_shape(&self) -> Option<&[usize]> {
        self.entries.last().and_then(|e| e.output_shape.as_deref())
    }

    fn is_built(&self) -> bool {
        !self.entries.is_empty() && self.entries.iter().all(|e| e.output_shape.is_some())
    }

    pub(super) fn require_built(&self, what: &str) -> Result<()> {
        if self.entries.is_empty() {
            return Err(Error::Model(format!("{what}: the model has no layers")));
        }
        if !self.is_built() {
            return Err(Error::Model(format!(
                "{what}: this model has not yet been built. Build the model first by giving \
                 the first layer an input_shape or by calling build(input_shape)"
            )));
        }
        Ok(())
    }

    /// The layer at `index`.
    pub fn layer(&self, index: usize) -> Option<&dyn Layer> {
        self.entries.get(index).map(|e| e.layer.as_ref())
    }

    /// The device of the layer at `index`.
    pub fn layer_device(&self, index: usize) -> Option<&LogicalDevice> {
        self.entries.get(index).map(|e| &e.device)
    }

    /// The distinct devices the model runs on: in layer order, or its strategy's replicas.
    pub fn devices(&self) -> Vec<LogicalDevice> {
        if let Some(strategy) = self.strategy() {
            return strategy.devices().to_vec();
        }
        distinct_devices(self.entries.iter().map(|e| &e.device))
            .into_iter()
            .cloned()
            .collect()
    }

    /// Total number of weight elements, trainable and not (`model.count_params()`).
    pub fn count_params(&self) -> usize {
        self.entries
            .iter()
            .map(|e| count_params(e.layer.as_ref()))
            .sum()
    }

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
    /// what the next step multiplies its loss by. `None` without loss scaling.
    pub fn loss_scale(&self) -> Option<f32> {
        self.compiled
            .as_ref()
            .and_then(|c| c.optimizer.loss_scale.map(|l| l.scale))
    }

    /// The loss scale and its counter, for checkpoints.
    pub(crate) fn loss_scale_state(&self) -> Option<LossScale> {
        self.compiled.as_ref().and_then(|c| c.optimizer.loss_scale)
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
    /// scaling skipped are not counted).
    pub fn iterations(&self) -> u64 {
        self.compiled.as_ref().map_or(0, |c| c.optimizer.iterations)
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
            opt.iterations = iterations;
            opt.loss_scale = loss_scale;
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

    pub(super) fn compiled(&self, what: &str) -> Result<&Compiled> {
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
    pub(super) fn objective(&self, what: &str) -> Result<Objective> {
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

    pub(super) fn check_batch(
        &self,
        what: &'static str,
        x: &Tensor,
        y: Option<&Tensor>,
    ) -> Result<usize> {
        let input = self.input_shape().unwrap_or(&[]);
        let shape = x.shape();
        if shape.len() != input.len() + 1 || shape[1..] != *input {
            return Err(Error::ShapeMismatch {
                op: "Sequential",
                lhs: shape.to_vec(),
                rhs: input.to_vec(),
                hint: format!(
                    ": {what} expects a batch of shape [batch, {}]",
                    input
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        x.expect_dtype(what, DType::F32)?;
        let n = shape[0];
        if let Some(y) = y {
            self.objective(what)?.check_targets(
                what,
                (y.shape(), y.dtype()),
                n,
                self.output_shape().unwrap_or(&[]),
            )?;
        }
        Ok(n)
    }

    /// The primary replica's layers with their devices (the whole model when not mirrored).
    pub(super) fn stages(&self) -> Vec<Stage<'_>> {
        self.entries
            .iter()
            .map(|e| Stage {
                layer: e.layer.as_ref(),
                device: &e.device,
                dtype: e.policy.compute_dtype_on(&e.device),
            })
            .collect()
    }

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
        let compiled = self.compiled(what)?;
        let objective = self.objective(what)?;
        // Gradients handed to the caller are the loss's own, unscaled.
        let factor = if update {
            compiled.optimizer.loss_factor()
        } else {
            1.0
        };
        let n = self.check_batch(what, x, Some(y))?;
        // An empty batch has no micro-batches to pipeline; the serial pass answers for it.
        let (part, grads) = match self.pipeline.filter(|_| n > 0) {
            Some(p) => {
                let out = self.pipelined(p, Examples::Device { x, y }, (&objective, factor))?;
                (out.part, out.grads)
            }
            None => self.serial_gradients(x, y, (&objective, factor))?,
        };
        if update {
            self.apply_layer_gradients(&grads)?;
        }
        let out = StepOutput::new(vec![part], n).named(objective.metric_names());
        Ok((out, grads.into_iter().flatten().collect()))
    }

    /// Forward, loss and backward of the whole batch, layer after layer.
    /// `(objective, factor)`: the loss and metrics, and the factor of the loss gradient (the
    /// loss scale).
    fn serial_gradients(
        &self,
        x: &Tensor,
        y: &Tensor,
        (objective, factor): (&Objective, f32),
    ) -> Result<(StepPart, Vec<Vec<Tensor>>)> {
        let stages = self.stages();
        let last = stages[stages.len() - 1].device;
        let (logits, saved) = pass::forward(&stages, x, true)?;
        let terms = pass::loss_terms(last, &logits, y, objective, factor)?;
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

    /// The pipelined forward, loss and backward (see [`Pipeline`]); keeps the stages' figures.
    fn pipelined(
        &mut self,
        p: Pipeline,
        examples: Examples<'_>,
        loss: (&Objective, f32),
    ) -> Result<PipelineGradients> {
        let out = pipeline::gradients(p, &self.stages(), examples, loss)?;
        self.pipeline_stats.clone_from(&out.stats);
        Ok(out)
    }

    /// Trains with micro-batches pipelined through the model's stages (see [`Pipeline`]) from
    /// the next step on; `None` goes back to the serial step. Only training steps are
    /// pipelined (`fit`, [`train_step`](Sequential::train_step),
    /// [`loss_and_gradients`](Sequential::loss_and_gradients)); `evaluate` and `predict` run
    /// each batch through the layers in turn.
    ///
    /// ```
    /// use anygpu::nn::{Dense, Pipeline, Sequential};
    /// let mut model = Sequential::new();
    /// model.add(Dense::new(2).input_shape(&[3]))?;
    /// model.set_pipeline(Pipeline::gpipe(4))?;
    /// assert_eq!(model.pipeline(), Some(Pipeline::gpipe(4)));
    /// assert!(model.set_pipeline(Pipeline::gpipe(0)).is_err());
    /// model.set_pipeline(None)?;
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 micro-batches, or for a model created under a
    /// [`MirroredStrategy`] (its replicas each hold the whole model: there is nothing to
    /// pipeline). The setting is unchanged on error.
    pub fn set_pipeline(&mut self, pipeline: impl Into<Option<Pipeline>>) -> Result<()> {
        let pipeline = pipeline.into();
        if let Some(p) = &pipeline {
            p.validate()?;
            if let Some(strategy) = self.strategy() {
                return Err(Error::InvalidArgument(format!(
                    "set_pipeline: this model is mirrored by a MirroredStrategy over {:?}, which \
                     runs the whole model on every replica; pipelining needs a model split over \
                     devices",
                    strategy
                        .devices()
                        .iter()
                        .map(|d| d.name())
                        .collect::<Vec<_>>()
                )));
            }
        }
        self.pipeline = pipeline;
        Ok(())
    }

    /// The pipeline training steps use, if any ([`set_pipeline`](Sequential::set_pipeline)).
    pub fn pipeline(&self) -> Option<Pipeline> {
        self.pipeline
    }

    /// What each stage did in the last pipelined step, first stage first (empty before one):
    /// its layers, device, and host time busy and waiting. The stages' busy times show their
    /// imbalance; the waits, the bubble.
    pub fn pipeline_stats(&self) -> &[StageStats] {
        &self.pipeline_stats
    }

    /// The optimizer step from every layer's gradients: the slots are allocated first (the only
    /// allocation of an update), then every weight is updated in place and the step counted.
    /// Under loss scaling the gradients are checked and unscaled first; a step whose gradients
    /// are not all finite updates nothing and only moves the scale.
    fn apply_layer_gradients(&mut self, grads: &[Vec<Tensor>]) -> Result<()> {
        let compiled = self
            .compiled
            .as_mut()
            .ok_or_else(|| Error::Model("fit: the model is not compiled".into()))?;
        let Some(grads) = compiled.optimizer.unscaled(grads)? else {
            compiled.optimizer.finish_step(false);
            return Ok(());
        };
        // Clipped after unscaling and after the pipeline's per-layer sums, as Keras clips.
        let grads = compiled.optimizer.clipped(&grads)?;
        let layer_weights: Vec<Vec<&Tensor>> = self
            .entries
            .iter()
            .map(|e| e.layer.weights().into_iter().map(|(_, t)| t).collect())
            .collect();
        for (i, weights) in layer_weights.iter().enumerate() {
            compiled.optimizer.ensure_slots(i, weights)?;
        }
        debug_assert_eq!(grads.len(), layer_weights.len(), "gradients of every layer");
        for (i, (weights, g)) in layer_weights.iter().zip(&grads).enumerate() {
            compiled.optimizer.apply(i, weights, g)?;
        }
        compiled.optimizer.finish_step(true);
        Ok(())
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
    pub(super) fn train_batch(&mut self, batch: &Batch) -> Result<StepOutput> {
        if self.mirrors.is_some() {
            self.joined(self.check_host_batch("fit", batch))?;
            return self.mirrored_step(HostBatch::from(batch));
        }
        if let (Some(p), false) = (self.pipeline, batch.batch_size() == 0) {
            // Each micro-batch goes from the host straight to its stage's device.
            self.require_built("fit")?;
            let factor = self.compiled("fit")?.optimizer.loss_factor();
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

    /// Checks a host batch's shape as [`check_batch`](Sequential::check_batch) does a tensor's.
    pub(super) fn check_host_batch(&self, what: &'static str, batch: &Batch) -> Result<()> {
        let input = self.input_shape().unwrap_or(&[]);
        let shape = &batch.x_shape;
        if shape.len() != input.len() + 1 {
            return Err(Error::InvalidArgument(format!(
                "{what}: the dataset yields elements of shape {shape:?}, not batches of examples \
                 of shape {input:?}; call .batch(batch_size) on it"
            )));
        }
        if shape[1..] != *input || batch.batch_size() != shape[0] {
            return Err(Error::ShapeMismatch {
                op: "Sequential",
                lhs: shape.clone(),
                rhs: input.to_vec(),
                hint: format!(
                    ": {what} expects batches of shape [batch, {input:?}] with one target per \
                     example, got {}",
                    batch.batch_size()
                ),
            });
        }
        let (target_shape, dtype) = match batch.has_float_targets() {
            true => {
                let mut t = vec![shape[0]];
                t.extend_from_slice(&batch.target_shape);
                (t, DType::F32)
            }
            false => (vec![shape[0]], DType::I32),
        };
        self.objective(what)?.check_targets(
            what,
            (&target_shape, dtype),
            shape[0],
            self.output_shape().unwrap_or(&[]),
        )
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

    /// Waits until every device of the model has finished its work (for timing).
    ///
    /// # Errors
    /// A device error.
    pub fn synchronize(&self) -> Result<()> {
        for d in self.devices() {
            d.synchronize()?;
        }
        Ok(())
    }

    pub(super) fn batch_tensors(&self, what: &str, batch: &Batch) -> Result<(Tensor, Tensor)> {
        let input = self.input_shape().unwrap_or(&[]);
        if batch.x_shape.len() != input.len() + 1 {
            return Err(Error::InvalidArgument(format!(
                "{what}: the dataset yields elements of shape {:?}, not batches of examples of \
                 shape {input:?}; call .batch(batch_size) on it",
                batch.x_shape
            )));
        }
        let first = &self.entries[0].device;
        let last = &self.entries[self.entries.len() - 1].device;
        let x = Tensor::from_slice_on(&batch.x, &batch.x_shape, first)?;
        let y = HostBatch::from(batch).labels(0..batch.batch_size(), last)?;
        Ok((x, y))
    }

    /// The model's output for a batch `x` of shape `[batch, ...input_shape]`
    /// (`model.predict(x)`): class probabilities when the last layer has a softmax, else its
    /// output. The result is on the last layer's device.
    ///
    /// ```
    /// use anygpu::nn::{Activation, Dense, Sequential};
    /// use anygpu::Tensor;
    /// let mut model = Sequential::new();
    /// model.add(Dense::new(10).activation(Activation::Softmax).input_shape(&[4]))?;
    /// let probs = model.predict(&Tensor::from_vec(vec![0.1f32; 8], &[2, 4])?)?;
    /// assert_eq!(probs.shape(), &[2, 10]);
    /// let first_row: f32 = probs.to_vec::<f32>()?[..10].iter().sum();
    /// assert!((first_row - 1.0).abs() < 1e-5);
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Model`] when the model is not built; a shape error for a batch of another
    /// shape.
    pub fn predict(&self, x: &Tensor) -> Result<Tensor> {
        self.require_built("predict")?;
        self.check_batch("predict", x, None)?;
        let out = match self.strategy() {
            Some(strategy) => mirrored::predict(
                strategy,
                &self.replica_layers(),
                &x.to_vec::<f32>()?,
                x.shape(),
                self.output_shape().unwrap_or(&[]),
            )?,
            None => pass::forward(&self.stages(), x, false)?.0,
        };
        let last = &self.entries[self.entries.len() - 1];
        let _scope = out.device_handle().scope();
        match last.layer.activation() {
            Activation::Softmax => ops::softmax(&out),
            _ => Ok(out),
        }
    }

    /// Every weight in layer order, each layer's in Keras' order (`model.weights`): its
    /// trainable weights, then its non-trainable ones (a `BatchNormalization`'s moving
    /// statistics), which [`get_weights`](Sequential::get_weights),
    /// [`set_weights`](Sequential::set_weights), weight files and checkpoints include too.
    ///
    /// Under a [`MirroredStrategy`] these are the primary replica's tensors: change a mirrored
    /// model's weights with [`set_weights`](Sequential::set_weights) or
    /// [`load_weights`](Sequential::load_weights), which reach every replica, not with
    /// [`Tensor::assign`] on these.
    pub fn weights(&self) -> Vec<&Tensor> {
        self.entries
            .iter()
            .flat_map(|e| variables(e.layer.as_ref()).into_iter().map(|(_, t)| t))
            .collect()
    }

    /// The weights the optimizer trains (`model.trainable_weights`), in layer order: what
    /// [`loss_and_gradients`](Sequential::loss_and_gradients) gives gradients for.
    /// [`weights`](Sequential::weights) adds each layer's non-trainable ones after its
    /// trainable ones (a `BatchNormalization`'s moving statistics).
    pub fn trainable_weights(&self) -> Vec<&Tensor> {
        self.entries
            .iter()
            .flat_map(|e| e.layer.weights().into_iter().map(|(_, t)| t))
            .collect()
    }

    /// Number of non-trainable weight elements (the summary's "Non-trainable params").
    pub fn count_non_trainable_params(&self) -> usize {
        self.entries
            .iter()
            .map(|e| crate::nn::layers::count_non_trainable(e.layer.as_ref()))
            .sum()
    }

    /// Weights with their names, `layer_name/weight_name` (`conv2d/kernel`,
    /// `batch_normalization/moving_mean`, ...), in [`weights`](Sequential::weights) order.
    pub fn named_weights(&self) -> Vec<(String, &Tensor)> {
        self.entries
            .iter()
            .flat_map(|e| {
                variables(e.layer.as_ref())
                    .into_iter()
                    .map(move |(n, t)| (format!("{}/{n}", e.name), t))
            })
            .collect()
    }

    /// Host copies of every weight (`model.get_weights()`), in [`weights`](Sequential::weights)
    /// order.
    ///
    /// ```
    /// use anygpu::nn::{Dense, Sequential};
    /// let mut model = Sequential::new();
    /// model.add(Dense::new(2).input_shape(&[3]))?;
    /// let weights = model.get_weights()?;
    /// assert_eq!(weights.iter().map(Vec::len).collect::<Vec<_>>(), [6, 2]); // kernel, bias
    /// model.set_weights(&[vec![1.0; 6], vec![0.5; 2]])?;
    /// assert!(model.set_weights(&[vec![1.0; 6]]).is_err());
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// A device error.
    pub fn get_weights(&self) -> Result<Vec<Vec<f32>>> {
        self.weights().iter().map(|t| t.to_vec::<f32>()).collect()
    }

    /// Replaces every weight (`model.set_weights(...)`), in
    /// [`weights`](Sequential::weights) order, on each layer's device.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a wrong number of arrays, a shape error for an array of
    /// the wrong length; the model is unchanged on error.
    pub fn set_weights(&mut self, values: &[Vec<f32>]) -> Result<()> {
        let named = self.named_weights();
        if values.len() != named.len() {
            return Err(Error::InvalidArgument(format!(
                "set_weights: you called set_weights with a list of {} arrays, but the model \
                 expects {}",
                values.len(),
                named.len()
            )));
        }
        for ((name, t), v) in named.iter().zip(values) {
            if v.len() != t.len() {
                return Err(Error::ShapeMismatch {
                    op: "set_weights",
                    lhs: t.shape().to_vec(),
                    rhs: vec![v.len()],
                    hint: format!(": '{name}' needs {} values, got {}", t.len(), v.len()),
                });
            }
        }
        self.write_weights(values)
    }

    /// Writes checked values (in [`weights`](Sequential::weights) order) into every weight of
    /// every replica, in place: nothing is allocated, so no replica can be left behind for
    /// want of memory.
    pub(crate) fn write_weights(&self, values: &[Vec<f32>]) -> Result<()> {
        for replica in self.replica_layers() {
            let weights = replica
                .layers
                .iter()
                .flat_map(|l| variables(*l).into_iter().map(|(_, t)| t));
            for (t, v) in weights.zip(values) {
                t.write_words(bytemuck::cast_slice(v))?;
            }
        }
        Ok(())
    }

    /// Saves every weight to a safetensors file (`model.save_weights(path)`), named
    /// `layer_name/weight_name`, f32, with their shapes.
    ///
    /// ```
    /// use anygpu::nn::{Dense, Sequential};
    /// let path = std::env::temp_dir().join(format!("anygpu-doc-{}.safetensors", std::process::id()));
    /// let mut a = Sequential::with_seed(1);
    /// a.add(Dense::new(2).input_shape(&[3]))?;
    /// a.save_weights(&path)?;
    /// let mut b = Sequential::with_seed(2);
    /// b.add(Dense::new(2).input_shape(&[3]))?;
    /// b.load_weights(&path)?;
    /// assert_eq!(a.get_weights()?, b.get_weights()?);
    /// let mut wider = Sequential::new();
    /// wider.add(Dense::new(5).input_shape(&[3]))?;
    /// assert!(wider.load_weights(&path).unwrap_err().to_string().contains("dense/kernel"));
    /// # std::fs::remove_file(&path).ok();
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be written; device errors.
    pub fn save_weights(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        weights::save(&self.named_weights(), &self.name, path.as_ref())
    }

    /// Loads weights saved by [`save_weights`](Sequential::save_weights) into this model
    /// (`model.load_weights(path)`), onto each layer's device. Every weight of the model must
    /// be in the file with the same shape; nothing is changed unless all are.
    ///
    /// # Errors
    /// [`Error::Io`] for an unreadable file; [`Error::Model`] for a malformed file, a missing or
    /// extra weight, a dtype other than f32, or a shape mismatch (naming the weight and both
    /// shapes).
    pub fn load_weights(&mut self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let staged = weights::load(path.as_ref(), &self.weight_layout())?;
        // In place, on every replica of a mirrored model.
        self.write_weights(&staged)
    }

    /// The metrics given to `compile` (empty before).
    pub(super) fn compiled_metrics(&self) -> &[Metric] {
        self.compiled.as_ref().map_or(&[], |c| &c.metrics)
    }

    /// Every weight's name and shape, in [`weights`](Sequential::weights) order.
    pub(crate) fn weight_layout(&self) -> Vec<(String, Vec<usize>)> {
        self.named_weights()
            .into_iter()
            .map(|(n, t)| (n, t.shape().to_vec()))
            .collect()
    }
}
