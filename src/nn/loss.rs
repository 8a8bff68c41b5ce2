//! Losses (`model.compile(loss=...)`).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// A loss for [`crate::nn::Sequential::compile`].
///
/// ```
/// use anygpu::nn::Loss;
/// let loss: Loss = "sparse_categorical_crossentropy".parse()?;
/// assert_eq!(loss, Loss::SparseCategoricalCrossentropy { from_logits: false });
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
}

impl Loss {
    /// `"sparse_categorical_crossentropy"` (`from_logits=False`).
    pub const fn sparse_categorical_crossentropy() -> Loss {
        Loss::SparseCategoricalCrossentropy { from_logits: false }
    }

    /// Keras' name, as `compile(loss=...)` takes it.
    pub fn name(&self) -> &'static str {
        match self {
            Loss::SparseCategoricalCrossentropy { .. } => "sparse_categorical_crossentropy",
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

    /// Keras' identifier `"sparse_categorical_crossentropy"`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for any other name.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "sparse_categorical_crossentropy" => Ok(Loss::sparse_categorical_crossentropy()),
            other => Err(Error::InvalidArgument(format!(
                "Could not interpret loss identifier: '{other}'; supported: \
                 sparse_categorical_crossentropy"
            ))),
        }
    }
}
