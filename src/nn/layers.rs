//! The layers of the tutorial CNN: [`Conv2D`], [`SeparableConv2D`], [`MaxPool2D`], [`Flatten`]
//! and [`Dense`], and the [`Layer`] trait they implement.
//!
//! Shapes exclude the batch axis, as Keras' `input_shape=` does: an image layer takes
//! `[height, width, channels]` (NHWC with the batch in front), a [`Dense`] layer `[features]`.

use std::fmt;

use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::mixed_precision::Policy;
use crate::nn::activation::Activation;
use crate::nn::conv_args::Window;
use crate::nn::init::{derive_seed, glorot_uniform, positive, zeros};
use crate::nn::layer_config;
use crate::ops;
use crate::ops::spec::{Activation as OpActivation, Padding, Pool2dShape, Size2};
use crate::tensor::{DType, Tensor};

/// A layer of a [`crate::nn::Sequential`] model (Keras' `keras.layers.Layer`).
///
/// A layer is created with its hyper-parameters, then *built* once its input shape is known:
/// `build` creates the weights on the layer's device. The model runs
/// [`call`](Layer::call)`(x, training)`: in a training step (`training = true`) it returns the
/// output and the tensors the backward pass needs (by default [`forward`](Layer::forward)),
/// then [`backward`](Layer::backward) gets the gradient of the loss w.r.t. the output; in
/// `evaluate`, `predict` and validation `training = false` and nothing goes backward.
/// A layer with a `softmax` activation returns its logits from `forward`; the model folds the
/// softmax into the loss (see [`Activation::Softmax`]).
///
/// The five layers of this module and [`crate::nn::BatchNormalization`] and
/// [`crate::nn::Dropout`] implement it; another implementation is a custom layer (it needs
/// only the required methods: `call`, `non_trainable_weights` and the others have defaults).
///
/// ```
/// use anygpu::nn::{Conv2D, Layer};
/// use anygpu::ops::spec::Padding;
/// let conv = Conv2D::new(32, 3).padding(Padding::Same);
/// assert_eq!(conv.class_name(), "Conv2D");
/// assert_eq!(conv.compute_output_shape(&[28, 28, 1])?, [28, 28, 32]);
/// # Ok::<(), anygpu::Error>(())
/// ```
pub trait Layer: fmt::Debug + Send + Sync {
    /// Keras' class name, shown in the summary: `Conv2D`, `SeparableConv2D`, ...
    fn class_name(&self) -> &'static str;

    /// Keras' automatic name before numbering: `conv2d`, `separable_conv2d`, ...
    fn base_name(&self) -> &'static str;

    /// The `input_shape=` this layer was given, if any (first layer of a model).
    fn declared_input_shape(&self) -> Option<&[usize]> {
        None
    }

    /// The layer's activation (`linear` for layers without one).
    fn activation(&self) -> Activation {
        Activation::Linear
    }

    /// The dtype policy the layer was given (Keras' `dtype=`), if any; a model gives a layer
    /// without one the global policy when it is added (see [`crate::mixed_precision`]).
    fn dtype_policy(&self) -> Option<Policy> {
        None
    }

    /// The output shape for an input shape (both without the batch axis).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when the layer cannot take that input.
    fn compute_output_shape(&self, input_shape: &[usize]) -> Result<Vec<usize>>;

    /// Creates the weights for `input_shape` on `device`, initialized from `seed` (Keras'
    /// `build`). Calling it again re-creates them.
    ///
    /// # Errors
    /// A shape error, or the device's out-of-memory error.
    fn build(&mut self, input_shape: &[usize], seed: u64, device: &LogicalDevice) -> Result<()>;

    /// The trainable weights with their Keras names (`kernel`, `bias`, ...), in Keras' order;
    /// empty before `build`.
    fn weights(&self) -> Vec<(&'static str, &Tensor)>;

    /// Replaces weight `index` (of [`weights`](Layer::weights)) with a tensor of the same shape.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] for another shape, [`Error::InvalidArgument`] for a bad index.
    fn set_weight(&mut self, index: usize, value: Tensor) -> Result<()>;

    /// The output for a batch `x` in training, and the tensors [`backward`](Layer::backward)
    /// needs (the training pass; see [`call`](Layer::call)).
    ///
    /// # Errors
    /// Shape errors, device errors, or [`Error::Model`] when the layer is not built.
    fn forward(&self, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)>;

    /// Keras' `layer(x, training=...)`: what the model runs. `training = true` in training
    /// steps (the output, and the tensors [`backward`](Layer::backward) needs); `false` in
    /// `evaluate`, `predict` and validation, where nothing goes backward, so a layer should
    /// keep nothing (the model drops what it returns then anyway).
    ///
    /// Provided: [`forward`](Layer::forward) either way, which is right for every layer whose
    /// output does not depend on the mode. [`crate::nn::BatchNormalization`] (batch statistics
    /// vs moving ones) and [`crate::nn::Dropout`] (a mask vs the identity) override it.
    ///
    /// # Errors
    /// As [`forward`](Layer::forward).
    fn call(&self, x: &Tensor, training: bool) -> Result<(Tensor, Vec<Tensor>)> {
        let _ = training;
        self.forward(x)
    }

    /// The non-trainable variables with their Keras names (Keras' `non_trainable_weights`:
    /// `BatchNormalization`'s `moving_mean` and `moving_variance`), in Keras' order; empty for
    /// most layers (the default) and before `build`.
    ///
    /// The layer itself updates them, in place on its device, during a training
    /// [`call`](Layer::call); the optimizer never sees them. The model saves and restores them
    /// with the weights ([`crate::nn::Sequential::save_weights`], checkpoints), copies them to
    /// its replicas under a [`crate::distribute::MirroredStrategy`] and counts them as
    /// "Non-trainable params".
    fn non_trainable_weights(&self) -> Vec<(&'static str, &Tensor)> {
        Vec::new()
    }

    /// Replaces non-trainable variable `index` (of
    /// [`non_trainable_weights`](Layer::non_trainable_weights)) with a tensor of the same shape.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] for another shape, [`Error::InvalidArgument`] for a bad index
    /// (every index, by default).
    fn set_non_trainable_weight(&mut self, index: usize, value: Tensor) -> Result<()> {
        replace(self.class_name(), &mut [], index, value)
    }

    /// From the gradient `dy` of the loss w.r.t. the output: the gradient w.r.t. the input
    /// (when `need_dx`) and one gradient per weight, in [`weights`](Layer::weights) order.
    ///
    /// # Errors
    /// As [`forward`](Layer::forward).
    fn backward(
        &self,
        saved: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Vec<Tensor>)>;

    /// Whether this layer is a 2×2, stride-2 max-pool, whose backward pass the layer before it
    /// may take over (see [`backward_through_max_pool`](Layer::backward_through_max_pool)).
    fn is_max_pool_2x2(&self) -> bool {
        false
    }

    /// This layer's [`backward`](Layer::backward) pass followed by that of a 2×2 max-pool of
    /// its output, in one: from `dpooled`, the gradient w.r.t. the pool's output, the gradient
    /// w.r.t. this layer's input (when `need_dx`) and its weight gradients. `Ok(None)` when the
    /// layer has no fused version where it runs; the model then runs the two passes.
    ///
    /// A model asks this when a [`MaxPool2D`] on the same device follows the layer.
    ///
    /// # Errors
    /// As [`backward`](Layer::backward).
    fn backward_through_max_pool(
        &self,
        saved: &[Tensor],
        dpooled: &Tensor,
        need_dx: bool,
    ) -> Result<Option<(Option<Tensor>, Vec<Tensor>)>> {
        let _ = (saved, dpooled, need_dx);
        Ok(None)
    }

    /// A copy of the layer: its configuration, and its weights as handles to the same
    /// storage (`Box::new(self.clone())`). [`crate::distribute::MirroredStrategy`] makes its
    /// replicas this way, then gives each copy its own weights on its replica's device through
    /// [`set_weight`](Layer::set_weight) and
    /// [`set_non_trainable_weight`](Layer::set_non_trainable_weight) — so every tensor the
    /// layer updates must be one of its [`weights`](Layer::weights) or
    /// [`non_trainable_weights`](Layer::non_trainable_weights), or the copies would share it.
    fn boxed_clone(&self) -> Box<dyn Layer>;

    /// The layer's hyper-parameters as Keras' `layer.get_config()` writes them, with Keras'
    /// key names (`filters`, `kernel_size`, `strides`, `padding`, `activation`, `use_bias`,
    /// ...) and `dtype` when the layer was given a policy of its own; not its weights, its
    /// name (the model gives it one) or its `input_shape` (the model's config holds that).
    /// [`crate::nn::layer_from_config`] rebuilds the layer from it, and
    /// [`crate::nn::Sequential::save`] stores it so that [`crate::nn::load_model`] can.
    ///
    /// Provided: `None`, "this layer cannot be saved"; every built-in layer has a config, a
    /// custom layer has none unless it adds one (it still cannot be *loaded* by
    /// `load_model`, which knows only the built-in classes: build the model in code and use
    /// [`crate::nn::Sequential::load_weights`]).
    ///
    /// ```
    /// use anygpu::nn::{Activation, Dense, Layer};
    /// let config = Dense::new(10).activation(Activation::Softmax).get_config().expect("config");
    /// assert_eq!(config["units"], 10);
    /// assert_eq!(config["activation"], "softmax");
    /// ```
    fn get_config(&self) -> Option<serde_json::Value> {
        None
    }
}

/// Number of elements of the weights of a layer, trainable and not (Keras'
/// `count_params()`).
pub(crate) fn count_params(layer: &dyn Layer) -> usize {
    variables(layer).iter().map(|(_, t)| t.len()).sum()
}

/// Number of elements of the non-trainable weights of a layer.
pub(crate) fn count_non_trainable(layer: &dyn Layer) -> usize {
    layer
        .non_trainable_weights()
        .iter()
        .map(|(_, t)| t.len())
        .sum()
}

/// Every variable of a layer: its trainable weights, then its non-trainable ones (Keras'
/// `layer.weights`, the order `get_weights`, weight files and checkpoints use).
pub(crate) fn variables(layer: &dyn Layer) -> Vec<(&'static str, &Tensor)> {
    let mut all = layer.weights();
    all.extend(layer.non_trainable_weights());
    all
}

/// Replaces variable `index` of [`variables`].
pub(crate) fn set_variable(layer: &mut dyn Layer, index: usize, value: Tensor) -> Result<()> {
    let trainable = layer.weights().len();
    match index.checked_sub(trainable) {
        None => layer.set_weight(index, value),
        Some(j) => layer.set_non_trainable_weight(j, value),
    }
}

pub(crate) fn not_built(layer: &str) -> Error {
    Error::Model(format!(
        "{layer} is not built: add it to a Sequential model whose input shape is known"
    ))
}

pub(crate) fn bad_input(op: &'static str, got: &[usize], hint: String) -> Error {
    Error::ShapeMismatch {
        op,
        lhs: got.to_vec(),
        rhs: Vec::new(),
        hint,
    }
}

pub(crate) fn saved<const N: usize>(layer: &str, saved: &[Tensor]) -> Result<[Tensor; N]> {
    <[Tensor; N]>::try_from(saved.to_vec()).map_err(|v| {
        Error::Model(format!(
            "{layer}.backward: expected {N} saved tensors from forward, got {}",
            v.len()
        ))
    })
}

pub(crate) fn replace(
    layer: &str,
    weights: &mut [Tensor],
    index: usize,
    value: Tensor,
) -> Result<()> {
    let n = weights.len();
    let slot = weights.get_mut(index).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{layer}: weight index {index} out of range (the layer has {n} weights)"
        ))
    })?;
    if slot.shape() != value.shape() {
        return Err(Error::ShapeMismatch {
            op: "set_weights",
            lhs: slot.shape().to_vec(),
            rhs: value.shape().to_vec(),
            hint: format!(": {layer} weight {index} must keep its shape"),
        });
    }
    *slot = value;
    Ok(())
}

/// `(dz, db)`: `dz = dy * act'(z)` from the layer's output `y` (`dy` itself for linear, and for
/// softmax, whose derivative the fused loss already applied) and the bias gradient, in one op.
pub(super) fn activation_and_bias_grad(
    dy: &Tensor,
    y: &Tensor,
    act: Activation,
) -> Result<(Tensor, Tensor)> {
    ops::activation_bias_grad(dy, y, act.fused())
}

// ---- activations and pooling layers ----

/// A product's output `z` through the layer's activation where that runs as its own op
/// ([`Activation::separate`]): `(y, kept)`, `kept` being what the gradient reads (the output
/// `y`, or `z` for the activations whose derivative needs the input). Fused activations pass
/// `z` through as both.
pub(super) fn activate_separately(z: Tensor, act: Activation) -> Result<(Tensor, Tensor)> {
    match act.separate() {
        None => Ok((z.clone(), z)),
        Some(f) => {
            let y = ops::activation_fn(&z, f)?;
            let kept = if f.grad_from_output() { y.clone() } else { z };
            Ok((y, kept))
        }
    }
}

/// What a layer's fused backward kernels take, `(dy, y, act)`: as given for a fused
/// activation; for a separate one `dz = dy · act'` (from what [`activate_separately`] kept),
/// with `dz` standing in for `y` (a linear gradient does not read it) and a linear activation.
pub(super) fn through_separate(
    dy: &Tensor,
    kept: &Tensor,
    act: Activation,
) -> Result<(Tensor, Tensor, Activation)> {
    match act.separate() {
        None => Ok((dy.clone(), kept.clone(), act)),
        Some(f) => {
            let dz = ops::activation_fn_backward(dy, kept, f, f.grad_from_output())?;
            Ok((dz.clone(), dz, Activation::Linear))
        }
    }
}
// ----

pub(super) fn image_shape(op: &'static str, input: &[usize]) -> Result<(usize, usize, usize)> {
    match *input {
        [h, w, c] if h > 0 && w > 0 && c > 0 => Ok((h, w, c)),
        _ => Err(bad_input(
            op,
            input,
            format!(
                ": {op} takes inputs of shape [height, width, channels] (without the batch \
                 axis), got {input:?}"
            ),
        )),
    }
}

pub(crate) fn weights_of<'a>(
    names: &[&'static str],
    w: &'a [Tensor],
) -> Vec<(&'static str, &'a Tensor)> {
    names.iter().copied().zip(w.iter()).collect()
}

// ---------------------------------------------------------------------------------------------

/// 2-D convolution (`keras.layers.Conv2D(filters, kernel_size, strides, padding,
/// dilation_rate, activation, use_bias, input_shape)`).
///
/// Weights: `kernel` `[kh, kw, in, filters]` (glorot_uniform), `bias` `[filters]` (zeros; none
/// with `use_bias(false)`). Parameter count `kh*kw*in*filters + filters`.
///
/// `kernel_size`, `strides` and `dilation_rate` take one integer or a `(height, width)` pair
/// (see [`Size2`]). 'same' padding is TensorFlow's: `ceil(in / stride)` outputs, the zeros
/// split with the odd one after (bottom/right). Stride-1 undilated convolutions run the tuned
/// kernels; the others a general path (im2col + GEMM on the CPU, direct WGSL on GPUs).
///
/// ```
/// use anygpu::nn::{Activation, Conv2D, Layer};
/// use anygpu::ops::spec::Padding;
/// let conv = Conv2D::new(32, 3)
///     .padding(Padding::Same)
///     .activation(Activation::Selu)
///     .input_shape(&[28, 28, 1]);
/// assert_eq!(conv.declared_input_shape(), Some(&[28, 28, 1][..]));
/// assert_eq!(Conv2D::new(8, 3).compute_output_shape(&[28, 28, 1])?, [26, 26, 8]); // 'valid'
/// let strided = Conv2D::new(8, (3, 5)).strides(2).padding(Padding::Same);
/// assert_eq!(strided.compute_output_shape(&[7, 6, 1])?, [4, 3, 8]);
/// assert!(Conv2D::new(8, 3).strides(2).dilation_rate(2).compute_output_shape(&[9, 9, 1]).is_err());
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// Differences from Keras: `groups=1` only; channels last only.
#[derive(Debug, Clone)]
pub struct Conv2D {
    filters: usize,
    window: Window,
    use_bias: bool,
    activation: Activation,
    input_shape: Option<Vec<usize>>,
    policy: Option<Policy>,
    /// `[kernel, bias]` (`[kernel]` without a bias) once built.
    weights: Vec<Tensor>,
}

impl Conv2D {
    /// `dtype=`: this layer's dtype policy, whatever the global one (a float32 output layer
    /// in a `mixed_float16` model, say).
    pub fn dtype_policy(mut self, policy: Policy) -> Conv2D {
        self.policy = Some(policy);
        self
    }

    /// `filters` output channels, a `kernel_size` window (`3` or `(3, 5)`), Keras' defaults:
    /// `strides=1`, `padding='valid'`, `dilation_rate=1`, no activation, `use_bias=True`.
    pub fn new(filters: usize, kernel_size: impl Into<Size2>) -> Conv2D {
        Conv2D {
            filters,
            window: Window::new(kernel_size.into().0, Padding::Valid),
            use_bias: true,
            activation: Activation::Linear,
            input_shape: None,
            policy: None,
            weights: Vec::new(),
        }
    }

    /// `kernel_size=`: `3` or `(3, 5)` (height, width).
    pub fn kernel_size(mut self, kernel_size: impl Into<Size2>) -> Conv2D {
        self.window.kernel = kernel_size.into().0;
        self
    }

    /// `strides=`: `2` or `(2, 1)`.
    pub fn strides(mut self, strides: impl Into<Size2>) -> Conv2D {
        self.window.options = self.window.options.strides(strides);
        self
    }

    /// `dilation_rate=`: `2` or `(2, 1)`; Keras refuses it above 1 with strides above 1.
    pub fn dilation_rate(mut self, dilation_rate: impl Into<Size2>) -> Conv2D {
        self.window.options = self.window.options.dilation(dilation_rate);
        self
    }

    /// `padding='same'` or `'valid'`.
    pub fn padding(mut self, padding: Padding) -> Conv2D {
        self.window.options.padding = padding;
        self
    }

    /// `use_bias=`.
    pub fn use_bias(mut self, use_bias: bool) -> Conv2D {
        self.use_bias = use_bias;
        self
    }

    /// `activation=`.
    pub fn activation(mut self, activation: Activation) -> Conv2D {
        self.activation = activation;
        self
    }

    /// `input_shape=[h, w, c]`, for the first layer of a model.
    pub fn input_shape(mut self, shape: &[usize]) -> Conv2D {
        self.input_shape = Some(shape.to_vec());
        self
    }

    fn kernel_shape(&self, c_in: usize) -> [usize; 4] {
        let [kh, kw] = self.window.kernel;
        [kh, kw, c_in, self.filters]
    }
}

impl Layer for Conv2D {
    fn dtype_policy(&self) -> Option<Policy> {
        self.policy
    }

    fn boxed_clone(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }

    fn get_config(&self) -> Option<serde_json::Value> {
        let mut c = layer_config::window_config(&self.window);
        c.insert("filters".into(), self.filters.into());
        c.insert("groups".into(), 1.into());
        c.insert(
            "activation".into(),
            layer_config::activation_value(self.activation),
        );
        c.insert("use_bias".into(), self.use_bias.into());
        Some(layer_config::with_dtype(c, self.policy))
    }

    fn class_name(&self) -> &'static str {
        "Conv2D"
    }

    fn base_name(&self) -> &'static str {
        "conv2d"
    }

    fn declared_input_shape(&self) -> Option<&[usize]> {
        self.input_shape.as_deref()
    }

    fn activation(&self) -> Activation {
        self.activation
    }

    fn compute_output_shape(&self, input_shape: &[usize]) -> Result<Vec<usize>> {
        positive("Conv2D", "filters", self.filters)?;
        let (h, w, _) = image_shape("Conv2D", input_shape)?;
        let [oh, ow] = self.window.output_hw("Conv2D", &[h, w])?;
        Ok(vec![oh, ow, self.filters])
    }

    fn build(&mut self, input_shape: &[usize], seed: u64, device: &LogicalDevice) -> Result<()> {
        self.compute_output_shape(input_shape)?;
        let kshape = self.kernel_shape(input_shape[2]);
        let mut weights = vec![glorot_uniform(&kshape, derive_seed(seed, 0), device)?];
        if self.use_bias {
            weights.push(zeros(&[self.filters], device)?);
        }
        self.weights = weights;
        Ok(())
    }

    fn weights(&self) -> Vec<(&'static str, &Tensor)> {
        weights_of(&["kernel", "bias"], &self.weights)
    }

    fn set_weight(&mut self, index: usize, value: Tensor) -> Result<()> {
        replace("Conv2D", &mut self.weights, index, value)
    }

    fn forward(&self, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        let w = in_dtype("Conv2D", &self.weights, x.dtype())?;
        let (kernel, bias) = match &w[..] {
            [kernel, bias] => (kernel, Some(bias)),
            [kernel] => (kernel, None),
            _ => return Err(not_built("Conv2D")),
        };
        let opts = self.window.options;
        let z = ops::conv2d(x, kernel, bias, opts, self.activation.fused())?;
        let (y, kept) = activate_separately(z, self.activation)?;
        Ok((y, vec![x.clone(), kept]))
    }

    fn backward(
        &self,
        saved_tensors: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Vec<Tensor>)> {
        let w = if self.use_bias {
            backward_weights("Conv2D", &self.weights, dy.dtype())?
        } else {
            in_dtype("Conv2D", &self.weights, dy.dtype())?
        };
        let [kernel] = &w[..] else {
            return Err(not_built("Conv2D"));
        };
        let [x, kept] = saved::<2>("Conv2D", saved_tensors)?;
        let (dy, y, activation) = through_separate(dy, &kept, self.activation)?;
        let opts = self.window.options;
        let with_bias = |dk: Tensor, db: Tensor| {
            if self.use_bias {
                vec![dk, db]
            } else {
                vec![dk]
            }
        };
        if !need_dx {
            // A first layer: one op, which on the CPU never writes `dz` to memory.
            let act = activation.fused();
            let (dk, db) = ops::conv2d_backward_weights(&x, &y, &dy, kernel.shape(), opts, act)?;
            return Ok((None, with_bias(dk, db)));
        }
        let (dz, db) = activation_and_bias_grad(&dy, &y, activation)?;
        let dk = ops::conv2d_backward_kernel(&x, &dz, kernel.shape(), opts)?;
        let dx = ops::conv2d_backward_input(&dz, kernel, x.shape(), opts)?;
        Ok((Some(dx), with_bias(dk, db)))
    }
}

// ---------------------------------------------------------------------------------------------

/// Depthwise-separable 2-D convolution (`keras.layers.SeparableConv2D(filters, kernel_size,
/// strides, padding, dilation_rate, depth_multiplier, activation)`): a depthwise convolution
/// without bias (`depth_multiplier` outputs per input channel), then a pointwise 1×1
/// convolution with bias and the activation.
///
/// Weights, in Keras' order: `depthwise_kernel` `[kh, kw, in, depth_multiplier]`,
/// `pointwise_kernel` `[1, 1, in * depth_multiplier, filters]` (both glorot_uniform, fans as
/// Keras computes them), `bias` `[filters]`. Parameter count `kh*kw*in*m + in*m*filters +
/// filters`, Keras' count.
///
/// ```
/// use anygpu::nn::{Layer, SeparableConv2D};
/// use anygpu::ops::spec::Padding;
/// let sep = SeparableConv2D::new(64, 3).padding(Padding::Same);
/// assert_eq!(sep.compute_output_shape(&[14, 14, 32])?, [14, 14, 64]);
/// // Keras' default padding is 'valid'.
/// assert_eq!(SeparableConv2D::new(8, 3).compute_output_shape(&[7, 7, 4])?, [5, 5, 8]);
/// let strided = SeparableConv2D::new(8, 3).strides(2).depth_multiplier(2);
/// assert_eq!(strided.compute_output_shape(&[7, 6, 4])?, [3, 2, 8]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// The stride-1, multiplier-1 'same' layer (the tutorial's) runs fused kernels (on the CPU one
/// op each way); other settings run the depthwise convolution's general path, then the 1×1
/// convolution.
///
/// Differences from Keras: `use_bias=True` only; channels last only.
#[derive(Debug, Clone)]
pub struct SeparableConv2D {
    filters: usize,
    window: Window,
    depth_multiplier: usize,
    activation: Activation,
    input_shape: Option<Vec<usize>>,
    policy: Option<Policy>,
    /// `[depthwise_kernel, pointwise_kernel, bias]` once built.
    weights: Vec<Tensor>,
}

impl SeparableConv2D {
    /// `dtype=`: this layer's dtype policy, whatever the global one (a float32 output layer
    /// in a `mixed_float16` model, say).
    pub fn dtype_policy(mut self, policy: Policy) -> SeparableConv2D {
        self.policy = Some(policy);
        self
    }

    /// `filters` output channels, a `kernel_size` depthwise window (`3` or `(3, 5)`), Keras'
    /// defaults: `strides=1`, `padding='valid'`, `dilation_rate=1`, `depth_multiplier=1`, no
    /// activation.
    pub fn new(filters: usize, kernel_size: impl Into<Size2>) -> SeparableConv2D {
        SeparableConv2D {
            filters,
            window: Window::new(kernel_size.into().0, Padding::Valid),
            depth_multiplier: 1,
            activation: Activation::Linear,
            input_shape: None,
            policy: None,
            weights: Vec::new(),
        }
    }

    /// `padding='same'` or `'valid'` (the default).
    pub fn padding(mut self, padding: Padding) -> SeparableConv2D {
        self.window.options.padding = padding;
        self
    }

    /// `strides=`: `2` or `(2, 1)`.
    pub fn strides(mut self, strides: impl Into<Size2>) -> SeparableConv2D {
        self.window.options = self.window.options.strides(strides);
        self
    }

    /// `dilation_rate=`: `2` or `(2, 1)`.
    pub fn dilation_rate(mut self, dilation_rate: impl Into<Size2>) -> SeparableConv2D {
        self.window.options = self.window.options.dilation(dilation_rate);
        self
    }

    /// `depth_multiplier=`: depthwise outputs per input channel.
    pub fn depth_multiplier(mut self, depth_multiplier: usize) -> SeparableConv2D {
        self.depth_multiplier = depth_multiplier;
        self
    }

    /// `activation=`.
    pub fn activation(mut self, activation: Activation) -> SeparableConv2D {
        self.activation = activation;
        self
    }

    /// `input_shape=[h, w, c]`, for the first layer of a model.
    pub fn input_shape(mut self, shape: &[usize]) -> SeparableConv2D {
        self.input_shape = Some(shape.to_vec());
        self
    }

    /// Whether the fused stride-1 kernels serve this layer.
    fn fused(&self) -> bool {
        self.window.is_same_unit() && self.depth_multiplier == 1
    }

    /// The unfused path's gradients from `dz` (w.r.t. the pre-activation output) and the bias
    /// gradient: the pointwise kernel's and input's, then the depthwise kernel's and input's.
    /// `(depthwise, pointwise)` are the kernels in `dz`'s dtype.
    fn backward_from_dz(
        &self,
        (x, d, dz): (&Tensor, &Tensor, &Tensor),
        (depthwise, pointwise): (&Tensor, &Tensor),
        db: Tensor,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Vec<Tensor>)> {
        let opts = self.window.options;
        let dp = ops::conv2d_backward_kernel(d, dz, pointwise.shape(), Padding::Same)?;
        let dd = ops::conv2d_backward_input(dz, pointwise, d.shape(), Padding::Same)?;
        let dk = ops::depthwise_conv2d_backward_kernel_with(x, &dd, depthwise.shape(), opts)?;
        let dx = if need_dx {
            Some(ops::depthwise_conv2d_backward_input_with(
                &dd,
                depthwise,
                x.shape(),
                opts,
            )?)
        } else {
            None
        };
        Ok((dx, vec![dk, dp, db]))
    }
}

impl Layer for SeparableConv2D {
    fn dtype_policy(&self) -> Option<Policy> {
        self.policy
    }

    fn boxed_clone(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }

    fn get_config(&self) -> Option<serde_json::Value> {
        let mut c = layer_config::window_config(&self.window);
        c.insert("filters".into(), self.filters.into());
        c.insert("depth_multiplier".into(), self.depth_multiplier.into());
        c.insert(
            "activation".into(),
            layer_config::activation_value(self.activation),
        );
        c.insert("use_bias".into(), true.into());
        Some(layer_config::with_dtype(c, self.policy))
    }

    fn class_name(&self) -> &'static str {
        "SeparableConv2D"
    }

    fn base_name(&self) -> &'static str {
        "separable_conv2d"
    }

    fn declared_input_shape(&self) -> Option<&[usize]> {
        self.input_shape.as_deref()
    }

    fn activation(&self) -> Activation {
        self.activation
    }

    fn compute_output_shape(&self, input_shape: &[usize]) -> Result<Vec<usize>> {
        positive("SeparableConv2D", "filters", self.filters)?;
        positive("SeparableConv2D", "depth_multiplier", self.depth_multiplier)?;
        let (h, w, _) = image_shape("SeparableConv2D", input_shape)?;
        let [oh, ow] = self.window.output_hw("SeparableConv2D", &[h, w])?;
        Ok(vec![oh, ow, self.filters])
    }

    fn build(&mut self, input_shape: &[usize], seed: u64, device: &LogicalDevice) -> Result<()> {
        self.compute_output_shape(input_shape)?;
        let ([kh, kw], c, m) = (self.window.kernel, input_shape[2], self.depth_multiplier);
        self.weights = vec![
            glorot_uniform(&[kh, kw, c, m], derive_seed(seed, 0), device)?,
            glorot_uniform(&[1, 1, c * m, self.filters], derive_seed(seed, 1), device)?,
            zeros(&[self.filters], device)?,
        ];
        Ok(())
    }

    fn weights(&self) -> Vec<(&'static str, &Tensor)> {
        weights_of(
            &["depthwise_kernel", "pointwise_kernel", "bias"],
            &self.weights,
        )
    }

    fn set_weight(&mut self, index: usize, value: Tensor) -> Result<()> {
        replace("SeparableConv2D", &mut self.weights, index, value)
    }

    fn forward(&self, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        let w = in_dtype("SeparableConv2D", &self.weights, x.dtype())?;
        let [depthwise, pointwise, bias] = &w[..] else {
            return Err(not_built("SeparableConv2D"));
        };
        let act = self.activation.fused();
        if on_gpu(depthwise) || !self.fused() {
            // Separate kernels, keeping the depthwise output `d` for the backward pass: each is
            // its own dispatch anyway, and recomputing `d` there would cost one more.
            let opts = self.window.options;
            let d = ops::depthwise_conv2d_with(x, depthwise, None, opts, OpActivation::Linear)?;
            let z = ops::pointwise_conv2d(&d, pointwise, Some(bias), act)?;
            let (y, kept) = activate_separately(z, self.activation)?;
            Ok((y, vec![x.clone(), kept, d]))
        } else {
            // One fused op whose backward pass recomputes `d` in cache (see
            // `ops::separable_conv2d`): one activation fewer kept per layer.
            let z = ops::separable_conv2d(x, depthwise, pointwise, Some(bias), act)?;
            let (y, kept) = activate_separately(z, self.activation)?;
            Ok((y, vec![x.clone(), kept]))
        }
    }
    fn backward(
        &self,
        saved_tensors: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Vec<Tensor>)> {
        let w = backward_weights("SeparableConv2D", &self.weights, dy.dtype())?;
        let [depthwise, pointwise] = &w[..] else {
            return Err(not_built("SeparableConv2D"));
        };
        let kept = saved_tensors.get(1).ok_or_else(|| {
            Error::Model(format!(
                "SeparableConv2D.backward: expected 2 or 3 saved tensors from forward, got {}",
                saved_tensors.len()
            ))
        })?;
        let (dy, y, activation) = through_separate(dy, kept, self.activation)?;
        let act = activation.fused();
        if let [x, _] = saved_tensors {
            let g = ops::separable_conv2d_backward(x, depthwise, pointwise, &y, &dy, act, need_dx)?;
            return Ok((g.dx, vec![g.depthwise, g.pointwise, g.bias]));
        }
        let [x, _, d] = saved::<3>("SeparableConv2D", saved_tensors)?;
        // (The GPU path: separate kernels, `d` kept from the forward pass.)
        let (dz, db) = activation_and_bias_grad(&dy, &y, activation)?;
        self.backward_from_dz((&x, &d, &dz), (depthwise, pointwise), db, need_dx)
    }

    /// On the CPU one op routes the pool's gradient and applies the activation's block by
    /// block (the full-size gradient of the output is never written); on a GPU one pass
    /// routes it and applies the activation's gradient (`FusedMaxPoolActivationBiasGrad`).
    fn backward_through_max_pool(
        &self,
        saved_tensors: &[Tensor],
        dpooled: &Tensor,
        need_dx: bool,
    ) -> Result<Option<(Option<Tensor>, Vec<Tensor>)>> {
        if self.activation.separate().is_some() {
            // The activation's own gradient op sits between the pool's and this layer's.
            return Ok(None);
        }
        let w = backward_weights("SeparableConv2D", &self.weights, dpooled.dtype())?;
        let [depthwise, pointwise] = &w[..] else {
            return Err(not_built("SeparableConv2D"));
        };
        // The CPU's forward pass keeps `[x, y]`; a GPU's keeps `d` too: there the pool's,
        // the activation's and the bias's gradients are one pass over `y`, then the rest.
        if let [x, y, d] = saved_tensors {
            let act = self.activation.fused();
            let (dz, db) = ops::max_pool2d_activation_bias_grad(y, dpooled, act)?;
            return self
                .backward_from_dz((x, d, &dz), (depthwise, pointwise), db, need_dx)
                .map(Some);
        }
        let [x, y] = saved_tensors else {
            return Ok(None);
        };
        let act = self.activation.fused();
        let g = ops::separable_conv2d_max_pool_backward(
            x, depthwise, pointwise, y, dpooled, act, need_dx,
        )?;
        Ok(Some((g.dx, vec![g.depthwise, g.pointwise, g.bias])))
    }
}

/// The weights as a layer computes with them: in its input's dtype (Keras' autocast variables:
/// float16 copies of the float32 variables under mixed precision; the same tensors otherwise).
pub(super) fn in_dtype(layer: &str, weights: &[Tensor], dtype: DType) -> Result<Vec<Tensor>> {
    if weights.is_empty() {
        return Err(not_built(layer));
    }
    weights.iter().map(|w| w.cast(dtype)).collect()
}

/// [`in_dtype`] for a backward pass: every weight but the last, the bias, which a backward pass
/// does not read (one cast less per layer and step under mixed precision).
pub(super) fn backward_weights(
    layer: &str,
    weights: &[Tensor],
    dtype: DType,
) -> Result<Vec<Tensor>> {
    let (_bias, kernels) = weights.split_last().ok_or_else(|| not_built(layer))?;
    in_dtype(layer, kernels, dtype)
}

/// Whether a layer's weight lives on a GPU (its ops then run there).
fn on_gpu(weight: &Tensor) -> bool {
    weight.device_handle().device_type() == crate::DeviceKind::Gpu
}

// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------

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
        let (dx, dk, db) = ops::dense_backward(&x, kernel, &y, &dy, activation.fused(), need_dx)?;
        Ok((dx, vec![dk, db]))
    }
}
