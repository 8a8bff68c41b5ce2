//! Metrics (`model.compile(metrics=[...])`).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// A metric for [`crate::nn::Sequential::compile`], reported in the history and the progress
/// lines under Keras' name.
///
/// The loss is always reported; metrics add to it.
///
/// ```
/// use anygpu::nn::Metric;
/// assert_eq!("accuracy".parse::<Metric>()?, Metric::Accuracy);
/// let top5: Metric = "sparse_top_k_categorical_accuracy".parse()?;
/// assert_eq!(top5, Metric::SparseTopKCategoricalAccuracy { k: 5 });
/// assert_eq!(Metric::BinaryAccuracy { threshold: 0.5 }.name(), "binary_accuracy");
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Metric {
    /// `"accuracy"`: Keras resolves it by the targets and the output: with integer labels to
    /// `sparse_categorical_accuracy` (the arg max is the label), with an output of one unit to
    /// `binary_accuracy` (threshold 0.5), else to `categorical_accuracy`. Reported as
    /// `accuracy`.
    Accuracy,
    /// `keras.metrics.SparseTopKCategoricalAccuracy(k)`: the integer label is among the `k`
    /// highest outputs, with TensorFlow's `in_top_k` semantics (classes tied with the `k`-th
    /// highest count as in; a label out of range or a non-finite output never does).
    SparseTopKCategoricalAccuracy {
        /// How many of the highest outputs count (Keras' default 5).
        k: usize,
    },
    /// `keras.metrics.CategoricalAccuracy()`: the output's arg max is the one-hot target's.
    CategoricalAccuracy,
    /// `keras.metrics.BinaryAccuracy(threshold)`: the mean over the last axis of
    /// `[output > threshold] == target`.
    BinaryAccuracy {
        /// Keras' default 0.5.
        threshold: f32,
    },
    /// `keras.metrics.MeanSquaredError()`: the mean over the last axis of `(y − o)²`.
    MeanSquaredError,
}

impl Metric {
    /// Keras' name as it appears in the logs and the history.
    pub fn name(&self) -> &'static str {
        match self {
            Metric::Accuracy => "accuracy",
            Metric::SparseTopKCategoricalAccuracy { .. } => "sparse_top_k_categorical_accuracy",
            Metric::CategoricalAccuracy => "categorical_accuracy",
            Metric::BinaryAccuracy { .. } => "binary_accuracy",
            Metric::MeanSquaredError => "mean_squared_error",
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Metric {
    type Err = Error;

    /// `"accuracy"` (`"acc"`, `"sparse_categorical_accuracy"`),
    /// `"sparse_top_k_categorical_accuracy"` (k = 5), `"categorical_accuracy"`,
    /// `"binary_accuracy"` (threshold 0.5), `"mean_squared_error"` (`"mse"`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for any other name.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "accuracy" | "acc" | "sparse_categorical_accuracy" => Ok(Metric::Accuracy),
            "sparse_top_k_categorical_accuracy" => {
                Ok(Metric::SparseTopKCategoricalAccuracy { k: 5 })
            }
            "categorical_accuracy" => Ok(Metric::CategoricalAccuracy),
            "binary_accuracy" => Ok(Metric::BinaryAccuracy { threshold: 0.5 }),
            "mean_squared_error" | "mse" => Ok(Metric::MeanSquaredError),
            other => Err(Error::InvalidArgument(format!(
                "Unknown metric function: '{other}'; supported: accuracy, \
                 sparse_top_k_categorical_accuracy, categorical_accuracy, binary_accuracy, \
                 mean_squared_error"
            ))),
        }
    }
}
