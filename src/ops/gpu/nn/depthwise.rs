//! The depthwise convolutions on a GPU (`depthwise.wgsl`), forward and gradients, and the fused
//! separable convolution built from a depthwise and a 1×1 convolution.

use bytemuck::{Pod, Zeroable};

use crate::error::Result;
use crate::ops::gpu::grid_1d;
use crate::ops::gpu::kernels::GpuKernels;
use crate::ops::gpu::tune::{bucket, Choice};
use crate::ops::nn_kernels::pointwise_shape;
use crate::ops::spec::ConvGeometry;
use crate::ops::spec::{Activation, DepthwiseShape, PoolShape};
use crate::ops::{
    ConvWeightGrads, Kernels, NnKernels, SeparableBackward, SeparableForward, StemConv,
};
use crate::tensor::Tensor;

use super::cpu_only;
use super::kernel_lists::*;
use super::{channel_lanes, chunking, u, MIN_CHUNK};

/// Mirror of `Params` in depthwise.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Default, Pod, Zeroable)]
struct DepthwiseParams {
    n: u32,
    h: u32,
    w: u32,
    c: u32,
    kh: u32,
    kw: u32,
    pt: u32,
    pl: u32,
    flip: u32,
    wblocks: u32,
    hblocks: u32,
    items: u32,
    chunk: u32,
    total: u32,
    units: u32,
    _pad: u32,
}

impl GpuKernels<'_> {
    /// The depthwise correlation over `s`: the forward pass, or with `flip` the input gradient
    /// (the flipped kernel and the complementary padding).
    fn depthwise_launch(
        &self,
        input: &Tensor,
        kernel: &Tensor,
        out: &Tensor,
        s: &DepthwiseShape,
        flip: bool,
    ) -> Result<()> {
        if s.input_len() == 0 {
            return Ok(());
        }
        let (pt, pl) = s.pad_top_left();
        let (pt, pl) = if flip {
            (s.kh - 1 - pt, s.kw - 1 - pl)
        } else {
            (pt, pl)
        };
        let (v4, c) = channel_lanes(s.c);
        if v4 && s.kh == 3 && s.kw == 3 {
            let class = format!("3x3 c{} p{}", s.c, bucket(s.n * s.h * s.w));
            let mut candidates = vec!["rows4x4"];
            let full_only = self.workgroup_tiles(&mut candidates, &["tile8x8"]);
            let choice =
                Choice::new("depthwise", class, &candidates, "rows4x4").full_only(full_only);
            return self.tuned(choice, &mut |candidate| {
                let tiled = candidate == "tile8x8";
                let side = if tiled { 8 } else { 4 };
                let (wblocks, hblocks) = (s.w.div_ceil(side), s.h.div_ceil(side));
                let blocks = s.n * hblocks * wblocks;
                let p = DepthwiseParams {
                    n: u(s.n),
                    h: u(s.h),
                    w: u(s.w),
                    c: u(c),
                    kh: 3,
                    kw: 3,
                    pt: u(pt),
                    pl: u(pl),
                    flip: u32::from(flip),
                    wblocks: u(wblocks),
                    hblocks: u(hblocks),
                    items: u(blocks * c),
                    ..Default::default()
                };
                let tensors = [input, kernel, out];
                if tiled {
                    let workgroups = blocks * c.div_ceil(8);
                    let grid = grid_1d(workgroups * 64, 64);
                    self.launch(DEPTHWISE3X3_TILE_V4, &p, &tensors, grid)
                } else {
                    self.launch(DEPTHWISE3X3_V4, &p, &tensors, grid_1d(blocks * c, 64))
                }
            });
        }
        let wblocks = s.w.div_ceil(4);
        let hblocks = s.h.div_ceil(4);
        let (kernel_entry, items) = if v4 {
            (DEPTHWISE_V4, s.n * s.h * wblocks * c)
        } else {
            (DEPTHWISE_S, s.n * s.h * wblocks * c)
        };
        let p = DepthwiseParams {
            n: u(s.n),
            h: u(s.h),
            w: u(s.w),
            c: u(c),
            kh: u(s.kh),
            kw: u(s.kw),
            pt: u(pt),
            pl: u(pl),
            flip: u32::from(flip),
            wblocks: u(wblocks),
            hblocks: u(hblocks),
            items: u(items),
            ..Default::default()
        };
        self.launch(kernel_entry, &p, &[input, kernel, out], grid_1d(items, 64))
    }

    /// The depthwise kernel gradient as partial sums sized for `target` invocations.
    fn depthwise_backward_kernel_in(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dk: &Tensor,
        s: &DepthwiseShape,
        target: usize,
    ) -> Result<()> {
        let pixels = s.n * s.h * s.w;
        let (pt, pl) = s.pad_top_left();
        let (v4, c) = channel_lanes(s.c);
        let mut p = DepthwiseParams {
            n: u(s.n),
            h: u(s.h),
            w: u(s.w),
            c: u(c),
            kh: u(s.kh),
            kw: u(s.kw),
            pt: u(pt),
            pl: u(pl),
            ..Default::default()
        };
        let (entry, units, chunk, chunks) = if v4 && s.kh == 3 && s.kw == 3 {
            // Chunks of whole image rows.
            let rows = s.n * s.h;
            let (chunk, chunks) = chunking(target, c, rows, 1);
            p.total = u(rows);
            (DEPTHWISE3X3_DK_V4, c, chunk, chunks)
        } else {
            let units = (s.kh * s.kw).div_ceil(4) * c;
            let (chunk, chunks) = chunking(target, units, pixels, MIN_CHUNK);
            p.total = u(pixels);
            let entry = if v4 { DEPTHWISE_DK_V4 } else { DEPTHWISE_DK_S };
            (entry, units, chunk, chunks)
        };
        let items = units * chunks;
        p.units = u(units);
        p.chunk = u(chunk);
        p.items = u(items);
        self.partial_sums(entry, &p, [x, dy], dk, items, chunks)
    }

    pub(super) fn depthwise_impl(
        &self,
        x: &Tensor,
        kernel: &Tensor,
        y: &Tensor,
        s: &DepthwiseShape,
    ) -> Result<()> {
        if !s.is_same_unit() {
            let g = ConvGeometry::depthwise(s);
            return self.conv_general_forward(x, kernel, None, y, &g, Activation::Linear);
        }
        self.depthwise_launch(x, kernel, y, s, false)
    }

    pub(super) fn depthwise_backward_input_impl(
        &self,
        dy: &Tensor,
        kernel: &Tensor,
        dx: &Tensor,
        s: &DepthwiseShape,
    ) -> Result<()> {
        if !s.is_same_unit() {
            let g = ConvGeometry::depthwise(s);
            return self.conv_general_backward_input(dy, kernel, dx, &g);
        }
        self.depthwise_launch(dy, kernel, dx, s, true)
    }

    pub(super) fn depthwise_backward_kernel_impl(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dk: &Tensor,
        s: &DepthwiseShape,
    ) -> Result<()> {
        if dk.is_empty() {
            return Ok(());
        }
        if !s.is_same_unit() {
            let g = ConvGeometry::depthwise(s);
            return self.conv_general_backward_kernel(x, dy, dk, &g);
        }
        let pixels = s.n * s.h * s.w;
        if pixels == 0 {
            self.clear(dk);
            return Ok(());
        }
        let class = format!(
            "depthwise_dk {}x{} c{} p{}",
            s.kh,
            s.kw,
            s.c,
            bucket(pixels)
        );
        self.tuned_partials(class, &mut |target| {
            self.depthwise_backward_kernel_in(x, dy, dk, s, target)
        })
    }

    pub(super) fn separable_impl(&self, f: &SeparableForward<'_>) -> Result<()> {
        let Some(y) = f.y.filter(|_| f.argmax.is_none()) else {
            return Err(cpu_only("FusedSeparableConv2DMaxPoolWithArgmax"));
        };
        // Unfused: on a GPU each step is its own dispatch anyway.
        let x = match &f.stem {
            Some(stem) => &self.stem_output(f.x, stem, &f.s)?,
            None => f.x,
        };
        let d = self.scratch(x.shape(), x)?;
        self.depthwise(x, f.depthwise, &d, &f.s)?;
        self.conv2d(
            &d,
            f.pointwise,
            f.bias,
            y,
            &pointwise_shape(&f.s, f.filters),
            f.act,
        )?;
        match f.pooled {
            Some(pooled) => self.maxpool(y, pooled, &separable_pool_shape(&f.s, f.filters)),
            None => Ok(()),
        }
    }

    /// The output of a separable convolution's stem: its input `s.input_len()` elements.
    fn stem_output(&self, x0: &Tensor, stem: &StemConv<'_>, s: &DepthwiseShape) -> Result<Tensor> {
        let x = self.scratch(&[s.n, s.h, s.w, s.c], x0)?;
        self.conv2d(x0, stem.kernel, stem.bias, &x, &stem.s, stem.act)?;
        Ok(x)
    }

    pub(super) fn separable_backward_impl(&self, g: &SeparableBackward<'_>) -> Result<()> {
        if g.argmax.is_some() {
            return Err(cpu_only("FusedSeparableConv2DMaxPoolGradWithArgmax"));
        }
        // With a stem: its output recomputed, the gradient of its pre-activation output
        // written where `dx` would be, then its weight gradients from that.
        if let Some((stem, [dk, db])) = &g.stem {
            let x = self.stem_output(g.x, stem, &g.s)?;
            let dz = self.scratch(x.shape(), &x)?;
            let inner = SeparableBackward {
                x: &x,
                dx: Some(&dz),
                input_act: stem.act,
                stem: None,
                ..*g
            };
            self.separable_backward_impl(&inner)?;
            let w = ConvWeightGrads {
                x: g.x,
                y: &x,
                dy: &dz,
                dk,
                db,
                s: stem.s,
                act: Activation::Linear,
            };
            return self.conv2d_backward_weights_impl(&w);
        }
        let d = self.scratch(g.x.shape(), g.x)?;
        self.depthwise(g.x, g.depthwise, &d, &g.s)?;
        // A pooled gradient goes through the max-pool's own gradient first (unfused here).
        let dy = if g.pooled {
            let dy = self.scratch(g.y.shape(), g.y)?;
            let pool = separable_pool_shape(&g.s, g.filters);
            self.maxpool_backward(g.y, g.dy, &dy, &pool)?;
            dy
        } else {
            g.dy.clone()
        };
        let dz = match g.act {
            Activation::Linear => dy,
            act => {
                let dz = self.scratch(g.y.shape(), g.y)?;
                self.activation_backward_impl(&dy, g.y, &dz, act)?;
                dz
            }
        };
        let ps = pointwise_shape(&g.s, g.filters);
        self.sum_rows(&dz, ps.n * ps.h * ps.w, g.filters, g.d_bias)?;
        self.conv2d_backward_kernel(&d, &dz, g.d_pointwise, &ps)?;
        let dd = self.scratch(g.x.shape(), g.x)?;
        self.conv2d_backward_input(&dz, g.pointwise, &dd, &ps)?;
        self.depthwise_backward_kernel(g.x, &dd, g.d_depthwise, &g.s)?;
        if let Some(dx) = g.dx {
            if g.input_act == Activation::Linear {
                self.depthwise_backward_input(&dd, g.depthwise, dx, &g.s)?;
            } else {
                // Unfused here: the input gradient, then the input activation's gradient.
                let plain = self.scratch(g.x.shape(), g.x)?;
                self.depthwise_backward_input(&dd, g.depthwise, &plain, &g.s)?;
                self.activation_backward_impl(&plain, g.x, dx, g.input_act)?;
            }
        }
        Ok(())
    }

    // ---- general convolutions ----
    pub(super) fn depthwise_bias_act_impl(
        &self,
        x: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        y: &Tensor,
        s: &DepthwiseShape,
        act: Activation,
    ) -> Result<()> {
        let g = ConvGeometry::depthwise(s);
        self.conv_general_forward(x, kernel, bias, y, &g, act)
    }
}

/// The 2×2 max-pool of a separable convolution's output of shape `s` with `filters` channels.
fn separable_pool_shape(s: &DepthwiseShape, filters: usize) -> PoolShape {
    PoolShape {
        n: s.n,
        h: s.h,
        w: s.w,
        c: filters,
    }
}
