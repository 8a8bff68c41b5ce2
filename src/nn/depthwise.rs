//! Keras' `DepthwiseConv2D` layer.

use crate::device::LogicalDevice;
use crate::error::Result;
use crate::mixed_precision::Policy;
use crate::nn::activation::Activation;
use crate::nn::conv_args::Window;
use crate::nn::init::{derive_seed, glorot_uniform, positive, zeros};
use crate::nn::layer_config;
use crate::nn::layers::{
    activate_separately, activation_and_bias_grad, backward_weights, image_shape, in_dtype,
    not_built, replace, saved, through_separate, weights_of, Layer,
};
use crate::ops::spec::{Padding, Size2};
use crate::ops::{self, GradDType};
use crate::tensor::Tensor;

/// Depthwise 2-D convolution (`keras.layers.DepthwiseConv2D(kernel_size, strides, padding,
/// depth_multiplier, dilation_rate, activation, use_bias)`): each input channel correlated
/// with `depth_multiplier` kernels of its own, output channel `c * depth_multiplier + q` for
/// input channel `c`, then the bias and the activation.
///
/// Weights, with Keras 3's names: `kernel` `[kh, kw, in, depth_multiplier]` (glorot_uniform),
/// `bias` `[in * depth_multiplier]` (zeros; none with `use_bias(false)`).
///
/// ```
/// use anygpu::nn::{DepthwiseConv2D, Layer};
/// use anygpu::ops::spec::Padding;
/// // Keras' defaults: strides 1, 'valid', depth_multiplier 1.
/// assert_eq!(DepthwiseConv2D::new(3).compute_output_shape(&[7, 6, 4])?, [5, 4, 4]);
/// let dw = DepthwiseConv2D::new(3).strides(2).padding(Padding::Same).depth_multiplier(2);
/// assert_eq!(dw.compute_output_shape(&[7, 6, 4])?, [4, 3, 8]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// Differences from Keras: channels last only.
#[derive(Debug, Clone)]
pub struct DepthwiseConv2D {
    window: Window,
    depth_multiplier: usize,
    use_bias: bool,
    activation: Activation,
    input_shape: Option<Vec<usize>>,
    policy: Option<Policy>,
    /// `[kernel, bias]` (`[kernel]` without a bias) once built.
    weights: Vec<Tensor>,
}

impl DepthwiseConv2D {
    /// A `kernel_size` window (`3` or `(3, 5)`), Keras' defaults: `strides=1`,
    /// `padding='valid'`, `depth_multiplier=1`, `dilation_rate=1`, no activation,
    /// `use_bias=True`.
    pub fn new(kernel_size: impl Into<Size2>) -> DepthwiseConv2D {
        DepthwiseConv2D {
            window: Window::new(kernel_size.into().0, Padding::Valid),
            depth_multiplier: 1,
            use_bias: true,
            activation: Activation::Linear,
            input_shape: None,
            policy: None,
            weights: Vec::new(),
        }
    }

    /// `dtype=`: this layer's dtype policy, whatever the global one.
    pub fn dtype_policy(mut self, policy: Policy) -> DepthwiseConv2D {
        self.policy = Some(policy);
        self
    }

    /// `strides=`: `2` or `(2, 1)`.
    pub fn strides(mut self, strides: impl Into<Size2>) -> DepthwiseConv2D {
        self.window.options = self.window.options.strides(strides);
        self
    }

    /// `padding='same'` or `'valid'` (the default).
    pub fn padding(mut self, padding: Padding) -> DepthwiseConv2D {
        self.window.options.padding = padding;
        self
    }

    /// `dilation_rate=`: `2` or `(2, 1)`.
    pub fn dilation_rate(mut self, dilation_rate: impl Into<Size2>) -> DepthwiseConv2D {
        self.window.options = self.window.options.dilation(dilation_rate);
        self
    }

    /// `depth_multiplier=`: outputs per input channel.
    pub fn depth_multiplier(mut self, depth_multiplier: usize) -> DepthwiseConv2D {
        self.depth_multiplier = depth_multiplier;
        self
    }

    /// `use_bias=`.
    pub fn use_bias(mut self, use_bias: bool) -> DepthwiseConv2D {
        self.use_bias = use_bias;
        self
    }

    /// `activation=`.
    pub fn activation(mut self, activation: Activation) -> DepthwiseConv2D {
        self.activation = activation;
        self
    }

    /// `input_shape=[h, w, c]`, for the first layer of a model.
    pub fn input_shape(mut self, shape: &[usize]) -> DepthwiseConv2D {
        self.input_shape = Some(shape.to_vec());
        self
    }
}

impl Layer for DepthwiseConv2D {
    fn dtype_policy(&self) -> Option<Policy> {
        self.policy
    }

    fn boxed_clone(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }

    fn get_config(&self) -> Option<serde_json::Value> {
        let mut c = layer_config::window_config(&self.window);
        c.insert("depth_multiplier".into(), self.depth_multiplier.into());
        c.insert(
            "activation".into(),
            layer_config::activation_value(self.activation),
        );
        c.insert("use_bias".into(), self.use_bias.into());
        Some(layer_config::with_dtype(c, self.policy))
    }

    fn class_name(&self) -> &'static str {
        "DepthwiseConv2D"
    }

    fn base_name(&self) -> &'static str {
        "depthwise_conv2d"
    }

    fn declared_input_shape(&self) -> Option<&[usize]> {
        self.input_shape.as_deref()
    }

    fn activation(&self) -> Activation {
        self.activation
    }

    fn compute_output_shape(&self, input_shape: &[usize]) -> Result<Vec<usize>> {
        let layer = "DepthwiseConv2D";
        positive(layer, "depth_multiplier", self.depth_multiplier)?;
        let (h, w, c) = image_shape(layer, input_shape)?;
        let [oh, ow] = self.window.output_hw(layer, &[h, w])?;
        Ok(vec![oh, ow, c * self.depth_multiplier])
    }

    fn build(&mut self, input_shape: &[usize], seed: u64, device: &LogicalDevice) -> Result<()> {
        self.compute_output_shape(input_shape)?;
        let ([kh, kw], c, m) = (self.window.kernel, input_shape[2], self.depth_multiplier);
        let mut weights = vec![glorot_uniform(
            &[kh, kw, c, m],
            derive_seed(seed, 0),
            device,
        )?];
        if self.use_bias {
            weights.push(zeros(&[c * m], device)?);
        }
        self.weights = weights;
        Ok(())
    }

    fn weights(&self) -> Vec<(&'static str, &Tensor)> {
        weights_of(&["kernel", "bias"], &self.weights)
    }

    fn autocast_weights(&self) -> &[Tensor] {
        &self.weights
    }

    fn set_weight(&mut self, index: usize, value: Tensor) -> Result<()> {
        replace("DepthwiseConv2D", &mut self.weights, index, value)
    }

    fn forward(&self, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        let w = in_dtype("DepthwiseConv2D", &self.weights, x.dtype())?;
        let (kernel, bias) = match &w[..] {
            [kernel, bias] => (kernel, Some(bias)),
            [kernel] => (kernel, None),
            _ => return Err(not_built("DepthwiseConv2D")),
        };
        let (opts, act) = (self.window.options, self.activation.fused());
        let z = ops::depthwise_conv2d_with(x, kernel, bias, opts, act)?;
        let (y, kept) = activate_separately(z, self.activation)?;
        Ok((y, vec![x.clone(), kept]))
    }

    fn backward(
        &self,
        saved_tensors: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Vec<Tensor>)> {
        let layer = "DepthwiseConv2D";
        let w = if self.use_bias {
            backward_weights(layer, &self.weights, dy.dtype())?
        } else {
            in_dtype(layer, &self.weights, dy.dtype())?
        };
        let [kernel] = &w[..] else {
            return Err(not_built(layer));
        };
        let [x, kept] = saved::<2>(layer, saved_tensors)?;
        let (dy, y, activation) = through_separate(dy, &kept, self.activation)?;
        let opts = self.window.options;
        let (dz, db) = activation_and_bias_grad(&dy, &y, activation)?;
        let grads = GradDType::Float32;
        let dk = ops::depthwise_conv2d_backward_kernel_as(&x, &dz, kernel.shape(), opts, grads)?;
        let dx = if need_dx {
            Some(ops::depthwise_conv2d_backward_input_with(
                &dz,
                kernel,
                x.shape(),
                opts,
            )?)
        } else {
            None
        };
        let grads = if self.use_bias {
            vec![dk, db]
        } else {
            vec![dk]
        };
        Ok((dx, grads))
    }
}
