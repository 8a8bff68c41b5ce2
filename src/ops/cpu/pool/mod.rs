//! 2×2, stride-2, 'valid' max pooling (Keras' `MaxPool2D()` defaults), NHWC.
//!
//! The backward pass recomputes each window's maximum from the input and routes the gradient to
//! the FIRST maximal element in window order (0,0), (0,1), (1,0), (1,1), as TF does; all other
//! input positions, including a dropped last row or column of an odd-sized input, get 0.

use rayon::prelude::*;

use crate::ops::spec::{Activation, PoolShape};

use super::elementwise::act_grad;

mod activated;
pub(super) mod compact;
pub(crate) use activated::forward_images_argmax_act;
pub(crate) use compact::{
    backward_image_argmax, route_image, route_image_argmax, Argmax, Compact, Placement,
};

/// `max(a, b)` keeping `a` unless `b` is strictly larger (so the earlier element wins ties).
#[inline(always)]
fn first_max(a: f32, b: f32) -> f32 {
    if b > a {
        b
    } else {
        a
    }
}

multiversion! {
    /// One output row from the two input rows `r0`, `r1` (`w * c` each).
    fn forward_row(r0: &[f32], r1: &[f32], y: &mut [f32], c: usize) {
        for ((y, a), b) in y.chunks_exact_mut(c).zip(r0.chunks_exact(2 * c)).zip(r1.chunks_exact(2 * c)) {
            let (a0, a1) = a.split_at(c);
            let (b0, b1) = b.split_at(c);
            for ((((y, &v00), &v01), &v10), &v11) in y.iter_mut().zip(a0).zip(a1).zip(b0).zip(b1) {
                *y = first_max(first_max(v00, v01), first_max(v10, v11));
            }
        }
    }
}

/// Borrowed input rows and output-gradient row of one backward window row.
struct BackwardRow<'a> {
    /// Input row `2i`.
    r0: &'a [f32],
    /// Input row `2i + 1`.
    r1: &'a [f32],
    /// Output-gradient row `i`.
    dy: &'a [f32],
}

multiversion! {
    /// Input-gradient rows `2i`, `2i + 1` (`d0`, `d1`) from output row `i`, each window's
    /// gradient multiplied by `act'` at its maximum (the activation whose output the rows are).
    fn backward_row(src: BackwardRow<'_>, d: (&mut [f32], &mut [f32]), c: usize, act: Activation, sums: &mut [f32]) {
        // One loop per activation and with or without the sums: with either a variable
        // inside it, the loop did not vectorize (the pooled separable layer's backward pass
        // ran 1.7 times as long).
        const LINEAR: u8 = Activation::Linear as u8;
        const RELU: u8 = Activation::Relu as u8;
        const SELU: u8 = Activation::Selu as u8;
        match (act, sums.is_empty()) {
            (Activation::Linear, true) => route_row::<LINEAR, false>(src, d, c, sums),
            (Activation::Relu, true) => route_row::<RELU, false>(src, d, c, sums),
            (Activation::Selu, true) => route_row::<SELU, false>(src, d, c, sums),
            (Activation::Linear, false) => route_row::<LINEAR, true>(src, d, c, sums),
            (Activation::Relu, false) => route_row::<RELU, true>(src, d, c, sums),
            (Activation::Selu, false) => route_row::<SELU, true>(src, d, c, sums),
        }
    }
}

/// The activation a const parameter names (an `Activation` as `u8`: an enum cannot be one).
#[inline(always)]
fn activation<const ACT: u8>() -> Activation {
    match ACT {
        a if a == Activation::Relu as u8 => Activation::Relu,
        a if a == Activation::Selu as u8 => Activation::Selu,
        _ => Activation::Linear,
    }
}

/// [`backward_row`] for the activation `ACT` (an `Activation` as `u8`: an enum cannot be a
/// const parameter), adding each window's gradient to `sums` (`[c]`) when `SUM`; inlined into
/// its multiversioned caller.
#[inline(always)]
fn route_row<const ACT: u8, const SUM: bool>(
    src: BackwardRow<'_>,
    (d0, d1): (&mut [f32], &mut [f32]),
    c: usize,
    sums: &mut [f32],
) {
    let act = activation::<ACT>();
    let BackwardRow { r0, r1, dy } = src;
    let pairs = r0
        .chunks_exact(2 * c)
        .zip(r1.chunks_exact(2 * c))
        .zip(dy.chunks_exact(c))
        .zip(d0.chunks_exact_mut(2 * c).zip(d1.chunks_exact_mut(2 * c)));
    for (((a, b), g), (da, db)) in pairs {
        let (a0, a1) = a.split_at(c);
        let (b0, b1) = b.split_at(c);
        let (da0, da1) = da.split_at_mut(c);
        let (db0, db1) = db.split_at_mut(c);
        // Equal lengths, visible to the optimizer: no bounds checks in the loop.
        let (a1, b0, b1, g) = (&a1[..c], &b0[..c], &b1[..c], &g[..c]);
        let (da0, da1, db0, db1) = (&mut da0[..c], &mut da1[..c], &mut db0[..c], &mut db1[..c]);
        let sums = &mut sums[..if SUM { c } else { 0 }];
        for i in 0..c {
            let (g, [t00, t01, t10, t11]) = window_gradient(a0[i], a1[i], b0[i], b1[i], g[i], act);
            if SUM {
                sums[i] += g;
            }
            // Bit masks rather than `if t { g } else { 0.0 }`, which LLVM turns into
            // masked stores (microcoded, very slow on AMD).
            let bits = g.to_bits();
            da0[i] = f32::from_bits(bits & 0u32.wrapping_sub(u32::from(t00)));
            da1[i] = f32::from_bits(bits & 0u32.wrapping_sub(u32::from(t01)));
            db0[i] = f32::from_bits(bits & 0u32.wrapping_sub(u32::from(t10)));
            db1[i] = f32::from_bits(bits & 0u32.wrapping_sub(u32::from(t11)));
        }
    }
    // A dropped last column (odd width) gets no gradient.
    let tail = d0.len() % (2 * c);
    let start = d0.len() - tail;
    d0[start..].fill(0.0);
    d1[start..].fill(0.0);
}

/// A window's gradient `dy * act'(m)` at its first maximum `m`, and which of its four elements
/// (in window order) that maximum is (only the maximum gets a gradient: the activation's, at
/// it, once per window).
#[inline(always)]
fn window_gradient(
    v00: f32,
    v01: f32,
    v10: f32,
    v11: f32,
    dy: f32,
    act: Activation,
) -> (f32, [bool; 4]) {
    let (m, t) = window_max(v00, v01, v10, v11);
    (act_grad(dy, m, act), t)
}

/// A window's first maximum, and which of its four elements (in window order) it is.
#[inline(always)]
fn window_max(v00: f32, v01: f32, v10: f32, v11: f32) -> (f32, [bool; 4]) {
    let m = first_max(first_max(v00, v01), first_max(v10, v11));
    let t00 = v00 == m;
    let t01 = !t00 && v01 == m;
    let t10 = !t00 && !t01 && v10 == m;
    let t11 = !t00 && !t01 && !t10;
    (m, [t00, t01, t10, t11])
}

/// Checks the slice lengths against the shape.
fn check(s: &PoolShape, x: usize, y: usize, what: &str) {
    assert_eq!(
        x,
        s.input_len(),
        "{what}: input length does not match the shape"
    );
    assert_eq!(
        y,
        s.output_len(),
        "{what}: output length does not match the shape"
    );
}

/// `y[n, i, j, c] = max` of the 2×2 window at `(2i, 2j)`.
pub(crate) fn maxpool_forward(x: &[f32], y: &mut [f32], s: &PoolShape) {
    check(s, x.len(), y.len(), "maxpool_forward");
    let (oh, ow) = s.out_hw();
    if y.is_empty() {
        return;
    }
    let (w, c) = (s.w, s.c);
    let image = s.h * w * c;
    let out_row = ow * c;
    y.par_chunks_mut(out_row)
        .enumerate()
        .with_min_len(8)
        .for_each(|(r, y)| {
            let (img, i) = (r / oh, r % oh);
            let base = img * image + 2 * i * w * c;
            forward_row(
                &x[base..base + w * c],
                &x[base + w * c..base + 2 * w * c],
                y,
                c,
            );
        });
}

/// [`maxpool_forward`] of one image: `x` `[h, w, c]`, `y` the pooled `[h / 2, w / 2, c]`, on
/// the calling thread.
pub(super) fn forward_image(x: &[f32], y: &mut [f32], (h, w, c): (usize, usize, usize)) {
    let row = w * c;
    let out_row = (w / 2) * c;
    assert!(
        x.len() == h * row && y.len() == (h / 2) * out_row,
        "maxpool_forward: image slices do not match [{h}, {w}, {c}]"
    );
    if out_row == 0 {
        return;
    }
    for (y, rows) in y.chunks_exact_mut(out_row).zip(x.chunks_exact(2 * row)) {
        let (r0, r1) = rows.split_at(row);
        forward_row(r0, r1, y, c);
    }
}

/// `dx` from `dy`: each window's gradient goes to its first maximal input (see module docs).
pub(crate) fn maxpool_backward(x: &[f32], dy: &[f32], dx: &mut [f32], s: &PoolShape) {
    check(s, x.len(), dy.len(), "maxpool_backward");
    assert_eq!(
        dx.len(),
        x.len(),
        "maxpool_backward: dx must be as long as x"
    );
    if dx.is_empty() {
        return;
    }
    let (oh, ow) = s.out_hw();
    let (h, w, c) = (s.h, s.w, s.c);
    let row = w * c;
    let image = h * row;
    if dy.is_empty() {
        // Every window was dropped (height or width below 2).
        dx.fill(0.0);
        return;
    }
    dx.par_chunks_mut(image)
        .zip(x.par_chunks(image))
        .zip(dy.par_chunks(oh * ow * c))
        .for_each(|((dx, x), dy)| {
            backward_image(x, dy, dx, (h, w, c), (Activation::Linear, &mut []));
        });
}

/// [`maxpool_backward`] of one image: `x` and `dx` `[h, w, c]`, `dy` the pooled `[h / 2, w / 2,
/// c]`, on the calling thread; `dx` multiplied by `act'` where `x` is the output of `act` (a
/// layer's activation, whose gradient is then computed once per window, at its maximum,
/// instead of in a pass of its own over `dx`); and, when `sums` is not empty (`[c]`), the
/// column sums of `dx` added to it (a bias gradient, from the windows' gradients rather than a
/// pass over `dx`).
pub(super) fn backward_image(
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    (h, w, c): (usize, usize, usize),
    (act, sums): (Activation, &mut [f32]),
) {
    let row = w * c;
    let (oh, ow) = (h / 2, w / 2);
    assert!(
        x.len() == h * row && dx.len() == h * row && dy.len() == oh * ow * c,
        "maxpool_backward: image slices do not match [{h}, {w}, {c}]"
    );
    assert!(
        sums.is_empty() || sums.len() == c,
        "maxpool_backward: sums must have c elements"
    );
    let (pairs, rest) = dx.split_at_mut(2 * oh * row);
    // A dropped last row (odd height) gets no gradient.
    rest.fill(0.0);
    if ow == 0 {
        pairs.fill(0.0);
        return;
    }
    for (i, (d, dy)) in pairs
        .chunks_exact_mut(2 * row)
        .zip(dy.chunks_exact(ow * c))
        .enumerate()
    {
        let (d0, d1) = d.split_at_mut(row);
        let src = BackwardRow {
            r0: &x[2 * i * row..(2 * i + 1) * row],
            r1: &x[(2 * i + 1) * row..(2 * i + 2) * row],
            dy,
        };
        backward_row(src, (d0, d1), c, act, &mut *sums);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::ops::reference::{self as r, assert_close, random_vec, to_f64};

    #[test]
    pub(in crate::ops::cpu) fn matches_reference() {
        for (t, (n, h, w, c)) in [
            (1, 1, 1, 1),
            (1, 2, 2, 1),
            (3, 7, 7, 3),
            (1, 13, 28, 32),
            (3, 28, 28, 32),
            (1, 3, 1, 3),
            (1, 1, 7, 3),
            (3, 28, 13, 1),
        ]
        .into_iter()
        .enumerate()
        {
            let s = PoolShape { n, h, w, c };
            let x = random_vec(s.input_len(), 800 + t as u64);
            let dy = random_vec(s.output_len(), 810 + t as u64);
            let mut y = vec![f32::NAN; s.output_len()];
            maxpool_forward(&x, &mut y, &s);
            assert_close(
                &y,
                &r::maxpool_forward(&to_f64(&x), &s),
                0.0,
                &format!("maxpool forward {s:?}"),
            );
            let mut dx = vec![f32::NAN; s.input_len()];
            maxpool_backward(&x, &dy, &mut dx, &s);
            let dx64 = r::maxpool_backward(&to_f64(&x), &to_f64(&dy), &s);
            assert_close(&dx, &dx64, 0.0, &format!("maxpool dx {s:?}"));
            // Through the activation whose output `x` would be, image by image.
            let (image, pooled) = (h * w * c, (h / 2) * (w / 2) * c);
            for act in [Activation::Relu, Activation::Selu] {
                let mut dx = vec![f32::NAN; s.input_len()];
                let mut sums = vec![0.0f32; c];
                for (i, dx) in dx.chunks_mut(image.max(1)).enumerate() {
                    let (x, dy) = (&x[i * image..][..image], &dy[i * pooled..][..pooled]);
                    backward_image(x, dy, dx, (h, w, c), (act, &mut sums));
                }
                let expected = r::activation_backward(&dx64, &to_f64(&x), act);
                assert_close(&dx, &expected, 1e-6, &format!("maxpool dx {act:?} {s:?}"));
                let rows = s.input_len() / c;
                let expected = r::sum_rows(&expected, rows, c);
                assert_close(
                    &sums,
                    &expected,
                    1e-5,
                    &format!("maxpool sums {act:?} {s:?}"),
                );
            }
        }
    }

    #[test]
    fn ties_route_to_the_first_maximum() {
        let s = PoolShape {
            n: 1,
            h: 2,
            w: 4,
            c: 2,
        };
        // Window 0: channel 0 all equal, channel 1 max at (1,0) and (1,1).
        // Window 1: channel 0 max at (0,1) and (1,1), channel 1 all distinct, max at (1,1).
        #[rustfmt::skip]
        let x = [
            1.0, 0.0,  1.0, 0.0,   0.0, 1.0,  5.0, 2.0,
            1.0, 3.0,  1.0, 3.0,   4.0, 3.0,  5.0, 4.0,
        ];
        let dy = [10.0, 20.0, 30.0, 40.0];
        let mut dx = [f32::NAN; 16];
        maxpool_backward(&x, &dy, &mut dx, &s);
        #[rustfmt::skip]
        let expected = [
            10.0, 0.0,  0.0, 0.0,   0.0, 0.0,  30.0, 0.0,
            0.0, 20.0,  0.0, 0.0,   0.0, 0.0,  0.0, 40.0,
        ];
        assert_eq!(dx, expected);
        assert_close(
            &dx,
            &r::maxpool_backward(&to_f64(&x), &to_f64(&dy), &s),
            0.0,
            "ties vs reference",
        );
    }
}
