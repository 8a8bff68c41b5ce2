//! The model's weights: every variable in Keras' order, their names, host copies in and out
//! (`get_weights`/`set_weights`), weight files and the layout checkpoints check.

use crate::error::{Error, Result};
use crate::nn::layers::variables;
use crate::nn::weights;
use crate::tensor::Tensor;

use super::Sequential;

impl Sequential {
    /// Every weight in layer order, each layer's in Keras' order (`model.weights`): its
    /// trainable weights, then its non-trainable ones (a `BatchNormalization`'s moving
    /// statistics), which [`get_weights`](Sequential::get_weights),
    /// [`set_weights`](Sequential::set_weights), weight files and checkpoints include too.
    ///
    /// Under a [`MirroredStrategy`](crate::distribute::MirroredStrategy) these are the primary
    /// replica's tensors: change a mirrored model's weights with
    /// [`set_weights`](Sequential::set_weights) or
    /// [`load_weights`](Sequential::load_weights), which reach every replica, not with
    /// [`Tensor::assign`] on these.
    pub fn weights(&self) -> Vec<&Tensor> {
        self.entries
            .iter()
            .flat_map(|e| variables(e.layer.as_ref()).into_iter().map(|(_, t)| t))
            .collect()
    }

    /// The weights the optimizer trains (`model.trainable_weights`), in layer order: what
    /// [`loss_and_gradients`](Sequential::loss_and_gradients) gives gradients for.
    /// [`weights`](Sequential::weights) adds each layer's non-trainable ones after its
    /// trainable ones (a `BatchNormalization`'s moving statistics).
    pub fn trainable_weights(&self) -> Vec<&Tensor> {
        self.entries
            .iter()
            .flat_map(|e| e.layer.weights().into_iter().map(|(_, t)| t))
            .collect()
    }

    /// Number of non-trainable weight elements (the summary's "Non-trainable params").
    pub fn count_non_trainable_params(&self) -> usize {
        self.entries
            .iter()
            .map(|e| crate::nn::layers::count_non_trainable(e.layer.as_ref()))
            .sum()
    }

    /// Weights with their names, `layer_name/weight_name` (`conv2d/kernel`,
    /// `batch_normalization/moving_mean`, ...), in [`weights`](Sequential::weights) order.
    pub fn named_weights(&self) -> Vec<(String, &Tensor)> {
        self.entries
            .iter()
            .flat_map(|e| {
                variables(e.layer.as_ref())
                    .into_iter()
                    .map(move |(n, t)| (format!("{}/{n}", e.name), t))
            })
            .collect()
    }

    /// Host copies of every weight (`model.get_weights()`), in [`weights`](Sequential::weights)
    /// order.
    ///
    /// ```
    /// use anygpu::nn::{Dense, Sequential};
    /// let mut model = Sequential::new();
    /// model.add(Dense::new(2).input_shape(&[3]))?;
    /// let weights = model.get_weights()?;
    /// assert_eq!(weights.iter().map(Vec::len).collect::<Vec<_>>(), [6, 2]); // kernel, bias
    /// model.set_weights(&[vec![1.0; 6], vec![0.5; 2]])?;
    /// assert!(model.set_weights(&[vec![1.0; 6]]).is_err());
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// A device error.
    pub fn get_weights(&self) -> Result<Vec<Vec<f32>>> {
        self.weights().iter().map(|t| t.to_vec::<f32>()).collect()
    }

    /// Replaces every weight (`model.set_weights(...)`), in
    /// [`weights`](Sequential::weights) order, on each layer's device.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a wrong number of arrays, a shape error for an array of
    /// the wrong length; the model is unchanged on error.
    pub fn set_weights(&mut self, values: &[Vec<f32>]) -> Result<()> {
        let named = self.named_weights();
        if values.len() != named.len() {
            return Err(Error::InvalidArgument(format!(
                "set_weights: you called set_weights with a list of {} arrays, but the model \
                 expects {}",
                values.len(),
                named.len()
            )));
        }
        for ((name, t), v) in named.iter().zip(values) {
            if v.len() != t.len() {
                return Err(Error::ShapeMismatch {
                    op: "set_weights",
                    lhs: t.shape().to_vec(),
                    rhs: vec![v.len()],
                    hint: format!(": '{name}' needs {} values, got {}", t.len(), v.len()),
                });
            }
        }
        self.write_weights(values)
    }

    /// Writes checked values (in [`weights`](Sequential::weights) order) into every weight of
    /// every replica, in place: nothing is allocated, so no replica can be left behind for
    /// want of memory.
    pub(crate) fn write_weights(&self, values: &[Vec<f32>]) -> Result<()> {
        for replica in self.replica_layers() {
            let weights = replica
                .layers
                .iter()
                .flat_map(|l| variables(*l).into_iter().map(|(_, t)| t));
            for (t, v) in weights.zip(values) {
                t.write_words(bytemuck::cast_slice(v))?;
            }
        }
        Ok(())
    }

    /// Saves every weight to a safetensors file (`model.save_weights(path)`), named
    /// `layer_name/weight_name`, f32, with their shapes.
    ///
    /// ```
    /// use anygpu::nn::{Dense, Sequential};
    /// let path = std::env::temp_dir().join(format!("anygpu-doc-{}.safetensors", std::process::id()));
    /// let mut a = Sequential::with_seed(1);
    /// a.add(Dense::new(2).input_shape(&[3]))?;
    /// a.save_weights(&path)?;
    /// let mut b = Sequential::with_seed(2);
    /// b.add(Dense::new(2).input_shape(&[3]))?;
    /// b.load_weights(&path)?;
    /// assert_eq!(a.get_weights()?, b.get_weights()?);
    /// let mut wider = Sequential::new();
    /// wider.add(Dense::new(5).input_shape(&[3]))?;
    /// assert!(wider.load_weights(&path).unwrap_err().to_string().contains("dense/kernel"));
    /// # std::fs::remove_file(&path).ok();
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be written; device errors.
    pub fn save_weights(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        weights::save(&self.named_weights(), &self.name, path.as_ref())
    }

    /// Loads weights saved by [`save_weights`](Sequential::save_weights) into this model
    /// (`model.load_weights(path)`), onto each layer's device. Every weight of the model must
    /// be in the file with the same shape; nothing is changed unless all are.
    ///
    /// # Errors
    /// [`Error::Io`] for an unreadable file; [`Error::Model`] for a malformed file, a missing or
    /// extra weight, a dtype other than f32, or a shape mismatch (naming the weight and both
    /// shapes).
    pub fn load_weights(&mut self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let staged = weights::load(path.as_ref(), &self.weight_layout())?;
        // In place, on every replica of a mirrored model.
        self.write_weights(&staged)
    }

    /// Every weight's name and shape, in [`weights`](Sequential::weights) order.
    pub(crate) fn weight_layout(&self) -> Vec<(String, Vec<usize>)> {
        self.named_weights()
            .into_iter()
            .map(|(n, t)| (n, t.shape().to_vec()))
            .collect()
    }
}
