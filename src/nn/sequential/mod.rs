//! `keras.Sequential`: a stack of layers, each on its own device, trained with `fit`.
//!
//! One file per concept beside this one, each an `impl Sequential` block: `stack.rs` (add, build,
//! shapes, devices), `compile.rs` (loss, metrics, optimizer state), `batches.rs` (batch checks),
//! `step.rs` (the training step and its update), `pipelining.rs`, `predict.rs`, `replicas.rs`
//! (the layers as passes see them) and `weights.rs`; here the model, its entries and its
//! settings.

use std::fmt;

use crate::device::LogicalDevice;
use crate::distribute::{self, MirroredStrategy};
use crate::mixed_precision::Policy;
use crate::nn::history::History;
use crate::nn::layers::Layer;
use crate::nn::loss::Loss;
use crate::nn::metrics::Metric;
use crate::nn::mirrored::Mirrors;
use crate::nn::optimizer::OptimizerState;
use crate::nn::pipeline::{Pipeline, StageStats};
use crate::nn::verbosity::Verbosity;

mod batches;
mod compile;
mod pipelining;
mod predict;
mod replicas;
mod stack;
mod step;
mod weights;

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
/// ([`Tensor::to_device`](crate::Tensor::to_device)), so a model split over GPUs trains like one
/// on a single device.
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

    // ---- steps_per_execution ----
    /// Keras' `steps_per_execution` (a `compile` argument there): the steps between two host
    /// reads of the logs, the same setting as [`set_log_every`](Sequential::set_log_every).
    ///
    /// Differences from Keras: Keras runs that many steps in one compiled call and calls the
    /// batch callbacks once per call; here every step is recorded as it comes and none waits
    /// for the device, so the setting only decides how often the host waits to read the loss
    /// and metrics (and moves the progress bar). A callback with a batch interval of its own
    /// is still called at that interval (and the logs read for it).
    ///
    /// ```
    /// let mut model = anygpu::nn::Sequential::new();
    /// model.set_steps_per_execution(32);
    /// assert_eq!(model.steps_per_execution(), 32);
    /// ```
    pub fn set_steps_per_execution(&mut self, steps: usize) {
        self.set_log_every(steps);
    }

    /// The steps between two host reads of the logs: [`set_steps_per_execution`] and
    /// [`set_log_every`] set it (default 10).
    ///
    /// [`set_steps_per_execution`]: Sequential::set_steps_per_execution
    /// [`set_log_every`]: Sequential::set_log_every
    pub fn steps_per_execution(&self) -> usize {
        self.log_every
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the model has no layers.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
