//! Depthwise 2-D convolution (depth multiplier 1, stride 1, 'same' padding, no bias): the first
//! half of Keras' `SeparableConv2D`. Direct loops with the channel dimension innermost.
//!
//! The backward-input pass is the same correlation run on `dy` with the kernel flipped
//! spatially and the complementary padding (`kh - 1 - pad_top`, `kw - 1 - pad_left`).

use rayon::prelude::*;

use crate::ops::spec::{Activation, ConvGeometry, DepthwiseShape};
use crate::shape::product;

use super::{conv_general, madd, ordered_sums, with_scratch, Vector, V16, V8};

mod window;

use window::{correlate_row_3x3, correlate_row_pair_3x3, kernel_grad_row_3x3};

/// Geometry of one depthwise correlation: input and output are both `[h, w, c]` per image,
/// `out[i, j] = Σ_{a,b} in[i + a - pt, j + b - pl] * k[a, b]` (out-of-range inputs are zero).
#[derive(Clone, Copy)]
pub(super) struct Geometry {
    /// Height.
    h: usize,
    /// Width.
    w: usize,
    /// Channels.
    c: usize,
    /// Kernel height.
    kh: usize,
    /// Kernel width.
    kw: usize,
    /// Zero rows above.
    pt: usize,
    /// Zero columns on the left.
    pl: usize,
}

impl Geometry {
    /// Whether `len` covers one image (`h * w * c`, computed without wrapping).
    #[inline(always)]
    fn holds_image(&self, len: usize) -> bool {
        product(&[self.h, self.w, self.c]).is_some_and(|n| len >= n)
    }

    /// Whether `len` covers one image row (`w * c`, computed without wrapping).
    #[inline(always)]
    fn holds_row(&self, len: usize) -> bool {
        product(&[self.w, self.c]).is_some_and(|n| len >= n)
    }

    /// Whether `len` covers the kernel (`kh * kw * c`, computed without wrapping).
    #[inline(always)]
    fn holds_kernel(&self, len: usize) -> bool {
        product(&[self.kh, self.kw, self.c]).is_some_and(|n| len >= n)
    }

    /// Output columns `[j0, j1)` whose input column `j + b - pl` is inside the image.
    #[inline(always)]
    fn cols(&self, b: usize) -> (usize, usize) {
        let j0 = self.pl.saturating_sub(b).min(self.w);
        let j1 = (self.w + self.pl).saturating_sub(b).min(self.w).max(j0);
        (j0, j1)
    }

    /// Kernel rows `[a0, a1)` whose input row `i + a - pt` is inside the image.
    #[inline(always)]
    fn rows(&self, i: usize) -> (usize, usize) {
        let a0 = self.pt.saturating_sub(i).min(self.kh);
        let a1 = (self.h + self.pt).saturating_sub(i).min(self.kh).max(a0);
        (a0, a1)
    }

    /// Kernel columns `[b0, b1)` whose input column `j + b - pl` is inside the image.
    #[inline(always)]
    fn taps(&self, j: usize) -> (usize, usize) {
        let b0 = self.pl.saturating_sub(j).min(self.kw);
        let b1 = (self.w + self.pl).saturating_sub(j).min(self.kw).max(b0);
        (b0, b1)
    }

    /// Whether this is a 3×3 correlation with one row and column of zeros on each side.
    #[inline(always)]
    fn is_3x3_same(&self) -> bool {
        self.kh == 3 && self.kw == 3 && self.pt == 1 && self.pl == 1
    }

    /// Output columns `[j0, j1)` for which every kernel column reads inside the image.
    #[inline(always)]
    fn interior(&self) -> (usize, usize) {
        let j0 = self.pl.min(self.w);
        let j1 = (self.w + self.pl + 1)
            .saturating_sub(self.kw)
            .min(self.w)
            .max(j0);
        (j0, j1)
    }
}

/// Output pixels `(i, j..j + NP)` for channels in groups of `8 * NV`: every output vector is
/// accumulated in registers over the taps inside the image and stored once, the `NP * NV`
/// independent chains hiding the multiply-add latency.
///
/// Panics unless `c` is a multiple of `8 * NV`, the slices hold a whole image / kernel / output
/// row, and all `NP` pixels read the same kernel columns (true in the interior, or `NP = 1`).
#[inline(always)]
fn correlate_pixels<const NV: usize, const NP: usize, const FMA: bool>(
    x: &[f32],
    k: &[f32],
    out: &mut [f32],
    (i, j): (usize, usize),
    g: Geometry,
) {
    let (w, c, kw) = (g.w, g.c, g.kw);
    let (a0, a1) = g.rows(i);
    let (b0, b1) = g.taps(j);
    assert!(
        c % (8 * NV) == 0
            && g.holds_image(x.len())
            && g.holds_kernel(k.len())
            && g.holds_row(out.len())
            && j + NP <= w
            && (b0 == b1 || g.taps(j + NP - 1).1 >= b1),
        "depthwise: pixel group out of range"
    );
    for c0 in (0..c).step_by(8 * NV) {
        let mut acc = [[V8::splat(0.0); NV]; NP];
        for a in a0..a1 {
            let ii = i + a - g.pt;
            for b in b0..b1 {
                let tap = (a * kw + b) * c + c0;
                let src = (ii * w + j + b - g.pl) * c + c0;
                for v in 0..NV {
                    // SAFETY (both reads): a < a1 <= kh and b < b1 <= kw, so `tap + 8 * v + 8 <=
                    // (kh * kw - 1) * c + c <= k.len()` (c0 + 8 * NV <= c as c is a multiple of
                    // 8 * NV). `rows`/`taps` keep ii < h and j + b - pl < w, and the assert above
                    // keeps j + p + b - pl < w for every p < NP, so `src + p * c + 8 * v + 8 <=
                    // h * w * c <= x.len()`.
                    let kv = V8::load(unsafe { k.get_unchecked(tap + 8 * v..tap + 8 * v + 8) }, 0);
                    for (p, acc) in acc.iter_mut().enumerate() {
                        let at = src + p * c + 8 * v;
                        let xv = V8::load(unsafe { x.get_unchecked(at..at + 8) }, 0);
                        acc[v] = acc[v].madd_v::<FMA>(xv, kv);
                    }
                }
            }
        }
        for (p, acc) in acc.iter().enumerate() {
            for (v, acc) in acc.iter().enumerate() {
                acc.store(out, (j + p) * c + c0 + 8 * v);
            }
        }
    }
}

/// Output row `i` for `c` a multiple of 8: interior pixels in groups of `NP`, the rest one by
/// one.
#[inline(always)]
fn correlate_row_v8<const NV: usize, const NP: usize, const FMA: bool>(
    x: &[f32],
    k: &[f32],
    out: &mut [f32],
    i: usize,
    g: Geometry,
) {
    let (j0, j1) = g.interior();
    for j in 0..j0 {
        correlate_pixels::<NV, 1, FMA>(x, k, out, (i, j), g);
    }
    let mut j = j0;
    while j + NP <= j1 {
        correlate_pixels::<NV, NP, FMA>(x, k, out, (i, j), g);
        j += NP;
    }
    for j in j..g.w {
        correlate_pixels::<NV, 1, FMA>(x, k, out, (i, j), g);
    }
}

/// Output row `i` for any channel count: tap by tap over the row, channels innermost.
#[inline(always)]
fn correlate_row_any<const FMA: bool>(
    x: &[f32],
    k: &[f32],
    out: &mut [f32],
    i: usize,
    g: Geometry,
) {
    let (w, c) = (g.w, g.c);
    out.fill(0.0);
    let (a0, a1) = g.rows(i);
    for a in a0..a1 {
        let ii = i + a - g.pt;
        let row = &x[ii * w * c..(ii + 1) * w * c];
        for b in 0..g.kw {
            let (j0, j1) = g.cols(b);
            if j0 == j1 {
                continue;
            }
            let kk = &k[(a * g.kw + b) * c..(a * g.kw + b + 1) * c];
            let src0 = (j0 + b - g.pl) * c;
            let src = &row[src0..src0 + (j1 - j0) * c];
            let dst = &mut out[j0 * c..j1 * c];
            for (d, s) in dst.chunks_exact_mut(c).zip(src.chunks_exact(c)) {
                for ((d, &s), &kv) in d.iter_mut().zip(s).zip(kk) {
                    *d = madd::<FMA>(s, kv, *d);
                }
            }
        }
    }
}

multiversion! {
    /// Output rows `i` and `i + 1` of one image into `out` (two rows; `i + 1 < h`).
    fn correlate_row_pair<const FMA: bool>(x: &[f32], k: &[f32], out: &mut [f32], i: usize, g: Geometry) {
        if g.is_3x3_same() && g.c.is_multiple_of(32) && super::wide_registers() {
            correlate_row_pair_3x3::<V16, 2, FMA>(x, k, out, i, g);
        } else {
            let (first, second) = out.split_at_mut(g.w * g.c);
            correlate_row(x, k, first, i, g);
            correlate_row(x, k, second, i + 1, g);
        }
    }
}

multiversion! {
    /// Output row `i` of one image (`x` is the whole image, `k` is `[kh, kw, c]`).
    fn correlate_row<const FMA: bool>(x: &[f32], k: &[f32], out: &mut [f32], i: usize, g: Geometry) {
        if g.is_3x3_same() && g.c.is_multiple_of(32) && super::wide_registers() {
            correlate_row_3x3::<V16, 2, FMA>(x, k, out, i, g);
        } else if g.is_3x3_same() && g.c.is_multiple_of(16) && super::wide_registers() {
            correlate_row_3x3::<V16, 1, FMA>(x, k, out, i, g);
        } else if g.c.is_multiple_of(32) {
            correlate_row_v8::<4, 2, FMA>(x, k, out, i, g);
        } else if g.c.is_multiple_of(8) {
            correlate_row_v8::<1, 4, FMA>(x, k, out, i, g);
        } else {
            correlate_row_any::<FMA>(x, k, out, i, g);
        }
    }
}

/// `acc[a, b, :] += Σ_j x[i + a - pt, j + b - pl, :] * dy[i, j, :]` for output row `i`,
/// channels in groups of `8 * NV`, two pixels per step in separate accumulators.
///
/// Panics unless `c` is a multiple of `8 * NV` and the slices hold a whole image, an output
/// row and a kernel.
#[inline(always)]
fn kernel_grad_row_v8<const NV: usize, const FMA: bool>(
    x: &[f32],
    dy_row: &[f32],
    acc: &mut [f32],
    i: usize,
    g: Geometry,
) {
    let (w, c) = (g.w, g.c);
    assert!(
        c % (8 * NV) == 0
            && g.holds_image(x.len())
            && g.holds_row(dy_row.len())
            && g.holds_kernel(acc.len()),
        "depthwise: kernel-gradient row out of range"
    );
    let (a0, a1) = g.rows(i);
    for a in a0..a1 {
        let row0 = (i + a - g.pt) * w * c;
        for b in 0..g.kw {
            let (j0, j1) = g.cols(b);
            let tap = (a * g.kw + b) * c;
            for c0 in (0..c).step_by(8 * NV) {
                let (mut s0, mut s1) = ([V8::splat(0.0); NV], [V8::splat(0.0); NV]);
                let mut j = j0;
                while j < j1 {
                    let pair = j + 1 < j1;
                    let (src, d) = (row0 + (j + b - g.pl) * c + c0, j * c + c0);
                    for v in 0..NV {
                        let o = 8 * v;
                        // SAFETY (all four reads): `cols` keeps j < j1 <= w and j + b - pl < w
                        // for j in [j0, j1), so with c0 + 8 * NV <= c (c a multiple of 8 * NV)
                        // `src + c + o + 8 <= (i + a - pt + 1) * w * c <= h * w * c <= x.len()`
                        // when `pair` (j + 1 < j1), `src + o + 8` likewise otherwise, and
                        // `d (+ c) + o + 8 <= w * c <= dy_row.len()` in the same cases.
                        let xv = V8::load(unsafe { x.get_unchecked(src + o..src + o + 8) }, 0);
                        let dv = V8::load(unsafe { dy_row.get_unchecked(d + o..d + o + 8) }, 0);
                        s0[v] = s0[v].madd_v::<FMA>(xv, dv);
                        if pair {
                            let xv = V8::load(
                                unsafe { x.get_unchecked(src + c + o..src + c + o + 8) },
                                0,
                            );
                            let dv = V8::load(
                                unsafe { dy_row.get_unchecked(d + c + o..d + c + o + 8) },
                                0,
                            );
                            s1[v] = s1[v].madd_v::<FMA>(xv, dv);
                        }
                    }
                    j += 2;
                }
                for v in 0..NV {
                    let at = tap + c0 + 8 * v;
                    V8::load(acc, at).add(s0[v].add(s1[v])).store(acc, at);
                }
            }
        }
    }
}

/// [`kernel_grad_row_v8`] for any channel count, channels innermost.
#[inline(always)]
fn kernel_grad_row_any<const FMA: bool>(
    x: &[f32],
    dy_row: &[f32],
    acc: &mut [f32],
    i: usize,
    g: Geometry,
) {
    let (w, c) = (g.w, g.c);
    let (a0, a1) = g.rows(i);
    for a in a0..a1 {
        let row = &x[(i + a - g.pt) * w * c..(i + a - g.pt + 1) * w * c];
        for b in 0..g.kw {
            let (j0, j1) = g.cols(b);
            if j0 == j1 {
                continue;
            }
            let kk = &mut acc[(a * g.kw + b) * c..(a * g.kw + b + 1) * c];
            let src0 = (j0 + b - g.pl) * c;
            let src = &row[src0..src0 + (j1 - j0) * c];
            let dys = &dy_row[j0 * c..j1 * c];
            for (s, d) in src.chunks_exact(c).zip(dys.chunks_exact(c)) {
                for ((kv, &s), &d) in kk.iter_mut().zip(s).zip(d) {
                    *kv = madd::<FMA>(s, d, *kv);
                }
            }
        }
    }
}

multiversion! {
    /// `acc[a, b, :] += Σ_j x[i + a - pt, j + b - pl, :] * dy[i, j, :]` for output row `i`.
    fn kernel_grad_row<const FMA: bool>(x: &[f32], dy_row: &[f32], acc: &mut [f32], i: usize, g: Geometry) {
        if g.is_3x3_same() && g.c.is_multiple_of(32) && super::wide_registers() {
            kernel_grad_row_3x3::<V16, 2, FMA>(x, dy_row, acc, i, g);
        } else if g.is_3x3_same() && g.c.is_multiple_of(16) && super::wide_registers() {
            kernel_grad_row_3x3::<V16, 1, FMA>(x, dy_row, acc, i, g);
        } else if g.c.is_multiple_of(32) {
            kernel_grad_row_v8::<4, FMA>(x, dy_row, acc, i, g);
        } else if g.c.is_multiple_of(8) {
            kernel_grad_row_v8::<1, FMA>(x, dy_row, acc, i, g);
        } else {
            kernel_grad_row_any::<FMA>(x, dy_row, acc, i, g);
        }
    }
}

/// Runs the correlation `g` over every output row, in parallel.
fn correlate(x: &[f32], k: &[f32], y: &mut [f32], g: Geometry) {
    let row = g.w * g.c;
    let image = g.h * row;
    if row == 0 || g.h == 0 {
        return;
    }
    // Pairs of rows of one image (a last odd row alone).
    y.par_chunks_mut(image)
        .enumerate()
        .flat_map(|(img, out)| {
            out.par_chunks_mut(2 * row)
                .with_min_len(2)
                .enumerate()
                .map(move |(p, out)| (img, p, out))
        })
        .for_each(|(img, p, out)| {
            let x = &x[img * image..(img + 1) * image];
            correlate_rows(x, k, out, 2 * p, g);
        });
}

/// Output rows from `i` to fill `out` (one or two rows) of one image `x`.
fn correlate_rows(x: &[f32], k: &[f32], out: &mut [f32], i: usize, g: Geometry) {
    if out.len() >= 2 * g.w * g.c {
        correlate_row_pair(x, k, out, i, g);
    } else {
        correlate_row(x, k, out, i, g);
    }
}

/// The correlation `g` of one image `x` into `out` (both `[h, w, c]`), on the calling thread.
pub(super) fn correlate_image(x: &[f32], k: &[f32], out: &mut [f32], g: Geometry) {
    if g.w * g.c == 0 {
        return;
    }
    for (p, out) in out.chunks_mut(2 * g.w * g.c).enumerate() {
        correlate_rows(x, k, out, 2 * p, g);
    }
}

/// `acc[a, b, :] += Σ_{i,j} x[i + a - pt, j + b - pl, :] * dy[i, j, :]` over one image, on the
/// calling thread.
pub(super) fn kernel_grad_image(x: &[f32], dy: &[f32], acc: &mut [f32], g: Geometry) {
    if g.w * g.c == 0 {
        return;
    }
    for (i, dy_row) in dy.chunks_exact(g.w * g.c).enumerate() {
        kernel_grad_row(x, dy_row, acc, i, g);
    }
}

/// The kernel and geometry of the input gradient: the forward correlation `g` with the kernel
/// flipped spatially and the complementary padding.
pub(super) fn flipped(kernel: &[f32], g: Geometry) -> (Vec<f32>, Geometry) {
    let (kh, kw, c) = (g.kh, g.kw, g.c);
    let mut flipped = vec![0.0f32; kernel.len()];
    // No channels, no taps: an empty kernel's `kh * kw` may be astronomically large.
    for a in 0..if c == 0 { 0 } else { kh } {
        for b in 0..kw {
            let src = ((kh - 1 - a) * kw + (kw - 1 - b)) * c;
            flipped[(a * kw + b) * c..(a * kw + b + 1) * c].copy_from_slice(&kernel[src..src + c]);
        }
    }
    let geometry = Geometry {
        pt: kh - 1 - g.pt,
        pl: kw - 1 - g.pl,
        ..g
    };
    (flipped, geometry)
}

/// Panics unless the slices match a general (strided, multiplier, 'valid') shape.
fn check_general(s: &DepthwiseShape, x: usize, k: usize, y: usize, what: &str) {
    assert!(s.kh > 0 && s.kw > 0, "{what}: kernel must be at least 1x1");
    let input = product(&[s.n, s.h, s.w, s.c]);
    assert_eq!(
        input,
        Some(x),
        "{what}: input length does not match the shape"
    );
    let kernel = product(&[s.kh, s.kw, s.c, s.multiplier]);
    assert_eq!(
        kernel,
        Some(k),
        "{what}: kernel length does not match the shape"
    );
    let (oh, ow) = s.out_hw();
    let output = product(&[s.n, oh, ow, s.c, s.multiplier]);
    assert_eq!(
        output,
        Some(y),
        "{what}: output length does not match the shape"
    );
}

/// Checks slice lengths against the shape and returns the forward geometry.
pub(super) fn geometry(s: &DepthwiseShape, x: usize, k: usize, y: usize, what: &str) -> Geometry {
    assert!(s.kh > 0 && s.kw > 0, "{what}: kernel must be at least 1x1");
    // Lengths computed without wrapping: a shape whose product wraps matches no slice, so the
    // per-image bounds the unchecked loads rely on (`h * w * c <= x.len()`) cannot wrap either.
    let input = product(&[s.n, s.h, s.w, s.c]);
    assert_eq!(
        input,
        Some(x),
        "{what}: input length does not match the shape"
    );
    assert_eq!(
        product(&[s.kh, s.kw, s.c]),
        Some(k),
        "{what}: kernel length does not match the shape"
    );
    assert_eq!(
        input,
        Some(y),
        "{what}: output length does not match the shape"
    );
    let (pt, pl) = s.pad_top_left();
    Geometry {
        h: s.h,
        w: s.w,
        c: s.c,
        kh: s.kh,
        kw: s.kw,
        pt,
        pl,
    }
}

/// `y[n, i, j, c] = Σ_{a,b} x[n, i + a - pt, j + b - pl, c] * kernel[a, b, c, 0]` ('same').
pub(crate) fn depthwise_forward(x: &[f32], kernel: &[f32], y: &mut [f32], s: &DepthwiseShape) {
    if !s.is_same_unit() {
        check_general(s, x.len(), kernel.len(), y.len(), "depthwise_forward");
        let g = ConvGeometry::depthwise(s);
        return conv_general::forward((x, None), kernel, None, y, &g, Activation::Linear);
    }
    let g = geometry(s, x.len(), kernel.len(), y.len(), "depthwise_forward");
    correlate(x, kernel, y, g);
}

/// Gradient w.r.t. the input: the correlation of `dy` with the spatially flipped kernel.
pub(crate) fn depthwise_backward_input(
    dy: &[f32],
    kernel: &[f32],
    dx: &mut [f32],
    s: &DepthwiseShape,
) {
    if !s.is_same_unit() {
        check_general(
            s,
            dx.len(),
            kernel.len(),
            dy.len(),
            "depthwise_backward_input",
        );
        return conv_general::backward_input(dy, kernel, dx, &ConvGeometry::depthwise(s));
    }
    let g = geometry(
        s,
        dy.len(),
        kernel.len(),
        dx.len(),
        "depthwise_backward_input",
    );
    let (flipped, flipped_geometry) = flipped(kernel, g);
    correlate(dy, &flipped, dx, flipped_geometry);
}

/// Gradient w.r.t. the kernel: `dk[a, b, c] = Σ_{n,i,j} x[n, i + a - pt, j + b - pl, c] *
/// dy[n, i, j, c]`, per image in f32 and across images in f64.
pub(crate) fn depthwise_backward_kernel(x: &[f32], dy: &[f32], dk: &mut [f32], s: &DepthwiseShape) {
    if !s.is_same_unit() {
        check_general(s, x.len(), dk.len(), dy.len(), "depthwise_backward_kernel");
        return conv_general::backward_kernel((x, None), dy, dk, &ConvGeometry::depthwise(s));
    }
    let g = geometry(s, x.len(), dk.len(), dy.len(), "depthwise_backward_kernel");
    let row = s.w * s.c;
    let image = s.h * row;
    if image == 0 || s.n == 0 {
        dk.fill(0.0);
        return;
    }
    let klen = dk.len();
    let total = ordered_sums(s.n, klen, |total: &mut [f64], n| {
        let (x, dy) = (&x[n * image..][..image], &dy[n * image..][..image]);
        with_scratch(klen, |acc| {
            acc.fill(0.0);
            kernel_grad_image(x, dy, acc, g);
            total
                .iter_mut()
                .zip(acc.iter())
                .for_each(|(t, &a)| *t += f64::from(a));
        });
    });
    dk.iter_mut().zip(&total).for_each(|(d, &t)| *d = t as f32);
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::ops::reference::{self as r, assert_close, random_vec, to_f64};

    #[test]
    pub(in crate::ops::cpu) fn matches_reference() {
        for (t, (n, h, w, c, kh, kw)) in [
            (1, 1, 1, 1, 1, 1),
            (3, 7, 7, 3, 3, 3),
            (1, 13, 7, 32, 5, 5),
            (3, 28, 28, 32, 3, 3),
            (1, 3, 13, 1, 5, 3),
            (1, 1, 7, 3, 3, 1),
            (3, 6, 5, 3, 2, 4),
            (1, 2, 2, 7, 5, 5),
            // Channel counts taking the 8-wide and 32-wide vector paths.
            (1, 7, 9, 8, 3, 3),
            (3, 5, 7, 40, 3, 3),
            (1, 6, 6, 64, 3, 3),
            (1, 9, 9, 16, 5, 5),
            (1, 4, 3, 32, 2, 4),
            // The 3×3 sliding window on images of one row or column.
            (2, 1, 1, 16, 3, 3),
            (1, 2, 1, 8, 3, 3),
            (1, 1, 5, 48, 3, 3),
            // Rows in pairs (AVX-512, channels a multiple of 32): odd heights, one row, one pair.
            (2, 7, 5, 32, 3, 3),
            (1, 1, 4, 32, 3, 3),
            (1, 2, 3, 64, 3, 3),
            (3, 3, 3, 96, 3, 3),
        ]
        .into_iter()
        .enumerate()
        {
            let s = DepthwiseShape::same(n, h, w, c, kh, kw);
            let x = random_vec(s.input_len(), 700 + t as u64);
            let k = random_vec(s.kernel_len(), 710 + t as u64);
            let dy = random_vec(s.input_len(), 720 + t as u64);
            let (x64, k64, dy64) = (to_f64(&x), to_f64(&k), to_f64(&dy));
            let mut y = vec![f32::NAN; s.input_len()];
            depthwise_forward(&x, &k, &mut y, &s);
            assert_close(
                &y,
                &r::depthwise_forward(&x64, &k64, &s),
                1e-4,
                &format!("depthwise forward {s:?}"),
            );
            let mut dx = vec![f32::NAN; s.input_len()];
            depthwise_backward_input(&dy, &k, &mut dx, &s);
            assert_close(
                &dx,
                &r::depthwise_backward_input(&dy64, &k64, &s),
                1e-4,
                &format!("depthwise dx {s:?}"),
            );
            let mut dk = vec![f32::NAN; s.kernel_len()];
            depthwise_backward_kernel(&x, &dy, &mut dk, &s);
            assert_close(
                &dk,
                &r::depthwise_backward_kernel(&x64, &dy64, &s),
                1e-4,
                &format!("depthwise dk {s:?}"),
            );
        }
    }
}
