//! The layers of the tutorial CNN: [`Conv2D`], [`SeparableConv2D`], [`MaxPool2D`], [`Flatten`]
//! and [`Dense`], and the [`Layer`] trait they implement.
//!
//! Shapes exclude the batch axis, as Keras' `input_shape=` does: an image layer takes
//! `[height, width, channels]` (NHWC with the batch in front), a [`Dense`] layer `[features]`.
//!
//! One file per layer (`conv2d.rs`, `separable.rs`, `max_pool.rs`, `flatten.rs`, `dense.rs`);
//! here the trait and the helpers every layer shares (its variables, its errors, its weights in
//! the input's dtype, its activation run fused or as its own op).

use std::fmt;

use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::mixed_precision::Policy;
use crate::nn::activation::Activation;
use crate::nn::autocast;
use crate::ops::spec::{Activation as OpActivation, ActivationFn};
use crate::ops::{self, GradDType};
use crate::tensor::{DType, Tensor};

mod conv2d;
mod dense;
mod flatten;
mod max_pool;
mod separable;

pub use conv2d::Conv2D;
pub use dense::Dense;
pub use flatten::Flatten;
pub use max_pool::MaxPool2D;
pub use separable::SeparableConv2D;

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

    /// The weights this layer reads in its compute dtype (Keras' autocast variables: a float16
    /// copy of each under `mixed_float16`). A training step casts them all before its forward
    /// pass, in one op per device; a layer that leaves this empty (the default) casts its own
    /// as it reads them. Batch normalization, which computes in float32, leaves it empty.
    fn autocast_weights(&self) -> &[Tensor] {
        &[]
    }

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

    /// This layer's [`call`](Layer::call) followed by a 2×2 max-pool of its output, in one:
    /// `(pooled, saved, y)`, the pool's output, this layer's saved tensors and its own output
    /// for the pool's backward pass to read, or `None` when the layer keeps what its
    /// [`backward_through_max_pool`](Layer::backward_through_max_pool) and
    /// [`backward_fused`](Layer::backward_fused) need and answers both for the pool (the
    /// pool's own backward pass cannot run then). `Ok(None)` when the layer has no fused
    /// version where it runs; the model then runs the two. Provided: `Ok(None)`.
    ///
    /// A model asks this when a [`MaxPool2D`] on the same device follows the layer.
    ///
    /// # Errors
    /// As [`forward`](Layer::forward).
    #[allow(clippy::type_complexity)] // the three outputs, named above
    fn call_through_max_pool(
        &self,
        x: &Tensor,
        training: bool,
    ) -> Result<Option<(Tensor, Vec<Tensor>, Option<Tensor>)>> {
        let _ = (x, training);
        Ok(None)
    }

    /// The activation whose gradient this layer lets the layer after it apply (see
    /// [`BackwardPlan::input_activation`]), when the two run on the same device: `Some` (a
    /// fused ReLU or SELU) promises that [`backward_fused`](Layer::backward_fused) takes a plan
    /// with [`dy_preactivated`](BackwardPlan::dy_preactivated). Provided: `None`.
    fn preactivation_grad(&self) -> Option<OpActivation> {
        None
    }

    /// The backward pass as `plan` asks, fused with its neighbours' work: through the 2×2
    /// max-pool after it, from a `dy` that the layer after already multiplied by this layer's
    /// activation gradient, and applying the layer before's activation gradient to `dx` as it
    /// writes it. `Ok(None)`: no such pass (only allowed when `plan.dy_preactivated` is false);
    /// the model then runs [`backward_through_max_pool`](Layer::backward_through_max_pool) or
    /// [`backward`](Layer::backward). Provided: `Ok(None)`.
    ///
    /// # Errors
    /// As [`backward`](Layer::backward).
    fn backward_fused(
        &self,
        saved: &[Tensor],
        dy: &Tensor,
        plan: BackwardPlan,
    ) -> Result<Option<FusedGrads>> {
        let _ = (saved, dy, plan);
        Ok(None)
    }

    /// The activation this layer applies and nothing else (a `ReLU()`, an
    /// `Activation("relu")`), which the layer before it may apply as it writes its own output
    /// (see [`call_with_activation`](Layer::call_with_activation)). Provided: `None`.
    fn as_activation(&self) -> Option<ActivationFn> {
        None
    }

    /// This layer's [`call`](Layer::call) followed by `act`, the activation of the layer after
    /// it ([`as_activation`](Layer::as_activation)), in one pass: `(output, saved)`, the
    /// activation's output and what
    /// [`backward_with_activation`](Layer::backward_with_activation) needs. `Ok(None)` when the
    /// layer has no such pass for `act` where it runs; the model then runs the two layers.
    /// Provided: `Ok(None)`.
    ///
    /// A model asks this when an activation layer on the same device follows the layer
    /// (`BatchNormalization` then `ReLU` run as one).
    ///
    /// # Errors
    /// As [`forward`](Layer::forward).
    fn call_with_activation(
        &self,
        x: &Tensor,
        act: ActivationFn,
        training: bool,
    ) -> Result<Option<(Tensor, Vec<Tensor>)>> {
        let _ = (x, act, training);
        Ok(None)
    }

    /// The backward pass of [`call_with_activation`](Layer::call_with_activation) from `dy`,
    /// the gradient w.r.t. the activation's output, and what that pass saved: as
    /// [`backward`](Layer::backward) gives them. `Some` exactly when `call_with_activation`
    /// gives `Some` for `act` (the model asks when the activation layer kept nothing, and runs
    /// the two backward passes on `None`). Provided: `Ok(None)`.
    ///
    /// # Errors
    /// As [`backward`](Layer::backward).
    #[allow(clippy::type_complexity)] // backward's pair, optional
    fn backward_with_activation(
        &self,
        saved: &[Tensor],
        dy: &Tensor,
        act: ActivationFn,
        need_dx: bool,
    ) -> Result<Option<(Option<Tensor>, Vec<Tensor>)>> {
        let _ = (saved, dy, act, need_dx);
        Ok(None)
    }

    /// This layer as a stride-1 convolution computing in `dtype` that the layer after it may
    /// run inside its own passes (see [`call_through_stem`](Layer::call_through_stem)): its
    /// weights in `dtype`, its options and activation. Provided: `None`; `Conv2D` on the CPU
    /// answers.
    ///
    /// # Errors
    /// As [`forward`](Layer::forward).
    fn as_stem(&self, dtype: DType) -> Result<Option<StemConv>> {
        let _ = dtype;
        Ok(None)
    }

    /// The layer before's convolution `stem` (from [`as_stem`](Layer::as_stem)), this layer
    /// and the 2×2 max-pool after it in one pass from the stem's input `x`:
    /// `(pooled, saved, y)` as [`call_through_max_pool`](Layer::call_through_max_pool) gives
    /// them, the stem's output computed on the way and not kept. `Ok(None)` when the layer has
    /// no such pass where it runs; the model then runs the layers one by one. Provided:
    /// `Ok(None)`.
    ///
    /// # Errors
    /// As [`forward`](Layer::forward).
    #[allow(clippy::type_complexity)] // the three outputs, named above
    fn call_through_stem(
        &self,
        stem: &StemConv,
        x: &Tensor,
        training: bool,
    ) -> Result<Option<(Tensor, Vec<Tensor>, Option<Tensor>)>> {
        let _ = (stem, x, training);
        Ok(None)
    }

    /// The backward pass of [`call_through_stem`](Layer::call_through_stem) from `dpooled`,
    /// the gradient w.r.t. the pool's output, and what that pass saved: `(stem's weight
    /// gradients, this layer's)`, each in its layer's [`weights`](Layer::weights) order. The
    /// stem's input gradient is not computed (the stem is a model's first layer). Provided:
    /// `Ok(None)` (allowed only for a layer whose `call_through_stem` gives `None`).
    ///
    /// # Errors
    /// As [`backward`](Layer::backward).
    fn backward_through_stem(
        &self,
        stem: &StemConv,
        saved: &[Tensor],
        dpooled: &Tensor,
    ) -> Result<Option<(Vec<Tensor>, Vec<Tensor>)>> {
        let _ = (stem, saved, dpooled);
        Ok(None)
    }

    /// Whether this layer is a global average pooling (`[n, h, w, c]` → `[n, c]`), which the
    /// layer before it may run inside its own passes (see
    /// [`call_with_activation_and_mean`](Layer::call_with_activation_and_mean)).
    fn is_global_average_pool(&self) -> bool {
        false
    }

    /// [`call_with_activation`](Layer::call_with_activation) followed by the global average
    /// pooling after the activation, in one pass: `(pooled, saved)`, the pooling's output and
    /// what [`backward_with_activation_from_mean`](Layer::backward_with_activation_from_mean)
    /// needs; the activation's output is never written. `Ok(None)` when the layer has no such
    /// pass for `act` where it runs; the model then runs the layers as it would without the
    /// pooling. Provided: `Ok(None)`; `BatchNormalization` answers on the CPU.
    ///
    /// # Errors
    /// As [`forward`](Layer::forward).
    fn call_with_activation_and_mean(
        &self,
        x: &Tensor,
        act: ActivationFn,
        training: bool,
    ) -> Result<Option<(Tensor, Vec<Tensor>)>> {
        let _ = (x, act, training);
        Ok(None)
    }

    /// The backward pass of
    /// [`call_with_activation_and_mean`](Layer::call_with_activation_and_mean) from
    /// `dpooled`, the gradient w.r.t. the pooling's output, and what that pass saved: as
    /// [`backward`](Layer::backward) gives them. `Some` exactly when that pass gives `Some`
    /// for `act`. Provided: `Ok(None)`.
    ///
    /// # Errors
    /// As [`backward`](Layer::backward).
    #[allow(clippy::type_complexity)] // backward's pair, optional
    fn backward_with_activation_from_mean(
        &self,
        saved: &[Tensor],
        dpooled: &Tensor,
        act: ActivationFn,
        need_dx: bool,
    ) -> Result<Option<(Option<Tensor>, Vec<Tensor>)>> {
        let _ = (saved, dpooled, act, need_dx);
        Ok(None)
    }

    /// The input this layer's forward pass kept in `saved`, for a layer after it that runs
    /// this one's kernel gradient inside its own backward pass
    /// ([`backward_into_stem`](Layer::backward_into_stem)). Provided: `None`; `Conv2D`
    /// answers.
    fn kept_input<'a>(&self, saved: &'a [Tensor]) -> Option<&'a Tensor> {
        let _ = saved;
        None
    }

    /// This layer's backward pass with the activation `act` after it (as
    /// [`backward_with_activation`](Layer::backward_with_activation)) and the weight gradients
    /// of the layer before, the convolution `stem` of `stem_input` (from
    /// [`as_stem`](Layer::as_stem) and [`kept_input`](Layer::kept_input)), in one: `(stem's
    /// weight gradients, this layer's)`, each in its layer's [`weights`](Layer::weights)
    /// order. The stem's input gradient is not computed (the stem is a model's first layer),
    /// and the gradient w.r.t. its output need not go through memory. `Ok(None)` when the
    /// layer has no such pass where it runs; the model then runs the two backward passes.
    /// Provided: `Ok(None)`; `BatchNormalization` answers on the CPU.
    ///
    /// # Errors
    /// As [`backward`](Layer::backward).
    fn backward_into_stem(
        &self,
        stem: &StemConv,
        stem_input: &Tensor,
        saved: &[Tensor],
        dy: &Tensor,
        act: ActivationFn,
    ) -> Result<Option<(Vec<Tensor>, Vec<Tensor>)>> {
        let _ = (stem, stem_input, saved, dy, act);
        Ok(None)
    }

    /// This layer's training pass with the activation `act` after it (as
    /// [`call_with_activation`](Layer::call_with_activation)) whose output is not written:
    /// `(output, saved)`, the output as the layer after the activation reads it in its
    /// place ([`call_normalized`](Layer::call_normalized)), and what
    /// [`backward_with_activation`](Layer::backward_with_activation) needs. `Ok(None)` when
    /// the layer has no such pass for `act` where it runs; the model then runs the layers as
    /// it would without it. Provided: `Ok(None)`; `BatchNormalization` answers on the CPU in
    /// float32, with a ReLU.
    ///
    /// # Errors
    /// As [`forward`](Layer::forward).
    fn call_with_activation_deferred(
        &self,
        x: &Tensor,
        act: ActivationFn,
    ) -> Result<Option<(DeferredNormalization, Vec<Tensor>)>> {
        let _ = (x, act);
        Ok(None)
    }

    /// Whether this layer's training pass, computing in `dtype`, reads an `input_shape` input
    /// that [`call_with_activation_deferred`](Layer::call_with_activation_deferred) left
    /// unwritten in its place, at no more cost than a written one
    /// ([`call_normalized`](Layer::call_normalized)). Provided: `false`; `Conv2D` answers
    /// for a strided convolution on the CPU.
    fn reads_normalized_input(&self, input_shape: &[usize], dtype: DType) -> bool {
        let _ = (input_shape, dtype);
        false
    }

    /// This layer's training pass ([`forward`](Layer::forward)) from an input `x` that the
    /// layer before left unwritten: `(output, saved)`, what it saved for its
    /// [`backward`](Layer::backward). Asked only where
    /// [`reads_normalized_input`](Layer::reads_normalized_input) said yes. Provided: an
    /// error.
    ///
    /// # Errors
    /// As [`forward`](Layer::forward); a layer that does not read such inputs.
    fn call_normalized(&self, x: &DeferredNormalization) -> Result<(Tensor, Vec<Tensor>)> {
        let _ = x;
        Err(Error::Model(format!(
            "{}: reads no normalized input (reads_normalized_input says no)",
            self.class_name()
        )))
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

/// What a model asks of [`Layer::backward_fused`]: the work at the seams between this layer
/// and its neighbours, done while the data is in cache instead of in passes of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardPlan {
    /// Whether the gradient w.r.t. the layer's input is needed.
    pub need_dx: bool,
    /// `dy` is the gradient w.r.t. the output of a 2×2 max-pool of this layer's output (the
    /// pool is the model's next layer, whose backward pass this one takes over).
    pub through_max_pool: bool,
    /// `dy` is already the gradient w.r.t. this layer's pre-activation output: the layer after
    /// applied this layer's [`preactivation_grad`](Layer::preactivation_grad) to it.
    pub dy_preactivated: bool,
    /// Not `Linear`: the activation whose output this layer's input is (the layer before's,
    /// from its [`preactivation_grad`](Layer::preactivation_grad)); `dx` should come
    /// multiplied by its gradient at the input, and [`FusedGrads::dx_preactivated`] say so.
    pub input_activation: OpActivation,
}

/// A batch normalization's output through a ReLU that its training pass did not write
/// ([`Layer::call_with_activation_deferred`]): the layer after the ReLU forms
/// `max((z - mean) · inv · gamma + beta, 0)` where it reads it ([`Layer::call_normalized`]).
#[derive(Clone, Debug)]
pub struct DeferredNormalization {
    /// The normalization's input, `[..., c]`.
    pub z: Tensor,
    /// Its scale, `[c]`.
    pub gamma: Tensor,
    /// Its offset, `[c]`.
    pub beta: Tensor,
    /// The batch statistics, `[2, c]`: mean, then `1 / sqrt(var + epsilon)`.
    pub stats: Tensor,
}

impl DeferredNormalization {
    /// The tensors as the ops take them.
    pub(crate) fn op(&self) -> ops::NormalizedInput<'_> {
        ops::NormalizedInput {
            z: &self.z,
            gamma: &self.gamma,
            beta: &self.beta,
            stats: &self.stats,
        }
    }
}

/// A layer seen as a stride-1 convolution that the layer after it runs inside its own passes
/// ([`Layer::as_stem`]): a model's first layer, whose output, the model's largest activation,
/// then never goes through memory.
#[derive(Clone, Debug)]
pub struct StemConv {
    /// Kernel `[kh, kw, c_in, filters]`, in the dtype asked for.
    pub kernel: Tensor,
    /// Bias `[filters]`, if the layer has one.
    pub bias: Option<Tensor>,
    /// Padding (strides and dilation 1).
    pub options: ops::spec::ConvOptions,
    /// The activation, fused.
    pub activation: OpActivation,
}

impl StemConv {
    /// The convolution as [`ops::conv2d_separable_conv2d_max_pool`] takes it.
    pub(crate) fn op(&self) -> ops::ConvStem<'_> {
        ops::ConvStem {
            kernel: &self.kernel,
            bias: self.bias.as_ref(),
            options: self.options,
            act: self.activation,
        }
    }
}

/// What [`Layer::backward_fused`] returns.
#[derive(Debug)]
pub struct FusedGrads {
    /// The gradient w.r.t. the input (when asked for).
    pub dx: Option<Tensor>,
    /// The weight gradients, in the order of [`Layer::weights`].
    pub weights: Vec<Tensor>,
    /// Whether `dx` already carries [`BackwardPlan::input_activation`]'s gradient.
    pub dx_preactivated: bool,
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
    ops::activation_bias_grad_as(dy, y, act.fused(), GradDType::Float32)
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

/// The weights as a layer computes with them: in its input's dtype (Keras' autocast variables:
/// float16 copies of the float32 variables under mixed precision, one per weight and training
/// step; the same tensors otherwise).
pub(super) fn in_dtype(layer: &str, weights: &[Tensor], dtype: DType) -> Result<Vec<Tensor>> {
    if weights.is_empty() {
        return Err(not_built(layer));
    }
    weights.iter().map(|w| autocast::cast(w, dtype)).collect()
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

/// The fused activation (ReLU, SELU) a layer on the CPU lets the layer after it differentiate
/// (see [`Layer::preactivation_grad`]); `None` on a GPU, where the saving is a dispatch's
/// worth at best, and for other activations.
fn cpu_preactivation_grad(act: Activation, weight: Option<&Tensor>) -> Option<OpActivation> {
    let fused = act.fused();
    let on_cpu = weight.is_some_and(|w| !on_gpu(w));
    (on_cpu && act.separate().is_none() && fused != OpActivation::Linear).then_some(fused)
}

/// Whether a layer's weight (or a tensor it computes on) lives on a GPU (its ops then run
/// there).
pub(crate) fn on_gpu(weight: &Tensor) -> bool {
    weight.device_handle().device_type() == crate::DeviceKind::Gpu
}
