//! [`SeparableConv2D`]: the depthwise-separable convolution layer (the tutorial's), its
//! builder, its Keras config and its passes, fused with a following 2×2 max-pool's backward.

use crate::device::LogicalDevice;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::mixed_precision::Policy;
use crate::nn::activation::Activation;
use crate::nn::conv_args::Window;
use crate::nn::init::{derive_seed, glorot_uniform, positive, zeros};
use crate::nn::layer_config;
use crate::ops::spec::{Activation as OpActivation, Padding, Size2};
use crate::ops::{self, GradDType};
use crate::tensor::Tensor;

use super::{
    activate_separately, activation_and_bias_grad, backward_weights, cpu_preactivation_grad,
    image_shape, in_dtype, not_built, on_gpu, replace, saved, through_separate, weights_of,
    BackwardPlan, FusedGrads, Layer, StemConv,
};

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
        let grads = GradDType::Float32;
        let dp = ops::conv2d_backward_kernel_as(d, dz, pointwise.shape(), Padding::Same, grads)?;
        let dd = ops::conv2d_backward_input(dz, pointwise, d.shape(), Padding::Same)?;
        let dk = ops::depthwise_conv2d_backward_kernel_as(x, &dd, depthwise.shape(), opts, grads)?;
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

impl SeparableConv2D {
    /// [`Layer::call_through_max_pool`], behind `stem` when given (`x` is then its input): one
    /// op on the CPU, `None` elsewhere.
    #[allow(clippy::type_complexity)] // the three outputs of call_through_max_pool
    fn pooled_forward(
        &self,
        x: &Tensor,
        stem: Option<&StemConv>,
    ) -> Result<Option<(Tensor, Vec<Tensor>, Option<Tensor>)>> {
        let on_cpu = self.weights.first().is_some_and(|w| !on_gpu(w));
        if !on_cpu || !self.fused() || self.activation.separate().is_some() {
            return Ok(None);
        }
        let w = in_dtype("SeparableConv2D", &self.weights, x.dtype())?;
        let [depthwise, pointwise, bias] = &w[..] else {
            return Err(not_built("SeparableConv2D"));
        };
        let act = self.activation.fused();
        // The pool and its argmax are all the backward pass reads of `y`: `y` is not kept.
        let (pooled, argmax) = match stem {
            Some(stem) => ops::conv2d_separable_conv2d_max_pool_with_argmax(
                x,
                stem.op(),
                depthwise,
                pointwise,
                Some(bias),
                act,
            )?,
            None => ops::separable_conv2d_max_pool_with_argmax(
                x,
                depthwise,
                pointwise,
                Some(bias),
                act,
            )?,
        };
        let kept = vec![x.clone(), pooled.clone(), argmax];
        Ok(Some((pooled, kept, None)))
    }
}

/// What the CPU's pass through the pool kept (see `pooled_forward`): the input, the pool's
/// output and its argmax (int32, unlike the third tensor a GPU keeps).
fn kept_argmax(saved: &[Tensor]) -> Option<[&Tensor; 3]> {
    match saved {
        [x, pooled, argmax] if argmax.dtype() == DType::I32 => Some([x, pooled, argmax]),
        _ => None,
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

    fn autocast_weights(&self) -> &[Tensor] {
        &self.weights
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

    /// On the CPU one op pools each block of images while its output is in cache.
    fn call_through_max_pool(
        &self,
        x: &Tensor,
        _training: bool,
    ) -> Result<Option<(Tensor, Vec<Tensor>, Option<Tensor>)>> {
        self.pooled_forward(x, None)
    }

    /// On the CPU one op: each block of images goes through the stem, this layer and the pool
    /// in cache.
    fn call_through_stem(
        &self,
        stem: &StemConv,
        x: &Tensor,
        _training: bool,
    ) -> Result<Option<(Tensor, Vec<Tensor>, Option<Tensor>)>> {
        self.pooled_forward(x, Some(stem))
    }

    /// The stem's output recomputed block by block (see [`ops::conv2d_separable_conv2d_max_pool_backward`]).
    fn backward_through_stem(
        &self,
        stem: &StemConv,
        saved_tensors: &[Tensor],
        dpooled: &Tensor,
    ) -> Result<Option<(Vec<Tensor>, Vec<Tensor>)>> {
        let w = backward_weights("SeparableConv2D", &self.weights, dpooled.dtype())?;
        let [depthwise, pointwise] = &w[..] else {
            return Err(not_built("SeparableConv2D"));
        };
        let weights = [depthwise, pointwise];
        let act = self.activation.fused();
        let g = match (kept_argmax(saved_tensors), saved_tensors) {
            (Some([x, pooled, argmax]), _) => {
                ops::conv2d_separable_conv2d_max_pool_backward_with_argmax(
                    x,
                    stem.op(),
                    weights,
                    (pooled, argmax),
                    dpooled,
                    act,
                )?
            }
            (None, [x, y]) => ops::conv2d_separable_conv2d_max_pool_backward(
                x,
                stem.op(),
                weights,
                y,
                dpooled,
                act,
            )?,
            _ => return Ok(None),
        };
        let mut stem_grads = vec![g.conv_kernel];
        if stem.bias.is_some() {
            stem_grads.push(g.conv_bias);
        }
        Ok(Some((stem_grads, vec![g.depthwise, g.pointwise, g.bias])))
    }

    fn preactivation_grad(&self) -> Option<OpActivation> {
        if !self.fused() {
            return None;
        }
        cpu_preactivation_grad(self.activation, self.weights.first())
    }

    /// On the CPU (whose forward pass keeps `[x, y]`): one op for the whole plan.
    fn backward_fused(
        &self,
        saved_tensors: &[Tensor],
        dy: &Tensor,
        plan: BackwardPlan,
    ) -> Result<Option<FusedGrads>> {
        let argmax = kept_argmax(saved_tensors);
        if argmax.is_none() && saved_tensors.len() != 2 {
            return Ok(None);
        }
        if self.activation.separate().is_some() {
            return Ok(None);
        }
        let w = backward_weights("SeparableConv2D", &self.weights, dy.dtype())?;
        let [depthwise, pointwise] = &w[..] else {
            return Err(not_built("SeparableConv2D"));
        };
        // A pre-activated `dy` is `dz` already: the activation's gradient is the identity.
        let act = if plan.dy_preactivated {
            OpActivation::Linear
        } else {
            self.activation.fused()
        };
        let options = ops::SeparableBackwardOptions {
            pooled: plan.through_max_pool,
            need_dx: plan.need_dx,
            input_activation: plan.input_activation,
        };
        let weights = [depthwise, pointwise];
        let g = match (argmax, saved_tensors) {
            (Some([x, pooled, argmax]), _) => ops::separable_conv2d_max_pool_backward_with_argmax(
                x,
                weights,
                (pooled, argmax),
                dy,
                act,
                options,
            )?,
            (None, [x, y]) => ops::separable_conv2d_backward_with(x, weights, y, dy, act, options)?,
            _ => return Ok(None),
        };
        Ok(Some(FusedGrads {
            dx_preactivated: g.dx.is_some() && plan.input_activation != OpActivation::Linear,
            dx: g.dx,
            weights: vec![g.depthwise, g.pointwise, g.bias],
        }))
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
        let act = self.activation.fused();
        if let Some([x, pooled, argmax]) = kept_argmax(saved_tensors) {
            let options = ops::SeparableBackwardOptions {
                pooled: true,
                need_dx,
                ..Default::default()
            };
            let weights = [depthwise, pointwise];
            let kept = (pooled, argmax);
            let g = ops::separable_conv2d_max_pool_backward_with_argmax(
                x, weights, kept, dpooled, act, options,
            )?;
            return Ok(Some((g.dx, vec![g.depthwise, g.pointwise, g.bias])));
        }
        // The CPU's unpooled forward pass keeps `[x, y]`; a GPU's keeps `d` too: there the
        // pool's, the activation's and the bias's gradients are one pass over `y`, then the
        // rest.
        if let [x, y, d] = saved_tensors {
            let act = self.activation.fused();
            let grads = GradDType::Float32;
            let (dz, db) = ops::max_pool2d_activation_bias_grad_as(y, dpooled, act, grads)?;
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
