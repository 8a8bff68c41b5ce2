//! A 2×2 max-pool of an activated layer's output, taken before the activation: for a layer
//! that keeps only the pool and its argmax, the activation runs on one value in four.
//!
//! Exact, not approximately so: the result is bit for bit the pool of `act(z + bias)` with its
//! first maximum. An increasing activation keeps the maximum where it was, but in f32 two
//! different `z` can give the same `act(z)` (SELU's negative side flattens; rounding joins
//! neighbours), and the pool of the activated values then routes to the first of them. So a
//! window whose other values come within rounding of its maximum after the activation is
//! recomputed the plain way: rare, since a channel's values must come within about 2e-6 of
//! each other after the activation without being equal (equal values need no second look).

use crate::ops::spec::Activation;

use super::{activation, first_max};
use crate::ops::cpu::elementwise::{act_grad, act_value};

/// The smallest gap after the activation, between a window's maximum and another of its
/// values, that rounding cannot close: twice the activations' error (SELU's exp within
/// 1.25e-7 relative, |SELU| < 1.76 on its negative side) plus the results' half ulps, with
/// room to spare. Relative to the maximum's size on top, for the linear part.
const CLEAR_GAP: f32 = 2e-6;
const CLEAR_GAP_RELATIVE: f32 = 1.0 / (1u32 << 20) as f32;

multiversion! {
    /// One output row of the pool of `act(z + bias)` from the two input rows `r0`, `r1`
    /// (`w * c` each), and each maximum's position in its window in `argmax` (0 (0,0), 1
    /// (0,1), 2 (1,0), 3 (1,1)).
    fn forward_row<const FMA: bool>(r0: &[f32], r1: &[f32], bias: Option<&[f32]>, y: &mut [f32], argmax: &mut [i32], c: usize, act: Activation) {
        const LINEAR: u8 = Activation::Linear as u8;
        const RELU: u8 = Activation::Relu as u8;
        const SELU: u8 = Activation::Selu as u8;
        let rows = Rows { r0, r1, y, argmax, c };
        match act {
            Activation::Linear => pool_rows::<FMA, LINEAR>(rows, bias),
            Activation::Relu => pool_rows::<FMA, RELU>(rows, bias),
            Activation::Selu => pool_rows::<FMA, SELU>(rows, bias),
        }
    }
}

/// A pooled row's inputs and outputs (see [`forward_row`]).
struct Rows<'a> {
    r0: &'a [f32],
    r1: &'a [f32],
    y: &'a mut [f32],
    argmax: &'a mut [i32],
    c: usize,
}

/// [`forward_row`] for the activation `ACT` (an `Activation` as `u8`), inlined into its
/// multiversioned caller.
#[inline(always)]
fn pool_rows<const FMA: bool, const ACT: u8>(rows: Rows<'_>, bias: Option<&[f32]>) {
    let Rows {
        r0,
        r1,
        y,
        argmax,
        c,
    } = rows;
    let act = activation::<ACT>();
    let windows = y
        .chunks_exact_mut(c)
        .zip(argmax.chunks_exact_mut(c))
        .zip(r0.chunks_exact(2 * c).zip(r1.chunks_exact(2 * c)));
    for ((y, argmax), (a, b)) in windows {
        let (a0, a1) = a.split_at(c);
        let (b0, b1) = b.split_at(c);
        let window = [&a0[..c], &a1[..c], &b0[..c], &b1[..c]];
        let (y, argmax) = (&mut y[..c], &mut argmax[..c]);
        let unclear = match bias {
            Some(bias) => pool_window::<FMA, true>(window, &bias[..c], y, argmax, act),
            None => pool_window::<FMA, false>(window, &[], y, argmax, act),
        };
        if unclear {
            match bias {
                Some(bias) => pool_window_exactly::<FMA, true>(window, &bias[..c], y, argmax, act),
                None => pool_window_exactly::<FMA, false>(window, &[], y, argmax, act),
            }
        }
    }
}

/// The window's four values of channel `i`, plus the bias when `BIAS`.
#[inline(always)]
fn values<const BIAS: bool>(window: [&[f32]; 4], bias: &[f32], i: usize) -> [f32; 4] {
    let b = if BIAS { bias[i] } else { 0.0 };
    // Without a bias the values go through untouched (adding 0 would turn -0 into +0).
    window.map(|v| if BIAS { v[i] + b } else { v[i] })
}

/// The first position of `m` among `v` (the window's maximum), as selects.
#[inline(always)]
fn position(v: [f32; 4], m: f32) -> i32 {
    let q = if v[2] == m { 2 } else { 3 };
    let q = if v[1] == m { 1 } else { q };
    if v[0] == m {
        0
    } else {
        q
    }
}

/// One window's channels pooled before the activation; whether any channel's other values came
/// too close to its maximum to tell them apart after the activation (then the window must be
/// pooled [exactly](pool_window_exactly)). NaN anywhere counts as too close.
#[inline(always)]
fn pool_window<const FMA: bool, const BIAS: bool>(
    window: [&[f32]; 4],
    bias: &[f32],
    y: &mut [f32],
    argmax: &mut [i32],
    act: Activation,
) -> bool {
    let mut unclear = false;
    for i in 0..y.len() {
        let v = values::<BIAS>(window, bias, i);
        let m = first_max(first_max(v[0], v[1]), first_max(v[2], v[3]));
        let q = position(v, m);
        let top = act_value::<FMA>(m, act);
        // The activation's slope at the maximum: a gap of `d` before it is about `d * slope`
        // after (at least half that for d <= 1 on SELU's convex negative side).
        let slope = act_grad(1.0, top, act);
        let gap = CLEAR_GAP + top.abs() * CLEAR_GAP_RELATIVE;
        let mut clear = true;
        for &v in &v {
            // Written so that NaN is never clear (`f32::min` would drop it).
            let d = m - v;
            let d = if d > 1.0 { 1.0 } else { d };
            // Equal values (the maximum itself; a constant region, such as a background)
            // stay equal after the activation, and the first of them is the maximum both
            // ways.
            clear &= d == 0.0 || d * slope > gap;
        }
        unclear |= !clear;
        y[i] = top;
        argmax[i] = q;
    }
    unclear
}

/// One window's channels pooled after the activation: the plain way, for windows
/// [`pool_window`] could not settle.
#[inline(always)]
fn pool_window_exactly<const FMA: bool, const BIAS: bool>(
    window: [&[f32]; 4],
    bias: &[f32],
    y: &mut [f32],
    argmax: &mut [i32],
    act: Activation,
) {
    for i in 0..y.len() {
        let v = values::<BIAS>(window, bias, i).map(|v| act_value::<FMA>(v, act));
        let m = first_max(first_max(v[0], v[1]), first_max(v[2], v[3]));
        y[i] = m;
        argmax[i] = position(v, m);
    }
}

/// The pool of one image's `act(z + bias)` (`z` `[h, w, c]`, `bias` `[c]`) into `y`, each
/// maximum's position in its window in `argmax` (both `[h / 2, w / 2, c]`): bit for bit the
/// pool of the activated `z`, first maxima included.
fn forward_image_argmax_act(
    z: &[f32],
    bias: Option<&[f32]>,
    act: Activation,
    (y, argmax): (&mut [f32], &mut [i32]),
    (h, w, c): (usize, usize, usize),
) {
    let row = w * c;
    let out_row = (w / 2) * c;
    assert!(
        z.len() == h * row
            && y.len() == (h / 2) * out_row
            && argmax.len() == y.len()
            && bias.is_none_or(|b| b.len() == c),
        "maxpool_forward: image slices do not match [{h}, {w}, {c}]"
    );
    if out_row == 0 {
        return;
    }
    let rows = y
        .chunks_exact_mut(out_row)
        .zip(argmax.chunks_exact_mut(out_row))
        .zip(z.chunks_exact(2 * row));
    for ((y, argmax), rows) in rows {
        let (r0, r1) = rows.split_at(row);
        forward_row(r0, r1, bias, y, argmax, c, act);
    }
}

/// [`forward_image_argmax_act`] image by image over a batch: `z` whole `[h, w, c]` images, `y`
/// and `argmax` their pools.
pub(crate) fn forward_images_argmax_act(
    z: &[f32],
    bias: Option<&[f32]>,
    act: Activation,
    (y, argmax): (&mut [f32], &mut [i32]),
    (h, w, c): (usize, usize, usize),
) {
    let (image, pooled) = (h * w * c, (h / 2) * (w / 2) * c);
    if image == 0 || pooled == 0 {
        return;
    }
    let images = z
        .chunks_exact(image)
        .zip(y.chunks_exact_mut(pooled))
        .zip(argmax.chunks_exact_mut(pooled));
    for ((z, y), argmax) in images {
        forward_image_argmax_act(z, bias, act, (y, argmax), (h, w, c));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::cpu::elementwise::bias_act_rows;
    use crate::ops::reference::random_vec;

    /// The pool of `y` (`[h, w, c]`) and its first maxima, one value at a time.
    fn plain_pool(y: &[f32], (h, w, c): (usize, usize, usize)) -> (Vec<f32>, Vec<i32>) {
        let (mut pooled, mut argmax) = (vec![], vec![]);
        for i in 0..h / 2 {
            for j in 0..w / 2 {
                for ch in 0..c {
                    let at = |q: usize| y[((2 * i + q / 2) * w + 2 * j + q % 2) * c + ch];
                    let mut best = 0;
                    for q in 1..4 {
                        if at(q) > at(best) {
                            best = q;
                        }
                    }
                    pooled.push(at(best));
                    argmax.push(best as i32);
                }
            }
        }
        (pooled, argmax)
    }

    /// Bit for bit the pool of the activated values, where values crowd each other: random
    /// windows, windows whose values are one or a few ulps apart, equal values, SELU's flat
    /// far negative side, zeros of both signs, NaN; with and without a bias. (With no gap
    /// demanded after the activation, SELU's windows near -12 and 1.95 come out wrong.)
    #[test]
    fn matches_the_pool_of_the_activated_values() {
        let (h, w, c) = (10, 9, 24);
        let len = h * w * c;
        let base = random_vec(len, 901);
        let nudges = random_vec(len, 902);
        let mut z: Vec<f32> = base
            .iter()
            .zip(&nudges)
            .enumerate()
            .map(|(e, (&v, &n))| {
                // One kind for all of a window's values: a window goes the plain way when
                // any of its channels must.
                let pixel = e / c;
                let window = (pixel / w / 2) * (w / 2) + pixel % w / 2;
                let ulps = (n * 3.0).round() as i32;
                match window % 9 {
                    0 | 1 => 4.0 * v,
                    // SELU's results have twice the ulp of its inputs here: neighbours join.
                    2 => 1.95 + f32::EPSILON * ulps as f32,
                    3 => -f32::from_bits((0.5f32.to_bits() as i32 + ulps) as u32),
                    // SELU's slope ~1e-5: inputs 1e-3 apart round to the same result.
                    4 => -12.0 + 1e-3 * n,
                    5 => [0.0, -0.0, 1e-30, -1e-30][e % 4],
                    // SELU's results all -scale * alpha.
                    6 => -20.0 + n,
                    7 => 0.25,
                    _ => 1.0 + f32::EPSILON * ulps as f32,
                }
            })
            .collect();
        // In windows 0 and 5 (random ones).
        z[c + 3] = f32::NAN;
        z[(3 * w + 2) * c + 7] = f32::NAN;
        let bias = random_vec(c, 903);
        let pooled_len = (h / 2) * (w / 2) * c;
        for act in [Activation::Linear, Activation::Relu, Activation::Selu] {
            for bias in [None, Some(&bias[..])] {
                let what = format!("{act:?} with bias {}", bias.is_some());
                let mut activated = z.clone();
                bias_act_rows(&mut activated, bias, c, act);
                let (expected, expected_argmax) = plain_pool(&activated, (h, w, c));
                let (mut pooled, mut argmax) = (vec![f32::NAN; pooled_len], vec![-1; pooled_len]);
                forward_image_argmax_act(&z, bias, act, (&mut pooled, &mut argmax), (h, w, c));
                for (e, ((p, x), (a, xa))) in pooled
                    .iter()
                    .zip(&expected)
                    .zip(argmax.iter().zip(&expected_argmax))
                    .enumerate()
                {
                    assert!(
                        p.to_bits() == x.to_bits() && a == xa,
                        "{what}: window entry {e}: {p} at {a}, expected {x} at {xa}"
                    );
                }
            }
        }
    }
}
