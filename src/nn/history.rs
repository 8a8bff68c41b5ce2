//! What [`crate::nn::Sequential::fit`] returns: Keras' `History`.

use std::collections::BTreeMap;

/// Per-epoch logs of a [`crate::nn::Sequential::fit`] run (Keras' `History.history`).
///
/// Every vector has one entry per epoch; `accuracy` and `val_accuracy` are empty when the model
/// was compiled without the `accuracy` metric, and the `val_*` ones when `fit` had no
/// validation data. Every other metric is in `metrics` under Keras' key
/// (`sparse_top_k_categorical_accuracy`, `val_sparse_top_k_categorical_accuracy`, ...).
///
/// ```
/// use anygpu::nn::History;
/// let h = History::default();
/// assert_eq!(h.epochs(), 0);
/// assert!(h.last("loss").is_none());
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    /// Mean training loss of each epoch (over every example seen, as Keras averages it).
    pub loss: Vec<f64>,
    /// Training accuracy of each epoch.
    pub accuracy: Vec<f64>,
    /// Validation loss after each epoch.
    pub val_loss: Vec<f64>,
    /// Validation accuracy after each epoch.
    pub val_accuracy: Vec<f64>,
    /// Wall-clock seconds of each epoch's training steps (validation excluded).
    pub epoch_seconds: Vec<f64>,
    /// Training throughput of each epoch, images per second.
    pub images_per_second: Vec<f64>,
    /// Training steps run in each epoch.
    pub steps: Vec<usize>,
    /// The learning rate of each epoch, when a callback logs it as Keras'
    /// `ReduceLROnPlateau` and `LearningRateScheduler` do (`logs["learning_rate"]`); empty
    /// otherwise.
    pub learning_rate: Vec<f64>,
    /// The metrics other than `accuracy`, by Keras' key (`val_` first for validation).
    pub metrics: BTreeMap<String, Vec<f64>>,
}

impl History {
    /// Number of epochs recorded.
    pub fn epochs(&self) -> usize {
        self.loss.len()
    }

    /// The series by Keras' key: `loss`, `accuracy`, `val_loss`, `val_accuracy`,
    /// `learning_rate`, or another metric's (`binary_accuracy`, `val_mean_squared_error`, ...).
    pub fn get(&self, key: &str) -> Option<&[f64]> {
        match key {
            "loss" => Some(&self.loss),
            "accuracy" => Some(&self.accuracy),
            "val_loss" => Some(&self.val_loss),
            "val_accuracy" => Some(&self.val_accuracy),
            "learning_rate" => Some(&self.learning_rate),
            other => self.metrics.get(other).map(Vec::as_slice),
        }
    }

    /// Appends one epoch's value of `metric` (`accuracy` to its own series).
    pub(crate) fn push_metric(&mut self, prefix: &str, metric: &str, value: f64) {
        match (prefix, metric) {
            ("", "accuracy") => self.accuracy.push(value),
            ("val_", "accuracy") => self.val_accuracy.push(value),
            _ => self
                .metrics
                .entry(format!("{prefix}{metric}"))
                .or_default()
                .push(value),
        }
    }

    /// The last value of a series, if any.
    pub fn last(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(|s| s.last().copied())
    }
}

/// The result of [`crate::nn::Sequential::evaluate`]: Keras' `[loss, accuracy, ...]`.
///
/// ```
/// use anygpu::nn::Evaluation;
/// let e = Evaluation { loss: 0.3, accuracy: Some(0.9), examples: 10_000, metrics: Default::default() };
/// assert_eq!(e.accuracy, Some(0.9));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    /// Mean loss over every example.
    pub loss: f64,
    /// Fraction classified correctly (when compiled with the `accuracy` metric).
    pub accuracy: Option<f64>,
    /// Number of examples evaluated.
    pub examples: usize,
    /// The metrics other than `accuracy`, by Keras' name.
    pub metrics: BTreeMap<String, f64>,
}
