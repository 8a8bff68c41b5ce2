//! The stack of layers: adding a layer on its device (mirrored to every replica under a
//! strategy), building it once its input shape is known, the model's shapes, layers, devices
//! (and waiting for them) and parameter count.

use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::mixed_precision;
use crate::nn::init::derive_seed;
use crate::nn::layers::{count_params, Layer};
use crate::tensor::Tensor;

use super::{distinct_devices, Entry, Sequential};

impl Sequential {
    /// Adds a layer on the device of the current scope (`with tf.device(...)`), or on the
    /// default device (`GPU:0`, else `CPU:0`) outside any scope.
    ///
    /// The scope is resolved now, once: the layer stays on that device. The layer is built
    /// (its weights created) as soon as its input shape is known: from its `input_shape` for
    /// the first layer, from the layer before otherwise.
    ///
    /// ```
    /// use anygpu::nn::{Dense, Sequential};
    /// let mut model = Sequential::new();
    /// {
    ///     let _cpu = anygpu::with_device("/cpu:0")?;
    ///     model.add(Dense::new(4).input_shape(&[3]))?;
    /// }
    /// assert_eq!(model.layer_infos()[0].device, "/device:CPU:0");
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`add_on`](Sequential::add_on).
    pub fn add(&mut self, layer: impl Layer + 'static) -> Result<()> {
        let device = match self.strategy() {
            Some(strategy) => strategy.devices()[0].clone(),
            // Resolve the scope exactly as weight creation would: with a (tiny) constant.
            None => Tensor::zeros(&[1])?.device_handle().clone(),
        };
        self.add_on(&device, layer)
    }

    /// Adds a layer on `device` explicitly, whatever the scope.
    ///
    /// # Errors
    /// A shape error when the layer cannot take the previous layer's output (or its own
    /// `input_shape`); [`Error::InvalidArgument`] when a layer follows a `softmax` layer; the
    /// device's out-of-memory error. The model is unchanged on error.
    pub fn add_on(&mut self, device: &LogicalDevice, layer: impl Layer + 'static) -> Result<()> {
        self.add_boxed(device, Box::new(layer))
    }

    /// [`add_on`](Sequential::add_on) for a boxed layer.
    ///
    /// # Errors
    /// As [`add_on`](Sequential::add_on).
    pub fn add_boxed(&mut self, device: &LogicalDevice, mut layer: Box<dyn Layer>) -> Result<()> {
        if let Some(strategy) = self.strategy() {
            if !strategy.devices()[0].same_device(device) {
                return Err(Error::InvalidArgument(format!(
                    "cannot add {} on {device}: this model was created under a \
                     MirroredStrategy, which mirrors every layer on each of its replicas {:?}; \
                     add layers with add()",
                    layer.class_name(),
                    strategy
                        .devices()
                        .iter()
                        .map(|d| d.name())
                        .collect::<Vec<_>>()
                )));
            }
        }
        if let Some(last) = self.entries.last() {
            let act = last.layer.activation();
            if act.is_folded() {
                return Err(Error::InvalidArgument(format!(
                    "cannot add {} after '{}': a {act} activation is supported on the last \
                     layer only",
                    layer.class_name(),
                    last.name
                )));
            }
        }
        let input_shape = match self.entries.last() {
            None => layer.declared_input_shape().map(<[usize]>::to_vec),
            Some(prev) => {
                if let (Some(declared), Some(prev_out)) =
                    (layer.declared_input_shape(), prev.output_shape.as_deref())
                {
                    if declared != prev_out {
                        return Err(Error::ShapeMismatch {
                            op: "Sequential.add",
                            lhs: prev_out.to_vec(),
                            rhs: declared.to_vec(),
                            hint: format!(
                                ": {} declares input_shape {declared:?} but '{}' outputs \
                                 {prev_out:?}",
                                layer.class_name(),
                                prev.name
                            ),
                        });
                    }
                }
                prev.output_shape.clone()
            }
        };
        let base = layer.base_name();
        let same_kind = self
            .entries
            .iter()
            .filter(|e| e.layer.base_name() == base)
            .count();
        let name = match same_kind {
            0 => base.to_string(),
            n => format!("{base}_{n}"),
        };
        let output_shape = match &input_shape {
            Some(shape) => {
                let seed = derive_seed(self.seed, self.entries.len() as u64);
                layer.build(shape, seed, device)?;
                Some(layer.compute_output_shape(shape)?)
            }
            None => None,
        };
        let policy = layer
            .dtype_policy()
            .unwrap_or_else(mixed_precision::global_policy);
        self.entries.push(Entry {
            name,
            layer,
            device: device.clone(),
            policy,
            input_shape,
            output_shape,
        });
        let index = self.entries.len() - 1;
        if let Err(e) = self.mirror_layer(index) {
            self.entries.pop();
            if let Some(m) = self.mirrors.as_mut() {
                m.truncate(index);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Copies layer `index`, as it is now, to the other replicas (a no-op without a strategy).
    fn mirror_layer(&mut self, index: usize) -> Result<()> {
        match (self.mirrors.as_mut(), self.entries.get(index)) {
            (Some(m), Some(e)) => m.mirror_layer(index, e.layer.as_ref()),
            _ => Ok(()),
        }
    }

    /// Builds the layers not built yet for examples of `input_shape` (Keras'
    /// `model.build((None, *input_shape))`); needed only when the first layer has no
    /// `input_shape`.
    ///
    /// # Errors
    /// A shape error naming the first layer that cannot take its input.
    pub fn build(&mut self, input_shape: &[usize]) -> Result<()> {
        let mut shape = input_shape.to_vec();
        for (i, e) in self.entries.iter_mut().enumerate() {
            if e.input_shape.as_deref() != Some(&shape[..]) || e.output_shape.is_none() {
                // Unbuilt until every replica has the layer: a failure here (a replica out of
                // memory) leaves it to be built again, not half built.
                e.output_shape = None;
                e.layer
                    .build(&shape, derive_seed(self.seed, i as u64), &e.device)?;
                let output = e.layer.compute_output_shape(&shape)?;
                if let Some(m) = self.mirrors.as_mut() {
                    m.mirror_layer(i, e.layer.as_ref())?;
                }
                e.input_shape = Some(shape.clone());
                e.output_shape = Some(output);
            }
            shape = e.output_shape.clone().unwrap_or_default();
        }
        Ok(())
    }

    /// The input shape of one example, once known.
    pub fn input_shape(&self) -> Option<&[usize]> {
        self.entries.first().and_then(|e| e.input_shape.as_deref())
    }

    /// The output shape of one example, once built.
    pub fn output_shape(&self) -> Option<&[usize]> {
        self.entries.last().and_then(|e| e.output_shape.as_deref())
    }

    fn is_built(&self) -> bool {
        !self.entries.is_empty() && self.entries.iter().all(|e| e.output_shape.is_some())
    }

    pub(in crate::nn) fn require_built(&self, what: &str) -> Result<()> {
        if self.entries.is_empty() {
            return Err(Error::Model(format!("{what}: the model has no layers")));
        }
        if !self.is_built() {
            return Err(Error::Model(format!(
                "{what}: this model has not yet been built. Build the model first by giving \
                 the first layer an input_shape or by calling build(input_shape)"
            )));
        }
        Ok(())
    }

    /// The layer at `index`.
    pub fn layer(&self, index: usize) -> Option<&dyn Layer> {
        self.entries.get(index).map(|e| e.layer.as_ref())
    }

    /// The device of the layer at `index`.
    pub fn layer_device(&self, index: usize) -> Option<&LogicalDevice> {
        self.entries.get(index).map(|e| &e.device)
    }

    /// The distinct devices the model runs on: in layer order, or its strategy's replicas.
    pub fn devices(&self) -> Vec<LogicalDevice> {
        if let Some(strategy) = self.strategy() {
            return strategy.devices().to_vec();
        }
        distinct_devices(self.entries.iter().map(|e| &e.device))
            .into_iter()
            .cloned()
            .collect()
    }

    /// Total number of weight elements, trainable and not (`model.count_params()`).
    pub fn count_params(&self) -> usize {
        self.entries
            .iter()
            .map(|e| count_params(e.layer.as_ref()))
            .sum()
    }

    /// Waits until every device of the model has finished its work (for timing).
    ///
    /// # Errors
    /// A device error.
    pub fn synchronize(&self) -> Result<()> {
        for d in self.devices() {
            d.synchronize()?;
        }
        Ok(())
    }
}
