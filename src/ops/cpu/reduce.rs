//! Reductions: total sum, column sums (bias gradients) and row-wise argmax.
//!
//! Sums accumulate in f64, so a million f32 terms lose nothing visible at f32 precision.

use super::{ordered_reduce, ordered_sums, PAR_CHUNK, PAR_MIN_ELEMS};

multiversion! {
    /// Σ x in f64, with 8 independent lanes so the loop vectorizes.
    fn sum_leaf(x: &[f32]) -> f64 {
        let mut lanes = [0.0f64; 8];
        let mut chunks = x.chunks_exact(8);
        for c in &mut chunks {
            for (l, &v) in lanes.iter_mut().zip(c) {
                *l += f64::from(v);
            }
        }
        let tail: f64 = chunks.remainder().iter().map(|&v| f64::from(v)).sum();
        lanes.iter().sum::<f64>() + tail
    }
}

/// Σ x, accumulated in f64 (returned rounded to f32).
pub(crate) fn sum_all(x: &[f32]) -> f32 {
    let total = if x.len() < PAR_MIN_ELEMS {
        sum_leaf(x)
    } else {
        let chunk = |t: usize| &x[t * PAR_CHUNK..((t + 1) * PAR_CHUNK).min(x.len())];
        let tasks = x.len().div_ceil(PAR_CHUNK);
        ordered_reduce(
            tasks,
            || 0.0,
            |acc, t| acc + sum_leaf(chunk(t)),
            |a, b| a + b,
        )
        .unwrap_or(0.0)
    };
    total as f32
}

multiversion! {
    /// `acc[c] += Σ_r x[r, c]` over the rows of a row-major block, in f64.
    pub(super) fn sum_rows_leaf(x: &[f32], cols: usize, acc: &mut [f64]) {
        for row in x.chunks_exact(cols) {
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += f64::from(v);
            }
        }
    }
}

multiversion! {
    /// `acc[c] += Σ_r x[r, c]` over the rows of a row-major block, in f32, row after row (the
    /// bias sums of fused backward passes, whose partials are added in a fixed order after).
    pub(super) fn add_rows_leaf(x: &[f32], cols: usize, acc: &mut [f32]) {
        for row in x.chunks_exact(cols) {
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += v;
            }
        }
    }
}

/// Column sums of a row-major `[rows, cols]` matrix: `out[c] = Σ_r x[r, c]` (bias gradients),
/// accumulated in f64.
pub(crate) fn sum_rows(x: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
    assert_eq!(
        x.len(),
        rows * cols,
        "sum_rows: x must have rows*cols elements"
    );
    assert_eq!(out.len(), cols, "sum_rows: out must have cols elements");
    if cols == 0 {
        return;
    }
    let acc = if x.len() < PAR_MIN_ELEMS {
        let mut acc = vec![0.0f64; cols];
        sum_rows_leaf(x, cols, &mut acc);
        acc
    } else {
        let block = PAR_CHUNK.div_ceil(cols) * cols;
        ordered_sums(x.len().div_ceil(block), cols, |acc, t| {
            sum_rows_leaf(&x[t * block..((t + 1) * block).min(x.len())], cols, acc);
        })
    };
    out.iter_mut().zip(&acc).for_each(|(o, &a)| *o = a as f32);
}

/// Index of the first maximum of a row (0 for an empty row; NaNs never win).
pub(crate) fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    let mut best_value = f32::NEG_INFINITY;
    for (i, &v) in row.iter().enumerate() {
        if v > best_value {
            best = i;
            best_value = v;
        }
    }
    best
}

/// Row-wise argmax of a row-major `[rows, cols]` matrix (first maximum on ties).
pub(crate) fn argmax_rows(x: &[f32], rows: usize, cols: usize, out: &mut [i32]) {
    assert_eq!(
        x.len(),
        rows * cols,
        "argmax_rows: x must have rows*cols elements"
    );
    assert_eq!(out.len(), rows, "argmax_rows: out must have rows elements");
    if cols == 0 {
        out.fill(0);
        return;
    }
    for (o, row) in out.iter_mut().zip(x.chunks_exact(cols)) {
        *o = i32::try_from(argmax(row)).unwrap_or(i32::MAX);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::ops::reference::{self as r, assert_close, random_vec, to_f64};

    #[test]
    pub(in crate::ops::cpu) fn sums_match_reference() {
        for len in [1, 3, 7, 13, 28, 1_000_003] {
            let x = random_vec(len, len as u64);
            let got = sum_all(&x);
            let expected = r::sum(&to_f64(&x));
            assert_close(&[got], &[expected], 1e-6, &format!("sum_all {len}"));
        }
        // A million ones plus a tiny value: f32 sequential summation would stall at 2^24.
        let x = vec![1.0f32; 20_000_000];
        assert_eq!(sum_all(&x), 2e7);
        for (rows, cols) in [(1, 1), (3, 7), (13, 28), (128 * 28 * 28, 32), (100_001, 3)] {
            let x = random_vec(rows * cols, (rows + cols) as u64);
            let mut out = vec![f32::NAN; cols];
            sum_rows(&x, rows, cols, &mut out);
            assert_close(
                &out,
                &r::sum_rows(&to_f64(&x), rows, cols),
                1e-6,
                &format!("sum_rows {rows}x{cols}"),
            );
        }
    }

    #[test]
    fn argmax_matches_reference() {
        for (rows, cols) in [(1, 1), (3, 7), (28, 13)] {
            let x = random_vec(rows * cols, 99);
            let mut out = vec![-1; rows];
            argmax_rows(&x, rows, cols, &mut out);
            assert_eq!(out, r::argmax_rows(&to_f64(&x), rows, cols));
        }
        let mut out = [-1; 2];
        argmax_rows(&[2.0, 5.0, 5.0, -3.0, -3.0, -4.0], 2, 3, &mut out);
        assert_eq!(out, [1, 0]);
    }
}
