//! The gradients of the fused separable layer ([`separable_backward`]), block by block: the
//! depthwise output recomputed, the pointwise products with `dz` (dense, or from a pool's
//! compact gradient, see `routed.rs`), the depthwise kernel's and input's gradients.

use rayon::prelude::*;

use crate::ops::cpu::conv::conv2d_weight_grads_serial;
use crate::ops::cpu::depthwise::{correlate_image, flipped, kernel_grad_image};
use crate::ops::cpu::elementwise::{act_backward_in_place, act_backward_leaf};
use crate::ops::cpu::gemm::{gemm_strided, Strided};
use crate::ops::cpu::pool;
use crate::ops::cpu::reduce::add_rows_leaf;
use crate::ops::cpu::routed::{self, Images, Routed};
use crate::ops::spec::{Activation, DepthwiseShape};

use super::{images_per_block, Layer, Source};

/// The gradients of [`separable_forward`](super::separable_forward) from `dy` (w.r.t. the activated output `y`): with
/// `dz = dy * act'(y)`, `db = Σ dz`, `dpk = dᵀ · dz`, `dd = dz · pkᵀ`, `ddk` the depthwise
/// kernel gradient of `dd` and, when `dx` is given, `dx` its input gradient.
///
/// With `pooled`, `dy` is the gradient w.r.t. the 2×2 max-pool of `y` (`[n, h / 2, w / 2, f]`),
/// routed to each window's maximum block by block: the layer's full-size `dy` is never written
/// to memory, and `y` is read once for both the routing and `act'`.
///
/// With a [`Stem`](super::Stem), its output is recomputed block by block, and the input gradient, through
/// the stem's activation, gives the stem's kernel and bias gradients in the same block.
///
/// Image ranges run in parallel, each with its own partial `dpk`, `db` and `ddk` (the last in
/// f64, as in `depthwise_backward_kernel`), added in range order at the end: the same result on
/// every run with the same number of threads.
pub(crate) struct SeparableGrads<'a> {
    /// The layer's input `[n, h, w, c]`, or its stem's input.
    pub src: Source<'a>,
    /// Depthwise kernel `[kh, kw, c]`.
    pub dk: &'a [f32],
    /// Pointwise kernel `[c, f]`.
    pub pk: &'a [f32],
    /// What the forward pass kept of the activated output.
    pub kept: Kept<'a>,
    /// Its gradient, or that of its max-pool when `pooled`.
    pub dy: &'a [f32],
    /// The activation.
    pub act: Activation,
    /// Whether `dy` is the gradient w.r.t. `max_pool2d(y)` (2×2, stride 2, 'valid').
    pub pooled: bool,
    /// The activation whose output `x` is (the layer before's): `dx` is multiplied by its
    /// gradient as it is written, so that layer's backward pass starts from its `dz` without
    /// reading its output again. `Linear` for a plain `dx`. (A stem's activation is its own.)
    pub input_act: Activation,
}

/// What [`separable_backward`] reads of the forward pass's output.
#[derive(Clone, Copy)]
pub(crate) enum Kept<'a> {
    /// The activated output `[n, h, w, f]`.
    Output(&'a [f32]),
    /// Its 2×2 max-pool and where each window's maximum is (`pooled` only): what
    /// [`separable_forward`](super::separable_forward) writes with an `argmax`.
    Argmax(pool::Argmax<'a>),
}

/// The outputs of [`separable_backward`].
pub(crate) struct SeparableGradsOut<'a> {
    /// Gradient w.r.t. `x` (skipped when `None`; always `None` with a stem, whose input
    /// gradient is not computed).
    pub dx: Option<&'a mut [f32]>,
    /// Gradient w.r.t. the depthwise kernel.
    pub ddk: &'a mut [f32],
    /// Gradient w.r.t. the pointwise kernel.
    pub dpk: &'a mut [f32],
    /// Gradient w.r.t. the bias.
    pub db: &'a mut [f32],
    /// With a stem: the gradients w.r.t. its kernel and its bias (`[c]`, given even when the
    /// stem has no bias).
    pub stem: Option<(&'a mut [f32], &'a mut [f32])>,
}

/// One task's partial sums of [`separable_backward`]'s weight gradients.
struct Partial {
    dpk: Vec<f32>,
    /// `dpk` transposed (`[f, c]`), as the routed products write it (empty otherwise).
    dpk_t: Vec<f32>,
    db: Vec<f32>,
    ddk: Vec<f64>,
    /// The stem's kernel and bias gradients (empty without a stem).
    stem_dk: Vec<f32>,
    stem_db: Vec<f64>,
}

/// See [`SeparableGrads`].
pub(crate) fn separable_backward(
    a: &SeparableGrads<'_>,
    out: SeparableGradsOut<'_>,
    s: &DepthwiseShape,
    f: usize,
) {
    let what = "separable_backward";
    let x_len = a.src.input_len(s, what);
    let y_len = s.n * s.h * s.w * f;
    // Per image: the gradient of the max-pool of `y` when `pooled`.
    let image_pooled = (s.h / 2) * (s.w / 2) * f;
    let y = match a.kept {
        Kept::Output(y) => Some(y),
        Kept::Argmax(kept) => {
            assert!(
                a.pooled
                    && kept.pooled.len() == s.n * image_pooled
                    && kept.argmax.len() == kept.pooled.len(),
                "{what}: an argmax needs the pooled gradient and the pool's shape"
            );
            None
        }
    };
    let layer = Layer::new(
        s,
        f,
        [x_len, a.dk.len(), a.pk.len(), y.map_or(y_len, <[f32]>::len)],
        what,
    );
    assert_eq!(
        a.dy.len(),
        if a.pooled { s.n * image_pooled } else { y_len },
        "{what}: dy does not match the output (pooled: {})",
        a.pooled
    );
    assert!(
        out.ddk.len() == a.dk.len()
            && out.dpk.len() == a.pk.len()
            && out.db.len() == f
            && out.dx.as_ref().is_none_or(|dx| dx.len() == x_len),
        "{what}: gradient lengths do not match the shape"
    );
    let stem = match (a.src, out.stem) {
        (Source::Stem(x0, stem), Some((dk, db))) => {
            assert!(
                out.dx.is_none(),
                "{what}: a stem's input gradient is not computed"
            );
            assert!(
                dk.len() == stem.kernel.len() && db.len() == stem.s.c_out,
                "{what}: the stem's gradient lengths do not match its shape"
            );
            Some((x0, stem, dk, db))
        }
        (Source::Input(_), None) => None,
        _ => panic!("{what}: a stem needs its gradients, and only a stem has them"),
    };
    let (c, pixels) = (layer.c, layer.pixels);
    let image_in = pixels * c;
    let sh = BlockShape {
        s: *s,
        f,
        c,
        pixels,
        y,
    };
    let (stem_k, stem_c) = stem
        .as_ref()
        .map_or((0, 0), |(_, t, ..)| (t.kernel.len(), c));
    if image_in == 0 || s.n == 0 || f == 0 {
        out.ddk.fill(0.0);
        out.dpk.fill(0.0);
        out.db.fill(0.0);
        if let Some(dx) = out.dx {
            dx.fill(0.0);
        }
        if let Some((_, _, dk, db)) = stem {
            dk.fill(0.0);
            db.fill(0.0);
        }
        return;
    }
    let (flipped_dk, flipped_g) = flipped(a.dk, layer.g);
    // Below a pool, `dz` is zero but at each window's maximum: its two products read the
    // pool's compact gradient instead (`routed.rs`), with the pointwise kernel transposed.
    let routed = a.pooled && routed::supports(c);
    let pk_t: Vec<f32> = if routed {
        (0..f * c).map(|e| a.pk[(e % c) * f + e / c]).collect()
    } else {
        Vec::new()
    };
    let per_block = images_per_block(pixels);
    let tasks = (2 * rayon::current_num_threads()).min(s.n.div_ceil(per_block));
    let images_per_task = s.n.div_ceil(tasks);
    let dx_parts: Vec<Option<&mut [f32]>> = match out.dx {
        Some(dx) => dx
            .chunks_mut(images_per_task * image_in)
            .map(Some)
            .collect(),
        None => (0..s.n.div_ceil(images_per_task)).map(|_| None).collect(),
    };
    let partials: Vec<Partial> = dx_parts
        .into_par_iter()
        .enumerate()
        .map(|(t, mut dx)| {
            let images = t * images_per_task..((t + 1) * images_per_task).min(s.n);
            let mut p = Partial {
                dpk: vec![0.0f32; if routed { 0 } else { c * f }],
                dpk_t: vec![0.0f32; if routed { f * c } else { 0 }],
                db: vec![0.0f32; f],
                ddk: vec![0.0f64; a.dk.len()],
                stem_dk: vec![0.0f32; stem_k],
                stem_db: vec![0.0f64; stem_c],
            };
            let mut ddk_image = vec![0.0f32; a.dk.len()];
            let block = per_block * pixels;
            // `d`, then its gradient in the same buffer; `dz` (dense products only); with a
            // stem, its output and the gradient of its pre-activation output.
            let dz_len = if routed { 0 } else { block * f };
            let (mut d, mut dz) = (vec![0.0f32; block * c], vec![0.0f32; dz_len]);
            let (mut stem_out, mut stem_dz) =
                (vec![0.0f32; block * stem_c], vec![0.0f32; block * stem_c]);
            // The routed gradient of a block's windows.
            let windows = if routed { per_block * image_pooled } else { 0 };
            let (mut g, mut q, mut at) = (
                vec![0.0f32; windows],
                vec![0u8; windows],
                vec![0u32; windows],
            );
            for (b, n0) in images.clone().step_by(per_block).enumerate() {
                let n1 = (n0 + per_block).min(images.end);
                let rows = (n1 - n0) * pixels;
                let d = &mut d[..rows * c];
                let x = a.src.block(n0..n1, image_in, &mut stem_out);
                layer.depthwise(x, a.dk, d);
                let block = Block {
                    images: n0..n1,
                    first: b == 0,
                };
                if routed {
                    let scratch = (&mut g[..], &mut q[..], &mut at[..]);
                    routed_products(a, &sh, &block, scratch, (&pk_t, &mut p), d);
                } else {
                    dense_products(a, &sh, &block, &mut dz[..rows * f], &mut p, d);
                }
                let dd = &*d;
                for (x, dd) in x.chunks_exact(image_in).zip(dd.chunks_exact(image_in)) {
                    ddk_image.fill(0.0);
                    kernel_grad_image(x, dd, &mut ddk_image, layer.g);
                    for (t, &v) in p.ddk.iter_mut().zip(&ddk_image) {
                        *t += f64::from(v);
                    }
                }
                let (dx, input_act) = match (&stem, dx.as_deref_mut()) {
                    (Some((.., t, _, _)), _) => (&mut stem_dz[..rows * c], t.act),
                    (None, Some(dx)) => {
                        let at = (n0 - images.start) * image_in;
                        (&mut dx[at..at + rows * c], a.input_act)
                    }
                    (None, None) => continue,
                };
                let images_dx = dx.chunks_exact_mut(image_in).zip(dd.chunks_exact(image_in));
                for ((dx, dd), x) in images_dx.zip(x.chunks_exact(image_in)) {
                    correlate_image(dd, &flipped_dk, dx, flipped_g);
                    if input_act != Activation::Linear {
                        act_backward_in_place(dx, x, input_act);
                    }
                }
                if let Some((x0, stem, ..)) = &stem {
                    let (x0, shape) = stem.block(x0, n0..n1);
                    let grads = (&mut p.stem_dk[..], &mut p.stem_db[..]);
                    conv2d_weight_grads_serial(x0, dx, grads, &shape);
                }
            }
            p
        })
        .collect();
    out.dpk.fill(0.0);
    out.db.fill(0.0);
    let mut ddk = vec![0.0f64; a.dk.len()];
    let (mut stem_dk, mut stem_db) = (vec![0.0f32; stem_k], vec![0.0f64; stem_c]);
    for p in &partials {
        out.dpk.iter_mut().zip(&p.dpk).for_each(|(a, b)| *a += b);
        for (j, row) in p.dpk_t.chunks_exact(c).enumerate() {
            for (i, &v) in row.iter().enumerate() {
                out.dpk[i * f + j] += v;
            }
        }
        out.db.iter_mut().zip(&p.db).for_each(|(a, b)| *a += b);
        ddk.iter_mut().zip(&p.ddk).for_each(|(a, b)| *a += b);
        stem_dk
            .iter_mut()
            .zip(&p.stem_dk)
            .for_each(|(a, b)| *a += b);
        stem_db
            .iter_mut()
            .zip(&p.stem_db)
            .for_each(|(a, b)| *a += b);
    }
    out.ddk
        .iter_mut()
        .zip(&ddk)
        .for_each(|(d, &t)| *d = t as f32);
    if let Some((_, _, dk, db)) = stem {
        dk.copy_from_slice(&stem_dk);
        db.iter_mut()
            .zip(&stem_db)
            .for_each(|(d, &t)| *d = t as f32);
    }
}

/// A layer's sizes as the per-block steps need them.
struct BlockShape<'a> {
    s: DepthwiseShape,
    f: usize,
    c: usize,
    pixels: usize,
    /// The activated output when the forward pass kept it.
    y: Option<&'a [f32]>,
}

impl BlockShape<'_> {
    /// Elements of one image's output.
    fn image_out(&self) -> usize {
        self.pixels * self.f
    }

    /// Elements of one image's pooled output.
    fn image_pooled(&self) -> usize {
        (self.s.h / 2) * (self.s.w / 2) * self.f
    }
}

/// A block of whole images, `images` of the batch; `first`: the task's first block (its
/// products write the partial sums rather than add to them).
struct Block {
    images: std::ops::Range<usize>,
    first: bool,
}

/// A pooled block's pointwise products from the pool's compact gradient: routes `dy` (the
/// pooled gradient) to the windows' maxima into `g`, `q`, `at` (the bias sums on the way),
/// adds `dᵀ · dz` to `p.dpk_t` and replaces `d`, the depthwise output, with `dz · pkᵀ`.
fn routed_products(
    a: &SeparableGrads<'_>,
    sh: &BlockShape<'_>,
    block: &Block,
    (g, q, at): (&mut [f32], &mut [u8], &mut [u32]),
    (pk_t, p): (&[f32], &mut Partial),
    d: &mut [f32],
) {
    let (s, f, image_pooled) = (&sh.s, sh.f, sh.image_pooled());
    let Block { images, .. } = block;
    let entries = images.len() * image_pooled;
    let (g, q, at) = (&mut g[..entries], &mut q[..entries], &mut at[..entries]);
    for (j, n) in images.clone().enumerate() {
        let e = j * image_pooled..(j + 1) * image_pooled;
        let pooled = n * image_pooled..(n + 1) * image_pooled;
        let dp = &a.dy[pooled.clone()];
        let out = pool::Compact {
            g: &mut g[e.clone()],
            q: &mut q[e.clone()],
            at: &mut at[e],
        };
        let place = pool::Placement {
            first_pixel: j * sh.pixels,
            stride: sh.c,
        };
        // The bias sums on the way, from the windows' gradients.
        let sums = (a.act, &mut p.db[..]);
        match a.kept {
            Kept::Output(y) => {
                let y = &y[n * sh.image_out()..][..sh.image_out()];
                pool::route_image(y, dp, (s.h, s.w, f), sums, out, place);
            }
            Kept::Argmax(kept) => {
                let kept = pool::Argmax {
                    pooled: &kept.pooled[pooled.clone()],
                    argmax: &kept.argmax[pooled],
                };
                pool::route_image_argmax(kept, dp, (s.h, s.w, f), sums, out, place);
            }
        }
    }
    let r = Routed { g, q, at, f };
    routed::weight_grad(d, sh.c, &r, &mut p.dpk_t);
    // `d` is spent: its buffer takes the gradient `dd = dz · pkᵀ`.
    let im = Images {
        n: images.len(),
        h: s.h,
        w: s.w,
    };
    routed::input_grad(&r, pk_t, sh.c, im, d);
}

/// A block's pointwise products as dense ones: `dz` from `dy` (routed through the pool when
/// pooled, or through `act'`) into `dz` unless `dy` is it, the bias sums, `dᵀ · dz` into
/// `p.dpk`, and `d` replaced with `dz · pkᵀ`.
fn dense_products(
    a: &SeparableGrads<'_>,
    sh: &BlockShape<'_>,
    block: &Block,
    dz: &mut [f32],
    p: &mut Partial,
    d: &mut [f32],
) {
    let (s, f, c) = (&sh.s, sh.f, sh.c);
    let (image_out, image_pooled) = (sh.image_out(), sh.image_pooled());
    let images = &block.images;
    let outs = images.start * image_out..images.end * image_out;
    let rows = images.len() * sh.pixels;
    let dz: &[f32] = if a.pooled {
        for (n, dz) in images.clone().zip(dz.chunks_exact_mut(image_out)) {
            let pooled = n * image_pooled..(n + 1) * image_pooled;
            let dp = &a.dy[pooled.clone()];
            // The bias sums on the way, from the windows' gradients.
            let sums = (a.act, &mut p.db[..]);
            match a.kept {
                Kept::Output(y) => {
                    let y = &y[n * image_out..][..image_out];
                    pool::backward_image(y, dp, dz, (s.h, s.w, f), sums);
                }
                Kept::Argmax(kept) => {
                    let kept = pool::Argmax {
                        pooled: &kept.pooled[pooled.clone()],
                        argmax: &kept.argmax[pooled],
                    };
                    pool::backward_image_argmax(kept, dp, dz, (s.h, s.w, f), sums);
                }
            }
        }
        dz
    } else if a.act == Activation::Linear {
        // `dy` is `dz` (a pre-activated gradient, or no activation).
        &a.dy[outs]
    } else {
        // Not pooled: the output itself was kept (`separable_backward` checked).
        let y = sh.y.expect("only a pooled layer keeps an argmax");
        act_backward_leaf(&a.dy[outs.clone()], &y[outs], dz, a.act);
        dz
    };
    if !a.pooled {
        add_rows_leaf(dz, f, &mut p.db);
    }
    let dz_view = Strided::row_major(dz, f);
    let d_t = Strided::transposed(d, c);
    gemm_strided(&mut p.dpk, c, f, rows, d_t, dz_view, !block.first, false);
    // `d` is spent: its buffer takes the gradient `dd = dz · pkᵀ`.
    let pk_view_t = Strided::transposed(a.pk, f);
    gemm_strided(d, rows, c, f, dz_view, pk_view_t, false, false);
}
