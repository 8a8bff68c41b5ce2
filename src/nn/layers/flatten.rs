//! [`Flatten`]: the reshape from images to one axis per example.

use crate::device::LogicalDevice;
use crate::error::Result;
use crate::mixed_precision::Policy;
use crate::nn::layer_config;
use crate::tensor::Tensor;

use super::{replace, saved, Layer};

/// Flattens each example to one axis (`keras.layers.Flatten()`): `[3, 3, 128]` → `[1152]`. A
/// reshape that shares the data; no computation.
///
/// ```
/// use anygpu::nn::{Flatten, Layer};
/// assert_eq!(Flatten::new().compute_output_shape(&[3, 3, 128])?, [1152]);
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Flatten {
    input_shape: Option<Vec<usize>>,
    policy: Option<Policy>,
}

impl Flatten {
    /// `dtype=`: this layer's dtype policy, whatever the global one (a float32 output layer
    /// in a `mixed_float16` model, say).
    pub fn dtype_policy(mut self, policy: Policy) -> Flatten {
        self.policy = Some(policy);
        self
    }

    /// A flatten layer.
    pub fn new() -> Flatten {
        Flatten::default()
    }

    /// `input_shape=`, for the first layer of a model.
    pub fn input_shape(mut self, shape: &[usize]) -> Flatten {
        self.input_shape = Some(shape.to_vec());
        self
    }
}

impl Layer for Flatten {
    fn dtype_policy(&self) -> Option<Policy> {
        self.policy
    }

    fn boxed_clone(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }

    fn get_config(&self) -> Option<serde_json::Value> {
        let mut c = serde_json::Map::new();
        c.insert("data_format".into(), "channels_last".into());
        Some(layer_config::with_dtype(c, self.policy))
    }

    fn class_name(&self) -> &'static str {
        "Flatten"
    }

    fn base_name(&self) -> &'static str {
        "flatten"
    }

    fn declared_input_shape(&self) -> Option<&[usize]> {
        self.input_shape.as_deref()
    }

    fn compute_output_shape(&self, input_shape: &[usize]) -> Result<Vec<usize>> {
        Ok(vec![input_shape.iter().product()])
    }

    fn build(&mut self, _input_shape: &[usize], _seed: u64, _device: &LogicalDevice) -> Result<()> {
        Ok(())
    }

    fn weights(&self) -> Vec<(&'static str, &Tensor)> {
        Vec::new()
    }

    fn set_weight(&mut self, index: usize, value: Tensor) -> Result<()> {
        replace("Flatten", &mut [], index, value)
    }

    fn forward(&self, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        let n = x.shape().first().copied().unwrap_or(1);
        // From the dimensions, not `len / n`: an empty batch still has its features.
        let features = x.shape().iter().skip(1).product();
        let y = x.reshape(&[n, features])?;
        Ok((y, vec![x.clone()]))
    }

    fn backward(
        &self,
        saved_tensors: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Vec<Tensor>)> {
        let [x] = saved::<1>("Flatten", saved_tensors)?;
        let dx = if need_dx {
            Some(dy.reshape(x.shape())?)
        } else {
            None
        };
        Ok((dx, Vec::new()))
    }
}
