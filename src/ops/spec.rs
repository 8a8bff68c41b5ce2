//! Shapes and options shared by every backend's kernels.
//!
//! The CPU kernels (`ops::cpu`), the WGSL kernels (`shaders/`, driven by `ops::gpu`) and the f64
//! oracle (`ops::reference`) all take these, so the three can never disagree about what a shape
//! or a padding mode means. Layout is NHWC, kernels are Keras' HWIO, everything row-major.

/// The activation fused into a kernel's output write (Keras' `activation=` argument).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// No activation (`None` / `"linear"` in Keras).
    #[default]
    Linear,
    /// `max(x, 0)`.
    Relu,
    /// Scaled exponential linear unit with Keras' constants [`SELU_ALPHA`] and [`SELU_SCALE`].
    Selu,
}

/// Keras' `selu` alpha.
pub const SELU_ALPHA: f64 = 1.673_263_242_354_377_3;
/// Keras' `selu` scale.
pub const SELU_SCALE: f64 = 1.050_700_987_355_480_5;

impl Activation {
    /// The code WGSL kernels receive in their params (`0` linear, `1` relu, `2` selu).
    pub fn code(self) -> u32 {
        match self {
            Activation::Linear => 0,
            Activation::Relu => 1,
            Activation::Selu => 2,
        }
    }
}

/// The product of `dims`; a wrapped count would size buffers wrongly, so overflow panics
/// (naming `what`) in release builds too.
fn elements(dims: &[usize], what: &str) -> usize {
    match crate::shape::product(dims) {
        Some(n) => n,
        None => panic!("the {what} {dims:?} has more elements than usize can count"),
    }
}

/// Convolution padding, as Keras spells it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Padding {
    /// Output as large as the input (stride 1); the input is padded with zeros, TF's split:
    /// `pad_top = (kh - 1) / 2`, the rest at the bottom (likewise left/right).
    #[default]
    Same,
    /// No padding: output `h - kh + 1` by `w - kw + 1`.
    Valid,
}

/// A stride-1 2-D convolution: input `[n, h, w, c_in]`, kernel `[kh, kw, c_in, c_out]`,
/// bias `[c_out]`, output `[n, out_h, out_w, c_out]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dShape {
    /// Batch.
    pub n: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Input channels.
    pub c_in: usize,
    /// Output channels (filters).
    pub c_out: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Padding mode.
    pub padding: Padding,
}

impl Conv2dShape {
    /// Output height and width.
    pub fn out_hw(&self) -> (usize, usize) {
        match self.padding {
            Padding::Same => (self.h, self.w),
            Padding::Valid => (
                (self.h + 1).saturating_sub(self.kh),
                (self.w + 1).saturating_sub(self.kw),
            ),
        }
    }

    /// Zeros added above and to the left of the input.
    pub fn pad_top_left(&self) -> (usize, usize) {
        match self.padding {
            Padding::Same => (self.kh.saturating_sub(1) / 2, self.kw.saturating_sub(1) / 2),
            Padding::Valid => (0, 0),
        }
    }

    /// Elements of the input.
    ///
    /// # Panics
    /// If the count overflows `usize` (the ops refuse such a shape with
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) before they build one).
    pub fn input_len(&self) -> usize {
        elements(&[self.n, self.h, self.w, self.c_in], "conv2d input")
    }

    /// Elements of the kernel.
    ///
    /// # Panics
    /// If the count overflows `usize`, as [`input_len`](Conv2dShape::input_len).
    pub fn kernel_len(&self) -> usize {
        elements(&[self.kh, self.kw, self.c_in, self.c_out], "conv2d kernel")
    }

    /// Elements of the output.
    ///
    /// # Panics
    /// If the count overflows `usize`, as [`input_len`](Conv2dShape::input_len).
    pub fn output_len(&self) -> usize {
        let (oh, ow) = self.out_hw();
        elements(&[self.n, oh, ow, self.c_out], "conv2d output")
    }
}

/// A depthwise convolution with depth multiplier 1 and 'same' padding (Keras'
/// `SeparableConv2D` first half): input and output `[n, h, w, c]`, kernel `[kh, kw, c, 1]`,
/// no bias, no activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DepthwiseShape {
    /// Batch.
    pub n: usize,
    /// Height.
    pub h: usize,
    /// Width.
    pub w: usize,
    /// Channels.
    pub c: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
}

impl DepthwiseShape {
    /// Zeros added above and to the left of the input ('same', TF's split).
    pub fn pad_top_left(&self) -> (usize, usize) {
        (self.kh.saturating_sub(1) / 2, self.kw.saturating_sub(1) / 2)
    }

    /// Elements of the input (and of the output).
    ///
    /// # Panics
    /// If the count overflows `usize`, as [`Conv2dShape::input_len`].
    pub fn input_len(&self) -> usize {
        elements(&[self.n, self.h, self.w, self.c], "depthwise input")
    }

    /// Elements of the kernel.
    ///
    /// # Panics
    /// If the count overflows `usize`, as [`Conv2dShape::input_len`].
    pub fn kernel_len(&self) -> usize {
        elements(&[self.kh, self.kw, self.c], "depthwise kernel")
    }
}

/// A 2×2, stride-2, 'valid' max-pool: input `[n, h, w, c]`, output `[n, h / 2, w / 2, c]`
/// (floor: 7 → 3, the last row and column are dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolShape {
    /// Batch.
    pub n: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Channels.
    pub c: usize,
}

impl PoolShape {
    /// Output height and width.
    pub fn out_hw(&self) -> (usize, usize) {
        (self.h / 2, self.w / 2)
    }

    /// Elements of the input.
    ///
    /// # Panics
    /// If the count overflows `usize`, as [`Conv2dShape::input_len`].
    pub fn input_len(&self) -> usize {
        elements(&[self.n, self.h, self.w, self.c], "max-pool input")
    }

    /// Elements of the output.
    ///
    /// # Panics
    /// If the count overflows `usize`, as [`Conv2dShape::input_len`].
    pub fn output_len(&self) -> usize {
        let (oh, ow) = self.out_hw();
        elements(&[self.n, oh, ow, self.c], "max-pool output")
    }
}

/// The element-wise binary ops, with bias-style broadcasting: the right operand's shape is a
/// suffix of the left's (`[rows, cols] + [cols]`) or equal to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
}

impl BinaryOp {
    /// Code passed to the WGSL kernel.
    pub fn code(self) -> u32 {
        match self {
            BinaryOp::Add => 0,
            BinaryOp::Sub => 1,
            BinaryOp::Mul => 2,
        }
    }

    /// Name in the placement log (TF's op names).
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "AddV2",
            BinaryOp::Sub => "Sub",
            BinaryOp::Mul => "Mul",
        }
    }
}

/// Hyper-parameters of Keras' SGD (`learning_rate`, `momentum`, `nesterov`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdParams {
    /// Step size.
    pub lr: f32,
    /// Momentum; 0 means plain SGD (no velocity slot).
    pub momentum: f32,
    /// Nesterov momentum.
    pub nesterov: bool,
}

/// Hyper-parameters of Keras' Adam, plus the 1-based step number the update is for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamParams {
    /// Step size (Keras default 1e-3).
    pub lr: f32,
    /// First-moment decay (0.9).
    pub beta1: f32,
    /// Second-moment decay (0.999).
    pub beta2: f32,
    /// Keras' epsilon (1e-7), added outside the square root.
    pub epsilon: f32,
    /// 1-based step count, for the bias correction.
    pub step: u32,
}

// ---- batch normalization and dropout ----

/// Batch normalization over a tensor viewed as `[rows, channels]` (statistics per channel:
/// `rows` is `n` for a `[n, c]` input, `n * h * w` for an NHWC one), with Keras'
/// `momentum` and `epsilon`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNormParams {
    /// Rows the statistics run over.
    pub rows: usize,
    /// Channels (the last axis).
    pub channels: usize,
    /// Keras' `momentum` of the moving statistics (0.99).
    pub momentum: f32,
    /// Added to the variance (Keras' 1e-3).
    pub epsilon: f32,
}

impl BatchNormParams {
    /// `1 - momentum`, rounded once to f32, as TensorFlow rounds the Python float: every
    /// device updates the moving statistics with this same constant.
    pub fn one_minus_momentum(&self) -> f32 {
        (1.0 - f64::from(self.momentum)) as f32
    }
}

/// Dropout's counter-based mask: element `i` is kept when [`DropoutMask::keeps`]`(i)`, a pure
/// function of `(key, i)` in `u32` arithmetic that the CPU kernel, the WGSL kernel
/// (`shaders/dropout.wgsl`) and the oracle compute alike, so one key gives one mask on every
/// device. Kept values are multiplied by `scale = 1 / (1 - rate)`.
///
/// ```
/// use anygpu::ops::spec::DropoutMask;
/// let m = DropoutMask::new(0.25, 7, 0);
/// let kept = (0..100_000u32).filter(|&i| m.keeps(i)).count();
/// assert!((kept as f64 / 1e5 - 0.75).abs() < 0.01);
/// assert_ne!(DropoutMask::new(0.25, 7, 1).key, m.key); // a new mask every step
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutMask {
    /// The seed and step, mixed into one word.
    pub key: u32,
    /// `ceil(rate * 2^24)`: an element is dropped when its 24 hash bits fall below it.
    pub threshold: u32,
    /// `1 / (1 - rate)`, in f32.
    pub scale: f32,
}

impl DropoutMask {
    /// The mask of step `step` of a layer seeded `seed`, dropping a `rate` fraction
    /// (`0 <= rate < 1`, checked by the layer).
    pub fn new(rate: f32, seed: u64, step: u64) -> DropoutMask {
        let word = |v: u64, shift: u32| (v >> shift) as u32;
        let key = dropout_mix(
            word(seed, 0)
                ^ dropout_mix(
                    word(seed, 32) ^ dropout_mix(word(step, 0) ^ dropout_mix(word(step, 32))),
                ),
        );
        let threshold = (f64::from(rate) * f64::from(1u32 << 24)).ceil() as u32;
        DropoutMask {
            key,
            threshold,
            scale: 1.0 / (1.0 - rate),
        }
    }

    /// Whether element `i` is kept (indices past `u32::MAX` wrap).
    pub fn keeps(&self, i: u32) -> bool {
        dropout_mix(dropout_mix(i ^ self.key).wrapping_add(self.key)) >> 8 >= self.threshold
    }
}

/// Wellons' `lowbias32` integer hash, the mixing step of [`DropoutMask`].
pub fn dropout_mix(h: u32) -> u32 {
    let mut v = h;
    v ^= v >> 16;
    v = v.wrapping_mul(0x7feb_352d);
    v ^= v >> 15;
    v = v.wrapping_mul(0x846c_a68b);
    v ^= v >> 16;
    v
}

// ---- activations and pooling layers ----

/// An element-wise activation run by its own kernel (Keras' activations beyond the three that
/// the products fuse, and the `Activation`/`ReLU` layers): a layer computes its product linear,
/// then this.
///
/// The gradient follows TensorFlow's at the kinks (`ReluGrad`, `Relu6Grad`, `LeakyReluGrad`,
/// `EluGrad`, `SeluGrad`, `clip_by_value`'s): `relu'(0) = 0`, `relu6'(6) = 0`,
/// `leaky_relu'(0) = slope`, `elu'(0) = 1`, `selu'(0) = scale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ActivationFn {
    /// The identity.
    Linear,
    /// Keras' `relu(x, negative_slope, max_value, threshold)`: `clip(x > threshold ? x : 0, 0,
    /// max_value) - negative_slope * max(threshold - x, 0)`, with Keras' special cases
    /// (`tf.nn.relu6` for `max_value=6` without threshold, `tf.nn.leaky_relu` for a slope alone),
    /// whose gradients differ at the kinks.
    Relu {
        /// Slope below the threshold.
        negative_slope: f32,
        /// The largest output (`None`: unbounded).
        max_value: Option<f32>,
        /// Inputs at or below it give 0 (before the negative slope's part).
        threshold: f32,
    },
    /// `x > 0 ? x : expm1(x)` (alpha 1, `tf.nn.elu`).
    Elu,
    /// Scaled ELU with [`SELU_ALPHA`] and [`SELU_SCALE`].
    Selu,
    /// `x Φ(x)`; `approximate`: `x σ(2 √(2/π) (x + 0.044715 x³))`, TF's tanh form.
    Gelu {
        /// The tanh approximation instead of the exact `erfc` form.
        approximate: bool,
    },
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    /// `tanh(x)`.
    Tanh,
    /// `x σ(x)` (`silu`).
    Swish,
    /// `log(1 + exp(x))`.
    Softplus,
}

impl ActivationFn {
    /// `relu`.
    pub const RELU: ActivationFn = ActivationFn::Relu {
        negative_slope: 0.0,
        max_value: None,
        threshold: 0.0,
    };
    /// `relu6`.
    pub const RELU6: ActivationFn = ActivationFn::Relu {
        negative_slope: 0.0,
        max_value: Some(6.0),
        threshold: 0.0,
    };

    /// `leaky_relu` with `negative_slope` (Keras' default 0.2).
    pub fn leaky_relu(negative_slope: f32) -> ActivationFn {
        ActivationFn::Relu {
            negative_slope,
            max_value: None,
            threshold: 0.0,
        }
    }

    /// The code WGSL kernels receive (`kind` in `activation.wgsl`), also the index into the op
    /// names.
    pub fn code(self) -> u32 {
        match self {
            ActivationFn::Linear => 0,
            ActivationFn::Relu { .. } => 1,
            ActivationFn::Elu => 2,
            ActivationFn::Selu => 3,
            ActivationFn::Gelu { approximate: false } => 4,
            ActivationFn::Gelu { approximate: true } => 5,
            ActivationFn::Sigmoid => 6,
            ActivationFn::Tanh => 7,
            ActivationFn::Swish => 8,
            ActivationFn::Softplus => 9,
        }
    }

    /// Whether the gradient can be computed from the activation's output alone (then a layer
    /// keeps its output, which the next layer keeps anyway; otherwise its pre-activation).
    /// `gelu` and `swish` are not monotonic; a relu with a threshold or a clip other than 6 is
    /// ambiguous at its kinks.
    pub fn grad_from_output(self) -> bool {
        match self {
            ActivationFn::Relu {
                max_value,
                threshold,
                ..
            } => threshold == 0.0 && matches!(max_value, None | Some(6.0)),
            ActivationFn::Gelu { .. } | ActivationFn::Swish => false,
            _ => true,
        }
    }
}

/// A 2-D pooling window over `[n, h, w, c]` (NHWC): `pool` `(ph, pw)`, `strides` `(sh, sw)`,
/// padding as TensorFlow's `tf.nn.avg_pool2d`/`max_pool2d` (`'same'`: output `ceil(h / sh)`,
/// the padding split with the smaller half on top/left; `'valid'`: `(h - ph) / sh + 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pool2dShape {
    /// Batch.
    pub n: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Channels.
    pub c: usize,
    /// Window height and width.
    pub pool: (usize, usize),
    /// Strides (rows, columns).
    pub strides: (usize, usize),
    /// Padding mode.
    pub padding: Padding,
}

impl Pool2dShape {
    /// Output height and width (0 when a 'valid' window does not fit).
    pub fn out_hw(&self) -> (usize, usize) {
        let dim = |size: usize, k: usize, s: usize| match self.padding {
            Padding::Same => size.div_ceil(s.max(1)),
            Padding::Valid if size >= k => (size - k) / s.max(1) + 1,
            Padding::Valid => 0,
        };
        (
            dim(self.h, self.pool.0, self.strides.0),
            dim(self.w, self.pool.1, self.strides.1),
        )
    }

    /// Rows and columns of padding above and to the left (TF: half the total, rounded down).
    pub fn pad_top_left(&self) -> (usize, usize) {
        let (oh, ow) = self.out_hw();
        let pad = |out: usize, size: usize, k: usize, s: usize| match self.padding {
            Padding::Same => ((out.saturating_sub(1) * s + k).saturating_sub(size)) / 2,
            Padding::Valid => 0,
        };
        (
            pad(oh, self.h, self.pool.0, self.strides.0),
            pad(ow, self.w, self.pool.1, self.strides.1),
        )
    }

    /// Elements of the input.
    ///
    /// # Panics
    /// If the count overflows `usize`, as [`Conv2dShape::input_len`].
    pub fn input_len(&self) -> usize {
        elements(&[self.n, self.h, self.w, self.c], "pool input")
    }

    /// Elements of the output.
    ///
    /// # Panics
    /// If the count overflows `usize`, as [`Conv2dShape::input_len`].
    pub fn output_len(&self) -> usize {
        let (oh, ow) = self.out_hw();
        elements(&[self.n, oh, ow, self.c], "pool output")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_counts_that_overflow_panic_instead_of_wrapping() {
        let huge = Conv2dShape {
            n: 1 << 40,
            h: 1 << 20,
            w: 1 << 10,
            c_in: 1,
            c_out: 1,
            kh: 3,
            kw: 3,
            padding: Padding::Same,
        };
        // 2^70 wraps to 0 in u64 arithmetic: a kernel sized by it would write past its buffer.
        let wrapped = std::panic::catch_unwind(|| huge.input_len());
        assert!(wrapped.is_err(), "2^70 elements must not wrap");
        let fine = Conv2dShape { n: 2, ..huge };
        assert_eq!(fine.kernel_len(), 9);
        let pool = PoolShape {
            n: usize::MAX,
            h: 2,
            w: 2,
            c: 1,
        };
        assert!(std::panic::catch_unwind(|| pool.input_len()).is_err());
        assert_eq!(pool.output_len(), usize::MAX);
    }

    #[test]
    fn an_empty_kernel_has_no_padding_rather_than_an_underflow() {
        let s = DepthwiseShape {
            n: 1,
            h: 4,
            w: 4,
            c: 1,
            kh: 0,
            kw: 0,
        };
        assert_eq!(s.pad_top_left(), (0, 0));
        assert_eq!(s.kernel_len(), 0);
    }
}
