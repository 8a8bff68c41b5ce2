//! Element-wise kernels: activations (forward, and backward from the activated output),
//! broadcasting binary ops, `AddN`, scaling, and the vectorizable `exp` they share with softmax.

use rayon::prelude::*;

use crate::ops::spec::{Activation, BinaryOp, SELU_ALPHA, SELU_SCALE};

use super::{madd, PAR_CHUNK, PAR_MIN_ELEMS};

/// `SELU_SCALE` in f32.
const SCALE: f32 = SELU_SCALE as f32;
/// `SELU_SCALE * SELU_ALPHA` in f32.
const SCALE_ALPHA: f32 = (SELU_SCALE * SELU_ALPHA) as f32;

/// Splits `e^x` into `(2^n, q)` with `e^x = 2^n * (1 + q)`, `n = round(x / ln 2)`.
///
/// Cephes' `expf` reduction and polynomial (about 1 ulp on the reduced range), written with
/// integer bit tricks only so that loops calling it vectorize. `x` is clamped to `[-87, 88]`
/// (where `2^n` stays a normal number); NaN propagates.
#[inline(always)]
fn exp_parts<const FMA: bool>(x: f32) -> (f32, f32) {
    /// 1.5 * 2^23: adding it rounds a float of magnitude < 2^22 to an integer.
    const MAGIC: f32 = 12_582_912.0;
    /// The high bits of ln 2 (exact in 9 bits, so `n * LN2_HI` is exact).
    const LN2_HI: f32 = 0.693_359_4;
    /// ln 2 - `LN2_HI`.
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let t = madd::<FMA>(x, std::f32::consts::LOG2_E, MAGIC);
    let n_int = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let n = t - MAGIC;
    let r = madd::<FMA>(-n, LN2_LO, madd::<FMA>(-n, LN2_HI, x));
    let mut p = 1.987_569_2e-4_f32;
    p = madd::<FMA>(p, r, 1.398_199_9e-3);
    p = madd::<FMA>(p, r, 8.333_452e-3);
    p = madd::<FMA>(p, r, 4.166_579_6e-2);
    p = madd::<FMA>(p, r, 1.666_666_5e-1);
    p = madd::<FMA>(p, r, 0.5);
    let q = madd::<FMA>(r * r, p, r);
    let two_n = f32::from_bits((n_int.wrapping_add(127) << 23) as u32);
    (two_n, q)
}

/// `e^x` to about 2 ulp for `x` in `[-87, 88]` (clamped outside), vectorizable.
#[inline(always)]
pub(crate) fn exp_approx<const FMA: bool>(x: f32) -> f32 {
    let (s, q) = exp_parts::<FMA>(x);
    madd::<FMA>(s, q, s)
}

/// `selu(x)` with Keras' constants.
#[inline(always)]
fn selu<const FMA: bool>(x: f32) -> f32 {
    // NaN takes the negative branch and propagates.
    let negative = selu_negative::<FMA>(if x > 0.0 { 0.0 } else { x });
    if x > 0.0 {
        SCALE * x
    } else {
        negative
    }
}

/// `SCALE_ALPHA * (e^x - 1)` for `x <= 0` (clamped at -87; NaN propagates): SELU's negative
/// side, the cost of every SELU layer, so [`exp_parts`] trimmed for it. No upper clamp; with
/// FMA one reduction step (its error, `n * |ln 2 - LN2|` with `|n| <= 126`, is below 2.5e-7 of
/// `e^x`, which is itself below 1e-30 of the result's size there); `2^n` from the rounding's
/// own bits; a degree-4 polynomial (3e-9 on the reduced range, below f32's rounding).
#[inline(always)]
fn selu_negative<const FMA: bool>(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    const LN2: f32 = std::f32::consts::LN_2;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = if x < -87.0 { -87.0 } else { x };
    let t = madd::<FMA>(x, std::f32::consts::LOG2_E, MAGIC);
    let n = t - MAGIC;
    let r = if FMA {
        madd::<FMA>(-n, LN2, x)
    } else {
        madd::<FMA>(-n, LN2_LO, madd::<FMA>(-n, LN2_HI, x))
    };
    let mut p = 1.381_461_3e-3_f32;
    p = madd::<FMA>(p, r, 8.368_71e-3);
    p = madd::<FMA>(p, r, 4.166_839e-2);
    p = madd::<FMA>(p, r, 1.666_652_1e-1);
    p = madd::<FMA>(p, r, 0.499_999_94);
    let q = madd::<FMA>(r * r, p, r);
    // `t`'s low bits hold n: shifted to the exponent field they give 2^n once biased.
    let two_n = f32::from_bits((t.to_bits() << 23).wrapping_add(127 << 23));
    let s = SCALE_ALPHA * two_n;
    madd::<FMA>(s, q, s - SCALE_ALPHA)
}

/// `max(x, 0)` (NaN propagates as 0, like a comparison-based ReLU).
#[inline(always)]
fn relu(x: f32) -> f32 {
    if x > 0.0 {
        x
    } else {
        0.0
    }
}

multiversion! {
    /// `y[i] = act(x[i])` on one chunk.
    fn act_leaf<const FMA: bool>(x: &[f32], y: &mut [f32], act: Activation) {
        match act {
            Activation::Linear => y.copy_from_slice(x),
            Activation::Relu => {
                for (y, &x) in y.iter_mut().zip(x) {
                    *y = relu(x);
                }
            }
            Activation::Selu => {
                for (y, &x) in y.iter_mut().zip(x) {
                    *y = selu::<FMA>(x);
                }
            }
        }
    }
}

multiversion! {
    /// `y = act(y + bias)` row by row on a row-major `[rows, cols]` block (`bias` `[cols]`).
    pub(crate) fn bias_act_rows<const FMA: bool>(y: &mut [f32], bias: Option<&[f32]>, cols: usize, act: Activation) {
        if cols == 0 {
            return;
        }
        if let Some(bias) = bias {
            for row in y.chunks_exact_mut(cols) {
                match act {
                    Activation::Linear => {
                        for (y, &b) in row.iter_mut().zip(bias) {
                            *y += b;
                        }
                    }
                    Activation::Relu => {
                        for (y, &b) in row.iter_mut().zip(bias) {
                            *y = relu(*y + b);
                        }
                    }
                    Activation::Selu => {
                        for (y, &b) in row.iter_mut().zip(bias) {
                            *y = selu::<FMA>(*y + b);
                        }
                    }
                }
            }
        } else {
            act_in_place::<FMA>(y, act);
        }
    }
}

/// `act(x)` for one value, as every kernel here computes it (inline into a multiversioned
/// caller).
#[inline(always)]
pub(crate) fn act_value<const FMA: bool>(x: f32, act: Activation) -> f32 {
    match act {
        Activation::Linear => x,
        Activation::Relu => relu(x),
        Activation::Selu => selu::<FMA>(x),
    }
}

/// `y = act(y)` (inline into a multiversioned caller).
#[inline(always)]
pub(crate) fn act_in_place<const FMA: bool>(y: &mut [f32], act: Activation) {
    match act {
        Activation::Linear => {}
        Activation::Relu => {
            for y in y.iter_mut() {
                *y = relu(*y);
            }
        }
        Activation::Selu => {
            for y in y.iter_mut() {
                *y = selu::<FMA>(*y);
            }
        }
    }
}

/// `dy * act'` from the activated output `y` (inline into a multiversioned caller).
#[inline(always)]
pub(crate) fn act_grad(dy: f32, y: f32, act: Activation) -> f32 {
    match act {
        Activation::Linear => dy,
        Activation::Relu => relu_grad(dy, y),
        Activation::Selu => selu_grad(dy, y),
    }
}

/// `dy * relu'` from ReLU's output `y` (or its input: the same sign), 0 where it is not
/// positive (NaN included).
#[inline(always)]
pub(super) fn relu_grad(dy: f32, y: f32) -> f32 {
    if y > 0.0 {
        dy
    } else {
        0.0
    }
}

/// `dy * selu'` from SELU's output `y` (`selu' = scale` above 0, `y + scale * alpha` below).
#[inline(always)]
fn selu_grad(dy: f32, y: f32) -> f32 {
    if y > 0.0 {
        dy * SCALE
    } else {
        dy * (y + SCALE_ALPHA)
    }
}

multiversion! {
    /// `dz[i] = dy[i] * act'(.)` from the activated output `y`, on one chunk.
    pub(crate) fn act_backward_leaf(dy: &[f32], y: &[f32], dz: &mut [f32], act: Activation) {
        match act {
            Activation::Linear => dz.copy_from_slice(dy),
            Activation::Relu => {
                for ((dz, &dy), &y) in dz.iter_mut().zip(dy).zip(y) {
                    *dz = relu_grad(dy, y);
                }
            }
            Activation::Selu => {
                for ((dz, &dy), &y) in dz.iter_mut().zip(dy).zip(y) {
                    *dz = selu_grad(dy, y);
                }
            }
        }
    }
}

multiversion! {
    /// `dz[i] *= act'(.)` from the activated output `y`, in place: [`act_backward_leaf`] on a
    /// gradient that was just written into `dz`.
    pub(crate) fn act_backward_in_place(dz: &mut [f32], y: &[f32], act: Activation) {
        assert_eq!(dz.len(), y.len(), "act_backward_in_place: lengths differ");
        match act {
            Activation::Linear => {}
            Activation::Relu => {
                for (dz, &y) in dz.iter_mut().zip(y) {
                    *dz = relu_grad(*dz, y);
                }
            }
            Activation::Selu => {
                for (dz, &y) in dz.iter_mut().zip(y) {
                    *dz = selu_grad(*dz, y);
                }
            }
        }
    }
}

/// `y[i] = act(x[i])`.
pub(crate) fn activation_forward(x: &[f32], y: &mut [f32], act: Activation) {
    assert_eq!(
        x.len(),
        y.len(),
        "activation_forward: x and y lengths differ"
    );
    if x.len() < PAR_MIN_ELEMS {
        act_leaf(x, y, act);
    } else {
        y.par_chunks_mut(PAR_CHUNK)
            .zip(x.par_chunks(PAR_CHUNK))
            .for_each(|(y, x)| act_leaf(x, y, act));
    }
}

/// Gradient through the activation, from the activated output `y` (not the input):
/// relu `y > 0 ? dy : 0`, selu `y > 0 ? dy * SCALE : dy * (y + SCALE * ALPHA)`, linear `dy`.
pub(crate) fn activation_backward(dy: &[f32], y: &[f32], dz: &mut [f32], act: Activation) {
    assert_eq!(
        dy.len(),
        y.len(),
        "activation_backward: dy and y lengths differ"
    );
    assert_eq!(
        dy.len(),
        dz.len(),
        "activation_backward: dy and dz lengths differ"
    );
    if dy.len() < PAR_MIN_ELEMS {
        act_backward_leaf(dy, y, dz, act);
    } else {
        dz.par_chunks_mut(PAR_CHUNK)
            .zip(dy.par_chunks(PAR_CHUNK))
            .zip(y.par_chunks(PAR_CHUNK))
            .for_each(|((dz, dy), y)| act_backward_leaf(dy, y, dz, act));
    }
}

multiversion! {
    /// `out = a op b` where `b` repeats every `b.len()` elements of `a` (`a.len()` a multiple).
    fn binary_leaf(a: &[f32], b: &[f32], out: &mut [f32], op: BinaryOp) {
        /// The broadcast loop for one operator (a macro, not a closure, so that it is compiled
        /// inside the target-feature function).
        macro_rules! apply {
            ($op:tt) => {
                if let [b] = b {
                    let b = *b;
                    for (o, &a) in out.iter_mut().zip(a) {
                        *o = a $op b;
                    }
                } else {
                    for (out, a) in out.chunks_exact_mut(b.len()).zip(a.chunks_exact(b.len())) {
                        for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
                            *o = a $op b;
                        }
                    }
                }
            };
        }
        match op {
            BinaryOp::Add => apply!(+),
            BinaryOp::Sub => apply!(-),
            BinaryOp::Mul => apply!(*),
        }
    }
}

/// `out[i] = a[i] op b[i % b.len()]`; `b.len()` must divide `a.len()` (bias-style broadcast).
pub(crate) fn binary(a: &[f32], b: &[f32], out: &mut [f32], op: BinaryOp) {
    assert_eq!(a.len(), out.len(), "binary: a and out lengths differ");
    if a.is_empty() {
        return;
    }
    assert!(
        !b.is_empty() && a.len().is_multiple_of(b.len()),
        "binary: b's length {} does not divide a's length {}",
        b.len(),
        a.len()
    );
    if a.len() < PAR_MIN_ELEMS {
        binary_leaf(a, b, out, op);
    } else {
        let chunk = PAR_CHUNK.div_ceil(b.len()) * b.len();
        out.par_chunks_mut(chunk)
            .zip(a.par_chunks(chunk))
            .for_each(|(out, a)| binary_leaf(a, b, out, op));
    }
}

multiversion! {
    /// `out += x`.
    fn add_assign_leaf(out: &mut [f32], x: &[f32]) {
        for (o, &x) in out.iter_mut().zip(x) {
            *o += x;
        }
    }
}

multiversion! {
    /// `out = alpha * x`.
    fn scale_leaf(x: &[f32], alpha: f32, out: &mut [f32]) {
        for (o, &x) in out.iter_mut().zip(x) {
            *o = alpha * x;
        }
    }
}

/// `out = Σ inputs` element-wise (zeros when `inputs` is empty); every input as long as `out`.
pub(crate) fn add_n(inputs: &[&[f32]], out: &mut [f32]) {
    for (i, x) in inputs.iter().enumerate() {
        assert_eq!(
            x.len(),
            out.len(),
            "add_n: input {i} and out lengths differ"
        );
    }
    /// Sums the inputs' `[start, start + out.len())` range into `out`.
    fn chunk(inputs: &[&[f32]], start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match inputs.split_first() {
            None => out.fill(0.0),
            Some((first, rest)) => {
                out.copy_from_slice(&first[start..end]);
                for x in rest {
                    add_assign_leaf(out, &x[start..end]);
                }
            }
        }
    }
    if out.len() < PAR_MIN_ELEMS {
        chunk(inputs, 0, out);
    } else {
        out.par_chunks_mut(PAR_CHUNK)
            .enumerate()
            .for_each(|(i, out)| chunk(inputs, i * PAR_CHUNK, out));
    }
}

/// `out = alpha * x`.
pub(crate) fn scale(x: &[f32], alpha: f32, out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "scale: x and out lengths differ");
    if x.len() < PAR_MIN_ELEMS {
        scale_leaf(x, alpha, out);
    } else {
        out.par_chunks_mut(PAR_CHUNK)
            .zip(x.par_chunks(PAR_CHUNK))
            .for_each(|(out, x)| scale_leaf(x, alpha, out));
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::ops::reference::{self as r, assert_close, random_vec, to_f64};

    const ACTS: [Activation; 3] = [Activation::Linear, Activation::Relu, Activation::Selu];

    #[test]
    fn exp_approximations_are_accurate() {
        /// Worst relative error of exp over [-87, 88].
        fn worst<const FMA: bool>() -> f64 {
            let mut worst = 0.0f64;
            let mut x = -87.0f32;
            while x <= 88.0 {
                let e = f64::from(x).exp();
                worst = worst.max((f64::from(exp_approx::<FMA>(x)) - e).abs() / e);
                x += 0.001_7;
            }
            worst
        }
        // SELU's negative side against `SCALE_ALPHA * expm1` in f64, down to -87 and near 0
        // (relative: no cancellation there).
        fn worst_selu<const FMA: bool>() -> f64 {
            let near_zero = [-1e-30f32, -1e-7, -1e-3, -0.3, -0.35, -0.7];
            let grid = (0..=51_200).map(|i| -(i as f32) * 0.001_7);
            let mut worst = 0.0f64;
            for x in grid.chain(near_zero) {
                let expected = (SELU_SCALE * SELU_ALPHA) * f64::from(x).exp_m1();
                let got = f64::from(selu_negative::<FMA>(x));
                worst = worst.max((got - expected).abs() / expected.abs().max(f64::MIN_POSITIVE));
            }
            worst
        }
        for worst in [worst_selu::<false>(), worst_selu::<true>()] {
            assert!(worst < 4e-7, "selu relative error {worst}");
        }
        for exp in [worst::<false>(), worst::<true>()] {
            assert!(exp < 4e-7, "exp relative error {exp}");
        }
        assert_eq!(exp_approx::<false>(-1e4), exp_approx::<false>(-87.0));
        assert!(exp_approx::<false>(f32::NAN).is_nan());
        assert!(selu::<false>(f32::NAN).is_nan());
    }

    #[test]
    pub(in crate::ops::cpu) fn activations_match_reference() {
        for len in [1, 3, 7, 13, 28, 100_003] {
            let x: Vec<f32> = random_vec(len, len as u64)
                .iter()
                .map(|v| 6.0 * v)
                .collect();
            let dy = random_vec(len, 1 + len as u64);
            for act in ACTS {
                let mut y = vec![f32::NAN; len];
                activation_forward(&x, &mut y, act);
                assert_close(
                    &y,
                    &r::activation(&to_f64(&x), act),
                    1e-5,
                    &format!("{act:?} forward {len}"),
                );
                let mut dz = vec![f32::NAN; len];
                activation_backward(&dy, &y, &mut dz, act);
                let expected = r::activation_backward_from_input(&to_f64(&dy), &to_f64(&x), act);
                assert_close(&dz, &expected, 1e-4, &format!("{act:?} backward {len}"));
            }
        }
        let mut y = [f32::NAN; 4];
        activation_forward(&[-1e4, -1e-7, 1e-7, 1e4], &mut y, Activation::Selu);
        let expected = r::activation(
            &[-1e4, f64::from(-1e-7f32), f64::from(1e-7f32), 1e4],
            Activation::Selu,
        );
        assert_close(&y, &expected, 1e-6, "selu extremes");
    }

    #[test]
    fn bias_act_rows_matches_reference() {
        for (rows, cols) in [(1, 1), (3, 7), (13, 28)] {
            let z = random_vec(rows * cols, 5);
            let bias = random_vec(cols, 6);
            for act in ACTS {
                let mut y = z.clone();
                bias_act_rows(&mut y, Some(&bias), cols, act);
                assert_close(
                    &y,
                    &r::bias_act(&to_f64(&z), Some(&to_f64(&bias)), act),
                    1e-5,
                    "bias_act",
                );
                let mut y = z.clone();
                bias_act_rows(&mut y, None, cols, act);
                assert_close(&y, &r::bias_act(&to_f64(&z), None, act), 1e-5, "act only");
            }
        }
    }

    #[test]
    fn binary_broadcasts() {
        for (len, blen) in [
            (1, 1),
            (7, 7),
            (21, 3),
            (13, 1),
            (28 * 28 * 32 * 4, 32),
            (100_000, 1),
        ] {
            let a = random_vec(len, 7);
            let b = random_vec(blen, 8);
            for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul] {
                let mut out = vec![f32::NAN; len];
                binary(&a, &b, &mut out, op);
                let expected: Vec<f64> = (0..len)
                    .map(|i| {
                        let (x, y) = (f64::from(a[i]), f64::from(b[i % blen]));
                        match op {
                            BinaryOp::Add => x + y,
                            BinaryOp::Sub => x - y,
                            BinaryOp::Mul => x * y,
                        }
                    })
                    .collect();
                assert_close(&out, &expected, 1e-6, &format!("{op:?} {len}/{blen}"));
            }
        }
    }

    #[test]
    #[should_panic(expected = "does not divide")]
    fn binary_rejects_bad_broadcast() {
        let mut out = [0.0; 3];
        binary(&[1.0; 3], &[1.0; 2], &mut out, BinaryOp::Add);
    }

    #[test]
    fn add_n_and_scale() {
        for len in [1, 7, 100_001] {
            let inputs: Vec<Vec<f32>> = (0..3).map(|s| random_vec(len, 60 + s)).collect();
            let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
            for count in 0..=3 {
                let mut out = vec![f32::NAN; len];
                add_n(&refs[..count], &mut out);
                let expected: Vec<f64> = (0..len)
                    .map(|i| refs[..count].iter().map(|x| f64::from(x[i])).sum())
                    .collect();
                assert_close(&out, &expected, 1e-6, &format!("add_n {count} x {len}"));
            }
            let mut out = vec![f32::NAN; len];
            scale(&inputs[0], -0.25, &mut out);
            let expected: Vec<f64> = to_f64(&inputs[0]).iter().map(|v| -0.25 * v).collect();
            assert_close(&out, &expected, 1e-7, "scale");
        }
    }
}
