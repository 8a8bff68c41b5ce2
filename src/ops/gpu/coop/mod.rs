//! Matrix products and k×k convolutions on cooperative matrices (`matmul_coop.wgsl`): the
//! tensor cores, through wgpu's experimental `EXPERIMENTAL_COOPERATIVE_MATRIX`, for float16
//! work (float32 accumulation) under the mixed-precision policy.
//!
//! Three gates keep them away from where they would be wrong:
//! * the device is opened with the feature only where the adapter reports the configuration the
//!   kernels are written for (16×16×16, float16 A and B, float32 C; see `CoopSupport::wanted` in
//!   `shader::coop`) and where it runs them as they assume (float16, subgroups of exactly 32
//!   invocations);
//! * before the tuner may time them, each candidate is checked once per adapter against the f64
//!   oracle ([`check`]: products on ragged shapes and every transpose, convolutions with every
//!   padding, stride and dilation); a candidate that fails is logged as an error and never
//!   offered again in the process for that work;
//! * `ANYGPU_AUTOTUNE_FORCE` skips that check, so that `tests/coop_matrix.rs` (which the GPU
//!   check runs before it times anything) sees each kernel's own output.
//!
//! Elsewhere nothing changes: the candidates are simply not offered.
//!
//! This module offers the candidates and runs the products; [`gather`] runs the convolutions
//! (A gathered from the image), [`check`] holds the self-checks, and `device` what a
//! [`LogicalDevice`] reports of its tensor cores. Without tensor cores, the `emulated` tests run
//! the kernels' text with the cooperative operations done by hand.

mod check;
mod device;
#[cfg(test)]
mod emulated;
mod gather;
#[cfg(test)]
mod tests;

use gather::ConvMode;
pub(crate) use gather::Gather;

use bytemuck::{Pod, Zeroable};

use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::ops::gpu::grid_1d;
use crate::ops::gpu::kernels::{GpuKernels, SPLITK_REDUCE};
use crate::ops::gpu::MAX_GROUPS_PER_DIM;
use crate::ops::spec::{Activation, ConvGeometry};
use crate::ops::Kernels;
use crate::ops::MatmulDims;
pub(crate) use crate::shader::coop::is_candidate;
use crate::shader::coop::{Candidate, CoopSupport, CANDIDATES, SPLIT_CANDIDATE, SPLIT_KERNEL};
use crate::tensor::{DType, Tensor};

/// Whether `c` takes a product of `d`: the vec4 kernels where A and B are stored untransposed
/// with k and n multiples of 4 (the vec4 products of `matmul.rs`), the scalar ones elsewhere
/// (they would take those too, slower).
fn applies(c: &Candidate, d: MatmulDims) -> bool {
    let v4 = !d.trans_a && !d.trans_b && d.k.is_multiple_of(4) && d.n.is_multiple_of(4);
    c.split || c.v4 == v4
}

/// The most 64×64 output tiles a product may have for the split-k candidate to be offered,
/// and the least k: it pays where the tiles alone leave a GPU's cores idle.
const SPLIT_MAX_TILES: usize = 32;
const SPLIT_MIN_K: usize = 512;

/// Whether splitting k pays for a product of `d`: few output tiles and a long k.
fn split_pays(d: MatmulDims) -> bool {
    d.m.div_ceil(64) * d.n.div_ceil(64) <= SPLIT_MAX_TILES && d.k >= SPLIT_MIN_K
}

/// Workgroups a split product aims for (a few per streaming multiprocessor of an H200).
const SPLIT_WORKGROUPS: usize = 512;

/// `(k_slice, splits)` of a split-k product of `d`: slices of whole 32-deep steps of k, about
/// [`SPLIT_WORKGROUPS`] workgroups in all.
fn split_slices(d: MatmulDims) -> (usize, usize) {
    let tiles = d.m.div_ceil(64) * d.n.div_ceil(64);
    let steps = d.k.div_ceil(32).max(1);
    let wanted = SPLIT_WORKGROUPS.div_ceil(tiles.max(1)).clamp(1, steps);
    let k_slice = 32 * steps.div_ceil(wanted);
    (k_slice, d.k.div_ceil(k_slice).max(1))
}

/// Mirror of `Params` in matmul_coop.wgsl (matmul.wgsl's).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct CoopParams {
    m: u32,
    k: u32,
    n: u32,
    has_bias: u32,
    a_rs: u32,
    a_cs: u32,
    b_rs: u32,
    b_cs: u32,
    act: u32,
    /// `matmul_coop_64x64_splitk`'s slice of k.
    k_slice: u32,
    _unused: [u32; 2],
    /// The convolution whose im2col matrix A is ([`ConvMode`]), and its geometry.
    conv: u32,
    h: u32,
    w: u32,
    ci: u32,
    kw: u32,
    oh: u32,
    ow: u32,
    sh: u32,
    sw: u32,
    dh: u32,
    dw: u32,
    pt: u32,
    pl: u32,
    uh: u32,
    uw: u32,
    _pad: u32,
}

/// What a candidate is checked for and offered for: each has its own self-check and verdicts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Work {
    /// Matrix products (dense layers, 1×1 convolutions).
    Products,
    /// k×k convolutions, A gathered from the image.
    Convolutions,
}

impl Work {
    fn name(self) -> &'static str {
        match self {
            Work::Products => "products",
            Work::Convolutions => "convolutions",
        }
    }
}

impl GpuKernels<'_> {
    /// The cooperative-matrix candidates for `out = act(op(a) · op(b) + bias)` of `d`: float16
    /// tensors on a device where the kernels run, those that take `d`, each once its
    /// self-check passed (under `ANYGPU_AUTOTUNE_FORCE`, without the check).
    pub(crate) fn coop_candidates(
        &self,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        d: MatmulDims,
    ) -> Result<Vec<&'static str>> {
        let half = [Some(a), Some(b), bias, Some(out)]
            .into_iter()
            .flatten()
            .all(|t| t.dtype() == DType::F16);
        if !half {
            return Ok(Vec::new());
        }
        self.coop_offered(&self.dev.ctx.coop, d, out.device_handle())
    }

    /// The candidates `support` lets the tuner offer for a float16 product of `d` on `device`.
    fn coop_offered(
        &self,
        support: &CoopSupport,
        d: MatmulDims,
        device: &LogicalDevice,
    ) -> Result<Vec<&'static str>> {
        // A 32-column tile only where the product is that narrow: wider ones have the others;
        // split k only for few tiles and a long k.
        self.coop_passing(support, device, Work::Products, &|c| {
            applies(c, d) && (c.cols == 64 || d.n <= c.cols) && (!c.split || split_pays(d))
        })
    }

    /// The candidates `support` lets the tuner offer for `work` on `device` of those `takes`
    /// accepts.
    fn coop_passing(
        &self,
        support: &CoopSupport,
        device: &LogicalDevice,
        work: Work,
        takes: &dyn Fn(&Candidate) -> bool,
    ) -> Result<Vec<&'static str>> {
        if !support.usable() {
            return Ok(Vec::new());
        }
        let takes = CANDIDATES.iter().filter(|c| takes(c));
        if self.dev.ctx.tuner.forced() {
            return Ok(takes.map(|c| c.name).collect());
        }
        if self.dev.ctx.tuner.off() {
            // Never picked: no self-check (its time, its risk) for them.
            return Ok(Vec::new());
        }
        let verdicts = self.coop_verdicts(support, device, work)?;
        Ok(takes
            .filter(|c| verdicts.iter().any(|(n, v)| *n == c.name && v.is_ok()))
            .map(|c| c.name)
            .collect())
    }
}

impl GpuKernels<'_> {
    /// `out = act(op(a) · op(b) + bias)` by candidate `name` (float16 tensors; k > 0).
    #[allow(clippy::too_many_arguments)] // matmul_impl's operands, dims and activation
    pub(crate) fn matmul_coop(
        &self,
        name: &str,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        d: MatmulDims,
        act: Activation,
    ) -> Result<()> {
        // Offered only where it applies (the split kernel only where its row tiles fit in one
        // grid dimension: z holds the slices); anything else is refused rather than run by
        // another kernel, which might be one whose self-check failed.
        let split_fits = d.m.div_ceil(64) <= MAX_GROUPS_PER_DIM;
        let Some(&c) = CANDIDATES
            .iter()
            .find(|c| c.name == name && applies(c, d) && (!c.split || split_fits))
        else {
            return Err(Error::Unsupported {
                op: "MatMul",
                device: self.name.to_string(),
                missing: format!(
                    "the tensor-core kernel {name} for a {}x{}x{} product (trans_a {}, trans_b {})",
                    d.m, d.k, d.n, d.trans_a, d.trans_b
                ),
            });
        };
        if c.split {
            let (k_slice, _) = split_slices(d);
            return self.coop_split_product(a, b, bias, out, d, act, k_slice);
        }
        let bias_or_out = bias.unwrap_or(out);
        let (p, grid) = launch_shape(d, bias.is_some(), act, (c.rows, c.cols));
        if c.v4 {
            // Bindings 3, 4, 5, 6: bias, out, then a and b as vec4.
            self.launch(c.kernel, &p, &[bias_or_out, out, a, b], grid)
        } else {
            self.launch(c.kernel, &p, &[a, b, bias_or_out, out], grid)
        }
    }
}

impl GpuKernels<'_> {
    /// `out = act(op(a) · op(b) + bias)` on the tensor cores, split over k in slices of
    /// `k_slice` (whole steps of 32): the layers' float32 sums, then matmul.wgsl's reduction
    /// with the bias and the activation (its float16 twin rounds once, at the end).
    #[allow(clippy::too_many_arguments)] // matmul_coop's, and the slice
    fn coop_split_product(
        &self,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        d: MatmulDims,
        act: Activation,
        k_slice: usize,
    ) -> Result<()> {
        let (partials, splits) = self.coop_split(a, b, d, k_slice, None)?;
        let (mut r, _) = launch_shape(d, bias.is_some(), act, (64, 64));
        r.k = splits as u32;
        let grid = grid_1d(d.m * d.n, 256);
        self.launch(
            SPLITK_REDUCE,
            &r,
            &[bias.unwrap_or(out), out, &partials],
            grid,
        )
    }

    /// The float32 partial sums `[splits, m, n]` of `op(a) · op(b)` by
    /// `matmul_coop_64x64_splitk`, one layer per slice of k (float16 tensors; k > 0); with
    /// `gather`, A is the transposed im2col matrix of that convolution of the image `a`.
    fn coop_split(
        &self,
        a: &Tensor,
        b: &Tensor,
        d: MatmulDims,
        k_slice: usize,
        gather: Option<&ConvGeometry>,
    ) -> Result<(Tensor, usize)> {
        let splits = d.k.div_ceil(k_slice).max(1);
        let partials = Tensor::uninit(&[splits, d.m, d.n], DType::F32, a.device_handle())?;
        let (mut p, _) = launch_shape(d, false, Activation::Linear, (64, 64));
        if let Some(g) = gather {
            p = p.gathering(ConvMode::KernelGrad, &Gather::conv(*g));
        }
        p.k_slice = k_slice as u32;
        // No row tile folds into z, which holds the slices: the callers check that the row
        // tiles fit in y.
        let grid = [
            d.n.div_ceil(64) as u32,
            d.m.div_ceil(64) as u32,
            splits as u32,
        ];
        self.launch(SPLIT_KERNEL, &p, &[a, b, &partials], grid)?;
        Ok((partials, splits))
    }

    /// Whether the split-k candidate is offered for `op(a) · op(b)` of `d` (float16 operands):
    /// tensor cores, its self-check passed, few tiles and a long k.
    pub(crate) fn coop_split_offered(
        &self,
        (a, b): (&Tensor, &Tensor),
        d: MatmulDims,
    ) -> Result<bool> {
        let half = a.dtype() == DType::F16 && b.dtype() == DType::F16;
        if !half || d.k == 0 {
            return Ok(false);
        }
        let offered = self.coop_offered(&self.dev.ctx.coop, d, a.device_handle())?;
        Ok(offered.contains(&SPLIT_CANDIDATE))
    }

    /// `out = op(a) · op(b)` on the tensor cores, split over k, the layers added up by a column
    /// sum into `out` of either float dtype (a 1×1 convolution's float32 kernel gradient:
    /// `xᵀ · dz` over the pixels). For where [`coop_split_offered`](Self::coop_split_offered).
    pub(crate) fn coop_split_sum(
        &self,
        (a, b): (&Tensor, &Tensor),
        out: &Tensor,
        d: MatmulDims,
    ) -> Result<()> {
        let (k_slice, _) = split_slices(d);
        let (partials, splits) = self.coop_split(a, b, d, k_slice, None)?;
        self.sum_rows(&partials, splits, d.m * d.n, out)
    }
}

/// The params and grid of a product of `d` on a kernel of `rows` × `cols` outputs per
/// workgroup.
fn launch_shape(
    d: MatmulDims,
    has_bias: bool,
    act: Activation,
    (rows, cols): (usize, usize),
) -> (CoopParams, [u32; 3]) {
    let (a_rs, a_cs) = if d.trans_a { (1, d.m) } else { (d.k, 1) };
    let (b_rs, b_cs) = if d.trans_b { (1, d.k) } else { (d.n, 1) };
    // Shapes on a GPU fit in u32 (bounded by the binding size).
    let u = |x: usize| x as u32;
    let p = CoopParams {
        m: u(d.m),
        k: u(d.k),
        n: u(d.n),
        has_bias: u32::from(has_bias),
        a_rs: u(a_rs),
        a_cs: u(a_cs),
        b_rs: u(b_rs),
        b_cs: u(b_cs),
        act: act.code(),
        ..CoopParams::zeroed()
    };
    // Row tiles past one grid dimension fold into z (the shader's row_tile).
    let row_tiles = d.m.div_ceil(rows);
    let y = row_tiles.clamp(1, MAX_GROUPS_PER_DIM);
    let grid = [u(d.n.div_ceil(cols)), u(y), u(row_tiles.div_ceil(y).max(1))];
    (p, grid)
}
