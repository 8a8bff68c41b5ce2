//! Products with a 2×2 max-pool's routed gradient.
//!
//! Below a max-pool, a layer's output gradient `dz` is zero except at each window's first
//! maximum: one pixel in four per channel. The pooled separable layer's backward pass multiplies
//! it twice, `dᵀ · dz` for the pointwise kernel's gradient and `dz · pkᵀ` for the gradient of
//! the depthwise output, and as dense products three quarters of their multiply-adds meet
//! zeros. Read from the pool's compact form ([`pool::Compact`](super::pool::Compact): each
//! window's gradient and where its maximum is), both need a quarter of the multiply-adds,
//! though not a quarter of the time: the gemm crate runs at its peak, these pay for picking
//! rows. On one Zen 4 core at batch 128 the tutorial's pooled separable layers' backward pass
//! went from 7.4, 5.4 and 4.5 ms to 7.0, 3.5-4.1 and 2.1-2.3 ms (28×28×32, 14×14×64,
//! 7×7×128); at 32 input channels the input side's loop exits, which mispredict, leave it
//! about as fast as the dense product (a loop of its own for that case took it from ~300 to
//! ~245 cycles a window, where the dense product needs ~256 multiply-adds). Both work on channel
//! vectors, so the layer uses them when its input channels are a multiple of 8
//! ([`supports`]).

use super::{Vector, V16, V8};

/// Whether the routed products handle a layer with `c` input channels.
pub(super) fn supports(c: usize) -> bool {
    c > 0 && c.is_multiple_of(8)
}

/// A block's routed gradient: [`pool::Compact`](super::pool::Compact)'s `g`, `q` and `at`
/// (one entry per window and output channel), read back.
#[derive(Clone, Copy)]
pub(super) struct Routed<'a> {
    pub g: &'a [f32],
    pub q: &'a [u8],
    pub at: &'a [u32],
    /// Output channels.
    pub f: usize,
}

impl Routed<'_> {
    /// Windows in the block; panics unless the three slices hold whole windows alike.
    fn windows(&self, what: &str) -> usize {
        assert!(
            self.f > 0
                && self.g.len().is_multiple_of(self.f)
                && self.q.len() == self.g.len()
                && self.at.len() == self.g.len(),
            "{what}: the routed gradient's slices do not hold whole windows of {} channels",
            self.f
        );
        self.g.len() / self.f
    }
}

multiversion! {
    /// `dpk_t[j, :] += Σ_w g[w, j] · d[at[w, j]..][..c]`: the pointwise kernel's gradient
    /// `dᵀ · dz`, transposed (`[f, c]`), from `d` `[pixels, c]` and the routed `dz`.
    ///
    /// Panics unless [`supports`]`(c)`, `dpk_t` is `[f, c]` and every `at + c` lies in `d`.
    pub(super) fn weight_grad<const FMA: bool>(d: &[f32], c: usize, r: &Routed<'_>, dpk_t: &mut [f32]) {
        let what = "separable_backward (routed kernel gradient)";
        let windows = r.windows(what);
        assert!(supports(c) && dpk_t.len() == r.f * c, "{what}: dpk_t must be [{}, {c}]", r.f);
        // One pass over the offsets keeps the unchecked loads below in bounds.
        let last = r.at.iter().copied().max().map_or(0, |a| a as usize);
        assert!(windows == 0 || last + c <= d.len(), "{what}: an offset past d");
        let wide = super::wide_registers();
        if wide && c.is_multiple_of(64) {
            weight_grad_in::<V16, 4, FMA>(d, c, r, windows, dpk_t);
        } else if wide && c.is_multiple_of(32) {
            weight_grad_in::<V16, 2, FMA>(d, c, r, windows, dpk_t);
        } else if wide && c.is_multiple_of(16) {
            weight_grad_in::<V16, 1, FMA>(d, c, r, windows, dpk_t);
        } else if c.is_multiple_of(16) {
            weight_grad_in::<V8, 2, FMA>(d, c, r, windows, dpk_t);
        } else {
            weight_grad_in::<V8, 1, FMA>(d, c, r, windows, dpk_t);
        }
    }
}

/// Output channels whose sums one pass keeps in registers, `NV` vectors each.
const FB: usize = 4;

/// [`weight_grad`] on `NV` vectors of `V` per channel group. Windows go in tiles whose rows of
/// `d` stay in L1 while every output channel's sums meet them (a pass per group of [`FB`]
/// channels over all windows re-read `d` from L2 each time and ran 1.4× as long).
#[inline(always)]
fn weight_grad_in<V: Vector, const NV: usize, const FMA: bool>(
    d: &[f32],
    c: usize,
    r: &Routed<'_>,
    windows: usize,
    dpk_t: &mut [f32],
) {
    let f = r.f;
    let lanes = V::LANES * NV;
    // A tile's four rows per window: 16 KiB of d.
    let tile = (1024 / c).max(1);
    let full = f - f % FB;
    for w0 in (0..windows).step_by(tile) {
        let tile = w0..(w0 + tile).min(windows);
        for j0 in (0..full).step_by(FB) {
            weight_grad_tile::<V, NV, FB, FMA>(d, c, r, tile.clone(), j0, dpk_t);
        }
        for j0 in full..f {
            weight_grad_tile::<V, NV, 1, FMA>(d, c, r, tile.clone(), j0, dpk_t);
        }
    }
    debug_assert!(c.is_multiple_of(lanes));
}

/// [`weight_grad_in`] for output channels `j0..j0 + B` over a tile of windows.
#[inline(always)]
fn weight_grad_tile<V: Vector, const NV: usize, const B: usize, const FMA: bool>(
    d: &[f32],
    c: usize,
    r: &Routed<'_>,
    tile: std::ops::Range<usize>,
    j0: usize,
    dpk_t: &mut [f32],
) {
    let (f, lanes) = (r.f, V::LANES * NV);
    for c0 in (0..c).step_by(lanes) {
        let mut acc = [[V::splat(0.0); NV]; B];
        for (b, acc) in acc.iter_mut().enumerate() {
            *acc = V::load_n::<NV>(dpk_t, (j0 + b) * c + c0);
        }
        for w in tile.clone() {
            let at = &r.at[w * f + j0..][..B];
            let g = &r.g[w * f + j0..][..B];
            for b in 0..B {
                let a = at[b] as usize + c0;
                // SAFETY: `weight_grad` checked `at + c <= d.len()` for every offset, and
                // c0 + lanes <= c (c a multiple of lanes).
                let row = unsafe { d.get_unchecked(a..a + lanes) };
                for (v, acc) in acc[b].iter_mut().enumerate() {
                    *acc = acc.madd::<FMA>(g[b], V::load(row, v * V::LANES));
                }
            }
        }
        for (b, acc) in acc.iter().enumerate() {
            for (v, acc) in acc.iter().enumerate() {
                acc.store(dpk_t, (j0 + b) * c + c0 + v * V::LANES);
            }
        }
    }
}

/// The block's images and their size: `n` images of `h × w` pixels, pooled 2×2.
#[derive(Clone, Copy)]
pub(super) struct Images {
    pub n: usize,
    pub h: usize,
    pub w: usize,
}

/// `dd = dz · pkᵀ` (`[pixels, c]`) from the routed `dz` and `pk_t` (`[f, c]`, the pointwise
/// kernel transposed): each window's four pixel rows are the sums of `g · pk_t[j]` over the
/// channels `j` routed to them, kept in registers; the rows of pixels no window covers (an odd
/// height's last row, an odd width's last column) are zeros.
///
/// Panics unless [`supports`]`(c)` and the slices match the shapes.
pub(super) fn input_grad(r: &Routed<'_>, pk_t: &[f32], c: usize, im: Images, dd: &mut [f32]) {
    let what = "separable_backward (routed input gradient)";
    let windows = r.windows(what);
    let Images { n, h, w } = im;
    assert!(
        supports(c)
            && pk_t.len() == r.f * c
            && dd.len() == n * h * w * c
            && windows == n * (h / 2) * (w / 2),
        "{what}: slices do not match {n} images of [{h}, {w}] with {c} -> {} channels",
        r.f
    );
    // The tutorial's first pooled layer has a loop of its own: the general one's mask words
    // and channel groups cost ~50 cycles a window there.
    if r.f <= 64 && c == 32 && super::wide_registers() {
        input_grad_narrow(r, pk_t, im, dd);
    } else {
        input_grad_any(r, pk_t, c, im, dd);
    }
}

multiversion! {
    /// [`input_grad`] for any output channel count (a mask word per 64).
    fn input_grad_any<const FMA: bool>(r: &Routed<'_>, pk_t: &[f32], c: usize, im: Images, dd: &mut [f32]) {
        let wide = super::wide_registers();
        // At most four vectors of sums: with eight, the compiler kept them in memory (10×
        // slower at 128 channels).
        if wide && c.is_multiple_of(64) {
            input_grad_in::<V16, 4, FMA>(r, pk_t, c, im, dd);
        } else if wide && c.is_multiple_of(32) {
            input_grad_in::<V16, 2, FMA>(r, pk_t, c, im, dd);
        } else if wide && c.is_multiple_of(16) {
            input_grad_in::<V16, 1, FMA>(r, pk_t, c, im, dd);
        } else if c.is_multiple_of(32) {
            input_grad_in::<V8, 4, FMA>(r, pk_t, c, im, dd);
        } else {
            input_grad_in::<V8, 1, FMA>(r, pk_t, c, im, dd);
        }
    }
}

/// [`input_grad`] on `NV` vectors of `V`.
#[inline(always)]
fn input_grad_in<V: Vector, const NV: usize, const FMA: bool>(
    r: &Routed<'_>,
    pk_t: &[f32],
    c: usize,
    im: Images,
    dd: &mut [f32],
) {
    let Images { h, w, .. } = im;
    let (f, lanes) = (r.f, V::LANES * NV);
    let (oh, ow) = (h / 2, w / 2);
    let words = f.div_ceil(64);
    // Per window, one bit per channel for each of its four pixels.
    let mut masks = vec![[0u64; 4]; words];
    let image = h * w * c;
    if image == 0 {
        return;
    }
    for (k, dd) in dd.chunks_exact_mut(image).enumerate() {
        clear_uncovered(dd, im, c);
        for i in 0..oh {
            for j in 0..ow {
                let at = ((k * oh + i) * ow + j) * f;
                let (q, g) = (&r.q[at..at + f], &r.g[at..at + f]);
                for (word, masks) in masks.iter_mut().enumerate() {
                    *masks = window_masks(&q[word * 64..(word * 64 + 64).min(f)]);
                }
                let p00 = 2 * i * w + 2 * j;
                for (s, pixel) in [p00, p00 + 1, p00 + w, p00 + w + 1].into_iter().enumerate() {
                    for c0 in (0..c).step_by(lanes) {
                        let mut acc = [V::splat(0.0); NV];
                        for (word, masks) in masks.iter().enumerate() {
                            let mut m = masks[s];
                            while m != 0 {
                                let jj = word * 64 + m.trailing_zeros() as usize;
                                m &= m - 1;
                                let a = jj * c + c0;
                                // SAFETY: a mask has bits only for the channels of its word
                                // (`window_masks`), so jj < f = g.len(); `input_grad` checked
                                // pk_t.len() == f * c, and c0 + lanes <= c.
                                let (g, row) = unsafe {
                                    (*g.get_unchecked(jj), pk_t.get_unchecked(a..a + lanes))
                                };
                                for (v, acc) in acc.iter_mut().enumerate() {
                                    *acc = acc.madd::<FMA>(g, V::load(row, v * V::LANES));
                                }
                            }
                        }
                        for (v, acc) in acc.iter().enumerate() {
                            acc.store(dd, pixel * c + c0 + v * V::LANES);
                        }
                    }
                }
            }
        }
    }
}

multiversion! {
    /// [`input_grad`] for 32 input channels (a pixel row in two `V16`s) and at most 64 output
    /// channels (one mask word a position): 244 cycles a window where [`input_grad_in`]'s
    /// general loops take 303, at the tutorial's first pooled layer (28×28, 32 → 32) on a
    /// Zen 4 core.
    fn input_grad_narrow<const FMA: bool>(r: &Routed<'_>, pk_t: &[f32], im: Images, dd: &mut [f32]) {
        const C: usize = 32;
        let f = r.f;
        let Images { h, w, .. } = im;
        let (oh, ow) = (h / 2, w / 2);
        let image = h * w * C;
        assert!(f <= 64 && pk_t.len() == f * C, "input_grad_narrow: at most 64 x 32 channels");
        if image == 0 {
            return;
        }
        for (k, dd) in dd.chunks_exact_mut(image).enumerate() {
            clear_uncovered(dd, im, C);
            for i in 0..oh {
                for j in 0..ow {
                    let at = ((k * oh + i) * ow + j) * f;
                    let (q, g) = (&r.q[at..at + f], &r.g[at..at + f]);
                    let masks = window_masks(q);
                    let p00 = 2 * i * w + 2 * j;
                    for (s, pixel) in [p00, p00 + 1, p00 + w, p00 + w + 1].into_iter().enumerate() {
                        let mut acc = [V16::splat(0.0); 2];
                        let mut m = masks[s];
                        while m != 0 {
                            let jj = m.trailing_zeros() as usize;
                            m &= m - 1;
                            // SAFETY: the mask has bits only for the f channels of `q`
                            // (`window_masks`), so jj < f = g.len(), and the assert keeps
                            // pk_t.len() == f * 32.
                            let (g, row) = unsafe {
                                (*g.get_unchecked(jj), pk_t.get_unchecked(jj * C..jj * C + C))
                            };
                            for (v, acc) in acc.iter_mut().enumerate() {
                                *acc = acc.madd::<FMA>(g, V16::load(row, v * 16));
                            }
                        }
                        for (v, acc) in acc.iter().enumerate() {
                            acc.store(dd, pixel * C + v * 16);
                        }
                    }
                }
            }
        }
    }
}

/// Zeros the rows of one image's `dd` (`[h, w, c]`) that no window covers: an odd height's last
/// row, an odd width's last column.
#[inline(always)]
fn clear_uncovered(dd: &mut [f32], Images { h, w, .. }: Images, c: usize) {
    let oh = h / 2;
    dd[2 * oh * w * c..].fill(0.0);
    if w % 2 == 1 {
        for row in dd[..2 * oh * w * c].chunks_exact_mut(w * c) {
            row[(w - 1) * c..].fill(0.0);
        }
    }
}

/// One bit per channel of `q` (at most 64) for each of the window's four positions.
#[inline(always)]
fn window_masks(q: &[u8]) -> [u64; 4] {
    let mut m = [0u64; 4];
    // A whole word as an array: the compiler turns the loop into vector compares.
    if let Ok(q) = <&[u8; 64]>::try_from(q) {
        for (b, &v) in q.iter().enumerate() {
            for (s, m) in m.iter_mut().enumerate() {
                *m |= u64::from(v == s as u8) << b;
            }
        }
    } else {
        for (b, &v) in q.iter().enumerate() {
            for (s, m) in m.iter_mut().enumerate() {
                *m |= u64::from(v == s as u8) << b;
            }
        }
    }
    m
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::ops::reference::{self as r, assert_close, random_vec, to_f64};

    /// Both products against the dense f64 ones of the same `dz`: channel counts for every
    /// vector width (and a rest of channel groups), more than 64 output channels (two mask
    /// words), 32 input channels with at most 64 output ones (`input_grad_narrow`), odd sizes
    /// (uncovered pixels), images too small for a window or with no pixels at all.
    #[test]
    pub(in crate::ops::cpu) fn products_match_the_dense_ones() {
        for (t, (n, h, w, c, f)) in [
            (2, 4, 4, 8, 5),
            (1, 7, 5, 16, 9),
            (3, 6, 6, 32, 70),
            (2, 5, 7, 32, 33),
            (1, 0, 3, 32, 8),
            (2, 2, 3, 64, 4),
            (1, 3, 3, 128, 3),
            (1, 5, 4, 24, 1),
            (2, 1, 4, 8, 3),
        ]
        .into_iter()
        .enumerate()
        {
            let what = format!("routed {n}x[{h}, {w}] {c} -> {f}");
            let seed = 700 + 10 * t as u64;
            let (oh, ow) = (h / 2, w / 2);
            let entries = n * oh * ow * f;
            let g = random_vec(entries, seed);
            let q: Vec<u8> = random_vec(entries, seed + 1)
                .iter()
                .map(|v| ((v + 1.0) * 2.0).clamp(0.0, 3.0) as u8)
                .collect();
            // The dense `dz` the compact form stands for, and each entry's pixel offset.
            let pixels = h * w;
            let mut dz = vec![0.0f64; n * pixels * f];
            let mut at = vec![0u32; entries];
            for (e, (&g, &q)) in g.iter().zip(&q).enumerate() {
                let (window, j) = (e / f, e % f);
                let (k, i, jj) = (window / (oh * ow), window % (oh * ow) / ow, window % ow);
                let pixel = k * pixels
                    + (2 * i + usize::from(q >= 2)) * w
                    + 2 * jj
                    + usize::from(q % 2 == 1);
                dz[pixel * f + j] = f64::from(g);
                at[e] = (pixel * c) as u32;
            }
            let routed = Routed {
                g: &g,
                q: &q,
                at: &at,
                f,
            };
            let d = random_vec(n * pixels * c, seed + 2);
            let pk = random_vec(c * f, seed + 3);
            let rows = n * pixels;

            let start = random_vec(f * c, seed + 4);
            let mut dpk_t = start.clone();
            weight_grad(&d, c, &routed, &mut dpk_t);
            let dpk = r::matmul(&dz, &to_f64(&d), f, rows, c, true, false);
            let expected: Vec<f64> = dpk
                .iter()
                .zip(&start)
                .map(|(p, &s)| p + f64::from(s))
                .collect();
            assert_close(&dpk_t, &expected, 1e-5, &format!("{what}: kernel gradient"));

            let pk_t: Vec<f32> = (0..f * c).map(|e| pk[(e % c) * f + e / c]).collect();
            let mut dd = vec![f32::NAN; rows * c];
            input_grad(&routed, &pk_t, c, Images { n, h, w }, &mut dd);
            let expected = r::matmul(&dz, &to_f64(&pk), rows, f, c, false, true);
            assert_close(&dd, &expected, 1e-5, &format!("{what}: input gradient"));
        }
    }
}
