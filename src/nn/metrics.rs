//! Metrics (`model.compile(metrics=[...])`).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// A metric for [`crate::nn::Sequential::compile`].
///
/// The loss is always reported; metrics add to it.
///
/// ```
/// use anygpu::nn::Metric;
/// assert_eq!("accuracy".parse::<Metric>()?, Metric::Accuracy);
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Metric {
    /// `"accuracy"`: with integer labels and a softmax output, Keras resolves it to
    /// `sparse_categorical_accuracy`, the fraction of examples whose arg max is the label.
    Accuracy,
}

impl Metric {
    /// Keras' name as it appears in the logs and the history.
    pub fn name(&self) -> &'static str {
        match self {
            Metric::Accuracy => "accuracy",
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

    /// `"accuracy"`, `"acc"` or `"sparse_categorical_accuracy"`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for any other name.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "accuracy" | "acc" | "sparse_categorical_accuracy" => Ok(Metric::Accuracy),
            other => Err(Error::InvalidArgument(format!(
                "Unknown metric function: '{other}'; supported: accuracy"
            ))),
        }
    }
}
