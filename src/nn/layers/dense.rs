//! [`Dense`]: the fully connected layer, its builder, its Keras config and its passes.

use crate::device::LogicalDevice;
use crate::error::Result;
use crate::mixed_precision::Policy;
use crate::nn::activation::Activation;
use crate::nn::init::{derive_seed, glorot_uniform, positive, zeros};
use crate::nn::layer_config;
use crate::ops::{self, GradDType};
use crate::tensor::Tensor;

use super::{
    activate_separately, backward_weights, bad_input, in_dtype, not_built, replace, saved,
    through_separate, weights_of, Layer,
};

/// A fully connected layer (`keras.layers.Dense(units, activation)`): `y = act(x · kernel +
/// bias)`.
///
/// Weights: `kernel` `[in, units]` (glorot_uniform), `bias` `[units]` (zeros).
///
/// ```
/// use anygpu::nn::{Activation, Dense, Layer};
/// let out = Dense::new(10).activation(Activation::Softmax);
/// assert_eq!(out.compute_output_shape(&[128])?, [10]);
/// assert!(out.compute_output_shape(&[3, 3, 128]).is_err()); // Flatten first
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// Differences from Keras: the input must be one axis per example (Keras also applies a Dense
/// layer to the last axis of a higher-rank input).
#[derive(Debug, Clone)]
pub struct Dense {
    units: usize,
    activation: Activation,
    input_shape: Option<Vec<usize>>,
    policy: Option<Policy>,
    /// `[kernel, bias]` once built.
    weights: Vec<Tensor>,
}

impl Dense {
    /// `dtype=`: this layer's dtype policy, whatever the global one (a float32 output layer
    /// in a `mixed_float16` model, say).
    pub fn dtype_policy(mut self, policy: Policy) -> Dense {
        self.policy = Some(policy);
        self
    }

    /// `units` outputs, no activation.
    pub fn new(units: usize) -> Dense {
        Dense {
            units,
            activation: Activation::Linear,
            input_shape: None,
            policy: None,
            weights: Vec::new(),
        }
    }

    /// `activation=`.
    pub fn activation(mut self, activation: Activation) -> Dense {
        self.activation = activation;
        self
    }

    /// `input_shape=[features]`, for the first layer of a model.
    pub fn input_shape(mut self, shape: &[usize]) -> Dense {
        self.input_shape = Some(shape.to_vec());
        self
    }
}

impl Layer for Dense {
    fn dtype_policy(&self) -> Option<Policy> {
        self.policy
    }

    fn boxed_clone(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }

    fn get_config(&self) -> Option<serde_json::Value> {
        let mut c = serde_json::Map::new();
        c.insert("units".into(), self.units.into());
        c.insert(
            "activation".into(),
            layer_config::activation_value(self.activation),
        );
        c.insert("use_bias".into(), true.into());
        Some(layer_config::with_dtype(c, self.policy))
    }

    fn class_name(&self) -> &'static str {
        "Dense"
    }

    fn base_name(&self) -> &'static str {
        "dense"
    }

    fn declared_input_shape(&self) -> Option<&[usize]> {
        self.input_shape.as_deref()
    }

    fn activation(&self) -> Activation {
        self.activation
    }

    fn compute_output_shape(&self, input_shape: &[usize]) -> Result<Vec<usize>> {
        positive("Dense", "units", self.units)?;
        match *input_shape {
            [features] if features > 0 => Ok(vec![self.units]),
            _ => Err(bad_input(
                "Dense",
                input_shape,
                format!(
                    ": Dense takes inputs of shape [features] (add a Flatten layer before it), \
                     got {input_shape:?}"
                ),
            )),
        }
    }

    fn build(&mut self, input_shape: &[usize], seed: u64, device: &LogicalDevice) -> Result<()> {
        self.compute_output_shape(input_shape)?;
        self.weights = vec![
            glorot_uniform(&[input_shape[0], self.units], derive_seed(seed, 0), device)?,
            zeros(&[self.units], device)?,
        ];
        Ok(())
    }

    fn weights(&self) -> Vec<(&'static str, &Tensor)> {
        weights_of(&["kernel", "bias"], &self.weights)
    }

    fn autocast_weights(&self) -> &[Tensor] {
        &self.weights
    }

    fn set_weight(&mut self, index: usize, value: Tensor) -> Result<()> {
        replace("Dense", &mut self.weights, index, value)
    }

    fn forward(&self, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        let w = in_dtype("Dense", &self.weights, x.dtype())?;
        let [kernel, bias] = &w[..] else {
            return Err(not_built("Dense"));
        };
        let z = ops::dense(x, kernel, Some(bias), self.activation.fused())?;
        let (y, kept) = activate_separately(z, self.activation)?;
        Ok((y, vec![x.clone(), kept]))
    }

    fn backward(
        &self,
        saved_tensors: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Vec<Tensor>)> {
        let w = backward_weights("Dense", &self.weights, dy.dtype())?;
        let [kernel] = &w[..] else {
            return Err(not_built("Dense"));
        };
        let [x, kept] = saved::<2>("Dense", saved_tensors)?;
        let (dy, y, activation) = through_separate(dy, &kept, self.activation)?;
        // Float32 gradients for the optimizer, whatever the compute dtype.
        let (dx, dk, db) = ops::dense_backward_as(
            &x,
            kernel,
            &y,
            &dy,
            activation.fused(),
            need_dx,
            GradDType::Float32,
        )?;
        Ok((dx, vec![dk, db]))
    }
}
