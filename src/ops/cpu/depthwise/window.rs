//! The 3×3 'same' depthwise loops that hold the kernel (or the nine tap sums) in registers and
//! slide a window along each row: AVX-512 only, whose 32 vector registers hold them (with
//! AVX2's 16 they spill, and `depthwise.rs`'s pixel-blocked loops are faster).

use crate::ops::cpu::{prefetch, Vector};

use super::Geometry;

/// Output row `i` of a 3×3 correlation with one zero row and column of padding on each side
/// ('same', and its flipped input gradient), channels in groups of `V::LANES * NV`.
///
/// Input-stationary: each input column's (up to) three vectors are loaded once and feed the
/// three outputs that read them (`j - 1`, `j`, `j + 1`), with the nine kernel vectors held in
/// registers for the whole row. That is one load per three multiply-adds, where the
/// pixel-stationary [`correlate_pixels`](super::correlate_pixels) needs about one and a half. A row's three input rows
/// (10.5 KiB at every tutorial shape) stay in L1 across the channel groups.
///
/// Each output is one chain of nine dependent multiply-adds, so only `3 * NV` chains are in
/// flight: for AVX-512 registers only (`V16`, `NV = 2` needs 26 of the 32); with 16 registers
/// (AVX2) this measured slower than [`correlate_pixels`](super::correlate_pixels).
///
/// Panics unless `c` is a multiple of `V::LANES * NV`, `g` is such a 3×3 geometry, and the
/// slices hold a whole image, kernel and output row.
#[inline(always)]
pub(super) fn correlate_row_3x3<V: Vector, const NV: usize, const FMA: bool>(
    x: &[f32],
    k: &[f32],
    out: &mut [f32],
    i: usize,
    g: Geometry,
) {
    // Kernel rows whose input row `i + a - 1` is inside the image, as constants: with the
    // bounds known the loop over the rows unrolls and the kernel stays in registers (with
    // them in a variable, the edge rows read it from memory at every multiply-add).
    match g.rows(i) {
        (0, 3) => correlate_row_in::<V, NV, FMA, 0, 3>(x, k, out, i, g),
        (1, 3) => correlate_row_in::<V, NV, FMA, 1, 3>(x, k, out, i, g),
        (0, 2) => correlate_row_in::<V, NV, FMA, 0, 2>(x, k, out, i, g),
        _ => correlate_row_in::<V, NV, FMA, 1, 2>(x, k, out, i, g),
    }
}

/// [`correlate_row_3x3`] for a row whose kernel rows inside the image are `[A0, A1)`.
#[inline(always)]
fn correlate_row_in<
    V: Vector,
    const NV: usize,
    const FMA: bool,
    const A0: usize,
    const A1: usize,
>(
    x: &[f32],
    k: &[f32],
    out: &mut [f32],
    i: usize,
    g: Geometry,
) {
    let (w, c, lanes) = (g.w, g.c, V::LANES);
    assert!(
        g.is_3x3_same()
            && c % (lanes * NV) == 0
            && w > 0
            && g.rows(i) == (A0, A1)
            && g.holds_image(x.len())
            && g.holds_kernel(k.len())
            && g.holds_row(out.len()),
        "depthwise: 3x3 row out of range"
    );
    let (a0, a1) = (A0, A1);
    let zero = [V::splat(0.0); NV];
    for c0 in (0..c).step_by(lanes * NV) {
        let mut kv = [[zero; 3]; 3];
        for (a, row) in kv.iter_mut().enumerate() {
            for (b, tap) in row.iter_mut().enumerate() {
                *tap = V::load_n::<NV>(k, (a * 3 + b) * c + c0);
            }
        }
        // Outputs `jj - 1` and `jj` collect their taps while input column `jj` is read; `jj + 1`
        // starts there.
        let (mut left, mut mid) = (zero, zero);
        for jj in 0..w {
            let mut right = zero;
            // The input row that the next output row reads first, fetched while this one
            // computes: a layer's input comes from memory (12.8 MB for the tutorial's first
            // separable layer), and this took 4-9% off a training step.
            if i + 2 < g.h {
                for v in 0..NV {
                    prefetch(x, ((i + 2) * w + jj) * c + c0 + lanes * v);
                }
            }
            for (a, taps) in kv.iter().enumerate() {
                if a < a0 || a >= a1 {
                    continue;
                }
                let src = ((i + a - 1) * w + jj) * c + c0;
                for v in 0..NV {
                    let at = src + lanes * v;
                    // SAFETY: `rows` keeps i + a - 1 < h, and jj < w, so with c0 + lanes * NV <=
                    // c (c a multiple of lanes * NV) `at + lanes <= h * w * c <= x.len()`.
                    let xv = V::load(unsafe { x.get_unchecked(at..at + lanes) }, 0);
                    left[v] = left[v].madd_v::<FMA>(xv, taps[2][v]);
                    mid[v] = mid[v].madd_v::<FMA>(xv, taps[1][v]);
                    right[v] = right[v].madd_v::<FMA>(xv, taps[0][v]);
                }
            }
            if jj > 0 {
                for (v, acc) in left.iter().enumerate() {
                    acc.store(out, (jj - 1) * c + c0 + lanes * v);
                }
            }
            (left, mid) = (mid, right);
        }
        // Output `w - 1` is complete: its right-hand tap reads the zero padding.
        for (v, acc) in left.iter().enumerate() {
            acc.store(out, (w - 1) * c + c0 + lanes * v);
        }
    }
}

/// Output rows `i` and `i + 1` of a 3×3 'same' correlation at once (`out` holds both): the
/// four input rows they read are loaded once per column and each vector feeds up to six
/// multiply-adds, against three in [`correlate_row_3x3`], with `6 * NV` chains in flight
/// instead of `3 * NV`. Needs `9 * NV + 6 * NV + 1` vector registers: AVX-512's 32 for
/// `V16`, `NV = 2` (31). In cache on a Zen 4 core this ran 84 GFLOP/s against the single
/// row's 68 (32 channels, 28×28).
///
/// Whether the pair touches the image's top or bottom edge is a constant of each version:
/// with the input rows known the loop over them unrolls, so the kernel vectors stay in
/// registers (with the edges in the loop's bounds they were read from memory at every
/// multiply-add).
///
/// Panics unless `c` is a multiple of `V::LANES * NV`, `g` is such a 3×3 geometry, `i + 1 <
/// h`, and the slices hold a whole image, kernel and two output rows.
#[inline(always)]
pub(super) fn correlate_row_pair_3x3<V: Vector, const NV: usize, const FMA: bool>(
    x: &[f32],
    k: &[f32],
    out: &mut [f32],
    i: usize,
    g: Geometry,
) {
    match (i == 0, i + 2 == g.h) {
        (false, false) => correlate_pair_in::<V, NV, FMA, false, false>(x, k, out, i, g),
        (true, false) => correlate_pair_in::<V, NV, FMA, true, false>(x, k, out, i, g),
        (false, true) => correlate_pair_in::<V, NV, FMA, false, true>(x, k, out, i, g),
        (true, true) => correlate_pair_in::<V, NV, FMA, true, true>(x, k, out, i, g),
    }
}

/// [`correlate_row_pair_3x3`] for a pair at the top edge (`TOP`: `i == 0`, no input row above)
/// or the bottom one (`BOTTOM`: `i + 2 == h`, none below), or neither.
#[inline(always)]
fn correlate_pair_in<
    V: Vector,
    const NV: usize,
    const FMA: bool,
    const TOP: bool,
    const BOTTOM: bool,
>(
    x: &[f32],
    k: &[f32],
    out: &mut [f32],
    i: usize,
    g: Geometry,
) {
    let (w, c, lanes) = (g.w, g.c, V::LANES);
    let row = w * c;
    assert!(
        g.is_3x3_same()
            && c % (lanes * NV) == 0
            && w > 0
            && i + 1 < g.h
            && TOP == (i == 0)
            && BOTTOM == (i + 2 == g.h)
            && g.holds_image(x.len())
            && g.holds_kernel(k.len())
            && g.holds_row(out.len())
            && out.len() >= 2 * row,
        "depthwise: 3x3 row pair out of range"
    );
    // Input row `i - 1 + r` meets kernel row `r` of output row `i` (when `r < 3`) and kernel
    // row `r - 1` of output row `i + 1` (when `r > 0`).
    let zero = [[V::splat(0.0); NV]; 2];
    for c0 in (0..c).step_by(lanes * NV) {
        let mut kv = [[[V::splat(0.0); NV]; 3]; 3];
        for (a, taps) in kv.iter_mut().enumerate() {
            for (b, tap) in taps.iter_mut().enumerate() {
                *tap = V::load_n::<NV>(k, (a * 3 + b) * c + c0);
            }
        }
        let (mut left, mut mid) = (zero, zero);
        for jj in 0..w {
            let mut right = zero;
            // The next pair's two new input rows, fetched while this pair computes.
            for ahead in [i + 3, i + 4] {
                if ahead < g.h {
                    for v in 0..NV {
                        prefetch(x, (ahead * w + jj) * c + c0 + lanes * v);
                    }
                }
            }
            for r in 0..4 {
                // Input rows `i - 1` and `i + 2` when they exist.
                if (TOP && r == 0) || (BOTTOM && r == 3) {
                    continue;
                }
                let src = ((i + r - 1) * w + jj) * c + c0;
                for v in 0..NV {
                    let at = src + lanes * v;
                    // SAFETY: the assert keeps i - 1 >= 0 unless TOP (then r > 0) and i + 2 < h
                    // unless BOTTOM (then r < 3), so 0 <= i + r - 1 < h; jj < w; with c0 +
                    // lanes * NV <= c (c a multiple of lanes * NV) `at + lanes <= h * w * c <=
                    // x.len()`.
                    let xv = V::load(unsafe { x.get_unchecked(at..at + lanes) }, 0);
                    if r < 3 {
                        left[0][v] = left[0][v].madd_v::<FMA>(xv, kv[r][2][v]);
                        mid[0][v] = mid[0][v].madd_v::<FMA>(xv, kv[r][1][v]);
                        right[0][v] = right[0][v].madd_v::<FMA>(xv, kv[r][0][v]);
                    }
                    if r > 0 {
                        left[1][v] = left[1][v].madd_v::<FMA>(xv, kv[r - 1][2][v]);
                        mid[1][v] = mid[1][v].madd_v::<FMA>(xv, kv[r - 1][1][v]);
                        right[1][v] = right[1][v].madd_v::<FMA>(xv, kv[r - 1][0][v]);
                    }
                }
            }
            if jj > 0 {
                for (o, accs) in left.iter().enumerate() {
                    for (v, acc) in accs.iter().enumerate() {
                        acc.store(out, o * row + (jj - 1) * c + c0 + lanes * v);
                    }
                }
            }
            (left, mid) = (mid, right);
        }
        for (o, accs) in left.iter().enumerate() {
            for (v, acc) in accs.iter().enumerate() {
                acc.store(out, o * row + (w - 1) * c + c0 + lanes * v);
            }
        }
    }
}

/// [`kernel_grad_row_v8`](super::kernel_grad_row_v8) for a 3×3 'same' geometry: the nine tap sums of a channel group stay
/// in registers for the whole row, each input column's vectors are loaded once and meet the
/// three `dy` vectors that read them (`dy[j + 1]`, `dy[j]`, `dy[j - 1]`, a sliding window): four
/// loads per nine multiply-adds. Needs `12 * NV + 1` vector registers: AVX-512 only (with AVX2's
/// 16 it spilled and ran at half the speed of [`kernel_grad_row_v8`](super::kernel_grad_row_v8)).
///
/// Panics unless `c` is a multiple of `V::LANES * NV`, `g` is such a 3×3 geometry, and the
/// slices hold a whole image, an output row and a kernel.
#[inline(always)]
pub(super) fn kernel_grad_row_3x3<V: Vector, const NV: usize, const FMA: bool>(
    x: &[f32],
    dy_row: &[f32],
    acc: &mut [f32],
    i: usize,
    g: Geometry,
) {
    let (w, c, lanes) = (g.w, g.c, V::LANES);
    assert!(
        g.is_3x3_same()
            && c % (lanes * NV) == 0
            && g.holds_image(x.len())
            && g.holds_row(dy_row.len())
            && g.holds_kernel(acc.len()),
        "depthwise: 3x3 kernel-gradient row out of range"
    );
    let (a0, a1) = g.rows(i);
    let zero = [V::splat(0.0); NV];
    for c0 in (0..c).step_by(lanes * NV) {
        let mut sums = [[zero; 3]; 3];
        // `dy` at output columns jj - 1, jj and jj + 1 (zero outside the row).
        let (mut left, mut mid) = (zero, V::load_n::<NV>(dy_row, c0));
        for jj in 0..w {
            let right = if jj + 1 < w {
                V::load_n::<NV>(dy_row, (jj + 1) * c + c0)
            } else {
                zero
            };
            for (a, taps) in sums.iter_mut().enumerate() {
                if a < a0 || a >= a1 {
                    continue;
                }
                let src = ((i + a - 1) * w + jj) * c + c0;
                for v in 0..NV {
                    let at = src + lanes * v;
                    // SAFETY: `rows` keeps i + a - 1 < h, and jj < w, so with c0 + lanes * NV <=
                    // c (c a multiple of lanes * NV) `at + lanes <= h * w * c <= x.len()`.
                    let xv = V::load(unsafe { x.get_unchecked(at..at + lanes) }, 0);
                    taps[0][v] = taps[0][v].madd_v::<FMA>(xv, right[v]);
                    taps[1][v] = taps[1][v].madd_v::<FMA>(xv, mid[v]);
                    taps[2][v] = taps[2][v].madd_v::<FMA>(xv, left[v]);
                }
            }
            (left, mid) = (mid, right);
        }
        for (a, taps) in sums.iter().enumerate() {
            for (b, tap) in taps.iter().enumerate() {
                for (v, sum) in tap.iter().enumerate() {
                    let at = (a * 3 + b) * c + c0 + lanes * v;
                    V::load(acc, at).add(*sum).store(acc, at);
                }
            }
        }
    }
}
