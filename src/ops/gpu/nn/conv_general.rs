//! The general convolutions of `conv2d_general.wgsl` on a GPU: any groups, strides, dilation
//! and padding, forward and both gradients. A child of `nn.rs`, whose depthwise dispatchers
//! send here the shapes the depthwise kernels do not serve (a multiplier, strides, dilation or
//! 'valid' padding: `DepthwiseShape::is_same_unit`) and every depthwise convolution with a fused
//! bias and activation; a `Conv2D` of any strides takes `conv.rs`'s kernels.

use bytemuck::{Pod, Zeroable};

use super::{chunking, u, GpuKernels, MIN_CHUNK};
use crate::error::Result;
use crate::ops::gpu::{grid_1d, Kernel, ShaderFamily};
use crate::ops::spec::{Activation, ConvGeometry};
use crate::tensor::Tensor;

const fn general(entry: &'static str) -> Kernel {
    Kernel::new(ShaderFamily::Conv2dGeneral, entry)
}

pub(crate) const CONV_GENERAL_FWD: Kernel = general("conv_general_fwd");
pub(crate) const CONV_GENERAL_DX: Kernel = general("conv_general_dx");
pub(crate) const CONV_GENERAL_DK: Kernel = general("conv_general_dk");

/// Mirror of `Params` in conv2d_general.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Default, Pod, Zeroable)]
struct GeneralParams {
    n: u32,
    h: u32,
    w: u32,
    ci: u32,
    co: u32,
    cig: u32,
    cog: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    dh: u32,
    dw: u32,
    pt: u32,
    pl: u32,
    oh: u32,
    ow: u32,
    act: u32,
    has_bias: u32,
    items: u32,
    chunk: u32,
    klen: u32,
    _pad0: u32,
    _pad1: u32,
}

fn params(g: &ConvGeometry) -> GeneralParams {
    GeneralParams {
        n: u(g.n),
        h: u(g.h),
        w: u(g.w),
        ci: u(g.ci),
        co: u(g.co),
        cig: u(g.cig),
        cog: u(g.cog),
        kh: u(g.kh),
        kw: u(g.kw),
        sh: u(g.sh),
        sw: u(g.sw),
        dh: u(g.dh),
        dw: u(g.dw),
        pt: u(g.pt),
        pl: u(g.pl),
        oh: u(g.oh),
        ow: u(g.ow),
        ..Default::default()
    }
}

impl GpuKernels<'_> {
    /// `y = act(conv(x, kernel) + bias)`.
    pub(super) fn conv_general_forward(
        &self,
        x: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        y: &Tensor,
        g: &ConvGeometry,
        act: Activation,
    ) -> Result<()> {
        let items = y.len();
        if items == 0 {
            return Ok(());
        }
        let p = GeneralParams {
            act: act.code(),
            has_bias: u32::from(bias.is_some()),
            items: u(items),
            ..params(g)
        };
        // Without a bias the (unread) bias binding takes the output.
        let b = bias.unwrap_or(y);
        self.launch(CONV_GENERAL_FWD, &p, &[x, kernel, b, y], grid_1d(items, 64))
    }

    /// `dx` from `dz`, the gradient w.r.t. the pre-activation output.
    pub(super) fn conv_general_backward_input(
        &self,
        dz: &Tensor,
        kernel: &Tensor,
        dx: &Tensor,
        g: &ConvGeometry,
    ) -> Result<()> {
        let items = dx.len();
        if items == 0 {
            return Ok(());
        }
        if dz.is_empty() || kernel.is_empty() {
            // Nothing flows back (and the empty tensors have no buffers to bind).
            self.clear(dx);
            return Ok(());
        }
        let p = GeneralParams {
            items: u(items),
            ..params(g)
        };
        self.launch(CONV_GENERAL_DX, &p, &[kernel, dz, dx], grid_1d(items, 64))
    }

    /// `dk` as partial sums over chunks of output pixels, then their sum.
    pub(super) fn conv_general_backward_kernel(
        &self,
        x: &Tensor,
        dz: &Tensor,
        dk: &Tensor,
        g: &ConvGeometry,
    ) -> Result<()> {
        let klen = dk.len();
        if klen == 0 {
            return Ok(());
        }
        let pixels = g.n * g.oh * g.ow;
        if pixels == 0 || x.is_empty() {
            self.clear(dk);
            return Ok(());
        }
        let (chunk, chunks) = chunking(self.partial_target(), klen, pixels, MIN_CHUNK);
        let items = klen * chunks;
        let p = GeneralParams {
            items: u(items),
            chunk: u(chunk),
            klen: u(klen),
            ..params(g)
        };
        self.partial_sums(CONV_GENERAL_DK, &p, [x, dz], dk, items, chunks)
    }
}
