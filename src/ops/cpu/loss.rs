//! Losses on float targets and the metrics of `ops::loss`, row by row (one rayon task per
//! block of rows; every row is independent, so the result does not depend on the threads).

use rayon::prelude::*;

use crate::ops::loss::{LossKind, LossParams, MetricKind, OutputActivation};

/// Keras' `backend.epsilon()`: where probabilities are clipped.
const EPSILON: f32 = 1e-7;

/// Rows per rayon task: class counts are small, so a row is little work.
const ROWS_PER_TASK: usize = 64;

/// `1 / (1 + e^{-z})`, without overflow on either side (as `loss.wgsl`).
pub(crate) fn sigmoid_f32(z: f32) -> f32 {
    if z >= 0.0 {
        1.0 / (1.0 + (-z).exp())
    } else {
        let e = z.exp();
        e / (1.0 + e)
    }
}

/// `y = sigmoid(x)`.
pub(crate) fn sigmoid(x: &[f32], y: &mut [f32]) {
    y.par_chunks_mut(4096)
        .zip(x.par_chunks(4096))
        .for_each(|(y, x)| {
            for (y, &x) in y.iter_mut().zip(x) {
                *y = sigmoid_f32(x);
            }
        });
}

/// `o = act(z)` for one row.
fn activate(z: &[f32], act: OutputActivation, o: &mut [f32]) {
    match act {
        OutputActivation::Identity => o.copy_from_slice(z),
        OutputActivation::Sigmoid => {
            for (o, &z) in o.iter_mut().zip(z) {
                *o = sigmoid_f32(z);
            }
        }
        OutputActivation::Softmax => {
            let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut s = 0.0f32;
            for (o, &z) in o.iter_mut().zip(z) {
                *o = (z - m).exp();
                s += *o;
            }
            for o in o.iter_mut() {
                *o /= s;
            }
        }
    }
}

/// One row's loss and `dz` (unscaled: the caller multiplies).
fn loss_row(z: &[f32], y: &[f32], dz: &mut [f32], p: &LossParams) -> f32 {
    let n = z.len() as f32;
    let ls = p.label_smoothing;
    match p.kind {
        LossKind::CategoricalLogits => {
            let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let s: f32 = z.iter().map(|&v| (v - m).exp()).sum();
            let lse = s.ln() + m;
            let mut loss = 0.0f32;
            for ((d, &zc), &yc) in dz.iter_mut().zip(z).zip(y) {
                let yc = yc * (1.0 - ls) + ls / n;
                loss += yc * (lse - zc);
                *d = (zc - m).exp() / s - yc;
            }
            loss
        }
        LossKind::CategoricalProbs => {
            let total: f32 = z.iter().sum();
            let mut loss = 0.0f32;
            // dL/dq_c, then through q = z / Σ z: dz_j = (g_j − Σ_c g_c q_c) / Σ z.
            let mut gq = 0.0f32;
            for ((d, &zc), &yc) in dz.iter_mut().zip(z).zip(y) {
                let yc = yc * (1.0 - ls) + ls / n;
                let q = zc / total;
                let qc = q.clamp(EPSILON, 1.0 - EPSILON);
                loss -= yc * qc.ln();
                *d = if (EPSILON..=1.0 - EPSILON).contains(&q) {
                    -yc / qc
                } else {
                    0.0
                };
                gq += *d * q;
            }
            for d in dz.iter_mut() {
                *d = (*d - gq) / total;
            }
            loss
        }
        LossKind::BinaryLogits => {
            let mut loss = 0.0f32;
            for ((d, &zc), &yc) in dz.iter_mut().zip(z).zip(y) {
                let yc = yc * (1.0 - ls) + 0.5 * ls;
                loss += zc.max(0.0) - zc * yc + (-zc.abs()).exp().ln_1p();
                *d = (sigmoid_f32(zc) - yc) / n;
            }
            loss / n
        }
        LossKind::BinaryProbs => {
            let mut loss = 0.0f32;
            for ((d, &zc), &yc) in dz.iter_mut().zip(z).zip(y) {
                let yc = yc * (1.0 - ls) + 0.5 * ls;
                let pc = zc.clamp(EPSILON, 1.0 - EPSILON);
                loss -= yc * pc.ln() + (1.0 - yc) * (1.0 - pc).ln();
                *d = if (EPSILON..=1.0 - EPSILON).contains(&zc) {
                    -(yc / pc - (1.0 - yc) / (1.0 - pc)) / n
                } else {
                    0.0
                };
            }
            loss / n
        }
        LossKind::MeanSquared | LossKind::MeanAbsolute => {
            let mut o = vec![0.0f32; z.len()];
            activate(z, p.act, &mut o);
            let mut loss = 0.0f32;
            for ((d, &oc), &yc) in dz.iter_mut().zip(&o).zip(y) {
                let diff = oc - yc;
                if p.kind == LossKind::MeanSquared {
                    loss += diff * diff;
                    *d = 2.0 * diff / n;
                } else {
                    loss += diff.abs();
                    *d = sign(diff) / n;
                }
            }
            chain(&o, p.act, dz);
            loss / n
        }
    }
}

/// TensorFlow's `sign`: 0 at 0.
fn sign(v: f32) -> f32 {
    if v > 0.0 {
        1.0
    } else if v < 0.0 {
        -1.0
    } else {
        0.0
    }
}

/// `dz` from `do` (in place) through `o = act(z)`.
fn chain(o: &[f32], act: OutputActivation, d: &mut [f32]) {
    match act {
        OutputActivation::Identity => {}
        OutputActivation::Sigmoid => {
            for (d, &o) in d.iter_mut().zip(o) {
                *d *= o * (1.0 - o);
            }
        }
        OutputActivation::Softmax => {
            let dot: f32 = d.iter().zip(o).map(|(d, o)| d * o).sum();
            for (d, &o) in d.iter_mut().zip(o) {
                *d = o * (*d - dot);
            }
        }
    }
}

/// Per-row loss (times `row_scale`) and `dz` (times `grad_scale`) of `[rows, cols]` `z`
/// against `y` of the same length.
pub(crate) fn dense_loss(z: &[f32], y: &[f32], loss: &mut [f32], dz: &mut [f32], p: &LossParams) {
    let cols = p.cols;
    if p.rows == 0 || cols == 0 {
        loss[..p.rows].fill(0.0);
        return;
    }
    let block = ROWS_PER_TASK * cols;
    loss[..p.rows]
        .par_chunks_mut(ROWS_PER_TASK)
        .zip(dz[..p.rows * cols].par_chunks_mut(block))
        .zip(z[..p.rows * cols].par_chunks(block))
        .zip(y[..p.rows * cols].par_chunks(block))
        .for_each(|(((loss, dz), z), y)| {
            for (r, l) in loss.iter_mut().enumerate() {
                let row = r * cols..(r + 1) * cols;
                let d = &mut dz[row.clone()];
                *l = loss_row(&z[row.clone()], &y[row], d, p) * p.row_scale;
                for v in d.iter_mut() {
                    *v *= p.grad_scale;
                }
            }
        });
}

/// One row's metric value.
fn metric_row(
    z: &[f32],
    y: Option<&[f32]>,
    label: i32,
    kind: MetricKind,
    act: OutputActivation,
) -> f32 {
    let mut o = vec![0.0f32; z.len()];
    activate(z, act, &mut o);
    let first_max = |v: &[f32]| {
        let mut at = 0;
        for (c, &x) in v.iter().enumerate() {
            if x > v[at] {
                at = c;
            }
        }
        at
    };
    match (kind, y) {
        (MetricKind::SparseTopK(k), _) => {
            let Some(target) = usize::try_from(label).ok().filter(|&l| l < o.len()) else {
                return 0.0;
            };
            if o.iter().any(|v| !v.is_finite()) {
                return 0.0;
            }
            let t = o[target];
            let above = o.iter().filter(|&&v| v > t).count();
            f32::from(u8::from(above < k))
        }
        (MetricKind::Categorical, Some(y)) => {
            f32::from(u8::from(!o.is_empty() && first_max(y) == first_max(&o)))
        }
        (MetricKind::Binary(threshold), Some(y)) => {
            let hits = o
                .iter()
                .zip(y)
                .filter(|&(&o, &y)| f32::from(u8::from(o > threshold)) == y)
                .count();
            hits as f32 / o.len() as f32
        }
        (MetricKind::MeanSquared, Some(y)) => {
            let s: f32 = o.iter().zip(y).map(|(o, y)| (o - y) * (o - y)).sum();
            s / o.len() as f32
        }
        _ => 0.0,
    }
}

/// Each row's metric value into `out[..rows]`: `targets` are f32 like `z`, or one i32 label
/// per row (`labels`) for the top-k metric.
pub(crate) fn metric_rows(
    z: &[f32],
    (targets, labels): (Option<&[f32]>, Option<&[i32]>),
    out: &mut [f32],
    (rows, cols): (usize, usize),
    kind: MetricKind,
    act: OutputActivation,
) {
    out[..rows].par_iter_mut().enumerate().for_each(|(r, v)| {
        let row = r * cols..(r + 1) * cols;
        let y = targets.map(|t| &t[row.clone()]);
        let label = labels.map_or(-1, |l| l[r]);
        *v = metric_row(&z[row], y, label, kind, act);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_counts_ties_at_the_boundary_as_in() {
        let p = |z: &[f32], l: i32, k| {
            metric_row(
                z,
                None,
                l,
                MetricKind::SparseTopK(k),
                OutputActivation::Identity,
            )
        };
        // Three classes tie for first: each is in the top 1 (TF's in_top_k).
        assert_eq!(p(&[0.3, 0.3, 0.3, 0.1], 2, 1), 1.0);
        assert_eq!(p(&[0.3, 0.3, 0.3, 0.1], 3, 3), 0.0);
        assert_eq!(p(&[0.3, 0.3, 0.3, 0.1], 3, 4), 1.0);
        // Out of range, or a non-finite score in the row: never in.
        assert_eq!(p(&[0.3, 0.2], 2, 2), 0.0);
        assert_eq!(p(&[0.3, 0.2], -1, 2), 0.0);
        assert_eq!(p(&[f32::NAN, 0.2], 1, 2), 0.0);
    }
}
