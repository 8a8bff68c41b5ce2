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
    /// Output `ceil(h / stride)` by `ceil(w / stride)` (as large as the input at stride 1); the
    /// input is padded with zeros, TF's split: `pad_total = max((out - 1) * stride +
    /// (kh - 1) * dilation + 1 - h, 0)`, `pad_top = pad_total / 2`, the rest at the bottom
    /// (likewise left/right) — asymmetric for even kernels and for some strided sizes.
    #[default]
    Same,
    /// No padding: output `floor((h - (kh - 1) * dilation - 1) / stride) + 1` (`h - kh + 1` at
    /// stride 1), likewise for the width.
    Valid,
}

/// A height and a width: Keras' "an integer or a tuple/list of 2 integers" for `kernel_size`,
/// `strides` and `dilation_rate`.
///
/// ```
/// use anygpu::ops::spec::Size2;
/// assert_eq!(Size2::from(3), Size2([3, 3]));
/// assert_eq!(Size2::from((3, 5)), Size2([3, 5]));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Size2(pub [usize; 2]);

impl From<usize> for Size2 {
    fn from(v: usize) -> Size2 {
        Size2([v, v])
    }
}

impl From<(usize, usize)> for Size2 {
    fn from((h, w): (usize, usize)) -> Size2 {
        Size2([h, w])
    }
}

impl From<[usize; 2]> for Size2 {
    fn from(hw: [usize; 2]) -> Size2 {
        Size2(hw)
    }
}

/// A convolution's `padding`, `strides` and `dilation_rate` (`tf.nn.conv2d`'s arguments). A
/// [`Padding`] alone converts into stride 1, dilation 1.
///
/// ```
/// use anygpu::ops::spec::{ConvOptions, Padding};
/// let o = ConvOptions::new(Padding::Same).strides((2, 1));
/// assert_eq!(o.strides, [2, 1]);
/// assert_eq!(ConvOptions::from(Padding::Valid).dilation, [1, 1]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvOptions {
    /// Padding mode.
    pub padding: Padding,
    /// Steps between output pixels, height and width.
    pub strides: [usize; 2],
    /// Steps between kernel taps, height and width.
    pub dilation: [usize; 2],
}

impl ConvOptions {
    /// `padding`, stride 1, dilation 1.
    pub fn new(padding: Padding) -> ConvOptions {
        ConvOptions {
            padding,
            strides: [1, 1],
            dilation: [1, 1],
        }
    }

    /// `strides=`.
    pub fn strides(mut self, strides: impl Into<Size2>) -> ConvOptions {
        self.strides = strides.into().0;
        self
    }

    /// `dilation_rate=`.
    pub fn dilation(mut self, dilation: impl Into<Size2>) -> ConvOptions {
        self.dilation = dilation.into().0;
        self
    }
}

impl From<Padding> for ConvOptions {
    fn from(padding: Padding) -> ConvOptions {
        ConvOptions::new(padding)
    }
}

/// A 2-D convolution: input `[n, h, w, c_in]`, kernel `[kh, kw, c_in, c_out]`, bias
/// `[c_out]`, output `[n, out_h, out_w, c_out]`, with `strides` and `dilation` (`[1, 1]`: the
/// stride-1 convolution the tuned kernels serve).
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
    /// Steps between output pixels along the height and the width (Keras' `strides`).
    pub strides: [usize; 2],
    /// Steps between kernel taps along the height and the width (Keras' `dilation_rate`).
    pub dilation: [usize; 2],
}

impl Conv2dShape {
    /// Output height and width.
    pub fn out_hw(&self) -> (usize, usize) {
        let geo = self.geometry();
        (geo[0].out, geo[1].out)
    }

    /// Zeros added above and to the left of the input.
    pub fn pad_top_left(&self) -> (usize, usize) {
        let geo = self.geometry();
        (geo[0].pad_before, geo[1].pad_before)
    }

    /// Zeros added `[top, bottom, left, right]` (TF's split for 'same').
    pub fn pads(&self) -> [usize; 4] {
        let [hg, wg] = self.geometry();
        [hg.pad_before, hg.pad_after, wg.pad_before, wg.pad_after]
    }

    /// Whether this is the stride-1, undilated convolution the tuned kernels serve.
    pub fn is_unit_stride(&self) -> bool {
        self.strides == [1, 1] && self.dilation == [1, 1]
    }

    /// The height and width axes' geometry.
    pub fn geometry(&self) -> [Axis; 2] {
        [
            Axis::new(
                self.h,
                self.kh,
                self.strides[0],
                self.dilation[0],
                self.padding,
            ),
            Axis::new(
                self.w,
                self.kw,
                self.strides[1],
                self.dilation[1],
                self.padding,
            ),
        ]
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

/// A depthwise convolution (Keras' `DepthwiseConv2D`, and `SeparableConv2D`'s first half):
/// input `[n, h, w, c]`, kernel `[kh, kw, c, multiplier]`, output `[n, out_h, out_w,
/// c * multiplier]` (output channel `c * multiplier + q` is input channel `c` correlated with
/// `kernel[.., c, q]`), no bias, no activation.
///
/// [`DepthwiseShape::same`] gives the stride-1, multiplier-1, 'same' shape the tuned kernels
/// serve.
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
    /// Output channels per input channel (Keras' `depth_multiplier`).
    pub multiplier: usize,
    /// Padding mode.
    pub padding: Padding,
    /// Steps between output pixels (Keras' `strides`).
    pub strides: [usize; 2],
    /// Steps between kernel taps (Keras' `dilation_rate`).
    pub dilation: [usize; 2],
}

impl DepthwiseShape {
    /// Stride 1, depth multiplier 1, 'same' padding: the output has the input's shape.
    pub fn same(n: usize, h: usize, w: usize, c: usize, kh: usize, kw: usize) -> DepthwiseShape {
        DepthwiseShape {
            n,
            h,
            w,
            c,
            kh,
            kw,
            multiplier: 1,
            padding: Padding::Same,
            strides: [1, 1],
            dilation: [1, 1],
        }
    }

    /// Whether this is the stride-1, multiplier-1, 'same' convolution the tuned kernels serve.
    pub fn is_same_unit(&self) -> bool {
        self.multiplier == 1
            && self.padding == Padding::Same
            && self.strides == [1, 1]
            && self.dilation == [1, 1]
    }

    /// The same convolution as a grouped [`Conv2dShape`] view: `c_out = c * multiplier`, and
    /// `c_in = c` (the kernel's `[kh, kw, c, multiplier]` is `[kh, kw, 1, c * multiplier]`).
    pub fn as_conv(&self) -> Conv2dShape {
        Conv2dShape {
            n: self.n,
            h: self.h,
            w: self.w,
            c_in: self.c,
            c_out: self.c_out(),
            kh: self.kh,
            kw: self.kw,
            padding: self.padding,
            strides: self.strides,
            dilation: self.dilation,
        }
    }

    /// Output channels, `c * multiplier`.
    pub fn c_out(&self) -> usize {
        self.c.saturating_mul(self.multiplier)
    }

    /// Output height and width.
    pub fn out_hw(&self) -> (usize, usize) {
        self.as_conv().out_hw()
    }

    /// Zeros added above and to the left of the input (TF's split for 'same').
    pub fn pad_top_left(&self) -> (usize, usize) {
        self.as_conv().pad_top_left()
    }

    /// Elements of the input.
    ///
    /// # Panics
    /// If the count overflows `usize`, as [`Conv2dShape::input_len`].
    pub fn input_len(&self) -> usize {
        elements(&[self.n, self.h, self.w, self.c], "depthwise input")
    }

    /// Elements of the output.
    ///
    /// # Panics
    /// If the count overflows `usize`, as [`Conv2dShape::input_len`].
    pub fn output_len(&self) -> usize {
        let (oh, ow) = self.out_hw();
        elements(
            &[self.n, oh, ow, self.c, self.multiplier],
            "depthwise output",
        )
    }

    /// Elements of the kernel.
    ///
    /// # Panics
    /// If the count overflows `usize`, as [`Conv2dShape::input_len`].
    pub fn kernel_len(&self) -> usize {
        elements(
            &[self.kh, self.kw, self.c, self.multiplier],
            "depthwise kernel",
        )
    }
}

/// One spatial axis of a convolution: its output length and the zeros before and after the
/// input, TensorFlow's way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Axis {
    /// Output length.
    pub out: usize,
    /// Zeros before the input (top or left).
    pub pad_before: usize,
    /// Zeros after the input (bottom or right).
    pub pad_after: usize,
}

impl Axis {
    /// The axis of an input of length `len`, a kernel of `k` taps `dilation` apart, and
    /// `stride`: 'valid' `floor((len - (k - 1) * dilation - 1) / stride) + 1` (0 when the
    /// dilated kernel is longer than the input), 'same' `ceil(len / stride)` with `pad_total =
    /// max((out - 1) * stride + (k - 1) * dilation + 1 - len, 0)` split `pad_total / 2` before,
    /// the rest after. A stride or dilation of 0 counts as 1 (the ops refuse them first).
    ///
    /// ```
    /// use anygpu::ops::spec::{Axis, Padding};
    /// // 7 pixels, k 4, stride 2, 'same': 4 outputs, 3 zeros: 1 before, 2 after.
    /// let a = Axis::new(7, 4, 2, 1, Padding::Same);
    /// assert_eq!((a.out, a.pad_before, a.pad_after), (4, 1, 2));
    /// assert_eq!(Axis::new(7, 3, 2, 1, Padding::Valid).out, 3);
    /// ```
    pub fn new(len: usize, k: usize, stride: usize, dilation: usize, padding: Padding) -> Axis {
        let (stride, dilation) = (stride.max(1), dilation.max(1));
        let span = k
            .saturating_sub(1)
            .saturating_mul(dilation)
            .saturating_add(1);
        match padding {
            Padding::Valid => Axis {
                out: if len >= span && k > 0 {
                    (len - span) / stride + 1
                } else {
                    0
                },
                pad_before: 0,
                pad_after: 0,
            },
            Padding::Same => {
                let out = len.div_ceil(stride);
                let needed = out
                    .saturating_sub(1)
                    .saturating_mul(stride)
                    .saturating_add(span);
                let total = if k == 0 {
                    0
                } else {
                    needed.saturating_sub(len)
                };
                Axis {
                    out,
                    pad_before: total / 2,
                    pad_after: total - total / 2,
                }
            }
        }
    }
}

// ---- general (strided, dilated, grouped) convolutions ----

/// Everything a general convolution kernel needs, for [`Conv2dShape`] (one group) and
/// [`DepthwiseShape`] (one group per input channel) alike: output channel `o` belongs to group
/// `g = o / cog` and reads input channels `g * cig .. (g + 1) * cig`; the kernel is
/// `[kh, kw, cig, co]`, so `kernel[((a * kw + b) * cig + i) * co + o]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ConvGeometry {
    pub(crate) n: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    /// Input channels, all groups.
    pub(crate) ci: usize,
    /// Output channels, all groups.
    pub(crate) co: usize,
    /// Input channels per group.
    pub(crate) cig: usize,
    /// Output channels per group.
    pub(crate) cog: usize,
    pub(crate) kh: usize,
    pub(crate) kw: usize,
    pub(crate) sh: usize,
    pub(crate) sw: usize,
    pub(crate) dh: usize,
    pub(crate) dw: usize,
    pub(crate) pt: usize,
    pub(crate) pl: usize,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
}

impl ConvGeometry {
    fn new(s: &Conv2dShape, cig: usize, cog: usize) -> ConvGeometry {
        let (oh, ow) = s.out_hw();
        let (pt, pl) = s.pad_top_left();
        ConvGeometry {
            n: s.n,
            h: s.h,
            w: s.w,
            ci: s.c_in,
            co: s.c_out,
            cig,
            cog,
            kh: s.kh,
            kw: s.kw,
            sh: s.strides[0].max(1),
            sw: s.strides[1].max(1),
            dh: s.dilation[0].max(1),
            dw: s.dilation[1].max(1),
            pt,
            pl,
            oh,
            ow,
        }
    }

    /// A full (one-group) convolution.
    pub(crate) fn conv(s: &Conv2dShape) -> ConvGeometry {
        ConvGeometry::new(s, s.c_in, s.c_out)
    }

    /// A depthwise convolution: one group per input channel.
    pub(crate) fn depthwise(s: &DepthwiseShape) -> ConvGeometry {
        ConvGeometry::new(&s.as_conv(), 1, s.multiplier)
    }

    /// Kernel taps per output channel, `kh * kw * cig`.
    pub(crate) fn taps(&self) -> usize {
        self.kh * self.kw * self.cig
    }

    /// The input row (or column) of output row `i` at tap `a`: `i * stride + a * dilation -
    /// pad` when inside `[0, len)`.
    pub(crate) fn in_row(&self, i: usize, a: usize) -> Option<usize> {
        (i * self.sh + a * self.dh)
            .checked_sub(self.pt)
            .filter(|&r| r < self.h)
    }

    /// The input column of output column `j` at tap `b`, as [`in_row`](Self::in_row).
    pub(crate) fn in_col(&self, j: usize, b: usize) -> Option<usize> {
        (j * self.sw + b * self.dw)
            .checked_sub(self.pl)
            .filter(|&c| c < self.w)
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
            strides: [1, 1],
            dilation: [1, 1],
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
    fn same_padding_splits_like_tensorflow_for_odd_sizes_and_strides() {
        // (len, k, stride, dilation) -> (out, before, after), from tf.nn.conv2d's rule.
        for (len, k, st, d, want) in [
            (7, 3, 2, 1, (4, 1, 1)),
            (7, 4, 2, 1, (4, 1, 2)),
            (6, 3, 2, 1, (3, 0, 1)),
            (6, 4, 2, 1, (3, 1, 1)),
            (5, 3, 1, 2, (5, 2, 2)),
            (28, 3, 1, 1, (28, 1, 1)),
            (1, 5, 3, 1, (1, 2, 2)),
        ] {
            let a = Axis::new(len, k, st, d, Padding::Same);
            assert_eq!(
                (a.out, a.pad_before, a.pad_after),
                want,
                "{len} {k} {st} {d}"
            );
        }
        assert_eq!(Axis::new(7, 3, 1, 2, Padding::Valid).out, 3);
        assert_eq!(Axis::new(4, 3, 1, 2, Padding::Valid).out, 0);
        assert_eq!(Axis::new(6, 5, 2, 1, Padding::Valid).out, 1);
    }

    #[test]
    fn an_empty_kernel_has_no_padding_rather_than_an_underflow() {
        let s = DepthwiseShape::same(1, 4, 4, 1, 0, 0);
        assert_eq!(s.pad_top_left(), (0, 0));
        assert_eq!(s.kernel_len(), 0);
    }
}
