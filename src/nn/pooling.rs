//! Pooling layers beyond the tutorial's 2×2 max-pool: [`AveragePooling2D`] (any window,
//! strides and padding), [`GlobalAveragePooling2D`] and [`GlobalMaxPooling2D`]. No weights.

use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::mixed_precision::Policy;
use crate::nn::layer_config;
use crate::nn::layers::{bad_input, image_shape, replace, saved, Layer};
use crate::ops;
use crate::ops::spec::{Padding, Pool2dShape};
use crate::tensor::Tensor;

/// Average pooling (`keras.layers.AveragePooling2D(pool_size, strides=None,
/// padding="valid")`): `[h, w, c]` → `[oh, ow, c]`, each output the mean of its window; strides
/// default to the window. With `padding='same'` (output `ceil(h / stride)`) a window that
/// overhangs the image averages the elements inside it only, as TensorFlow does.
///
/// ```
/// use anygpu::nn::{AveragePooling2D, Layer};
/// use anygpu::ops::spec::Padding;
/// let pool = AveragePooling2D::new((2, 2));
/// assert_eq!(pool.compute_output_shape(&[7, 7, 8])?, [3, 3, 8]);
/// let same = AveragePooling2D::new((3, 3)).strides((2, 2)).padding(Padding::Same);
/// assert_eq!(same.compute_output_shape(&[7, 7, 8])?, [4, 4, 8]);
/// assert_eq!(pool.base_name(), "average_pooling2d");
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct AveragePooling2D {
    pool_size: (usize, usize),
    strides: Option<(usize, usize)>,
    padding: Padding,
    input_shape: Option<Vec<usize>>,
    policy: Option<Policy>,
}

impl AveragePooling2D {
    /// `pool_size=(rows, columns)` (Keras requires it), `strides` the same, `'valid'`.
    pub fn new(pool_size: (usize, usize)) -> AveragePooling2D {
        AveragePooling2D {
            pool_size,
            strides: None,
            padding: Padding::Valid,
            input_shape: None,
            policy: None,
        }
    }

    /// `strides=(rows, columns)`.
    pub fn strides(mut self, strides: (usize, usize)) -> AveragePooling2D {
        self.strides = Some(strides);
        self
    }

    /// `padding='valid'` or `'same'`.
    pub fn padding(mut self, padding: Padding) -> AveragePooling2D {
        self.padding = padding;
        self
    }

    /// `input_shape=[h, w, c]`, for the first layer of a model.
    pub fn input_shape(mut self, shape: &[usize]) -> AveragePooling2D {
        self.input_shape = Some(shape.to_vec());
        self
    }

    /// `dtype=`: this layer's dtype policy, whatever the global one.
    pub fn dtype_policy(mut self, policy: Policy) -> AveragePooling2D {
        self.policy = Some(policy);
        self
    }

    fn strides_or_pool(&self) -> (usize, usize) {
        self.strides.unwrap_or(self.pool_size)
    }
}

impl Layer for AveragePooling2D {
    fn class_name(&self) -> &'static str {
        "AveragePooling2D"
    }

    fn base_name(&self) -> &'static str {
        "average_pooling2d"
    }

    fn declared_input_shape(&self) -> Option<&[usize]> {
        self.input_shape.as_deref()
    }

    fn dtype_policy(&self) -> Option<Policy> {
        self.policy
    }

    fn compute_output_shape(&self, input_shape: &[usize]) -> Result<Vec<usize>> {
        let (h, w, c) = image_shape("AveragePooling2D", input_shape)?;
        let (pool, strides) = (self.pool_size, self.strides_or_pool());
        if pool.0 == 0 || pool.1 == 0 || strides.0 == 0 || strides.1 == 0 {
            return Err(Error::InvalidArgument(format!(
                "AveragePooling2D: pool_size {pool:?} and strides {strides:?} must be positive"
            )));
        }
        let s = Pool2dShape {
            n: 1,
            h,
            w,
            c,
            pool,
            strides,
            padding: self.padding,
        };
        let (oh, ow) = s.out_hw();
        if oh == 0 || ow == 0 {
            return Err(bad_input(
                "AveragePooling2D",
                input_shape,
                format!(
                    ": a {}x{} window with padding='valid' needs at least {}x{} pixels",
                    pool.0, pool.1, pool.0, pool.1
                ),
            ));
        }
        Ok(vec![oh, ow, c])
    }

    fn build(&mut self, input_shape: &[usize], _seed: u64, _device: &LogicalDevice) -> Result<()> {
        self.compute_output_shape(input_shape).map(|_| ())
    }

    fn weights(&self) -> Vec<(&'static str, &Tensor)> {
        Vec::new()
    }

    fn set_weight(&mut self, index: usize, value: Tensor) -> Result<()> {
        replace("AveragePooling2D", &mut [], index, value)
    }

    fn forward(&self, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        let y = ops::avg_pool2d(x, self.pool_size, self.strides_or_pool(), self.padding)?;
        Ok((y, vec![x.clone()]))
    }

    fn backward(
        &self,
        saved_tensors: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Vec<Tensor>)> {
        let [x] = saved::<1>("AveragePooling2D", saved_tensors)?;
        if !need_dx {
            return Ok((None, Vec::new()));
        }
        let dx = ops::avg_pool2d_backward(
            dy,
            x.shape(),
            self.pool_size,
            self.strides_or_pool(),
            self.padding,
        )?;
        Ok((Some(dx), Vec::new()))
    }

    fn boxed_clone(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }

    fn get_config(&self) -> Option<serde_json::Value> {
        let mut c = serde_json::Map::new();
        let (ph, pw) = self.pool_size;
        let (sh, sw) = self.strides_or_pool();
        c.insert("pool_size".into(), layer_config::size2([ph, pw]));
        c.insert("strides".into(), layer_config::size2([sh, sw]));
        c.insert(
            "padding".into(),
            layer_config::padding_name(self.padding).into(),
        );
        c.insert("data_format".into(), "channels_last".into());
        Some(layer_config::with_dtype(c, self.policy))
    }
}

/// The global poolings' shared layer logic: `[h, w, c]` → `[c]`.
#[derive(Debug, Clone, Default)]
struct Global {
    input_shape: Option<Vec<usize>>,
    policy: Option<Policy>,
}

impl Global {
    fn output_shape(op: &'static str, input_shape: &[usize]) -> Result<Vec<usize>> {
        let (_, _, c) = image_shape(op, input_shape)?;
        Ok(vec![c])
    }

    fn backward(
        op: &str,
        max: bool,
        saved_tensors: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Vec<Tensor>)> {
        let [x] = saved::<1>(op, saved_tensors)?;
        if !need_dx {
            return Ok((None, Vec::new()));
        }
        Ok((Some(ops::global_pool2d_backward(&x, dy, max)?), Vec::new()))
    }
}

macro_rules! global_pooling {
    ($(#[$doc:meta])* $name:ident, $class:literal, $base:literal, $max:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default)]
        pub struct $name(Global);

        impl $name {
            /// Keras' defaults (`keepdims=False`, channels last).
            pub fn new() -> $name {
                $name::default()
            }

            /// `input_shape=[h, w, c]`, for the first layer of a model.
            pub fn input_shape(mut self, shape: &[usize]) -> $name {
                self.0.input_shape = Some(shape.to_vec());
                self
            }

            /// `dtype=`: this layer's dtype policy, whatever the global one.
            pub fn dtype_policy(mut self, policy: Policy) -> $name {
                self.0.policy = Some(policy);
                self
            }
        }

        impl Layer for $name {
            fn class_name(&self) -> &'static str {
                $class
            }

            fn base_name(&self) -> &'static str {
                $base
            }

            fn declared_input_shape(&self) -> Option<&[usize]> {
                self.0.input_shape.as_deref()
            }

            fn dtype_policy(&self) -> Option<Policy> {
                self.0.policy
            }

            fn compute_output_shape(&self, input_shape: &[usize]) -> Result<Vec<usize>> {
                Global::output_shape($class, input_shape)
            }

            fn build(
                &mut self,
                input_shape: &[usize],
                _seed: u64,
                _device: &LogicalDevice,
            ) -> Result<()> {
                self.compute_output_shape(input_shape).map(|_| ())
            }

            fn weights(&self) -> Vec<(&'static str, &Tensor)> {
                Vec::new()
            }

            fn set_weight(&mut self, index: usize, value: Tensor) -> Result<()> {
                replace($class, &mut [], index, value)
            }

            fn is_global_average_pool(&self) -> bool {
                !$max
            }

            fn forward(&self, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
                Ok((ops::global_pool2d(x, $max)?, vec![x.clone()]))
            }

            fn backward(
                &self,
                saved_tensors: &[Tensor],
                dy: &Tensor,
                need_dx: bool,
            ) -> Result<(Option<Tensor>, Vec<Tensor>)> {
                Global::backward($class, $max, saved_tensors, dy, need_dx)
            }

            fn boxed_clone(&self) -> Box<dyn Layer> {
                Box::new(self.clone())
            }

            fn get_config(&self) -> Option<serde_json::Value> {
                let mut c = serde_json::Map::new();
                c.insert("data_format".into(), "channels_last".into());
                c.insert("keepdims".into(), false.into());
                Some(layer_config::with_dtype(c, self.0.policy))
            }
        }
    };
}

global_pooling!(
    /// The mean over each image's pixels (`keras.layers.GlobalAveragePooling2D()`):
    /// `[h, w, c]` → `[c]` (`keepdims=False`). No weights.
    ///
    /// ```
    /// use anygpu::nn::{GlobalAveragePooling2D, Layer};
    /// let gap = GlobalAveragePooling2D::new();
    /// assert_eq!(gap.compute_output_shape(&[7, 7, 128])?, [128]);
    /// assert_eq!(gap.base_name(), "global_average_pooling2d");
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    GlobalAveragePooling2D,
    "GlobalAveragePooling2D",
    "global_average_pooling2d",
    false
);

global_pooling!(
    /// The maximum over each image's pixels (`keras.layers.GlobalMaxPooling2D()`):
    /// `[h, w, c]` → `[c]` (`keepdims=False`); the gradient is shared by the pixels equal to the
    /// maximum, as TensorFlow's `reduce_max` shares it. No weights.
    ///
    /// ```
    /// use anygpu::nn::{GlobalMaxPooling2D, Layer};
    /// assert_eq!(GlobalMaxPooling2D::new().compute_output_shape(&[3, 3, 16])?, [16]);
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    GlobalMaxPooling2D,
    "GlobalMaxPooling2D",
    "global_max_pooling2d",
    true
);
