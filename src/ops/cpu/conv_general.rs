//! Convolutions the stride-1 kernels of `conv.rs` and `depthwise.rs` do not serve: strides,
//! dilation, TensorFlow's asymmetric 'same' padding, and depthwise convolutions with a depth
//! multiplier or 'valid' padding (see [`ConvGeometry`]: a depthwise convolution is a grouped one
//! with one input channel per group).
//!
//! A full convolution (one group) without dilation runs on the implicit-GEMM kernels of [`strided`]
//! where they fit (channels in whole 8-lane vectors; AVX2 for the forward pass, AVX-512 for the
//! gradients). Otherwise it goes through an im2col per image into the gemm crate: the patches
//! `[oh*ow, kh*kw*c_in]` times the kernel `[kh*kw*c_in, c_out]` forward, `dz · kernelᵀ` scattered
//! back (col2im) for the input gradient, `patchesᵀ · dz` summed over the images for the kernel's.
//! Grouped convolutions (depthwise) have a few taps per output: direct loops. Images run in
//! parallel, a few to a task where one image alone makes a short product (their patches stacked
//! into one matrix); the kernel gradients are summed per task in a fixed order ([`ordered_sums`]),
//! so a run gives the same bits every time.

use rayon::prelude::*;

use super::batchnorm::Normalizer;
use super::elementwise::bias_act_rows;
use super::gemm::{gemm_strided, Strided};
use super::strided;
use super::{ordered_sums, with_scratch};
use crate::ops::spec::{Activation, ConvGeometry};

/// The first input column of output column `j`'s taps when all `kw` of them fall inside the
/// image next to each other (no dilation along rows): a patch row's taps of one kernel row are
/// then one run of `kw * ci` values of the image, copied (or added back) at once.
fn whole_run(g: &ConvGeometry, j: usize) -> Option<usize> {
    let first = g.in_col(j, 0)?;
    (g.dw == 1 && g.in_col(j, g.kw - 1).is_some()).then_some(first)
}

/// The patches of image `x` (`[h, w, ci]`) for group 0 of a one-group convolution:
/// `col[(i * ow + j) * taps + (a * kw + b) * ci + c]`, zero where a tap falls in the padding.
fn im2col(x: &[f32], g: &ConvGeometry, col: &mut [f32]) {
    let (taps, run) = (g.taps(), g.kw * g.ci);
    for i in 0..g.oh {
        for j in 0..g.ow {
            let row = &mut col[(i * g.ow + j) * taps..][..taps];
            let whole = whole_run(g, j);
            for (a, dst) in row.chunks_exact_mut(run).enumerate() {
                let Some(r) = g.in_row(i, a) else {
                    dst.fill(0.0);
                    continue;
                };
                if let Some(c) = whole {
                    dst.copy_from_slice(&x[(r * g.w + c) * g.ci..][..run]);
                    continue;
                }
                for (b, dst) in dst.chunks_exact_mut(g.ci).enumerate() {
                    match g.in_col(j, b) {
                        Some(c) => dst.copy_from_slice(&x[(r * g.w + c) * g.ci..][..g.ci]),
                        None => dst.fill(0.0),
                    }
                }
            }
        }
    }
}

multiversion! {
    /// The adjoint of [`im2col`]: adds each patch entry back into its input pixel (`dx` zeroed
    /// first by the caller).
    fn col2im(col: &[f32], g: &ConvGeometry, dx: &mut [f32]) {
        let (taps, run) = (g.taps(), g.kw * g.ci);
        for i in 0..g.oh {
            for j in 0..g.ow {
                let row = &col[(i * g.ow + j) * taps..][..taps];
                let whole = whole_run(g, j);
                for (a, src) in row.chunks_exact(run).enumerate() {
                    let Some(r) = g.in_row(i, a) else { continue };
                    if let Some(c) = whole {
                        let dst = &mut dx[(r * g.w + c) * g.ci..][..run];
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d += s;
                        }
                        continue;
                    }
                    for (b, src) in src.chunks_exact(g.ci).enumerate() {
                        let Some(c) = g.in_col(j, b) else { continue };
                        let dst = &mut dx[(r * g.w + c) * g.ci..][..g.ci];
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d += s;
                        }
                    }
                }
            }
        }
    }
}

/// Patch-matrix rows a task aims for: below ~256 the gemm crate's per-call packing and its
/// 64-row micro-tiles leave much of a product idle (a 7×7 output is 49 rows an image).
const TASK_PIXELS: usize = 256;

/// Tasks a pass over a batch is cut into, at least, when the batch allows it: two for each of
/// 16 cores. A constant, not the pool's size: the images a task stacks set the product's row
/// count, and with it how the gemm crate splits the sum over taps, so a cut by the thread
/// count would round differently on another machine.
const MIN_TASKS: usize = 32;

/// Patch-matrix bytes a task stays under (about half a core's L2).
const TASK_COL_BYTES: usize = 512 * 1024;

/// Images per task of a one-group convolution: enough for [`TASK_PIXELS`] rows, as long as
/// their patch matrix stays under [`TASK_COL_BYTES`], and never fewer than [`MIN_TASKS`] tasks
/// when the batch allows it. A function of the shape alone.
fn images_per_task(g: &ConvGeometry) -> usize {
    let pixels = (g.oh * g.ow).max(1);
    let by_rows = TASK_PIXELS.div_ceil(pixels);
    let by_bytes = TASK_COL_BYTES / (4 * pixels * g.taps()).max(1);
    let balanced = g.n.div_ceil(MIN_TASKS);
    by_rows.min(by_bytes).min(balanced).max(1)
}

/// Runs `f` on a task's images `x` (normalized into scratch memory first, with `norm`) and a
/// scratch patch matrix of `len` floats: one scratch allocation for both, so that the
/// normalized images stay in cache for the patch matrix's copies.
fn with_patch_matrix<R>(
    (x, norm): (&[f32], Option<&Normalizer>),
    len: usize,
    f: impl FnOnce(&[f32], &mut [f32]) -> R,
) -> R {
    let Some(norm) = norm else {
        return with_scratch(len, |col| f(x, col));
    };
    with_scratch(x.len() + len, |scratch| {
        let (normalized, col) = scratch.split_at_mut(x.len());
        norm.apply(x, normalized);
        f(normalized, col)
    })
}

/// `y = act(conv(x, kernel) + bias)` for the general geometry `g`; with `norm` (one group
/// only), of the normalized `x`, formed where a task copies its images (into the strided
/// kernels' padded images, or into scratch memory before the patch matrix).
pub(crate) fn forward(
    (x, norm): (&[f32], Option<&Normalizer>),
    kernel: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
    g: &ConvGeometry,
    act: Activation,
) {
    let (image_in, image_out) = g.image_lens();
    if y.is_empty() {
        return;
    }
    if image_in == 0 || kernel.is_empty() {
        y.fill(0.0);
        y.par_chunks_mut(image_out.max(1))
            .for_each(|y| bias_act_rows(y, bias, g.co, act));
        return;
    }
    let (pixels, taps) = (g.oh * g.ow, g.taps());
    if g.cig != g.ci {
        assert!(
            norm.is_none(),
            "conv_general: a grouped convolution of a normalized input"
        );
        y.par_chunks_mut(image_out)
            .zip(x.par_chunks(image_in))
            .for_each(|(y, x)| {
                grouped_image_forward(x, kernel, y, g);
                bias_act_rows(y, bias, g.co, act);
            });
        return;
    }
    if strided::fits_forward(g) {
        return strided::forward((x, norm), kernel, bias, y, g, act);
    }
    // A few images a task, their patches stacked into one matrix: one product for all.
    let images = images_per_task(g);
    y.par_chunks_mut(image_out * images)
        .zip(x.par_chunks(image_in * images))
        .for_each(|(y, x)| {
            let rows = y.len() / g.co;
            with_patch_matrix((x, norm), rows * taps, |x, col| {
                for (x, col) in x.chunks(image_in).zip(col.chunks_mut(pixels * taps)) {
                    im2col(x, g, col);
                }
                let (lhs, rhs) = (
                    Strided::row_major(col, taps),
                    Strided::row_major(kernel, g.co),
                );
                gemm_strided(y, rows, g.co, taps, lhs, rhs, false, false);
            });
            bias_act_rows(y, bias, g.co, act);
        });
}

/// One image of a grouped convolution, direct loops.
fn grouped_image_forward(x: &[f32], kernel: &[f32], y: &mut [f32], g: &ConvGeometry) {
    for i in 0..g.oh {
        for j in 0..g.ow {
            let out = &mut y[(i * g.ow + j) * g.co..][..g.co];
            out.fill(0.0);
            for a in 0..g.kh {
                let Some(r) = g.in_row(i, a) else { continue };
                for b in 0..g.kw {
                    let Some(c) = g.in_col(j, b) else { continue };
                    let px = &x[(r * g.w + c) * g.ci..][..g.ci];
                    let k = &kernel[(a * g.kw + b) * g.cig * g.co..][..g.cig * g.co];
                    for (o, acc) in out.iter_mut().enumerate() {
                        let c0 = o / g.cog * g.cig;
                        for q in 0..g.cig {
                            *acc += px[c0 + q] * k[q * g.co + o];
                        }
                    }
                }
            }
        }
    }
}

/// The input gradient `dx` from `dz` (w.r.t. the pre-activation output).
pub(crate) fn backward_input(dz: &[f32], kernel: &[f32], dx: &mut [f32], g: &ConvGeometry) {
    let (image_in, image_out) = g.image_lens();
    if image_in == 0 || image_out == 0 || kernel.is_empty() {
        dx.fill(0.0);
        return;
    }
    if strided::fits_input_grad(g) {
        return strided::backward_input(dz, kernel, dx, g);
    }
    // Each image's dx is zeroed by its task just before the scatter adds into it, while it
    // is in cache, rather than all at once before (a pass over memory of its own).
    let (pixels, taps) = (g.oh * g.ow, g.taps());
    if g.cig != g.ci {
        dx.par_chunks_mut(image_in)
            .zip(dz.par_chunks(image_out))
            .for_each(|(dx, dz)| {
                dx.fill(0.0);
                grouped_image_backward_input(dz, kernel, dx, g);
            });
        return;
    }
    let images = images_per_task(g);
    dx.par_chunks_mut(image_in * images)
        .zip(dz.par_chunks(image_out * images))
        .for_each(|(dx, dz)| {
            let rows = dz.len() / g.co;
            with_scratch(rows * taps, |col| {
                // col = dz · kernelᵀ: [pixels, co] · [co, taps], for the task's images at once.
                let (lhs, rhs) = (
                    Strided::row_major(dz, g.co),
                    Strided::transposed(kernel, g.co),
                );
                gemm_strided(col, rows, taps, g.co, lhs, rhs, false, false);
                for (col, dx) in col.chunks(pixels * taps).zip(dx.chunks_mut(image_in)) {
                    dx.fill(0.0);
                    col2im(col, g, dx);
                }
            });
        });
}

fn grouped_image_backward_input(dz: &[f32], kernel: &[f32], dx: &mut [f32], g: &ConvGeometry) {
    for i in 0..g.oh {
        for j in 0..g.ow {
            let d = &dz[(i * g.ow + j) * g.co..][..g.co];
            for a in 0..g.kh {
                let Some(r) = g.in_row(i, a) else { continue };
                for b in 0..g.kw {
                    let Some(c) = g.in_col(j, b) else { continue };
                    let px = &mut dx[(r * g.w + c) * g.ci..][..g.ci];
                    let k = &kernel[(a * g.kw + b) * g.cig * g.co..][..g.cig * g.co];
                    for (o, &dv) in d.iter().enumerate() {
                        let c0 = o / g.cog * g.cig;
                        for q in 0..g.cig {
                            px[c0 + q] += dv * k[q * g.co + o];
                        }
                    }
                }
            }
        }
    }
}

/// The kernel gradient `dk` `[kh, kw, cig, co]` from `x` and `dz`, summed over the images;
/// with `norm` (one group only), from the normalized `x`, as [`forward`] forms it.
pub(crate) fn backward_kernel(
    (x, norm): (&[f32], Option<&Normalizer>),
    dz: &[f32],
    dk: &mut [f32],
    g: &ConvGeometry,
) {
    let (image_in, image_out) = g.image_lens();
    if dk.is_empty() {
        return;
    }
    if image_in == 0 || image_out == 0 {
        dk.fill(0.0);
        return;
    }
    assert!(
        norm.is_none() || g.cig == g.ci,
        "conv_general: a grouped convolution of a normalized input"
    );
    if strided::fits_kernel_grad(g) {
        return strided::backward_kernel((x, norm), dz, dk, g);
    }
    let (pixels, taps, len) = (g.oh * g.ow, g.taps(), dk.len());
    // Tasks of a few images (one product over their stacked patches) for one group, of one
    // image for grouped convolutions.
    let images = if g.cig == g.ci { images_per_task(g) } else { 1 };
    let total = ordered_sums(g.n.div_ceil(images), len, |acc: &mut [f32], t| {
        let first = t * images;
        let count = images.min(g.n - first);
        let x = &x[first * image_in..][..count * image_in];
        let dz = &dz[first * image_out..][..count * image_out];
        if g.cig == g.ci {
            let rows = count * pixels;
            with_patch_matrix((x, norm), rows * taps, |x, col| {
                for (x, col) in x.chunks(image_in).zip(col.chunks_mut(pixels * taps)) {
                    im2col(x, g, col);
                }
                let (lhs, rhs) = (Strided::transposed(col, taps), Strided::row_major(dz, g.co));
                gemm_strided(acc, taps, g.co, rows, lhs, rhs, true, false);
            });
        } else {
            grouped_image_backward_kernel(x, dz, acc, g);
        }
    });
    dk.copy_from_slice(&total);
}

fn grouped_image_backward_kernel(x: &[f32], dz: &[f32], dk: &mut [f32], g: &ConvGeometry) {
    for i in 0..g.oh {
        for j in 0..g.ow {
            let d = &dz[(i * g.ow + j) * g.co..][..g.co];
            for a in 0..g.kh {
                let Some(r) = g.in_row(i, a) else { continue };
                for b in 0..g.kw {
                    let Some(c) = g.in_col(j, b) else { continue };
                    let px = &x[(r * g.w + c) * g.ci..][..g.ci];
                    let k = &mut dk[(a * g.kw + b) * g.cig * g.co..][..g.cig * g.co];
                    for (o, &dv) in d.iter().enumerate() {
                        let c0 = o / g.cog * g.cig;
                        for q in 0..g.cig {
                            k[q * g.co + o] += px[c0 + q] * dv;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
pub(in crate::ops::cpu) mod tests {
    use super::*;
    use crate::ops::reference::{self as r, assert_close, random_vec, to_f64};
    use crate::ops::spec::{Conv2dShape, DepthwiseShape, Padding};

    fn conv_cases() -> Vec<Conv2dShape> {
        let mut v = Vec::new();
        for (h, w, kh, kw, strides, dilation, padding) in [
            (7, 6, 3, 3, [2, 2], [1, 1], Padding::Same),
            (7, 6, 4, 4, [2, 2], [1, 1], Padding::Same),
            (7, 6, 3, 5, [2, 1], [1, 1], Padding::Valid),
            (9, 8, 3, 3, [1, 1], [2, 2], Padding::Same),
            (2, 3, 3, 3, [2, 2], [1, 1], Padding::Valid),
        ] {
            v.push(Conv2dShape {
                n: 3,
                h,
                w,
                c_in: 3,
                c_out: 5,
                kh,
                kw,
                padding,
                strides,
                dilation,
            });
        }
        v
    }

    #[test]
    fn general_conv_matches_the_oracle() {
        // 130 images: several to a task (see `images_per_task`), the last task short.
        let batches = conv_cases()
            .into_iter()
            .flat_map(|s| [s, Conv2dShape { n: 130, ..s }]);
        for (t, s) in batches.enumerate() {
            let passes = Passes {
                forward: |x, k, b, y, g, act| forward((x, None), k, b, y, g, act),
                backward_input: Some(backward_input),
                backward_kernel: |x, dz, dk, g| backward_kernel((x, None), dz, dk, g),
            };
            check_passes(&s, 40 + 10 * t as u64, Activation::Selu, passes);
        }
    }

    /// A forward pass: `(x, kernel, bias, y, g, act)`.
    type Forward = fn(&[f32], &[f32], Option<&[f32]>, &mut [f32], &ConvGeometry, Activation);

    /// A gradient pass: `(dz, kernel, dx, g)` or `(x, dz, dk, g)`.
    type Gradient = fn(&[f32], &[f32], &mut [f32], &ConvGeometry);

    /// A convolution's three passes, as `forward`, `backward_input` and `backward_kernel`
    /// take them.
    pub(in crate::ops::cpu) struct Passes {
        pub forward: Forward,
        /// None where the input gradient is not computed.
        pub backward_input: Option<Gradient>,
        pub backward_kernel: Gradient,
    }

    /// `passes` on random operands of `s` (with a bias and `act` forward) against the f64
    /// oracle.
    pub(in crate::ops::cpu) fn check_passes(
        s: &Conv2dShape,
        seed: u64,
        act: Activation,
        passes: Passes,
    ) {
        let g = ConvGeometry::conv(s);
        let x = random_vec(s.input_len(), seed);
        let k = random_vec(s.kernel_len(), seed + 1);
        let b = random_vec(s.c_out, seed + 2);
        let dz = random_vec(s.output_len(), seed + 3);
        let mut y = vec![f32::NAN; s.output_len()];
        (passes.forward)(&x, &k, Some(&b), &mut y, &g, act);
        let want = r::conv2d_forward(&to_f64(&x), &to_f64(&k), Some(&to_f64(&b)), s, act);
        assert_close(&y, &want, 1e-5, &format!("forward {s:?}"));
        if let Some(backward_input) = passes.backward_input {
            let mut dx = vec![f32::NAN; s.input_len()];
            backward_input(&dz, &k, &mut dx, &g);
            let want = r::conv2d_backward_input(&to_f64(&dz), &to_f64(&k), s);
            assert_close(&dx, &want, 1e-5, &format!("dx {s:?}"));
        }
        let mut dk = vec![f32::NAN; s.kernel_len()];
        (passes.backward_kernel)(&x, &dz, &mut dk, &g);
        let want = r::conv2d_backward_kernel(&to_f64(&x), &to_f64(&dz), s);
        assert_close(&dk, &want, 1e-5, &format!("dk {s:?}"));
    }

    #[test]
    fn general_depthwise_matches_the_oracle() {
        for (t, s) in conv_cases().into_iter().enumerate() {
            for multiplier in [1, 2] {
                let d = DepthwiseShape {
                    n: s.n,
                    h: s.h,
                    w: s.w,
                    c: 3,
                    kh: s.kh,
                    kw: s.kw,
                    multiplier,
                    padding: s.padding,
                    strides: s.strides,
                    dilation: s.dilation,
                };
                let g = ConvGeometry::depthwise(&d);
                let seed = 80 + 10 * t as u64;
                let x = random_vec(d.input_len(), seed);
                let k = random_vec(d.kernel_len(), seed + 1);
                let dy = random_vec(d.output_len(), seed + 2);
                let mut y = vec![f32::NAN; d.output_len()];
                forward((&x, None), &k, None, &mut y, &g, Activation::Linear);
                let want = r::depthwise_forward(&to_f64(&x), &to_f64(&k), &d);
                assert_close(&y, &want, 1e-5, &format!("forward {d:?}"));
                let mut dx = vec![f32::NAN; d.input_len()];
                backward_input(&dy, &k, &mut dx, &g);
                let want = r::depthwise_backward_input(&to_f64(&dy), &to_f64(&k), &d);
                assert_close(&dx, &want, 1e-5, &format!("dx {d:?}"));
                let mut dk = vec![f32::NAN; d.kernel_len()];
                backward_kernel((&x, None), &dy, &mut dk, &g);
                let want = r::depthwise_backward_kernel(&to_f64(&x), &to_f64(&dy), &d);
                assert_close(&dk, &want, 1e-5, &format!("dk {d:?}"));
            }
        }
    }
}
