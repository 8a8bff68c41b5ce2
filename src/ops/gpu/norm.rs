//! Batch normalization and dropout on a GPU: `shaders/batchnorm.wgsl` and
//! `shaders/dropout.wgsl`.
//!
//! The per-channel sums are partial sums over chunks of rows (one invocation per chunk and
//! channel, channels fastest, float32 partials whatever the input's dtype) added by `sum_rows`, the column sums
//! every reduction here goes through; the moments take two passes (mean, then squared
//! deviations), as `tf.nn.moments` does. Nothing waits for the device.

use bytemuck::{Pod, Zeroable};

use crate::error::Result;
use crate::ops::gpu::kernels::{self as gk, GpuKernels};
use crate::ops::gpu::{grid_1d, row_chunk, Kernel, ShaderFamily};
use crate::ops::nn_kernels::{BatchNormArgs, BatchNormGradArgs};
use crate::ops::spec::{BatchNormParams, DropoutMask};
use crate::ops::Kernels;
use crate::tensor::{DType, Tensor};

const fn bn(entry: &'static str) -> Kernel {
    Kernel::new(ShaderFamily::Batchnorm, entry)
}

pub(crate) const BN_SUM_PART: Kernel = bn("bn_sum_part");
pub(crate) const BN_SQDEV_PART: Kernel = bn("bn_sqdev_part");
pub(crate) const BN_STATS: Kernel = bn("bn_stats");
pub(crate) const BN_INFER_STATS: Kernel = bn("bn_infer_stats");
pub(crate) const BN_APPLY: Kernel = bn("bn_apply");
pub(crate) const BN_GRAD_PART: Kernel = bn("bn_grad_part");
pub(crate) const BN_GRAD_COEF: Kernel = bn("bn_grad_coef");
pub(crate) const BN_DX: Kernel = bn("bn_dx");
pub(crate) const BN_AFFINE: Kernel = bn("bn_affine");
pub(crate) const BN_APPLY_RELU: Kernel = bn("bn_apply_relu");
pub(crate) const BN_RELU_GRAD_PART: Kernel = bn("bn_relu_grad_part");
pub(crate) const BN_RELU_DX: Kernel = bn("bn_relu_dx");
pub(crate) const DROPOUT_MASK: Kernel = Kernel::new(ShaderFamily::Dropout, "dropout");
pub(crate) const DROPOUT_GRAD_MASK: Kernel = Kernel::new(ShaderFamily::Dropout, "dropout_grad");

/// Kernels of `FusedBatchNormV3` (training and inference).
pub(crate) const BATCH_NORM: &[Kernel] = &[
    BN_SUM_PART,
    BN_SQDEV_PART,
    BN_STATS,
    BN_INFER_STATS,
    BN_APPLY,
    gk::SUM_ROWS,
    gk::SUM_ROWS_V4,
    gk::SUM_ROWS_WG,
];
/// Kernels of `FusedBatchNormGradV3`.
pub(crate) const BATCH_NORM_GRAD: &[Kernel] = &[
    BN_GRAD_PART,
    BN_GRAD_COEF,
    BN_DX,
    gk::SUM_ROWS,
    gk::SUM_ROWS_V4,
    gk::SUM_ROWS_WG,
];
/// Kernels of `_FusedBatchNormEx` (batch normalization, then a ReLU).
pub(crate) const BATCH_NORM_RELU: &[Kernel] = &[
    BN_SUM_PART,
    BN_SQDEV_PART,
    BN_STATS,
    BN_INFER_STATS,
    BN_APPLY_RELU,
    gk::SUM_ROWS,
    gk::SUM_ROWS_V4,
    gk::SUM_ROWS_WG,
];
/// Kernels of `_FusedBatchNormGradEx`.
pub(crate) const BATCH_NORM_RELU_GRAD: &[Kernel] = &[
    BN_AFFINE,
    BN_RELU_GRAD_PART,
    BN_GRAD_COEF,
    BN_RELU_DX,
    gk::SUM_ROWS,
    gk::SUM_ROWS_V4,
    gk::SUM_ROWS_WG,
];
/// Kernels of `Dropout`.
pub(crate) const DROPOUT: &[Kernel] = &[DROPOUT_MASK];
/// Kernels of `DropoutGrad`.
pub(crate) const DROPOUT_GRAD: &[Kernel] = &[DROPOUT_GRAD_MASK];

/// Rows per partial sum: enough work per invocation, and a few hundred chunks at most for the
/// tutorial's sizes (28·28·128 rows → 392 chunks).
const CHUNK_ROWS: usize = 256;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct BnParams {
    rows: u32,
    c: u32,
    chunk: u32,
    items: u32,
    momentum: f32,
    one_minus: f32,
    epsilon: f32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct DropoutParams {
    items: u32,
    key: u32,
    threshold: u32,
    scale: f32,
}

fn u(x: usize) -> u32 {
    // Shapes on a GPU are bounded by max_storage_buffer_binding_size (< 4 GiB).
    x as u32
}

impl BnParams {
    /// The parameters and the number of chunks of rows the partial sums cut `p.rows` into.
    fn new(p: &BatchNormParams) -> (BnParams, usize) {
        let chunk = row_chunk(p.rows, CHUNK_ROWS);
        let params = BnParams {
            rows: u(p.rows),
            c: u(p.channels),
            chunk: u(chunk),
            items: u(p.rows * p.channels),
            momentum: p.momentum,
            one_minus: p.one_minus_momentum(),
            epsilon: p.epsilon,
            _pad: 0,
        };
        (params, p.rows.div_ceil(chunk).max(1))
    }

    /// The same for a partial-sum kernel: one item per chunk and channel.
    fn partial_sums(self, chunks: usize) -> BnParams {
        BnParams {
            items: u(chunks * self.c as usize),
            ..self
        }
    }
}

impl GpuKernels<'_> {
    /// Column sums of a partial-sum kernel's output: `part` fills `[chunks, width]` float32
    /// partials, `sum_rows` adds them into `out`.
    fn bn_partial_sums(
        &self,
        (chunks, width): (usize, usize),
        out: &Tensor,
        part: impl FnOnce(&Tensor) -> Result<()>,
    ) -> Result<()> {
        let partials = Tensor::uninit(&[chunks, width], DType::F32, out.device_handle())?;
        part(&partials)?;
        self.sum_rows(&partials, chunks, width, out)
    }

    pub(crate) fn batch_norm_impl(&self, a: &BatchNormArgs<'_>) -> Result<()> {
        let c = a.p.channels;
        let (p, chunks) = BnParams::new(&a.p);
        let channel_groups = u(c.div_ceil(64));
        let scratch_stats;
        let stats = match a.stats {
            Some(stats) => {
                let sums = Tensor::uninit(&[c], DType::F32, stats.device_handle())?;
                let sq = Tensor::uninit(&[c], DType::F32, stats.device_handle())?;
                let (part, grid) = (p.partial_sums(chunks), grid_1d(chunks * c, 64));
                self.bn_partial_sums((chunks, c), &sums, |partials| {
                    self.launch(BN_SUM_PART, &part, &[a.x, partials], grid)
                })?;
                self.bn_partial_sums((chunks, c), &sq, |partials| {
                    self.launch(BN_SQDEV_PART, &part, &[a.x, partials, &sums], grid)
                })?;
                let tensors = [&sums, &sq, a.v.moving_mean, a.v.moving_variance, stats];
                self.launch(BN_STATS, &p, &tensors, [channel_groups, 1, 1])?;
                stats
            }
            None => {
                scratch_stats = Tensor::uninit(&[2, c], DType::F32, a.y.device_handle())?;
                let tensors = [a.v.moving_mean, a.v.moving_variance, &scratch_stats];
                self.launch(BN_INFER_STATS, &p, &tensors, [channel_groups, 1, 1])?;
                &scratch_stats
            }
        };
        let apply = if a.relu { BN_APPLY_RELU } else { BN_APPLY };
        let tensors = [a.x, a.y, a.v.gamma, a.v.beta, stats];
        self.launch(apply, &p, &tensors, grid_1d(a.p.rows * c, 64))
    }

    /// `[a; b]` per channel (`[2, c]`, float32): the normalization's `y = x * a + b`, which a
    /// fused ReLU's gradient passes read to find where it passed.
    fn bn_affine(
        &self,
        p: &BnParams,
        (gamma, beta): (&Tensor, &Tensor),
        stats: &Tensor,
    ) -> Result<Tensor> {
        let c = p.c as usize;
        let affine = Tensor::uninit(&[2, c], DType::F32, stats.device_handle())?;
        let groups = [u(c.div_ceil(64)), 1, 1];
        self.launch(BN_AFFINE, p, &[gamma, beta, stats, &affine], groups)?;
        Ok(affine)
    }

    pub(crate) fn batch_norm_backward_impl(&self, g: &BatchNormGradArgs<'_>) -> Result<()> {
        let c = g.p.channels;
        let (p, chunks) = BnParams::new(&g.p);
        let channel_groups = u(c.div_ceil(64));
        let device = g.dx.device_handle();
        // A fused ReLU's mask comes from x and the normalization's [a; b].
        let affine = g
            .relu_beta
            .map(|beta| self.bn_affine(&p, (g.gamma, beta), g.stats))
            .transpose()?;
        let sums = Tensor::uninit(&[2 * c], DType::F32, device)?;
        self.bn_partial_sums((chunks, 2 * c), &sums, |partials| {
            let (part, grid) = (p.partial_sums(chunks), grid_1d(chunks * c, 64));
            match &affine {
                Some(affine) => {
                    let tensors = [g.x, g.dy, partials, g.stats, affine];
                    self.launch(BN_RELU_GRAD_PART, &part, &tensors, grid)
                }
                None => self.launch(BN_GRAD_PART, &part, &[g.x, g.dy, partials, g.stats], grid),
            }
        })?;
        let coef = Tensor::uninit(&[3 * c], DType::F32, device)?;
        let tensors = [&sums, g.gamma, g.stats, &coef, g.dgamma, g.dbeta];
        self.launch(BN_GRAD_COEF, &p, &tensors, [channel_groups, 1, 1])?;
        let grid = grid_1d(g.p.rows * c, 64);
        match &affine {
            Some(affine) => {
                let tensors = [g.x, g.dy, g.dx, g.stats, &coef, affine];
                self.launch(BN_RELU_DX, &p, &tensors, grid)
            }
            None => self.launch(BN_DX, &p, &[g.x, g.dy, g.dx, g.stats, &coef], grid),
        }
    }

    pub(crate) fn dropout_impl(
        &self,
        x: &Tensor,
        (y, mask): (&Tensor, &Tensor),
        m: &DropoutMask,
    ) -> Result<()> {
        let p = DropoutParams {
            items: u(x.len()),
            key: m.key,
            threshold: m.threshold,
            scale: m.scale,
        };
        self.launch(DROPOUT_MASK, &p, &[x, y, mask], grid_1d(x.len(), 64))
    }

    pub(crate) fn dropout_grad_impl(&self, dy: &Tensor, mask: &Tensor, dx: &Tensor) -> Result<()> {
        let p = DropoutParams {
            items: u(dy.len()),
            key: 0,
            threshold: 0,
            scale: 0.0,
        };
        self.launch(
            DROPOUT_GRAD_MASK,
            &p,
            &[dy, dx, mask],
            grid_1d(dy.len(), 64),
        )
    }
}
