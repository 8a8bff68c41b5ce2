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
//! accumulates `patchesᵀ · dz` (or Winograd's transformed sums) per task and sums the tasks'
//! partials.

use rayon::prelude::*;

use crate::ops::spec::{Activation, Conv2dShape, ConvGeometry};
use crate::shape::product;

use super::batchnorm::{Dy, InputGrad};
use super::elementwise::{act_backward_leaf, bias_act_rows};
use super::gemm::{gemm_strided, Strided};
use super::reduce::sum_rows_leaf;
use super::small_k::{small_k_bias_act, small_k_kernel_grad, SmallK, SmallKGrad, SMALL_K};
use super::{add_parts, conv_general, ordered_parts, padded_row, winograd, with_scratch};

/// Patch-matrix bytes a task aims for (fits in L2 next to the kernel and the output block).
const COL_BYTES: usize = 192 * 1024;

/// Output pixels a task aims for when no patch matrix is built (1×1 kernels).
const DIRECT_PIXELS: usize = 2048;
/// Channels (in and out) from which a 3×3 correlation takes Winograd's algorithm. Measured with
/// F(2×2, 3×3): at 16 → 16 channels on 28×28 images it ran as fast as the patch matrix; from 32
/// channels on it was 1.1-1.9× faster (forward, either gradient; see docs/performance.md, "The
/// modern CNN on CPU:0").
const WINOGRAD_MIN_CHANNELS: usize = 16;
/// Tasks a kernel-gradient reduction is cut into, at least, when the batch allows it.
const REDUCTION_TASKS: usize = 64;

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

/// Gradient w.r.t. the kernel, `dk` `[kh, kw, c_in, c_out]` = `patches(x)ᵀ · dz` summed over
/// the batch (`dz` is the gradient w.r.t. the pre-activation output).
pub(crate) fn conv2d_backward_kernel(x: &[f32], dz: &[f32], dk: &mut [f32], s: &Conv2dShape) {
    check(s, x.len(), dk.len(), dz.len(), "conv2d_backward_kernel");
    if !s.is_unit_stride() {
        return conv_general::backward_kernel((x, None), dz, dk, &ConvGeometry::conv(s));
    }
    weight_grads(x, OutputGrad::Dz(dz), dk, None, s);
}

/// The kernel and bias gradients of `y = act(conv2d(x, kernel) + bias)` from `dy`, the
/// gradient w.r.t. the activated `y`: with `dz = dy * act'(y)`, `dk = patches(x)ᵀ · dz` and
/// `db = Σ dz`.
///
/// One pass over blocks of output rows, each block's `dz` formed in scratch memory: separate
/// ops would write `dz` and read it twice (12.8 MB each way for the tutorial's first layer at
/// batch 128). What a model's first layer needs, which has no input gradient to compute.
pub(crate) fn conv2d_backward_weights(
    x: &[f32],
    (y, dy): (&[f32], &[f32]),
    act: Activation,
    (dk, db): (&mut [f32], &mut [f32]),
    s: &Conv2dShape,
) {
    let what = "conv2d_backward_weights";
    check(s, x.len(), dk.len(), dy.len(), what);
    assert_eq!(y.len(), dy.len(), "{what}: y and dy lengths differ");
    assert_eq!(db.len(), s.c_out, "{what}: db must have c_out elements");
    if !s.is_unit_stride() {
        // dz written out whole: the general path is not the tuned first layer.
        let mut dz = vec![0.0f32; dy.len()];
        super::activation_backward(dy, y, &mut dz, act);
        super::sum_rows(&dz, dz.len() / s.c_out.max(1), s.c_out, db);
        return conv_general::backward_kernel((x, None), &dz, dk, &ConvGeometry::conv(s));
    }
    let grad = match act {
        // `dy` is `dz` (a pre-activated gradient, or no activation): read it in place.
        Activation::Linear => OutputGrad::Dz(dy),
        act => OutputGrad::Activated { dy, y, act },
    };
    weight_grads(x, grad, dk, Some(db), s);
}

/// The kernel and bias gradients of a convolution whose output `z` a batch normalization
/// (with a fused ReLU when `bn.relu_beta` is given) takes, from `dy`, the gradient w.r.t. the
/// normalization's output, and that normalization's `dgamma` and `dbeta`: the normalization's
/// sums in one pass, then `dz`, its input gradient, formed block by block where the kernel
/// gradient reads it. As separate ops `dz` would be written whole and read back (12.8 MB each
/// way for the modern CNN's first layer at batch 128). What a model's first layer needs, which
/// has no input gradient to compute.
pub(crate) fn conv2d_backward_weights_normalized(
    x: &[f32],
    bn: BatchNormGradInputs<'_>,
    (dk, db): (&mut [f32], Option<&mut [f32]>),
    (dgamma, dbeta): (&mut [f32], &mut [f32]),
    s: &Conv2dShape,
) {
    let what = "conv2d_backward_weights_normalized";
    check(s, x.len(), dk.len(), bn.dy.len(), what);
    assert_eq!(bn.z.len(), bn.dy.len(), "{what}: z and dy lengths differ");
    let rows = bn.dy.len() / s.c_out.max(1);
    let grad = InputGrad::new(
        (bn.z, Dy::Rows(bn.dy)),
        (bn.gamma, bn.relu_beta),
        bn.stats,
        (dgamma, dbeta),
        (rows, s.c_out),
    );
    if !s.is_unit_stride() {
        // dz written out whole: the general path is not the tuned first layer.
        let mut dz = vec![0.0f32; bn.dy.len()];
        grad.all(&mut dz);
        if let Some(db) = db {
            super::sum_rows(&dz, rows, s.c_out, db);
        }
        return conv_general::backward_kernel((x, None), &dz, dk, &ConvGeometry::conv(s));
    }
    weight_grads(x, OutputGrad::Normalized(&grad), dk, db, s);
}

/// What [`conv2d_backward_weights_normalized`] reads of the batch normalization after the
/// convolution: its input `z` (the convolution's output), the gradient `dy` w.r.t. its
/// output, `gamma`, the forward pass's `stats` (`[mean; inv]`) and, with a fused ReLU, `beta`.
#[derive(Clone, Copy)]
pub(crate) struct BatchNormGradInputs<'a> {
    pub z: &'a [f32],
    pub dy: &'a [f32],
    pub gamma: &'a [f32],
    pub stats: &'a [f32],
    pub relu_beta: Option<&'a [f32]>,
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

/// Adds `patches(x)ᵀ · dz` to `dk` and the column sums of `dz` to `db`, for a stride-1 shape on
/// the calling thread (a block of images inside a fused op's parallel loop, as
/// [`conv2d_forward_serial`]). `dz` is the gradient w.r.t. the pre-activation output.
pub(crate) fn conv2d_weight_grads_serial(
    x: &[f32],
    dz: &[f32],
    (dk, db): (&mut [f32], &mut [f64]),
    s: &Conv2dShape,
) {
    check(s, x.len(), dk.len(), dz.len(), "conv2d_weight_grads_serial");
    assert!(
        s.is_unit_stride(),
        "conv2d_weight_grads_serial: stride-1 shapes only"
    );
    assert_eq!(
        db.len(),
        s.c_out,
        "conv2d_weight_grads_serial: db must have c_out elements"
    );
    let g = Geometry::forward(s);
    if dz.is_empty() || dk.is_empty() {
        return;
    }
    let (k, pixels) = (g.patch_len(), dz.len() / g.c_out);
    let rhs = Strided::row_major(dz, g.c_out);
    if k <= SMALL_K && !g.is_pointwise() {
        // The bias sums along with the first taps.
        let offs = patch_offsets_in(&g, g.ow + g.kw - 1);
        let pad_len = (g.oh + g.kh - 1) * (g.ow + g.kw - 1) * g.c_in;
        with_scratch(pad_len, |pad| {
            small_k_rows(x, dz, &g, (0, pixels / g.ow), &offs, (dk, db), pad);
        });
        return;
    }
    sum_rows_leaf(dz, g.c_out, db);
    if g.is_pointwise() {
        let lhs = Strided::transposed(&x[..pixels * k], k);
        gemm_strided(dk, k, g.c_out, pixels, lhs, rhs, true, false);
    } else {
        with_scratch(pixels * k, |col| {
            g.im2col(x, 0, pixels / g.ow, col);
            let lhs = Strided::transposed(col, k);
            gemm_strided(dk, k, g.c_out, pixels, lhs, rhs, true, false);
        });
    }
}

/// Where [`weight_grads`] takes the gradient w.r.t. the pre-activation output from.
#[derive(Clone, Copy)]
enum OutputGrad<'a> {
    /// `dz` itself.
    Dz(&'a [f32]),
    /// `dz = dy * act'(y)`, formed block by block from the activated output `y`.
    Activated {
        dy: &'a [f32],
        y: &'a [f32],
        act: Activation,
    },
    /// The input gradient of a batch normalization of the output, formed block by block.
    Normalized(&'a InputGrad<'a>),
}

/// `dk = patches(x)ᵀ · dz` and, when asked, `db = Σ dz` (in f64), over blocks of output rows in
/// parallel, each task with its own partial sums, added at the end.
fn weight_grads(
    x: &[f32],
    grad: OutputGrad<'_>,
    dk: &mut [f32],
    db: Option<&mut [f32]>,
    s: &Conv2dShape,
) {
    let g = Geometry::forward(s);
    let out_row = g.ow * g.c_out;
    let total = match grad {
        OutputGrad::Dz(dz) => dz.len(),
        OutputGrad::Activated { dy, .. } => dy.len(),
        OutputGrad::Normalized(grad) => grad.len(),
    };
    if total == 0 || out_row == 0 || dk.is_empty() {
        dk.fill(0.0);
        if let Some(db) = db {
            db.fill(0.0);
        }
        return;
    }
    let k = g.patch_len();
    // Under Winograd a task takes whole rows of tiles (`per_task` of them), and the
    // partial sums are the gradient w.r.t. the transformed kernel.
    let wino = g.winograd().map(|c| {
        let c = winograd::Correlation {
            tile: winograd::Tile::for_kernel_grad(c.oh, c.ow),
            ..c
        };
        (c, c.grad_rows_per_task(REDUCTION_TASKS))
    });
    // A large transformed kernel goes by groups of tiles, without per-task partial sums (from
    // `dz` itself; an activation's gradient formed block by block keeps the tasks).
    if let (Some((c, _)), OutputGrad::Dz(dz)) = (wino, grad) {
        if c.grad_by_groups() {
            let du = winograd::kernel_grad_by_groups(x, dz, &c, c.group_rows());
            winograd::kernel_from_grad(&du, dk, &c);
            if let Some(db) = db {
                super::sum_rows(dz, dz.len() / g.c_out, g.c_out, db);
            }
            return;
        }
    }
    // Tasks cut independently of the thread count: each sums its rows into its own partial,
    // so the cut decides the rounding, which must be the same on every run and machine.
    let rows_per_task = g.rows_per_task(REDUCTION_TASKS);
    let tasks = match wino {
        Some((c, per_task)) => c.tile_rows().div_ceil(per_task),
        None => (g.n * g.oh).div_ceil(rows_per_task),
    };
    // Task `t`'s tile rows (Winograd) and output rows (batch-flattened).
    let tiles_of = |t: usize| {
        wino.map(|(c, per_task)| (t * per_task, ((t + 1) * per_task).min(c.tile_rows())))
    };
    let rows_of = |t: usize| match (wino, tiles_of(t)) {
        (Some((c, _)), Some((t0, t1))) => (c.out_row(t0), c.out_row(t1)),
        _ => (t * rows_per_task, ((t + 1) * rows_per_task).min(g.n * g.oh)),
    };
    let partial_len = match wino {
        Some((c, _)) => c.transformed_kernel_len(),
        None => dk.len(),
    };
    // A small patch (the 3×3 first layer on one channel) is read in place from padded input
    // rows: its patch matrix would be copied tap run by tap run, 3 values at a time.
    let small_k = wino.is_none() && k <= SMALL_K && !g.is_pointwise();
    let offs = if small_k {
        patch_offsets_in(&g, g.ow + g.kw - 1)
    } else {
        Vec::new()
    };
    let with_bias = db.is_some();
    let parts = ordered_parts(
        tasks,
        // A Winograd partial starts empty: its first task writes it (`add_kernel_grad`).
        || {
            let partial = if wino.is_some() {
                Vec::new()
            } else {
                vec![0.0f32; partial_len]
            };
            (partial, vec![0.0f64; g.c_out])
        },
        |(mut acc, mut bias), t| {
            let (r0, r1) = rows_of(t);
            let range = r0 * out_row..r1 * out_row;
            let pixels = range.len() / g.c_out;
            let product_len = match (wino, tiles_of(t)) {
                (Some((c, _)), Some(tiles)) => c.scratch_len(tiles),
                _ if g.is_pointwise() => 0,
                _ if small_k => (r1 - r0 + g.kh - 1) * (g.ow + g.kw - 1) * g.c_in,
                _ => pixels * k,
            };
            let dz_len = match grad {
                OutputGrad::Dz(_) => 0,
                OutputGrad::Activated { .. } | OutputGrad::Normalized(..) => range.len(),
            };
            // One scratch buffer for both: a nested `with_scratch` would allocate.
            with_scratch(product_len + dz_len, |buf| {
                let (scratch, dz_buf) = buf.split_at_mut(product_len);
                let dz: &[f32] = match grad {
                    OutputGrad::Dz(dz) => &dz[range.clone()],
                    OutputGrad::Activated { dy, y, act } => {
                        act_backward_leaf(&dy[range.clone()], &y[range.clone()], dz_buf, act);
                        dz_buf
                    }
                    OutputGrad::Normalized(norm) => {
                        norm.rows(range.start / g.c_out, dz_buf);
                        dz_buf
                    }
                };
                if with_bias {
                    sum_rows_leaf(dz, g.c_out, &mut bias);
                }
                if let (Some((c, _)), Some(tiles)) = (wino, tiles_of(t)) {
                    winograd::add_kernel_grad(x, dz, &c, tiles, &mut acc, scratch);
                    return;
                }
                if small_k {
                    small_k_rows(x, dz, &g, (r0, r1), &offs, (&mut acc, &mut []), scratch);
                    return;
                }
                let patches: &[f32] = if g.is_pointwise() {
                    &x[r0 * g.ow * k..(r0 * g.ow + pixels) * k]
                } else {
                    g.im2col(x, r0, pixels / g.ow, scratch);
                    scratch
                };
                let (lhs, rhs) = (
                    Strided::transposed(patches, k),
                    Strided::row_major(dz, g.c_out),
                );
                gemm_strided(&mut acc, k, g.c_out, pixels, lhs, rhs, true, false);
            });
            (acc, bias)
        },
    );
    let (parts, bias_parts): (Vec<_>, Vec<_>) = parts.into_iter().unzip();
    let total = add_parts(parts).unwrap_or_else(|| vec![0.0; partial_len]);
    match wino {
        Some((c, _)) => winograd::kernel_from_grad(&total, dk, &c),
        None => dk.copy_from_slice(&total),
    }
    if let Some(db) = db {
        let bias = add_parts(bias_parts).unwrap_or_else(|| vec![0.0; g.c_out]);
        db.iter_mut().zip(&bias).for_each(|(d, &b)| *d = b as f32);
    }
}

/// `dk += patches(x)ᵀ · dz` over output rows `[r0, r1)` (batch-flattened; `dz` holds those
/// rows) for a small patch, and the column sums of `dz` added to `sums` unless it is empty:
/// image by image, from a zero-padded copy of the input rows they read
/// ([`small_k_kernel_grad`], the sums in registers). `pad` holds at least `(min(r1 - r0, oh)
/// + kh - 1) * (ow + kw - 1) * c_in` floats.
fn small_k_rows(
    x: &[f32],
    dz: &[f32],
    g: &Geometry,
    (r0, r1): (usize, usize),
    offs: &[usize],
    (dk, sums): (&mut [f32], &mut [f64]),
    pad: &mut [f32],
) {
    let (wp, out_row) = (g.ow + g.kw - 1, g.ow * g.c_out);
    let mut r = r0;
    while r < r1 {
        let end = ((r / g.oh + 1) * g.oh).min(r1);
        let padded = &mut pad[..(end - r + g.kh - 1) * wp * g.c_in];
        g.pad_rows(x, r, padded);
        let p = SmallKGrad {
            lhs: padded,
            rs: wp * g.c_in,
            ps: g.c_in,
            w: g.ow,
            offs,
            dz: &dz[(r - r0) * out_row..(end - r0) * out_row],
            n: g.c_out,
        };
        small_k_kernel_grad(&p, dk, sums);
        r = end;
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::ops::cpu::batchnorm::{batch_norm_backward, batch_norm_train, Normalized};
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
