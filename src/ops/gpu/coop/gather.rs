//! k×k convolutions as implicit products on the tensor cores: A is the im2col matrix of the
//! NHWC image (or its transpose, for the kernel gradient), gathered in the kernels' loads, so no
//! im2col buffer is written.

use super::{launch_shape, split_slices, CoopParams, Work, SPLIT_MIN_K};
use crate::error::{Error, Result};
use crate::ops::gpu::kernels::GpuKernels;
use crate::ops::gpu::MAX_GROUPS_PER_DIM;
use crate::ops::spec::{Activation, ConvGeometry};
use crate::ops::Kernels;
use crate::ops::MatmulDims;
use crate::shader::coop::{Candidate, CANDIDATES};
use crate::tensor::{DType, Tensor};

/// What A is in a convolution on the tensor cores (`conv` in matmul_coop.wgsl's Params).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum ConvMode {
    /// The im2col matrix `[pixels, taps]` of the input: the forward product with the kernel
    /// `[taps, co]`.
    Forward = 1,
    /// Its transpose `[taps, pixels]`: the kernel gradient's product with dz `[pixels, co]`.
    KernelGrad = 2,
}

/// The correlation a gathered A reads (matmul_coop.wgsl's `load_a_gathered`): `g`'s image
/// `[n, h, w, ci]`, its `oh × ow` outputs, kernel, strides, dilation and padding, the image
/// seen upsampled by `up` (zeros between its rows and columns; 1 for a plain convolution).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gather {
    pub(crate) g: ConvGeometry,
    pub(crate) up: [usize; 2],
}

impl Gather {
    /// The convolution `g` itself.
    pub(crate) fn conv(g: ConvGeometry) -> Gather {
        Gather { g, up: [1, 1] }
    }

    /// The input gradient of convolution `g`, `dx = correlate(up(dz), kt)`: the
    /// correlation of `dz` upsampled by the strides with `kt[a, b, o, c] = kernel[kh-1-a,
    /// kw-1-b, c, o]` (`conv2d_flip`'s), at stride 1, the same dilation, and the padding that
    /// puts tap `a` of input row `i` on `dz`'s row `(i + pt - (kh-1-a)·dh) / sh` when that
    /// divides.
    pub(crate) fn input_grad(g: &ConvGeometry) -> Gather {
        let up = [g.sh, g.sw];
        let g = ConvGeometry {
            h: g.oh,
            w: g.ow,
            ci: g.co,
            co: g.ci,
            // (Swapped, so that a grouped convolution's stays unfit for the kernels.)
            cig: g.cog,
            cog: g.cig,
            sh: 1,
            sw: 1,
            pt: (g.kh - 1) * g.dh - g.pt,
            pl: (g.kw - 1) * g.dw - g.pl,
            oh: g.h,
            ow: g.w,
            ..*g
        };
        Gather { g, up }
    }
}

impl CoopParams {
    /// These params with A gathered as `mode` of `gather`.
    pub(super) fn gathering(self, mode: ConvMode, gather: &Gather) -> CoopParams {
        let Gather { g, up } = gather;
        let u = |x: usize| x as u32;
        CoopParams {
            // Neighbouring invocations along the taps (channels innermost in the image):
            // along k for the forward matrix, along m for its transpose (load_a).
            a_rs: 0,
            a_cs: u32::from(mode == ConvMode::Forward),
            conv: mode as u32,
            h: u(g.h),
            w: u(g.w),
            ci: u(g.ci),
            kw: u(g.kw),
            oh: u(g.oh),
            ow: u(g.ow),
            sh: u(g.sh),
            sw: u(g.sw),
            dh: u(g.dh),
            dw: u(g.dw),
            pt: u(g.pt),
            pl: u(g.pl),
            uh: u(up[0]),
            uw: u(up[1]),
            ..self
        }
    }
}

/// The product a convolution `g` (one group) is in `mode`: the forward pass's
/// `[pixels, taps] · [taps, co]`, or the kernel gradient's `[taps, pixels] · [pixels, co]`.
pub(super) fn conv_dims(g: &ConvGeometry, mode: ConvMode) -> MatmulDims {
    let (pixels, taps) = (g.n * g.oh * g.ow, g.kh * g.kw * g.ci);
    match mode {
        ConvMode::Forward => MatmulDims {
            m: pixels,
            k: taps,
            n: g.co,
            trans_a: false,
            trans_b: false,
        },
        ConvMode::KernelGrad => MatmulDims {
            m: taps,
            k: pixels,
            n: g.co,
            trans_a: true,
            trans_b: false,
        },
    }
}

/// Whether candidate `c` takes the forward pass of convolution `g`: not the split one; the
/// vec4 ones where the channels (in and out) are multiples of 4 (a vec4 of the image is then
/// one tap's channels), the scalar ones elsewhere; a 32-column tile only for 32 output
/// channels or fewer.
pub(super) fn conv_applies(c: &Candidate, g: &ConvGeometry) -> bool {
    let v4 = g.ci.is_multiple_of(4) && g.co.is_multiple_of(4);
    !c.split && c.v4 == v4 && (c.cols == 64 || g.co <= c.cols)
}

/// Whether a convolution `g` goes to the tensor cores at all: one group, and taps enough to
/// fill a step of k (a one-channel 3×3 convolution would multiply mostly zeros).
pub(super) fn conv_fits(g: &ConvGeometry) -> bool {
    g.cig == g.ci && g.cog == g.co && g.kh * g.kw * g.ci >= 32 && g.co > 0 && g.n * g.oh * g.ow > 0
}

impl GpuKernels<'_> {
    /// The tensor-core candidates for the forward pass of convolution `g`, `y = act(conv(x,
    /// kernel) + bias)` as the implicit product of its im2col matrix and the kernel: float16
    /// tensors, one group and taps enough ([`conv_fits`]), the candidates that take it whose
    /// self-check passed.
    pub(crate) fn coop_conv_candidates(
        &self,
        (x, kernel, bias, y): (&Tensor, &Tensor, Option<&Tensor>, &Tensor),
        gather: &Gather,
    ) -> Result<Vec<&'static str>> {
        let g = &gather.g;
        let half = [Some(x), Some(kernel), bias, Some(y)]
            .into_iter()
            .flatten()
            .all(|t| t.dtype() == DType::F16);
        if !half || !conv_fits(g) {
            return Ok(Vec::new());
        }
        self.coop_passing(
            &self.dev.ctx.coop,
            y.device_handle(),
            Work::Convolutions,
            &|c| conv_applies(c, g),
        )
    }

    /// `y = act(conv(x, kernel) + bias)` (convolution `g`, float16 tensors) by candidate
    /// `name`, where [`coop_conv_candidates`](Self::coop_conv_candidates) offers it.
    #[allow(clippy::too_many_arguments)] // a convolution's operands, geometry and activation
    pub(crate) fn conv_coop(
        &self,
        name: &str,
        x: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        y: &Tensor,
        gather: &Gather,
        act: Activation,
    ) -> Result<()> {
        let g = &gather.g;
        let Some(&c) = CANDIDATES
            .iter()
            .find(|c| c.name == name && conv_applies(c, g) && conv_fits(g))
        else {
            return Err(Error::Unsupported {
                op: "Conv2D",
                device: self.name.to_string(),
                missing: format!(
                    "the tensor-core kernel {name} for a {}x{} convolution of {} to {} channels \
                     in {} group(s)",
                    g.kh,
                    g.kw,
                    g.ci,
                    g.co,
                    g.ci / g.cig.max(1)
                ),
            });
        };
        let d = conv_dims(g, ConvMode::Forward);
        let (p, grid) = launch_shape(d, bias.is_some(), act, (c.rows, c.cols));
        let p = p.gathering(ConvMode::Forward, gather);
        let b = bias.unwrap_or(y);
        if c.v4 {
            self.launch(c.kernel, &p, &[b, y, x, kernel], grid)
        } else {
            self.launch(c.kernel, &p, &[x, kernel, b, y], grid)
        }
    }

    /// Whether the kernel gradient of convolution `g` is offered on the tensor cores
    /// ([`coop_conv_dk`](Self::coop_conv_dk)): float16 `x` and `dz`, one group and taps
    /// enough, pixels enough to split, and the split candidate's self-check passed.
    pub(crate) fn coop_conv_dk_offered(
        &self,
        (x, dz): (&Tensor, &Tensor),
        g: &ConvGeometry,
    ) -> Result<bool> {
        let half = x.dtype() == DType::F16 && dz.dtype() == DType::F16;
        let d = conv_dims(g, ConvMode::KernelGrad);
        if !half || !conv_fits(g) || d.k < SPLIT_MIN_K || d.m.div_ceil(64) > MAX_GROUPS_PER_DIM {
            return Ok(false);
        }
        let support = &self.dev.ctx.coop;
        let offered =
            self.coop_passing(support, x.device_handle(), Work::Convolutions, &|c| c.split)?;
        Ok(!offered.is_empty())
    }

    /// The kernel gradient `dk = im2col(x)ᵀ · dz` of convolution `g` (`dk` `[kh, kw, ci, co]`
    /// of either float dtype) on the tensor cores, split over the pixels, the slices added up
    /// by a column sum.
    pub(crate) fn coop_conv_dk(
        &self,
        x: &Tensor,
        dz: &Tensor,
        dk: &Tensor,
        g: &ConvGeometry,
    ) -> Result<()> {
        let d = conv_dims(g, ConvMode::KernelGrad);
        let (k_slice, _) = split_slices(d);
        let (partials, splits) = self.coop_split(x, dz, d, k_slice, Some(g))?;
        self.sum_rows(&partials, splits, d.m * d.n, dk)
    }
}
