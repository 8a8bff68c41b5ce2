//! Pooling shapes: the 2×2 max-pool's [`PoolShape`] and the general window's [`Pool2dShape`].

use super::*;

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
