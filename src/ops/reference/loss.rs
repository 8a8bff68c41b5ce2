//! Softmax, the sparse cross-entropy, accuracy, and Keras' losses and metrics on float targets
//! (`ops/loss.rs`).

/// `probs[r, c] = e^{x[r, c]} / Σ_q e^{x[r, q]}`, computed as `e^{x - max}` for range.
pub fn softmax(logits: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        let row = &logits[r * cols..(r + 1) * cols];
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|&v| (v - max).exp()).sum();
        for c in 0..cols {
            out[r * cols + c] = (row[c] - max).exp() / sum;
        }
    }
    out
}

/// Sparse categorical cross-entropy on logits: returns `(loss, dlogits)` with
/// `loss[r] = ln Σ_c e^{x[r, c]} - x[r, label[r]]` (per row) and
/// `dlogits[r, c] = (softmax(x)[r, c] - [c == label[r]]) / rows`, the gradient of the mean loss.
pub fn softmax_cross_entropy(
    logits: &[f64],
    labels: &[i32],
    rows: usize,
    cols: usize,
) -> (Vec<f64>, Vec<f64>) {
    let probs = softmax(logits, rows, cols);
    let mut loss = vec![0.0; rows];
    let mut grad = vec![0.0; rows * cols];
    for r in 0..rows {
        let row = &logits[r * cols..(r + 1) * cols];
        let label = labels[r] as usize;
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|&v| (v - max).exp()).sum::<f64>().ln();
        loss[r] = lse - row[label];
        for c in 0..cols {
            let onehot = if c == label { 1.0 } else { 0.0 };
            grad[r * cols + c] = (probs[r * cols + c] - onehot) / rows as f64;
        }
    }
    (loss, grad)
}

/// Row-wise argmax of a row-major `[rows, cols]` matrix, the first maximum on ties.
pub fn argmax_rows(x: &[f64], rows: usize, cols: usize) -> Vec<i32> {
    (0..rows)
        .map(|r| {
            let row = &x[r * cols..(r + 1) * cols];
            let mut best = 0;
            for c in 1..cols {
                if row[c] > row[best] {
                    best = c;
                }
            }
            best as i32
        })
        .collect()
}

/// How many rows' argmax (first maximum) equals the label.
pub fn accuracy_count(logits: &[f64], labels: &[i32], rows: usize, cols: usize) -> u32 {
    argmax_rows(logits, rows, cols)
        .iter()
        .zip(labels)
        .filter(|(a, l)| a == l)
        .count() as u32
}

/// Keras' losses on float targets, naively in f64: `(per-row loss × row_scale, dz × grad_scale)`
/// for `[rows, cols]` `z` and targets `y`, as [`crate::ops::loss::dense_loss`] defines them.
pub fn dense_loss(
    z: &[f64],
    y: &[f64],
    p: &crate::ops::nn_kernels::LossParams,
) -> (Vec<f64>, Vec<f64>) {
    use crate::ops::nn_kernels::LossKind as K;
    let (rows, cols) = (p.rows, p.cols);
    let eps = f64::from(1e-7f32);
    let hi = f64::from(1.0f32 - 1e-7f32);
    let ls = f64::from(p.label_smoothing);
    let n = cols as f64;
    let mut loss = vec![0.0; rows];
    let mut dz = vec![0.0; rows * cols];
    for r in 0..rows {
        let zr = &z[r * cols..(r + 1) * cols];
        let yr = &y[r * cols..(r + 1) * cols];
        let d = &mut dz[r * cols..(r + 1) * cols];
        let smooth = |v: f64, k: f64| v * (1.0 - ls) + ls / k;
        let l = match p.kind {
            K::CategoricalLogits => {
                let probs = softmax(zr, 1, cols);
                let max = zr.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lse = max + zr.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
                let mut l = 0.0;
                for c in 0..cols {
                    let yc = smooth(yr[c], n);
                    l += yc * (lse - zr[c]);
                    d[c] = probs[c] - yc;
                }
                l
            }
            K::CategoricalProbs => {
                let total: f64 = zr.iter().sum();
                let q: Vec<f64> = zr.iter().map(|v| v / total).collect();
                let g: Vec<f64> = (0..cols)
                    .map(|c| {
                        let yc = smooth(yr[c], n);
                        if q[c] >= eps && q[c] <= hi {
                            -yc / q[c]
                        } else {
                            0.0
                        }
                    })
                    .collect();
                for (j, dj) in d.iter_mut().enumerate() {
                    // dq_c/dz_j = ([c == j] - q_c) / total.
                    *dj = (0..cols)
                        .map(|c| g[c] * (f64::from(u8::from(c == j)) - q[c]) / total)
                        .sum();
                }
                (0..cols)
                    .map(|c| -smooth(yr[c], n) * q[c].clamp(eps, hi).ln())
                    .sum()
            }
            K::BinaryLogits => {
                let mut l = 0.0;
                for c in 0..cols {
                    let yc = smooth(yr[c], 2.0);
                    let v = zr[c];
                    l += v.max(0.0) - v * yc + (-v.abs()).exp().ln_1p();
                    d[c] = (1.0 / (1.0 + (-v).exp()) - yc) / n;
                }
                l / n
            }
            K::BinaryProbs => {
                let mut l = 0.0;
                for c in 0..cols {
                    let yc = smooth(yr[c], 2.0);
                    let q = zr[c].clamp(eps, hi);
                    l -= yc * q.ln() + (1.0 - yc) * (1.0 - q).ln();
                    d[c] = if zr[c] >= eps && zr[c] <= hi {
                        -(yc / q - (1.0 - yc) / (1.0 - q)) / n
                    } else {
                        0.0
                    };
                }
                l / n
            }
            K::MeanSquared | K::MeanAbsolute => {
                let o = output_activation(zr, p.act);
                let mut l = 0.0;
                let mut g = vec![0.0; cols];
                for c in 0..cols {
                    let diff = o[c] - yr[c];
                    if p.kind == K::MeanSquared {
                        l += diff * diff;
                        g[c] = 2.0 * diff / n;
                    } else {
                        l += diff.abs();
                        g[c] = if diff == 0.0 { 0.0 } else { diff.signum() / n };
                    }
                }
                // Through o = act(z), with the full Jacobian for the softmax.
                for j in 0..cols {
                    d[j] = match p.act {
                        crate::ops::nn_kernels::OutputActivation::Identity => g[j],
                        crate::ops::nn_kernels::OutputActivation::Sigmoid => {
                            g[j] * o[j] * (1.0 - o[j])
                        }
                        crate::ops::nn_kernels::OutputActivation::Softmax => (0..cols)
                            .map(|c| g[c] * o[c] * (f64::from(u8::from(c == j)) - o[j]))
                            .sum(),
                    };
                }
                l / n
            }
        };
        loss[r] = l * f64::from(p.row_scale);
        for v in d.iter_mut() {
            *v *= f64::from(p.grad_scale);
        }
    }
    (loss, dz)
}

/// `act(z)` for one row.
pub fn output_activation(z: &[f64], act: crate::ops::nn_kernels::OutputActivation) -> Vec<f64> {
    match act {
        crate::ops::nn_kernels::OutputActivation::Identity => z.to_vec(),
        crate::ops::nn_kernels::OutputActivation::Sigmoid => {
            z.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect()
        }
        crate::ops::nn_kernels::OutputActivation::Softmax => softmax(z, 1, z.len()),
    }
}

/// Each row's metric value (see [`crate::ops::loss::MetricKind`]); `labels` for the top-k
/// metric, `y` (like `z`) for the others.
pub fn metric_rows(
    z: &[f64],
    y: &[f64],
    labels: &[i32],
    (rows, cols): (usize, usize),
    kind: crate::ops::nn_kernels::MetricKind,
    act: crate::ops::nn_kernels::OutputActivation,
) -> Vec<f64> {
    use crate::ops::nn_kernels::MetricKind as M;
    (0..rows)
        .map(|r| {
            let o = output_activation(&z[r * cols..(r + 1) * cols], act);
            let yr = || &y[r * cols..(r + 1) * cols];
            let hit = |b: bool| f64::from(u8::from(b));
            match kind {
                M::SparseTopK(k) => {
                    let l = labels[r];
                    if l < 0 || l as usize >= cols || o.iter().any(|v| !v.is_finite()) {
                        return 0.0;
                    }
                    let t = o[l as usize];
                    hit(o.iter().filter(|&&v| v > t).count() < k)
                }
                M::Categorical => hit(argmax_rows(&o, 1, cols) == argmax_rows(yr(), 1, cols)),
                M::Binary(th) => {
                    let th = f64::from(th);
                    let hits = o
                        .iter()
                        .zip(yr())
                        .filter(|(o, y)| hit(**o > th) == **y)
                        .count();
                    hits as f64 / cols as f64
                }
                M::MeanSquared => {
                    o.iter()
                        .zip(yr())
                        .map(|(o, y)| (o - y) * (o - y))
                        .sum::<f64>()
                        / cols as f64
                }
            }
        })
        .collect()
}
