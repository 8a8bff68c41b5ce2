//! The f64 oracle: every kernel of the crate written as the plainest loops over its definition,
//! in double precision, for tests to compare the CPU and GPU kernels against.
//!
//! Nothing here is fast or clever on purpose: each function is a direct transcription of the
//! formula in its doc comment, so that it can be checked by reading (and its gradients are
//! checked by central finite differences in this module's tests). Layouts are the crate's: NHWC
//! activations, HWIO kernels, row-major matrices. Slices must have the lengths the shapes imply
//! (indexing panics otherwise).
//!
//! One file per family beside this one; the helpers shared by the tests (`to_f64`, `random_vec`,
//! `assert_close`), the products and the fused activations here. The finite-difference checks
//! are in `tests.rs`.

use crate::ops::spec::{Activation, SELU_ALPHA, SELU_SCALE};

mod activations;
mod conv;
mod loss;
mod norm;
mod optim;
mod pool;
pub use activations::*;
pub use conv::*;
pub use loss::*;
pub use norm::*;
pub use optim::*;
pub use pool::*;

/// Widens an f32 slice to f64.
pub fn to_f64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}

/// `len` deterministic pseudo-random values, uniform in `[-1, 1)` and never exactly 0
/// (SplitMix64 seeded with `seed`; 24-bit mantissas, so every value is exact in f32).
pub fn random_vec(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let k = (next() >> 40) as u32; // 24 random bits
        let v = (k as f32) / 8_388_608.0 - 1.0; // k / 2^23 - 1, in [-1, 1)
        if v != 0.0 {
            out.push(v);
        }
    }
    out
}

/// Panics unless `actual` matches `expected` element-wise within `rel_tol`.
///
/// The criterion is `|a - e| <= rel_tol * max(1, |e|)`: relative for values of magnitude above
/// 1, absolute (with the same tolerance) below, so results that should be near zero are not
/// held to an impossible relative precision. NaN or infinite actual values always fail, as do
/// differing lengths. The panic message names `what`, the worst index (largest error relative to
/// its allowance), both values and the error.
pub fn assert_close(actual: &[f32], expected: &[f64], rel_tol: f64, what: &str) {
    assert_eq!(
        actual.len(),
        expected.len(),
        "{what}: length {} but expected {}",
        actual.len(),
        expected.len()
    );
    // The worst element is the one exceeding its allowance by the most.
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let a = f64::from(a);
        let allowance = rel_tol * e.abs().max(1.0);
        let err = (a - e).abs();
        let ok = a.is_finite() && err <= allowance;
        let excess = if a.is_finite() {
            err - allowance
        } else {
            f64::INFINITY
        };
        if !ok && worst.is_none_or(|(_, w)| excess > w) {
            worst = Some((i, excess));
        }
    }
    if let Some((i, _)) = worst {
        let (a, e) = (f64::from(actual[i]), expected[i]);
        panic!(
            "{what}: element {i} of {} is {a:e}, expected {e:e} (error {:e}, tolerance {rel_tol:e} * max(1, |expected|))",
            actual.len(),
            (a - e).abs()
        );
    }
}

/// `op(a) · op(b)`, `[m, n]`: `a` is `[m, k]` (`[k, m]` when `trans_a`), `b` is `[k, n]`
/// (`[n, k]` when `trans_b`), all row-major.
pub fn matmul(
    a: &[f64],
    b: &[f64],
    m: usize,
    k: usize,
    n: usize,
    trans_a: bool,
    trans_b: bool,
) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0;
            for p in 0..k {
                let av = if trans_a { a[p * m + i] } else { a[i * k + p] };
                let bv = if trans_b { b[j * k + p] } else { b[p * n + j] };
                s += av * bv;
            }
            out[i * n + j] = s;
        }
    }
    out
}

/// `act(x)` for one value: linear `x`, relu `max(x, 0)`, selu
/// `SCALE * (x > 0 ? x : ALPHA * (e^x - 1))`.
pub fn activate(x: f64, act: Activation) -> f64 {
    match act {
        Activation::Linear => x,
        Activation::Relu => x.max(0.0),
        Activation::Selu => {
            if x > 0.0 {
                SELU_SCALE * x
            } else {
                SELU_SCALE * SELU_ALPHA * x.exp_m1()
            }
        }
    }
}

/// `act(x)` element-wise.
pub fn activation(x: &[f64], act: Activation) -> Vec<f64> {
    x.iter().map(|&v| activate(v, act)).collect()
}

/// `dy * act'(x)` from the activation's INPUT `x` (relu: `x > 0 ? dy : 0`; selu:
/// `x > 0 ? dy * SCALE : dy * SCALE * ALPHA * e^x`).
pub fn activation_backward_from_input(dy: &[f64], x: &[f64], act: Activation) -> Vec<f64> {
    dy.iter()
        .zip(x)
        .map(|(&dy, &x)| match act {
            Activation::Linear => dy,
            Activation::Relu => {
                if x > 0.0 {
                    dy
                } else {
                    0.0
                }
            }
            Activation::Selu => {
                if x > 0.0 {
                    dy * SELU_SCALE
                } else {
                    dy * SELU_SCALE * SELU_ALPHA * x.exp()
                }
            }
        })
        .collect()
}

/// `dy * act'(.)` from the activation's OUTPUT `y`, the form the kernels use: relu
/// `y > 0 ? dy : 0`; selu `y > 0 ? dy * SCALE : dy * (y + SCALE * ALPHA)` (since for `x <= 0`,
/// `y + SCALE * ALPHA = SCALE * ALPHA * e^x`); linear `dy`.
pub fn activation_backward(dy: &[f64], y: &[f64], act: Activation) -> Vec<f64> {
    dy.iter()
        .zip(y)
        .map(|(&dy, &y)| match act {
            Activation::Linear => dy,
            Activation::Relu => {
                if y > 0.0 {
                    dy
                } else {
                    0.0
                }
            }
            Activation::Selu => {
                if y > 0.0 {
                    dy * SELU_SCALE
                } else {
                    dy * (y + SELU_SCALE * SELU_ALPHA)
                }
            }
        })
        .collect()
}

/// `act(z[r, c] + bias[c])` over a row-major `[rows, cols]` matrix (`cols = bias.len()`;
/// no bias: `act(z)`).
pub fn bias_act(z: &[f64], bias: Option<&[f64]>, act: Activation) -> Vec<f64> {
    z.iter()
        .enumerate()
        .map(|(i, &v)| {
            let b = bias.map_or(0.0, |b| b[i % b.len()]);
            activate(v + b, act)
        })
        .collect()
}

/// `act(a · b + bias)`, `a` `[m, k]`, `b` `[k, n]`, `bias` `[n]` (a `Dense` layer).
pub fn matmul_bias_act(
    a: &[f64],
    b: &[f64],
    bias: Option<&[f64]>,
    m: usize,
    k: usize,
    n: usize,
    act: Activation,
) -> Vec<f64> {
    bias_act(&matmul(a, b, m, k, n, false, false), bias, act)
}

/// `Σ x`.
pub fn sum(x: &[f64]) -> f64 {
    x.iter().sum()
}

/// Column sums of a row-major `[rows, cols]` matrix: `out[c] = Σ_r x[r, c]`.
pub fn sum_rows(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; cols];
    for r in 0..rows {
        for c in 0..cols {
            out[c] += x[r * cols + c];
        }
    }
    out
}

#[cfg(test)]
mod tests;
