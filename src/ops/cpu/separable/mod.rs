//! Keras' `SeparableConv2D` (depthwise 'same' correlation, then a pointwise product with bias
//! and activation) fused block by block: a few whole images at a time go through every step
//! while they are in cache.
//!
//! Run as separate ops, the depthwise output `d` is written to memory, read back by the
//! product, kept for the backward pass and read again there, and its gradient is written and
//! read twice more. Fused, `d` and its gradient live only in a per-block scratch buffer: the
//! forward pass reads `x` and writes `y`; the backward pass recomputes `d` from `x` (9
//! multiply-adds per element), reads `y` and `dy`, and writes `dx`. On a Zen 4 whose 32 MiB L3
//! holds every activation of the tutorial model this runs as fast as the separate ops (the
//! traffic it saves was L3 traffic); what it always saves is memory: `d` is never kept.

use std::ops::Range;

use rayon::prelude::*;

use crate::ops::spec::{Activation, Conv2dShape, DepthwiseShape, PoolShape};
use crate::shape::product;

use super::conv::{conv2d_forward, conv2d_forward_serial};
use super::depthwise::{self, correlate_image, Geometry};
use super::elementwise::bias_act_rows;
use super::gemm::{gemm_strided, Strided};
use super::pool;
use super::with_scratch;

mod backward;
pub(crate) use backward::{separable_backward, Kept, SeparableGrads, SeparableGradsOut};

/// Pixels a block should hold at least: as in the fused dense product (`gemm.rs`), below a
/// few hundred rows the gemm crate's per-call packing costs more than the cache saves.
const MIN_BLOCK_PIXELS: usize = 256;

/// Whole images per block: enough for [`MIN_BLOCK_PIXELS`].
fn images_per_block(pixels: usize) -> usize {
    MIN_BLOCK_PIXELS.div_ceil(pixels.max(1))
}

/// A stride-1 convolution whose output is the separable convolution's input, computed block
/// by block in front of it (a model's first two layers: `Conv2D`, then `SeparableConv2D`). Its
/// output never goes through memory: the forward pass computes each block from the stem's
/// input and the backward pass recomputes it, so the 12.8 MB the tutorial's first layer
/// writes at batch 128, and the reads of it and of its gradient, are gone.
pub(crate) struct Stem<'a> {
    /// Kernel `[kh, kw, c_in, c]`.
    pub kernel: &'a [f32],
    /// Bias `[c]`.
    pub bias: Option<&'a [f32]>,
    /// The convolution's shape over the whole batch: stride 1, output `[n, h, w, c]` (the
    /// separable convolution's input).
    pub s: Conv2dShape,
    /// Its activation.
    pub act: Activation,
}

/// Where the separable convolution's input comes from.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    /// The input itself, `[n, h, w, c]`.
    Input(&'a [f32]),
    /// A [`Stem`]'s input `[n, h0, w0, c_in]`: the stem's output is the input.
    Stem(&'a [f32], &'a Stem<'a>),
}

impl<'a> Source<'a> {
    /// Checks the source against the separable convolution's shape; the length its input
    /// would have (the input's own length for [`Source::Input`]).
    fn input_len(&self, s: &DepthwiseShape, what: &str) -> usize {
        match *self {
            Source::Input(x) => x.len(),
            Source::Stem(x0, stem) => {
                let c = &stem.s;
                assert!(c.is_unit_stride(), "{what}: the stem must have stride 1");
                assert_eq!(
                    (c.n, c.out_hw(), c.c_out),
                    (s.n, (s.h, s.w), s.c),
                    "{what}: the stem's output is not the separable convolution's input"
                );
                assert_eq!(
                    product(&[c.n, c.h, c.w, c.c_in]),
                    Some(x0.len()),
                    "{what}: the stem's input length does not match its shape"
                );
                s.input_len()
            }
        }
    }

    /// The input of `images`: a slice of it, or the stem's output computed into `buf` (at
    /// least as long as those images' input).
    fn block<'b>(&self, images: Range<usize>, image_in: usize, buf: &'b mut [f32]) -> &'b [f32]
    where
        'a: 'b,
    {
        match *self {
            Source::Input(x) => &x[images.start * image_in..images.end * image_in],
            Source::Stem(x0, stem) => {
                let (x0, s) = stem.block(x0, images.clone());
                let out = &mut buf[..images.len() * image_in];
                conv2d_forward_serial(x0, stem.kernel, stem.bias, out, &s, stem.act);
                out
            }
        }
    }
}

impl Stem<'_> {
    /// The stem's input of `images` and the shape of that block.
    fn block<'x>(&self, x0: &'x [f32], images: Range<usize>) -> (&'x [f32], Conv2dShape) {
        let image = self.s.h * self.s.w * self.s.c_in;
        let s = Conv2dShape {
            n: images.len(),
            ..self.s
        };
        (&x0[images.start * image..images.end * image], s)
    }
}

/// The depthwise geometry of one layer and its sizes.
struct Layer {
    g: Geometry,
    /// Pixels per image.
    pixels: usize,
    c: usize,
}

impl Layer {
    /// Checks the lengths of the input, the depthwise kernel, the pointwise kernel and `y`
    /// against the shape.
    fn new(s: &DepthwiseShape, f: usize, lens: [usize; 4], what: &str) -> Layer {
        let [x, dk, pk, y] = lens;
        let g = depthwise::geometry(s, x, dk, x, what);
        assert_eq!(
            pk,
            s.c * f,
            "{what}: pointwise kernel length does not match the shape"
        );
        assert_eq!(
            y,
            s.n * s.h * s.w * f,
            "{what}: output length does not match the shape"
        );
        Layer {
            g,
            pixels: s.h * s.w,
            c: s.c,
        }
    }

    /// `d = depthwise(x)` for a block of whole images.
    fn depthwise(&self, x: &[f32], dk: &[f32], d: &mut [f32]) {
        let image = self.pixels * self.c;
        for (x, d) in x.chunks_exact(image).zip(d.chunks_exact_mut(image)) {
            correlate_image(x, dk, d, self.g);
        }
    }
}

/// Where [`separable_forward`] writes: `y`, and its 2×2 max-pool when `pooled` is given;
/// or, with `argmax`, only the pool and where each window's maximum is (0..3, see
/// `pool::forward_images_argmax_act`), the products before bias and activation living block by
/// block in scratch memory (what the backward pass then reads instead of `y`, see
/// [`Kept::Argmax`]).
pub(crate) struct Outputs<'a> {
    /// `[n, h, w, f]`.
    pub y: Option<&'a mut [f32]>,
    /// `[n, h / 2, w / 2, f]`.
    pub pooled: Option<&'a mut [f32]>,
    /// `[n, h / 2, w / 2, f]`, with `pooled` and without `y`.
    pub argmax: Option<&'a mut [i32]>,
}

/// `out` cut into `blocks` slices of `len` elements (the last one shorter); without `out`, or
/// with nothing in it to write (the pool of an image of height or width 1), `None` for each.
fn per_block_slices<T>(out: Option<&mut [T]>, len: usize, blocks: usize) -> Vec<Option<&mut [T]>> {
    match out {
        Some(out) if len > 0 => out.chunks_mut(len).map(Some).collect(),
        _ => (0..blocks).map(|_| None).collect(),
    }
}

/// `y = act(depthwise(x, dk) · pk + bias)`: `x` `[n, h, w, c]` (or a [`Stem`]'s output), `dk`
/// `[kh, kw, c]`, `pk` `[c, f]`, `bias` `[f]`, `y` `[n, h, w, f]`; and, when `pooled` is given,
/// its 2×2 max-pool `[n, h / 2, w / 2, f]`, taken block by block while `y` is in cache (the
/// separate pool would read all of `y` back: 12.8 MB for the tutorial's first separable layer
/// at batch 128). With `argmax`, `y` itself is not written (see [`Outputs`]).
#[allow(clippy::too_many_arguments)] // the layer's three weights, its input and outputs
pub(crate) fn separable_forward(
    src: Source<'_>,
    dk: &[f32],
    pk: &[f32],
    bias: Option<&[f32]>,
    out: Outputs<'_>,
    s: &DepthwiseShape,
    f: usize,
    act: Activation,
) {
    let what = "separable_forward";
    let y_len = s.n * s.h * s.w * f;
    let Outputs { y, pooled, argmax } = out;
    assert!(
        y.is_some() != argmax.is_some() && (argmax.is_none() || pooled.is_some()),
        "{what}: writes y, or the pool and its argmax"
    );
    let layer = Layer::new(
        s,
        f,
        [
            src.input_len(s, what),
            dk.len(),
            pk.len(),
            y.as_ref().map_or(y_len, |y| y.len()),
        ],
        what,
    );
    if let Some(bias) = bias {
        assert_eq!(bias.len(), f, "{what}: bias must have f elements");
    }
    let (c, pixels) = (layer.c, layer.pixels);
    let pool = PoolShape {
        n: s.n,
        h: s.h,
        w: s.w,
        c: f,
    };
    for len in [
        pooled.as_ref().map(|p| p.len()),
        argmax.as_ref().map(|a| a.len()),
    ]
    .into_iter()
    .flatten()
    {
        assert_eq!(
            len,
            pool.output_len(),
            "{what}: pooled output length does not match the shape"
        );
    }
    assert!(c > 0 || y_len == 0, "{what}: no input channels");
    if y_len == 0 {
        return;
    }
    let per_block = images_per_block(pixels);
    let pk_view = Strided::row_major(pk, f);
    let image_pooled = pool.output_len() / s.n;
    // With fewer blocks than threads (a small batch), the unfused ops parallelise better.
    if s.n.div_ceil(per_block) < 2 * rayon::current_num_threads() {
        let mut d = vec![0.0f32; s.input_len()];
        match src {
            Source::Input(x) => depthwise::depthwise_forward(x, dk, &mut d, s),
            Source::Stem(x0, stem) => {
                let mut x = vec![0.0f32; s.input_len()];
                conv2d_forward(x0, stem.kernel, stem.bias, &mut x, &stem.s, stem.act);
                depthwise::depthwise_forward(&x, dk, &mut d, s);
            }
        }
        let mut own_y = Vec::new();
        let y = match y {
            Some(y) => y,
            None => {
                own_y.resize(y_len, 0.0);
                &mut own_y[..]
            }
        };
        // With the argmax kept, the pool takes the bias and the activation (before it: see
        // `pool::forward_images_argmax_act`).
        if argmax.is_some() {
            super::gemm::matmul_bias_act(&d, pk, None, y, s.n * pixels, c, f, Activation::Linear);
        } else {
            super::gemm::matmul_bias_act(&d, pk, bias, y, s.n * pixels, c, f, act);
        }
        match (pooled, argmax) {
            (Some(p), Some(argmax)) => {
                pool::forward_images_argmax_act(y, bias, act, (p, argmax), (s.h, s.w, f));
            }
            (Some(p), None) => pool::maxpool_forward(y, p, &pool),
            _ => {}
        }
        return;
    }
    let blocks = s.n.div_ceil(per_block);
    // Each block's outputs: its rows of `y` (or none), of the pool and of the argmax.
    let block_outputs: Vec<_> = per_block_slices(y, per_block * pixels * f, blocks)
        .into_iter()
        .zip(
            per_block_slices(pooled, per_block * image_pooled, blocks)
                .into_iter()
                .zip(per_block_slices(argmax, per_block * image_pooled, blocks)),
        )
        .collect();
    // Scratch per block: `d`, the stem's output before it, and `y` when it is not written.
    let stem_len = |rows: usize| match src {
        Source::Input(_) => 0,
        Source::Stem(..) => rows * c,
    };
    let own_y = |rows: usize, y: &Option<&mut [f32]>| if y.is_some() { 0 } else { rows * f };
    block_outputs
        .into_par_iter()
        .enumerate()
        .for_each(|(b, (y, (pooled, argmax)))| {
            let images = b * per_block..((b + 1) * per_block).min(s.n);
            let rows = images.len() * pixels;
            with_scratch(rows * c + stem_len(rows) + own_y(rows, &y), |buf| {
                let (d, rest) = buf.split_at_mut(rows * c);
                let (stem_out, scratch_y) = rest.split_at_mut(stem_len(rows));
                let y = match y {
                    Some(y) => y,
                    None => scratch_y,
                };
                let x = src.block(images, pixels * c, stem_out);
                layer.depthwise(x, dk, d);
                gemm_strided(
                    y,
                    rows,
                    f,
                    c,
                    Strided::row_major(d, c),
                    pk_view,
                    false,
                    false,
                );
                let image = pixels * f;
                match (pooled, argmax) {
                    // `y` holds the products alone: the pool applies the bias and the
                    // activation to one value in four.
                    (Some(pooled), Some(argmax)) => pool::forward_images_argmax_act(
                        y,
                        bias,
                        act,
                        (pooled, argmax),
                        (s.h, s.w, f),
                    ),
                    (Some(pooled), None) => {
                        bias_act_rows(y, bias, f, act);
                        for (y, p) in y
                            .chunks_exact(image)
                            .zip(pooled.chunks_exact_mut(image_pooled))
                        {
                            pool::forward_image(y, p, (s.h, s.w, f));
                        }
                    }
                    _ => bias_act_rows(y, bias, f, act),
                }
            });
        });
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::ops::reference::{self as r, assert_close, random_vec, to_f64};
    use crate::ops::spec::PoolShape;

    /// The f64 reference of the composition: depthwise, then the pointwise product with bias
    /// and activation; and its gradients through the reference's own pieces.
    #[test]
    pub(in crate::ops::cpu) fn matches_reference() {
        for (t, (n, h, w, c, f, k)) in [
            (1, 1, 1, 1, 1, 1),
            (3, 7, 7, 3, 5, 3),
            (2, 13, 7, 32, 13, 3),
            (5, 28, 28, 8, 16, 3),
            (9, 7, 7, 64, 128, 3),
            (1, 3, 13, 1, 7, 5),
            (40, 3, 3, 16, 8, 3),
            // Enough blocks for the fused forward pass, a partial last block included.
            (8, 14, 14, 32, 64, 3),
            (26, 7, 7, 64, 128, 3),
        ]
        .into_iter()
        .enumerate()
        {
            for act in [Activation::Selu, Activation::Linear] {
                let s = DepthwiseShape::same(n, h, w, c, k, k);
                let seed = 900 + 10 * t as u64;
                let x = random_vec(s.input_len(), seed);
                let dk = random_vec(s.kernel_len(), seed + 1);
                let pk = random_vec(c * f, seed + 2);
                let bias = random_vec(f, seed + 3);
                let dy = random_vec(n * h * w * f, seed + 4);
                let what = format!("separable {s:?} f {f} {act:?}");

                let d64 = r::depthwise_forward(&to_f64(&x), &to_f64(&dk), &s);
                let rows = n * h * w;
                let (pk64, bias64) = (to_f64(&pk), to_f64(&bias));
                let y64 = r::matmul_bias_act(&d64, &pk64, Some(&bias64), rows, c, f, act);
                let mut y = vec![f32::NAN; rows * f];
                let out = Outputs {
                    y: Some(&mut y),
                    pooled: None,
                    argmax: None,
                };
                separable_forward(Source::Input(&x), &dk, &pk, Some(&bias), out, &s, f, act);
                assert_close(&y, &y64, 1e-4, &format!("{what}: forward"));
                // With the max-pool taken on the way: `y` again, and its pool. (Not bit for
                // bit the first `y`: `kernels_match_the_reference`, running beside this test,
                // forces other SIMD levels on every thread while it runs.)
                let pool = PoolShape { n, h, w, c: f };
                let mut y_again = vec![f32::NAN; y.len()];
                let mut pooled = vec![f32::NAN; pool.output_len()];
                let out = Outputs {
                    y: Some(&mut y_again),
                    pooled: Some(&mut pooled),
                    argmax: None,
                };
                let src = Source::Input(&x);
                separable_forward(src, &dk, &pk, Some(&bias), out, &s, f, act);
                assert_close(
                    &y_again,
                    &y64,
                    1e-4,
                    &format!("{what}: forward with the pool"),
                );
                let pooled64 = r::maxpool_forward(&to_f64(&y_again), &pool);
                assert_close(&pooled, &pooled64, 0.0, &format!("{what}: pooled"));
                assert_argmax_forward(
                    (Source::Input(&x), &dk, &pk, Some(&bias)),
                    (&s, f, act),
                    &y_again,
                    &what,
                );

                // The gradients, from the f32 forward output as the layer passes it: from the
                // output's gradient, and from its max-pool's; `dx` through the activation whose
                // output `x` would be (`act` here too).
                let dp = random_vec(pool.output_len(), seed + 5);
                let dy_pooled = r::maxpool_backward(&to_f64(&y), &to_f64(&dp), &pool);
                for (pooled, dy, dy64) in [(false, &dy, to_f64(&dy)), (true, &dp, dy_pooled)] {
                    let what = format!("{what} pooled {pooled}");
                    let dz64 = r::activation_backward(&dy64, &to_f64(&y), act);
                    let db64 = r::sum_rows(&dz64, rows, f);
                    let dpk64 = r::matmul(&d64, &dz64, c, rows, f, true, false);
                    let dd64 = r::matmul(&dz64, &pk64, rows, f, c, false, true);
                    let ddk64 = r::depthwise_backward_kernel(&to_f64(&x), &dd64, &s);
                    let dx64 = r::depthwise_backward_input(&dd64, &to_f64(&dk), &s);
                    let dx64 = r::activation_backward(&dx64, &to_f64(&x), act);
                    // From `y`, and (pooled) from its pool and argmax.
                    let (pooled_y, argmax) = argmax_of(&y, &pool);
                    let mut kept = vec![Kept::Output(&y)];
                    if pooled {
                        kept.push(Kept::Argmax(pool::Argmax {
                            pooled: &pooled_y,
                            argmax: &argmax,
                        }));
                    }
                    for kept in kept {
                        let mut dx = vec![f32::NAN; x.len()];
                        let mut ddk = vec![f32::NAN; dk.len()];
                        let mut dpk = vec![f32::NAN; pk.len()];
                        let mut db = vec![f32::NAN; f];
                        let grads = SeparableGrads {
                            src: Source::Input(&x),
                            dk: &dk,
                            pk: &pk,
                            kept,
                            dy,
                            act,
                            pooled,
                            input_act: act,
                        };
                        let out = SeparableGradsOut {
                            dx: Some(&mut dx),
                            ddk: &mut ddk,
                            dpk: &mut dpk,
                            db: &mut db,
                            stem: None,
                        };
                        separable_backward(&grads, out, &s, f);
                        let what = format!("{what} argmax {}", matches!(kept, Kept::Argmax(_)));
                        assert_close(&dx, &dx64, 1e-4, &format!("{what}: dx"));
                        assert_close(&ddk, &ddk64, 1e-4, &format!("{what}: d depthwise"));
                        assert_close(&dpk, &dpk64, 1e-4, &format!("{what}: d pointwise"));
                        assert_close(&db, &db64, 1e-4, &format!("{what}: d bias"));
                    }
                }
            }
        }
    }

    /// With a stem: the convolution's output recomputed block by block, against the f64
    /// reference of the three layers, its weight gradients included (both loops: a batch in
    /// blocks and one too small for them; the small-K, im2col and 1×1 products).
    #[test]
    pub(in crate::ops::cpu) fn stem_matches_reference() {
        use crate::ops::spec::{Conv2dShape, Padding};
        for (t, (n, h, w, c_in, c, f, k, padding)) in [
            (9, 28, 28, 1, 32, 16, 3, Padding::Same),
            (2, 5, 6, 1, 4, 3, 3, Padding::Same),
            (12, 9, 11, 3, 8, 5, 5, Padding::Valid),
            (40, 6, 6, 16, 16, 8, 1, Padding::Same),
        ]
        .into_iter()
        .enumerate()
        {
            let cs = Conv2dShape {
                n,
                h,
                w,
                c_in,
                c_out: c,
                kh: k,
                kw: k,
                padding,
                strides: [1, 1],
                dilation: [1, 1],
            };
            let (oh, ow) = cs.out_hw();
            let s = DepthwiseShape::same(n, oh, ow, c, 3, 3);
            let pool = PoolShape {
                n,
                h: oh,
                w: ow,
                c: f,
            };
            let (act0, act) = [
                (Activation::Selu, Activation::Selu),
                (Activation::Relu, Activation::Linear),
            ][t % 2];
            let seed = 950 + 10 * t as u64;
            let x = random_vec(cs.input_len(), seed);
            let ck = random_vec(cs.kernel_len(), seed + 1);
            let cb = random_vec(c, seed + 2);
            let dk = random_vec(s.kernel_len(), seed + 3);
            let pk = random_vec(c * f, seed + 4);
            let dp = random_vec(pool.output_len(), seed + 5);
            let stem = Stem {
                kernel: &ck,
                bias: Some(&cb),
                s: cs,
                act: act0,
            };
            let what = format!("stem {cs:?} f {f} {act0:?} {act:?}");
            let src = Source::Stem(&x, &stem);
            let mut y = vec![f32::NAN; n * oh * ow * f];
            let mut pooled = vec![f32::NAN; pool.output_len()];
            let out = Outputs {
                y: Some(&mut y),
                pooled: Some(&mut pooled),
                argmax: None,
            };
            separable_forward(src, &dk, &pk, None, out, &s, f, act);
            let x64 = to_f64(&x);
            let a64 = r::conv2d_forward(&x64, &to_f64(&ck), Some(&to_f64(&cb)), &cs, act0);
            let d64 = r::depthwise_forward(&a64, &to_f64(&dk), &s);
            let rows = n * oh * ow;
            let y64 = r::matmul_bias_act(&d64, &to_f64(&pk), None, rows, c, f, act);
            assert_close(&y, &y64, 1e-4, &format!("{what}: forward"));
            let pooled64 = r::maxpool_forward(&to_f64(&y), &pool);
            assert_close(&pooled, &pooled64, 0.0, &format!("{what}: pooled"));
            assert_argmax_forward((src, &dk, &pk, None), (&s, f, act), &y, &what);

            let y32 = to_f64(&y);
            let dy64 = r::maxpool_backward(&y32, &to_f64(&dp), &pool);
            let dz64 = r::activation_backward(&dy64, &y32, act);
            let dd64 = r::matmul(&dz64, &to_f64(&pk), rows, f, c, false, true);
            let da64 = r::depthwise_backward_input(&dd64, &to_f64(&dk), &s);
            let dza64 = r::activation_backward(&da64, &a64, act0);
            let (pooled_y, argmax) = argmax_of(&y, &pool);
            let from_argmax = Kept::Argmax(pool::Argmax {
                pooled: &pooled_y,
                argmax: &argmax,
            });
            for kept in [Kept::Output(&y), from_argmax] {
                let mut grads = [dk.len(), pk.len(), f, ck.len(), c].map(|l| vec![f32::NAN; l]);
                let [ddk, dpk, db, dck, dcb] = &mut grads;
                let a = SeparableGrads {
                    src,
                    dk: &dk,
                    pk: &pk,
                    kept,
                    dy: &dp,
                    act,
                    pooled: true,
                    input_act: Activation::Linear,
                };
                let out = SeparableGradsOut {
                    dx: None,
                    ddk,
                    dpk,
                    db,
                    stem: Some((dck, dcb)),
                };
                separable_backward(&a, out, &s, f);
                let what = format!("{what} argmax {}", matches!(kept, Kept::Argmax(_)));
                let expected = [
                    r::depthwise_backward_kernel(&a64, &dd64, &s),
                    r::matmul(&d64, &dz64, c, rows, f, true, false),
                    r::sum_rows(&dz64, rows, f),
                    r::conv2d_backward_kernel(&x64, &dza64, &cs),
                    r::bias_grad(&dza64, c),
                ];
                let names = [
                    "d depthwise",
                    "d pointwise",
                    "d bias",
                    "d conv",
                    "d conv bias",
                ];
                for ((got, expected), name) in grads.iter().zip(&expected).zip(names) {
                    assert_close(got, expected, 1e-4, &format!("{what}: {name}"));
                }
            }
        }
    }

    /// The pool of `y` (`[n, h, w, c]` as `pool` says) and its argmax, image by image.
    fn argmax_of(y: &[f32], pool: &PoolShape) -> (Vec<f32>, Vec<i32>) {
        let (mut pooled, mut argmax) = (vec![0.0; pool.output_len()], vec![-1; pool.output_len()]);
        pool::forward_images_argmax_act(
            y,
            None,
            Activation::Linear,
            (&mut pooled, &mut argmax),
            (pool.h, pool.w, pool.c),
        );
        (pooled, argmax)
    }

    /// The forward pass that writes the pool and its argmax instead of `y`: the same pool as
    /// from `y` (another run's, so within rounding: see `matches_reference`), and each argmax
    /// a position in its window whose value in `y` is the window's maximum.
    fn assert_argmax_forward(
        (src, dk, pk, bias): (Source<'_>, &[f32], &[f32], Option<&[f32]>),
        (s, f, act): (&DepthwiseShape, usize, Activation),
        y: &[f32],
        what: &str,
    ) {
        let pool = PoolShape {
            n: s.n,
            h: s.h,
            w: s.w,
            c: f,
        };
        let mut pooled = vec![f32::NAN; pool.output_len()];
        let mut argmax = vec![-1i32; pool.output_len()];
        let out = Outputs {
            y: None,
            pooled: Some(&mut pooled),
            argmax: Some(&mut argmax),
        };
        separable_forward(src, dk, pk, bias, out, s, f, act);
        let pooled64 = r::maxpool_forward(&to_f64(y), &pool);
        assert_close(
            &pooled,
            &pooled64,
            1e-5,
            &format!("{what}: pooled with argmax"),
        );
        let (ow, image_pooled) = (s.w / 2, pool.output_len() / s.n.max(1));
        for (e, &a) in argmax.iter().enumerate() {
            let (k, i, j, ch) = (
                e / image_pooled,
                e % image_pooled / (ow * f),
                e / f % ow,
                e % f,
            );
            assert!((0..4).contains(&a), "{what}: argmax {a} at {e}");
            let (di, dj) = (a as usize / 2, a as usize % 2);
            let at = ((k * s.h + 2 * i + di) * s.w + 2 * j + dj) * f + ch;
            let tolerance = 1e-5 * (1.0 + pooled64[e].abs());
            assert!(
                (f64::from(y[at]) - pooled64[e]).abs() <= tolerance,
                "{what}: argmax at {e}"
            );
        }
    }
}
