//! Row-wise softmax, the fused softmax + sparse categorical cross-entropy, and accuracy.
//!
//! Every row is shifted by its maximum before exponentiating, so logits of any magnitude
//! (±1e4 and beyond) give finite probabilities, losses and gradients.

use rayon::prelude::*;

use super::elementwise::exp_approx;
use super::PAR_MIN_ELEMS;

/// The largest element of a non-empty row (NaNs are skipped unless the row is all NaN).
#[inline(always)]
fn row_max(row: &[f32]) -> f32 {
    let mut max = f32::NEG_INFINITY;
    for &v in row {
        if v > max {
            max = v;
        }
    }
    max
}

multiversion! {
    /// `probs = exp(row - max) / Σ exp(row - max)` for one row; returns `ln Σ exp(row - max)`
    /// and the row maximum.
    fn softmax_row<const FMA: bool>(row: &[f32], probs: &mut [f32]) -> (f32, f32) {
        let max = row_max(row);
        let mut sum = 0.0f32;
        for (p, &x) in probs.iter_mut().zip(row) {
            let e = exp_approx::<FMA>(x - max);
            *p = e;
            sum += e;
        }
        let inv = 1.0 / sum;
        for p in probs.iter_mut() {
            *p *= inv;
        }
        (sum.ln(), max)
    }
}

/// Rows per rayon task.
fn rows_per_task(rows: usize, cols: usize) -> usize {
    if rows * cols < PAR_MIN_ELEMS {
        rows.max(1)
    } else {
        (PAR_MIN_ELEMS / 2).div_ceil(cols.max(1)).max(1)
    }
}

/// Numerically stable softmax of each row of a row-major `[rows, cols]` matrix.
pub(crate) fn softmax(logits: &[f32], probs: &mut [f32], rows: usize, cols: usize) {
    assert_eq!(
        logits.len(),
        rows * cols,
        "softmax: logits must have rows*cols elements"
    );
    assert_eq!(
        probs.len(),
        rows * cols,
        "softmax: probs must have rows*cols elements"
    );
    if cols == 0 {
        return;
    }
    let per = rows_per_task(rows, cols) * cols;
    probs
        .par_chunks_mut(per)
        .zip(logits.par_chunks(per))
        .for_each(|(probs, logits)| {
            for (p, x) in probs.chunks_exact_mut(cols).zip(logits.chunks_exact(cols)) {
                softmax_row(x, p);
            }
        });
}

/// Sparse categorical cross-entropy fused with softmax.
///
/// `loss[r] = logsumexp(row) - row[label]` (per row, not averaged) and
/// `dlogits = (softmax(row) - onehot(label)) / rows`, the gradient of the batch-mean loss.
/// Labels must lie in `0..cols` (checked: panics otherwise).
pub(crate) fn softmax_cross_entropy(
    logits: &[f32],
    labels: &[i32],
    loss: &mut [f32],
    dlogits: &mut [f32],
    rows: usize,
    cols: usize,
) {
    assert_eq!(
        logits.len(),
        rows * cols,
        "softmax_cross_entropy: logits must be rows*cols"
    );
    assert_eq!(
        labels.len(),
        rows,
        "softmax_cross_entropy: labels must have rows elements"
    );
    assert_eq!(
        loss.len(),
        rows,
        "softmax_cross_entropy: loss must have rows elements"
    );
    assert_eq!(
        dlogits.len(),
        rows * cols,
        "softmax_cross_entropy: dlogits must be rows*cols"
    );
    if rows == 0 {
        return;
    }
    assert!(
        cols > 0,
        "softmax_cross_entropy: a row needs at least one class"
    );
    let inv_rows = 1.0 / rows as f32;
    let per = rows_per_task(rows, cols);
    dlogits
        .par_chunks_mut(per * cols)
        .zip(logits.par_chunks(per * cols))
        .zip(loss.par_chunks_mut(per))
        .zip(labels.par_chunks(per))
        .for_each(|(((dlogits, logits), loss), labels)| {
            for (((d, x), l), &label) in dlogits
                .chunks_exact_mut(cols)
                .zip(logits.chunks_exact(cols))
                .zip(loss.iter_mut())
                .zip(labels)
            {
                let label = usize::try_from(label).unwrap_or(usize::MAX);
                assert!(
                    label < cols,
                    "softmax_cross_entropy: label out of 0..{cols}"
                );
                let (log_sum, max) = softmax_row(x, d);
                // logsumexp(row) - row[label] = ln Σ exp(row - max) + (max - row[label]).
                *l = log_sum + (max - x[label]);
                d[label] -= 1.0;
                d.iter_mut().for_each(|d| *d *= inv_rows);
            }
        });
}

/// How many rows' argmax (first maximum on ties) equals the label.
pub(crate) fn accuracy_count(logits: &[f32], labels: &[i32], rows: usize, cols: usize) -> u32 {
    assert_eq!(
        logits.len(),
        rows * cols,
        "accuracy_count: logits must be rows*cols"
    );
    assert_eq!(
        labels.len(),
        rows,
        "accuracy_count: labels must have rows elements"
    );
    if cols == 0 {
        return 0;
    }
    let hits = logits
        .chunks_exact(cols)
        .zip(labels)
        .filter(|(row, &label)| super::reduce::argmax(row) as i64 == i64::from(label))
        .count();
    u32::try_from(hits).unwrap_or(u32::MAX)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::ops::reference::{self as r, assert_close, random_vec, to_f64};

    #[test]
    pub(in crate::ops::cpu) fn matches_reference() {
        for (rows, cols) in [(1, 1), (3, 7), (13, 10), (128, 10), (7000, 13)] {
            let logits: Vec<f32> = random_vec(rows * cols, rows as u64)
                .iter()
                .map(|v| 8.0 * v)
                .collect();
            let labels: Vec<i32> = (0..rows).map(|r| ((r * 7 + 3) % cols) as i32).collect();
            let l64 = to_f64(&logits);
            let mut probs = vec![f32::NAN; rows * cols];
            softmax(&logits, &mut probs, rows, cols);
            assert_close(&probs, &r::softmax(&l64, rows, cols), 1e-5, "softmax");
            let mut loss = vec![f32::NAN; rows];
            let mut grad = vec![f32::NAN; rows * cols];
            softmax_cross_entropy(&logits, &labels, &mut loss, &mut grad, rows, cols);
            let (eloss, egrad) = r::softmax_cross_entropy(&l64, &labels, rows, cols);
            assert_close(&loss, &eloss, 1e-5, "xent loss");
            // The gradient is divided by rows: compare it scaled back up.
            let scaled: Vec<f32> = grad.iter().map(|g| g * rows as f32).collect();
            let escaled: Vec<f64> = egrad.iter().map(|g| g * rows as f64).collect();
            assert_close(&scaled, &escaled, 1e-5, "xent grad");
            let hits = accuracy_count(&logits, &labels, rows, cols);
            assert_eq!(hits, r::accuracy_count(&l64, &labels, rows, cols));
        }
    }

    #[test]
    fn huge_logits_stay_finite() {
        let logits = [1e4f32, -1e4, 0.0, -1e4, 1e4, 1e4, 3e4, -3e4, 2e4];
        let labels = [1, 0, 2];
        let (mut loss, mut grad, mut probs) = ([f32::NAN; 3], [f32::NAN; 9], [f32::NAN; 9]);
        softmax_cross_entropy(&logits, &labels, &mut loss, &mut grad, 3, 3);
        softmax(&logits, &mut probs, 3, 3);
        let l64 = to_f64(&logits);
        let (eloss, egrad) = r::softmax_cross_entropy(&l64, &labels, 3, 3);
        assert_close(&loss, &eloss, 1e-6, "huge loss");
        assert_close(&grad, &egrad, 1e-6, "huge grad");
        assert_close(&probs, &r::softmax(&l64, 3, 3), 1e-6, "huge probs");
        assert_eq!(loss[0], 2e4);
    }

    #[test]
    fn accuracy_takes_the_first_maximum() {
        let logits = [1.0, 3.0, 3.0, 0.0, 0.0, 0.0];
        assert_eq!(accuracy_count(&logits, &[1, 0], 2, 3), 2);
        assert_eq!(accuracy_count(&logits, &[2, 1], 2, 3), 0);
    }
}
