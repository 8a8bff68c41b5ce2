//! The losses on float targets and the metrics of `ops::loss` on a GPU: `shaders/loss.wgsl`,
//! one invocation per row (see its header).

use bytemuck::{Pod, Zeroable};

use crate::error::Result;
use crate::ops::gpu::kernels::GpuKernels;
use crate::ops::gpu::{grid_1d, Kernel, ShaderFamily};
use crate::ops::nn_kernels::{LossParams, MetricKind, OutputActivation};
use crate::tensor::Tensor;

const fn loss(entry: &'static str) -> Kernel {
    Kernel::new(ShaderFamily::Loss, entry)
}

pub(crate) const DENSE_LOSS_ROWS: Kernel = loss("dense_loss");
pub(crate) const METRIC: Kernel = loss("metric_rows");
pub(crate) const TOP_K: Kernel = loss("top_k_rows");
pub(crate) const SIGMOID_MAP: Kernel = loss("sigmoid_map");

/// Kernels of `DenseLoss`.
pub(crate) const DENSE_LOSS: &[Kernel] = &[DENSE_LOSS_ROWS];
/// Kernels of `MetricRows`.
pub(crate) const METRIC_ROWS: &[Kernel] = &[METRIC, TOP_K];
/// Kernels of `Sigmoid`.
pub(crate) const SIGMOID: &[Kernel] = &[SIGMOID_MAP];

/// Mirror of `Params` in loss.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Default, Pod, Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    kind: u32,
    act: u32,
    label_smoothing: f32,
    row_scale: f32,
    grad_scale: f32,
    k: u32,
    threshold: f32,
    n: u32,
    pad0: u32,
    pad1: u32,
}

fn u(x: usize) -> u32 {
    // Shapes on a GPU are bounded by max_storage_buffer_binding_size (< 4 GiB).
    x as u32
}

pub(crate) fn dense_loss(
    k: &GpuKernels<'_>,
    (z, targets): (&Tensor, &Tensor),
    (loss, dz): (&Tensor, &Tensor),
    p: &LossParams,
) -> Result<()> {
    // The front-end answers an empty row itself.
    if p.rows * p.cols == 0 {
        return Ok(());
    }
    let params = Params {
        rows: u(p.rows),
        cols: u(p.cols),
        kind: p.kind as u32,
        act: p.act as u32,
        label_smoothing: p.label_smoothing,
        row_scale: p.row_scale,
        grad_scale: p.grad_scale,
        ..Default::default()
    };
    k.launch(
        DENSE_LOSS_ROWS,
        &params,
        &[z, targets, loss, dz],
        grid_1d(p.rows, 64),
    )
}

pub(crate) fn metric_rows(
    k: &GpuKernels<'_>,
    (z, targets, out): (&Tensor, &Tensor, &Tensor),
    (rows, cols): (usize, usize),
    kind: MetricKind,
    act: OutputActivation,
) -> Result<()> {
    if rows * cols == 0 {
        return Ok(());
    }
    let mut params = Params {
        rows: u(rows),
        cols: u(cols),
        act: act as u32,
        ..Default::default()
    };
    let entry = match kind {
        MetricKind::SparseTopK(top) => {
            params.k = u(top.min(cols + 1));
            TOP_K
        }
        MetricKind::Categorical => {
            params.kind = 1;
            METRIC
        }
        MetricKind::Binary(threshold) => {
            params.kind = 2;
            params.threshold = threshold;
            METRIC
        }
        MetricKind::MeanSquared => {
            params.kind = 3;
            METRIC
        }
    };
    k.launch(entry, &params, &[z, targets, out], grid_1d(rows, 64))
}

pub(crate) fn sigmoid(k: &GpuKernels<'_>, x: &Tensor, y: &Tensor) -> Result<()> {
    let n = x.len();
    if n == 0 {
        return Ok(());
    }
    let params = Params {
        n: u(n),
        ..Default::default()
    };
    k.launch(SIGMOID_MAP, &params, &[x, y], grid_1d(n, 64))
}
