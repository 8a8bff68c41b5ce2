//! Batch normalization on CPU:0, over `x` viewed as `[rows, c]` (see
//! [`BatchNormParams`]): per-channel moments (two passes, biased variance, as `tf.nn.moments`),
//! the normalization `y = x * a + b` with `a = gamma / sqrt(var + epsilon)`, `b = beta - mean * a`
//! (`tf.nn.batch_normalization`'s arithmetic), the moving statistics' update, and the fused
//! gradient. Sums run in f64 over fixed blocks of rows added in order
//! ([`ordered_reduce`]), so a result is the same bits on every run.

use rayon::prelude::*;

use crate::ops::cpu::ordered_reduce;
use crate::ops::spec::BatchNormParams;

/// Rows per task of the sums and of the element-wise passes.
const ROWS_PER_TASK: usize = 256;

/// Per-channel sums of `f(row, channel)` over every row, in f64, `width` values per row.
fn column_sums(rows: usize, width: usize, f: impl Fn(usize, &mut [f64]) + Sync) -> Vec<f64> {
    let tasks = rows.div_ceil(ROWS_PER_TASK);
    ordered_reduce(
        tasks,
        || vec![0.0f64; width],
        |mut acc, t| {
            for r in t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(rows) {
                f(r, &mut acc);
            }
            acc
        },
        |mut a, b| {
            a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
            a
        },
    )
    .unwrap_or_else(|| vec![0.0; width])
}

/// `(mean, var)` per channel of `x` (`[rows, c]`, rows > 0): biased variance, two passes.
pub(crate) fn batch_norm_moments(x: &[f32], rows: usize, c: usize) -> (Vec<f32>, Vec<f32>) {
    assert!(
        x.len() >= rows * c,
        "x holds {} values, not {rows}x{c}",
        x.len()
    );
    let sums = column_sums(rows, c, |r, acc| {
        for (a, &v) in acc.iter_mut().zip(&x[r * c..(r + 1) * c]) {
            *a += f64::from(v);
        }
    });
    let mean: Vec<f32> = sums.iter().map(|s| (s / rows as f64) as f32).collect();
    let sq = column_sums(rows, c, |r, acc| {
        for ((a, &v), &m) in acc.iter_mut().zip(&x[r * c..(r + 1) * c]).zip(&mean) {
            let d = f64::from(v) - f64::from(m);
            *a += d * d;
        }
    });
    let var = sq.iter().map(|s| (s / rows as f64) as f32).collect();
    (mean, var)
}

/// `y = x * (gamma * inv) + (beta - mean * gamma * inv)` per channel, `stats = [mean; inv]`.
fn normalize(x: &[f32], gamma: &[f32], beta: &[f32], stats: &[f32], y: &mut [f32], c: usize) {
    let (mean, inv) = stats.split_at(c);
    let a: Vec<f32> = gamma.iter().zip(inv).map(|(g, i)| g * i).collect();
    let b: Vec<f32> = (0..c).map(|j| beta[j] - mean[j] * a[j]).collect();
    let n = y.len().min(x.len());
    y[..n]
        .par_chunks_mut(ROWS_PER_TASK * c)
        .zip(x[..n].par_chunks(ROWS_PER_TASK * c))
        .for_each(|(y, x)| {
            for (yr, xr) in y.chunks_mut(c).zip(x.chunks(c)) {
                for j in 0..c {
                    yr[j] = xr[j] * a[j] + b[j];
                }
            }
        });
}

/// The training forward pass: batch statistics into `stats` (`[mean; inv]`, `2c` values, what
/// the backward pass needs), `y`, and the moving statistics updated in place.
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_norm_train(
    x: &[f32],
    (gamma, beta): (&[f32], &[f32]),
    (moving_mean, moving_var): (&mut [f32], &mut [f32]),
    y: &mut [f32],
    stats: &mut [f32],
    p: &BatchNormParams,
) {
    let (rows, c) = (p.rows, p.channels);
    let (mean, var) = batch_norm_moments(x, rows, c);
    let one_minus = p.one_minus_momentum();
    for j in 0..c {
        stats[j] = mean[j];
        stats[c + j] = 1.0 / (var[j] + p.epsilon).sqrt();
        moving_mean[j] = moving_mean[j] * p.momentum + mean[j] * one_minus;
        moving_var[j] = moving_var[j] * p.momentum + var[j] * one_minus;
    }
    normalize(x, gamma, beta, stats, y, c);
}

/// The inference pass: `y` from the moving statistics.
pub(crate) fn batch_norm_infer(
    x: &[f32],
    (gamma, beta): (&[f32], &[f32]),
    (moving_mean, moving_var): (&[f32], &[f32]),
    y: &mut [f32],
    p: &BatchNormParams,
) {
    let c = p.channels;
    let mut stats = vec![0.0f32; 2 * c];
    for j in 0..c {
        stats[j] = moving_mean[j];
        stats[c + j] = 1.0 / (moving_var[j] + p.epsilon).sqrt();
    }
    normalize(x, gamma, beta, &stats, y, c);
}

/// The gradients of the training pass: `dx`, `dgamma = Σ dy x̂`, `dbeta = Σ dy`, from the
/// forward pass's `stats` (`[mean; inv]`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_norm_backward(
    x: &[f32],
    dy: &[f32],
    gamma: &[f32],
    stats: &[f32],
    dx: &mut [f32],
    (dgamma, dbeta): (&mut [f32], &mut [f32]),
    p: &BatchNormParams,
) {
    let (rows, c) = (p.rows, p.channels);
    let (mean, inv) = stats.split_at(c);
    let sums = column_sums(rows, 2 * c, |r, acc| {
        let (s1, s2) = acc.split_at_mut(c);
        let (xr, gr) = (&x[r * c..(r + 1) * c], &dy[r * c..(r + 1) * c]);
        for j in 0..c {
            s1[j] += f64::from(gr[j]);
            s2[j] += f64::from(gr[j]) * f64::from(xr[j] - mean[j]);
        }
    });
    let n = rows as f32;
    let mut coef = vec![0.0f32; 3 * c];
    for j in 0..c {
        let (s1, s2) = (sums[j] as f32, sums[c + j] as f32);
        let k = gamma[j] * inv[j];
        dbeta[j] = s1;
        dgamma[j] = s2 * inv[j];
        coef[j] = k;
        coef[c + j] = -k * inv[j] * inv[j] * s2 / n;
        coef[2 * c + j] = -k * s1 / n;
    }
    let len = rows * c;
    dx[..len]
        .par_chunks_mut(ROWS_PER_TASK * c)
        .zip(x[..len].par_chunks(ROWS_PER_TASK * c))
        .zip(dy[..len].par_chunks(ROWS_PER_TASK * c))
        .for_each(|((dx, x), dy)| {
            for ((dxr, xr), gr) in dx.chunks_mut(c).zip(x.chunks(c)).zip(dy.chunks(c)) {
                for j in 0..c {
                    dxr[j] = coef[j] * gr[j] + coef[c + j] * (xr[j] - mean[j]) + coef[2 * c + j];
                }
            }
        });
}
