//! Strided convolutions (one group, no dilation) on the implicit-GEMM kernels of
//! [`implicit`](super::implicit), the forward pass under AVX2 or AVX-512, the gradients under
//! AVX-512 (see [`fits_forward`] and [`fits_kernel_grad`]): no patch matrix is written.
//!
//! * The forward pass and the kernel gradient read each output pixel's patch in place from a
//!   zero-padded copy of its image: `kh` runs of `kw * c_in` values, one per kernel row.
//! * The input gradient splits the input into its `sh × sw` phases (the pixels whose row `r`
//!   and column `c` have `r + pt ≡ p (mod sh)` and `c + pl ≡ q (mod sw)`): the taps that reach
//!   a phase are the kernel's rows `p, p + sh, ...` and columns `q, q + sw, ...`, so each phase
//!   is a stride-1 correlation of `dz` (zero-padded) with that sub-kernel, transposed and
//!   flipped. Every product is over the taps that are there: the zeros an upsampled `dz` would
//!   hold between its pixels are never multiplied, and nothing is scattered back (col2im).
//!
//! A task takes a few images: its padded copies stay in L2 and its products have a few hundred
//! rows. The kernel gradient's tasks are summed in a fixed order, so the bits depend on the
//! shape alone, never on the thread count.

use rayon::prelude::*;

use super::batchnorm::Normalizer;
use super::elementwise::bias_act_rows;
use super::implicit::{self, Patches};
use super::{fma_vectors, ordered_sums, padded_row, wide_registers, with_scratch};
use crate::ops::spec::{Activation, ConvGeometry};

/// Output pixels a task aims for (rows of its products).
const TASK_PIXELS: usize = 256;

/// Tasks a pass is cut into, at least, when the batch allows it: two for each of 16 cores. A
/// constant, not the pool's size, so that a kernel gradient's sums are cut the same way on
/// every machine.
const MIN_TASKS: usize = 32;

/// Whether the forward pass of `g` runs here: one group, no dilation, whole 8-lane vectors of
/// output channels, and AVX2 at least. Under AVX2 its tiles are 6 pixels × 16 channels in 16
/// registers; they beat the im2col path's gemm crate there too: on a 2-core AMD Zen 3,
/// 2026-12-07, min of six `--profile` runs of the modern CNN each, alternating, the two strided
/// forward passes 3.39 → 2.92 and 3.00 → 2.89 ms (on a Zen 4 as AVX2, 5-18% faster).
pub(crate) fn fits_forward(g: &ConvGeometry) -> bool {
    shape_fits(g) && fma_vectors()
}

/// Whether the kernel gradient of `g` runs here: as [`fits_forward`], with AVX-512's 32
/// registers for the tiles. Under AVX2, tiles of 6 taps × 16 channels lost to the im2col path's
/// gemm crate: 4.21 against 3.64 ms and 3.94 against 3.90 on that Zen 3 (up to 24% slower on
/// the Zen 4 as AVX2); with the pixels taken 128 at a time, so that a tile's operands stay in
/// L1, 3.87 and 3.63: no better.
pub(crate) fn fits_kernel_grad(g: &ConvGeometry) -> bool {
    shape_fits(g) && wide_registers()
}

/// Whether the input gradient of `g` runs here: as [`fits_kernel_grad`], with whole vectors of
/// input channels (its products' columns). Under AVX2 it ran within 4% of the im2col path.
pub(crate) fn fits_input_grad(g: &ConvGeometry) -> bool {
    fits_kernel_grad(g) && implicit::fits(g.ci)
}

/// [`fits_forward`] without the CPU: what the kernels can compute at all (at any speed).
fn shape_fits(g: &ConvGeometry) -> bool {
    g.cig == g.ci
        && g.kh * g.kw > 0
        && g.dh == 1
        && g.dw == 1
        && g.image_lens().0 > 0
        && g.oh * g.ow > 0
        && implicit::fits(g.co)
}

/// Images per task: enough for [`TASK_PIXELS`] output pixels, but at least [`MIN_TASKS`] tasks
/// when the batch allows it.
fn images_per_task(g: &ConvGeometry) -> usize {
    let by_pixels = TASK_PIXELS.div_ceil((g.oh * g.ow).max(1));
    by_pixels.min(g.n.div_ceil(MIN_TASKS)).max(1)
}

/// The padded image the forward taps read: every tap of every output pixel.
fn padded_hw(g: &ConvGeometry) -> (usize, usize) {
    ((g.oh - 1) * g.sh + g.kh, (g.ow - 1) * g.sw + g.kw)
}

/// Copies the `[h, w, c]` images of `src` into `dst`, each as a `[hp, wp, c]` image with `top`
/// zero rows above it and `left` zero columns to its left, zeros wherever it ends (and cut
/// where it does not fit); with `norm`, each pixel copied is normalized (the padding stays
/// zero, as the normalized input's padding is).
fn pad_images(
    src: &[f32],
    (h, w, c): (usize, usize, usize),
    (hp, wp, top, left): (usize, usize, usize, usize),
    norm: Option<&Normalizer>,
    dst: &mut [f32],
) {
    for (src, dst) in src.chunks(h * w * c).zip(dst.chunks_mut(hp * wp * c)) {
        for (pr, dst) in dst.chunks_mut(wp * c).enumerate() {
            let row = pr.checked_sub(top).filter(|&r| r < h);
            let row = row.map(|r| &src[r * w * c..][..w * c]);
            match (row, norm) {
                (Some(row), Some(norm)) => {
                    // Whole pixels that fit after the left padding, the rest zeros.
                    let left = (left * c).min(dst.len());
                    let len = row.len().min(dst.len() - left) / c * c;
                    dst[..left].fill(0.0);
                    norm.apply(&row[..len], &mut dst[left..left + len]);
                    dst[left + len..].fill(0.0);
                }
                _ => padded_row(row, left * c, dst),
            }
        }
    }
}

/// Runs `f` on the patches of the images of `x` (a task's), read in place from padded copies
/// in scratch memory (normalized as they are copied, with `norm`).
fn with_patches<R>(
    x: &[f32],
    g: &ConvGeometry,
    norm: Option<&Normalizer>,
    f: impl FnOnce(&Patches<'_>) -> R,
) -> R {
    let (hp, wp) = padded_hw(g);
    let count = x.len() / g.image_lens().0;
    let mut bases = Vec::with_capacity(count * g.oh * g.ow);
    for image in 0..count {
        for i in 0..g.oh {
            for j in 0..g.ow {
                bases.push((image * hp * wp + i * g.sh * wp + j * g.sw) * g.ci);
            }
        }
    }
    let runs: Vec<usize> = (0..g.kh).map(|a| a * wp * g.ci).collect();
    with_scratch(count * hp * wp * g.ci, |img| {
        pad_images(x, (g.h, g.w, g.ci), (hp, wp, g.pt, g.pl), norm, img);
        f(&Patches {
            img,
            bases: &bases,
            runs: &runs,
            len: g.kw * g.ci,
        })
    })
}

/// `y = act(conv(x, kernel) + bias)`, for a `g` that [`fits_forward`] (at least its shape); with
/// `norm`, of the normalized `x` (see [`Normalizer`]).
pub(crate) fn forward(
    (x, norm): (&[f32], Option<&Normalizer>),
    kernel: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
    g: &ConvGeometry,
    act: Activation,
) {
    assert!(shape_fits(g), "strided::forward: {g:?} does not fit");
    let images = images_per_task(g);
    let (image_in, image_out) = g.image_lens();
    y.par_chunks_mut(image_out * images)
        .zip(x.par_chunks(image_in * images))
        .for_each(|(y, x)| {
            with_patches(x, g, norm, |p| implicit::forward(p, kernel, g.co, y, None));
            bias_act_rows(y, bias, g.co, act);
        });
}

/// The kernel gradient `dk` `[kh, kw, c_in, c_out]` from `x` and `dz`, summed over the images,
/// for a `g` that [`fits_kernel_grad`] (at least its shape); with `norm`, from the normalized
/// `x`.
pub(crate) fn backward_kernel(
    (x, norm): (&[f32], Option<&Normalizer>),
    dz: &[f32],
    dk: &mut [f32],
    g: &ConvGeometry,
) {
    assert!(
        shape_fits(g),
        "strided::backward_kernel: {g:?} does not fit"
    );
    let images = images_per_task(g);
    let (image_in, image_out) = g.image_lens();
    let total = ordered_sums(g.n.div_ceil(images), dk.len(), |acc: &mut [f32], t| {
        let first = t * images;
        let count = images.min(g.n - first);
        let x = &x[first * image_in..][..count * image_in];
        let dz = &dz[first * image_out..][..count * image_out];
        with_patches(x, g, norm, |p| implicit::kernel_grad(p, dz, g.co, acc));
    });
    dk.copy_from_slice(&total);
}

/// One phase of the input: the pixels `(r, c)` with `r + pt ≡ pr (mod sh)` and `c + pl ≡ pc
/// (mod sw)`, which the kernel's rows `pr + sh * u` and columns `pc + sw * v` reach.
struct Phase {
    pr: usize,
    pc: usize,
    /// Kernel rows and columns that reach the phase.
    ku: usize,
    kv: usize,
    /// `[ku, kv, c_out, c_in]`: entry `(u', v', o, i)` is the kernel's `(pr + sh * (ku - 1 -
    /// u'), pc + sw * (kv - 1 - v'), i, o)`, so that `dz`'s pixels, read top to bottom and
    /// left to right, meet their taps.
    kernel: Vec<f32>,
}

impl Phase {
    fn all(kernel: &[f32], g: &ConvGeometry) -> Vec<Phase> {
        let reach = |p: usize, k: usize, s: usize| if p < k { (k - p).div_ceil(s) } else { 0 };
        let mut phases = Vec::with_capacity(g.sh * g.sw);
        for pr in 0..g.sh {
            for pc in 0..g.sw {
                let (ku, kv) = (reach(pr, g.kh, g.sh), reach(pc, g.kw, g.sw));
                let mut sub = vec![0.0f32; ku * kv * g.co * g.ci];
                for u in 0..ku {
                    for v in 0..kv {
                        let a = pr + g.sh * (ku - 1 - u);
                        let b = pc + g.sw * (kv - 1 - v);
                        let src = &kernel[(a * g.kw + b) * g.ci * g.co..][..g.ci * g.co];
                        let dst = &mut sub[(u * kv + v) * g.co * g.ci..][..g.co * g.ci];
                        for i in 0..g.ci {
                            for o in 0..g.co {
                                dst[o * g.ci + i] = src[i * g.co + o];
                            }
                        }
                    }
                }
                phases.push(Phase {
                    pr,
                    pc,
                    ku,
                    kv,
                    kernel: sub,
                });
            }
        }
        phases
    }

    /// The phase's indices `q` along one axis of length `len` (input pixel `q * s + p - pad`),
    /// as a range.
    fn span(p: usize, s: usize, pad: usize, len: usize) -> std::ops::Range<usize> {
        let first = pad.saturating_sub(p).div_ceil(s);
        let end = (len + pad).saturating_sub(p).div_ceil(s);
        first..end
    }
}

/// The input gradient `dx` from `dz` (w.r.t. the pre-activation output), for a `g` that
/// [`fits_input_grad`] (at least its shape): a stride-1 correlation per phase (see the
/// module's docs).
pub(crate) fn backward_input(dz: &[f32], kernel: &[f32], dx: &mut [f32], g: &ConvGeometry) {
    assert!(
        shape_fits(g) && implicit::fits(g.ci),
        "strided::backward_input: {g:?} does not fit"
    );
    let phases = Phase::all(kernel, g);
    // dz padded with the rows and columns a phase's taps reach above and left of it (up to
    // `ceil(kh / sh) - 1`), and below and right as far as the last phase pixel reads (or dz's
    // own last row and column, if further: every row of dz must fit).
    let (top, left) = ((g.kh - 1) / g.sh, (g.kw - 1) / g.sw);
    let (hd, wd) = (
        top + g.oh.max((g.h - 1 + g.pt) / g.sh + 1),
        left + g.ow.max((g.w - 1 + g.pl) / g.sw + 1),
    );
    let images = images_per_task(g);
    let (image_in, image_out) = g.image_lens();
    dx.par_chunks_mut(image_in * images)
        .zip(dz.par_chunks(image_out * images))
        .for_each(|(dx, dz)| {
            let count = dz.len() / image_out;
            with_scratch(count * hd * wd * g.co, |img| {
                pad_images(dz, (g.oh, g.ow, g.co), (hd, wd, top, left), None, img);
                for phase in &phases {
                    let (rows_q, cols_q) = (
                        Phase::span(phase.pr, g.sh, g.pt, g.h),
                        Phase::span(phase.pc, g.sw, g.pl, g.w),
                    );
                    let tapped = phase.ku * phase.kv > 0;
                    let pixels = count * rows_q.len() * cols_q.len();
                    let mut rows = Vec::with_capacity(pixels);
                    let mut bases = Vec::with_capacity(if tapped { pixels } else { 0 });
                    for image in 0..count {
                        for q in rows_q.clone() {
                            let r = q * g.sh + phase.pr - g.pt;
                            // A pixel's patch starts at dz's pixel (q - (ku - 1), q2 - (kv - 1)).
                            let pi = q + top + 1 - phase.ku;
                            for q2 in cols_q.clone() {
                                rows.push((image * g.h + r) * g.w + q2 * g.sw + phase.pc - g.pl);
                                if tapped {
                                    let pj = q2 + left + 1 - phase.kv;
                                    bases.push(((image * hd + pi) * wd + pj) * g.co);
                                }
                            }
                        }
                    }
                    if !tapped {
                        // No tap reaches these pixels.
                        for &row in &rows {
                            dx[row * g.ci..][..g.ci].fill(0.0);
                        }
                        continue;
                    }
                    let runs: Vec<usize> = (0..phase.ku).map(|u| u * wd * g.co).collect();
                    let p = Patches {
                        img,
                        bases: &bases,
                        runs: &runs,
                        len: phase.kv * g.co,
                    };
                    implicit::forward(&p, &phase.kernel, g.ci, dx, Some(&rows));
                }
            });
        });
}

#[cfg(test)]
pub(in crate::ops::cpu) mod tests {
    use super::*;
    use crate::ops::cpu::conv_general::tests::{check_passes, Passes};
    use crate::ops::spec::{Conv2dShape, Padding};

    /// Every tile width (8, 16, 32, 64 columns and their sums), pixel counts that leave a last
    /// tile short, runs that leave taps past the last whole tile (`kw * c_in` not a multiple
    /// of 6 or 12), kernels wider than tall, strides along one axis and past the kernel (a
    /// phase no tap reaches), TensorFlow's asymmetric 'same' padding on odd and even sizes,
    /// 'valid' padding, and batches of several tasks.
    fn cases() -> Vec<Conv2dShape> {
        let mut v = Vec::new();
        for (n, h, w, c_in, c_out, (kh, kw), strides, padding) in [
            (3, 7, 6, 16, 16, (3, 3), [2, 2], Padding::Same),
            (2, 9, 8, 32, 32, (3, 3), [2, 2], Padding::Same),
            (3, 7, 7, 48, 48, (3, 3), [2, 2], Padding::Same),
            (2, 6, 6, 5, 64, (3, 3), [2, 2], Padding::Valid),
            (2, 8, 5, 16, 80, (2, 4), [1, 2], Padding::Same),
            (2, 5, 9, 3, 112, (3, 5), [2, 1], Padding::Valid),
            (2, 10, 11, 16, 32, (5, 5), [3, 2], Padding::Same),
            (130, 6, 6, 2, 32, (3, 3), [2, 2], Padding::Same),
            (70, 5, 4, 16, 16, (1, 1), [2, 2], Padding::Valid),
            (3, 4, 4, 32, 16, (1, 3), [3, 3], Padding::Same),
            (2, 9, 6, 24, 40, (5, 5), [1, 2], Padding::Same),
            (3, 7, 8, 40, 24, (4, 3), [3, 2], Padding::Valid),
            (2, 6, 7, 8, 8, (3, 3), [2, 2], Padding::Same),
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
                strides,
                dilation: [1, 1],
            });
        }
        v
    }

    #[test]
    pub(in crate::ops::cpu) fn strided_passes_match_the_oracle() {
        for (t, s) in cases().into_iter().enumerate() {
            assert!(shape_fits(&ConvGeometry::conv(&s)), "{s:?}");
            let passes = Passes {
                forward: |x, k, b, y, g, act| forward((x, None), k, b, y, g, act),
                backward_input: implicit::fits(s.c_in).then_some(backward_input as _),
                backward_kernel: |x, dz, dk, g| backward_kernel((x, None), dz, dk, g),
            };
            check_passes(&s, 900 + 10 * t as u64, Activation::Relu, passes);
        }
    }
}
