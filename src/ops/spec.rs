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

// ---- optimizers: RMSprop, weight decay, gradient clipping ----

/// Hyper-parameters of Keras' RMSprop (`learning_rate`, `rho`, `momentum`, `epsilon`,
/// `centered`). Which slots the update takes follows from `momentum != 0` and `centered`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmspropParams {
    /// Step size (Keras default 1e-3).
    pub lr: f32,
    /// Discount of the squared-gradient average (0.9).
    pub rho: f32,
    /// Momentum (0: no momentum slot).
    pub momentum: f32,
    /// Keras' epsilon (1e-7), added inside the square root.
    pub epsilon: f32,
    /// Divides by the gradient's estimated variance instead of its second moment.
    pub centered: bool,
}

/// How a gradient is clipped before the update (Keras 3's `clipnorm`, `global_clipnorm`,
/// `clipvalue`: at most one per optimizer).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ClipMode {
    /// `g * c / max(‖g‖, c)` with the gradient's own L2 norm (`tf.clip_by_norm`).
    Norm(f32),
    /// `g * (c * min(1 / n, 1 / c))` with the L2 norm `n` over every gradient of the step
    /// (NaN everywhere when `n` is not finite, as Keras' `clip_by_global_norm`).
    GlobalNorm(f32),
    /// `min(max(g, -c), c)` element-wise (`tf.clip_by_value`).
    Value(f32),
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
