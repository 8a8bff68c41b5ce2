//! The matrix products on a GPU (`matmul.wgsl`): the kernel picked per shape and adapter (64×64
//! tiles, vec4, workgroup-memory tiles, tall register blocks, the uniform window of `matmul_ubo8`,
//! split k, a transposed operand copied row-major first; for float16, cooperative matrices where
//! the adapter has them, see `coop/`), by the tuner where several apply.

use bytemuck::{Pod, Zeroable};

use crate::device::context::UNIFORM_SCRATCH_BYTES;
use crate::device::logical::GpuRange;
use crate::error::Result;
use crate::ops::gpu::coop;
use crate::ops::gpu::tune::{bucket, Choice};
use crate::ops::gpu::{grid_1d, MAX_GROUPS_PER_DIM};
use crate::ops::spec::Activation;
use crate::ops::{Kernels, MatmulDims};
use crate::tensor::{DType, Tensor};

use super::kernels::*;

/// Output rows and columns one `matmul_16x8` workgroup covers.
const TALL_ROWS: usize = 128;

const TALL_COLS: usize = 64;

/// Output columns one `matmul_16x4` workgroup covers, and the widest product it is offered.
const NARROW_COLS: usize = 32;

/// The most dispatches `matmul_ubo8` may take for one product (a 1×1 convolution of 64
/// channels to 128 takes 32).
const UBO8_MAX_DISPATCHES: usize = (UNIFORM_SCRATCH_BYTES / UBO8_WINDOW) as usize;

/// Bytes of B one `matmul_ubo8` dispatch reads: 32 rows of k × 8 columns.
const UBO8_WINDOW: u64 = 32 * 8 * 4;

/// Split k when the output has at most this many 64×64 tiles...
const SPLITK_MAX_TILES: usize = 32;

/// ...and k is at least this long (in vec4s); each slice gets at least `SPLITK_MIN_SLICE`.
const SPLITK_MIN_K4: usize = 64;

const SPLITK_MIN_SLICE: usize = 8;

/// Workgroups a split product aims for.
const SPLITK_WORKGROUPS: usize = 256;

/// The grid of a tiled product: `col_tiles` along x, `row_tiles` along y, folded into z past
/// the 65,535 one dimension holds (the shaders' `row_tile`).
fn tile_grid(col_tiles: usize, row_tiles: usize) -> [u32; 3] {
    let y = row_tiles.clamp(1, MAX_GROUPS_PER_DIM);
    [u(col_tiles), u(y), u(row_tiles.div_ceil(y).max(1))]
}

/// Whether the vec4 matrix-product kernels take `d`: n and k multiples of 4, no transposes.
fn vec4_product(d: MatmulDims) -> bool {
    d.n.is_multiple_of(4) && d.k.is_multiple_of(4) && !d.trans_a && !d.trans_b
}

/// `(slice, splits)` for a split-k product of `d`, in units of k the kernel steps by (vec4s
/// for the vec4 kernels, elements else), or `None` when the output has enough tiles or k is
/// short.
fn splitk_slices(d: MatmulDims) -> Option<(usize, usize)> {
    let tiles = d.m.div_ceil(64) * d.n.div_ceil(64);
    let (k, unit) = if vec4_product(d) {
        (d.k / 4, 1)
    } else {
        (d.k, 4)
    };
    if tiles > SPLITK_MAX_TILES || k < SPLITK_MIN_K4 * unit {
        return None;
    }
    let wanted = SPLITK_WORKGROUPS.div_ceil(tiles);
    let slice = k.div_ceil(wanted).max(SPLITK_MIN_SLICE * unit);
    Some((slice, k.div_ceil(slice)))
}

/// `(column blocks, chunks of k)` of a `matmul_ubo8` product of `d` (one dispatch each), or
/// `None` where it does not apply: k a multiple of 32, n of 8, no transposes, and few
/// dispatches (each streams the whole of A's slice, so a long k or a wide n loses).
fn ubo8_windows(d: MatmulDims) -> Option<(usize, usize)> {
    let fits = vec4_product(d) && d.k.is_multiple_of(32) && d.n.is_multiple_of(8) && d.k > 0;
    let (blocks, chunks) = (d.n / 8, d.k / 32);
    (fits && blocks * chunks <= UBO8_MAX_DISPATCHES).then_some((blocks, chunks))
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct MatmulParams {
    m: u32,
    k: u32,
    n: u32,
    has_bias: u32,
    a_rs: u32,
    a_cs: u32,
    b_rs: u32,
    b_cs: u32,
    act: u32,
    /// `matmul_v4_splitk`'s slice of k, in vec4s.
    k_slice: u32,
    /// `matmul_ubo8`'s block of 8 columns and slice of 32 rows of k.
    block: u32,
    chunk: u32,
}

impl GpuKernels<'_> {
    pub(super) fn matmul_impl(
        &self,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        d: MatmulDims,
        act: Activation,
    ) -> Result<()> {
        if d.m == 0 || d.n == 0 {
            return Ok(());
        }
        let (a_rs, a_cs) = if d.trans_a { (1, d.m) } else { (d.k, 1) };
        let (b_rs, b_cs) = if d.trans_b { (1, d.k) } else { (d.n, 1) };
        let p = MatmulParams {
            m: u(d.m),
            k: u(d.k),
            n: u(d.n),
            has_bias: u32::from(bias.is_some()),
            a_rs: u(a_rs),
            a_cs: u(a_cs),
            b_rs: u(b_rs),
            b_cs: u(b_cs),
            act: act.code(),
            k_slice: 0,
            block: 0,
            chunk: 0,
        };
        if d.k == 0 {
            // No terms: the product is zero; the kernel's loop simply does not run, but a and b
            // have no buffers to bind. Bind the output in their place.
            return self.launch(
                MATMUL,
                &p,
                &[out, out, bias.unwrap_or(out), out],
                tile_grid(d.n.div_ceil(64), d.m.div_ceil(64)),
            );
        }
        let software = self.dev.ctx.software_kernels;
        let bias_or_out = bias.unwrap_or(out);
        if vec4_product(d) {
            // Bindings 3, 5, 6, 7: bias, then b, out and a as vec4 (ranges are 256-byte
            // aligned and sized, so the vec4 views are valid). Software adapters want the tall
            // register block (see matmul.wgsl for the measurements), GPUs many invocations to
            // hide latency, and split k when the output has few tiles.
            let mut candidates = vec!["tile64_v4", "tall_16x8"];
            if d.n <= NARROW_COLS {
                candidates.push("tall_16x4");
            }
            let full_only = self.workgroup_tiles(&mut candidates, &["smem64_v4", "smem128_v4"]);
            if splitk_slices(d).is_some() {
                candidates.push("splitk_v4");
            }
            // Its uniform window holds float32 values: no float16 twin.
            if ubo8_windows(d).is_some() && a.dtype() == DType::F32 {
                candidates.push("ubo8");
            }
            // Tensor cores, where the adapter has them (float16 only).
            candidates.extend(self.coop_candidates(a, b, bias, out, d)?);
            let heuristic = if software { "tall_16x8" } else { "tile64_v4" };
            let class = format!("v4 {}x{}x{}", bucket(d.m), bucket(d.n), bucket(d.k));
            return self.tuned(
                Choice::new("matmul", class, &candidates, heuristic).full_only(full_only),
                &mut |c| match c {
                    "tall_16x8" => {
                        let grid = tile_grid(d.n.div_ceil(TALL_COLS), d.m.div_ceil(TALL_ROWS));
                        self.launch(MATMUL_16X8, &p, &[bias_or_out, b, out, a], grid)
                    }
                    "tall_16x4" => {
                        let grid = tile_grid(d.n.div_ceil(NARROW_COLS), d.m.div_ceil(TALL_ROWS));
                        self.launch(MATMUL_16X4, &p, &[bias_or_out, b, out, a], grid)
                    }
                    "splitk_v4" => self.matmul_split_k(a, b, bias, out, d, p),
                    "ubo8" => self.matmul_ubo8(a, b, bias, out, d, p),
                    c if coop::is_candidate(c) => self.matmul_coop(c, a, b, bias, out, d, act),
                    "smem64_v4" => {
                        let grid = tile_grid(d.n.div_ceil(64), d.m.div_ceil(64));
                        self.launch(MATMUL_SMEM_V4, &p, &[bias_or_out, b, out, a], grid)
                    }
                    "smem128_v4" => {
                        let grid = tile_grid(d.n.div_ceil(64), d.m.div_ceil(128));
                        self.launch(MATMUL_SMEM128_V4, &p, &[bias_or_out, b, out, a], grid)
                    }
                    _ => {
                        let grid = tile_grid(d.n.div_ceil(64), d.m.div_ceil(64));
                        self.launch(MATMUL_V4, &p, &[bias_or_out, b, out, a], grid)
                    }
                },
            );
        }
        let heuristic = if software { "tall" } else { "tile64" };
        let class = format!(
            "{}{} {}x{}x{}",
            if d.trans_a { "t" } else { "n" },
            if d.trans_b { "t" } else { "n" },
            bucket(d.m),
            bucket(d.n),
            bucket(d.k)
        );
        let mut candidates = vec!["tile64", "tall"];
        if splitk_slices(d).is_some() {
            candidates.push("splitk");
        }
        if d.n.is_multiple_of(4) && d.k.is_multiple_of(4) {
            candidates.push("untransposed");
        }
        candidates.extend(self.coop_candidates(a, b, bias, out, d)?);
        let choice = Choice::new("matmul", class, &candidates, heuristic);
        self.tuned(choice, &mut |c| match c {
            "untransposed" => self.matmul_untransposed(a, b, bias, out, d, act),
            "tall" => {
                let grid = tile_grid(d.n.div_ceil(64), d.m.div_ceil(128));
                self.launch(MATMUL_TALL, &p, &[a, b, bias_or_out, out], grid)
            }
            "splitk" => self.matmul_split_k(a, b, bias, out, d, p),
            c if coop::is_candidate(c) => self.matmul_coop(c, a, b, bias, out, d, act),
            _ => {
                let grid = tile_grid(d.n.div_ceil(64), d.m.div_ceil(64));
                self.launch(MATMUL, &p, &[a, b, bias_or_out, out], grid)
            }
        })
    }

    /// `out = act(a · b + bias)` by `matmul_ubo8`: B packed into blocks of 8 columns, then one
    /// dispatch per (block, 32 rows of k) that reads its window of B as a uniform buffer.
    fn matmul_ubo8(
        &self,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        d: MatmulDims,
        p: MatmulParams,
    ) -> Result<()> {
        let bias_or_out = bias.unwrap_or(out);
        let Some((blocks, chunks)) = ubo8_windows(d) else {
            // Only offered where it applies; a forced pick elsewhere gets the plain tiles.
            let tiles = tile_grid(d.n.div_ceil(64), d.m.div_ceil(64));
            return self.launch(MATMUL_V4, &p, &[bias_or_out, b, out, a], tiles);
        };
        // B packed into the uniform scratch buffer (UBO8_MAX_DISPATCHES windows fit).
        let bytes = (d.k * d.n * 4) as u64;
        self.with_uniform_windows(
            [bias_or_out, out, a, b],
            bytes,
            |[bias_or_out, out, a, b], packed| {
                self.launch_ranges(PACK_B8, &p, &[b, packed], grid_1d(d.k * d.n, 256))?;
                for block in 0..blocks {
                    // In order of k: each chunk adds to what the one before stored.
                    for chunk in 0..chunks {
                        let window = GpuRange {
                            offset: packed.offset + (block * chunks + chunk) as u64 * UBO8_WINDOW,
                            size: UBO8_WINDOW,
                            ..packed
                        };
                        let params = MatmulParams {
                            block: u(block),
                            chunk: u(chunk),
                            ..p
                        };
                        // Bindings 3, 6, 7, 8: bias, out, a, the window.
                        let ranges = [bias_or_out, out, a, window];
                        self.launch_ranges(MATMUL_UBO8, &params, &ranges, grid_1d(d.m, 64))?;
                    }
                }
                Ok(())
            },
        )
    }

    /// Runs `record` with the ranges of `tensors` and the first `bytes` of the adapter's
    /// uniform scratch buffer, held until `record` returns so that no other op repacks it
    /// before the dispatches reading it are recorded (commands run in recording order).
    /// Nothing runs when a tensor is empty (it has no range).
    pub(crate) fn with_uniform_windows<const N: usize>(
        &self,
        tensors: [&Tensor; N],
        bytes: u64,
        record: impl FnOnce([GpuRange<'_>; N], GpuRange<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut ranges = Vec::with_capacity(N);
        for t in tensors {
            match t.gpu_range() {
                Some(r) => ranges.push(r),
                None => return Ok(()),
            }
        }
        let Ok(ranges) = <[GpuRange<'_>; N]>::try_from(ranges) else {
            return Ok(());
        };
        let scratch = self.dev.ctx.uniform_scratch.lock();
        let scratch = scratch.unwrap_or_else(|e| e.into_inner());
        debug_assert!(
            bytes <= UNIFORM_SCRATCH_BYTES,
            "windows fit the scratch buffer"
        );
        let windows = GpuRange {
            buffer: &scratch,
            offset: 0,
            size: bytes,
        };
        record(ranges, windows)
    }

    /// `out = act(op(a) · op(b) + bias)` with the transposed operands first copied row-major
    /// (`materialize`), then on the vec4 kernels (tuned in their own right): a copy of an
    /// operand costs one pass over it, the scalar kernels' strided loads one per output tile.
    fn matmul_untransposed(
        &self,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        d: MatmulDims,
        act: Activation,
    ) -> Result<()> {
        let copy = |t: &Tensor, rows: usize, cols: usize| -> Result<Tensor> {
            // The stored [cols, rows] read as its transpose [rows, cols].
            let row_major = self.scratch(&[rows, cols], t)?;
            let p = MatmulParams {
                k: u(rows),
                n: u(cols),
                b_rs: 1,
                b_cs: u(rows),
                ..MatmulParams::zeroed()
            };
            self.launch(MATERIALIZE, &p, &[t, &row_major], grid_1d(rows * cols, 256))?;
            Ok(row_major)
        };
        let a = if d.trans_a {
            copy(a, d.m, d.k)?
        } else {
            a.clone()
        };
        let b = if d.trans_b {
            copy(b, d.k, d.n)?
        } else {
            b.clone()
        };
        let plain = MatmulDims {
            trans_a: false,
            trans_b: false,
            ..d
        };
        self.matmul(&a, &b, bias, out, plain, act)
    }

    /// `out = act(op(a) · op(b) + bias)` as `splits` partial products over slices of k, then one
    /// reduction that adds them with the bias and applies the activation; on the vec4 kernels
    /// where [`vec4_product`] allows, else the scalar ones.
    fn matmul_split_k(
        &self,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        d: MatmulDims,
        p: MatmulParams,
    ) -> Result<()> {
        let vec4 = vec4_product(d);
        let bias_or_out = bias.unwrap_or(out);
        // Split k only when the output has few tiles, so its layers fit in z (never folded).
        let tiles = tile_grid(d.n.div_ceil(64), d.m.div_ceil(64));
        let Some((slice, splits)) = splitk_slices(d) else {
            // Only offered where k splits; a forced pick elsewhere gets the plain tiles.
            return if vec4 {
                self.launch(MATMUL_V4, &p, &[bias_or_out, b, out, a], tiles)
            } else {
                self.launch(MATMUL, &p, &[a, b, bias_or_out, out], tiles)
            };
        };
        // Float32 partials whatever the operands (the float16 twins keep `part` float32).
        let partials = Tensor::uninit(&[splits, d.m, d.n], DType::F32, out.device_handle())?;
        let split = MatmulParams {
            k_slice: u(slice),
            ..p
        };
        let layers = [tiles[0], tiles[1], u(splits)];
        let reduce = MatmulParams { k: u(splits), ..p };
        if vec4 {
            // Bindings 5, 7, 10: b, a, the partials (no bias); then 3, 6, 10: bias, out, the
            // partials.
            self.launch(MATMUL_V4_SPLITK, &split, &[b, a, &partials], layers)?;
            let grid = grid_1d(d.m * d.n / 4, 256);
            self.launch(
                SPLITK_REDUCE_V4,
                &reduce,
                &[bias_or_out, out, &partials],
                grid,
            )
        } else {
            // Bindings 1, 2, 9: a, b, the partials; then 3, 4, 9: bias, out, the partials.
            self.launch(MATMUL_SPLITK, &split, &[a, b, &partials], layers)?;
            let grid = grid_1d(d.m * d.n, 256);
            self.launch(SPLITK_REDUCE, &reduce, &[bias_or_out, out, &partials], grid)
        }
    }
}
