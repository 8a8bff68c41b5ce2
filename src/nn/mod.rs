//! Keras-like training: layers, [`Sequential`], losses, optimizers, metrics and [`History`].
//!
//! The names and defaults are Keras' (`keras.layers.Conv2D`, `model.compile`, `model.fit`,
//! `glorot_uniform` kernels and zero biases, SGD at `learning_rate=0.01`, Adam's `1e-3, 0.9,
//! 0.999, 1e-7`), and so is the arithmetic. What is ours is placement: every layer runs on the
//! device it was added on — inside a device scope, or named with [`Sequential::add_on`] — and
//! keeps its weights and optimizer state there, so one model can be split over several GPUs
//! (physical, or virtual ones cut from one GPU) and train exactly as on one device.
//!
//! ```
//! use anygpu::nn::{self, Adam, Loss, Metric, Verbosity};
//! use anygpu::{data::Dataset, Runtime};
//!
//! let rt = Runtime::builder().virtual_cpus(3).build()?;
//! let cpus = rt.list_logical_devices("CPU")?;
//! // The GPU guide's Fashion-MNIST CNN, its three blocks on three devices.
//! let mut model = nn::tutorial_cnn(42, &cpus)?;
//! assert_eq!(model.count_params(), 184_234);
//! println!("{}", model.summary());
//! model.compile(Loss::sparse_categorical_crossentropy(), Adam::default(), &[Metric::Accuracy])?;
//! model.set_verbose(Verbosity::Silent);
//!
//! let x = vec![0.5f32; 4 * 28 * 28];
//! let data = Dataset::from_tensor_slices(x, &[28, 28, 1], vec![0, 1, 2, 3])?.batch(4, false);
//! let history = model.fit(&data, 1, None, None)?;
//! assert!(history.loss[0].is_finite());
//! # Ok::<(), anygpu::Error>(())
//! ```
//!
//! ## Differences from Keras
//!
//! * Layer names are numbered per model (`dense`, `dense_1` in every new model), not per
//!   process, so summaries and weight files are reproducible.
//! * A `softmax` activation is allowed on the last layer only; training folds it into the
//!   loss (see [`Activation::Softmax`]).
//! * The random stream behind the initializers is SplitMix64, so a seed gives other (equally
//!   distributed) weights than in TensorFlow.

mod activation;
mod activation_layers;
mod autocast;
mod callbacks;
mod checkpoint;
mod conv_args;
mod depthwise;
mod event_file;
mod fit;
mod history;
mod init;
mod layer_config;
mod layers;
mod loss;
mod metrics;
mod mirrored;
mod model_config;
mod monitor;
#[cfg(feature = "mpi")]
mod multi_worker;
mod normalization;
mod objective;
mod optimizer;
mod pass;
mod pipeline;
mod pooling;
mod replica_group;
mod saved_model;
mod schedules;
mod sequential;
mod step_output;
mod summary;
mod tensorboard;
mod verbosity;
mod weights;

pub use crate::atomic_file::write_atomically;
pub use activation::Activation;
pub use activation_layers::{ActivationLayer, ReLU};
pub use callbacks::{BatchLogs, Callback, CsvLogger, FitContext, ModelCheckpoint};
pub use checkpoint::BackupAndRestore;
pub use depthwise::DepthwiseConv2D;
pub use history::{Evaluation, History};
pub use layers::{
    BackwardPlan, Conv2D, DeferredNormalization, Dense, Flatten, FusedGrads, Layer, MaxPool2D,
    SeparableConv2D, StemConv,
};
pub use loss::Loss;
pub use metrics::Metric;
// ---- saved model ----
pub use model_config::layer_from_config;
pub use saved_model::load_model;
// ----
pub use monitor::{EarlyStopping, LearningRateScheduler, MonitorMode, ReduceLROnPlateau};
pub use normalization::{BatchNormalization, Dropout};
pub use optimizer::{Adam, AdamW, BaseOptions, LossScaleOptimizer, Optimizer, RmsProp, Sgd};
pub use pipeline::{Pipeline, Schedule, StageStats};
pub use pooling::{AveragePooling2D, GlobalAveragePooling2D, GlobalMaxPooling2D};
pub use schedules::{CosineDecay, ExponentialDecay, LearningRateSchedule, PiecewiseConstantDecay};
pub use sequential::Sequential;
pub use step_output::StepOutput;
pub use summary::LayerInfo;
pub use tensorboard::TensorBoard;
pub use verbosity::Verbosity;

use crate::device::LogicalDevice;
use crate::error::Result;
use crate::ops::spec::Padding;

/// The CNN of TensorFlow's GPU guide / the Fashion-MNIST tutorial, built with `seed`:
///
/// ```text
/// Conv2D(32, 3, same, selu, input 28×28×1)
/// SeparableConv2D(32, 3, same, selu) → MaxPool2D                       block 1
/// SeparableConv2D(64, 3, same, selu) ×2 → MaxPool2D                    block 1
/// SeparableConv2D(128, 3, same, selu) ×2 → MaxPool2D (7 → 3)           block 2
/// Flatten (1152) → Dense(128, selu) → Dense(10, softmax)               block 3
/// ```
///
/// 184,234 parameters. Placement, as the tutorial splits it: with no `devices`, every layer on
/// the current scope's device; otherwise the convolution blocks up to the 64-filter pool on
/// `devices[0]`, the 128-filter block on `devices[1]`, the dense layers on `devices[2]`,
/// wrapping around when fewer devices are given (two devices: the dense layers back on the
/// first).
///
/// ```
/// let model = anygpu::nn::tutorial_cnn(0, &[])?;
/// assert_eq!(model.len(), 12);
/// assert_eq!(model.output_shape(), Some(&[10][..]));
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// The devices' out-of-memory errors.
pub fn tutorial_cnn(seed: u64, devices: &[LogicalDevice]) -> Result<Sequential> {
    let mut model = Sequential::with_seed(seed);
    // Without devices, resolve the current scope once, as `add` would (under a strategy, its
    // primary replica: the layers are mirrored from there).
    let scoped;
    let devices = if devices.is_empty() {
        scoped = [match model.strategy() {
            Some(strategy) => strategy.devices()[0].clone(),
            None => crate::tensor::Tensor::zeros(&[1])?.device_handle().clone(),
        }];
        &scoped[..]
    } else {
        devices
    };
    for (block, layer) in tutorial_layers() {
        model.add_boxed(&devices[block % devices.len()], layer)?;
    }
    Ok(model)
}

/// [`tutorial_cnn`] with layer `i` on `layer_devices[i]`, for splits other than the
/// tutorial's (a pipeline balances its stages by where it cuts).
///
/// ```
/// let cpu = anygpu::Runtime::builder().build()?.cpu()?;
/// let model = anygpu::nn::tutorial_cnn_on(0, &vec![cpu; 12])?;
/// assert_eq!(model.count_params(), 184_234);
/// assert!(anygpu::nn::tutorial_cnn_on(0, &[]).is_err());
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) unless there are 12 devices; the
/// devices' out-of-memory errors.
pub fn tutorial_cnn_on(seed: u64, layer_devices: &[LogicalDevice]) -> Result<Sequential> {
    let layers = tutorial_layers();
    if layer_devices.len() != layers.len() {
        return Err(crate::Error::InvalidArgument(format!(
            "tutorial_cnn_on: the tutorial CNN has {} layers, got {} devices",
            layers.len(),
            layer_devices.len()
        )));
    }
    let mut model = Sequential::with_seed(seed);
    for ((_, layer), device) in layers.into_iter().zip(layer_devices) {
        model.add_boxed(device, layer)?;
    }
    Ok(model)
}

/// The tutorial CNN's layers, each with its block (0, 1 or 2).
fn tutorial_layers() -> Vec<(usize, Box<dyn Layer>)> {
    let selu = Activation::Selu;
    let sep = |filters| {
        SeparableConv2D::new(filters, 3)
            .padding(Padding::Same)
            .activation(selu)
    };
    vec![
        (
            0,
            Box::new(
                Conv2D::new(32, 3)
                    .padding(Padding::Same)
                    .activation(selu)
                    .input_shape(&[28, 28, 1]),
            ),
        ),
        (0, Box::new(sep(32))),
        (0, Box::new(MaxPool2D::new())),
        (0, Box::new(sep(64))),
        (0, Box::new(sep(64))),
        (0, Box::new(MaxPool2D::new())),
        (1, Box::new(sep(128))),
        (1, Box::new(sep(128))),
        (1, Box::new(MaxPool2D::new())),
        (2, Box::new(Flatten::new())),
        (2, Box::new(Dense::new(128).activation(selu))),
        (2, Box::new(Dense::new(10).activation(Activation::Softmax))),
    ]
}
