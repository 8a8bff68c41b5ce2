//! Losses (`model.compile(loss=...)`).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// A loss for [`crate::nn::Sequential::compile`], reduced as Keras' default
/// (`sum_over_batch_size`: the mean over the examples, and over the positions of an output of
/// rank above 2).
///
/// ```
/// use anygpu::nn::Loss;
/// let loss: Loss = "sparse_categorical_crossentropy".parse()?;
/// assert_eq!(loss, Loss::SparseCategoricalCrossentropy { from_logits: false });
/// assert_eq!("mse".parse::<Loss>()?, Loss::MeanSquaredError);
/// assert_eq!(Loss::categorical_crossentropy().name(), "categorical_crossentropy");
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// ## Targets
///
/// The sparse cross-entropy takes int32 class indices (`[batch]`); every other loss takes
/// float32 targets shaped like the model's output (`[batch, classes]` one-hot for the
/// categorical cross-entropy, `[batch, units]` otherwise; `[batch]` against an output of one
/// unit). See [`Dataset::from_tensor_slices_with_targets`](crate::data::Dataset::from_tensor_slices_with_targets).
///
/// ## The last layer's softmax or sigmoid
///
/// Keras 3 on TensorFlow keeps the logits on the output of a `softmax` activation and its
/// cross-entropies use them. Here the last layer's `softmax` is folded into the loss the same
/// way: `from_logits: false` with a final softmax computes the fused, stable cross-entropy on the
/// logits. A `sigmoid` layer applies its activation (it may sit anywhere in a model), so a binary
/// cross-entropy after it takes Keras' formula on probabilities (clipped to
/// `[1e-7, 1 − 1e-7]`), as after any other last layer; Keras' logits form differs from it only
/// where the probabilities saturate (|logit| above ~16). `from_logits: true` needs a last layer
/// without softmax or sigmoid. The regression losses see the activated output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Loss {
    /// `keras.losses.SparseCategoricalCrossentropy(from_logits)`: integer labels, mean over
    /// the batch.
    ///
    /// With `from_logits: false` (Keras' `"sparse_categorical_crossentropy"`) the model must end
    /// in a `softmax` layer; training then folds that softmax into the loss and computes the
    /// cross-entropy on the logits, fused and numerically stable, as Keras does when it can
    /// see the softmax. With `from_logits: true` the last layer must be linear, and its outputs
    /// are the logits.
    SparseCategoricalCrossentropy {
        /// Whether the model outputs logits rather than probabilities.
        from_logits: bool,
    },
    /// `keras.losses.CategoricalCrossentropy(from_logits, label_smoothing)`: float one-hot
    /// (or soft) targets `[batch, classes]`, `−Σ y log p` per example. Label smoothing replaces
    /// the targets by `y (1 − ls) + ls / classes`.
    CategoricalCrossentropy {
        /// Whether the model outputs logits rather than probabilities.
        from_logits: bool,
        /// Keras' `label_smoothing`, in `[0, 1]`.
        label_smoothing: f32,
    },
    /// `keras.losses.BinaryCrossentropy(from_logits, label_smoothing)`: float targets in
    /// `[0, 1]` shaped like the output, the mean over the last axis of
    /// `−(y log p + (1 − y) log(1 − p))`. Label smoothing: `y (1 − ls) + ls / 2`.
    BinaryCrossentropy {
        /// Whether the model outputs logits rather than probabilities.
        from_logits: bool,
        /// Keras' `label_smoothing`, in `[0, 1]`.
        label_smoothing: f32,
    },
    /// `keras.losses.MeanSquaredError()`: the mean over the last axis of `(y − o)²`.
    MeanSquaredError,
    /// `keras.losses.MeanAbsoluteError()`: the mean over the last axis of `|y − o|`.
    MeanAbsoluteError,
}

impl Loss {
    /// `"sparse_categorical_crossentropy"` (`from_logits=False`).
    pub const fn sparse_categorical_crossentropy() -> Loss {
        Loss::SparseCategoricalCrossentropy { from_logits: false }
    }

    /// `"categorical_crossentropy"` (`from_logits=False`, no label smoothing).
    pub const fn categorical_crossentropy() -> Loss {
        Loss::CategoricalCrossentropy {
            from_logits: false,
            label_smoothing: 0.0,
        }
    }

    /// `"binary_crossentropy"` (`from_logits=False`, no label smoothing).
    pub const fn binary_crossentropy() -> Loss {
        Loss::BinaryCrossentropy {
            from_logits: false,
            label_smoothing: 0.0,
        }
    }

    /// Keras' name, as `compile(loss=...)` takes it.
    pub fn name(&self) -> &'static str {
        match self {
            Loss::SparseCategoricalCrossentropy { .. } => "sparse_categorical_crossentropy",
            Loss::CategoricalCrossentropy { .. } => "categorical_crossentropy",
            Loss::BinaryCrossentropy { .. } => "binary_crossentropy",
            Loss::MeanSquaredError => "mean_squared_error",
            Loss::MeanAbsoluteError => "mean_absolute_error",
        }
    }

    /// Whether the loss takes int32 class indices (else float32 targets like the output).
    pub fn takes_labels(&self) -> bool {
        matches!(self, Loss::SparseCategoricalCrossentropy { .. })
    }

    /// `from_logits`, for the cross-entropies.
    pub(crate) fn logits_flag(&self) -> Option<bool> {
        match *self {
            Loss::SparseCategoricalCrossentropy { from_logits }
            | Loss::CategoricalCrossentropy { from_logits, .. }
            | Loss::BinaryCrossentropy { from_logits, .. } => Some(from_logits),
            Loss::MeanSquaredError | Loss::MeanAbsoluteError => None,
        }
    }

    /// Checks the hyper-parameters (label smoothing in `[0, 1]`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the loss and the value.
    pub(crate) fn validate(&self) -> Result<()> {
        match *self {
            Loss::CategoricalCrossentropy {
                label_smoothing, ..
            }
            | Loss::BinaryCrossentropy {
                label_smoothing, ..
            } if !(0.0..=1.0).contains(&label_smoothing) => Err(Error::InvalidArgument(format!(
                "{}: label_smoothing must be in [0, 1], got {label_smoothing}",
                self.name()
            ))),
            _ => Ok(()),
        }
    }
}

impl Default for Loss {
    fn default() -> Self {
        Loss::sparse_categorical_crossentropy()
    }
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Loss {
    type Err = Error;

    /// Keras' identifiers: `"sparse_categorical_crossentropy"`, `"categorical_crossentropy"`,
    /// `"binary_crossentropy"`, `"mean_squared_error"` (`"mse"`), `"mean_absolute_error"`
    /// (`"mae"`), with their defaults (`from_logits=False`, no label smoothing).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for any other name.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "sparse_categorical_crossentropy" => Ok(Loss::sparse_categorical_crossentropy()),
            "categorical_crossentropy" => Ok(Loss::categorical_crossentropy()),
            "binary_crossentropy" => Ok(Loss::binary_crossentropy()),
            "mean_squared_error" | "mse" | "MSE" => Ok(Loss::MeanSquaredError),
            "mean_absolute_error" | "mae" | "MAE" => Ok(Loss::MeanAbsoluteError),
            other => Err(Error::InvalidArgument(format!(
                "Could not interpret loss identifier: '{other}'; supported: \
                 sparse_categorical_crossentropy, categorical_crossentropy, \
                 binary_crossentropy, mean_squared_error (mse), mean_absolute_error (mae)"
            ))),
        }
    }
}
