//! `pooling.wgsl` driven: average and max pooling with any window, strides and padding, and the
//! global poolings, with their gradients; one output (or gathered input) element per invocation.

use bytemuck::{Pod, Zeroable};

use crate::error::Result;
use crate::ops::gpu::kernels::GpuKernels;
use crate::ops::gpu::{grid_1d, Kernel, ShaderFamily};
use crate::ops::spec::{Pool2dShape, PoolShape};
use crate::tensor::Tensor;

const fn pooling(entry: &'static str) -> Kernel {
    Kernel::new(ShaderFamily::Pooling, entry)
}

pub(crate) const AVGPOOL: Kernel = pooling("avgpool");
pub(crate) const AVGPOOL_BWD: Kernel = pooling("avgpool_bwd");
pub(crate) const MAXPOOL: Kernel = pooling("maxpool");
pub(crate) const MAXPOOL_BWD: Kernel = pooling("maxpool_bwd");
pub(crate) const GLOBAL_AVG: Kernel = pooling("global_avg");
pub(crate) const GLOBAL_AVG_BWD: Kernel = pooling("global_avg_bwd");
pub(crate) const GLOBAL_MAX: Kernel = pooling("global_max");
pub(crate) const GLOBAL_MAX_BWD: Kernel = pooling("global_max_bwd");

/// Mirror of `Params` in pooling.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Default, Pod, Zeroable)]
struct PoolingParams {
    n: u32,
    h: u32,
    w: u32,
    c: u32,
    oh: u32,
    ow: u32,
    ph: u32,
    pw: u32,
    sh: u32,
    sw: u32,
    pt: u32,
    pl: u32,
    items: u32,
    pad: [u32; 3],
}

fn u(x: usize) -> u32 {
    // Shapes on a GPU are bounded by max_storage_buffer_binding_size (< 4 GiB).
    x as u32
}

impl PoolingParams {
    fn windows(s: &Pool2dShape, items: usize) -> PoolingParams {
        let (oh, ow) = s.out_hw();
        let (pt, pl) = s.pad_top_left();
        PoolingParams {
            n: u(s.n),
            h: u(s.h),
            w: u(s.w),
            c: u(s.c),
            oh: u(oh),
            ow: u(ow),
            ph: u(s.pool.0),
            pw: u(s.pool.1),
            sh: u(s.strides.0),
            sw: u(s.strides.1),
            pt: u(pt),
            pl: u(pl),
            items: u(items),
            ..Default::default()
        }
    }

    fn global(s: &PoolShape, items: usize) -> PoolingParams {
        PoolingParams {
            n: u(s.n),
            h: u(s.h),
            w: u(s.w),
            c: u(s.c),
            items: u(items),
            ..Default::default()
        }
    }
}

impl GpuKernels<'_> {
    /// A pooling over the windows of `s`, one invocation per output (forward) or input
    /// (gathered gradient) element, `items` of them; nothing when there are none.
    fn launch_windows(
        &self,
        entry: Kernel,
        s: &Pool2dShape,
        items: usize,
        tensors: &[&Tensor],
    ) -> Result<()> {
        if items == 0 {
            return Ok(());
        }
        let p = PoolingParams::windows(s, items);
        self.launch(entry, &p, tensors, grid_1d(items, 256))
    }

    pub(crate) fn avg_pool2d_impl(&self, x: &Tensor, y: &Tensor, s: &Pool2dShape) -> Result<()> {
        self.launch_windows(AVGPOOL, s, s.output_len(), &[x, y])
    }

    pub(crate) fn avg_pool2d_backward_impl(
        &self,
        dy: &Tensor,
        dx: &Tensor,
        s: &Pool2dShape,
    ) -> Result<()> {
        // With no output (a 'valid' window larger than the image) every dx is 0 and dy is never
        // read; dx stands in for the empty binding.
        let dy = if dy.is_empty() { dx } else { dy };
        self.launch_windows(AVGPOOL_BWD, s, s.input_len(), &[dy, dx])
    }

    pub(crate) fn max_pool2d_window_impl(
        &self,
        x: &Tensor,
        y: &Tensor,
        s: &Pool2dShape,
    ) -> Result<()> {
        self.launch_windows(MAXPOOL, s, s.output_len(), &[x, y])
    }

    pub(crate) fn max_pool2d_window_backward_impl(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dx: &Tensor,
        s: &Pool2dShape,
    ) -> Result<()> {
        // As in avg_pool2d_backward_impl: with no output, dx stands in for the empty dy.
        let dy = if dy.is_empty() { dx } else { dy };
        self.launch_windows(MAXPOOL_BWD, s, s.input_len(), &[x, dy, dx])
    }

    pub(crate) fn global_pool_impl(
        &self,
        max: bool,
        x: &Tensor,
        y: &Tensor,
        s: &PoolShape,
    ) -> Result<()> {
        let items = s.n * s.c;
        if items == 0 {
            return Ok(());
        }
        let p = PoolingParams::global(s, items);
        let entry = if max { GLOBAL_MAX } else { GLOBAL_AVG };
        self.launch(entry, &p, &[x, y], grid_1d(items, 256))
    }

    pub(crate) fn global_avg_pool_backward_impl(
        &self,
        dy: &Tensor,
        dx: &Tensor,
        s: &PoolShape,
    ) -> Result<()> {
        let items = s.input_len();
        if items == 0 {
            return Ok(());
        }
        let p = PoolingParams::global(s, items);
        self.launch(GLOBAL_AVG_BWD, &p, &[dy, dx], grid_1d(items, 256))
    }

    pub(crate) fn global_max_pool_backward_impl(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dx: &Tensor,
        s: &PoolShape,
    ) -> Result<()> {
        let items = s.n * s.c;
        if s.input_len() == 0 {
            return Ok(());
        }
        let p = PoolingParams::global(s, items);
        self.launch(GLOBAL_MAX_BWD, &p, &[x, dy, dx], grid_1d(items, 256))
    }
}
