//! A 2×2 max-pool's gradient in compact form (one entry per window and channel, where the
//! dense gradient has four, three of them zero), for the products that read it
//! (`routed.rs`); and the backward pass from the argmax a forward pass kept
//! ([`forward_images_argmax_act`](super::forward_images_argmax_act)) instead of the pool's
//! input.

use crate::ops::spec::Activation;

use super::{activation, window_gradient, BackwardRow};
use crate::ops::cpu::elementwise::act_grad;

/// A 2×2 max-pool's input gradient in compact form, for products that read it (`routed.rs`):
/// one entry per window and channel (`window * c + channel`, windows in pooled-output order),
/// where the dense gradient has four, three of them zero.
pub(crate) struct Compact<'a> {
    /// The window's gradient (times `act'` at its maximum, see [`backward_image`](super::backward_image)).
    pub g: &'a mut [f32],
    /// Where the window's first maximum is: 0 (0,0), 1 (0,1), 2 (1,0), 3 (1,1).
    pub q: &'a mut [u8],
    /// That pixel's offset in a `[pixels, stride]` matrix of the layer's block (see
    /// [`route_image`]).
    pub at: &'a mut [u32],
}

impl Compact<'_> {
    /// Checks the lengths of an image's compact gradient, its `dy` and `sums` against its
    /// shape, and that every offset, the last pixel's included, fits in u32.
    fn check(
        &self,
        (dy, sums): (usize, usize),
        (h, w, c): (usize, usize, usize),
        place: Placement,
    ) {
        let entries = (h / 2) * (w / 2) * c;
        assert!(
            dy == entries
                && self.g.len() == entries
                && self.q.len() == entries
                && self.at.len() == entries,
            "maxpool_backward: compact image slices do not match [{h}, {w}, {c}]"
        );
        assert_eq!(sums, c, "maxpool_backward: sums must have c elements");
        let end = (place.first_pixel + h * w)
            .checked_mul(place.stride)
            .filter(|&e| u32::try_from(e).is_ok());
        assert!(
            end.is_some(),
            "maxpool_backward: a block too large for u32 offsets"
        );
    }
}

/// The pixel at position `q` (0..=3, see [`Compact::q`]) of the window whose first pixel is
/// `p00`, in an image `w` pixels wide.
#[inline(always)]
fn window_pixel(p00: u32, q: u32, w: u32) -> u32 {
    p00 + (q & 1) + (q >> 1) * w
}

/// Where [`route_image`]'s image lies in its block: its first pixel's index there, and the
/// row length (`stride`) of the matrices [`Compact::at`] indexes.
#[derive(Clone, Copy)]
pub(crate) struct Placement {
    pub first_pixel: usize,
    pub stride: usize,
}

multiversion! {
    /// [`route_row`](super::route_row) into compact form: the windows of one output row, their first pixel
    /// `p00` (the pixel index of input element (2i, 0) in the block) and the image width `w`.
    fn route_row_compact(src: BackwardRow<'_>, out: Compact<'_>, c: usize, act: Activation, sums: &mut [f32], place: (u32, u32, u32)) {
        const LINEAR: u8 = Activation::Linear as u8;
        const RELU: u8 = Activation::Relu as u8;
        const SELU: u8 = Activation::Selu as u8;
        match act {
            Activation::Linear => route_compact::<LINEAR>(src, out, c, sums, place),
            Activation::Relu => route_compact::<RELU>(src, out, c, sums, place),
            Activation::Selu => route_compact::<SELU>(src, out, c, sums, place),
        }
    }
}

/// [`route_row_compact`] for the activation `ACT` (see [`route_row`](super::route_row)); always adds to `sums`.
#[inline(always)]
fn route_compact<const ACT: u8>(
    src: BackwardRow<'_>,
    out: Compact<'_>,
    c: usize,
    sums: &mut [f32],
    (p00, w, stride): (u32, u32, u32),
) {
    let act = activation::<ACT>();
    let BackwardRow { r0, r1, dy } = src;
    let windows = r0
        .chunks_exact(2 * c)
        .zip(r1.chunks_exact(2 * c))
        .zip(dy.chunks_exact(c))
        .zip(out.g.chunks_exact_mut(c))
        .zip(out.q.chunks_exact_mut(c).zip(out.at.chunks_exact_mut(c)));
    let sums = &mut sums[..c];
    for (j, ((((a, b), dy), g_out), (q_out, at_out))) in windows.enumerate() {
        let (a0, a1) = a.split_at(c);
        let (b0, b1) = b.split_at(c);
        // Equal lengths, visible to the optimizer: no bounds checks in the loop.
        let (a1, b0, b1, dy) = (&a1[..c], &b0[..c], &b1[..c], &dy[..c]);
        let (g_out, q_out, at_out) = (&mut g_out[..c], &mut q_out[..c], &mut at_out[..c]);
        let p = p00 + 2 * j as u32;
        for i in 0..c {
            let (g, [_, t01, t10, t11]) = window_gradient(a0[i], a1[i], b0[i], b1[i], dy[i], act);
            sums[i] += g;
            g_out[i] = g;
            let q = u32::from(t01) + 2 * u32::from(t10) + 3 * u32::from(t11);
            q_out[i] = q as u8;
            at_out[i] = window_pixel(p, q, w) * stride;
        }
    }
}

/// [`backward_image`](super::backward_image) in compact form: the gradient of one image `y` `[h, w, c]` from its
/// pooled gradient `dy`, one entry per window and channel in `out` (`(h / 2) * (w / 2) * c`
/// each), with its bias sums added to `sums` (`[c]`). `at` indexes the pixels of a block in
/// which this image starts at `place.first_pixel`, in rows of `place.stride`.
pub(crate) fn route_image(
    y: &[f32],
    dy: &[f32],
    (h, w, c): (usize, usize, usize),
    (act, sums): (Activation, &mut [f32]),
    out: Compact<'_>,
    place: Placement,
) {
    let row = w * c;
    let (oh, ow) = (h / 2, w / 2);
    let entries = oh * ow * c;
    assert_eq!(
        y.len(),
        h * row,
        "maxpool_backward: y does not match [{h}, {w}, {c}]"
    );
    out.check((dy.len(), sums.len()), (h, w, c), place);
    if entries == 0 {
        return;
    }
    let Compact { g, q, at } = out;
    let rows = g
        .chunks_exact_mut(ow * c)
        .zip(q.chunks_exact_mut(ow * c))
        .zip(at.chunks_exact_mut(ow * c))
        .zip(dy.chunks_exact(ow * c));
    for (i, (((g, q), at), dy)) in rows.enumerate() {
        let src = BackwardRow {
            r0: &y[2 * i * row..(2 * i + 1) * row],
            r1: &y[(2 * i + 1) * row..(2 * i + 2) * row],
            dy,
        };
        // In range of u32 by the assert above.
        let p00 = (place.first_pixel + 2 * i * w) as u32;
        let out = Compact { g, q, at };
        route_row_compact(
            src,
            out,
            c,
            act,
            &mut *sums,
            (p00, w as u32, place.stride as u32),
        );
    }
}

/// The pool's output and where each window's maximum was, as [`forward_images_argmax_act`](super::forward_images_argmax_act) keeps
/// them: what the backward pass routes from instead of the pool's input.
#[derive(Clone, Copy)]
pub(crate) struct Argmax<'a> {
    pub pooled: &'a [f32],
    pub argmax: &'a [i32],
}

multiversion! {
    /// [`route_row_compact`] from the pooled row's maxima and their positions.
    fn route_row_argmax(src: (Argmax<'_>, &[f32]), out: Compact<'_>, act: Activation, sums: &mut [f32], place: (u32, u32, u32)) {
        const LINEAR: u8 = Activation::Linear as u8;
        const RELU: u8 = Activation::Relu as u8;
        const SELU: u8 = Activation::Selu as u8;
        match act {
            Activation::Linear => route_argmax::<LINEAR>(src, out, sums, place),
            Activation::Relu => route_argmax::<RELU>(src, out, sums, place),
            Activation::Selu => route_argmax::<SELU>(src, out, sums, place),
        }
    }
}

/// [`route_row_argmax`] for the activation `ACT` (see [`route_row`](super::route_row)).
#[inline(always)]
fn route_argmax<const ACT: u8>(
    (kept, dy): (Argmax<'_>, &[f32]),
    out: Compact<'_>,
    sums: &mut [f32],
    (p00, w, stride): (u32, u32, u32),
) {
    let act = activation::<ACT>();
    let c = sums.len();
    let windows = kept
        .pooled
        .chunks_exact(c)
        .zip(kept.argmax.chunks_exact(c))
        .zip(dy.chunks_exact(c))
        .zip(out.g.chunks_exact_mut(c))
        .zip(out.q.chunks_exact_mut(c).zip(out.at.chunks_exact_mut(c)));
    for (j, ((((m, argmax), dy), g_out), (q_out, at_out))) in windows.enumerate() {
        let (argmax, dy) = (&argmax[..c], &dy[..c]);
        let (g_out, q_out, at_out) = (&mut g_out[..c], &mut q_out[..c], &mut at_out[..c]);
        let p = p00 + 2 * j as u32;
        for (i, (&m, sum)) in m.iter().zip(sums.iter_mut()).enumerate() {
            let g = act_grad(dy[i], m, act);
            *sum += g;
            g_out[i] = g;
            // Positions are 0..=3; the mask keeps a corrupt one inside the window.
            let q = (argmax[i] as u32) & 3;
            q_out[i] = q as u8;
            at_out[i] = window_pixel(p, q, w) * stride;
        }
    }
}

/// [`route_image`] from what [`forward_images_argmax_act`](super::forward_images_argmax_act) kept of the image (its pooled output and
/// the maxima's positions, `(h / 2) * (w / 2) * c` each) instead of its full-size output.
pub(crate) fn route_image_argmax(
    kept: Argmax<'_>,
    dy: &[f32],
    (h, w, c): (usize, usize, usize),
    (act, sums): (Activation, &mut [f32]),
    out: Compact<'_>,
    place: Placement,
) {
    let (oh, ow) = (h / 2, w / 2);
    let entries = oh * ow * c;
    assert!(
        kept.pooled.len() == entries && kept.argmax.len() == entries,
        "maxpool_backward: the kept pool does not match [{h}, {w}, {c}]"
    );
    out.check((dy.len(), sums.len()), (h, w, c), place);
    if entries == 0 {
        return;
    }
    let row = ow * c;
    let Compact { g, q, at } = out;
    let rows = g
        .chunks_exact_mut(row)
        .zip(q.chunks_exact_mut(row))
        .zip(at.chunks_exact_mut(row))
        .enumerate();
    for (i, ((g, q), at)) in rows {
        let r = i * row..(i + 1) * row;
        let src = Argmax {
            pooled: &kept.pooled[r.clone()],
            argmax: &kept.argmax[r.clone()],
        };
        // In range of u32 by the assert above.
        let p00 = (place.first_pixel + 2 * i * w) as u32;
        let out = Compact { g, q, at };
        let place = (p00, w as u32, place.stride as u32);
        route_row_argmax((src, &dy[r]), out, act, &mut *sums, place);
    }
}

/// [`backward_image`](super::backward_image) from what [`forward_images_argmax_act`](super::forward_images_argmax_act) kept: `dx` `[h, w, c]` gets each
/// window's gradient at its maximum and zeros elsewhere.
pub(crate) fn backward_image_argmax(
    kept: Argmax<'_>,
    dy: &[f32],
    dx: &mut [f32],
    (h, w, c): (usize, usize, usize),
    (act, sums): (Activation, &mut [f32]),
) {
    let entries = (h / 2) * (w / 2) * c;
    assert_eq!(
        dx.len(),
        h * w * c,
        "maxpool_backward: dx does not match [{h}, {w}, {c}]"
    );
    let (mut g, mut q, mut at) = (
        vec![0.0f32; entries],
        vec![0u8; entries],
        vec![0u32; entries],
    );
    let out = Compact {
        g: &mut g,
        q: &mut q,
        at: &mut at,
    };
    let place = Placement {
        first_pixel: 0,
        stride: c,
    };
    route_image_argmax(kept, dy, (h, w, c), (act, sums), out, place);
    dx.fill(0.0);
    for (e, (&g, &at)) in g.iter().zip(&at).enumerate() {
        dx[at as usize + e % c.max(1)] = g;
    }
}

#[cfg(test)]
pub(in crate::ops::cpu) mod tests {
    use super::*;
    use crate::ops::cpu::pool::backward_image;
    use crate::ops::reference::{assert_close, random_vec, to_f64};

    /// The compact routing against the dense one: each window's gradient sits where `q` and
    /// `at` say, the other three pixels get zero, and the sums agree; for an image that is not
    /// the first of its block, in rows of another stride; ties included (few distinct values).
    #[test]
    pub(in crate::ops::cpu) fn compact_routing_matches_the_dense_one() {
        for (t, (h, w, c)) in [(2, 2, 1), (7, 5, 3), (28, 28, 32), (6, 4, 70), (1, 4, 2)]
            .into_iter()
            .enumerate()
        {
            let seed = 850 + 10 * t as u64;
            // Values on a coarse grid, so that windows have ties.
            let y: Vec<f32> = random_vec(h * w * c, seed)
                .iter()
                .map(|v| (v * 4.0).round())
                .collect();
            let (oh, ow) = (h / 2, w / 2);
            let dy = random_vec(oh * ow * c, seed + 1);
            for act in [Activation::Linear, Activation::Relu, Activation::Selu] {
                let what = format!("compact routing [{h}, {w}, {c}] {act:?}");
                let mut dense = vec![f32::NAN; h * w * c];
                let mut sums = vec![0.5f32; c];
                backward_image(&y, &dy, &mut dense, (h, w, c), (act, &mut sums));
                let entries = oh * ow * c;
                let (mut g, mut q, mut at) = (
                    vec![f32::NAN; entries],
                    vec![9u8; entries],
                    vec![0u32; entries],
                );
                let mut compact_sums = vec![0.5f32; c];
                let place = Placement {
                    first_pixel: 3 * h * w,
                    stride: 5,
                };
                let out = Compact {
                    g: &mut g,
                    q: &mut q,
                    at: &mut at,
                };
                route_image(&y, &dy, (h, w, c), (act, &mut compact_sums), out, place);
                assert_close(&compact_sums, &to_f64(&sums), 0.0, &format!("{what}: sums"));
                let mut rebuilt = vec![0.0f32; h * w * c];
                for (e, ((&g, &q), &at)) in g.iter().zip(&q).zip(&at).enumerate() {
                    let (window, ch) = (e / c, e % c);
                    let (i, j) = (window / ow, window % ow);
                    assert!(q < 4, "{what}: q {q}");
                    let pixel = (2 * i + usize::from(q >= 2)) * w + 2 * j + usize::from(q % 2 == 1);
                    assert_eq!(
                        at as usize,
                        (place.first_pixel + pixel) * 5,
                        "{what}: at of {e}"
                    );
                    rebuilt[pixel * c + ch] = g;
                }
                assert_close(&rebuilt, &to_f64(&dense), 0.0, &format!("{what}: gradient"));
            }
        }
    }
}
