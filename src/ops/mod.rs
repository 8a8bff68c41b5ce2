//! Ops: front-ends that check shapes, place the op, move inputs to its device and call the
//! device's kernels.
//!
//! Every device implements the crate's `Kernels` trait (and `NnKernels` for the CNN ops):
//! `HostKernels` on the native CPU kernels, `GpuKernels` on the WGSL of `shaders/`. A new op
//! does not compile until both sides have it. Kernels receive tensors already on their device
//! and an output allocated there; only placement decides where that is.

pub(crate) mod basic;
pub(crate) mod cpu;
pub(crate) mod gpu;
/// The autotune cache parser, public for the fuzz targets only.
#[doc(hidden)]
pub use crate::shader::tune::parse_cache as parse_autotune_cache;
pub(crate) mod host;
pub mod loss;
pub(crate) mod nn;
pub(crate) mod nn_kernels;
pub(crate) mod norm;
#[doc(hidden)]
pub mod reference;
pub mod spec;

pub use basic::cast_all;
pub use nn::*;
pub use norm::{
    batch_normalization_backward, batch_normalization_inference, batch_normalization_training,
    dropout, dropout_backward, BatchNormVariables,
};
pub(crate) use norm::{
    batch_normalization_relu_backward, batch_normalization_relu_inference,
    batch_normalization_relu_mean_backward, batch_normalization_relu_mean_inference,
    batch_normalization_relu_mean_training, batch_normalization_relu_training,
    batch_normalization_statistics_training,
};

use crate::device::logical::Backend;
use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::placement::{self, OpInfo};
use crate::profiler::{self, Timing};
use crate::tensor::{DType, Tensor};
use spec::{Activation, BinaryOp};

/// A matrix product's dimensions: `op(A)` is `[m, k]`, `op(B)` is `[k, n]`, where `op`
/// transposes a stored `[k, m]` (`[n, k]`) operand when the flag is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MatmulDims {
    pub(crate) m: usize,
    pub(crate) k: usize,
    pub(crate) n: usize,
    pub(crate) trans_a: bool,
    pub(crate) trans_b: bool,
}

/// The general-purpose kernels every device has.
///
/// An output never aliases an input (the CPU side locks inputs for reading and outputs for
/// writing); only the optimizer updates of [`NnKernels`] write their own state in place.
pub(crate) trait Kernels {
    /// `out = a (op) b`, `b` repeating with period `b.len()`.
    fn binary(&self, a: &Tensor, b: &Tensor, out: &Tensor, op: BinaryOp) -> Result<()>;
    /// `out = Σ inputs` (at least one input).
    fn add_n(&self, inputs: &[&Tensor], out: &Tensor) -> Result<()>;
    /// `out = alpha * x`.
    fn scale(&self, x: &Tensor, alpha: f32, out: &Tensor) -> Result<()>;
    /// `out = act(op(a) · op(b) + bias)`.
    fn matmul(
        &self,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        dims: MatmulDims,
        act: Activation,
    ) -> Result<()>;
    /// `out[0] = alpha * Σ x`.
    fn sum_all(&self, x: &Tensor, alpha: f32, out: &Tensor) -> Result<()>;
    /// Column sums of `x` as `[rows, cols]`: `out[c] = Σ_r x[r, c]`.
    fn sum_rows(&self, x: &Tensor, rows: usize, cols: usize, out: &Tensor) -> Result<()>;
    /// Index of the first maximum of each row of `x` as `[rows, cols]`, into an i32 `out`.
    fn argmax_rows(&self, x: &Tensor, rows: usize, cols: usize, out: &Tensor) -> Result<()>;
    /// `out = x` converted to `out`'s float type (float32 ↔ float16; overflow gives ±inf).
    fn cast(&self, x: &Tensor, out: &Tensor) -> Result<()>;
    /// [`Kernels::cast`] of each `xs[i]` into `outs[i]`: in turn, unless the device casts many
    /// tensors at once (a GPU: float32 to float16 in one dispatch).
    fn cast_many(&self, xs: &[Tensor], outs: &[Tensor]) -> Result<()> {
        xs.iter()
            .zip(outs)
            .try_for_each(|(x, out)| self.cast(x, out))
    }
    /// `out = alpha * x` (float32), and `flag[0] = 1` when some element of `x` is infinite or
    /// NaN (left as it was otherwise): loss scaling's unscale and check in one pass.
    fn unscale_flag(&self, x: &Tensor, alpha: f32, out: &Tensor, flag: &Tensor) -> Result<()>;
}

/// Runs `f` with the kernels of `device`.
pub(crate) fn with_kernels<R: Send>(
    device: &LogicalDevice,
    f: impl FnOnce(&dyn Kernels, &dyn NnKernels) -> Result<R> + Send,
) -> Result<R> {
    match &device.0.backend {
        Backend::Cpu(cpu) => cpu.run(|| f(&host::HostKernels, &host::HostKernels)),
        Backend::Gpu(g) => {
            let k = gpu::kernels::GpuKernels::new(g, device.full_name());
            f(&k, &k)
        }
        Backend::Unavailable(u) => Err(u.error(device.full_name())),
    }
}

thread_local! {
    /// Whether the op running on this thread has float16 inputs.
    static HALF: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the op running on this thread computes in float16: the tuner keeps its picks for
/// float16 kernels apart from the float32 ones' (they may differ).
pub(crate) fn computing_in_half() -> bool {
    HALF.with(std::cell::Cell::get)
}

/// Marks the ops run while it lives as float16 or not; restores the outer op's mark on drop.
struct HalfMark(bool);

impl HalfMark {
    fn enter(half: bool) -> HalfMark {
        HalfMark(HALF.with(|h| h.replace(half)))
    }
}

impl Drop for HalfMark {
    fn drop(&mut self) {
        HALF.with(|h| h.set(self.0));
    }
}

/// Places `op`, brings `inputs` to its device, and hands both to `f`.
pub(crate) fn run<R>(
    op: &OpInfo,
    inputs: &[&Tensor],
    f: impl FnOnce(&LogicalDevice, &[Tensor]) -> Result<R>,
) -> Result<R> {
    let device = placement::place(op, inputs.first().map(|t| t.device_handle()))?;
    // Float16 tensors only meet float16 kernels (the CPU's casts read them too): a float32
    // kernel would read their bytes as garbage.
    if op.name != "Cast" && !device.has_f16() {
        if let Some(t) = inputs.iter().find(|t| t.dtype() == DType::F16) {
            return Err(Error::Unsupported {
                op: op.name,
                device: device.full_name().to_string(),
                missing: format!(
                    "float16 kernels for its {} input (an adapter with shader-f16); cast it to \
                     float32 first",
                    crate::tensor::describe(t.shape(), t.dtype())
                ),
            });
        }
    }
    device
        .0
        .ops_run
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let profiled = profiler::op_begin(op.name, device.name());
    let moved = inputs
        .iter()
        .map(|t| t.to_device(&device))
        .collect::<Result<Vec<_>>>()?;
    let _half = HalfMark::enter(moved.iter().any(|t| t.dtype() == DType::F16));
    let out = f(&device, &moved);
    if let Some(scope) = profiled {
        match device.gpu() {
            None => scope.end(Timing::Host),
            Some(g) if g.ctx.has_timestamps() => scope.end(Timing::Device),
            Some(_) => {
                // No timestamps: the op's time is its call's, waiting for its kernels.
                let synced = {
                    let _cause = profiler::WaitCause::enter(
                        "profiler: an op timed on the host (no timestamp queries)",
                    );
                    device.synchronize()
                };
                scope.end(Timing::HostSynced);
                synced?;
            }
        }
    }
    out
}

pub(crate) use basic::unscale_checked;
pub(crate) use nn_kernels::{
    ConvNormGrads, ConvWeightGrads, DenseGrads, NnKernels, NormWrites, NormalizedInput,
    SeparableBackward, SeparableForward, StemConv,
};
pub(crate) use spec::ScaleRules;
