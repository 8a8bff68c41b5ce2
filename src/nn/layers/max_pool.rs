//! [`MaxPool2D`]: the max-pooling layer, its builder, its Keras config and its passes (the
//! 2×2 'valid' pool on its tuned kernels).

use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::mixed_precision::Policy;
use crate::nn::layer_config;
use crate::ops;
use crate::ops::spec::{Padding, Pool2dShape, Size2};
use crate::tensor::Tensor;

use super::{bad_input, image_shape, replace, saved, Layer};

/// Max pooling (`keras.layers.MaxPool2D(pool_size=2, strides=None, padding="valid")`):
/// `[h, w, c]` → `[oh, ow, c]`, each output the maximum of its window; strides default to the
/// window, so the default is the tutorial's 2×2 pool (7 → 3, rounding down). With
/// `padding='same'` (output `ceil(h / stride)`) the padding never wins.
///
/// ```
/// use anygpu::nn::{Layer, MaxPool2D};
/// use anygpu::ops::spec::Padding;
/// assert_eq!(MaxPool2D::new().compute_output_shape(&[7, 7, 128])?, [3, 3, 128]);
/// // A ResNet stem's pool: 3×3 windows, stride 2, 'same'.
/// let stem = MaxPool2D::new().pool_size(3).strides(2).padding(Padding::Same);
/// assert_eq!(stem.compute_output_shape(&[112, 112, 64])?, [56, 56, 64]);
/// assert!(MaxPool2D::new().pool_size(8).compute_output_shape(&[7, 7, 1]).is_err());
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// When windows tie, the gradient goes to the first maximum in row-major order, as
/// TensorFlow's kernels do. The 2×2, stride-2 `'valid'` pool runs tuned kernels and, after a
/// layer on the same device, a fused backward pass (`Layer::backward_through_max_pool`).
#[derive(Debug, Clone)]
pub struct MaxPool2D {
    pool_size: [usize; 2],
    strides: Option<[usize; 2]>,
    padding: Padding,
    policy: Option<Policy>,
}

impl MaxPool2D {
    /// `dtype=`: this layer's dtype policy, whatever the global one (a float32 output layer
    /// in a `mixed_float16` model, say).
    pub fn dtype_policy(mut self, policy: Policy) -> MaxPool2D {
        self.policy = Some(policy);
        self
    }

    /// `pool_size=2`, `strides=None` (the window), `padding='valid'`.
    pub fn new() -> MaxPool2D {
        MaxPool2D {
            pool_size: [2, 2],
            strides: None,
            padding: Padding::Valid,
            policy: None,
        }
    }

    /// `pool_size=`: `3` or `(3, 2)` (rows, columns).
    pub fn pool_size(mut self, pool_size: impl Into<Size2>) -> MaxPool2D {
        self.pool_size = pool_size.into().0;
        self
    }

    /// `strides=`: `2` or `(2, 1)`; the window when not given.
    pub fn strides(mut self, strides: impl Into<Size2>) -> MaxPool2D {
        self.strides = Some(strides.into().0);
        self
    }

    /// `padding='valid'` or `'same'`.
    pub fn padding(mut self, padding: Padding) -> MaxPool2D {
        self.padding = padding;
        self
    }

    /// The windows over one image of `input_shape` (`n = 1`).
    fn geometry(&self, input_shape: &[usize]) -> Result<Pool2dShape> {
        let (h, w, c) = image_shape("MaxPool2D", input_shape)?;
        let pool = (self.pool_size[0], self.pool_size[1]);
        let strides = self.strides.unwrap_or(self.pool_size);
        let strides = (strides[0], strides[1]);
        if pool.0 == 0 || pool.1 == 0 || strides.0 == 0 || strides.1 == 0 {
            return Err(Error::InvalidArgument(format!(
                "MaxPool2D: pool_size {pool:?} and strides {strides:?} must be positive"
            )));
        }
        Ok(Pool2dShape {
            n: 1,
            h,
            w,
            c,
            pool,
            strides,
            padding: self.padding,
        })
    }
}

impl Default for MaxPool2D {
    fn default() -> Self {
        MaxPool2D::new()
    }
}

impl Layer for MaxPool2D {
    fn dtype_policy(&self) -> Option<Policy> {
        self.policy
    }

    fn boxed_clone(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }

    fn get_config(&self) -> Option<serde_json::Value> {
        let mut c = serde_json::Map::new();
        let strides = self.strides.unwrap_or(self.pool_size);
        c.insert("pool_size".into(), layer_config::size2(self.pool_size));
        c.insert("strides".into(), layer_config::size2(strides));
        c.insert(
            "padding".into(),
            layer_config::padding_name(self.padding).into(),
        );
        c.insert("data_format".into(), "channels_last".into());
        Some(layer_config::with_dtype(c, self.policy))
    }

    fn class_name(&self) -> &'static str {
        "MaxPooling2D"
    }

    fn base_name(&self) -> &'static str {
        "max_pooling2d"
    }

    fn compute_output_shape(&self, input_shape: &[usize]) -> Result<Vec<usize>> {
        let s = self.geometry(input_shape)?;
        let (oh, ow) = s.out_hw();
        if oh == 0 || ow == 0 {
            let [ph, pw] = self.pool_size;
            return Err(bad_input(
                "MaxPool",
                input_shape,
                format!(": a {ph}x{pw} pool with padding='valid' needs at least {ph}x{pw} pixels"),
            ));
        }
        Ok(vec![oh, ow, s.c])
    }

    fn build(&mut self, input_shape: &[usize], _seed: u64, _device: &LogicalDevice) -> Result<()> {
        self.compute_output_shape(input_shape).map(|_| ())
    }

    fn weights(&self) -> Vec<(&'static str, &Tensor)> {
        Vec::new()
    }

    fn set_weight(&mut self, index: usize, value: Tensor) -> Result<()> {
        replace("MaxPool2D", &mut [], index, value)
    }

    fn is_max_pool_2x2(&self) -> bool {
        self.pool_size == [2, 2]
            && self.strides.unwrap_or(self.pool_size) == [2, 2]
            && self.padding == Padding::Valid
    }

    fn forward(&self, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        let s = self.geometry(x.shape().get(1..).unwrap_or_default())?;
        let y = ops::max_pool2d_window(x, s.pool, s.strides, s.padding)?;
        Ok((y, vec![x.clone()]))
    }

    fn backward(
        &self,
        saved_tensors: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Vec<Tensor>)> {
        let [x] = saved::<1>("MaxPool2D", saved_tensors)?;
        let dx = if need_dx {
            let s = self.geometry(x.shape().get(1..).unwrap_or_default())?;
            Some(ops::max_pool2d_window_backward(
                &x, dy, s.pool, s.strides, s.padding,
            )?)
        } else {
            None
        };
        Ok((dx, Vec::new()))
    }
}
