//! Keras' layer activations (`activation="selu"`), including the `softmax` that ends a
//! classifier.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::ops::spec::{Activation as OpActivation, ActivationFn};

/// The `activation=` argument of a layer, with Keras' names.
///
/// `Linear`, `Relu` and `Selu` are fused into the layer's kernel. The others run as their own
/// element-wise op after the layer's (linear) product, and their gradient as another before the
/// product's ([`ActivationFn`]). `Softmax` is different: it is allowed on the last layer only,
/// where [`crate::nn::Sequential`] folds it into the loss during training (the fused,
/// numerically stable sparse cross-entropy on the logits) and applies it in
/// [`crate::nn::Sequential::predict`].
///
/// Parsing takes Keras' strings, case-insensitively: `linear`, `relu`, `relu6`, `leaky_relu`
/// (negative slope 0.2, as `keras.activations.leaky_relu`), `elu` (alpha 1), `selu`, `gelu`
/// (the exact `erfc` form, as `keras.activations.gelu`'s default `approximate=False`),
/// `sigmoid`, `tanh`, `silu` or `swish`, `softplus`, `softmax`. The tanh form of gelu is
/// `Activation::Gelu { approximate: true }` (Keras: `activations.gelu(x, approximate=True)`,
/// which has no string either).
///
/// ```
/// use anygpu::nn::Activation;
/// let selu: Activation = "selu".parse()?;
/// assert_eq!(selu, Activation::Selu);
/// assert_eq!("GELU".parse::<Activation>()?, Activation::Gelu { approximate: false });
/// assert_eq!("swish".parse::<Activation>()?, Activation::Swish);
/// assert_eq!(Activation::Swish.to_string(), "silu");
/// assert_eq!(Activation::Softmax.to_string(), "softmax");
/// assert!("mish".parse::<Activation>().is_err());
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
    // ---- activations and pooling layers ----
    /// `"relu6"`: `min(max(x, 0), 6)`.
    Relu6,
    /// `"leaky_relu"`: `x > 0 ? x : 0.2 x`.
    LeakyRelu,
    /// `"elu"`: `x > 0 ? x : e^x - 1`.
    Elu,
    /// `"gelu"`: `x Φ(x)`, or with `approximate` the tanh form
    /// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
    Gelu {
        /// The tanh approximation (Keras' `approximate=True`).
        approximate: bool,
    },
    /// `"sigmoid"`: `1 / (1 + e^-x)`.
    Sigmoid,
    /// `"tanh"`.
    Tanh,
    /// `"silu"` / `"swish"`: `x · sigmoid(x)`.
    Swish,
    /// `"softplus"`: `log(1 + e^x)`.
    Softplus,
}

/// The names [`Activation::from_str`] takes, for its error message.
const SUPPORTED: &str = "linear, relu, relu6, leaky_relu, elu, selu, gelu, sigmoid, tanh, \
                         silu (swish), softplus, softmax";

impl Activation {
    /// Keras' name (`activation.__name__`): `linear`, `relu`, `selu`, `softmax`, `relu6`,
    /// `leaky_relu`, `elu`, `gelu` (either form), `sigmoid`, `tanh`, `silu`, `softplus`.
    pub fn name(self) -> &'static str {
        match self {
            Activation::Linear => "linear",
            Activation::Relu => "relu",
            Activation::Selu => "selu",
            Activation::Softmax => "softmax",
            Activation::Relu6 => "relu6",
            Activation::LeakyRelu => "leaky_relu",
            Activation::Elu => "elu",
            Activation::Gelu { .. } => "gelu",
            Activation::Sigmoid => "sigmoid",
            Activation::Tanh => "tanh",
            Activation::Swish => "silu",
            Activation::Softplus => "softplus",
        }
    }

    /// The activation the kernels fuse: softmax layers compute their logits (linear), and so do
    /// the layers whose activation runs as its own op ([`Activation::separate`]).
    pub(crate) fn fused(self) -> OpActivation {
        match self {
            Activation::Relu => OpActivation::Relu,
            Activation::Selu => OpActivation::Selu,
            _ => OpActivation::Linear,
        }
    }

    /// The element-wise op that follows a layer's product when the kernels do not fuse this
    /// activation; `None` for the fused ones and softmax.
    pub(crate) fn separate(self) -> Option<ActivationFn> {
        match self {
            Activation::Linear | Activation::Relu | Activation::Selu | Activation::Softmax => None,
            other => other.function(),
        }
    }

    /// The activation as an element-wise function; `None` for softmax (a function of a row).
    pub fn function(self) -> Option<ActivationFn> {
        Some(match self {
            Activation::Linear => ActivationFn::Linear,
            Activation::Relu => ActivationFn::RELU,
            Activation::Selu => ActivationFn::Selu,
            Activation::Softmax => return None,
            Activation::Relu6 => ActivationFn::RELU6,
            Activation::LeakyRelu => ActivationFn::leaky_relu(0.2),
            Activation::Elu => ActivationFn::Elu,
            Activation::Gelu { approximate } => ActivationFn::Gelu { approximate },
            Activation::Sigmoid => ActivationFn::Sigmoid,
            Activation::Tanh => ActivationFn::Tanh,
            Activation::Swish => ActivationFn::Swish,
            Activation::Softplus => ActivationFn::Softplus,
        })
    }
}

impl Activation {
    /// Whether this is a last-layer-only activation that the loss folds in: softmax. (A
    /// sigmoid is an activation like any other: its layer outputs probabilities, which the
    /// binary cross-entropy takes as Keras' probability form does.)
    pub(crate) fn is_folded(self) -> bool {
        matches!(self, Activation::Softmax)
    }
}

impl fmt::Display for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Activation {
    type Err = Error;

    /// Parses Keras' names (see [`Activation`]; case-insensitive).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the supported activations.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "linear" | "none" => Ok(Activation::Linear),
            "relu" => Ok(Activation::Relu),
            "selu" => Ok(Activation::Selu),
            "softmax" => Ok(Activation::Softmax),
            "relu6" => Ok(Activation::Relu6),
            "leaky_relu" => Ok(Activation::LeakyRelu),
            "elu" => Ok(Activation::Elu),
            "gelu" => Ok(Activation::Gelu { approximate: false }),
            "sigmoid" => Ok(Activation::Sigmoid),
            "tanh" => Ok(Activation::Tanh),
            "silu" | "swish" => Ok(Activation::Swish),
            "softplus" => Ok(Activation::Softplus),
            other => Err(Error::InvalidArgument(format!(
                "Unknown activation function: '{other}'; supported: {SUPPORTED}"
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
