//! Matrix products on the [`gemm`](https://docs.rs/gemm) crate's micro-kernels, plus the
//! fused bias + activation epilogue that `Dense` and the convolutions share.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use crate::ops::spec::Activation;
use crate::shape::product;

use super::elementwise::{act_backward_leaf, bias_act_rows};
use super::reduce::add_rows_leaf;

/// Rows per block of a fused product (`k` inputs and `n` outputs per row): about 64 KiB of
/// rows, small enough to stay in a core's L2 between the product and its epilogue, but at least
/// 256, below which the gemm crate's per-call packing of the other operand costs more than the
/// cache saves. Measured on the tutorial's pointwise shapes at batch 128 (min of 40, ms, fwd /
/// fused bwd), floor 16 → 256: 28×28 32→32 2.7 / 4.4 → 2.1 / 3.7, 14×14 64→64 2.1 / 3.2 →
/// 1.7 / 3.0, 7×7 128→128 1.7 / 2.8 → 1.4 / 2.6; 512 and 1024 were no better.
fn block_rows(n: usize, k: usize) -> usize {
    (16 * 1024 / (n + k).max(1)).max(256)
}

/// Multiply-adds (`m * n * k`) from which a product is worth splitting over rayon's pool.
const PAR_MIN_MACS: usize = 1 << 17;

/// A read-only strided matrix view: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Strided<'a> {
    /// The backing slice.
    pub data: &'a [f32],
    /// Row stride, in elements.
    pub rs: usize,
    /// Column stride, in elements.
    pub cs: usize,
}

impl<'a> Strided<'a> {
    /// A row-major `[rows, cols]` matrix.
    pub fn row_major(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose of a row-major `[cols, rows]` matrix, seen as `[rows, cols]`.
    pub fn transposed(data: &'a [f32], rows: usize) -> Self {
        Self {
            data,
            rs: 1,
            cs: rows,
        }
    }

    /// Panics unless every element of a `rows × cols` view lies inside `data`: the offset of
    /// the last one, `(rows - 1) * rs + (cols - 1) * cs`, computed without wrapping, is below
    /// `data.len()`.
    fn check(&self, rows: usize, cols: usize, what: &str) {
        if rows == 0 || cols == 0 {
            return;
        }
        let last = (rows - 1)
            .checked_mul(self.rs)
            .zip((cols - 1).checked_mul(self.cs))
            .and_then(|(r, c)| r.checked_add(c));
        assert!(
            last.is_some_and(|last| last < self.data.len()),
            "gemm: {what} is {rows}x{cols} (strides {}, {}) but has only {} elements",
            self.rs,
            self.cs,
            self.data.len()
        );
        assert!(
            self.rs <= isize::MAX as usize && self.cs <= isize::MAX as usize,
            "gemm: {what} strides overflow isize"
        );
    }
}

/// `dst = lhs · rhs` (or `dst += lhs · rhs` when `accumulate`), `dst` row-major `[m, n]`,
/// `lhs` `m × k`, `rhs` `k × n`. `parallel` lets the gemm crate use rayon's pool (pass `false`
/// from inside a rayon task).
#[allow(clippy::too_many_arguments)] // m, n, k and the flags are the product; a struct adds nothing
pub(crate) fn gemm_strided(
    dst: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
    lhs: Strided<'_>,
    rhs: Strided<'_>,
    accumulate: bool,
    parallel: bool,
) {
    assert_eq!(product(&[m, n]), Some(dst.len()), "gemm: dst must be m x n");
    if k == 0 && !accumulate {
        dst.fill(0.0);
    }
    // SAFETY: `dst` is m*n initialized elements, borrowed mutably (nothing aliases it).
    unsafe {
        product_into(
            dst.as_mut_ptr(),
            (m, n, k),
            (lhs, rhs),
            accumulate,
            parallel,
        )
    }
}

/// [`gemm_strided`] without `accumulate` into memory not written yet: every element of `dst`
/// is written (zeros for `k == 0`) and none is read, so a caller may take `dst` from a
/// vector's spare capacity instead of zeroing it first (a kernel gradient's per-task partial
/// sums, up to 1.2 MB each, were zeroed only to be overwritten).
pub(crate) fn gemm_strided_uninit(
    dst: &mut [MaybeUninit<f32>],
    (m, n, k): (usize, usize, usize),
    lhs: Strided<'_>,
    rhs: Strided<'_>,
    parallel: bool,
) {
    assert_eq!(product(&[m, n]), Some(dst.len()), "gemm: dst must be m x n");
    if k == 0 {
        dst.fill(MaybeUninit::new(0.0));
    }
    // SAFETY: `dst` is m*n elements borrowed mutably; without `accumulate` none is read.
    unsafe {
        product_into(
            dst.as_mut_ptr().cast(),
            (m, n, k),
            (lhs, rhs),
            false,
            parallel,
        )
    }
}

/// The gemm crate's `dst = lhs · rhs` (`+=` with `accumulate`) for `k > 0`; nothing for
/// `k == 0` or an empty `dst` (the callers' zeros).
///
/// # Safety
/// `dst` points at `m * n` writable elements (a product that does not wrap) that nothing else
/// borrows, initialized where `accumulate`.
unsafe fn product_into(
    dst: *mut f32,
    (m, n, k): (usize, usize, usize),
    (lhs, rhs): (Strided<'_>, Strided<'_>),
    accumulate: bool,
    parallel: bool,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    lhs.check(m, k, "lhs");
    rhs.check(k, n, "rhs");
    let macs = m.saturating_mul(n).saturating_mul(k);
    let parallelism = if parallel && macs >= PAR_MIN_MACS && rayon::current_num_threads() > 1 {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: `dst` holds m*n elements (the caller's contract), written row-major (row stride
    // n, column stride 1); `check` proved every element the views address, (m-1)*rs +
    // (k-1)*cs for lhs and likewise for rhs, lies inside its slice, with strides representable
    // as isize. `dst` is borrowed by no one else, so nothing aliases. With `read_dst == false`
    // the crate never reads `dst` (alpha is ignored) and writes all of it.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            n as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// `out[m, n] = op(a) · op(b)`: `a` is `[m, k]` row-major (`[k, m]` when `trans_a`), `b` is
/// `[k, n]` (`[n, k]` when `trans_b`). `k == 0` gives zeros.
#[allow(clippy::too_many_arguments)] // the integrator's fixed signature
pub(crate) fn matmul(
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    trans_a: bool,
    trans_b: bool,
) {
    assert_eq!(
        product(&[m, k]),
        Some(a.len()),
        "matmul: a must have m*k elements"
    );
    assert_eq!(
        product(&[k, n]),
        Some(b.len()),
        "matmul: b must have k*n elements"
    );
    assert_eq!(
        product(&[m, n]),
        Some(out.len()),
        "matmul: out must have m*n elements"
    );
    let lhs = if trans_a {
        Strided::transposed(a, m)
    } else {
        Strided::row_major(a, k)
    };
    let rhs = if trans_b {
        Strided::transposed(b, k)
    } else {
        Strided::row_major(b, n)
    };
    gemm_strided(out, m, n, k, lhs, rhs, false, true);
}

/// `out = act(a · b + bias)`: `a` `[m, k]`, `b` `[k, n]`, `bias` `[n]` (none: zero), all
/// row-major.
#[allow(clippy::too_many_arguments)] // the integrator's fixed signature
pub(crate) fn matmul_bias_act(
    a: &[f32],
    b: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    act: Activation,
) {
    assert_eq!(
        product(&[m, k]),
        Some(a.len()),
        "matmul_bias_act: a must have m*k elements"
    );
    assert_eq!(
        product(&[k, n]),
        Some(b.len()),
        "matmul_bias_act: b must have k*n elements"
    );
    assert_eq!(
        product(&[m, n]),
        Some(out.len()),
        "matmul_bias_act: out must have m*n elements"
    );
    if let Some(bias) = bias {
        assert_eq!(bias.len(), n, "matmul_bias_act: bias must have n elements");
    }
    if m == 0 || n == 0 {
        return;
    }
    let rhs = Strided::row_major(b, n);
    if m.saturating_mul(n).saturating_mul(k) < PAR_MIN_MACS || rayon::current_num_threads() == 1 {
        gemm_strided(out, m, n, k, Strided::row_major(a, k), rhs, false, false);
        bias_act_rows(out, bias, n, act);
        return;
    }
    let rows_per_task = block_rows(n, k);
    if m.div_ceil(rows_per_task) < 2 * rayon::current_num_threads() {
        // Too few row blocks to keep every core busy (a dense layer's batch): one product,
        // parallel inside, then the epilogue.
        gemm_strided(out, m, n, k, Strided::row_major(a, k), rhs, false, true);
        bias_act_rows(out, bias, n, act);
        return;
    }
    // Row blocks in parallel, each product followed by its epilogue while still in cache.
    out.par_chunks_mut(rows_per_task * n)
        .zip(a.par_chunks(rows_per_task * k))
        .for_each(|(out, a)| {
            let rows = out.len() / n;
            gemm_strided(out, rows, n, k, Strided::row_major(a, k), rhs, false, false);
            bias_act_rows(out, bias, n, act);
        });
}

/// The gradients of `y = act(x · w + b)` from `dy`, in one pass over the rows: with
/// `dz = dy * act'(y)` (from the activated output `y`), `db = Σ_rows dz`, `dw = xᵀ · dz` and,
/// when `dx` is given, `dx = dz · wᵀ`. `x` is `[m, k]`, `w` `[k, n]`, `y`, `dy` `[m, n]`, all
/// row-major.
///
/// Separate passes would stream `dz` through memory four times; here each block of rows goes
/// through all four steps while it is in cache. Row ranges run in parallel, each with its own
/// partial `dw` and `db`, added in range order at the end (the same result on every run with
/// the same number of threads).
#[allow(clippy::too_many_arguments)] // the four tensors of the layer and their gradients
pub(crate) fn dense_backward(
    x: &[f32],
    w: &[f32],
    y: &[f32],
    dy: &[f32],
    dx: Option<&mut [f32]>,
    dw: &mut [f32],
    db: &mut [f32],
    (m, k, n): (usize, usize, usize),
    act: Activation,
) {
    let (mk, kn, mn) = (product(&[m, k]), product(&[k, n]), product(&[m, n]));
    assert!(
        mk == Some(x.len()) && kn == Some(w.len()) && mn == Some(y.len()) && mn == Some(dy.len()),
        "dense_backward: inputs do not match m = {m}, k = {k}, n = {n}"
    );
    assert!(
        kn == Some(dw.len()) && db.len() == n && dx.as_ref().is_none_or(|dx| mk == Some(dx.len())),
        "dense_backward: outputs do not match m = {m}, k = {k}, n = {n}"
    );
    dw.fill(0.0);
    db.fill(0.0);
    if m == 0 || n == 0 {
        if let Some(dx) = dx {
            dx.fill(0.0);
        }
        return;
    }
    if m < 4 * k {
        // Few rows for the size of `w` (a dense layer's batch): `dz` is small, and splitting
        // the rows would give every task a partial `dw` as large as the whole work. Whole
        // products instead, each parallel inside.
        let mut dz = vec![0.0f32; m * n];
        act_backward_leaf(dy, y, &mut dz, act);
        add_rows_leaf(&dz, n, db);
        let dz_view = Strided::row_major(&dz, n);
        gemm_strided(dw, k, n, m, Strided::transposed(x, k), dz_view, false, true);
        if let Some(dx) = dx {
            gemm_strided(dx, m, k, n, dz_view, Strided::transposed(w, n), false, true);
        }
        return;
    }
    let tasks = if m * n * k < PAR_MIN_MACS {
        1
    } else {
        (2 * rayon::current_num_threads()).min(m.div_ceil(16))
    };
    let rows_per_task = m.div_ceil(tasks);
    let dx_parts: Vec<Option<&mut [f32]>> = match dx {
        // (With k = 0 there is no dx to write.)
        Some(dx) if k > 0 => dx.chunks_mut(rows_per_task * k).map(Some).collect(),
        _ => (0..m.div_ceil(rows_per_task)).map(|_| None).collect(),
    };
    let block = block_rows(n, k);
    let partials: Vec<(Vec<f32>, Vec<f32>)> = dx_parts
        .into_par_iter()
        .enumerate()
        .map(|(t, mut dx)| {
            let rows = t * rows_per_task..((t + 1) * rows_per_task).min(m);
            let (mut dw_t, mut db_t) = (vec![0.0f32; k * n], vec![0.0f32; n]);
            let mut dz = vec![0.0f32; block * n];
            for (b, r0) in rows.clone().step_by(block).enumerate() {
                let r1 = (r0 + block).min(rows.end);
                let len = r1 - r0;
                let dz = &mut dz[..len * n];
                act_backward_leaf(&dy[r0 * n..r1 * n], &y[r0 * n..r1 * n], dz, act);
                add_rows_leaf(dz, n, &mut db_t);
                let x_rows = &x[r0 * k..r1 * k];
                let dz = &*dz;
                gemm_strided(
                    &mut dw_t,
                    k,
                    n,
                    len,
                    Strided::transposed(x_rows, k),
                    Strided::row_major(dz, n),
                    b > 0,
                    false,
                );
                if let Some(dx) = dx.as_deref_mut() {
                    let at = (r0 - rows.start) * k;
                    let rhs = Strided::transposed(w, n);
                    let out = &mut dx[at..at + len * k];
                    gemm_strided(out, len, k, n, Strided::row_major(dz, n), rhs, false, false);
                }
            }
            (dw_t, db_t)
        })
        .collect();
    for (dw_t, db_t) in &partials {
        dw.iter_mut().zip(dw_t).for_each(|(a, b)| *a += b);
        db.iter_mut().zip(db_t).for_each(|(a, b)| *a += b);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::ops::reference::{self as r, assert_close, random_vec, to_f64};

    /// Row-major `[rows, cols]` data stored transposed (`[cols, rows]`).
    fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| x[(i % rows) * cols + i / rows])
            .collect()
    }

    #[test]
    fn matmul_matches_reference_all_transposes() {
        let shapes = [
            (1, 1, 1),
            (3, 7, 13),
            (13, 1, 7),
            (28, 13, 3),
            (7, 28, 1),
            (64, 130, 33),
            (130, 64, 96),
        ];
        for (t, &(m, k, n)) in shapes.iter().enumerate() {
            let a = random_vec(m * k, 10 + t as u64);
            let b = random_vec(k * n, 20 + t as u64);
            let expected = r::matmul(&to_f64(&a), &to_f64(&b), m, k, n, false, false);
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let a_in = if ta { transpose(&a, m, k) } else { a.clone() };
                let b_in = if tb { transpose(&b, k, n) } else { b.clone() };
                let mut out = vec![f32::NAN; m * n];
                matmul(&a_in, &b_in, &mut out, m, k, n, ta, tb);
                assert_close(
                    &out,
                    &expected,
                    1e-4,
                    &format!("matmul {m}x{k}x{n} ta={ta} tb={tb}"),
                );
            }
        }
    }

    #[test]
    fn matmul_with_empty_inner_dimension_is_zero() {
        let mut out = vec![f32::NAN; 6];
        matmul(&[], &[], &mut out, 2, 0, 3, false, false);
        assert_eq!(out, vec![0.0; 6]);
        let mut out = vec![f32::NAN; 6];
        matmul_bias_act(
            &[],
            &[],
            Some(&[1.0, -2.0, 0.5]),
            &mut out,
            2,
            0,
            3,
            Activation::Relu,
        );
        assert_eq!(out, vec![1.0, 0.0, 0.5, 1.0, 0.0, 0.5]);
    }

    #[test]
    fn matmul_bias_act_matches_reference() {
        // The last shape is the tutorial's Dense(128) on 1152 features, batch 128 (parallel path).
        for (t, &(m, k, n)) in [(1, 3, 1), (7, 13, 3), (28, 7, 13), (128, 1152, 128)]
            .iter()
            .enumerate()
        {
            let a = random_vec(m * k, 30 + t as u64);
            let b = random_vec(k * n, 40 + t as u64);
            let bias = random_vec(n, 50 + t as u64);
            for act in [Activation::Linear, Activation::Relu, Activation::Selu] {
                for with_bias in [true, false] {
                    let bias = with_bias.then_some(&bias[..]);
                    let mut out = vec![f32::NAN; m * n];
                    matmul_bias_act(&a, &b, bias, &mut out, m, k, n, act);
                    let bias64 = bias.map(to_f64);
                    let expected = r::matmul_bias_act(
                        &to_f64(&a),
                        &to_f64(&b),
                        bias64.as_deref(),
                        m,
                        k,
                        n,
                        act,
                    );
                    assert_close(
                        &out,
                        &expected,
                        1e-4,
                        &format!("dense {m}x{k}x{n} {act:?} bias={with_bias}"),
                    );
                }
            }
        }
    }

    #[test]
    fn gemm_strided_accumulates() {
        let (a, b) = (random_vec(12, 1), random_vec(20, 2));
        let mut out = vec![1.0f32; 15];
        gemm_strided(
            &mut out,
            3,
            5,
            4,
            Strided::row_major(&a, 4),
            Strided::row_major(&b, 5),
            true,
            false,
        );
        let expected: Vec<f64> = r::matmul(&to_f64(&a), &to_f64(&b), 3, 4, 5, false, false)
            .iter()
            .map(|v| v + 1.0)
            .collect();
        assert_close(&out, &expected, 1e-5, "accumulate");
    }
}
