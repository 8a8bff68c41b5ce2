//! The activations with their own kernel ([`ActivationFn`]).

/// An element-wise activation run by its own kernel (Keras' activations beyond the three that
/// the products fuse, and the `Activation`/`ReLU` layers): a layer computes its product linear,
/// then this.
///
/// The gradient follows TensorFlow's at the kinks (`ReluGrad`, `Relu6Grad`, `LeakyReluGrad`,
/// `EluGrad`, `SeluGrad`, `clip_by_value`'s): `relu'(0) = 0`, `relu6'(6) = 0`,
/// `leaky_relu'(0) = slope`, `elu'(0) = 1`, `selu'(0) = scale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ActivationFn {
    /// The identity.
    Linear,
    /// Keras' `relu(x, negative_slope, max_value, threshold)`: `clip(x > threshold ? x : 0, 0,
    /// max_value) - negative_slope * max(threshold - x, 0)`, with Keras' special cases
    /// (`tf.nn.relu6` for `max_value=6` without threshold, `tf.nn.leaky_relu` for a slope alone),
    /// whose gradients differ at the kinks.
    Relu {
        /// Slope below the threshold.
        negative_slope: f32,
        /// The largest output (`None`: unbounded).
        max_value: Option<f32>,
        /// Inputs at or below it give 0 (before the negative slope's part).
        threshold: f32,
    },
    /// `x > 0 ? x : expm1(x)` (alpha 1, `tf.nn.elu`).
    Elu,
    /// Scaled ELU with [`SELU_ALPHA`](super::SELU_ALPHA) and [`SELU_SCALE`](super::SELU_SCALE).
    Selu,
    /// `x Φ(x)`; `approximate`: `x σ(2 √(2/π) (x + 0.044715 x³))`, TF's tanh form.
    Gelu {
        /// The tanh approximation instead of the exact `erfc` form.
        approximate: bool,
    },
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    /// `tanh(x)`.
    Tanh,
    /// `x σ(x)` (`silu`).
    Swish,
    /// `log(1 + exp(x))`.
    Softplus,
}

impl ActivationFn {
    /// `relu`.
    pub const RELU: ActivationFn = ActivationFn::Relu {
        negative_slope: 0.0,
        max_value: None,
        threshold: 0.0,
    };
    /// `relu6`.
    pub const RELU6: ActivationFn = ActivationFn::Relu {
        negative_slope: 0.0,
        max_value: Some(6.0),
        threshold: 0.0,
    };

    /// `leaky_relu` with `negative_slope` (Keras' default 0.2).
    pub fn leaky_relu(negative_slope: f32) -> ActivationFn {
        ActivationFn::Relu {
            negative_slope,
            max_value: None,
            threshold: 0.0,
        }
    }

    /// The code WGSL kernels receive (`kind` in `activation.wgsl`), also the index into the op
    /// names.
    pub fn code(self) -> u32 {
        match self {
            ActivationFn::Linear => 0,
            ActivationFn::Relu { .. } => 1,
            ActivationFn::Elu => 2,
            ActivationFn::Selu => 3,
            ActivationFn::Gelu { approximate: false } => 4,
            ActivationFn::Gelu { approximate: true } => 5,
            ActivationFn::Sigmoid => 6,
            ActivationFn::Tanh => 7,
            ActivationFn::Swish => 8,
            ActivationFn::Softplus => 9,
        }
    }

    /// Whether the gradient can be computed from the activation's output alone (then a layer
    /// keeps its output, which the next layer keeps anyway; otherwise its pre-activation).
    /// `gelu` and `swish` are not monotonic; a relu with a threshold or a clip other than 6 is
    /// ambiguous at its kinks.
    pub fn grad_from_output(self) -> bool {
        match self {
            ActivationFn::Relu {
                max_value,
                threshold,
                ..
            } => threshold == 0.0 && matches!(max_value, None | Some(6.0)),
            ActivationFn::Gelu { .. } | ActivationFn::Swish => false,
            _ => true,
        }
    }
}
