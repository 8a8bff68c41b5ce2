//! Convolution shapes and options: [`Padding`], [`Size2`], [`ConvOptions`], [`Conv2dShape`],
//! [`DepthwiseShape`], one [`Axis`]' output size and padding, and the general geometry both
//! convolutions reduce to (`ConvGeometry`).

use super::*;

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

    /// Floats in one input image and in one output image.
    pub(crate) fn image_lens(&self) -> (usize, usize) {
        (self.h * self.w * self.ci, self.oh * self.ow * self.co)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::spec::PoolShape;

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
