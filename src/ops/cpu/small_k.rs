//! Products whose inner dimension is a handful of values (`k <= SMALL_K`), where the gemm
//! crate's packing costs more than the multiply-adds: a convolution with a small patch (the
//! 3×3 first layer on one channel) reads each pixel's patch in place from a zero-padded image
//! (an implicit im2col), and its kernel gradient keeps taps × channels of sums in registers
//! over every pixel. The outputs sit in vector registers across channels, so a result's bits
//! do not depend on the vector width.

use crate::ops::spec::Activation;
use crate::shape::product;

use super::elementwise::act_in_place;
use super::{madd, Vector, V16, V8};

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

impl SmallK<'_> {
    /// Rows of `out`, after checking the bounds a tile of `width` columns from `c0` reads
    /// unchecked: panics unless `c0 + width <= n`, `out` is `m × n`, `rhs` holds `k × n` and
    /// every `lhs(p, t)` of the `m` rows is inside `lhs` (each computed without wrapping).
    fn check_tile(&self, out: &[f32], c0: usize, width: usize) -> usize {
        let (n, k) = (self.n, self.offs.len());
        let m = out.len() / n.max(1);
        let max_off = self.offs.iter().copied().max().unwrap_or(0);
        let last_lhs = (m.max(1) - 1)
            .checked_mul(self.ps)
            .and_then(|r| r.checked_add(max_off));
        assert!(
            c0.checked_add(width).is_some_and(|end| end <= n)
                && product(&[m, n]) == Some(out.len())
                && product(&[k, n]).is_some_and(|kn| self.rhs.len() >= kn)
                && (k == 0 || m == 0 || last_lhs.is_some_and(|last| last < self.lhs.len())),
            "small_k: operands too short"
        );
        m
    }

    /// The accumulators' start for columns `[c0, c0 + LANES * NV)`: the bias, or zeros.
    #[inline(always)]
    fn init<V: Vector, const NV: usize>(&self, c0: usize) -> [V; NV] {
        match self.bias {
            Some(b) => V::load_n::<NV>(b, c0),
            None => [V::splat(0.0); NV],
        }
    }
}

/// Columns `[c0, c0 + LANES * NV)` of `out = lhs · rhs + bias`, two rows at a time so that
/// every `rhs` load feeds two independent accumulator chains.
///
/// Panics as [`SmallK::check_tile`] does.
#[inline(always)]
fn small_k_tile<V: Vector, const NV: usize, const FMA: bool>(
    p: &SmallK<'_>,
    c0: usize,
    out: &mut [f32],
) {
    let lanes = V::LANES;
    let (n, ps) = (p.n, p.ps);
    let m = p.check_tile(out, c0, lanes * NV);
    let init = p.init::<V, NV>(c0);
    // SAFETY (every unchecked read below): by `check_tile`, `t * n + c0 + lanes * (v + 1) <= k
    // * n <= rhs.len()` for t < k and v < NV, and `r * ps + o <= (m - 1) * ps + max(offs) <
    // lhs.len()` for rows r < m and offsets o in `offs`.
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
/// Panics as [`SmallK::check_tile`] does, or unless `lhs` has `K` taps.
#[inline(always)]
fn small_k_taps<V: Vector, const K: usize, const NV: usize, const FMA: bool>(
    p: &SmallK<'_>,
    c0: usize,
    out: &mut [f32],
) {
    const ROWS: usize = 4;
    let lanes = V::LANES;
    let (n, ps) = (p.n, p.ps);
    assert!(p.offs.len() == K, "small_k: operands too short");
    let m = p.check_tile(out, c0, lanes * NV);
    let mut offs = [0usize; K];
    offs.copy_from_slice(p.offs);
    let init = p.init::<V, NV>(c0);
    let mut i = 0;
    while i + ROWS <= m {
        let mut acc = [init; ROWS];
        for (t, &o) in offs.iter().enumerate() {
            let mut w = [V::splat(0.0); NV];
            for (v, w) in w.iter_mut().enumerate() {
                let at = t * n + c0 + lanes * v;
                // SAFETY: `at + lanes <= K * n <= rhs.len()` by `check_tile`.
                *w = V::load(unsafe { p.rhs.get_unchecked(at..at + lanes) }, 0);
            }
            for (q, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `(i + q) * ps + o <= (m - 1) * ps + max(offs) < lhs.len()` by
                // `check_tile`.
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

    /// The small-patch product against the reference on a padded layout read in place.
    #[test]
    pub(in crate::ops::cpu) fn small_k_handles_every_column_split() {
        // n = 32 + 16 + 8 + 3 exercises the 32-wide tiles, the 16-wide one (AVX-512), the
        // 8-wide one and the scalar columns, and an odd m the single-row tail; offsets read a
        // padded layout in place.
        // Nine taps (a 3×3 kernel on one channel, rows 5 apart) take the unrolled kernel.
        let (m, n, ps) = (7, 59, 3);
        let five = vec![0, 2, 4, 9, 11];
        let nine: Vec<usize> = (0..9).map(|t| t / 3 * 5 + t % 3).collect();
        for (offs, act) in [
            (&five, Activation::Linear),
            (&five, Activation::Selu),
            (&nine, Activation::Linear),
            (&nine, Activation::Relu),
        ] {
            let k = offs.len();
            let lhs = random_vec((m - 1) * ps + 13, 1);
            let rhs = random_vec(k * n, 2);
            let bias = random_vec(n, 3);
            let dense: Vec<f32> = (0..m * k)
                .map(|i| lhs[(i / k) * ps + offs[i % k]])
                .collect();
            let mut out = vec![f32::NAN; m * n];
            let p = SmallK {
                lhs: &lhs,
                ps,
                offs,
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
            assert_close(&out, &expected, 1e-5, &format!("small_k k {k} {act:?}"));
        }
    }

    /// The kernel gradient of a small patch against the reference's `patchesᵀ · dz`, added to
    /// what `dk` held: 3-tap groups and a 2- and 1-tap rest, nine taps in 16-lane registers
    /// and the columns past them, every column split, rows with a stride of their own.
    #[test]
    pub(in crate::ops::cpu) fn small_k_kernel_grad_handles_every_split() {
        for (k, n) in [(5, 43), (9, 32), (9, 43), (7, 8), (1, 3)] {
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
}
