//! Winograd's F(2×2, 3×3) for the stride-1 3×3 correlations of `conv.rs`: a `Conv2D`'s
//! forward pass and its input gradient, and the kernel gradient's sums. Each 2×2 block of
//! outputs comes from a 4×4 block of input in 16 multiplications per channel pair instead of
//! 36 (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016).
//!
//! With `d` a 4×4 input tile and `g` the 3×3 kernel, the tile's 2×2 output is
//! `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A`. Summed over the input channels, the element-wise product is 16
//! matrix products, one per tile element ξ: `M_ξ[tiles, c_out] = V_ξ[tiles, c_in] ·
//! U_ξ[c_in, c_out]`, which the gemm crate runs. A task takes a few rows of tiles: it
//! transforms their input into `V`, multiplies, and transforms `M` into its output rows, in
//! per-thread scratch memory small enough to stay in L2.
//!
//! The kernel gradient is the same bilinear form read the other way: `dU_ξ = Σ_t V_ξ[t]ᵀ
//! Z_ξ[t]` with `Z = A dz Aᵀ` each tile's output gradient, then `dk = Gᵀ dU G`.
//!
//! The transforms only add and halve, so the rounding stays close to the direct product's
//! (within the tests' 1e-4 of the f64 reference). Tasks are cut by the shape alone, so a
//! result is the same bits with any number of threads.

use rayon::prelude::*;

use crate::ops::spec::Activation;

use super::elementwise::bias_act_rows;
use super::gemm::{gemm_strided, Strided};
use super::with_scratch;

/// Scratch floats a task aims for (16 × tiles × (c_in + c_out): the transformed input and
/// output, or output gradient), about 512 KiB.
const TASK_FLOATS: usize = 128 * 1024;

/// Tasks a forward pass is cut into, at least, when the batch allows it: two for each of 16
/// cores.
const MIN_TASKS: usize = 32;

/// Tiles a kernel-gradient task takes at least: the inner dimension of its 16 products, which
/// add into a `[16, c_in, c_out]` partial sum that every task reads and writes whole (512 KiB
/// at 64 → 128 channels). At 32 tiles a task (7×7 images), that traffic cost a third of the
/// products' time.
const MIN_GRAD_TILES: usize = 128;

/// Kernel-gradient tasks, at least, where the batch has the tile rows: [`MIN_GRAD_TILES`]
/// yields to it, so that a small batch (32 images of 7×7 would be 4 tasks) still keeps 16
/// cores busy.
const MIN_GRAD_TASKS: usize = 16;

/// Channels a transform works on at once: one AVX-512 vector.
const CHUNK: usize = 16;

/// A stride-1 3×3 correlation `out[i, j, :] = Σ_{a,b} in[i + a - pt, j + b - pl, :] · K[a, b]`
/// between `[n, h, w, c_in]` and `[n, oh, ow, c_out]`, out-of-range inputs reading as zero.
#[derive(Clone, Copy, Debug)]
pub(super) struct Correlation {
    /// Batch.
    pub n: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Input channels.
    pub c_in: usize,
    /// Output height.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
    /// Output channels.
    pub c_out: usize,
    /// Zero rows above the input.
    pub pt: usize,
    /// Zero columns left of the input.
    pub pl: usize,
}

impl Correlation {
    /// Tile rows per image (a tile is 2×2 outputs; the last may stick out of the output).
    fn tiles_h(&self) -> usize {
        self.oh.div_ceil(2)
    }

    /// Tiles per tile row.
    fn tiles_w(&self) -> usize {
        self.ow.div_ceil(2)
    }

    /// Tile rows over the batch.
    pub(super) fn tile_rows(&self) -> usize {
        self.n * self.tiles_h()
    }

    /// Tile rows per task: what fills [`TASK_FLOATS`] of scratch, but at least `tasks` tasks
    /// when the batch allows it. A function of the shape alone: a kernel gradient's cut
    /// decides how its partial sums round, and a task's tile count is the products' row
    /// count, which decides how the gemm crate splits their sums over channels.
    pub(super) fn rows_per_task(&self, tasks: usize) -> usize {
        let per_row = self.scratch_len((0, 1));
        let balanced = self.tile_rows().div_ceil(tasks.max(1)).max(1);
        (TASK_FLOATS / per_row.max(1)).clamp(1, balanced)
    }

    /// Tile rows per kernel-gradient task: [`rows_per_task`](Self::rows_per_task), but at least
    /// [`MIN_GRAD_TILES`] tiles unless that leaves fewer than [`MIN_GRAD_TASKS`] tasks (a
    /// function of the shape alone, as there). A task's scratch may then pass
    /// [`TASK_FLOATS`] (1.5 MiB at 64 → 128 channels): its transforms spill to L3, which cost
    /// less than the partial sum's traffic.
    pub(super) fn grad_rows_per_task(&self, tasks: usize) -> usize {
        let min_rows = MIN_GRAD_TILES.div_ceil(self.tiles_w().max(1));
        let max_rows = (self.tile_rows() / MIN_GRAD_TASKS).max(1);
        let rows = self.rows_per_task(tasks);
        rows.max(min_rows.min(max_rows))
    }

    /// Scratch floats a task over tile rows `[t0, t1)` needs: 16 transformed rows of input
    /// and of output (or output gradient) per tile.
    pub(super) fn scratch_len(&self, (t0, t1): (usize, usize)) -> usize {
        16 * (t1 - t0) * self.tiles_w() * (self.c_in + self.c_out)
    }

    /// The first output row (batch-flattened) of tile row `t` (batch-flattened); `n * oh` for
    /// `t = n * tiles_h`.
    pub(super) fn out_row(&self, t: usize) -> usize {
        let th = self.tiles_h();
        (t / th) * self.oh + (2 * (t % th)).min(self.oh)
    }
}

/// `out = act(correlate(x, kmat) + bias)` over the whole batch, `kmat` the `[3, 3, c_in,
/// c_out]` kernel.
pub(super) fn correlate(
    x: &[f32],
    kmat: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    c: &Correlation,
    act: Activation,
) {
    let tile_rows = c.tile_rows();
    if out.is_empty() || tile_rows == 0 {
        return;
    }
    let u = transform_kernel(kmat, c.c_in, c.c_out);
    let rows = c.rows_per_task(MIN_TASKS);
    let mut tasks = Vec::with_capacity(tile_rows.div_ceil(rows));
    let mut rest = out;
    for t0 in (0..tile_rows).step_by(rows) {
        let t1 = (t0 + rows).min(tile_rows);
        let len = (c.out_row(t1) - c.out_row(t0)) * c.ow * c.c_out;
        let (mine, tail) = std::mem::take(&mut rest).split_at_mut(len);
        tasks.push((t0, t1, mine));
        rest = tail;
    }
    tasks.into_par_iter().for_each(|(t0, t1, out)| {
        let tiles = (t1 - t0) * c.tiles_w();
        with_scratch(c.scratch_len((t0, t1)), |scratch| {
            let (v, m) = scratch.split_at_mut(16 * tiles * c.c_in);
            transform_input(x, c, (t0, t1), v);
            for (xi, m) in m.chunks_exact_mut(tiles * c.c_out).enumerate() {
                // V_ξ: row t at t * 16 * c_in + ξ * c_in.
                let v = Strided {
                    data: &v[xi * c.c_in..],
                    rs: 16 * c.c_in,
                    cs: 1,
                };
                let u =
                    Strided::row_major(&u[xi * c.c_in * c.c_out..][..c.c_in * c.c_out], c.c_out);
                gemm_strided(m, tiles, c.c_out, c.c_in, v, u, false, false);
            }
            transform_output(m, c, (t0, t1), out);
            bias_act_rows(out, bias, c.c_out, act);
        });
    });
}

/// `U_ξ = (G g Gᵀ)_ξ` for every channel pair: `[16, c_in, c_out]` from the `[3, 3, c_in,
/// c_out]` kernel, with `G = [[1, 0, 0], [½, ½, ½], [½, -½, ½], [0, 0, 1]]`.
fn transform_kernel(kmat: &[f32], c_in: usize, c_out: usize) -> Vec<f32> {
    let pairs = c_in * c_out;
    let mut u = vec![0.0f32; 16 * pairs];
    let g_times = |[g0, g1, g2]: [f32; 3]| [g0, 0.5 * (g0 + g1 + g2), 0.5 * (g0 - g1 + g2), g2];
    for p in 0..pairs {
        let g = |a: usize, b: usize| kmat[(a * 3 + b) * pairs + p];
        // G g, 4×3, a column at a time; then (G g) Gᵀ, a row at a time.
        let mut gg = [[0.0; 3]; 4];
        for b in 0..3 {
            let col = g_times([g(0, b), g(1, b), g(2, b)]);
            for (row, value) in gg.iter_mut().zip(col) {
                row[b] = value;
            }
        }
        for (r, gg) in gg.into_iter().enumerate() {
            for (s, value) in g_times(gg).into_iter().enumerate() {
                u[(r * 4 + s) * pairs + p] = value;
            }
        }
    }
    u
}

/// The gradient w.r.t. `U` of the tiles of tile rows `[t0, t1)`, added to `du` (`[16, c_in,
/// c_out]`): `dU_ξ += V_ξᵀ Z_ξ`, with `Z = A dz Aᵀ` each tile's output gradient (zero past the
/// output) and `V` its input as in the forward pass. `dz` holds the output rows those tiles
/// cover; `scratch` at least [`Correlation::scratch_len`] floats.
pub(super) fn add_kernel_grad(
    x: &[f32],
    dz: &[f32],
    c: &Correlation,
    rows: (usize, usize),
    du: &mut [f32],
    scratch: &mut [f32],
) {
    let tiles = (rows.1 - rows.0) * c.tiles_w();
    let (v, z) = scratch.split_at_mut(16 * tiles * c.c_in);
    let z = &mut z[..16 * tiles * c.c_out];
    transform_input(x, c, rows, v);
    transform_output_grad(dz, c, rows, z);
    let pairs = c.c_in * c.c_out;
    for (xi, du) in du.chunks_exact_mut(pairs).enumerate() {
        // V_ξᵀ: element (i, t) at t * 16 * c_in + ξ * c_in + i; Z_ξ: (t, o) likewise.
        let vt = Strided {
            data: &v[xi * c.c_in..],
            rs: 1,
            cs: 16 * c.c_in,
        };
        let z = Strided {
            data: &z[xi * c.c_out..],
            rs: 16 * c.c_out,
            cs: 1,
        };
        gemm_strided(du, c.c_in, c.c_out, tiles, vt, z, true, false);
    }
}

/// The `[3, 3, c_in, c_out]` kernel gradient `Gᵀ dU_ξ G` from the gradient w.r.t. `U`
/// (`[16, c_in, c_out]`, summed over every tile).
pub(super) fn kernel_from_grad(du: &[f32], dk: &mut [f32], pairs: usize) {
    // Gᵀ · [a, b, c, d], Gᵀ = [[1, ½, ½, 0], [0, ½, -½, 0], [0, ½, ½, 1]].
    let gt = |[a, b, c, d]: [f32; 4]| [a + 0.5 * (b + c), 0.5 * (b - c), 0.5 * (b + c) + d];
    for p in 0..pairs {
        let u = |xi: usize| du[xi * pairs + p];
        // Gᵀ dU, 3×4, a column at a time; then (Gᵀ dU) G, a row at a time.
        let mut half = [[0.0; 4]; 3];
        for s in 0..4 {
            let col = gt([u(s), u(4 + s), u(8 + s), u(12 + s)]);
            for (row, value) in half.iter_mut().zip(col) {
                row[s] = value;
            }
        }
        for (a, row) in half.into_iter().enumerate() {
            for (b, value) in gt(row).into_iter().enumerate() {
                dk[(a * 3 + b) * pairs + p] = value;
            }
        }
    }
}

/// `outs[q][k] = f([ins[0][k], ins[1][k], ...])[q]` for every channel `k` (`outs` all as
/// long, `ins` at least as long). A chunk of [`CHUNK`] channels at a time is copied into
/// arrays and transformed there, so the compiler turns the per-channel arithmetic into whole
/// vectors whatever the channel count (a plain loop over 32 channels ran scalar: the
/// vectorized loop takes 64 at a time); the last channels one by one.
#[inline(always)]
fn per_channel<const N: usize, const M: usize>(
    ins: [&[f32]; N],
    outs: &mut [&mut [f32]; M],
    f: impl Fn([f32; N]) -> [f32; M],
) {
    let len = outs[0].len();
    let mut k0 = 0;
    while k0 + CHUNK <= len {
        let mut chunk = [[0.0; CHUNK]; N];
        for (chunk, src) in chunk.iter_mut().zip(ins) {
            chunk.copy_from_slice(&src[k0..k0 + CHUNK]);
        }
        let mut results = [[0.0; CHUNK]; M];
        for k in 0..CHUNK {
            let mut one = [0.0; N];
            for q in 0..N {
                one[q] = chunk[q][k];
            }
            let one = f(one);
            for q in 0..M {
                results[q][k] = one[q];
            }
        }
        for (dst, result) in outs.iter_mut().zip(&results) {
            dst[k0..k0 + CHUNK].copy_from_slice(result);
        }
        k0 += CHUNK;
    }
    for k in k0..len {
        let mut one = [0.0; N];
        for q in 0..N {
            one[q] = ins[q][k];
        }
        for (dst, value) in outs.iter_mut().zip(f(one)) {
            dst[k] = value;
        }
    }
}

/// `out` (16 rows of `width`) as its 16 rows.
#[inline(always)]
fn sixteen_rows(out: &mut [f32], width: usize) -> [&mut [f32]; 16] {
    let mut rows: [&mut [f32]; 16] = Default::default();
    for (row, chunk) in rows.iter_mut().zip(out.chunks_exact_mut(width)) {
        *row = chunk;
    }
    rows
}

/// `Bᵀ · [a, b, c, d]` with `Bᵀ = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]`.
#[inline(always)]
fn bt([a, b, c, d]: [f32; 4]) -> [f32; 4] {
    [a - c, b + c, c - b, b - d]
}

/// `Aᵀ · [a, b, c, d]` with `Aᵀ = [[1, 1, 1, 0], [0, 1, -1, -1]]`.
#[inline(always)]
fn at([a, b, c, d]: [f32; 4]) -> [f32; 2] {
    [a + b + c, b - c - d]
}

/// `Bᵀ d B` for one tile element by element, `d[q]` the tile's pixel `q` (4×4, row-major).
#[inline(always)]
fn input_tile(d: [f32; 16]) -> [f32; 16] {
    let mut e = [0.0; 16];
    for s in 0..4 {
        let col = bt([d[s], d[4 + s], d[8 + s], d[12 + s]]);
        for r in 0..4 {
            e[r * 4 + s] = col[r];
        }
    }
    let mut v = [0.0; 16];
    for r in 0..4 {
        let row = bt([e[r * 4], e[r * 4 + 1], e[r * 4 + 2], e[r * 4 + 3]]);
        v[r * 4..r * 4 + 4].copy_from_slice(&row);
    }
    v
}

/// `Aᵀ m A` for one tile: its outputs `[y00, y01, y10, y11]`.
#[inline(always)]
fn output_tile(m: [f32; 16]) -> [f32; 4] {
    let mut half = [[0.0; 4]; 2];
    for s in 0..4 {
        let col = at([m[s], m[4 + s], m[8 + s], m[12 + s]]);
        half[0][s] = col[0];
        half[1][s] = col[1];
    }
    let [y00, y01] = at(half[0]);
    let [y10, y11] = at(half[1]);
    [y00, y01, y10, y11]
}

multiversion! {
    /// `V_ξ[t, :] = (Bᵀ d_t B)_ξ` for the tiles of tile rows `[t0, t1)`: `v` is `[tiles, 16,
    /// c_in]` (each tile's 16 rows together, so that its transform writes one run of memory),
    /// `d_t` the tile's 4×4 input pixels (zero outside the image).
    fn transform_input(x: &[f32], c: &Correlation, rows: (usize, usize), v: &mut [f32]) {
        let (t0, t1) = rows;
        let (th, tw, ci) = (c.tiles_h(), c.tiles_w(), c.c_in);
        let zeros = vec![0.0f32; ci];
        for tr in t0..t1 {
            let (img, ti) = (tr / th, tr % th);
            for tj in 0..tw {
                let t = (tr - t0) * tw + tj;
                // The tile's 16 pixels, zeros outside the image (`wrapping_sub`: a row or
                // column before it wraps past the end).
                let mut d: [&[f32]; 16] = [&zeros; 16];
                for r in 0..4 {
                    let i = (2 * ti + r).wrapping_sub(c.pt);
                    for s in 0..4 {
                        let j = (2 * tj + s).wrapping_sub(c.pl);
                        if i < c.h && j < c.w {
                            d[r * 4 + s] = &x[((img * c.h + i) * c.w + j) * ci..][..ci];
                        }
                    }
                }
                let out = &mut v[t * 16 * ci..(t + 1) * 16 * ci];
                let mut rows = sixteen_rows(out, ci);
                per_channel(d, &mut rows, input_tile);
            }
        }
    }
}

/// `A · [p, q]` with `A = [[1, 0], [1, 1], [1, -1], [0, -1]]`.
#[inline(always)]
fn a_times(p: f32, q: f32) -> [f32; 4] {
    [p, p + q, p - q, -q]
}

/// `A dz Aᵀ` for one tile's output gradient `dz = [[a, b], [c, d]]`, 4×4 row-major.
#[inline(always)]
fn output_grad_tile([a, b, c, d]: [f32; 4]) -> [f32; 16] {
    let (col0, col1) = (a_times(a, c), a_times(b, d));
    let mut z = [0.0; 16];
    for r in 0..4 {
        z[r * 4..r * 4 + 4].copy_from_slice(&a_times(col0[r], col1[r]));
    }
    z
}

multiversion! {
    /// `Z_t = A dz_t Aᵀ` for the tiles of tile rows `[t0, t1)` into `z` (`[tiles, 16,
    /// c_out]`), `dz` the output rows those tiles cover (zero past the output).
    fn transform_output_grad(dz: &[f32], c: &Correlation, rows: (usize, usize), z: &mut [f32]) {
        let (t0, t1) = rows;
        let (th, tw, co) = (c.tiles_h(), c.tiles_w(), c.c_out);
        let first_row = c.out_row(t0);
        let zeros = vec![0.0f32; co];
        for tr in t0..t1 {
            let (img, ti) = (tr / th, tr % th);
            for tj in 0..tw {
                let t = (tr - t0) * tw + tj;
                let mut d: [&[f32]; 4] = [&zeros; 4];
                for (q, d) in d.iter_mut().enumerate() {
                    let (oi, oj) = (2 * ti + q / 2, 2 * tj + q % 2);
                    if oi < c.oh && oj < c.ow {
                        *d = &dz[((img * c.oh + oi - first_row) * c.ow + oj) * co..][..co];
                    }
                }
                let out = &mut z[t * 16 * co..(t + 1) * 16 * co];
                let mut rows = sixteen_rows(out, co);
                per_channel(d, &mut rows, output_grad_tile);
            }
        }
    }
}

multiversion! {
    /// The 2×2 outputs `Aᵀ m_t A` of the tiles of tile rows `[t0, t1)` from `m` (`[16, tiles,
    /// c_out]`) into `out`, the output rows those tiles cover (a last tile's row or column
    /// past the output is dropped).
    fn transform_output(m: &[f32], c: &Correlation, rows: (usize, usize), out: &mut [f32]) {
        let (t0, t1) = rows;
        let (th, tw, co) = (c.tiles_h(), c.tiles_w(), c.c_out);
        let tiles = (t1 - t0) * tw;
        let first_row = c.out_row(t0);
        // Where the outputs past the image go.
        let mut dropped = vec![0.0f32; 4 * co];
        for tr in t0..t1 {
            let (img, ti) = (tr / th, tr % th);
            for tj in 0..tw {
                let t = (tr - t0) * tw + tj;
                let mut e: [&[f32]; 16] = [&[]; 16];
                for (xi, e) in e.iter_mut().enumerate() {
                    *e = &m[(xi * tiles + t) * co..][..co];
                }
                // The tile's four outputs in `out`, or in `dropped`.
                let mut at_pixel = [None; 4];
                for (q, at) in at_pixel.iter_mut().enumerate() {
                    let (oi, oj) = (2 * ti + q / 2, 2 * tj + q % 2);
                    if oi < c.oh && oj < c.ow {
                        *at = Some(((img * c.oh + oi - first_row) * c.ow + oj) * co);
                    }
                }
                let (mut y, mut spare) = (&mut *out, dropped.as_mut_slice());
                let mut dst: [&mut [f32]; 4] = Default::default();
                // Pixels in increasing order, so each is split off the rest of `out`.
                let mut consumed = 0;
                for (q, dst) in dst.iter_mut().enumerate() {
                    match at_pixel[q] {
                        Some(pos) => {
                            let (_, tail) = std::mem::take(&mut y).split_at_mut(pos - consumed);
                            let (mine, tail) = tail.split_at_mut(co);
                            *dst = mine;
                            y = tail;
                            consumed = pos + co;
                        }
                        None => {
                            let (mine, tail) = std::mem::take(&mut spare).split_at_mut(co);
                            *dst = mine;
                            spare = tail;
                        }
                    }
                }
                per_channel(e, &mut dst, output_tile);
            }
        }
    }
}
