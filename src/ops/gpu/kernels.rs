//! [`Kernels`] on a GPU: each method packs its params, fetches the cached pipeline and records
//! one dispatch (or a few) into the adapter's pending command stream. Nothing waits here.

use bytemuck::{Pod, Zeroable};

use crate::device::logical::{GpuDevice, GpuRange};
use crate::error::Result;
use crate::ops::gpu::tune::{bucket, Choice};
use crate::ops::gpu::{grid_1d, row_chunk, Kernel, ShaderFamily};
use crate::ops::spec::{Activation, BinaryOp};
use crate::ops::{Kernels, MatmulDims};
use crate::tensor::{DType, Tensor};

pub(crate) const BINARY: Kernel = Kernel::new(ShaderFamily::Elementwise, "binary");
pub(crate) const SCALE: Kernel = Kernel::new(ShaderFamily::Elementwise, "scale");
pub(crate) const ACTIVATION: Kernel = Kernel::new(ShaderFamily::Elementwise, "activation");
pub(crate) const UNSCALE_FLAG: Kernel = Kernel::new(ShaderFamily::Elementwise, "unscale_flag");
pub(crate) const TO_F16: Kernel = Kernel::new(ShaderFamily::Cast, "to_f16");
pub(crate) const TO_F32: Kernel = Kernel::new(ShaderFamily::Cast, "to_f32");
pub(crate) const ACTIVATION_BACKWARD: Kernel =
    Kernel::new(ShaderFamily::Elementwise, "activation_backward");
pub(crate) const ACTIVATION_BACKWARD_V4: Kernel =
    Kernel::new(ShaderFamily::Elementwise, "activation_backward_v4");
pub(crate) const MATMUL: Kernel = Kernel::new(ShaderFamily::Matmul, "matmul");
pub(crate) const MATMUL_V4: Kernel = Kernel::new(ShaderFamily::Matmul, "matmul_v4");
pub(crate) const MATMUL_TALL: Kernel = Kernel::new(ShaderFamily::Matmul, "matmul_tall");
pub(crate) const MATMUL_16X8: Kernel = Kernel::new(ShaderFamily::Matmul, "matmul_16x8");
pub(crate) const MATMUL_16X4: Kernel = Kernel::new(ShaderFamily::Matmul, "matmul_16x4");
pub(crate) const MATMUL_SMEM_V4: Kernel = Kernel::new(ShaderFamily::Matmul, "matmul_smem_v4");
pub(crate) const MATMUL_SMEM128_V4: Kernel = Kernel::new(ShaderFamily::Matmul, "matmul_smem128_v4");
pub(crate) const MATMUL_V4_SPLITK: Kernel = Kernel::new(ShaderFamily::Matmul, "matmul_v4_splitk");
pub(crate) const MATMUL_SPLITK: Kernel = Kernel::new(ShaderFamily::Matmul, "matmul_splitk");
pub(crate) const MATMUL_UBO8: Kernel = Kernel::new(ShaderFamily::Matmul, "matmul_ubo8");
pub(crate) const PACK_B8: Kernel = Kernel::new(ShaderFamily::Matmul, "pack_b8");
pub(crate) const MATERIALIZE: Kernel = Kernel::new(ShaderFamily::Matmul, "materialize");
pub(crate) const SPLITK_REDUCE: Kernel = Kernel::new(ShaderFamily::Matmul, "splitk_reduce");
pub(crate) const SPLITK_REDUCE_V4: Kernel = Kernel::new(ShaderFamily::Matmul, "splitk_reduce_v4");
pub(crate) const SUM_ALL: Kernel = Kernel::new(ShaderFamily::Reduce, "sum_all");
pub(crate) const SUM_ROWS: Kernel = Kernel::new(ShaderFamily::Reduce, "sum_rows");
pub(crate) const SUM_ROWS_V4: Kernel = Kernel::new(ShaderFamily::Reduce, "sum_rows_v4");
pub(crate) const SUM_ROWS_WG: Kernel = Kernel::new(ShaderFamily::Reduce, "sum_rows_wg");
/// Only where the adapter has subgroups (never in an op's required kernels).
pub(crate) const SUM_ROWS_SG: Kernel = Kernel::new(ShaderFamily::ReduceSubgroup, "sum_rows_sg");
pub(crate) const ACT_GRAD_SUM_ROWS_V4: Kernel =
    Kernel::new(ShaderFamily::Reduce, "act_grad_sum_rows_v4");
pub(crate) const ARGMAX_ROWS: Kernel = Kernel::new(ShaderFamily::Reduce, "argmax_rows");
pub(crate) const ADD_INTO: Kernel = Kernel::new(ShaderFamily::Reduce, "add_into");

/// Rows of one `sum_rows` chunk: long enough to amortize the launch, short enough that the
/// chunks spread over the device.
const SUM_ROWS_CHUNK: usize = 256;

/// Elements one `sum_all` workgroup adds: 256 per invocation, far below the ~65,000 loop
/// iterations Mesa's software adapters allow.
const SUM_ALL_CHUNK: usize = 256 * 256;

/// Workgroups `sum_rows_wg` aims for per pass.
const WG_SUM_WORKGROUPS: usize = 512;

/// A `sum_rows_wg` pass that would leave at most this many rows for another pass adds them all
/// itself, if each invocation then walks at most [`WG_TAIL_WALK`] rows: a pass over 2-4 rows
/// costs a dispatch (~5 us on the H200, as much as one over thousands of rows), and many of the
/// column sums in a training step ended with one (512 rows → 2 → 1).
const WG_TAIL_CHUNKS: usize = 4;
const WG_TAIL_WALK: usize = 32;

/// Invocations a partial-sum pass aims for on a GPU: enough to fill it, few enough that the
/// partials stay small.
pub(crate) const PARTIAL_TARGET: usize = 32_768;

/// The same on a software adapter, whose few cores are busy with a few dozen workgroups: more
/// chunks would only add partials to write and sum (the 1×1 kernel gradient at 7×7×128→128,
/// batch 128, on lavapipe: 31-35 ms with 32,768, 10-15 ms with 2,048; the depthwise kernel
/// gradients gain about a third).
pub(crate) const SOFTWARE_PARTIAL_TARGET: usize = 2_048;

/// The most positions one invocation of a partial-sum kernel loops over: Mesa's software
/// adapters silently cut a shader loop short after about 65,000 iterations.
pub(crate) const MAX_CHUNK: usize = 32_768;

/// How a reduction over `total` positions is cut for `units` independent sums, aiming for
/// `target` invocations: `(chunk, chunks)`, `chunk` positions per partial, at most
/// [`MAX_CHUNK`].
pub(crate) fn chunking(
    target: usize,
    units: usize,
    total: usize,
    min_chunk: usize,
) -> (usize, usize) {
    let max_chunks = total.div_ceil(min_chunk).max(1);
    let chunks = target
        .div_ceil(units.max(1))
        .clamp(1, max_chunks)
        .max(total.div_ceil(MAX_CHUNK));
    let chunk = total.div_ceil(chunks).max(1);
    (chunk, total.div_ceil(chunk).max(1))
}

/// Fewest rows one lane of `act_grad_sum_rows_v4` walks.
const MIN_LANE_ROWS: usize = 16;

/// One pass of a column sum: its kernel, rows per chunk, column lanes (`sum_rows_wg`) and
/// workgroups across the columns.
struct SumPass {
    kernel: Kernel,
    chunk: usize,
    lanes: usize,
    column_groups: usize,
}

/// The kernels of one GPU logical device.
pub(crate) struct GpuKernels<'a> {
    pub(crate) dev: &'a GpuDevice,
    pub(crate) name: &'a str,
}

impl<'a> GpuKernels<'a> {
    pub(crate) fn new(dev: &'a GpuDevice, name: &'a str) -> Self {
        GpuKernels { dev, name }
    }

    /// Records `kernel` over `tensors` (in the kernel's binding order) with `params`: its
    /// float16 twin when the tensors are float16. Empty tensors have no buffer: an op over them
    /// has nothing to do, so nothing is recorded.
    pub(crate) fn launch<P: Pod>(
        &self,
        kernel: Kernel,
        params: &P,
        tensors: &[&Tensor],
        workgroups: [u32; 3],
    ) -> Result<()> {
        let ranges: Option<Vec<GpuRange<'_>>> = tensors.iter().map(|t| t.gpu_range()).collect();
        let Some(ranges) = ranges else {
            return Ok(());
        };
        let half = tensors.iter().any(|t| t.dtype() == DType::F16);
        self.launch_ranges(kernel.with_half(half), params, &ranges, workgroups)
    }

    /// [`GpuKernels::launch`] over buffer ranges: tensors, or windows of them.
    pub(crate) fn launch_ranges<P: Pod>(
        &self,
        kernel: Kernel,
        params: &P,
        ranges: &[GpuRange<'_>],
        workgroups: [u32; 3],
    ) -> Result<()> {
        let pipeline = self.dev.ctx.pipeline(kernel, self.name)?;
        self.dev
            .ctx
            .dispatch(&pipeline, bytemuck::bytes_of(params), ranges, workgroups);
        Ok(())
    }

    /// A scratch tensor on this device (freed when dropped; the stream keeps the memory valid
    /// for commands already recorded, since later users of it are recorded after them).
    pub(crate) fn scratch(&self, shape: &[usize], like: &Tensor) -> Result<Tensor> {
        Tensor::uninit(shape, like.dtype(), like.device_handle())
    }
}

pub(super) fn u(x: usize) -> u32 {
    // Shapes on a GPU are bounded by max_storage_buffer_binding_size (< 4 GiB), so every
    // element count and index fits in u32.
    x as u32
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(super) struct CastParams {
    pub(super) n: u32,
    pub(super) base: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct ElementwiseParams {
    n: u32,
    m: u32,
    op: u32,
    act: u32,
    alpha: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct ReduceParams {
    n: u32,
    rows: u32,
    cols: u32,
    chunk: u32,
    alpha: f32,
    act: u32,
    /// `act_grad_sum_rows_v4`'s walk (see reduce.wgsl).
    step: u32,
    steps: u32,
}

impl GpuKernels<'_> {
    /// Elementwise `act` (forward) over `x` into `y`.
    pub(crate) fn activation_impl(&self, x: &Tensor, y: &Tensor, act: Activation) -> Result<()> {
        let n = x.len();
        let p = ElementwiseParams {
            n: u(n),
            m: 1,
            op: 0,
            act: act.code(),
            alpha: 0.0,
        };
        self.launch(ACTIVATION, &p, &[x, y], grid_1d(n, 256))
    }

    /// `dz = dy * act'(y)`.
    pub(crate) fn activation_backward_impl(
        &self,
        dy: &Tensor,
        y: &Tensor,
        dz: &Tensor,
        act: Activation,
    ) -> Result<()> {
        let n = y.len();
        let p = ElementwiseParams {
            n: u(n),
            m: u(n),
            op: 0,
            act: act.code(),
            alpha: 0.0,
        };
        if n.is_multiple_of(4) {
            return self.launch(
                ACTIVATION_BACKWARD_V4,
                &p,
                &[y, dy, dz],
                grid_1d(n.div_ceil(16), 256),
            );
        }
        self.launch(ACTIVATION_BACKWARD, &p, &[y, dy, dz], grid_1d(n, 256))
    }
}

impl GpuKernels<'_> {
    /// The invocations a partial-sum pass aims for on this adapter.
    pub(crate) fn partial_target(&self) -> usize {
        if self.dev.ctx.software_kernels {
            SOFTWARE_PARTIAL_TARGET
        } else {
            PARTIAL_TARGET
        }
    }

    /// How a lane of `chunk` positions out of `lanes` walks them (`maxpool_act_grad_sum_v4`,
    /// `act_grad_sum_rows_v4`): `(lane_stride, step)`, position `lane * lane_stride + k *
    /// step`. Interleaved on GPUs, so that neighbouring lanes read neighbouring positions; in
    /// runs on software adapters, so that one invocation's positions share a core's cache.
    pub(crate) fn lane_walk(&self, chunk: usize, lanes: usize) -> (u32, u32) {
        if self.dev.ctx.software_kernels {
            (u(chunk), 1)
        } else {
            (1, u(lanes))
        }
    }

    /// Runs `sums` into a float32 tensor when `out` is float16, then casts that into `out`:
    /// sums keep their partials in float32 (the bindings the float16 twins keep float32, see
    /// `ShaderFamily::kept_f32`) and round to float16 once, at the end.
    pub(crate) fn float32_sums(
        &self,
        out: &Tensor,
        sums: impl FnOnce(&Tensor) -> Result<()>,
    ) -> Result<()> {
        if out.dtype() != DType::F16 {
            return sums(out);
        }
        let wide = Tensor::uninit(out.shape(), DType::F32, out.device_handle())?;
        sums(&wide)?;
        self.cast(&wide, out)
    }

    /// `dz = act'(dy, y)` (`[rows, cols]`) and the bias gradient `db = Σ_rows dz`: fused, the
    /// column sums' first pass runs in the activation's kernel and `dz` is not read again; the
    /// tuner weighs that against the separate kernels (the tree of `sum_rows_wg` keeps a GPU
    /// busier on narrow sums).
    pub(crate) fn activation_bias_grad_impl(
        &self,
        dy: &Tensor,
        y: &Tensor,
        dz: &Tensor,
        db: &Tensor,
        (rows, cols): (usize, usize),
        act: Activation,
    ) -> Result<()> {
        self.float32_sums(db, |db| {
            let separate = || -> Result<()> {
                self.activation_backward_impl(dy, y, dz, act)?;
                self.sum_rows(dz, rows, cols, db)
            };
            if rows == 0 || !cols.is_multiple_of(4) {
                return separate();
            }
            let class = format!("{}x{}", bucket(rows), bucket(cols));
            let heuristic = if self.dev.ctx.software_kernels {
                "fused"
            } else {
                "separate"
            };
            let choice = Choice::new("act_bias_grad", class, &["fused", "separate"], heuristic);
            self.tuned(choice, &mut |candidate| {
                if candidate == "separate" {
                    return separate();
                }
                let target = self.partial_target();
                let (per_lane, lanes) = chunking(target, cols / 4, rows, MIN_LANE_ROWS);
                let (lane_stride, step) = self.lane_walk(per_lane, lanes);
                let partials = if lanes == 1 {
                    db.clone()
                } else {
                    self.scratch(&[lanes, cols], db)?
                };
                let p = ReduceParams {
                    n: lane_stride,
                    rows: u(rows),
                    cols: u(cols),
                    chunk: u(lanes),
                    alpha: 0.0,
                    act: act.code(),
                    step,
                    steps: u(per_lane),
                };
                // Bindings 4, 5, 6, 7: y, the partial sums, dy, dz.
                let grid = grid_1d(lanes * cols / 4, 64);
                self.launch(ACT_GRAD_SUM_ROWS_V4, &p, &[y, &partials, dy, dz], grid)?;
                if lanes > 1 {
                    self.sum_rows(&partials, lanes, cols, db)?;
                }
                Ok(())
            })
        })
    }
}

impl Kernels for GpuKernels<'_> {
    fn cast(&self, x: &Tensor, out: &Tensor) -> Result<()> {
        let n = x.len();
        let kernel = match (x.dtype(), out.dtype()) {
            (DType::F32, DType::F16) => TO_F16,
            (DType::F16, DType::F32) => TO_F32,
            // The front-end answers a cast to the same type without a kernel.
            _ => return self.scale(x, 1.0, out),
        };
        // Bindings 1 (f32), 2 (f16 pairs): the float32 side first either way.
        let (f32_side, f16_side) = if kernel == TO_F16 { (x, out) } else { (out, x) };
        let p = CastParams { n: u(n), base: 0 };
        self.launch(
            kernel,
            &p,
            &[f32_side, f16_side],
            grid_1d(n.div_ceil(2), 256),
        )
    }

    fn cast_many(&self, xs: &[Tensor], outs: &[Tensor]) -> Result<()> {
        if self.cast_to_f16_at_once(xs, outs)? {
            return Ok(());
        }
        xs.iter()
            .zip(outs)
            .try_for_each(|(x, out)| self.cast(x, out))
    }

    fn unscale_flag(&self, x: &Tensor, alpha: f32, out: &Tensor, flag: &Tensor) -> Result<()> {
        let n = x.len();
        let p = ElementwiseParams {
            n: u(n),
            m: 1,
            op: 0,
            act: 0,
            alpha,
        };
        // Bindings 1, 2, 3: a, b (the flag), out.
        self.launch(UNSCALE_FLAG, &p, &[x, flag, out], grid_1d(n, 256))
    }

    fn binary(&self, a: &Tensor, b: &Tensor, out: &Tensor, op: BinaryOp) -> Result<()> {
        let n = a.len();
        let p = ElementwiseParams {
            n: u(n),
            m: u(b.len().max(1)),
            op: op.code(),
            act: 0,
            alpha: 0.0,
        };
        self.launch(BINARY, &p, &[a, b, out], grid_1d(n, 256))
    }

    fn add_n(&self, inputs: &[&Tensor], out: &Tensor) -> Result<()> {
        let n = out.len();
        let (first, rest) = inputs.split_first().expect("add_n front-end passes inputs");
        self.scale(first, 1.0, out)?;
        for x in rest {
            let p = ReduceParams {
                n: u(n),
                rows: 0,
                cols: 0,
                chunk: 0,
                alpha: 0.0,
                act: 0,
                step: 0,
                steps: 0,
            };
            self.launch(ADD_INTO, &p, &[x, out], grid_1d(n, 256))?;
        }
        Ok(())
    }

    fn scale(&self, x: &Tensor, alpha: f32, out: &Tensor) -> Result<()> {
        let n = x.len();
        let p = ElementwiseParams {
            n: u(n),
            m: 1,
            op: 0,
            act: 0,
            alpha,
        };
        self.launch(SCALE, &p, &[x, out], grid_1d(n, 256))
    }

    fn matmul(
        &self,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        d: MatmulDims,
        act: Activation,
    ) -> Result<()> {
        self.matmul_impl(a, b, bias, out, d, act)
    }

    fn sum_all(&self, x: &Tensor, alpha: f32, out: &Tensor) -> Result<()> {
        if x.is_empty() {
            return self.scale_fill_zero(out);
        }
        // Passes of partial sums until one chunk is left; alpha on the last.
        let mut current = x.clone();
        loop {
            let n = current.len();
            let chunks = n.div_ceil(SUM_ALL_CHUNK);
            let last = chunks == 1;
            let target = if last {
                out.clone()
            } else {
                self.scratch(&[chunks], out)?
            };
            let p = ReduceParams {
                n: u(n),
                rows: 0,
                cols: 0,
                chunk: u(SUM_ALL_CHUNK),
                alpha: if last { alpha } else { 1.0 },
                act: 0,
                step: 0,
                steps: 0,
            };
            let grid = grid_1d(chunks * 256, 256);
            self.launch(SUM_ALL, &p, &[&current, &target], grid)?;
            if last {
                return Ok(());
            }
            current = target;
        }
    }

    fn sum_rows(&self, x: &Tensor, rows: usize, cols: usize, out: &Tensor) -> Result<()> {
        self.float32_sums(out, |out| self.sum_rows_f32_out(x, rows, cols, out))
    }

    fn argmax_rows(&self, x: &Tensor, rows: usize, cols: usize, out: &Tensor) -> Result<()> {
        let p = ReduceParams {
            n: 0,
            rows: u(rows),
            cols: u(cols),
            chunk: 0,
            alpha: 0.0,
            act: 0,
            step: 0,
            steps: 0,
        };
        self.launch(ARGMAX_ROWS, &p, &[x, out], grid_1d(rows, 64))
    }
}

impl GpuKernels<'_> {
    /// [`Kernels::sum_rows`] into a float32 `out` (a float16 `x` is read by the twins).
    fn sum_rows_f32_out(&self, x: &Tensor, rows: usize, cols: usize, out: &Tensor) -> Result<()> {
        if rows == 0 {
            return self.scale_fill_zero(out);
        }
        if cols.is_multiple_of(4) {
            let class = format!("{}x{}", bucket(rows), bucket(cols));
            // (The device is opened with every subgroup-capable adapter's SUBGROUP feature.)
            let subgroups = self
                .dev
                .ctx
                .adapter
                .features
                .contains(wgpu::Features::SUBGROUP);
            let candidates: &[&str] = if subgroups {
                &["rows_v4", "rows_wg", "rows_sg"]
            } else {
                &["rows_v4", "rows_wg"]
            };
            return self.tuned(
                Choice::new("sum_rows", class, candidates, "rows_v4"),
                &mut |c| match c {
                    "rows_wg" => self.sum_rows_wg(x, rows, cols, out),
                    "rows_sg" => self.sum_rows_sg(x, rows, cols, out),
                    _ => self.sum_rows_chunked(x, rows, cols, out),
                },
            );
        }
        self.sum_rows_chunked(x, rows, cols, out)
    }

    /// Column sums in chunks of [`SUM_ROWS_CHUNK`] rows, one invocation per (vec4) column.
    fn sum_rows_chunked(&self, x: &Tensor, rows: usize, cols: usize, out: &Tensor) -> Result<()> {
        let (kernel, column_groups) = if cols.is_multiple_of(4) {
            (SUM_ROWS_V4, cols.div_ceil(256))
        } else {
            (SUM_ROWS, cols.div_ceil(64))
        };
        self.sum_rows_in_passes(x, rows, cols, out, |_| SumPass {
            kernel,
            chunk: SUM_ROWS_CHUNK,
            lanes: 0,
            column_groups,
        })
    }

    /// Column sums (cols a multiple of 4) by whole workgroups: `sum_rows_wg` over chunks sized
    /// so that a few hundred workgroups share the rows.
    fn sum_rows_wg(&self, x: &Tensor, rows: usize, cols: usize, out: &Tensor) -> Result<()> {
        let cols4 = cols / 4;
        let lanes = cols4.next_power_of_two().min(64);
        let column_groups = cols4.div_ceil(lanes);
        let row_lanes = 256 / lanes;
        self.sum_rows_in_passes(x, rows, cols, out, |rows| {
            // Each invocation adds at least 8 rows; the chunks fill ~512 workgroups.
            let wanted = WG_SUM_WORKGROUPS.div_ceil(column_groups);
            let chunk = rows.div_ceil(wanted).max(row_lanes * 8);
            let tail = rows.div_ceil(chunk) <= WG_TAIL_CHUNKS && rows <= row_lanes * WG_TAIL_WALK;
            SumPass {
                kernel: SUM_ROWS_WG,
                chunk: if tail { rows } else { chunk },
                lanes,
                column_groups,
            }
        })
    }

    /// Column sums (cols a multiple of 4) by `sum_rows_sg`: a workgroup per vec4 column and
    /// chunk of rows, its lanes combined by subgroup operations.
    fn sum_rows_sg(&self, x: &Tensor, rows: usize, cols: usize, out: &Tensor) -> Result<()> {
        let cols4 = cols / 4;
        self.sum_rows_in_passes(x, rows, cols, out, |rows| {
            // Each invocation adds at least 8 rows; the chunks fill ~512 workgroups.
            let wanted = WG_SUM_WORKGROUPS.div_ceil(cols4);
            SumPass {
                kernel: SUM_ROWS_SG,
                chunk: rows.div_ceil(wanted).max(256 * 8),
                lanes: 0,
                column_groups: cols4,
            }
        })
    }

    /// Column sums of `x` as `[rows, cols]` by passes of partial sums: each pass (`plan(rows)`)
    /// sums chunks of rows into a `[chunks, cols]` scratch tensor, until one row is left.
    fn sum_rows_in_passes(
        &self,
        x: &Tensor,
        rows: usize,
        cols: usize,
        out: &Tensor,
        plan: impl Fn(usize) -> SumPass,
    ) -> Result<()> {
        let mut current = x.clone();
        let mut rows = rows;
        loop {
            let pass = plan(rows);
            let chunk = row_chunk(rows, pass.chunk);
            let chunks = rows.div_ceil(chunk);
            let target = if chunks == 1 {
                out.clone()
            } else {
                self.scratch(&[chunks, cols], out)?
            };
            let p = ReduceParams {
                n: u(pass.lanes),
                rows: u(rows),
                cols: u(cols),
                chunk: u(chunk),
                alpha: 0.0,
                act: 0,
                step: 0,
                steps: 0,
            };
            let grid = [u(pass.column_groups), u(chunks), 1];
            self.launch(pass.kernel, &p, &[&current, &target], grid)?;
            if chunks == 1 {
                return Ok(());
            }
            current = target;
            rows = chunks;
        }
    }

    /// Where an op's workgroup-memory candidates `tiles` are timed: with the others (added to
    /// `candidates`) on a GPU; on a software adapter, whose workgroup memory is loaded lane by
    /// lane like storage, only under `ANYGPU_AUTOTUNE=full` (returned, for
    /// [`Choice::full_only`]), since there they would only lengthen the cold start.
    pub(crate) fn workgroup_tiles(
        &self,
        candidates: &mut Vec<&'static str>,
        tiles: &'static [&'static str],
    ) -> &'static [&'static str] {
        if self.dev.ctx.software_kernels {
            tiles
        } else {
            candidates.extend(tiles);
            &[]
        }
    }

    /// Runs one of `candidates` for `op` on this adapter, picked by its tuner.
    pub(crate) fn tuned(
        &self,
        choice: Choice<'_>,
        run: &mut dyn FnMut(&str) -> Result<()>,
    ) -> Result<()> {
        let ctx = &self.dev.ctx;
        let mut choice = choice;
        if crate::ops::computing_in_half() {
            choice.class.push_str(" f16");
        }
        let wait = || {
            let _cause = crate::profiler::WaitCause::enter("autotune: timing a candidate");
            ctx.pipelines.wait_for_compiles();
            ctx.wait_idle()
        };
        ctx.tuner.run(&choice, &wait, run)
    }

    fn scale_fill_zero(&self, out: &Tensor) -> Result<()> {
        if let Some(range) = out.gpu_range() {
            self.dev.ctx.clear(range, range.size);
        }
        Ok(())
    }
}
