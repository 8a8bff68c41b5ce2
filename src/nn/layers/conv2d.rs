//! [`Conv2D`]: the 2-D convolution layer, its builder, its Keras config and its passes.

use crate::device::LogicalDevice;
use crate::error::Result;
use crate::mixed_precision::Policy;
use crate::nn::activation::Activation;
use crate::nn::conv_args::Window;
use crate::nn::init::{derive_seed, glorot_uniform, positive, zeros};
use crate::nn::layer_config;
use crate::ops::spec::{Activation as OpActivation, Padding, Size2};
use crate::ops::{self, GradDType};
use crate::tensor::{DType, Tensor};

use super::{
    activate_separately, activation_and_bias_grad, backward_weights, cpu_preactivation_grad,
    image_shape, in_dtype, not_built, on_gpu, replace, saved, through_separate, weights_of,
    BackwardPlan, DeferredNormalization, FusedGrads, Layer, StemConv,
};

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

    fn autocast_weights(&self) -> &[Tensor] {
        &self.weights
    }

    fn set_weight(&mut self, index: usize, value: Tensor) -> Result<()> {
        replace("Conv2D", &mut self.weights, index, value)
    }

    fn forward(&self, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        let w = in_dtype("Conv2D", &self.weights, x.dtype())?;
        let (kernel, bias) = kernel_and_bias(&w)?;
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
        self.backward_impl(saved_tensors, dy, need_dx, false)
    }

    fn preactivation_grad(&self) -> Option<OpActivation> {
        cpu_preactivation_grad(self.activation, self.weights.first())
    }

    /// On the CPU, a stride-1 undilated convolution with a fused activation.
    fn as_stem(&self, dtype: DType) -> Result<Option<StemConv>> {
        let on_cpu = self.weights.first().is_some_and(|w| !on_gpu(w));
        let fused = matches!(
            self.activation,
            Activation::Linear | Activation::Relu | Activation::Selu
        );
        let unit = self.window.options.strides == [1, 1] && self.window.options.dilation == [1, 1];
        if !on_cpu || !fused || !unit {
            return Ok(None);
        }
        let w = in_dtype("Conv2D", &self.weights, dtype)?;
        let (kernel, bias) = kernel_and_bias(&w)?;
        Ok(Some(StemConv {
            kernel: kernel.clone(),
            bias: bias.cloned(),
            options: self.window.options,
            activation: self.activation.fused(),
        }))
    }

    /// The forward pass keeps `[x, kept]` (not after [`call_normalized`](Layer::call_normalized)).
    fn kept_input<'a>(&self, saved: &'a [Tensor]) -> Option<&'a Tensor> {
        match saved {
            [x, _] => Some(x),
            _ => None,
        }
    }

    /// On the CPU, in float32, a strided convolution: it normalizes its input where it copies
    /// each image anyway (into the zero-padded image its patches are read from, or before its
    /// patch matrix).
    fn reads_normalized_input(&self, input_shape: &[usize], dtype: DType) -> bool {
        let Some(kernel) = self.weights.first() else {
            return false;
        };
        let Some(&c_in) = input_shape.last() else {
            return false;
        };
        let kshape = self.kernel_shape(c_in);
        let opts = self.window.options;
        dtype == DType::F32
            && !on_gpu(kernel)
            && kernel.shape() == kshape
            && ops::conv2d_reads_normalized_input(input_shape, &kshape, opts)
    }

    /// Keeps `[z, kept, gamma, beta, statistics]`, which [`Layer::backward`] tells from the
    /// plain pass's `[x, kept]`.
    fn call_normalized(&self, x: &DeferredNormalization) -> Result<(Tensor, Vec<Tensor>)> {
        let w = in_dtype("Conv2D", &self.weights, DType::F32)?;
        let (kernel, bias) = kernel_and_bias(&w)?;
        let opts = self.window.options;
        let act = self.activation.fused();
        let z = ops::conv2d_normalized_input(x.op(), kernel, bias, opts, act)?;
        let (y, kept) = activate_separately(z, self.activation)?;
        let (z, gamma, beta, stats) = (&x.z, &x.gamma, &x.beta, &x.stats);
        Ok((
            y,
            vec![z.clone(), kept, gamma.clone(), beta.clone(), stats.clone()],
        ))
    }

    /// From a pre-activated `dy` (the layer after applied this one's activation gradient);
    /// the input's gradient plain.
    fn backward_fused(
        &self,
        saved_tensors: &[Tensor],
        dy: &Tensor,
        plan: BackwardPlan,
    ) -> Result<Option<FusedGrads>> {
        if plan.through_max_pool || !plan.dy_preactivated {
            return Ok(None);
        }
        let (dx, weights) = self.backward_impl(saved_tensors, dy, plan.need_dx, true)?;
        Ok(Some(FusedGrads {
            dx,
            weights,
            dx_preactivated: false,
        }))
    }
}

/// `(kernel, bias)` of a built layer's weights `[kernel, bias]` (`[kernel]` without a bias).
fn kernel_and_bias(w: &[Tensor]) -> Result<(&Tensor, Option<&Tensor>)> {
    match w {
        [kernel, bias] => Ok((kernel, Some(bias))),
        [kernel] => Ok((kernel, None)),
        _ => Err(not_built("Conv2D")),
    }
}

impl Conv2D {
    /// [`Layer::backward`], from `dz` itself when `dy_preactivated`.
    fn backward_impl(
        &self,
        saved_tensors: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
        dy_preactivated: bool,
    ) -> Result<(Option<Tensor>, Vec<Tensor>)> {
        let w = if self.use_bias {
            backward_weights("Conv2D", &self.weights, dy.dtype())?
        } else {
            in_dtype("Conv2D", &self.weights, dy.dtype())?
        };
        let [kernel] = &w[..] else {
            return Err(not_built("Conv2D"));
        };
        // After `call_normalized`, `x` is the normalization's input.
        let (x, kept, normalized) = match saved_tensors {
            [z, kept, gamma, beta, stats] => {
                let normalized = DeferredNormalization {
                    z: z.clone(),
                    gamma: gamma.clone(),
                    beta: beta.clone(),
                    stats: stats.clone(),
                };
                (z.clone(), kept.clone(), Some(normalized))
            }
            _ => {
                let [x, kept] = saved::<2>("Conv2D", saved_tensors)?;
                (x, kept, None)
            }
        };
        let (dy, y, activation) = if dy_preactivated {
            (dy.clone(), kept, Activation::Linear)
        } else {
            through_separate(dy, &kept, self.activation)?
        };
        let opts = self.window.options;
        let grads = GradDType::Float32;
        let with_bias = |dk: Tensor, db: Tensor| {
            if self.use_bias {
                vec![dk, db]
            } else {
                vec![dk]
            }
        };
        let plain = normalized.is_none();
        if plain && !need_dx && !self.use_bias && activation == Activation::Linear {
            // A first layer before a BatchNormalization: `dz` is `dy`, and no bias wants its
            // sum (a pass over the whole output gradient).
            let dk = ops::conv2d_backward_kernel_as(&x, &dy, kernel.shape(), opts, grads)?;
            return Ok((None, vec![dk]));
        }
        if plain && !need_dx {
            // A first layer: one op, which on the CPU never writes `dz` to memory.
            let act = activation.fused();
            let (dk, db) =
                ops::conv2d_backward_weights_as(&x, &y, &dy, kernel.shape(), opts, act, grads)?;
            return Ok((None, with_bias(dk, db)));
        }
        let dk_dx = |dz: &Tensor| -> Result<(Tensor, Option<Tensor>)> {
            let k = kernel.shape();
            let dk = match &normalized {
                Some(n) => ops::conv2d_backward_kernel_normalized_input(n.op(), dz, k, opts)?,
                None => ops::conv2d_backward_kernel_as(&x, dz, k, opts, grads)?,
            };
            let dx = need_dx
                .then(|| ops::conv2d_backward_input(dz, kernel, x.shape(), opts))
                .transpose()?;
            Ok((dk, dx))
        };
        if !self.use_bias && activation == Activation::Linear {
            // `dz` is `dy`, and no bias wants its sum (a convolution before a
            // BatchNormalization).
            let (dk, dx) = dk_dx(&dy)?;
            return Ok((dx, vec![dk]));
        }
        let (dz, db) = activation_and_bias_grad(&dy, &y, activation)?;
        let (dk, dx) = dk_dx(&dz)?;
        Ok((dx, with_bias(dk, db)))
    }
}
