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
pub(crate) mod host;
pub(crate) mod nn;
#[doc(hidden)]
pub mod reference;
pub mod spec;

pub use nn::*;

use crate::device::logical::Backend;
use crate::device::LogicalDevice;
use crate::error::Result;
use crate::placement::{self, OpInfo};
use crate::profiler::{self, Timing};
use crate::tensor::Tensor;
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

/// Places `op`, brings `inputs` to its device, and hands both to `f`.
pub(crate) fn run<R>(
    op: &OpInfo,
    inputs: &[&Tensor],
    f: impl FnOnce(&LogicalDevice, &[Tensor]) -> Result<R>,
) -> Result<R> {
    let device = placement::place(op, inputs.first().map(|t| t.device_handle()))?;
    device
        .0
        .ops_run
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let profiled = profiler::op_begin(op.name, device.name());
    let moved = inputs
        .iter()
        .map(|t| t.to_device(&device))
        .collect::<Result<Vec<_>>>()?;
    let out = f(&device, &moved);
    if let Some(scope) = profiled {
        match device.gpu() {
            None => scope.end(Timing::Host),
            Some(g) if g.ctx.has_timestamps() => scope.end(Timing::Device),
            Some(_) => {
                // No timestamps: the op's time is its call's, waiting for its kernels.
                let synced = device.synchronize();
                scope.end(Timing::HostSynced);
                synced?;
            }
        }
    }
    out
}

pub(crate) use nn::NnKernels;
