//! Keras' layer activations (`activation="selu"`), including the `softmax` that ends a
//! classifier.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::ops::spec::Activation as OpActivation;

/// The `activation=` argument of a layer, with Keras' names.
///
/// `Linear`, `Relu` and `Selu` are fused into the layer's kernel. `Softmax` is different: it is
/// allowed on the last layer only, where [`crate::nn::Sequential`] folds it into the loss during
/// training (the fused, numerically stable sparse cross-entropy on the logits) and applies it in
/// [`crate::nn::Sequential::predict`].
///
/// ```
/// use anygpu::nn::Activation;
/// let selu: Activation = "selu".parse()?;
/// assert_eq!(selu, Activation::Selu);
/// assert_eq!(Activation::Softmax.to_string(), "softmax");
/// assert!("gelu".parse::<Activation>().is_err());
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// No activation (`None` / `"linear"`).
    #[default]
    Linear,
    /// `"relu"`: `max(x, 0)`.
    Relu,
    /// `"selu"`: scaled exponential linear unit, Keras' constants.
    Selu,
    /// `"softmax"` over the last axis; last layer only.
    Softmax,
    /// `"sigmoid"`: `1 / (1 + e^{-x})`; last layer only here, where a binary cross-entropy
    /// folds it in as the softmax is (see [`crate::nn::Loss`]).
    Sigmoid,
}

impl Activation {
    /// Keras' name: `linear`, `relu`, `selu`, `softmax`, `sigmoid`.
    pub fn name(self) -> &'static str {
        match self {
            Activation::Linear => "linear",
            Activation::Relu => "relu",
            Activation::Selu => "selu",
            Activation::Softmax => "softmax",
            Activation::Sigmoid => "sigmoid",
        }
    }

    /// The activation the kernels fuse: softmax and sigmoid layers compute their logits
    /// (linear).
    pub(crate) fn fused(self) -> OpActivation {
        match self {
            Activation::Linear | Activation::Softmax | Activation::Sigmoid => OpActivation::Linear,
            Activation::Relu => OpActivation::Relu,
            Activation::Selu => OpActivation::Selu,
        }
    }
}

impl Activation {
    /// Whether this is a last-layer-only activation that the loss folds in (softmax, sigmoid).
    pub(crate) fn is_folded(self) -> bool {
        matches!(self, Activation::Softmax | Activation::Sigmoid)
    }
}

impl fmt::Display for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Activation {
    type Err = Error;

    /// Parses Keras' names (`"linear"`, `"relu"`, `"selu"`, `"softmax"`, `"sigmoid"`;
    /// case-insensitive).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the supported activations.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "linear" | "none" => Ok(Activation::Linear),
            "relu" => Ok(Activation::Relu),
            "selu" => Ok(Activation::Selu),
            "softmax" => Ok(Activation::Softmax),
            "sigmoid" => Ok(Activation::Sigmoid),
            other => Err(Error::InvalidArgument(format!(
                "Unknown activation function: '{other}'; supported: linear, relu, selu, \
                 softmax, sigmoid"
            ))),
        }
    }
}

impl From<OpActivation> for Activation {
    fn from(a: OpActivation) -> Self {
        match a {
            OpActivation::Linear => Activation::Linear,
            OpActivation::Relu => Activation::Relu,
            OpActivation::Selu => Activation::Selu,
        }
    }
}
