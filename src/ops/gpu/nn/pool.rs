//! 2×2 max-pooling on a GPU (`pool.wgsl`): forward, gradient, and the gradient fused with the
//! activation's and the bias's.

use bytemuck::{Pod, Zeroable};

use crate::error::Result;
use crate::ops::gpu::grid_1d;
use crate::ops::gpu::kernels::GpuKernels;
use crate::ops::gpu::tune::bucket;
use crate::ops::nn_kernels::unfused_maxpool_activation_bias_grad;
use crate::ops::spec::{Activation, PoolShape};
use crate::ops::Kernels;
use crate::tensor::Tensor;

use super::kernel_lists::*;
use super::{channel_lanes, chunking, u};

/// Mirror of `Params` in pool.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Default, Pod, Zeroable)]
struct PoolParams {
    n: u32,
    h: u32,
    w: u32,
    c: u32,
    oh: u32,
    ow: u32,
    hb: u32,
    wb: u32,
    items: u32,
    act: u32,
    windows: u32,
    lane_stride: u32,
    step: u32,
    steps: u32,
}

impl PoolParams {
    /// The shape fields of `s` with `c` channel slots (vec4s for the _v4 entry points); the
    /// rest zero.
    fn shape(s: &PoolShape, c: usize) -> PoolParams {
        let (oh, ow) = s.out_hw();
        PoolParams {
            n: u(s.n),
            h: u(s.h),
            w: u(s.w),
            c: u(c),
            oh: u(oh),
            ow: u(ow),
            hb: u(s.h.div_ceil(2)),
            wb: u(s.w.div_ceil(2)),
            ..Default::default()
        }
    }
}

/// Fewest windows one invocation of `maxpool_act_grad_sum_v4` walks: each lane's partial sums
/// are written and summed again.
const POOL_GRAD_MIN_WINDOWS: usize = 16;

impl GpuKernels<'_> {
    pub(super) fn maxpool_impl(&self, x: &Tensor, y: &Tensor, s: &PoolShape) -> Result<()> {
        if s.output_len() == 0 {
            return Ok(());
        }
        let (oh, ow) = s.out_hw();
        let (v4, c) = channel_lanes(s.c);
        let items = s.n * oh * ow * c;
        let p = PoolParams {
            items: u(items),
            ..PoolParams::shape(s, c)
        };
        let entry = if v4 { MAXPOOL_V4 } else { MAXPOOL_S };
        self.launch(entry, &p, &[x, y], grid_1d(items, 64))
    }

    pub(super) fn maxpool_backward_impl(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dx: &Tensor,
        s: &PoolShape,
    ) -> Result<()> {
        if s.input_len() == 0 {
            return Ok(());
        }
        let (v4, c) = channel_lanes(s.c);
        let items = s.n * s.h.div_ceil(2) * s.w.div_ceil(2) * c;
        let p = PoolParams {
            items: u(items),
            ..PoolParams::shape(s, c)
        };
        // Every window is partial when dy is empty; it is never read then.
        let dy = if dy.is_empty() { dx } else { dy };
        let entry = if v4 { MAXPOOL_BWD_V4 } else { MAXPOOL_BWD_S };
        self.launch(entry, &p, &[x, dy, dx], grid_1d(items, 64))
    }

    pub(super) fn maxpool_activation_bias_grad_impl(
        &self,
        y: &Tensor,
        dpooled: &Tensor,
        (dz, db): (&Tensor, &Tensor),
        s: &PoolShape,
        act: Activation,
    ) -> Result<()> {
        let (v4, c) = channel_lanes(s.c);
        if s.input_len() == 0 || !v4 {
            return unfused_maxpool_activation_bias_grad(self, y, dpooled, (dz, db), s, act);
        }
        let windows = s.n * s.h.div_ceil(2) * s.w.div_ceil(2);
        let class = format!("maxpool_act_grad c{} w{}", s.c, bucket(windows));
        // Every window is partial when dpooled is empty; it is never read then.
        let dpooled = if dpooled.is_empty() { dz } else { dpooled };
        self.tuned_partials(class, &mut |target| {
            // Partial sums in float32 (the bias sums are `kept_f32`), one rounding at the end.
            self.float32_sums(db, |db| {
                let (chunk, lanes) = chunking(target, c, windows, POOL_GRAD_MIN_WINDOWS);
                let (lane_stride, step) = self.lane_walk(chunk, lanes);
                let partials = if lanes == 1 {
                    db.clone()
                } else {
                    self.scratch(&[lanes, s.c], db)?
                };
                let p = PoolParams {
                    items: u(lanes * c),
                    act: act.code(),
                    windows: u(windows),
                    lane_stride,
                    step,
                    steps: u(chunk),
                    ..PoolParams::shape(s, c)
                };
                self.launch(
                    MAXPOOL_ACT_GRAD_SUM_V4,
                    &p,
                    &[y, dpooled, dz, &partials],
                    grid_1d(lanes * c, 64),
                )?;
                if lanes > 1 {
                    self.sum_rows(&partials, lanes, s.c, db)?;
                }
                Ok(())
            })
        })
    }
}
