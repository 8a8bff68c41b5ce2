//! Matrix products on the [`gemm`](https://docs.rs/gemm) crate's micro-kernels, plus the
//! fused bias + activation epilogue that `Dense` and the convolutions share.

use rayon::prelude::*;

use crate::ops::spec::Activation;
use crate::shape::product;

use super::elementwise::{act_backward_leaf, act_in_place, bias_act_rows};
use super::reduce::add_rows_leaf;
use super::{madd, Vector, V16, V8};

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
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst.fill(0.0);
        }
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
    // SAFETY: `dst` is exactly m*n elements (a product checked not to wrap), written row-major
    // (row stride n, column stride 1);
    // `check` proved every element the views address, (m-1)*rs + (k-1)*cs for lhs and likewise
    // for rhs, lies inside its slice, with strides representable as isize. The three slices are
    // distinct borrows (dst is `&mut`), so nothing aliases. With `read_dst == false` the crate
    // never reads `dst` (alpha is ignored) and writes all of it.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
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

/// Inner dimension up to which [`small_k_bias_act`] beats the gemm crate (whose packing does
/// not pay off for a handful of multiply-adds per output).
pub(crate) const SMALL_K: usize = 16;

/// Operands of [`small_k_bias_act`]: `out[p, c] = act(bias[c] + Σ_t lhs(p, t) * rhs[t, c])`
/// with `lhs(p, t) = lhs[p * ps + offs[t]]`, which covers a row-major `[m, k]` matrix
/// (`ps = k`, `offs = 0..k`) as well as patches read in place from a padded image (`ps` the
/// pixel stride, `offs` the taps' offsets): an implicit im2col.
pub(crate) struct SmallK<'a> {
    /// Left operand storage.
    pub lhs: &'a [f32],
    /// Distance between consecutive output rows' operands in `lhs`.
    pub ps: usize,
    /// Offset of each of the `k` operands of a row.
    pub offs: &'a [usize],
    /// Row-major `[k, n]`.
    pub rhs: &'a [f32],
    /// Optional `[n]` bias.
    pub bias: Option<&'a [f32]>,
    /// Output columns.
    pub n: usize,
    /// Activation applied to the result.
    pub act: Activation,
}

/// Columns `[c0, c0 + 8 * NV)` of `out = lhs · rhs + bias`, two rows at a time so that every
/// `rhs` load feeds two independent accumulator chains.
///
/// Panics unless `c0 + 8 * NV <= n`, `out` is `m × n`, `rhs` holds `k × n` and every
/// `lhs(p, t)` of the `m` rows is inside `lhs` (the bounds the unchecked reads rely on, each
/// computed without wrapping).
#[inline(always)]
fn small_k_tile<V: Vector, const NV: usize, const FMA: bool>(
    p: &SmallK<'_>,
    c0: usize,
    out: &mut [f32],
) {
    let lanes = V::LANES;
    let (n, ps, k) = (p.n, p.ps, p.offs.len());
    let m = out.len() / n.max(1);
    let max_off = p.offs.iter().copied().max().unwrap_or(0);
    let last_lhs = (m.max(1) - 1)
        .checked_mul(ps)
        .and_then(|r| r.checked_add(max_off));
    assert!(
        c0.checked_add(lanes * NV).is_some_and(|end| end <= n)
            && product(&[m, n]) == Some(out.len())
            && product(&[k, n]).is_some_and(|kn| p.rhs.len() >= kn)
            && (k == 0 || m == 0 || last_lhs.is_some_and(|last| last < p.lhs.len())),
        "small_k: operands too short"
    );
    let init: [V; NV] = match p.bias {
        Some(b) => V::load_n::<NV>(b, c0),
        None => [V::splat(0.0); NV],
    };
    // SAFETY (every unchecked read below): by the assert, `t * n + c0 + lanes * (v + 1) <= k * n <=
    // rhs.len()` for t < k and v < NV, and `r * ps + o <= (m - 1) * ps + max_off < lhs.len()`
    // for rows r < m and offsets o in `offs`.
    let mut i = 0;
    while i + 2 <= m {
        let (mut acc0, mut acc1) = (init, init);
        let (r0, r1) = (i * ps, (i + 1) * ps);
        for (t, &o) in p.offs.iter().enumerate() {
            let (a, b) = unsafe { (*p.lhs.get_unchecked(r0 + o), *p.lhs.get_unchecked(r1 + o)) };
            for v in 0..NV {
                let at = t * n + c0 + lanes * v;
                let wv = V::load(unsafe { p.rhs.get_unchecked(at..at + lanes) }, 0);
                acc0[v] = acc0[v].madd::<FMA>(a, wv);
                acc1[v] = acc1[v].madd::<FMA>(b, wv);
            }
        }
        for v in 0..NV {
            acc0[v].store(out, i * n + c0 + lanes * v);
            acc1[v].store(out, (i + 1) * n + c0 + lanes * v);
        }
        i += 2;
    }
    if i < m {
        let mut acc = init;
        for (t, &o) in p.offs.iter().enumerate() {
            let a = unsafe { *p.lhs.get_unchecked(i * ps + o) };
            for (v, acc) in acc.iter_mut().enumerate() {
                let at = t * n + c0 + lanes * v;
                *acc = acc.madd::<FMA>(
                    a,
                    V::load(unsafe { p.rhs.get_unchecked(at..at + lanes) }, 0),
                );
            }
        }
        for (v, acc) in acc.iter().enumerate() {
            acc.store(out, i * n + c0 + lanes * v);
        }
    }
}

/// Columns `[c0, c0 + LANES * NV)` of `out = lhs · rhs + bias` for exactly `K` taps (their
/// loop unrolled), four rows at a time, so that each `rhs` load feeds four independent
/// accumulator chains (six or eight rows ran slower, spilling).
///
/// Panics as [`small_k_tile`] does, or unless `lhs` has `K` taps.
#[inline(always)]
fn small_k_taps<V: Vector, const K: usize, const NV: usize, const FMA: bool>(
    p: &SmallK<'_>,
    c0: usize,
    out: &mut [f32],
) {
    const ROWS: usize = 4;
    let lanes = V::LANES;
    let (n, ps) = (p.n, p.ps);
    let m = out.len() / n.max(1);
    let max_off = p.offs.iter().copied().max().unwrap_or(0);
    let last_lhs = (m.max(1) - 1)
        .checked_mul(ps)
        .and_then(|r| r.checked_add(max_off));
    assert!(
        p.offs.len() == K
            && c0.checked_add(lanes * NV).is_some_and(|end| end <= n)
            && product(&[m, n]) == Some(out.len())
            && product(&[K, n]).is_some_and(|kn| p.rhs.len() >= kn)
            && (m == 0 || last_lhs.is_some_and(|last| last < p.lhs.len())),
        "small_k: operands too short"
    );
    let mut offs = [0usize; K];
    offs.copy_from_slice(p.offs);
    let init: [V; NV] = match p.bias {
        Some(b) => V::load_n::<NV>(b, c0),
        None => [V::splat(0.0); NV],
    };
    let mut i = 0;
    while i + ROWS <= m {
        let mut acc = [init; ROWS];
        for (t, &o) in offs.iter().enumerate() {
            let mut w = [V::splat(0.0); NV];
            for (v, w) in w.iter_mut().enumerate() {
                let at = t * n + c0 + lanes * v;
                // SAFETY: `at + lanes <= K * n <= rhs.len()` by the assert.
                *w = V::load(unsafe { p.rhs.get_unchecked(at..at + lanes) }, 0);
            }
            for (q, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `(i + q) * ps + o <= (m - 1) * ps + max_off < lhs.len()`.
                let a = unsafe { *p.lhs.get_unchecked((i + q) * ps + o) };
                for v in 0..NV {
                    acc[v] = acc[v].madd::<FMA>(a, w[v]);
                }
            }
        }
        for (q, acc) in acc.iter().enumerate() {
            for (v, acc) in acc.iter().enumerate() {
                acc.store(out, (i + q) * n + c0 + lanes * v);
            }
        }
        i += ROWS;
    }
    while i < m {
        let mut acc = init;
        for (t, &o) in offs.iter().enumerate() {
            let a = p.lhs[i * ps + o];
            let w = V::load_n::<NV>(p.rhs, t * n + c0);
            for v in 0..NV {
                acc[v] = acc[v].madd::<FMA>(a, w[v]);
            }
        }
        for (v, acc) in acc.iter().enumerate() {
            acc.store(out, i * n + c0 + lanes * v);
        }
        i += 1;
    }
}

/// Column `c` of `out = lhs · rhs + bias` (the columns left over after the 8-wide tiles).
#[inline(always)]
fn small_k_column<const FMA: bool>(p: &SmallK<'_>, c: usize, out: &mut [f32]) {
    let n = p.n;
    let init = p.bias.map_or(0.0, |b| b[c]);
    for i in 0..out.len() / n {
        let mut acc = init;
        for (t, &o) in p.offs.iter().enumerate() {
            acc = madd::<FMA>(p.lhs[i * p.ps + o], p.rhs[t * n + c], acc);
        }
        out[i * n + c] = acc;
    }
}

multiversion! {
    /// `out[m, n] = act(lhs · rhs + bias)` (see [`SmallK`]) for a small inner dimension:
    /// accumulates in registers starting from the bias, then applies the activation over the
    /// block while it is still in cache. `m = out.len() / n`.
    pub(crate) fn small_k_bias_act<const FMA: bool>(p: &SmallK<'_>, out: &mut [f32]) {
        let n = p.n;
        if n == 0 || out.is_empty() {
            return;
        }
        assert_eq!(out.len() % n, 0, "small_k_bias_act: out must be m x n");
        if let Some(b) = p.bias {
            assert!(b.len() >= n, "small_k_bias_act: bias too short");
        }
        let mut c0 = 0;
        // A 3×3 kernel on one channel (a first layer's): its nine taps unrolled, each kernel
        // vector feeding four pixels (15-20% faster than two with the taps in a loop).
        if super::wide_registers() && p.offs.len() == 9 {
            while c0 + 32 <= n {
                small_k_taps::<V16, 9, 2, FMA>(p, c0, out);
                c0 += 32;
            }
        }
        // 16 lanes where AVX-512 runs them (twice the work per instruction on cores with
        // full-width 512-bit units; the same rate on a Zen 4, which splits them).
        if super::wide_registers() {
            while c0 + 32 <= n {
                small_k_tile::<V16, 2, FMA>(p, c0, out);
                c0 += 32;
            }
            while c0 + 16 <= n {
                small_k_tile::<V16, 1, FMA>(p, c0, out);
                c0 += 16;
            }
        }
        while c0 + 32 <= n {
            small_k_tile::<V8, 4, FMA>(p, c0, out);
            c0 += 32;
        }
        while c0 + 8 <= n {
            small_k_tile::<V8, 1, FMA>(p, c0, out);
            c0 += 8;
        }
        for c in c0..n {
            small_k_column::<FMA>(p, c, out);
        }
        act_in_place::<FMA>(out, p.act);
    }
}

/// Operands of [`small_k_kernel_grad`]: `dk[t, c] += Σ_{i,j} lhs(i, j, t) * dz[i * w + j, c]`
/// with `lhs(i, j, t) = lhs[i * rs + j * ps + offs[t]]`, the patches of an image's `rows × w`
/// output pixels read in place from a zero-padded copy of it: the kernel gradient of a
/// convolution with a small patch, without the patch matrix (im2col) and a product whose `m`
/// is the patch length (9 for the tutorial's first layer, which the gemm crate's tiles of 16
/// rows fill half).
pub(crate) struct SmallKGrad<'a> {
    /// Left operand storage (the padded image).
    pub lhs: &'a [f32],
    /// Distance between consecutive output rows' operands in `lhs`.
    pub rs: usize,
    /// Distance between consecutive pixels' operands in a row.
    pub ps: usize,
    /// Pixels per output row.
    pub w: usize,
    /// Offset of each of the `k` taps.
    pub offs: &'a [usize],
    /// Row-major `[rows * w, n]`.
    pub dz: &'a [f32],
    /// Columns of `dz` and `dk`.
    pub n: usize,
}

impl SmallKGrad<'_> {
    /// Output rows.
    fn rows(&self) -> usize {
        self.dz.len() / (self.w * self.n).max(1)
    }

    /// Panics unless `dk` is `k × n`, `dz` whole rows, and every operand inside `lhs` (the
    /// bounds the unchecked reads rely on, each computed without wrapping).
    fn check(&self, dk: &[f32]) {
        let (rows, k) = (self.rows(), self.offs.len());
        let max_off = self.offs.iter().copied().max().unwrap_or(0);
        let last = (rows.max(1) - 1)
            .checked_mul(self.rs)
            .zip((self.w.max(1) - 1).checked_mul(self.ps))
            .and_then(|(r, p)| r.checked_add(p)?.checked_add(max_off));
        assert!(
            product(&[k, self.n]) == Some(dk.len())
                && product(&[rows, self.w, self.n]) == Some(self.dz.len())
                && (rows == 0 || self.w == 0 || k == 0 || last.is_some_and(|l| l < self.lhs.len())),
            "small_k_kernel_grad: operands do not match"
        );
    }
}

/// Taps `[t0, t0 + NT)` and columns `[c0, c0 + LANES * NV)` of [`small_k_kernel_grad`]:
/// `NT * NV` sums in registers over every pixel, each `dz` vector feeding `NT` multiply-adds.
#[inline(always)]
fn small_k_grad_tile<
    V: Vector,
    const NT: usize,
    const NV: usize,
    const FMA: bool,
    const SUM: bool,
>(
    p: &SmallKGrad<'_>,
    (t0, c0): (usize, usize),
    (dk, sums): (&mut [f32], &mut [f64]),
) {
    let (n, lanes) = (p.n, V::LANES);
    assert!(
        t0 + NT <= p.offs.len() && c0 + lanes * NV <= n && (!SUM || sums.len() == n),
        "small_k_grad: tile out of range"
    );
    let mut offs = [0usize; NT];
    offs.copy_from_slice(&p.offs[t0..t0 + NT]);
    let mut acc = [[V::splat(0.0); NV]; NT];
    for i in 0..p.rows() {
        // With `SUM`, the row's column sums of `dz` in f32, added to `sums` in f64 (a row is a
        // few dozen terms: f64 over the whole block, as `sum_rows_leaf` keeps it).
        let mut row = [V::splat(0.0); NV];
        for j in 0..p.w {
            let dz = V::load_n::<NV>(p.dz, (i * p.w + j) * n + c0);
            if SUM {
                for v in 0..NV {
                    row[v] = row[v].add(dz[v]);
                }
            }
            let base = i * p.rs + j * p.ps;
            for (acc, &o) in acc.iter_mut().zip(&offs) {
                // SAFETY: `check` proved `(rows - 1) * rs + (w - 1) * ps + max(offs) <
                // lhs.len()`, and i < rows, j < w.
                let a = unsafe { *p.lhs.get_unchecked(base + o) };
                for v in 0..NV {
                    acc[v] = acc[v].madd::<FMA>(a, dz[v]);
                }
            }
        }
        if SUM {
            let mut lanes_of = [0.0f32; 16];
            for (v, row) in row.iter().enumerate() {
                row.store(&mut lanes_of, 0);
                let at = c0 + lanes * v;
                for (s, &x) in sums[at..at + lanes].iter_mut().zip(&lanes_of) {
                    *s += f64::from(x);
                }
            }
        }
    }
    for (t, acc) in acc.iter().enumerate() {
        for (v, sum) in acc.iter().enumerate() {
            let at = (t0 + t) * n + c0 + lanes * v;
            V::load(dk, at).add(*sum).store(dk, at);
        }
    }
}

/// Taps `[t0, t0 + NT)` of [`small_k_kernel_grad`], every column; with `SUM`, the column
/// sums of `dz` too.
#[inline(always)]
fn small_k_grad_taps<const NT: usize, const FMA: bool, const SUM: bool>(
    p: &SmallKGrad<'_>,
    (t0, c_from): (usize, usize),
    (dk, sums): (&mut [f32], &mut [f64]),
) {
    let n = p.n;
    let mut c0 = c_from;
    while c0 + 32 <= n {
        small_k_grad_tile::<V8, NT, 4, FMA, SUM>(p, (t0, c0), (&mut *dk, &mut *sums));
        c0 += 32;
    }
    while c0 + 8 <= n {
        small_k_grad_tile::<V8, NT, 1, FMA, SUM>(p, (t0, c0), (&mut *dk, &mut *sums));
        c0 += 8;
    }
    for c in c0..n {
        for t in t0..t0 + NT {
            let mut sum = 0.0f32;
            for i in 0..p.rows() {
                for j in 0..p.w {
                    let a = p.lhs[i * p.rs + j * p.ps + p.offs[t]];
                    sum = madd::<FMA>(a, p.dz[(i * p.w + j) * n + c], sum);
                }
            }
            dk[t * n + c] += sum;
        }
        if SUM {
            for i in 0..p.rows() {
                let row: f32 = (0..p.w).map(|j| p.dz[(i * p.w + j) * n + c]).sum();
                sums[c] += f64::from(row);
            }
        }
    }
}

multiversion! {
    /// `dk += lhsᵀ · dz` for a small patch (see [`SmallKGrad`]): three taps at a time meet
    /// every pixel's `dz` with their sums in registers (12 of them for 32 columns); and, when
    /// `sums` is not empty (`[n]`), the column sums of `dz` added to it in f64 (a bias
    /// gradient, taken with the first taps instead of a pass of its own).
    pub(crate) fn small_k_kernel_grad<const FMA: bool>(p: &SmallKGrad<'_>, dk: &mut [f32], sums: &mut [f64]) {
        p.check(dk);
        assert!(sums.is_empty() || sums.len() == p.n, "small_k_kernel_grad: sums must have n elements");
        let k = p.offs.len();
        if k == 0 {
            return;
        }
        // A 3×3 kernel on one channel (a first layer's): all nine taps' sums for 32 columns in
        // registers (18 vectors of 16 lanes), each `dz` load feeding nine multiply-adds (40%
        // faster than three taps and 8 lanes at a time).
        let mut c_from = 0;
        if k == 9 && super::wide_registers() {
            while c_from + 32 <= p.n {
                let at = (0, c_from);
                if sums.is_empty() {
                    small_k_grad_tile::<V16, 9, 2, FMA, false>(p, at, (&mut *dk, &mut []));
                } else {
                    small_k_grad_tile::<V16, 9, 2, FMA, true>(p, at, (&mut *dk, &mut *sums));
                }
                c_from += 32;
            }
        }
        // The first group of taps takes the sums along.
        let first = k.min(3);
        match (first, sums.is_empty()) {
            (3, false) => small_k_grad_taps::<3, FMA, true>(p, (0, c_from), (&mut *dk, &mut *sums)),
            (2, false) => small_k_grad_taps::<2, FMA, true>(p, (0, c_from), (&mut *dk, &mut *sums)),
            (_, false) => small_k_grad_taps::<1, FMA, true>(p, (0, c_from), (&mut *dk, &mut *sums)),
            (3, true) => small_k_grad_taps::<3, FMA, false>(p, (0, c_from), (&mut *dk, &mut [])),
            (2, true) => small_k_grad_taps::<2, FMA, false>(p, (0, c_from), (&mut *dk, &mut [])),
            (_, true) => small_k_grad_taps::<1, FMA, false>(p, (0, c_from), (&mut *dk, &mut [])),
        }
        let mut t0 = first;
        while t0 + 3 <= k {
            small_k_grad_taps::<3, FMA, false>(p, (t0, c_from), (&mut *dk, &mut []));
            t0 += 3;
        }
        match k - t0 {
            2 => small_k_grad_taps::<2, FMA, false>(p, (t0, c_from), (&mut *dk, &mut [])),
            1 => small_k_grad_taps::<1, FMA, false>(p, (t0, c_from), (&mut *dk, &mut [])),
            _ => {}
        }
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
    pub(in crate::ops::cpu) fn small_k_handles_every_column_split() {
        // n = 32 + 16 + 8 + 3 exercises the 32-wide tiles, the 16-wide one (AVX-512), the
        // 8-wide one and the scalar columns, and an odd m the single-row tail; offsets read a
        // padded layout in place.
        let (m, k, n, ps) = (7, 5, 59, 3);
        let offs = [0, 2, 4, 9, 11];
        let lhs = random_vec((m - 1) * ps + 12, 1);
        let rhs = random_vec(k * n, 2);
        let bias = random_vec(n, 3);
        let dense: Vec<f32> = (0..m * k)
            .map(|i| lhs[(i / k) * ps + offs[i % k]])
            .collect();
        for act in [Activation::Linear, Activation::Selu] {
            let mut out = vec![f32::NAN; m * n];
            let p = SmallK {
                lhs: &lhs,
                ps,
                offs: &offs,
                rhs: &rhs,
                bias: Some(&bias),
                n,
                act,
            };
            small_k_bias_act(&p, &mut out);
            let expected = r::matmul_bias_act(
                &to_f64(&dense),
                &to_f64(&rhs),
                Some(&to_f64(&bias)),
                m,
                k,
                n,
                act,
            );
            assert_close(&out, &expected, 1e-5, &format!("small_k {act:?}"));
        }
    }

    /// The kernel gradient of a small patch against the reference's `patchesᵀ · dz`, added to
    /// what `dk` held: 3-tap groups and a 2- and 1-tap rest, every column split, rows with a
    /// stride of their own.
    #[test]
    pub(in crate::ops::cpu) fn small_k_kernel_grad_handles_every_split() {
        for (k, n) in [(5, 43), (9, 32), (7, 8), (1, 3)] {
            let (rows, w, ps, rs) = (3, 5, 2, 13);
            let offs: Vec<usize> = (0..k).map(|t| t % 3 + 4 * (t / 3)).collect();
            let max_off = offs.iter().copied().max().unwrap_or(0);
            let lhs = random_vec((rows - 1) * rs + (w - 1) * ps + max_off + 1, 4);
            let dz = random_vec(rows * w * n, 5);
            let start = random_vec(k * n, 6);
            // `patches[p, t]`, pixel by pixel.
            let patches: Vec<f64> = (0..rows * w * k)
                .map(|e| {
                    let (p, t) = (e / k, e % k);
                    f64::from(lhs[(p / w) * rs + (p % w) * ps + offs[t]])
                })
                .collect();
            let product = r::matmul(&patches, &to_f64(&dz), k, rows * w, n, true, false);
            let expected: Vec<f64> = product
                .iter()
                .zip(&start)
                .map(|(p, &s)| p + f64::from(s))
                .collect();
            let mut dk = start.clone();
            let p = SmallKGrad {
                lhs: &lhs,
                rs,
                ps,
                w,
                offs: &offs,
                dz: &dz,
                n,
            };
            let mut sums = vec![0.5f64; n];
            small_k_kernel_grad(&p, &mut dk, &mut sums);
            let what = format!("small_k_kernel_grad k {k} n {n}");
            assert_close(&dk, &expected, 1e-5, &what);
            // The column sums of `dz`, added to what `sums` held.
            let column_sums = r::sum_rows(&to_f64(&dz), rows * w, n);
            for (c, (&got, want)) in sums.iter().zip(&column_sums).enumerate() {
                assert!(
                    (got - 0.5 - want).abs() <= 1e-5,
                    "{what}: column {c} sums to {got}"
                );
            }
            // Without sums: the same kernel gradient.
            let mut again = start.clone();
            small_k_kernel_grad(&p, &mut again, &mut []);
            assert_eq!(again, dk, "{what}: without the sums");
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
