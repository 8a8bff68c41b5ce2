//! Layers that apply an activation and nothing else: [`ActivationLayer`] (Keras'
//! `keras.layers.Activation`) and [`ReLU`] (`keras.layers.ReLU`). They have no weights.

use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::mixed_precision::Policy;
use crate::nn::activation::Activation;
use crate::nn::layer_config;
use crate::nn::layers::{replace, saved, Layer};
use crate::ops;
use crate::ops::spec::ActivationFn;
use crate::tensor::Tensor;

/// `y = f(x)` and its gradient, keeping what the gradient reads (the output where the
/// derivative follows from it, else the input).
fn forward_fn(x: &Tensor, f: ActivationFn) -> Result<(Tensor, Vec<Tensor>)> {
    if f == ActivationFn::Linear {
        return Ok((x.clone(), vec![x.clone()]));
    }
    let y = ops::activation_fn(x, f)?;
    let kept = if f.grad_from_output() { &y } else { x };
    Ok((y.clone(), vec![kept.clone()]))
}

fn backward_fn(
    layer: &str,
    f: ActivationFn,
    saved_tensors: &[Tensor],
    dy: &Tensor,
    need_dx: bool,
) -> Result<(Option<Tensor>, Vec<Tensor>)> {
    let [kept] = saved::<1>(layer, saved_tensors)?;
    if !need_dx {
        return Ok((None, Vec::new()));
    }
    if f == ActivationFn::Linear {
        return Ok((Some(dy.clone()), Vec::new()));
    }
    let dx = ops::activation_fn_backward(dy, &kept, f, f.grad_from_output())?;
    Ok((Some(dx), Vec::new()))
}

/// Applies an activation to its input (`keras.layers.Activation("gelu")`); no weights.
///
/// The Rust name keeps [`Activation`] for the activation itself; Keras' class name,
/// `Activation`, is what [`Layer::class_name`] reports (and `activation`, numbered, the
/// layer's name). A `softmax` one must be the last layer: the model folds it into the loss as
/// it does a `Dense(activation="softmax")` (the Keras idiom `Dense(10)` + `Activation("softmax")`).
///
/// ```
/// use anygpu::nn::{ActivationLayer, Dense, Layer, Sequential};
/// let gelu = ActivationLayer::new("gelu".parse()?);
/// assert_eq!((gelu.class_name(), gelu.base_name()), ("Activation", "activation"));
/// assert_eq!(gelu.compute_output_shape(&[4, 4, 3])?, [4, 4, 3]);
///
/// let mut model = Sequential::new();
/// model.add(Dense::new(8).input_shape(&[4]))?;
/// model.add(ActivationLayer::new("tanh".parse()?))?;
/// model.add(Dense::new(3))?;
/// model.add(ActivationLayer::new("softmax".parse()?))?;
/// assert_eq!(model.output_shape(), Some(&[3][..]));
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ActivationLayer {
    activation: Activation,
    input_shape: Option<Vec<usize>>,
    policy: Option<Policy>,
}

impl ActivationLayer {
    /// A layer applying `activation`.
    pub fn new(activation: Activation) -> ActivationLayer {
        ActivationLayer {
            activation,
            input_shape: None,
            policy: None,
        }
    }

    /// `input_shape=`, for the first layer of a model.
    pub fn input_shape(mut self, shape: &[usize]) -> ActivationLayer {
        self.input_shape = Some(shape.to_vec());
        self
    }

    /// `dtype=`: this layer's dtype policy, whatever the global one.
    pub fn dtype_policy(mut self, policy: Policy) -> ActivationLayer {
        self.policy = Some(policy);
        self
    }
}

impl Layer for ActivationLayer {
    fn class_name(&self) -> &'static str {
        "Activation"
    }

    fn base_name(&self) -> &'static str {
        "activation"
    }

    fn declared_input_shape(&self) -> Option<&[usize]> {
        self.input_shape.as_deref()
    }

    fn activation(&self) -> Activation {
        self.activation
    }

    fn dtype_policy(&self) -> Option<Policy> {
        self.policy
    }

    fn compute_output_shape(&self, input_shape: &[usize]) -> Result<Vec<usize>> {
        Ok(input_shape.to_vec())
    }

    fn build(&mut self, input_shape: &[usize], _seed: u64, _device: &LogicalDevice) -> Result<()> {
        self.compute_output_shape(input_shape).map(|_| ())
    }

    fn weights(&self) -> Vec<(&'static str, &Tensor)> {
        Vec::new()
    }

    fn set_weight(&mut self, index: usize, value: Tensor) -> Result<()> {
        replace("Activation", &mut [], index, value)
    }

    fn forward(&self, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        // Softmax: the logits go on; the model's loss applies it (and its gradient).
        forward_fn(
            x,
            self.activation.function().unwrap_or(ActivationFn::Linear),
        )
    }

    fn as_activation(&self) -> Option<ActivationFn> {
        // Not softmax: the model folds that one into the loss.
        self.activation.function()
    }

    fn backward(
        &self,
        saved_tensors: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Vec<Tensor>)> {
        let f = self.activation.function().unwrap_or(ActivationFn::Linear);
        backward_fn("Activation", f, saved_tensors, dy, need_dx)
    }

    fn boxed_clone(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }

    fn get_config(&self) -> Option<serde_json::Value> {
        let mut c = serde_json::Map::new();
        c.insert(
            "activation".into(),
            layer_config::activation_value(self.activation),
        );
        Some(layer_config::with_dtype(c, self.policy))
    }
}

/// Rectified linear unit layer (`keras.layers.ReLU(max_value=None, negative_slope=0.0,
/// threshold=0.0)`): `clip(x > threshold ? x : 0, 0, max_value) - negative_slope ·
/// max(threshold - x, 0)`, with Keras' special cases (`max_value=6` alone is `tf.nn.relu6`, a
/// slope alone `tf.nn.leaky_relu`) and TensorFlow's gradients at the kinks. No weights.
///
/// ```
/// use anygpu::nn::{Layer, ReLU};
/// let relu6 = ReLU::new().max_value(6.0);
/// assert_eq!((relu6.class_name(), relu6.base_name()), ("ReLU", "re_lu"));
/// assert!(ReLU::new().negative_slope(-1.0).compute_output_shape(&[3]).is_err());
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct ReLU {
    max_value: Option<f32>,
    negative_slope: f32,
    threshold: f32,
    input_shape: Option<Vec<usize>>,
    policy: Option<Policy>,
}

impl ReLU {
    /// Keras' defaults: `max(x, 0)`.
    pub fn new() -> ReLU {
        ReLU::default()
    }

    /// `max_value=` (at least 0).
    pub fn max_value(mut self, max_value: f32) -> ReLU {
        self.max_value = Some(max_value);
        self
    }

    /// `negative_slope=` (at least 0).
    pub fn negative_slope(mut self, negative_slope: f32) -> ReLU {
        self.negative_slope = negative_slope;
        self
    }

    /// `threshold=` (at least 0).
    pub fn threshold(mut self, threshold: f32) -> ReLU {
        self.threshold = threshold;
        self
    }

    /// `input_shape=`, for the first layer of a model.
    pub fn input_shape(mut self, shape: &[usize]) -> ReLU {
        self.input_shape = Some(shape.to_vec());
        self
    }

    /// `dtype=`: this layer's dtype policy, whatever the global one.
    pub fn dtype_policy(mut self, policy: Policy) -> ReLU {
        self.policy = Some(policy);
        self
    }

    fn function(&self) -> ActivationFn {
        ActivationFn::Relu {
            negative_slope: self.negative_slope,
            max_value: self.max_value,
            threshold: self.threshold,
        }
    }

    /// Keras' checks, in its words.
    fn check(&self) -> Result<()> {
        let bad = |what: &str, value: f32| {
            Err(Error::InvalidArgument(format!(
                "{what} of a ReLU layer cannot be a negative value. Received: {what}={value}"
            )))
        };
        match self.max_value {
            Some(m) if m.is_nan() || m < 0.0 => bad("max_value", m),
            _ if self.negative_slope.is_nan() || self.negative_slope < 0.0 => {
                bad("negative_slope", self.negative_slope)
            }
            _ if self.threshold.is_nan() || self.threshold < 0.0 => {
                bad("threshold", self.threshold)
            }
            _ => Ok(()),
        }
    }
}

impl Layer for ReLU {
    fn class_name(&self) -> &'static str {
        "ReLU"
    }

    fn base_name(&self) -> &'static str {
        "re_lu"
    }

    fn declared_input_shape(&self) -> Option<&[usize]> {
        self.input_shape.as_deref()
    }

    fn dtype_policy(&self) -> Option<Policy> {
        self.policy
    }

    fn compute_output_shape(&self, input_shape: &[usize]) -> Result<Vec<usize>> {
        self.check()?;
        Ok(input_shape.to_vec())
    }

    fn build(&mut self, input_shape: &[usize], _seed: u64, _device: &LogicalDevice) -> Result<()> {
        self.compute_output_shape(input_shape).map(|_| ())
    }

    fn weights(&self) -> Vec<(&'static str, &Tensor)> {
        Vec::new()
    }

    fn set_weight(&mut self, index: usize, value: Tensor) -> Result<()> {
        replace("ReLU", &mut [], index, value)
    }

    fn forward(&self, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        forward_fn(x, self.function())
    }

    fn as_activation(&self) -> Option<ActivationFn> {
        Some(self.function())
    }

    fn backward(
        &self,
        saved_tensors: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Vec<Tensor>)> {
        backward_fn("ReLU", self.function(), saved_tensors, dy, need_dx)
    }

    fn boxed_clone(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }

    fn get_config(&self) -> Option<serde_json::Value> {
        let mut c = serde_json::Map::new();
        c.insert("max_value".into(), layer_config::opt_num(self.max_value));
        c.insert(
            "negative_slope".into(),
            layer_config::num(self.negative_slope),
        );
        c.insert("threshold".into(), layer_config::num(self.threshold));
        Some(layer_config::with_dtype(c, self.policy))
    }
}
