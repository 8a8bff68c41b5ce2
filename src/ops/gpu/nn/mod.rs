//! [`NnKernels`] on a GPU: the WGSL of `conv2d.wgsl`, `depthwise.wgsl`, `pool.wgsl`,
//! `softmax.wgsl` and `optim.wgsl`, plus the general kernels of [`super::kernels`] (activations,
//! `sum_rows` for the partial sums of the kernel gradients).
//!
//! Each method packs a `#[repr(C)]` mirror of its shader's `Params`, picks the entry point (the
//! `_v4` ones read and write `vec4<f32>` views and need channel counts that are multiples of 4),
//! and records one dispatch (two or three with the partial-sum reduction). Nothing waits.
//! The `pub(crate) const` lists say which kernels each op may dispatch, for placement
//! (`kernel_lists.rs`). One file per shader family beside this one (`conv`, `depthwise` with the
//! separable convolution, `pool`, `softmax`, `optim`, and `conv_general` for the grouped
//! convolutions `depthwise` does not take); this one holds the partial-sum helpers they share
//! and the trait's implementation, which hands each family's methods to its file.
//!
//! Design notes:
//! * Every output is written by exactly one invocation (no atomics, no zero-fill first); the
//!   kernel gradients reduce over pixels as partial sums in a scratch `[chunks, len]` tensor,
//!   summed by `sum_rows`. Outputs are allocated by the front-ends before any scratch.
//! * The input gradient of a convolution is the forward correlation of `dz` with the flipped,
//!   channel-swapped kernel (`conv2d_flip`, a small transpose into scratch), so one register-
//!   blocked kernel serves both directions.
//! * Loads dominate on software adapters (lavapipe/llvmpipe run 8 invocations per SIMD batch and
//!   load per lane), and memory traffic on hardware: the convolutions keep 4 pixels × 32 output
//!   channels per invocation in registers, with the kernel read at one address per workgroup.
//!   [`crate::ops::pointwise_conv2d`] runs on `conv2d_v4`, except on software adapters with 64
//!   or more output channels, where `matmul_16x8` (tall register blocks) is faster; the input
//!   gradient of a 1×1 convolution takes the same route with the channel counts swapped (the
//!   flipped kernel is then the transposed one). Its kernel gradient `xᵀ · dz` is
//!   `conv2d_dk_1x1`, partial sums over chunks of pixels (a plain product would give the long
//!   pixel dimension to one workgroup); software adapters get a few large chunks, GPUs many.

use bytemuck::Pod;

use crate::error::Result;
use crate::ops::gpu::kernels::GpuKernels;
use crate::ops::gpu::tune::Choice;
use crate::ops::gpu::{grid_1d, Kernel};
use crate::ops::spec::{Activation, AdamParams, Conv2dShape, DepthwiseShape, PoolShape, SgdParams};
use crate::ops::spec::{ActivationFn, Pool2dShape};
use crate::ops::spec::{ClipMode, RmspropParams};
use crate::ops::{
    ConvNormGrads, ConvWeightGrads, DenseGrads, Kernels, MatmulDims, NnKernels, NormWrites,
    NormalizedInput, ScaleRules, SeparableBackward, SeparableForward,
};
use crate::tensor::Tensor;

// ---- general (strided, dilated, grouped) convolutions ----
mod conv_general;

mod conv;
mod depthwise;
mod kernel_lists;
// ---- loss scaling on the device ----
mod loss_scale;
mod optim;
mod pool;
mod softmax;
pub(crate) use kernel_lists::*;
// ---- fused optimizer update ----
pub(crate) use optim::update_table;
// The partial-sum chunking the kernels below share with `kernels.rs`'s fused activation
// gradient.
use crate::ops::gpu::kernels::{chunking, PARTIAL_TARGET, SOFTWARE_PARTIAL_TARGET};

/// Fewest pixels (or image rows for the 3×3 depthwise filter gradient) one partial sums.
const MIN_CHUNK: usize = 32;

fn u(x: usize) -> u32 {
    // Shapes on a GPU are bounded by max_storage_buffer_binding_size (< 4 GiB), so every
    // element count and index fits in u32.
    x as u32
}

impl GpuKernels<'_> {
    /// Zeros a whole tensor.
    fn clear(&self, t: &Tensor) {
        if let Some(range) = t.gpu_range() {
            self.dev.ctx.clear(range, range.size);
        }
    }

    /// Dispatches a partial-sum kernel writing `[chunks, len]` partials and reduces them into
    /// `out` (`[len]`); with one chunk the kernel writes `out` directly.
    fn partial_sums(
        &self,
        kernel: Kernel,
        params: &impl Pod,
        inputs: [&Tensor; 2],
        out: &Tensor,
        items: usize,
        chunks: usize,
    ) -> Result<()> {
        self.float32_sums(out, |out| {
            let len = out.len();
            if chunks == 1 {
                return self.launch(
                    kernel,
                    params,
                    &[inputs[0], inputs[1], out],
                    grid_1d(items, 64),
                );
            }
            let partials = self.scratch(&[chunks, len], out)?;
            self.launch(
                kernel,
                params,
                &[inputs[0], inputs[1], &partials],
                grid_1d(items, 64),
            )?;
            self.sum_rows(&partials, chunks, len, out)
        })
    }

    /// Runs a partial-sum kernel gradient with the chunking its tuner picks: few large chunks
    /// (software adapters: a few cores, each chunk's partials to write and sum again) or many
    /// (GPUs: tens of thousands of invocations to hide latency).
    fn tuned_partials(
        &self,
        class: String,
        run: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<()> {
        let heuristic = if self.dev.ctx.software_kernels {
            "chunks_2k"
        } else {
            "chunks_32k"
        };
        let choice = Choice::new(
            "partial_sums",
            class,
            &["chunks_2k", "chunks_32k"],
            heuristic,
        )
        .full_only(&["chunks_8k", "chunks_128k"]);
        self.tuned(choice, &mut |c| {
            let target = match c {
                "chunks_2k" => SOFTWARE_PARTIAL_TARGET,
                "chunks_8k" => 8_192,
                "chunks_128k" => 131_072,
                _ => PARTIAL_TARGET,
            };
            run(target)
        })
    }
}

impl NnKernels for GpuKernels<'_> {
    fn conv2d(
        &self,
        x: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        y: &Tensor,
        s: &Conv2dShape,
        act: Activation,
    ) -> Result<()> {
        self.conv2d_impl(x, kernel, bias, y, s, act)
    }

    fn conv2d_backward_input(
        &self,
        dz: &Tensor,
        kernel: &Tensor,
        dx: &Tensor,
        s: &Conv2dShape,
    ) -> Result<()> {
        self.conv2d_backward_input_impl(dz, kernel, dx, s)
    }

    fn conv2d_backward_kernel(
        &self,
        x: &Tensor,
        dz: &Tensor,
        dk: &Tensor,
        s: &Conv2dShape,
    ) -> Result<()> {
        self.conv2d_backward_kernel_impl(x, dz, dk, s)
    }

    fn depthwise(&self, x: &Tensor, kernel: &Tensor, y: &Tensor, s: &DepthwiseShape) -> Result<()> {
        self.depthwise_impl(x, kernel, y, s)
    }

    fn depthwise_backward_input(
        &self,
        dy: &Tensor,
        kernel: &Tensor,
        dx: &Tensor,
        s: &DepthwiseShape,
    ) -> Result<()> {
        self.depthwise_backward_input_impl(dy, kernel, dx, s)
    }

    fn depthwise_backward_kernel(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dk: &Tensor,
        s: &DepthwiseShape,
    ) -> Result<()> {
        self.depthwise_backward_kernel_impl(x, dy, dk, s)
    }

    fn maxpool(&self, x: &Tensor, y: &Tensor, s: &PoolShape) -> Result<()> {
        self.maxpool_impl(x, y, s)
    }

    fn maxpool_backward(&self, x: &Tensor, dy: &Tensor, dx: &Tensor, s: &PoolShape) -> Result<()> {
        self.maxpool_backward_impl(x, dy, dx, s)
    }

    fn maxpool_activation_bias_grad(
        &self,
        y: &Tensor,
        dpooled: &Tensor,
        (dz, db): (&Tensor, &Tensor),
        s: &PoolShape,
        act: Activation,
    ) -> Result<()> {
        self.maxpool_activation_bias_grad_impl(y, dpooled, (dz, db), s, act)
    }

    fn activation(&self, x: &Tensor, y: &Tensor, act: Activation) -> Result<()> {
        self.activation_impl(x, y, act)
    }

    fn activation_backward(
        &self,
        dy: &Tensor,
        y: &Tensor,
        dz: &Tensor,
        act: Activation,
    ) -> Result<()> {
        self.activation_backward_impl(dy, y, dz, act)
    }

    fn activation_bias_grad(
        &self,
        dy: &Tensor,
        y: &Tensor,
        dz: &Tensor,
        db: &Tensor,
        rows_cols: (usize, usize),
        act: Activation,
    ) -> Result<()> {
        self.activation_bias_grad_impl(dy, y, dz, db, rows_cols, act)
    }

    fn separable(&self, f: &SeparableForward<'_>) -> Result<()> {
        self.separable_impl(f)
    }

    fn separable_backward(&self, g: &SeparableBackward<'_>) -> Result<()> {
        self.separable_backward_impl(g)
    }

    // ---- batch normalization and dropout (`ops::gpu::norm`) ----
    fn batch_norm(&self, a: &crate::ops::nn_kernels::BatchNormArgs<'_>) -> Result<()> {
        match a.writes {
            NormWrites::Values => {}
            NormWrites::ImageMeans(_) => return Err(cpu_only("FusedBatchNormReluMean")),
            NormWrites::Nothing => return Err(cpu_only("FusedBatchNormStatistics")),
        }
        self.batch_norm_impl(a)
    }

    fn batch_norm_backward(&self, g: &crate::ops::nn_kernels::BatchNormGradArgs<'_>) -> Result<()> {
        if g.image_means.is_some() {
            return Err(cpu_only("FusedBatchNormReluMeanGrad"));
        }
        self.batch_norm_backward_impl(g)
    }

    fn dropout(
        &self,
        x: &Tensor,
        (y, mask): (&Tensor, &Tensor),
        m: &crate::ops::spec::DropoutMask,
    ) -> Result<()> {
        self.dropout_impl(x, (y, mask), m)
    }

    fn dropout_grad(&self, dy: &Tensor, mask: &Tensor, dx: &Tensor) -> Result<()> {
        self.dropout_grad_impl(dy, mask, dx)
    }

    // ---- general convolutions ----
    fn depthwise_bias_act(
        &self,
        x: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        y: &Tensor,
        s: &DepthwiseShape,
        act: Activation,
    ) -> Result<()> {
        self.depthwise_bias_act_impl(x, kernel, bias, y, s, act)
    }

    fn conv2d_backward_weights(&self, g: &ConvWeightGrads<'_>) -> Result<()> {
        self.conv2d_backward_weights_impl(g)
    }

    fn conv2d_backward_weights_normalized(&self, _: &ConvNormGrads<'_>) -> Result<()> {
        Err(cpu_only("FusedBatchNormGradConv2DBackpropFilter"))
    }

    fn conv2d_normalized_input(
        &self,
        _: &NormalizedInput<'_>,
        _: (&Tensor, Option<&Tensor>),
        _: &Tensor,
        _: &Conv2dShape,
        _: Activation,
    ) -> Result<()> {
        Err(cpu_only("FusedBatchNormReluConv2D"))
    }

    fn conv2d_backward_kernel_normalized_input(
        &self,
        _: &NormalizedInput<'_>,
        _: &Tensor,
        _: &Tensor,
        _: &Conv2dShape,
    ) -> Result<()> {
        Err(cpu_only("FusedBatchNormReluConv2DBackpropFilter"))
    }

    fn dense_backward(&self, g: &DenseGrads<'_>) -> Result<()> {
        let dz = match g.act {
            Activation::Linear => {
                self.sum_rows(g.dy, g.m, g.n, g.db)?;
                g.dy.clone()
            }
            act => {
                let dz = self.scratch(&[g.m, g.n], g.y)?;
                self.activation_bias_grad_impl(g.dy, g.y, &dz, g.db, (g.m, g.n), act)?;
                dz
            }
        };
        let dw_dims = MatmulDims {
            m: g.k,
            k: g.m,
            n: g.n,
            trans_a: true,
            trans_b: false,
        };
        self.matmul(g.x, &dz, None, g.dw, dw_dims, Activation::Linear)?;
        if let Some(dx) = g.dx {
            let dx_dims = MatmulDims {
                m: g.m,
                k: g.n,
                n: g.k,
                trans_a: false,
                trans_b: true,
            };
            self.matmul(&dz, g.w, None, dx, dx_dims, Activation::Linear)?;
        }
        Ok(())
    }

    fn softmax(&self, logits: &Tensor, probs: &Tensor, rows: usize, cols: usize) -> Result<()> {
        self.softmax_impl(logits, probs, rows, cols)
    }

    fn softmax_cross_entropy(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        loss: &Tensor,
        dlogits: &Tensor,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        self.softmax_cross_entropy_impl(logits, labels, loss, dlogits, rows, cols)
    }

    fn accuracy_count(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        out: &Tensor,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        self.accuracy_count_impl(logits, labels, out, rows, cols)
    }

    // ---- losses on float targets, metrics (gpu/loss.rs) ----
    fn dense_loss(
        &self,
        z: &Tensor,
        targets: &Tensor,
        loss: &Tensor,
        dz: &Tensor,
        p: &crate::ops::nn_kernels::LossParams,
    ) -> Result<()> {
        super::loss::dense_loss(self, (z, targets), (loss, dz), p)
    }

    fn metric_rows(
        &self,
        z: &Tensor,
        targets: &Tensor,
        out: &Tensor,
        rows_cols: (usize, usize),
        kind: crate::ops::nn_kernels::MetricKind,
        act: crate::ops::nn_kernels::OutputActivation,
    ) -> Result<()> {
        super::loss::metric_rows(self, (z, targets, out), rows_cols, kind, act)
    }

    fn sigmoid(&self, x: &Tensor, y: &Tensor) -> Result<()> {
        super::loss::sigmoid(self, x, y)
    }

    fn sgd(&self, w: &Tensor, g: &Tensor, p: &SgdParams) -> Result<()> {
        self.sgd_impl(w, g, p)
    }

    fn sgd_momentum(&self, w: &Tensor, g: &Tensor, v: &Tensor, p: &SgdParams) -> Result<()> {
        self.sgd_momentum_impl(w, g, v, p)
    }

    fn adam(&self, w: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, p: &AdamParams) -> Result<()> {
        self.adam_impl(w, g, m, v, p)
    }

    // ---- activations and pooling layers ----
    fn activation_fn(&self, x: &Tensor, y: &Tensor, act: ActivationFn) -> Result<()> {
        self.activation_fn_impl(x, y, act)
    }

    fn activation_fn_backward(
        &self,
        dy: &Tensor,
        t: &Tensor,
        dz: &Tensor,
        act: ActivationFn,
        from_output: bool,
    ) -> Result<()> {
        self.activation_fn_backward_impl(dy, t, dz, act, from_output)
    }

    fn avg_pool2d(&self, x: &Tensor, y: &Tensor, s: &Pool2dShape) -> Result<()> {
        self.avg_pool2d_impl(x, y, s)
    }

    fn avg_pool2d_backward(&self, dy: &Tensor, dx: &Tensor, s: &Pool2dShape) -> Result<()> {
        self.avg_pool2d_backward_impl(dy, dx, s)
    }

    fn max_pool2d_window(&self, x: &Tensor, y: &Tensor, s: &Pool2dShape) -> Result<()> {
        self.max_pool2d_window_impl(x, y, s)
    }

    fn max_pool2d_window_backward(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dx: &Tensor,
        s: &Pool2dShape,
    ) -> Result<()> {
        self.max_pool2d_window_backward_impl(x, dy, dx, s)
    }

    fn global_pool(&self, max: bool, x: &Tensor, y: &Tensor, s: &PoolShape) -> Result<()> {
        self.global_pool_impl(max, x, y, s)
    }

    fn global_avg_pool_backward(&self, dy: &Tensor, dx: &Tensor, s: &PoolShape) -> Result<()> {
        self.global_avg_pool_backward_impl(dy, dx, s)
    }

    fn global_max_pool_backward(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dx: &Tensor,
        s: &PoolShape,
    ) -> Result<()> {
        self.global_max_pool_backward_impl(x, dy, dx, s)
    }

    fn rmsprop(
        &self,
        w: &Tensor,
        g: &Tensor,
        v: &Tensor,
        average: Option<&Tensor>,
        momentum: Option<&Tensor>,
        p: &RmspropParams,
    ) -> Result<()> {
        self.rmsprop_impl(w, g, v, average, momentum, p)
    }

    fn weight_decay(&self, w: &Tensor, wd: f32, lr: f32) -> Result<()> {
        self.weight_decay_impl(w, wd, lr)
    }

    fn clip(
        &self,
        g: &Tensor,
        sum_squares: Option<&Tensor>,
        out: &Tensor,
        mode: ClipMode,
    ) -> Result<()> {
        self.clip_impl(g, sum_squares, out, mode)
    }

    // ---- fused optimizer update ----
    fn fused_update(&self, f: &crate::ops::nn_kernels::FusedUpdate<'_>) -> Result<()> {
        self.fused_update_impl(f)
    }

    // ---- loss scaling on the device ----
    fn loss_scale_check(
        &self,
        f: &crate::ops::nn_kernels::FusedUpdate<'_>,
        state: &Tensor,
    ) -> Result<()> {
        self.loss_scale_check_impl(f, state)
    }

    fn loss_scale_seed(&self, x: &Tensor, factor: f32, state: &Tensor) -> Result<()> {
        self.loss_scale_seed_impl(x, factor, state)
    }

    fn loss_scale_unscale(
        &self,
        g: &Tensor,
        out: &Tensor,
        inverse_base: f32,
        state: &Tensor,
    ) -> Result<()> {
        self.loss_scale_unscale_impl(g, out, inverse_base, state)
    }

    fn loss_scale_advance(&self, state: &Tensor, rules: ScaleRules) -> Result<()> {
        self.loss_scale_advance_impl(state, rules)
    }
}

/// Whether `channels` can be processed as vec4 lanes, and the count of elements per pixel the
/// kernel then steps over (channels, or groups of four).
fn channel_lanes(channels: usize) -> (bool, usize) {
    if channels.is_multiple_of(4) {
        (true, channels / 4)
    } else {
        (false, channels)
    }
}

/// The error for a fused form of an op that only the CPU runs (the separable ops' argmax
/// forms, a batch normalization with the pooling after it, under the first convolution's
/// kernel gradient, or read unwritten by the convolution after it): their ops have no GPU
/// kernels, so placement never sends them here.
fn cpu_only(op: &'static str) -> crate::Error {
    crate::Error::Unsupported {
        op,
        device: "a GPU".into(),
        missing: "a GPU kernel (this fused form runs on the CPU)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gpu::kernels::MAX_CHUNK;

    #[test]
    fn partial_sum_chunks_cover_every_position_and_stay_under_the_loop_limit() {
        for (target, units, total, min_chunk) in [
            (2048, 8, 3584, 1),
            (2048, 4096, 100_352, 64),
            (32_768, 1, 10, 64),
            (2048, 1 << 20, 1 << 24, 1),
            (131_072, 3, 0, 64),
        ] {
            let (chunk, chunks) = chunking(target, units, total, min_chunk);
            assert!(chunk * chunks >= total, "{chunk} × {chunks} < {total}");
            assert!(chunk * (chunks - 1) < total.max(1), "an empty chunk");
            assert!(chunk <= MAX_CHUNK, "{chunk} positions in one loop");
        }
    }
}
