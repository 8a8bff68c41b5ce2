//! Winograd's minimal filtering for the stride-1 3×3 correlations of `conv/`: a `Conv2D`'s
//! forward pass and its input gradient, and the kernel gradient's sums (Lavin and Gray, "Fast
//! Algorithms for Convolutional Neural Networks", CVPR 2016). F(4×4, 3×3) computes each 4×4
//! block of outputs from a 6×6 block of input in 36 multiplications per channel pair instead
//! of 144; F(2×2, 3×3), each 2×2 block from 4×4 in 16 instead of 36. [`Tile`] picks one by
//! the image size.
//!
//! With `d` an input tile and `g` the 3×3 kernel, the tile's output is `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d
//! B)] A` ([`tiles`] the one-dimensional maps, [`transforms`] the tiles' transforms over rows
//! of channels). Summed over the input channels, the element-wise product is one matrix
//! product per tile element ξ: `M_ξ[tiles, c_out] = V_ξ[tiles, c_in] · U_ξ[c_in, c_out]`,
//! which the gemm crate runs. A task takes a few rows of tiles: it transforms their input into
//! `V` (element by element, [`transforms::Transformed`]), multiplies, and transforms `M` into
//! its output rows, in per-thread scratch memory small enough to stay in L2.
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
mod transforms;

use rayon::prelude::*;

use crate::ops::spec::Activation;

use super::elementwise::bias_act_rows;
use super::gemm::{gemm_strided, gemm_strided_uninit, Strided};
use super::with_scratch;
use transforms::{
    transform_input, transform_output, transform_output_grad, transform_pairs, Transformed,
};

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
        let per_row = self.row_floats();
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

    /// Floats of a tile row's transformed input and output (or output gradient).
    fn row_floats(&self) -> usize {
        self.tile.elements() * self.tiles_w() * (self.c_in + self.c_out)
    }

    /// Scratch floats a task over tile rows `[t0, t1)` needs: its tiles' transformed input and
    /// output (or output gradient), [`Transformed`] each.
    pub(super) fn scratch_len(&self, (t0, t1): (usize, usize)) -> usize {
        let (e, tiles) = (self.tile.elements(), (t1 - t0) * self.tiles_w());
        Transformed::len(e, tiles, self.c_in) + Transformed::len(e, tiles, self.c_out)
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
        (GROUP_FLOATS / self.row_floats().max(1)).max(1)
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
            let (v, m) = scratch.split_at_mut(Transformed::len(elements, tiles, c.c_in));
            transform_input(x, c, (t0, t1), Transformed::new(v, elements, tiles, c.c_in));
            let stride = Transformed::stride(tiles, c.c_in);
            let m = &mut m[..elements * tiles * c.c_out];
            for (xi, m) in m.chunks_exact_mut(tiles * c.c_out).enumerate() {
                let v = Strided::row_major(&v[xi * stride..][..tiles * c.c_in], c.c_in);
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
    let (v, z) = scratch.split_at_mut(Transformed::len(elements, tiles, c.c_in));
    let z = &mut z[..Transformed::len(elements, tiles, c.c_out)];
    transform_input(x, c, rows, Transformed::new(v, elements, tiles, c.c_in));
    transform_output_grad(dz, c, rows, Transformed::new(z, elements, tiles, c.c_out));
    let len = c.transformed_kernel_len();
    let fresh = du.is_empty();
    if fresh {
        du.reserve_exact(len);
    } else {
        assert_eq!(du.len(), len, "winograd: du must be [ξ, c_in, c_out]");
    }
    let pairs = c.c_in * c.c_out;
    for xi in 0..elements {
        let (vt, z) = element_operands((v, z), c, tiles, xi);
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

/// `V_ξᵀ` and `Z_ξ` of the `tiles` tiles transformed into `v` and `z` ([`Transformed`]):
/// element `(i, t)` of `V_ξᵀ` at `ξ * stride + t * c_in + i`, `(t, o)` of `Z_ξ` likewise (both
/// empty for no tiles, whose products are zeros).
fn element_operands<'a>(
    (v, z): (&'a [f32], &'a [f32]),
    c: &Correlation,
    tiles: usize,
    xi: usize,
) -> (Strided<'a>, Strided<'a>) {
    let at = |width| xi * Transformed::stride(tiles, width);
    let vt = Strided {
        data: &v[at(c.c_in).min(v.len())..],
        rs: 1,
        cs: c.c_in,
    };
    let z = Strided::row_major(&z[at(c.c_out).min(z.len())..], c.c_out);
    (vt, z)
}

/// The gradient w.r.t. `U` over every tile (`[ξ, c_in, c_out]`), `group` tile rows at a time
/// (at least one; [`Correlation::group_rows`]) in order: a group's tiles are transformed in
/// parallel into one scratch buffer ([`Transformed`], as [`add_kernel_grad`]'s), then
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
            let (v, z) = scratch.split_at_mut(Transformed::len(e, tiles, c.c_in));
            let z = &mut z[..Transformed::len(e, tiles, c.c_out)];
            // Each task transforms `part` tile rows into its own tiles of `v` and `z`.
            let mut parts = Vec::with_capacity((g1 - g0).div_ceil(part));
            let mut rest = (
                Transformed::new(v, e, tiles, c.c_in),
                Transformed::new(z, e, tiles, c.c_out),
            );
            for t0 in (g0..g1).step_by(part) {
                let t1 = (t0 + part).min(g1);
                let (v, v_rest) = rest.0.split_at((t1 - t0) * tw);
                let (z, z_rest) = rest.1.split_at((t1 - t0) * tw);
                parts.push(((t0, t1), v, z));
                rest = (v_rest, z_rest);
            }
            parts.into_par_iter().for_each(|(rows, v, z)| {
                transform_input(x, c, rows, v);
                transform_output_grad(&dz[out_at(rows.0)..out_at(rows.1)], c, rows, z);
            });
            let operands = |xi| element_operands((v, z), c, tiles, xi);
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

    #[test]
    fn anygpu_winograd_asks_for_f2_or_nothing() {
        assert!(f2_asked(Some("f2")));
        for value in [None, Some(""), Some("auto"), Some("F4"), Some("f4x4")] {
            assert!(!f2_asked(value), "{value:?}");
        }
    }
}
