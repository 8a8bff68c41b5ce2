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
            Padding::Same => ((self.kh - 1) / 2, (self.kw - 1) / 2),
            Padding::Valid => (0, 0),
        }
    }

    /// Elements of the input.
    pub fn input_len(&self) -> usize {
        self.n * self.h * self.w * self.c_in
    }

    /// Elements of the kernel.
    pub fn kernel_len(&self) -> usize {
        self.kh * self.kw * self.c_in * self.c_out
    }

    /// Elements of the output.
    pub fn output_len(&self) -> usize {
        let (oh, ow) = self.out_hw();
        self.n * oh * ow * self.c_out
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
        ((self.kh - 1) / 2, (self.kw - 1) / 2)
    }

    /// Elements of the input (and of the output).
    pub fn input_len(&self) -> usize {
        self.n * self.h * self.w * self.c
    }

    /// Elements of the kernel.
    pub fn kernel_len(&self) -> usize {
        self.kh * self.kw * self.c
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
    pub fn input_len(&self) -> usize {
        self.n * self.h * self.w * self.c
    }

    /// Elements of the output.
    pub fn output_len(&self) -> usize {
        let (oh, ow) = self.out_hw();
        self.n * oh * ow * self.c
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
