//! `predict`: the model's output for a batch, on one device or split among the replicas.

use crate::error::Result;
use crate::nn::activation::Activation;
use crate::nn::mirrored;
use crate::nn::pass;
use crate::ops;
use crate::tensor::Tensor;

use super::Sequential;

impl Sequential {
    /// The model's output for a batch `x` of shape `[batch, ...input_shape]`
    /// (`model.predict(x)`): class probabilities when the last layer has a softmax, else its
    /// output. The result is on the last layer's device.
    ///
    /// ```
    /// use anygpu::nn::{Activation, Dense, Sequential};
    /// use anygpu::Tensor;
    /// let mut model = Sequential::new();
    /// model.add(Dense::new(10).activation(Activation::Softmax).input_shape(&[4]))?;
    /// let probs = model.predict(&Tensor::from_vec(vec![0.1f32; 8], &[2, 4])?)?;
    /// assert_eq!(probs.shape(), &[2, 10]);
    /// let first_row: f32 = probs.to_vec::<f32>()?[..10].iter().sum();
    /// assert!((first_row - 1.0).abs() < 1e-5);
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Model`](crate::Error::Model) when the model is not built; a shape error for a
    /// batch of another shape.
    pub fn predict(&self, x: &Tensor) -> Result<Tensor> {
        self.require_built("predict")?;
        self.check_batch("predict", x, None)?;
        let out = match self.strategy() {
            Some(strategy) => mirrored::predict(
                strategy,
                &self.replica_layers(),
                &x.to_vec::<f32>()?,
                x.shape(),
                self.output_shape().unwrap_or(&[]),
            )?,
            None => pass::forward(&self.stages(), x, false)?.0,
        };
        let last = &self.entries[self.entries.len() - 1];
        let _scope = out.device_handle().scope();
        match last.layer.activation() {
            Activation::Softmax => ops::softmax(&out),
            _ => Ok(out),
        }
    }
}
