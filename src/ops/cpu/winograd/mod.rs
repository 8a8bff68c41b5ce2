//! Winograd's minimal filtering for the stride-1 3×3 correlations of `conv.rs`: a `Conv2D`'s
//! forward pass and its input gradient, and the kernel gradient's sums (Lavin and Gray, "Fast
//! Algorithms for Convolutional Neural Networks", CVPR 2016). F(4×4, 3×3) computes each 4×4
//! block of outputs from a 6×6 block of input in 36 multiplications per channel pair instead
//! of 144; F(2×2, 3×3), each 2×2 block from 4×4 in 16 instead of 36. [`Tile`] picks one by
//! the image size.
//!
//! With `d` an input tile and `g` the 3×3 kernel, the tile's output is `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d
//! B)] A` ([`tiles`]). Summed over the input channels, the element-wise product is one matrix
//! product per tile element ξ: `M_ξ[tiles, c_out] = V_ξ[tiles, c_in] · U_ξ[c_in, c_out]`,
//! which the gemm crate runs. A task takes a few rows of tiles: it transforms their input into
//! `V`, multiplies, and transforms `M` into its output rows, in per-thread scratch memory
//! small enough to stay in L2.
//!
//! The kernel gradient is the same bilinear form read the other way: `dU_ξ = Σ_t V_ξ[t]ᵀ
//! Z_ξ[t]` with `Z = A dz Aᵀ` each tile's output gradient, then `dk = Gᵀ dU G`. Tasks of a
//! few tile rows each sum into partial sums of their own, added at the end; where `dU` is
//! large (64 → 128 channels under F(4×4, 3×3)), groups of tile rows go one after another
//! instead, each element ξ's product over a group's tiles in parallel, with no partial sums.
//!
//! The transforms round more than the direct sum does, F(4×4, 3×3)'s most (see [`tiles`]):
//! within a few millionths of the outputs' magnitude, inside the tests' 1e-4 of the f64
//! reference. Tasks are cut by the shape alone, so a result is the same bits with any number
//! of threads.

mod tiles;

use rayon::prelude::*;

use crate::ops::spec::Activation;

use super::elementwise::bias_act_rows;
use super::gemm::{gemm_strided, gemm_strided_uninit, Strided};
use super::{with_scratch, Vector, V16, V8};
use tiles::{f2, f2_tile, f4, square, Map, Value};

/// Scratch floats a task aims for (the transformed input and output, or output gradient, of
/// its tiles), about 512 KiB.
const TASK_FLOATS: usize = 128 * 1024;

/// Tasks a forward pass is cut into, at least, when the batch allows it: two for each of 16
/// cores.
const MIN_TASKS: usize = 32;

/// Tiles a kernel-gradient task takes at least: the inner dimension of its products, which
/// add into a `[ξ, c_in, c_out]` partial sum that every task reads and writes whole (512 KiB
/// at 64 → 128 channels and 16 elements ξ). At 32 tiles a task (F(2×2, 3×3) on 7×7 images),
/// that traffic cost a third of the products' time.
const MIN_GRAD_TILES: usize = 128;

/// Kernel-gradient tasks, at least, where the batch has the tile rows: [`MIN_GRAD_TILES`]
/// yields to it, so that a small batch (32 images of 7×7 would be 4 tasks) still keeps 16
/// cores busy.
const MIN_GRAD_TASKS: usize = 16;

/// Floats of transformed input and output gradient a group of [`kernel_grad_by_groups`]
/// holds, about 4 MiB.
const GROUP_FLOATS: usize = 1 << 20;

/// Transformed-kernel floats from which a kernel gradient goes by groups
/// ([`Correlation::grad_by_groups`]): 512 KiB.
const GROUPED_KERNEL_FLOATS: usize = 128 * 1024;

/// Channels a transform works on at once: one AVX-512 vector.
const CHUNK: usize = 16;

/// Winograd's tile: the side of the block of outputs one tile computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tile {
    /// F(2×2, 3×3): 4×4 input tiles, 16 products per 4 outputs.
    F2,
    /// F(4×4, 3×3): 6×6 input tiles, 36 products per 16 outputs.
    F4,
}

impl Tile {
    /// The tile of a forward pass or an input gradient over an `oh × ow` output:
    /// [`fewer_products`](Self::fewer_products), or F(2×2, 3×3) under `ANYGPU_WINOGRAD=f2`.
    pub(super) fn for_output(oh: usize, ow: usize) -> Tile {
        if f2_only() {
            Tile::F2
        } else {
            Tile::fewer_products(oh, ow)
        }
    }

    /// The tile of a kernel gradient over an `oh × ow` output:
    /// [`as_tight`](Self::as_tight), or F(2×2, 3×3) under `ANYGPU_WINOGRAD=f2`.
    pub(super) fn for_kernel_grad(oh: usize, ow: usize) -> Tile {
        if f2_only() {
            Tile::F2
        } else {
            Tile::as_tight(oh, ow)
        }
    }

    /// The tile with fewer products over an `oh × ow` output (tiles sticking out of it count
    /// whole); F(2×2, 3×3) where they tie, as it rounds less. F(4×4, 3×3) from 3×3 outputs
    /// on, except 1 or 2 rows or columns: at 7×7 it takes 144 products per image and channel
    /// pair against 256, at 14×14 576 against 784.
    fn fewer_products(oh: usize, ow: usize) -> Tile {
        if Tile::F4.products(oh, ow) < Tile::F2.products(oh, ow) {
            Tile::F4
        } else {
            Tile::F2
        }
    }

    /// F(4×4, 3×3) only where its tiles cover an `oh × ow` output as tightly as F(2×2, 3×3)'s,
    /// so that it takes 9/16 of the products (at 7×7, not at 14×14). A kernel gradient's
    /// partial sums hold 36 values per channel pair under it against 16, and their traffic
    /// outweighed a smaller saving: at 14×14 32 → 64, batch 128, F(4×4, 3×3) took 5.2-6.2 ms
    /// against 4.7-5.5 (two threads, alternating), at 7×7 64 → 128 3.5-4.0 against 4.6-4.8.
    fn as_tight(oh: usize, ow: usize) -> Tile {
        if 16 * Tile::F4.products(oh, ow) <= 9 * Tile::F2.products(oh, ow) {
            Tile::F4
        } else {
            Tile::F2
        }
    }

    /// Products per channel pair over an `oh × ow` output.
    fn products(self, oh: usize, ow: usize) -> usize {
        oh.div_ceil(self.side()) * ow.div_ceil(self.side()) * self.elements()
    }

    /// Outputs along a tile's side.
    fn side(self) -> usize {
        match self {
            Tile::F2 => 2,
            Tile::F4 => 4,
        }
    }

    /// Elements ξ of a transformed tile: its products per channel pair.
    pub(super) fn elements(self) -> usize {
        (self.side() + 2).pow(2)
    }
}

/// Whether `ANYGPU_WINOGRAD=f2` keeps every correlation on F(2×2, 3×3), the tile that rounds
/// less (read once).
fn f2_only() -> bool {
    static F2_ONLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F2_ONLY.get_or_init(|| f2_asked(std::env::var("ANYGPU_WINOGRAD").ok().as_deref()))
}

/// What an `ANYGPU_WINOGRAD` value asks: `f2` for F(2×2, 3×3) only; unset, empty or `auto` for
/// the tile with fewer products; anything else the same, with a warning.
fn f2_asked(value: Option<&str>) -> bool {
    match value {
        None | Some("" | "auto") => false,
        Some("f2") => true,
        Some(other) => {
            log::warn!("ANYGPU_WINOGRAD={other:?} is not auto or f2; ignored");
            false
        }
    }
}

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
    /// The tile (see [`Tile::for_output`]).
    pub tile: Tile,
}

impl Correlation {
    /// Tile rows per image (the last may stick out of the output).
    fn tiles_h(&self) -> usize {
        self.oh.div_ceil(self.tile.side())
    }

    /// Tiles per tile row.
    fn tiles_w(&self) -> usize {
        self.ow.div_ceil(self.tile.side())
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

    /// Scratch floats a task over tile rows `[t0, t1)` needs: each tile's transformed input
    /// and output (or output gradient), an element ξ per row.
    pub(super) fn scratch_len(&self, (t0, t1): (usize, usize)) -> usize {
        self.tile.elements() * (t1 - t0) * self.tiles_w() * (self.c_in + self.c_out)
    }

    /// Whether the kernel gradient goes by groups of tile rows ([`kernel_grad_by_groups`]):
    /// where the transformed kernel, which each task's partial sums would hold whole, reaches
    /// [`GROUPED_KERNEL_FLOATS`] (7×7 64 → 128 under F(4×4, 3×3): 288 Ki floats; 14×14 32 →
    /// 64 under F(2×2, 3×3), 32 Ki, keeps its partial sums, which ran faster there).
    pub(super) fn grad_by_groups(&self) -> bool {
        self.transformed_kernel_len() >= GROUPED_KERNEL_FLOATS
    }

    /// Tile rows per group of [`kernel_grad_by_groups`]: what fills [`GROUP_FLOATS`].
    pub(super) fn group_rows(&self) -> usize {
        (GROUP_FLOATS / self.scratch_len((0, 1)).max(1)).max(1)
    }

    /// Floats of a transformed kernel, `[ξ, c_in, c_out]` (or of its gradient's partial sums).
    pub(super) fn transformed_kernel_len(&self) -> usize {
        self.tile.elements() * self.c_in * self.c_out
    }

    /// Where each of the `Q = M × M` outputs of image `img`'s tile `(ti, tj)` starts, in
    /// floats from output row `first_row` (batch-flattened); `None` past the output.
    #[inline(always)]
    fn tile_outputs<const M: usize, const Q: usize>(
        &self,
        img: usize,
        ti: usize,
        tj: usize,
        first_row: usize,
    ) -> [Option<usize>; Q] {
        let mut at = [None; Q];
        for (q, at) in at.iter_mut().enumerate() {
            let (oi, oj) = (M * ti + q / M, M * tj + q % M);
            if oi < self.oh && oj < self.ow {
                *at = Some(((img * self.oh + oi - first_row) * self.ow + oj) * self.c_out);
            }
        }
        at
    }

    /// The first output row (batch-flattened) of tile row `t` (batch-flattened); `n * oh` for
    /// `t = n * tiles_h`.
    pub(super) fn out_row(&self, t: usize) -> usize {
        let th = self.tiles_h();
        (t / th) * self.oh + (self.tile.side() * (t % th)).min(self.oh)
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
    let u = transform_kernel(kmat, c);
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
    let elements = c.tile.elements();
    tasks.into_par_iter().for_each(|(t0, t1, out)| {
        let tiles = (t1 - t0) * c.tiles_w();
        with_scratch(c.scratch_len((t0, t1)), |scratch| {
            let (v, m) = scratch.split_at_mut(elements * tiles * c.c_in);
            transform_input(x, c, (t0, t1), v);
            for (xi, m) in m.chunks_exact_mut(tiles * c.c_out).enumerate() {
                // V_ξ: row t at (t * elements + ξ) * c_in.
                let v = Strided {
                    data: &v[xi * c.c_in..],
                    rs: elements * c.c_in,
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

/// `U_ξ = (G g Gᵀ)_ξ` for every channel pair: `[ξ, c_in, c_out]` from the `[3, 3, c_in,
/// c_out]` kernel.
fn transform_kernel(kmat: &[f32], c: &Correlation) -> Vec<f32> {
    let mut u = vec![0.0f32; c.transformed_kernel_len()];
    transform_pairs(kmat, c, &mut u, false);
    u
}

/// The gradient w.r.t. `U` of the tiles of tile rows `[t0, t1)`, added to `du` (`[ξ, c_in,
/// c_out]`): `dU_ξ += V_ξᵀ Z_ξ`, with `Z = A dz Aᵀ` each tile's output gradient (zero past the
/// output) and `V` its input as in the forward pass. An empty `du` becomes those sums, written
/// once rather than added to zeros (a task's partial sums, 1.2 MB at 7×7 64 → 128 under
/// F(4×4, 3×3), were zeroed for it: 8-13% of that kernel gradient). `dz` holds the output rows
/// those tiles cover; `scratch` at least [`Correlation::scratch_len`] floats.
pub(super) fn add_kernel_grad(
    x: &[f32],
    dz: &[f32],
    c: &Correlation,
    rows: (usize, usize),
    du: &mut Vec<f32>,
    scratch: &mut [f32],
) {
    let elements = c.tile.elements();
    let tiles = (rows.1 - rows.0) * c.tiles_w();
    let (v, z) = scratch.split_at_mut(elements * tiles * c.c_in);
    let z = &mut z[..elements * tiles * c.c_out];
    transform_input(x, c, rows, v);
    transform_output_grad(dz, c, rows, z);
    let len = c.transformed_kernel_len();
    let fresh = du.is_empty();
    if fresh {
        du.reserve_exact(len);
    } else {
        assert_eq!(du.len(), len, "winograd: du must be [ξ, c_in, c_out]");
    }
    let pairs = c.c_in * c.c_out;
    for xi in 0..elements {
        let (vt, z) = element_operands((v, z), c, xi);
        let at = xi * pairs..(xi + 1) * pairs;
        if fresh {
            let dst = &mut du.spare_capacity_mut()[at];
            gemm_strided_uninit(dst, (c.c_in, c.c_out, tiles), vt, z, false);
        } else {
            gemm_strided(&mut du[at], c.c_in, c.c_out, tiles, vt, z, true, false);
        }
    }
    if fresh {
        // SAFETY: the capacity holds `len` elements, and the products wrote every one of
        // them (each element ξ's `pairs`, for every ξ).
        unsafe { du.set_len(len) };
    }
}

/// `V_ξᵀ` and `Z_ξ` of the tiles transformed into `v` and `z` (`[tiles, ξ, c]`): element `(i,
/// t)` of `V_ξᵀ` at `(t * elements + ξ) * c_in + i`, `(t, o)` of `Z_ξ` likewise (both empty
/// for no tiles, whose products are zeros).
fn element_operands<'a>(
    (v, z): (&'a [f32], &'a [f32]),
    c: &Correlation,
    xi: usize,
) -> (Strided<'a>, Strided<'a>) {
    let elements = c.tile.elements();
    let vt = Strided {
        data: &v[(xi * c.c_in).min(v.len())..],
        rs: 1,
        cs: elements * c.c_in,
    };
    let z = Strided {
        data: &z[(xi * c.c_out).min(z.len())..],
        rs: elements * c.c_out,
        cs: 1,
    };
    (vt, z)
}

/// The gradient w.r.t. `U` over every tile (`[ξ, c_in, c_out]`), `group` tile rows at a time
/// (at least one; [`Correlation::group_rows`]) in order: a group's tiles are transformed in
/// parallel into one scratch buffer (`[tiles, ξ, c]`, as [`add_kernel_grad`]'s), then
/// `dU_ξ += V_ξᵀ Z_ξ` runs for every element ξ in parallel, one product over the group's
/// tiles each. There are no per-task partial sums to write and add: at 7×7 64 → 128 under
/// F(4×4, 3×3) sixteen of them, 1.2 MB each, had cost more than the products. `dz` is the
/// whole output gradient. The groups are cut by the shape alone, so the bits do not depend
/// on the thread count.
pub(super) fn kernel_grad_by_groups(
    x: &[f32],
    dz: &[f32],
    c: &Correlation,
    group: usize,
) -> Vec<f32> {
    let (e, tw) = (c.tile.elements(), c.tiles_w());
    let (pairs, len) = (c.c_in * c.c_out, c.transformed_kernel_len());
    let mut du: Vec<f32> = Vec::with_capacity(len);
    let group = group.max(1);
    let part = group.div_ceil(MIN_TASKS).max(1);
    let out_at = |t: usize| c.out_row(t) * c.ow * c.c_out;
    with_scratch(c.scratch_len((0, group)), |scratch| {
        for g0 in (0..c.tile_rows()).step_by(group) {
            let g1 = (g0 + group).min(c.tile_rows());
            let tiles = (g1 - g0) * tw;
            let (v, z) = scratch.split_at_mut(e * tiles * c.c_in);
            let z = &mut z[..e * tiles * c.c_out];
            v.par_chunks_mut(part * tw * e * c.c_in)
                .zip(z.par_chunks_mut(part * tw * e * c.c_out))
                .enumerate()
                .for_each(|(k, (v, z))| {
                    let (t0, t1) = (g0 + k * part, (g0 + (k + 1) * part).min(g1));
                    transform_input(x, c, (t0, t1), v);
                    transform_output_grad(&dz[out_at(t0)..out_at(t1)], c, (t0, t1), z);
                });
            let operands = |xi| element_operands((v, z), c, xi);
            if g0 == 0 {
                let fresh = &mut du.spare_capacity_mut()[..len];
                fresh
                    .par_chunks_mut(pairs)
                    .enumerate()
                    .for_each(|(xi, du)| {
                        let (vt, z) = operands(xi);
                        gemm_strided_uninit(du, (c.c_in, c.c_out, tiles), vt, z, false);
                    });
                // SAFETY: the capacity holds `len` elements, and the products just wrote every
                // one of them (each element ξ's `pairs`).
                unsafe { du.set_len(len) };
            } else {
                du.par_chunks_mut(pairs).enumerate().for_each(|(xi, du)| {
                    let (vt, z) = operands(xi);
                    gemm_strided(du, c.c_in, c.c_out, tiles, vt, z, true, false);
                });
            }
        }
    });
    if du.is_empty() {
        du.resize(len, 0.0);
    }
    du
}

/// The `[3, 3, c_in, c_out]` kernel gradient `Gᵀ dU_ξ G` from the gradient w.r.t. `U`
/// (`[ξ, c_in, c_out]`, summed over every tile).
pub(super) fn kernel_from_grad(du: &[f32], dk: &mut [f32], c: &Correlation) {
    transform_pairs(du, c, dk, true);
}

/// Channel pairs a kernel transform's task takes: 64 KiB of kernel.
const PAIRS_PER_TASK: usize = 16 * 1024;

/// `G g Gᵀ` from a `[3, 3, pairs]` kernel into `[ξ, pairs]`, or with `back`, `Gᵀ dU G` from
/// `[ξ, pairs]` into `[3, 3, pairs]`: the channel pairs side by side, as channels are in the
/// tiles' transforms, cut into tasks of [`PAIRS_PER_TASK`].
fn transform_pairs(from: &[f32], c: &Correlation, to: &mut [f32], back: bool) {
    let pairs = c.c_in * c.c_out;
    if pairs == 0 {
        return;
    }
    let mut tasks: Vec<Vec<&mut [f32]>> = Vec::new();
    tasks.resize_with(pairs.div_ceil(PAIRS_PER_TASK), Vec::new);
    for row in to.chunks_exact_mut(pairs) {
        for (task, part) in tasks.iter_mut().zip(row.chunks_mut(PAIRS_PER_TASK)) {
            task.push(part);
        }
    }
    tasks.into_par_iter().enumerate().for_each(|(t, mut outs)| {
        let first = t * PAIRS_PER_TASK;
        let ins: Vec<&[f32]> = from
            .chunks_exact(pairs)
            .map(|row| &row[first..first + outs[0].len()])
            .collect();
        transform_pair_block(&ins, &mut outs, c.tile, back);
    });
}

multiversion! {
    /// [`transform_pairs`] on one block of channel pairs: `ins` and `outs` its rows.
    fn transform_pair_block(ins: &[&[f32]], outs: &mut [&mut [f32]], tile: Tile, back: bool) {
        let mut tmp = vec![0.0f32; 3 * (tile.side() + 2) * outs[0].len()];
        match (tile, back) {
            (Tile::F2, false) => separable::<3, 4, f2::G>(ins, outs, &mut tmp),
            (Tile::F4, false) => separable::<3, 6, f4::G>(ins, outs, &mut tmp),
            (Tile::F2, true) => separable::<4, 3, f2::Gt>(ins, outs, &mut tmp),
            (Tile::F4, true) => separable::<6, 3, f4::Gt>(ins, outs, &mut tmp),
        }
    }
}

/// `outs[q][k] = L([ins[0][k], ins[1][k], ...])[q]` for every channel `k` (`outs` all as
/// long, `ins` at least as long). A chunk of [`CHUNK`] channels at a time is copied into
/// arrays and transformed there, so the compiler turns the per-channel arithmetic into whole
/// vectors whatever the channel count (a plain loop over 32 channels ran scalar: the
/// vectorized loop takes 64 at a time); the last channels one by one.
#[inline(always)]
fn per_channel<const N: usize, const M: usize, L: Map<N, M>>(
    ins: [&[f32]; N],
    outs: &mut [&mut [f32]],
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
            let one = L::map(one);
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
        for (dst, value) in outs.iter_mut().zip(L::map(one)) {
            dst[k] = value;
        }
    }
}

/// `outs = L ins Lᵀ` channel by channel: `ins` an `I × I` tile of channel rows (row-major),
/// `outs` `O × O`. `L` maps each column into `tmp` (`[I, O, channels]`), then each row of
/// `tmp`: two passes of a one-dimensional map that the compiler vectorizes, where one pass
/// over a whole 6×6 tile ran scalar.
#[inline(always)]
fn separable<const I: usize, const O: usize, L: Map<I, O>>(
    ins: &[&[f32]],
    outs: &mut [&mut [f32]],
    tmp: &mut [f32],
) {
    let len = outs[0].len();
    for (s, col) in tmp.chunks_exact_mut(O * len).take(I).enumerate() {
        let mut src = [ins[0]; I];
        for (r, src) in src.iter_mut().enumerate() {
            *src = ins[r * I + s];
        }
        per_channel::<I, O, L>(src, &mut rows_of::<O>(col, len));
    }
    for (r, outs) in outs.chunks_exact_mut(O).enumerate() {
        let mut src = [&tmp[..0]; I];
        for (s, src) in src.iter_mut().enumerate() {
            *src = &tmp[(s * O + r) * len..][..len];
        }
        per_channel::<I, O, L>(src, outs);
    }
}

/// `out` (`E` rows of `width`) as its rows.
#[inline(always)]
fn rows_of<const E: usize>(out: &mut [f32], width: usize) -> [&mut [f32]; E] {
    let mut rows: [&mut [f32]; E] = std::array::from_fn(|_| Default::default());
    for (row, chunk) in rows.iter_mut().zip(out.chunks_exact_mut(width)) {
        *row = chunk;
    }
    rows
}

/// A tile's transform over channel rows: its `A` input rows (row-major over the tile) into
/// its `B` output rows, `len` channels each. The rows come as plain pointers: from slices,
/// every vector's load and store read a fat pointer from an array on the stack and checked
/// its bounds, and F(4×4, 3×3)'s transforms ran 10-40% slower.
trait TileMap<const A: usize, const B: usize> {
    /// Transforms one tile, channel by channel.
    ///
    /// # Safety
    /// Each of `ins` is readable and each of `outs` writable for `len` floats, and no output
    /// row overlaps another row, in or out.
    unsafe fn apply(ins: &[*const f32; A], outs: &[*mut f32; B], len: usize);
}

/// The vector at `p + k`.
///
/// # Safety
/// `p + k` is readable for `V::LANES` floats.
#[inline(always)]
unsafe fn load<V: Vector>(p: *const f32, k: usize) -> V {
    V::load(unsafe { std::slice::from_raw_parts(p.add(k), V::LANES) }, 0)
}

/// Writes `v` to `p + k`.
///
/// # Safety
/// `p + k` is writable for `V::LANES` floats, and no reference covers them.
#[inline(always)]
unsafe fn store<V: Vector>(v: V, p: *mut f32, k: usize) {
    v.store(
        unsafe { std::slice::from_raw_parts_mut(p.add(k), V::LANES) },
        0,
    )
}

/// A whole-tile map `T` into `B` rows in one pass ([`per_channel`]): F(2×2, 3×3)'s input
/// transform ([`f2_tile`]), which ran 10-15% slower on vectors ([`by_vectors!`]).
struct OnePass<T>(std::marker::PhantomData<T>);

impl<const A: usize, const B: usize, T: Map<A, B>> TileMap<A, B> for OnePass<T> {
    #[inline(always)]
    unsafe fn apply(ins: &[*const f32; A], outs: &[*mut f32; B], len: usize) {
        let ins = ins.map(|p| unsafe { std::slice::from_raw_parts(p, len) });
        let mut outs = outs.map(|p| unsafe { std::slice::from_raw_parts_mut(p, len) });
        per_channel::<A, B, T>(ins, &mut outs);
    }
}

/// Defines a [`TileMap`] `L x Lᵀ` that works on vectors `V` of channels, each tile's values
/// loaded from its rows and kept in registers: `L` on each column (one local per column, its
/// input rows listed), then on each row, each result stored straight into its output row
/// (the last channels one at a time). Against two passes of [`per_channel`] through a
/// scratch tile, F(4×4, 3×3)'s output transform ran 20-40% faster, its input transform
/// 0-20%; the same arithmetic in the same order, so the same bits. Written out: a column
/// array built by `from_fn`, or a row consumed by `into_iter`, left the vectors to be copied
/// through memory, and ran as slow as the passes; the rows written out one by one, rather
/// than a loop, ran 10-25% slower.
macro_rules! by_vectors {
    ($(#[$attr:meta])* $name:ident: $map:ty, $a:literal -> $b:literal, $i:literal x $o:literal,
     columns [$($col:ident: $($at:literal)*),*]) => {
        $(#[$attr])*
        struct $name<V>(std::marker::PhantomData<V>);

        // The tile's sides are those of its rows.
        const _: () = assert!($i * $i == $a && $o * $o == $b);

        impl<V: Vector + Value> TileMap<$a, $b> for $name<V> {
            #[inline(always)]
            unsafe fn apply(ins: &[*const f32; $a], outs: &[*mut f32; $b], len: usize) {
                let mut k = 0;
                while k + V::LANES <= len {
                    $(let $col = <$map>::map([$(unsafe { load::<V>(ins[$at], k) }),*]);)*
                    for r in 0..$o {
                        let row = <$map>::map([$($col[r]),*]);
                        for j in 0..$o {
                            unsafe { store(row[j], outs[r * $o + j], k) };
                        }
                    }
                    k += V::LANES;
                }
                for k in k..len {
                    let rows = square::<f32, $i, $o, $map>(|r, s| unsafe {
                        *ins[r * $i + s].add(k)
                    });
                    for (r, row) in rows.iter().enumerate() {
                        for (j, &value) in row.iter().enumerate() {
                            unsafe { *outs[r * $o + j].add(k) = value };
                        }
                    }
                }
            }
        }
    };
}

by_vectors!(
    /// F(4×4, 3×3)'s input transform `Bᵀ d B`.
    F4In: f4::Bt, 36 -> 36, 6 x 6, columns [
        c0: 0 6 12 18 24 30, c1: 1 7 13 19 25 31, c2: 2 8 14 20 26 32,
        c3: 3 9 15 21 27 33, c4: 4 10 16 22 28 34, c5: 5 11 17 23 29 35
    ]
);

by_vectors!(
    /// F(4×4, 3×3)'s output transform `Aᵀ m A`.
    F4Out: f4::At, 36 -> 16, 6 x 4, columns [
        c0: 0 6 12 18 24 30, c1: 1 7 13 19 25 31, c2: 2 8 14 20 26 32,
        c3: 3 9 15 21 27 33, c4: 4 10 16 22 28 34, c5: 5 11 17 23 29 35
    ]
);

by_vectors!(
    /// F(4×4, 3×3)'s output-gradient transform `A dz Aᵀ`.
    F4OutGrad: f4::A, 16 -> 36, 4 x 6, columns [
        c0: 0 4 8 12, c1: 1 5 9 13, c2: 2 6 10 14, c3: 3 7 11 15
    ]
);

by_vectors!(
    /// F(2×2, 3×3)'s output transform `Aᵀ m A`.
    F2Out: f2::At, 16 -> 4, 4 x 2, columns [
        c0: 0 4 8 12, c1: 1 5 9 13, c2: 2 6 10 14, c3: 3 7 11 15
    ]
);

by_vectors!(
    /// F(2×2, 3×3)'s output-gradient transform `A dz Aᵀ`.
    F2OutGrad: f2::A, 4 -> 16, 2 x 4, columns [c0: 0 2, c1: 1 3]
);

/// `E` rows of `width` floats from `out`'s start, as pointers (all from one, so that writing
/// through one leaves the others valid).
#[inline(always)]
fn row_pointers<const E: usize>(out: &mut [f32], width: usize) -> [*mut f32; E] {
    assert!(
        out.len() >= E * width,
        "{E} rows of {width} in {}",
        out.len()
    );
    let first = out.as_mut_ptr();
    let mut rows = [first; E];
    for (q, row) in rows.iter_mut().enumerate() {
        *row = first.wrapping_add(q * width);
    }
    rows
}

multiversion! {
    /// `V_ξ[t, :] = (Bᵀ d_t B)_ξ` for the tiles of tile rows `[t0, t1)`: `v` is `[tiles, ξ,
    /// c_in]` (each tile's rows together, so that its transform writes one run of memory),
    /// `d_t` the tile's input pixels (zero outside the image).
    fn transform_input(x: &[f32], c: &Correlation, rows: (usize, usize), v: &mut [f32]) {
        // Vectors of 16 channels (two AVX2 registers each, where AVX-512 is absent): with 8
        // the transforms ran 5-20% slower on both.
        match c.tile {
            Tile::F2 => input_tiles::<4, 16, OnePass<f2_tile::Bt>>(x, c, rows, v),
            Tile::F4 => input_tiles::<6, 36, F4In<V16>>(x, c, rows, v),
        }
    }
}

/// [`transform_input`] for input tiles of `N × N = E` pixels.
#[inline(always)]
fn input_tiles<const N: usize, const E: usize, T: TileMap<E, E>>(
    x: &[f32],
    c: &Correlation,
    (t0, t1): (usize, usize),
    v: &mut [f32],
) {
    let (th, tw, ci, side) = (c.tiles_h(), c.tiles_w(), c.c_in, c.tile.side());
    let zeros = vec![0.0f32; ci];
    for tr in t0..t1 {
        let (img, ti) = (tr / th, tr % th);
        for tj in 0..tw {
            let t = (tr - t0) * tw + tj;
            // The tile's pixels, zeros outside the image (`wrapping_sub`: a row or column
            // before it wraps past the end).
            let mut d = [zeros.as_ptr(); E];
            for r in 0..N {
                let i = (side * ti + r).wrapping_sub(c.pt);
                for s in 0..N {
                    let j = (side * tj + s).wrapping_sub(c.pl);
                    if i < c.h && j < c.w {
                        d[r * N + s] = x[((img * c.h + i) * c.w + j) * ci..][..ci].as_ptr();
                    }
                }
            }
            let out = row_pointers::<E>(&mut v[t * E * ci..], ci);
            // SAFETY: rows of `ci` floats of `x` or `zeros`, and `E` disjoint ones of `v`.
            unsafe { T::apply(&d, &out, ci) };
        }
    }
}

multiversion! {
    /// `Z_t = A dz_t Aᵀ` for the tiles of tile rows `[t0, t1)` into `z` (`[tiles, ξ,
    /// c_out]`), `dz` the output rows those tiles cover (zero past the output).
    fn transform_output_grad(dz: &[f32], c: &Correlation, rows: (usize, usize), z: &mut [f32]) {
        // Vectors of 8 channels: with 16 (36 outputs from 16 inputs) the output gradient ran
        // 10-20% slower under AVX-512, and up to 45% under AVX2.
        match c.tile {
            Tile::F2 => output_grad_tiles::<2, 4, 16, F2OutGrad<V8>>(dz, c, rows, z),
            Tile::F4 => output_grad_tiles::<4, 16, 36, F4OutGrad<V8>>(dz, c, rows, z),
        }
    }
}

/// [`transform_output_grad`] for tiles of `M × M = Q` outputs and `E` elements.
#[inline(always)]
fn output_grad_tiles<const M: usize, const Q: usize, const E: usize, T: TileMap<Q, E>>(
    dz: &[f32],
    c: &Correlation,
    (t0, t1): (usize, usize),
    z: &mut [f32],
) {
    let (th, tw, co) = (c.tiles_h(), c.tiles_w(), c.c_out);
    let first_row = c.out_row(t0);
    let zeros = vec![0.0f32; co];
    for tr in t0..t1 {
        let (img, ti) = (tr / th, tr % th);
        for tj in 0..tw {
            let t = (tr - t0) * tw + tj;
            let mut d = [zeros.as_ptr(); Q];
            for (d, at) in d
                .iter_mut()
                .zip(c.tile_outputs::<M, Q>(img, ti, tj, first_row))
            {
                if let Some(at) = at {
                    *d = dz[at..][..co].as_ptr();
                }
            }
            let out = row_pointers::<E>(&mut z[t * E * co..], co);
            // SAFETY: rows of `co` floats of `dz` or `zeros`, and `E` disjoint ones of `z`.
            unsafe { T::apply(&d, &out, co) };
        }
    }
}

multiversion! {
    /// The outputs `Aᵀ m_t A` of the tiles of tile rows `[t0, t1)` from `m` (`[ξ, tiles,
    /// c_out]`) into `out`, the output rows those tiles cover (a last tile's rows or columns
    /// past the output are dropped).
    fn transform_output(m: &[f32], c: &Correlation, rows: (usize, usize), out: &mut [f32]) {
        match c.tile {
            Tile::F2 => output_tiles::<2, 4, 16, F2Out<V16>>(m, c, rows, out),
            Tile::F4 => output_tiles::<4, 16, 36, F4Out<V16>>(m, c, rows, out),
        }
    }
}

/// [`transform_output`] for tiles of `M × M = Q` outputs and `E` elements.
#[inline(always)]
fn output_tiles<const M: usize, const Q: usize, const E: usize, T: TileMap<E, Q>>(
    m: &[f32],
    c: &Correlation,
    (t0, t1): (usize, usize),
    out: &mut [f32],
) {
    let (th, tw, co) = (c.tiles_h(), c.tiles_w(), c.c_out);
    let tiles = (t1 - t0) * tw;
    let first_row = c.out_row(t0);
    // Where the outputs past the image go.
    let mut dropped = vec![0.0f32; Q * co];
    let spare = row_pointers::<Q>(&mut dropped, co);
    let (y, y_len) = (out.as_mut_ptr(), out.len());
    for tr in t0..t1 {
        let (img, ti) = (tr / th, tr % th);
        for tj in 0..tw {
            let t = (tr - t0) * tw + tj;
            // A loop, not `from_fn`: that was called out of line, and reading its array back
            // stalled.
            let mut e = [std::ptr::null(); E];
            for (xi, e) in e.iter_mut().enumerate() {
                *e = m[(xi * tiles + t) * co..][..co].as_ptr();
            }
            // The tile's outputs in `out`, or in `dropped`.
            let at_pixel = c.tile_outputs::<M, Q>(img, ti, tj, first_row);
            let mut dst = spare;
            for (dst, at) in dst.iter_mut().zip(at_pixel) {
                if let Some(at) = at {
                    assert!(at + co <= y_len, "output pixel at {at} past {y_len}");
                    *dst = y.wrapping_add(at);
                }
            }
            // SAFETY: rows of `co` floats of `m`, and `Q` of `out` or `dropped`, distinct
            // pixels.
            unsafe { T::apply(&e, &dst, co) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_by_image_size() {
        // F(4×4, 3×3) where it takes fewer products; kernel gradients only at 9/16.
        assert_eq!(Tile::fewer_products(7, 7), Tile::F4);
        assert_eq!(Tile::fewer_products(14, 14), Tile::F4);
        assert_eq!(Tile::fewer_products(2, 9), Tile::F2);
        assert_eq!(Tile::fewer_products(6, 5), Tile::F2);
        assert_eq!(Tile::as_tight(7, 7), Tile::F4);
        assert_eq!(Tile::as_tight(28, 28), Tile::F4);
        assert_eq!(Tile::as_tight(14, 14), Tile::F2);
        assert_eq!(Tile::as_tight(9, 11), Tile::F2);
    }

    #[test]
    fn large_transformed_kernels_go_by_groups() {
        let layer = |hw: usize, c_in: usize, c_out: usize| {
            let tile = Tile::as_tight(hw, hw);
            Correlation {
                n: 128,
                h: hw,
                w: hw,
                c_in,
                oh: hw,
                ow: hw,
                c_out,
                pt: 1,
                pl: 1,
                tile,
            }
        };
        assert!(layer(7, 64, 128).grad_by_groups());
        assert!(!layer(14, 32, 64).grad_by_groups());
        assert!(!layer(28, 16, 32).grad_by_groups());
        // A group fills about GROUP_FLOATS: 75 of 7×7 64 → 128's 256 tile rows.
        assert_eq!(
            layer(7, 64, 128).group_rows(),
            GROUP_FLOATS / (36 * 2 * 192)
        );
    }

    /// `T` on `A = I × I` rows of `c` channels, against two passes of `L` ([`separable`]).
    fn tile_map_is_two_passes<
        const I: usize,
        const O: usize,
        const A: usize,
        const B: usize,
        L,
        T,
    >()
    where
        L: Map<I, O>,
        T: TileMap<A, B>,
    {
        // Whole vectors of 16 and of 8 channels, and channels left over after them.
        for c in [5, 8, 16, 37] {
            let ins: Vec<Vec<f32>> = (0..A)
                .map(|q| {
                    let values = (0..c).map(|k| ((q * 37 + k * 11) as f32 * 0.731).sin() * 2.0);
                    values.collect()
                })
                .collect();
            let rows: [&[f32]; A] = std::array::from_fn(|q| &ins[q][..]);
            let (mut ours, mut theirs) = (vec![0.0f32; O * O * c], vec![0.0f32; O * O * c]);
            let ins = rows.map(<[f32]>::as_ptr);
            // SAFETY: `A` rows of `c` floats, and `B` disjoint ones of `ours`.
            unsafe { T::apply(&ins, &row_pointers::<B>(&mut ours, c), c) };
            let mut tmp = vec![0.0f32; I * O * c];
            let mut outs: Vec<&mut [f32]> = theirs.chunks_exact_mut(c).collect();
            separable::<I, O, L>(&rows, &mut outs, &mut tmp);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&ours), bits(&theirs), "{c} channels");
        }
    }

    #[test]
    fn tile_maps_give_the_bits_of_two_passes() {
        tile_map_is_two_passes::<6, 6, 36, 36, f4::Bt, F4In<V16>>();
        tile_map_is_two_passes::<6, 4, 36, 16, f4::At, F4Out<V16>>();
        tile_map_is_two_passes::<4, 6, 16, 36, f4::A, F4OutGrad<V8>>();
        tile_map_is_two_passes::<4, 4, 16, 16, f2::Bt, OnePass<f2_tile::Bt>>();
        tile_map_is_two_passes::<4, 2, 16, 4, f2::At, F2Out<V16>>();
        tile_map_is_two_passes::<2, 4, 4, 16, f2::A, F2OutGrad<V8>>();
        // The vector widths the dispatch does not pick run the same arithmetic.
        tile_map_is_two_passes::<6, 4, 36, 16, f4::At, F4Out<V8>>();
        tile_map_is_two_passes::<4, 6, 16, 36, f4::A, F4OutGrad<V16>>();
    }

    #[test]
    fn anygpu_winograd_asks_for_f2_or_nothing() {
        assert!(f2_asked(Some("f2")));
        for value in [None, Some(""), Some("auto"), Some("F4"), Some("f4x4")] {
            assert!(!f2_asked(value), "{value:?}");
        }
    }
}
