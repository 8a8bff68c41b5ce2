//! Softmax, the sparse softmax cross-entropy and the accuracy count on a GPU (`softmax.wgsl`).

use bytemuck::{Pod, Zeroable};

use crate::error::Result;
use crate::ops::gpu::grid_1d;
use crate::ops::gpu::kernels::GpuKernels;
use crate::tensor::Tensor;

use super::kernel_lists::*;
use super::u;

/// Mirror of `Params` in softmax.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct SoftmaxParams {
    rows: u32,
    cols: u32,
    nan_bits: u32,
    inv_rows: f32,
}

impl GpuKernels<'_> {
    pub(super) fn softmax_impl(
        &self,
        logits: &Tensor,
        probs: &Tensor,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        if rows * cols == 0 {
            return Ok(());
        }
        let p = SoftmaxParams {
            rows: u(rows),
            cols: u(cols),
            nan_bits: f32::NAN.to_bits(),
            inv_rows: 1.0 / rows as f32,
        };
        self.launch(SOFTMAX_ROWS, &p, &[logits, probs], grid_1d(rows, 64))
    }

    pub(super) fn softmax_cross_entropy_impl(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        loss: &Tensor,
        dlogits: &Tensor,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        if rows * cols == 0 {
            return Ok(());
        }
        let p = SoftmaxParams {
            rows: u(rows),
            cols: u(cols),
            nan_bits: f32::NAN.to_bits(),
            inv_rows: 1.0 / rows as f32,
        };
        self.launch(
            SOFTMAX_XENT,
            &p,
            &[logits, labels, loss, dlogits],
            grid_1d(rows, 64),
        )
    }

    pub(super) fn accuracy_count_impl(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        out: &Tensor,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let p = SoftmaxParams {
            rows: u(rows),
            cols: u(cols),
            nan_bits: f32::NAN.to_bits(),
            inv_rows: 0.0,
        };
        // An empty batch (or class axis) counts 0; the kernel then reads neither input.
        let logits = if logits.is_empty() { out } else { logits };
        let labels = if labels.is_empty() { out } else { labels };
        self.launch(ACCURACY, &p, &[logits, labels, out], [1, 1, 1])
    }
}
