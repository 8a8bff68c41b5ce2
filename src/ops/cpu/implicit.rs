//! Implicit-GEMM kernels: a convolution's products with its patch matrix, the patches read in
//! place from zero-padded images instead of copied into an im2col matrix first.
//!
//! A patch row (one output pixel) is `kh` runs of `kw * c_in` consecutive values of the padded
//! image, one per kernel row, so tap `t = a * len + r` of pixel `p` is
//! `img[bases[p] + runs[a] + r]`. The forward product keeps a tile of pixels × output channels
//! in registers over every tap, broadcasting each tap's value from the image; the kernel
//! gradient keeps a tile of taps × output channels over every pixel. Under AVX-512 the tiles
//! hold up to 24 16-lane vectors (of its 32 registers, see [`super::wide_registers`]), and the
//! columns past the last multiple of 32 go in tiles of 12 8-lane vectors, which is all the
//! tiles hold on a narrower CPU: the columns come in whole 8-lane vectors.

use super::{wide_registers, Vector, V16, V8};

/// Patches read in place: tap `a * len + r` of output pixel `p` is `img[bases[p] + runs[a] +
/// r]`.
pub(crate) struct Patches<'a> {
    /// Zero-padded images.
    pub img: &'a [f32],
    /// Where each output pixel's patch starts in `img`.
    pub bases: &'a [usize],
    /// Where each kernel row's run starts, from a pixel's base.
    pub runs: &'a [usize],
    /// Taps per run (`kw * c_in`).
    pub len: usize,
}

impl Patches<'_> {
    /// Taps per pixel.
    fn taps(&self) -> usize {
        area(self.runs.len(), self.len, "taps")
    }

    /// Panics unless every tap of every pixel is inside `img` (the bound the unchecked reads
    /// rely on, computed without wrapping: an overflow panics too).
    fn check(&self) {
        let (Some(&base), Some(&run)) = (self.bases.iter().max(), self.runs.iter().max()) else {
            return; // no pixel or no tap: nothing is read
        };
        let end = base
            .checked_add(run)
            .and_then(|at| at.checked_add(self.len));
        assert!(
            self.len == 0 || end.is_some_and(|end| end <= self.img.len()),
            "implicit: a patch reads past its image"
        );
    }
}

/// `rows * n`, or a panic naming `what` where it overflows.
fn area(rows: usize, n: usize, what: &str) -> usize {
    rows.checked_mul(n)
        .unwrap_or_else(|| panic!("implicit: {what} overflows"))
}

/// Output columns the tiles cover: whole 8-lane vectors.
pub(crate) fn fits(c_out: usize) -> bool {
    c_out > 0 && c_out.is_multiple_of(V8::LANES)
}

/// Pixels `[first, first + R)` (clamped to the pixels) × columns `[c0, c0 + V::LANES * NV)` of
/// `out = patches · kernel`, pixel `i` into row `rows[i]` of `out` (row `i` without `rows`).
///
/// # Safety
/// `p.check()` passed, `kernel` holds `taps × n` values and `c0 + V::LANES * NV <= n` (the
/// unchecked reads; `out` is written through checked stores).
#[inline(always)]
unsafe fn forward_tile<V: Vector, const R: usize, const NV: usize, const FMA: bool>(
    p: &Patches<'_>,
    kernel: &[f32],
    n: usize,
    (first, c0): (usize, usize),
    (out, rows): (&mut [f32], Option<&[usize]>),
) {
    let lanes = V::LANES;
    let m = p.bases.len();
    let mut bases = [0usize; R];
    for (i, base) in bases.iter_mut().enumerate() {
        *base = p.bases[(first + i).min(m - 1)];
    }
    let mut acc = [[V::splat(0.0); NV]; R];
    let mut t = 0;
    for &run in p.runs {
        for r in 0..p.len {
            let mut w = [V::splat(0.0); NV];
            for (v, w) in w.iter_mut().enumerate() {
                let at = t * n + c0 + lanes * v;
                *w = V::load(unsafe { kernel.get_unchecked(at..at + lanes) }, 0);
            }
            for (acc, &base) in acc.iter_mut().zip(&bases) {
                let a = unsafe { *p.img.get_unchecked(base + run + r) };
                for (acc, &w) in acc.iter_mut().zip(&w) {
                    *acc = acc.madd::<FMA>(a, w);
                }
            }
            t += 1;
        }
    }
    for (i, acc) in acc.iter().enumerate().take(m - first) {
        let row = rows.map_or(first + i, |rows| rows[first + i]);
        for (v, acc) in acc.iter().enumerate() {
            acc.store(out, row * n + c0 + lanes * v);
        }
    }
}

/// Every tile of 6 pixels × `V::LANES * NV` columns from `c0`.
///
/// # Safety
/// As [`forward_tile`], for every tile.
#[inline(always)]
unsafe fn forward_columns<V: Vector, const NV: usize, const FMA: bool>(
    p: &Patches<'_>,
    kernel: &[f32],
    n: usize,
    c0: usize,
    (out, rows): (&mut [f32], Option<&[usize]>),
) {
    for first in (0..p.bases.len()).step_by(6) {
        let out = (&mut *out, rows);
        unsafe { forward_tile::<V, 6, NV, FMA>(p, kernel, n, (first, c0), out) };
    }
}

multiversion! {
    /// `out = patches · kernel`, `kernel` `[taps, n]` row-major, `n` a multiple of 8 (see
    /// [`fits`]): `out` is `[pixels, n]`, or with `rows`, pixel `i` goes to row `rows[i]` of
    /// `out` (rows of `n`; the others are left alone).
    pub(crate) fn forward<const FMA: bool>(
        p: &Patches<'_>,
        kernel: &[f32],
        n: usize,
        out: &mut [f32],
        rows: Option<&[usize]>,
    ) {
        let m = p.bases.len();
        assert!(fits(n), "implicit: {n} output channels are not whole vectors");
        match rows {
            None => assert_eq!(out.len(), area(m, n, "out"), "implicit: out must be pixels x n"),
            Some(rows) => assert!(
                rows.len() == m && rows.iter().all(|&r| r < out.len() / n),
                "implicit: a pixel's row is outside out"
            ),
        }
        assert!(kernel.len() >= area(p.taps(), n, "kernel"), "implicit: kernel too short");
        p.check();
        // SAFETY (each call): checked above; every tile stays inside the n columns.
        let mut c0 = 0;
        if wide_registers() {
            while c0 + 64 <= n {
                unsafe { forward_columns::<V16, 4, FMA>(p, kernel, n, c0, (&mut *out, rows)) };
                c0 += 64;
            }
            if c0 + 32 <= n {
                unsafe { forward_columns::<V16, 2, FMA>(p, kernel, n, c0, (&mut *out, rows)) };
                c0 += 32;
            }
        }
        while c0 + 16 <= n {
            unsafe { forward_columns::<V8, 2, FMA>(p, kernel, n, c0, (&mut *out, rows)) };
            c0 += 16;
        }
        if c0 + 8 <= n {
            unsafe { forward_columns::<V8, 1, FMA>(p, kernel, n, c0, (&mut *out, rows)) };
        }
    }
}

/// Taps `[t0, t0 + T)` of run `a` (all inside it) × columns `[c0, c0 + V::LANES * NV)` of `dk +=
/// patchesᵀ · dz`.
///
/// # Safety
/// `p.check()` passed, `dz` holds `pixels × n` values, `c0 + V::LANES * NV <= n` and `r0 + T <=
/// p.len` (the unchecked reads; `dk` is read and written through checked loads and stores).
#[inline(always)]
unsafe fn kernel_grad_tile<V: Vector, const T: usize, const NV: usize, const FMA: bool>(
    p: &Patches<'_>,
    dz: &[f32],
    n: usize,
    (a, r0, c0): (usize, usize, usize),
    dk: &mut [f32],
) {
    let lanes = V::LANES;
    let mut acc = [[V::splat(0.0); NV]; T];
    let run = p.runs[a] + r0;
    for (q, &base) in p.bases.iter().enumerate() {
        let mut d = [V::splat(0.0); NV];
        for (v, d) in d.iter_mut().enumerate() {
            let at = q * n + c0 + lanes * v;
            *d = V::load(unsafe { dz.get_unchecked(at..at + lanes) }, 0);
        }
        let x = base + run;
        for (i, acc) in acc.iter_mut().enumerate() {
            let x = unsafe { *p.img.get_unchecked(x + i) };
            for (acc, &d) in acc.iter_mut().zip(&d) {
                *acc = acc.madd::<FMA>(x, d);
            }
        }
    }
    let t0 = a * p.len + r0;
    for (i, acc) in acc.iter().enumerate() {
        for (v, acc) in acc.iter().enumerate() {
            let at = (t0 + i) * n + c0 + lanes * v;
            acc.add(V::load(dk, at)).store(dk, at);
        }
    }
}

/// Every tap of run `a` × columns `[c0, c0 + V::LANES * NV)` of `dk += patchesᵀ · dz`: tiles
/// of `T` taps, then the taps past the last whole tile one by one.
///
/// # Safety
/// As [`kernel_grad_tile`], for every tile.
#[inline(always)]
unsafe fn grad_columns<V: Vector, const T: usize, const NV: usize, const FMA: bool>(
    p: &Patches<'_>,
    dz: &[f32],
    n: usize,
    (a, c0): (usize, usize),
    dk: &mut [f32],
) {
    let mut r0 = 0;
    while r0 + T <= p.len {
        unsafe { kernel_grad_tile::<V, T, NV, FMA>(p, dz, n, (a, r0, c0), dk) };
        r0 += T;
    }
    for r0 in r0..p.len {
        unsafe { kernel_grad_tile::<V, 1, NV, FMA>(p, dz, n, (a, r0, c0), dk) };
    }
}

multiversion! {
    /// `dk += patchesᵀ · dz`: `dz` is `[pixels, n]`, `dk` `[taps, n]` row-major, `n` a multiple
    /// of 8 (see [`fits`]). Each entry adds its pixels in order, so the bits depend on the
    /// operands alone.
    pub(crate) fn kernel_grad<const FMA: bool>(
        p: &Patches<'_>,
        dz: &[f32],
        n: usize,
        dk: &mut [f32],
    ) {
        let m = p.bases.len();
        assert!(fits(n), "implicit: {n} output channels are not whole vectors");
        assert_eq!(dz.len(), area(m, n, "dz"), "implicit: dz must be pixels x n");
        assert_eq!(dk.len(), area(p.taps(), n, "dk"), "implicit: dk must be taps x n");
        p.check();
        // SAFETY (each call): checked above; every tile stays inside its run and the n
        // columns.
        for a in 0..p.runs.len() {
            let mut c0 = 0;
            if wide_registers() {
                while c0 + 64 <= n {
                    unsafe { grad_columns::<V16, 6, 4, FMA>(p, dz, n, (a, c0), dk) };
                    c0 += 64;
                }
                if c0 + 32 <= n {
                    unsafe { grad_columns::<V16, 12, 2, FMA>(p, dz, n, (a, c0), dk) };
                    c0 += 32;
                }
            }
            while c0 + 16 <= n {
                unsafe { grad_columns::<V8, 6, 2, FMA>(p, dz, n, (a, c0), dk) };
                c0 += 16;
            }
            if c0 + 8 <= n {
                unsafe { grad_columns::<V8, 6, 1, FMA>(p, dz, n, (a, c0), dk) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "reads past its image")]
    fn a_patch_whose_end_overflows_is_refused() {
        let img = [1.0f32; 8];
        let p = Patches {
            img: &img,
            bases: &[usize::MAX],
            runs: &[0],
            len: 1,
        };
        forward(&p, &[1.0; 8], 8, &mut [0.0; 8], None);
    }

    #[test]
    #[should_panic(expected = "dz overflows")]
    fn operand_sizes_that_overflow_are_refused() {
        let img = [1.0f32; 8];
        let p = Patches {
            img: &img,
            bases: &[0; 8],
            runs: &[0],
            len: 8,
        };
        kernel_grad(&p, &[], 1 << 61, &mut []);
    }
}
