//! Stride-1 2-D convolution (Keras' `Conv2D`, and the pointwise half of `SeparableConv2D`),
//! NHWC with HWIO kernels, as matrix products.
//!
//! The output rows of the whole batch are cut into blocks of a few image rows, one rayon task
//! each. A task multiplies its block's input patches by the kernel seen as the
//! `[kh*kw*c_in, c_out]` matrix and applies bias and activation while the block is in cache:
//!
//! * 1×1 kernels: the input block is the patch matrix;
//! * small patches (`kh*kw*c_in <= SMALL_K`, e.g. 3×3 on one channel): each output row's
//!   patches are read in place from a zero-padded copy of the `kh` input rows it needs, by the
//!   register-blocked `small_k_bias_act` (an implicit im2col);
//! * otherwise the patches are gathered into a per-thread scratch matrix (im2col) for the gemm
//!   crate.
//!
//! A 3×3 kernel between at least 16 channels each way takes Winograd's minimal filtering
//! instead (`winograd/`: F(4×4, 3×3) or F(2×2, 3×3) by the image size), in all three passes.
//!
//! Backward-input runs the same machinery on `dz` with the kernel flipped spatially and
//! transposed in its channels and the complementary padding (`kh - 1 - pad_top`, ...), except
//! when the input has fewer channels than the output (the first layer) and Winograd does not
//! apply, where `dz · kernelᵀ` is computed per image and summed back (col2im). Backward-kernel
//! ([`kernel_grad`]) accumulates `patchesᵀ · dz` (or Winograd's transformed sums) per task and
//! sums the tasks' partials.

mod kernel_grad;

pub(crate) use kernel_grad::{
    conv2d_backward_kernel, conv2d_backward_weights, conv2d_backward_weights_normalized,
    conv2d_weight_grads_serial, BatchNormGradInputs,
};

use rayon::prelude::*;

use crate::ops::spec::{Activation, Conv2dShape, ConvGeometry};
use crate::shape::product;

use super::elementwise::bias_act_rows;
use super::gemm::{gemm_strided, Strided};
use super::small_k::{small_k_bias_act, SmallK, SMALL_K};
use super::{conv_general, padded_row, winograd, with_scratch};

/// Patch-matrix bytes a task aims for (fits in L2 next to the kernel and the output block).
const COL_BYTES: usize = 192 * 1024;

/// Output pixels a task aims for when no patch matrix is built (1×1 kernels).
const DIRECT_PIXELS: usize = 2048;
/// Channels (in and out) from which a 3×3 correlation takes Winograd's algorithm. Measured with
/// F(2×2, 3×3): at 16 → 16 channels on 28×28 images it ran as fast as the patch matrix; from 32
/// channels on it was 1.1-1.9× faster (forward, either gradient; see docs/performance.md, "The
/// modern CNN on CPU:0").
const WINOGRAD_MIN_CHANNELS: usize = 16;

/// One stride-1 correlation `out[i, j, :] = Σ_{a,b} in[i + a - pt, j + b - pl, :] · K[a, b]`
/// between an `[h, w, c_in]` input and an `[oh, ow, c_out]` output (per image), out-of-range
/// inputs reading as zero.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    /// Batch.
    n: usize,
    /// Input height.
    h: usize,
    /// Input width.
    w: usize,
    /// Input channels.
    c_in: usize,
    /// Output height.
    oh: usize,
    /// Output width.
    ow: usize,
    /// Output channels.
    c_out: usize,
    /// Kernel height.
    kh: usize,
    /// Kernel width.
    kw: usize,
    /// Zero rows above the input.
    pt: usize,
    /// Zero columns left of the input.
    pl: usize,
}

impl Geometry {
    /// The forward correlation of a `Conv2D` shape.
    fn forward(s: &Conv2dShape) -> Self {
        let (oh, ow) = s.out_hw();
        let (pt, pl) = s.pad_top_left();
        Self {
            n: s.n,
            h: s.h,
            w: s.w,
            c_in: s.c_in,
            oh,
            ow,
            c_out: s.c_out,
            kh: s.kh,
            kw: s.kw,
            pt,
            pl,
        }
    }

    /// The correlation computing the input gradient from the output gradient: `dz` is the
    /// input, `dx` the output, the kernel flipped, padding complementary.
    fn backward_input(s: &Conv2dShape) -> Self {
        let f = Self::forward(s);
        Self {
            n: s.n,
            h: f.oh,
            w: f.ow,
            c_in: s.c_out,
            oh: s.h,
            ow: s.w,
            c_out: s.c_in,
            kh: s.kh,
            kw: s.kw,
            pt: s.kh - 1 - f.pt,
            pl: s.kw - 1 - f.pl,
        }
    }

    /// Rows of the patch matrix / of the kernel matrix.
    fn patch_len(&self) -> usize {
        self.kh * self.kw * self.c_in
    }

    /// Whether the patch matrix is the input itself (1×1 kernel, no padding, same size).
    fn is_pointwise(&self) -> bool {
        self.kh == 1
            && self.kw == 1
            && self.pt == 0
            && self.pl == 0
            && self.oh == self.h
            && self.ow == self.w
    }

    /// This correlation for Winograd's algorithm ([`winograd`]), when it pays: a 3×3 kernel
    /// between at least [`WINOGRAD_MIN_CHANNELS`] input and output channels. Its tile is the
    /// forward pass's and the input gradient's ([`winograd::Tile::for_output`]); the kernel
    /// gradient picks its own.
    fn winograd(&self) -> Option<winograd::Correlation> {
        let fits = self.kh == 3
            && self.kw == 3
            && self.c_in >= WINOGRAD_MIN_CHANNELS
            && self.c_out >= WINOGRAD_MIN_CHANNELS;
        fits.then_some(winograd::Correlation {
            n: self.n,
            h: self.h,
            w: self.w,
            c_in: self.c_in,
            oh: self.oh,
            ow: self.ow,
            c_out: self.c_out,
            pt: self.pt,
            pl: self.pl,
            tile: winograd::Tile::for_output(self.oh, self.ow),
        })
    }

    /// Whether some patch element falls outside the input.
    fn is_padded(&self) -> bool {
        self.pt > 0
            || self.pl > 0
            || self.oh + self.kh - 1 > self.h
            || self.ow + self.kw - 1 > self.w
    }

    /// Output rows (over the whole batch) per task.
    /// Output rows per task: what fills the cache, but at least `tasks` tasks when the batch
    /// allows it.
    fn rows_per_task(&self, tasks: usize) -> usize {
        let total_rows = self.n * self.oh;
        let pixels = if self.is_pointwise() {
            DIRECT_PIXELS
        } else {
            (COL_BYTES / (4 * self.patch_len().max(1))).max(1)
        };
        let rows = (pixels / self.ow.max(1)).max(1);
        let balanced = total_rows.div_ceil(tasks.max(1)).max(1);
        rows.min(balanced)
    }

    /// Copies the input rows that output rows `r..` (batch-flattened, of one image) read into
    /// `pad`, as many as it holds (`[kh, ow + kw - 1, c_in]` for one output row), shifted by
    /// the left padding, zeros outside the image.
    fn pad_rows(&self, x: &[f32], r: usize, pad: &mut [f32]) {
        let (img, oi) = (r / self.oh, r % self.oh);
        let (w, c) = (self.w, self.c_in);
        let row_len = (self.ow + self.kw - 1) * c;
        for (a, prow) in pad.chunks_exact_mut(row_len).enumerate() {
            let ii = (oi + a).checked_sub(self.pt).filter(|&ii| ii < self.h);
            let src = ii.map(|ii| &x[((img * self.h) + ii) * w * c..][..w * c]);
            padded_row(src, self.pl * c, prow);
        }
    }

    /// Gathers the patches of output rows `[r0, r0 + rows)` (batch-flattened) into `col`
    /// (`[rows * ow, patch_len]`, row-major).
    fn im2col(&self, x: &[f32], r0: usize, rows: usize, col: &mut [f32]) {
        let (w, c, kw, ow) = (self.w, self.c_in, self.kw, self.ow);
        let k = self.patch_len();
        if self.is_padded() {
            col.fill(0.0);
        }
        for r in r0..r0 + rows {
            let (img, oi) = (r / self.oh, r % self.oh);
            let block = &mut col[(r - r0) * ow * k..(r - r0 + 1) * ow * k];
            for a in 0..self.kh {
                let Some(ii) = (oi + a).checked_sub(self.pt).filter(|&ii| ii < self.h) else {
                    continue;
                };
                let in_row = &x[((img * self.h) + ii) * w * c..((img * self.h) + ii + 1) * w * c];
                if c == 1 {
                    // One float per tap: a strided gather per kernel column beats tiny copies.
                    for b in 0..kw {
                        let (j0, j1) = valid_cols(ow, w, self.pl, b);
                        let tap = a * kw + b;
                        let src = &in_row[j0 + b - self.pl..j1 + b - self.pl];
                        for (dst, &v) in block[j0 * k..].chunks_mut(k).zip(src) {
                            dst[tap] = v;
                        }
                    }
                } else {
                    for oj in 0..ow {
                        // Kernel columns b whose input column oj + b - pl is inside the row.
                        let b0 = self.pl.saturating_sub(oj).min(kw);
                        let b1 = (w + self.pl).saturating_sub(oj).min(kw).max(b0);
                        if b0 == b1 {
                            continue;
                        }
                        let dst =
                            &mut block[oj * k + (a * kw + b0) * c..oj * k + (a * kw + b1) * c];
                        let start = (oj + b0 - self.pl) * c;
                        dst.copy_from_slice(&in_row[start..start + (b1 - b0) * c]);
                    }
                }
            }
        }
    }

    /// Sums one image's patch-gradient matrix `dcol` (`[oh * ow, patch_len]`) back onto the
    /// input positions each patch element came from: `dx[i, j, c] = Σ_{a,b} dcol[i + pt - a,
    /// j + pl - b, (a, b, c)]` over the output positions inside the output. Tap by tap, so that
    /// the innermost loop runs along an input row.
    fn col2im(&self, dcol: &[f32], dx: &mut [f32]) {
        let (c, w, ow, k) = (self.c_in, self.w, self.ow, self.patch_len());
        dx.fill(0.0);
        for a in 0..self.kh {
            for b in 0..self.kw {
                let tap = (a * self.kw + b) * c;
                // Input columns j with output column oj = j + pl - b in [0, ow).
                let j0 = b.saturating_sub(self.pl).min(w);
                let j1 = (ow + b).saturating_sub(self.pl).min(w).max(j0);
                if j0 == j1 {
                    continue;
                }
                for i in 0..self.h {
                    let Some(oi) = (i + self.pt).checked_sub(a).filter(|&oi| oi < self.oh) else {
                        continue;
                    };
                    let dst = &mut dx[(i * w + j0) * c..(i * w + j1) * c];
                    let first = (oi * ow + j0 + self.pl - b) * k + tap;
                    let src = &dcol[first..first + (j1 - j0 - 1) * k + c];
                    if c == 1 {
                        for (d, &s) in dst.iter_mut().zip(src.iter().step_by(k)) {
                            *d += s;
                        }
                    } else {
                        for (d, s) in dst.chunks_exact_mut(c).zip(src.chunks(k)) {
                            for (d, &s) in d.iter_mut().zip(&s[..c]) {
                                *d += s;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Output columns `[j0, j1)` (of `ow`) whose input column `j + b - pl` lies in `[0, w)`.
#[inline]
fn valid_cols(ow: usize, w: usize, pl: usize, b: usize) -> (usize, usize) {
    let j0 = pl.saturating_sub(b).min(ow);
    let j1 = (w + pl).saturating_sub(b).min(ow).max(j0);
    (j0, j1)
}

/// `out = act(correlate(x, kmat) + bias)` over the whole batch (`kmat` is the
/// `[patch_len, c_out]` kernel matrix).
///
/// Three strategies: a 1×1 kernel multiplies the input block directly; a small patch
/// (`patch_len <= SMALL_K`, e.g. the 3×3 first layer on one channel) reads each output row's
/// patches in place from a zero-padded copy of the `kh` input rows it needs (an implicit
/// im2col) with the register-blocked [`small_k_bias_act`]; anything larger builds the patch
/// matrix and calls the gemm crate.
fn correlate(
    x: &[f32],
    kmat: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    g: &Geometry,
    act: Activation,
) {
    let out_row = g.ow * g.c_out;
    if out.is_empty() || out_row == 0 {
        return;
    }
    if let Some(c) = g.winograd() {
        return winograd::correlate(x, kmat, bias, out, &c, act);
    }
    // Two tasks per thread: each writes its own rows, so how they are cut changes nothing.
    let rows_per_task = g.rows_per_task(2 * rayon::current_num_threads());
    let offs = patch_offsets(g);
    out.par_chunks_mut(rows_per_task * out_row)
        .enumerate()
        .for_each(|(t, out)| correlate_rows(x, kmat, bias, out, g, act, &offs, t * rows_per_task));
}

/// Where each element of a patch sits: within the input block (pointwise) or within the rows
/// [`Geometry::pad_rows`] copies.
fn patch_offsets(g: &Geometry) -> Vec<usize> {
    if g.is_pointwise() {
        (0..g.patch_len()).collect()
    } else {
        patch_offsets_in(g, g.ow + g.kw - 1)
    }
}

/// Where each element of a patch sits in zero-padded rows of `padded_w` pixels.
fn patch_offsets_in(g: &Geometry, padded_w: usize) -> Vec<usize> {
    (0..g.patch_len())
        .map(|t| {
            (t / (g.kw * g.c_in) * padded_w + t % (g.kw * g.c_in) / g.c_in) * g.c_in + t % g.c_in
        })
        .collect()
}

/// [`correlate`]'s work on output rows `r0..` (batch-flattened; as many as `out` holds), on
/// the calling thread.
#[allow(clippy::too_many_arguments)] // correlate's arguments, the offsets and the first row
fn correlate_rows(
    x: &[f32],
    kmat: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    g: &Geometry,
    act: Activation,
    offs: &[usize],
    r0: usize,
) {
    let (k, out_row) = (g.patch_len(), g.ow * g.c_out);
    let rows = out.len() / out_row;
    let pixels = rows * g.ow;
    let small = k <= SMALL_K;
    let padded_w = g.ow + g.kw - 1;
    if g.is_pointwise() {
        let lhs = &x[r0 * g.ow * k..(r0 * g.ow + pixels) * k];
        if small {
            let p = SmallK {
                lhs,
                ps: k,
                offs,
                rhs: kmat,
                bias,
                n: g.c_out,
                act,
            };
            small_k_bias_act(&p, out);
        } else {
            let (lhs, rhs) = (
                Strided::row_major(lhs, k),
                Strided::row_major(kmat, g.c_out),
            );
            gemm_strided(out, pixels, g.c_out, k, lhs, rhs, false, false);
            bias_act_rows(out, bias, g.c_out, act);
        }
    } else if small {
        with_scratch(g.kh * padded_w * g.c_in, |pad| {
            for (r, out) in (r0..).zip(out.chunks_exact_mut(out_row)) {
                g.pad_rows(x, r, pad);
                let p = SmallK {
                    lhs: pad,
                    ps: g.c_in,
                    offs,
                    rhs: kmat,
                    bias,
                    n: g.c_out,
                    act,
                };
                small_k_bias_act(&p, out);
            }
        });
    } else {
        with_scratch(pixels * k, |col| {
            g.im2col(x, r0, rows, col);
            let (lhs, rhs) = (
                Strided::row_major(col, k),
                Strided::row_major(kmat, g.c_out),
            );
            gemm_strided(out, pixels, g.c_out, k, lhs, rhs, false, false);
            bias_act_rows(out, bias, g.c_out, act);
        });
    }
}

/// Panics unless the slices match the shape, each length computed without wrapping (a shape
/// whose product wraps matches no slice).
pub(super) fn check(s: &Conv2dShape, x: usize, k: usize, y: usize, what: &str) {
    assert!(s.kh > 0 && s.kw > 0, "{what}: kernel must be at least 1x1");
    let (oh, ow) = s.out_hw();
    assert_eq!(
        product(&[s.n, s.h, s.w, s.c_in]),
        Some(x),
        "{what}: input length does not match the shape"
    );
    assert_eq!(
        product(&[s.kh, s.kw, s.c_in, s.c_out]),
        Some(k),
        "{what}: kernel length does not match the shape"
    );
    assert_eq!(
        product(&[s.n, oh, ow, s.c_out]),
        Some(y),
        "{what}: output length does not match the shape"
    );
}

/// `y = act(conv2d(x, kernel) + bias)`: `x` `[n, h, w, c_in]`, `kernel` `[kh, kw, c_in, c_out]`,
/// `bias` `[c_out]` (none: zero), `y` `[n, out_h, out_w, c_out]`.
pub(crate) fn conv2d_forward(
    x: &[f32],
    kernel: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
    s: &Conv2dShape,
    act: Activation,
) {
    check(s, x.len(), kernel.len(), y.len(), "conv2d_forward");
    if let Some(bias) = bias {
        assert_eq!(
            bias.len(),
            s.c_out,
            "conv2d_forward: bias must have c_out elements"
        );
    }
    if !s.is_unit_stride() {
        return conv_general::forward((x, None), kernel, bias, y, &ConvGeometry::conv(s), act);
    }
    correlate(x, kernel, bias, y, &Geometry::forward(s), act);
}

/// Gradient w.r.t. the input, `dx` `[n, h, w, c_in]`, from `dz`, the gradient w.r.t. the
/// pre-activation output `[n, out_h, out_w, c_out]`.
///
/// With fewer input than output channels (the first layer) and no Winograd (see
/// [`Geometry::winograd`]), per image `dcol = dz · kernelᵀ` (`[pixels, kh*kw*c_in]`, the
/// smaller matrix) is gathered back into `dx` (col2im); otherwise `dz` is correlated with the
/// flipped kernel through the forward machinery.
pub(crate) fn conv2d_backward_input(dz: &[f32], kernel: &[f32], dx: &mut [f32], s: &Conv2dShape) {
    check(s, dx.len(), kernel.len(), dz.len(), "conv2d_backward_input");
    if !s.is_unit_stride() {
        return conv_general::backward_input(dz, kernel, dx, &ConvGeometry::conv(s));
    }
    if kernel.is_empty() || dz.is_empty() {
        // Nothing flows back; and an empty kernel's `kh * kw` may be astronomically large.
        dx.fill(0.0);
        return;
    }
    let (kh, kw, ci, co) = (s.kh, s.kw, s.c_in, s.c_out);
    let g = Geometry::backward_input(s);
    if ci < co && g.winograd().is_none() {
        col2im_backward_input(dz, kernel, dx, s);
        return;
    }
    // flipped[a, b, o, i] = kernel[kh-1-a, kw-1-b, i, o]: a [kh*kw*c_out, c_in] matrix.
    let mut flipped = vec![0.0f32; kernel.len()];
    for a in 0..kh {
        for b in 0..kw {
            let src = &kernel[((kh - 1 - a) * kw + (kw - 1 - b)) * ci * co..][..ci * co];
            let dst = &mut flipped[(a * kw + b) * co * ci..][..co * ci];
            for i in 0..ci {
                for o in 0..co {
                    dst[o * ci + i] = src[i * co + o];
                }
            }
        }
    }
    correlate(dz, &flipped, None, dx, &g, Activation::Linear);
}

/// `dx` via `dcol = dz · kernelᵀ` and a gather, one image per task.
fn col2im_backward_input(dz: &[f32], kernel: &[f32], dx: &mut [f32], s: &Conv2dShape) {
    let g = Geometry::forward(s);
    let k = g.patch_len();
    let (ci, co) = (s.c_in, s.c_out);
    let image_in = s.h * s.w * ci;
    let image_out = g.oh * g.ow * co;
    if image_in == 0 {
        return;
    }
    if image_out == 0 {
        dx.fill(0.0);
        return;
    }
    // kernelᵀ, row-major [c_out, kh*kw*c_in].
    let mut kt = vec![0.0f32; kernel.len()];
    for q in 0..k {
        for o in 0..co {
            kt[o * k + q] = kernel[q * co + o];
        }
    }
    let pixels = g.oh * g.ow;
    let identity: Vec<usize> = (0..co).collect();
    dx.par_chunks_mut(image_in)
        .zip(dz.par_chunks(image_out))
        .for_each(|(dx, dz)| {
            with_scratch(pixels * k, |dcol| {
                if co <= SMALL_K {
                    let p = SmallK {
                        lhs: dz,
                        ps: co,
                        offs: &identity,
                        rhs: &kt,
                        bias: None,
                        n: k,
                        act: Activation::Linear,
                    };
                    small_k_bias_act(&p, dcol);
                } else {
                    let (lhs, rhs) = (Strided::row_major(dz, co), Strided::row_major(&kt, k));
                    gemm_strided(dcol, pixels, k, co, lhs, rhs, false, false);
                }
                g.col2im(dcol, dx);
            });
        });
}

/// [`conv2d_forward`] of a stride-1 shape on the calling thread: for a fused op that runs the
/// convolution block by block inside its own parallel loop (`separable.rs`'s stem), where a
/// parallel loop of its own would only fight it for the threads.
pub(crate) fn conv2d_forward_serial(
    x: &[f32],
    kernel: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
    s: &Conv2dShape,
    act: Activation,
) {
    check(s, x.len(), kernel.len(), y.len(), "conv2d_forward_serial");
    assert!(
        s.is_unit_stride(),
        "conv2d_forward_serial: stride-1 shapes only"
    );
    let g = Geometry::forward(s);
    if !y.is_empty() && g.ow * g.c_out > 0 {
        correlate_rows(x, kernel, bias, y, &g, act, &patch_offsets(&g), 0);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::ops::cpu::batchnorm::{batch_norm_backward, batch_norm_train, Dy, Normalized};
    use crate::ops::reference::{self as r, assert_close, random_vec, to_f64};
    use crate::ops::spec::Padding;

    /// Shapes covering batch 1/2/3, sizes 1..28, channels 1 to 40, kernels 1/3/5, both
    /// paddings, and Winograd's (3×3 between ≥ 16 channels).
    fn shapes() -> Vec<Conv2dShape> {
        let mut v = Vec::new();
        for (n, h, w, c_in, c_out, kh, kw, padding) in [
            (1, 1, 1, 1, 1, 1, 1, Padding::Same),
            (3, 7, 7, 1, 32, 3, 3, Padding::Same),
            (1, 13, 7, 3, 3, 5, 5, Padding::Same),
            (3, 28, 28, 1, 3, 3, 3, Padding::Same),
            (1, 28, 28, 32, 32, 3, 3, Padding::Same),
            (3, 13, 13, 32, 3, 1, 1, Padding::Same),
            (1, 7, 13, 3, 32, 1, 1, Padding::Valid),
            (3, 13, 13, 3, 7, 3, 3, Padding::Valid),
            (1, 28, 7, 32, 1, 5, 3, Padding::Valid),
            (1, 3, 7, 1, 3, 5, 5, Padding::Same),
            (1, 3, 3, 3, 1, 5, 5, Padding::Valid),
            (3, 1, 13, 3, 3, 1, 5, Padding::Same),
            (1, 6, 8, 3, 2, 2, 4, Padding::Same),
            // Output channels that are not multiples of 32 / 8 (remainder tiles and columns).
            (1, 7, 7, 1, 13, 3, 3, Padding::Same),
            (1, 5, 6, 1, 40, 3, 3, Padding::Valid),
            (3, 5, 5, 3, 40, 1, 1, Padding::Same),
            (1, 7, 5, 13, 9, 3, 3, Padding::Same),
            // Winograd's algorithm (3×3, ≥ 16 channels each way): odd and even sizes, tiles
            // sticking out of the output, channels not a multiple of 16, fewer input than
            // output channels (its input gradient too), a 1×1 image, 'valid' padding.
            (2, 9, 11, 16, 24, 3, 3, Padding::Same),
            (3, 6, 5, 20, 17, 3, 3, Padding::Same),
            (1, 8, 7, 24, 40, 3, 3, Padding::Valid),
            (2, 1, 1, 16, 16, 3, 3, Padding::Same),
            (1, 3, 4, 33, 16, 3, 3, Padding::Valid),
            // A transformed kernel large enough for the kernel gradient by groups of tiles.
            (2, 7, 7, 64, 128, 3, 3, Padding::Same),
        ] {
            v.push(Conv2dShape {
                n,
                h,
                w,
                c_in,
                c_out,
                kh,
                kw,
                padding,
                strides: [1, 1],
                dilation: [1, 1],
            });
        }
        v
    }

    #[test]
    pub(in crate::ops::cpu) fn forward_matches_reference() {
        for (t, s) in shapes().into_iter().enumerate() {
            let x = random_vec(s.input_len(), 1000 + t as u64);
            let k = random_vec(s.kernel_len(), 2000 + t as u64);
            let b = random_vec(s.c_out, 3000 + t as u64);
            for (act, bias) in [
                (Activation::Linear, None),
                (Activation::Selu, Some(&b[..])),
                (Activation::Relu, Some(&b[..])),
            ] {
                let mut y = vec![f32::NAN; s.output_len()];
                conv2d_forward(&x, &k, bias, &mut y, &s, act);
                let bias64 = bias.map(to_f64);
                let expected =
                    r::conv2d_forward(&to_f64(&x), &to_f64(&k), bias64.as_deref(), &s, act);
                assert_close(&y, &expected, 1e-4, &format!("conv forward {s:?} {act:?}"));
            }
        }
    }

    #[test]
    pub(in crate::ops::cpu) fn backward_matches_reference() {
        for (t, s) in shapes().into_iter().enumerate() {
            let x = random_vec(s.input_len(), 4000 + t as u64);
            let k = random_vec(s.kernel_len(), 5000 + t as u64);
            let dz = random_vec(s.output_len(), 6000 + t as u64);
            let mut dx = vec![f32::NAN; s.input_len()];
            conv2d_backward_input(&dz, &k, &mut dx, &s);
            assert_close(
                &dx,
                &r::conv2d_backward_input(&to_f64(&dz), &to_f64(&k), &s),
                1e-4,
                &format!("conv dx {s:?}"),
            );
            let mut dk = vec![f32::NAN; s.kernel_len()];
            conv2d_backward_kernel(&x, &dz, &mut dk, &s);
            assert_close(
                &dk,
                &r::conv2d_backward_kernel(&to_f64(&x), &to_f64(&dz), &s),
                1e-4,
                &format!("conv dk {s:?}"),
            );
            // The fused kernel and bias gradients from the activated output's gradient.
            let y = random_vec(s.output_len(), 7000 + t as u64);
            for act in [Activation::Linear, Activation::Relu, Activation::Selu] {
                let dz64 = r::activation_backward(&to_f64(&dz), &to_f64(&y), act);
                let (mut dk, mut db) = (vec![f32::NAN; s.kernel_len()], vec![f32::NAN; s.c_out]);
                conv2d_backward_weights(&x, (&y, &dz), act, (&mut dk, &mut db), &s);
                let what = format!("conv weights {s:?} {act:?}");
                let expected = r::conv2d_backward_kernel(&to_f64(&x), &dz64, &s);
                assert_close(&dk, &expected, 1e-4, &format!("{what}: dk"));
                let expected = r::sum_rows(&dz64, s.output_len() / s.c_out.max(1), s.c_out);
                assert_close(&db, &expected, 1e-4, &format!("{what}: db"));
            }
        }
    }

    /// The kernel and bias gradients through a batch normalization and ReLU after the
    /// convolution, `dz` formed block by block: against the normalization's gradient and the
    /// kernel gradient in f64 on every shape (the small patch, Winograd by tasks and the shape
    /// whose plain kernel gradient goes by groups, the patch matrix) and a strided one (`dz`
    /// written whole); the normalization's own gradients are the unfused op's bits.
    #[test]
    pub(in crate::ops::cpu) fn weights_through_batch_norm_match_reference() {
        let strided = Conv2dShape {
            strides: [2, 2],
            ..shapes()[4]
        };
        let with_outputs = shapes().into_iter().filter(|s| s.output_len() > 0);
        for (t, s) in with_outputs.chain([strided]).enumerate() {
            let (rows, c) = (s.output_len() / s.c_out, s.c_out);
            let seed = 9000 + 10 * t as u64;
            let x = random_vec(s.input_len(), seed);
            let z = random_vec(s.output_len(), seed + 1);
            let dy = random_vec(s.output_len(), seed + 2);
            let (gamma, beta) = (random_vec(c, seed + 3), random_vec(c, seed + 4));
            let p = crate::ops::spec::BatchNormParams {
                rows,
                channels: c,
                momentum: 0.9,
                epsilon: 1e-3,
            };
            let (mut y, mut stats) = (vec![0.0; z.len()], vec![0.0; 2 * c]);
            let (mut mm, mut mv) = (vec![0.0; c], vec![1.0; c]);
            let vars = (&mut mm[..], &mut mv[..]);
            let out = Normalized::Values(&mut y);
            batch_norm_train(&z, (&gamma, &beta), vars, out, &mut stats, &p, true);
            let bn = BatchNormGradInputs {
                z: &z,
                dy: &dy,
                gamma: &gamma,
                stats: &stats,
                relu_beta: Some(&beta),
            };
            let (mut dk, mut db) = (vec![f32::NAN; s.kernel_len()], vec![f32::NAN; c]);
            let (mut dgamma, mut dbeta) = (vec![f32::NAN; c], vec![f32::NAN; c]);
            let sums = (&mut dgamma[..], &mut dbeta[..]);
            conv2d_backward_weights_normalized(&x, bn, (&mut dk, Some(&mut db)), sums, &s);

            // ReLU's gradient from the forward pass's output, then the f64 chain.
            let g: Vec<f64> = dy
                .iter()
                .zip(&y)
                .map(|(&d, &y)| if y > 0.0 { f64::from(d) } else { 0.0 })
                .collect();
            let (dz64, dgamma64, dbeta64) =
                r::batch_norm_backward(&to_f64(&z), &g, &to_f64(&gamma), (rows, c), 1e-3);
            let what = format!("weights through batch norm {s:?}");
            let expected = r::conv2d_backward_kernel(&to_f64(&x), &dz64, &s);
            assert_close(&dk, &expected, 1e-4, &format!("{what}: dk"));
            assert_close(
                &db,
                &r::sum_rows(&dz64, rows, c),
                1e-4,
                &format!("{what}: db"),
            );
            assert_close(&dgamma, &dgamma64, 1e-4, &format!("{what}: dgamma"));
            assert_close(&dbeta, &dbeta64, 1e-4, &format!("{what}: dbeta"));
            let (mut dz, mut dg, mut dbt) = (vec![0.0; z.len()], vec![0.0; c], vec![0.0; c]);
            let relu_beta = Some(&beta[..]);
            let sums = (&mut dg[..], &mut dbt[..]);
            batch_norm_backward(
                &z,
                Dy::Rows(&dy),
                &gamma,
                &stats,
                relu_beta,
                &mut dz,
                sums,
                &p,
            );
            assert_eq!((dg, dbt), (dgamma, dbeta), "{what}: the unfused sums");
        }
    }

    #[test]
    fn both_winograd_tiles_match_reference() {
        // Each tile where the size rules would pick the other too: F(4×4, 3×3) on odd sizes,
        // 'valid' padding and 1-2 output rows, F(2×2, 3×3) on whole 4×4 tiles; forward pass
        // and kernel gradient (the input gradient is a forward pass of `dz`).
        for (t, (n, h, w, c_in, c_out, padding)) in [
            (2, 9, 11, 16, 24, Padding::Same),
            (1, 8, 7, 24, 40, Padding::Valid),
            (2, 12, 8, 16, 32, Padding::Same),
            (1, 3, 4, 17, 16, Padding::Valid),
        ]
        .into_iter()
        .enumerate()
        {
            let s = Conv2dShape {
                n,
                h,
                w,
                c_in,
                c_out,
                kh: 3,
                kw: 3,
                padding,
                strides: [1, 1],
                dilation: [1, 1],
            };
            let seed = 100 * t as u64;
            let x = random_vec(s.input_len(), seed + 1);
            let k = random_vec(s.kernel_len(), seed + 2);
            let dz = random_vec(s.output_len(), seed + 3);
            let c = Geometry::forward(&s).winograd().expect("a Winograd shape");
            for tile in [winograd::Tile::F2, winograd::Tile::F4] {
                let c = winograd::Correlation { tile, ..c };
                let what = format!("{tile:?} on {s:?}");
                let mut y = vec![f32::NAN; s.output_len()];
                winograd::correlate(&x, &k, None, &mut y, &c, Activation::Linear);
                let expected =
                    r::conv2d_forward(&to_f64(&x), &to_f64(&k), None, &s, Activation::Linear);
                assert_close(&y, &expected, 1e-4, &format!("{what}: forward"));
                // The tiles in two parts: the first written into an empty `du`, the second
                // added to it; and all of them added to zeros, which must give the same sums
                // (a zero's sign aside: `0 + -0` is `+0`).
                let (all, half) = (c.tile_rows(), c.tile_rows() / 2);
                let mut scratch = vec![f32::NAN; c.scratch_len((0, all))];
                let mut du = Vec::new();
                for (t0, t1) in [(0, half), (half, all)] {
                    let ow = s.out_hw().1;
                    let out_rows = c.out_row(t0) * ow..c.out_row(t1) * ow;
                    let dz = &dz[out_rows.start * s.c_out..out_rows.end * s.c_out];
                    winograd::add_kernel_grad(&x, dz, &c, (t0, t1), &mut du, &mut scratch);
                }
                let mut dk = vec![f32::NAN; s.kernel_len()];
                winograd::kernel_from_grad(&du, &mut dk, &c);
                let expected = r::conv2d_backward_kernel(&to_f64(&x), &to_f64(&dz), &s);
                assert_close(&dk, &expected, 1e-4, &format!("{what}: kernel gradient"));
                let mut written = Vec::new();
                let mut added = vec![0.0; c.transformed_kernel_len()];
                for du in [&mut written, &mut added] {
                    winograd::add_kernel_grad(&x, &dz, &c, (0, all), du, &mut scratch);
                }
                assert!(
                    written.iter().zip(&added).all(|(w, a)| w == a),
                    "{what}: sums written and sums added to zeros differ"
                );
                // By groups of one and of two tile rows.
                for group in [1, 2] {
                    let du = winograd::kernel_grad_by_groups(&x, &dz, &c, group);
                    winograd::kernel_from_grad(&du, &mut dk, &c);
                    let what = format!("{what}: kernel gradient by groups of {group}");
                    assert_close(&dk, &expected, 1e-4, &what);
                }
            }
        }
    }

    #[test]
    fn kernel_larger_than_input_with_valid_padding() {
        let s = Conv2dShape {
            n: 2,
            h: 2,
            w: 3,
            c_in: 2,
            c_out: 3,
            kh: 3,
            kw: 3,
            padding: Padding::Valid,
            strides: [1, 1],
            dilation: [1, 1],
        };
        assert_eq!(s.output_len(), 0);
        let (x, k) = (random_vec(s.input_len(), 1), random_vec(s.kernel_len(), 2));
        let mut y = vec![];
        conv2d_forward(&x, &k, None, &mut y, &s, Activation::Linear);
        let mut dx = vec![f32::NAN; s.input_len()];
        conv2d_backward_input(&[], &k, &mut dx, &s);
        assert_eq!(dx, vec![0.0; s.input_len()]);
        let mut dk = vec![f32::NAN; s.kernel_len()];
        conv2d_backward_kernel(&x, &[], &mut dk, &s);
        assert_eq!(dk, vec![0.0; s.kernel_len()]);
    }
}
