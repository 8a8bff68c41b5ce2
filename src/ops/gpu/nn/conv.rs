//! The convolutions on a GPU (`conv2d.wgsl`), at any strides and dilation: the register-blocked
//! correlation and its variants (workgroup-memory tiles, the uniform window of a one-channel
//! input, the direct kernel), the 1×1 convolution as a product where that is faster, and the
//! kernel gradients as partial sums.

use bytemuck::{Pod, Zeroable};

use crate::device::context::UNIFORM_SCRATCH_BYTES;
use crate::device::logical::GpuRange;
use crate::error::Result;
use crate::ops::gpu::coop::{self, Gather};
use crate::ops::gpu::kernels::GpuKernels;
use crate::ops::gpu::tune::{bucket, Choice};
use crate::ops::gpu::{grid_1d, MAX_GROUPS_PER_DIM};
use crate::ops::spec::ConvGeometry;
use crate::ops::spec::{Activation, Conv2dShape};
use crate::ops::{ConvWeightGrads, Kernels, MatmulDims, NnKernels};
use crate::shader::coop::SPLIT_CANDIDATE;
use crate::tensor::{DType, Tensor};

use super::kernel_lists::*;
use super::{chunking, u, MIN_CHUNK};

/// The two ways of a 1×1 convolution: the convolution kernels, or a matrix product.
const POINTWISE: [&str; 2] = ["direct", "product"];

/// Whether a 1×1 convolution of `s` can run as a matrix product on the vec4 kernels.
fn pointwise_as_product(s: &Conv2dShape) -> bool {
    s.c_out.is_multiple_of(4)
        && s.c_in.is_multiple_of(4)
        && (s.n * s.h * s.w).div_ceil(128) <= MAX_GROUPS_PER_DIM
}

/// The tuner's class of a convolution of any strides and dilation: kernel, channels, strides,
/// dilation and the pixels' bucket.
fn general_class(g: &ConvGeometry) -> String {
    format!(
        "{}x{} {}->{} s{}x{} d{}x{} p{}",
        g.kh,
        g.kw,
        g.ci,
        g.co,
        g.sh,
        g.sw,
        g.dh,
        g.dw,
        bucket(g.n * g.oh * g.ow)
    )
}

/// Mirror of `Params` in conv2d.wgsl. Its default is a stride-1 correlation (strides, dilation
/// and upsampling 1), everything else 0.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct ConvParams {
    n: u32,
    h: u32,
    w: u32,
    ci: u32,
    co: u32,
    kh: u32,
    kw: u32,
    oh: u32,
    ow: u32,
    pt: u32,
    pl: u32,
    act: u32,
    has_bias: u32,
    sh: u32,
    wblocks: u32,
    items: u32,
    chunk: u32,
    pixels: u32,
    taps: u32,
    /// `conv2d_c1_ubo8`'s block of 8 output channels.
    block: u32,
    sw: u32,
    dh: u32,
    dw: u32,
    /// The input seen upsampled by (uh, uw): an input gradient at strides above 1.
    uh: u32,
    uw: u32,
    _pad: [u32; 3],
}

impl Default for ConvParams {
    fn default() -> ConvParams {
        ConvParams {
            sh: 1,
            sw: 1,
            dh: 1,
            dw: 1,
            uh: 1,
            uw: 1,
            ..ConvParams::zeroed()
        }
    }
}

/// One correlation `out[n, i, j, o] = Σ in↑[n, i·sh + a·dh - pt, j·sw + b·dw - pl, c] ·
/// k[a, b, c, o]` between `in` `[n, h, w, ci]` and `out` `[n, oh, ow, co]` of `g` (one group),
/// `in↑` the input seen upsampled by `up` (zeros between its rows and columns): a convolution's
/// forward pass (`up` 1), or its input gradient (`dz` upsampled by the strides, the flipped
/// kernel; [`Gather::input_grad`]). The tensor cores read the same correlation, as a gather.
type Correlation = Gather;

impl Correlation {
    /// The forward pass of convolution `s`.
    fn forward(s: &Conv2dShape) -> Correlation {
        Gather::conv(ConvGeometry::conv(s))
    }

    /// The input gradient of convolution `s`, over the flipped kernel.
    fn of_input_grad(s: &Conv2dShape) -> Correlation {
        Gather::input_grad(&ConvGeometry::conv(s))
    }

    /// Whether strides, dilation and upsampling are all 1.
    fn unit(&self) -> bool {
        let g = &self.g;
        [g.sh, g.sw, g.dh, g.dw, self.up[0], self.up[1]] == [1; 6]
    }

    /// The tuner's class of this correlation: kernel, channels, and the pixels' bucket; then
    /// strides, dilation and upsampling where any is not 1.
    fn class(&self) -> String {
        let g = &self.g;
        let pixels = g.n * g.oh * g.ow;
        let class = format!("{}x{} {}->{} p{}", g.kh, g.kw, g.ci, g.co, bucket(pixels));
        if self.unit() {
            return class;
        }
        let [uh, uw] = self.up;
        let (sh, sw, dh, dw) = (g.sh, g.sw, g.dh, g.dw);
        format!("{class} s{sh}x{sw} d{dh}x{dw} u{uh}x{uw}")
    }

    /// The kernel params of this correlation, with `act` and the bias flag.
    fn params(&self, act: Activation, has_bias: bool) -> ConvParams {
        let g = &self.g;
        ConvParams {
            n: u(g.n),
            h: u(g.h),
            w: u(g.w),
            ci: u(g.ci),
            co: u(g.co),
            kh: u(g.kh),
            kw: u(g.kw),
            oh: u(g.oh),
            ow: u(g.ow),
            pt: u(g.pt),
            pl: u(g.pl),
            sh: u(g.sh),
            sw: u(g.sw),
            dh: u(g.dh),
            dw: u(g.dw),
            uh: u(self.up[0]),
            uw: u(self.up[1]),
            act: act.code(),
            has_bias: u32::from(has_bias),
            ..Default::default()
        }
    }
}

/// Floats of one `conv2d_c1_ubo8` window (9 taps × 8 output channels), and the bytes between
/// windows (a multiple of every adapter's uniform offset alignment, at most 256).
const C1_WINDOW_FLOATS: usize = 9 * 8;
const C1_WINDOW_STRIDE: u64 = 512;

/// The number of `conv2d_c1_ubo8` windows (blocks of 8 output channels) of `g`, or `None`
/// where the kernel does not apply: a 3×3 kernel, one input channel, output channels a
/// multiple of 8, every window in the uniform scratch buffer, strides and dilation 1.
fn c1_windows(c: &Correlation) -> Option<usize> {
    let g = &c.g;
    let blocks = g.co / 8;
    let fits = c.unit()
        && g.ci == 1
        && g.kh == 3
        && g.kw == 3
        && g.co.is_multiple_of(8)
        && blocks > 0
        && blocks as u64 * C1_WINDOW_STRIDE <= UNIFORM_SCRATCH_BYTES;
    fits.then_some(blocks)
}

impl GpuKernels<'_> {
    /// Runs `out = act(correlate(input, kernel) + bias)`: when `co` is a multiple of 4, tuned
    /// between `conv2d_v4` and the workgroup-memory `conv2d_smem_v4`, `conv2d_s` otherwise,
    /// and for float16 against the tensor cores too (an implicit product, `coop/gather.rs`).
    fn correlate(
        &self,
        c: &Correlation,
        input: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        act: Activation,
    ) -> Result<()> {
        let g = &c.g;
        let v4 = g.co.is_multiple_of(4);
        let pixels = g.n * g.oh * g.ow;
        // (A stride-1 1×1 correlation is already tuned against the products, workgroup tiles
        // included.)
        let pointwise = g.kh * g.kw == 1 && c.unit();
        let tiled = v4 && !pointwise && pixels.div_ceil(64) <= MAX_GROUPS_PER_DIM && pixels > 0;
        let coop = if pointwise {
            Vec::new()
        } else {
            self.coop_conv_candidates((input, kernel, bias, out), c)?
        };
        if tiled || !coop.is_empty() {
            let mut candidates = vec!["direct"];
            // Its uniform windows hold float32 weights: no float16 twin.
            if tiled && c1_windows(c).is_some() && input.dtype() == DType::F32 {
                candidates.push("ubo_c1");
            }
            candidates.extend(coop);
            let full_only = if tiled {
                self.workgroup_tiles(&mut candidates, &["smem64"])
            } else {
                &[]
            };
            let choice =
                Choice::new("conv2d", c.class(), &candidates, "direct").full_only(full_only);
            return self.tuned(choice, &mut |candidate| {
                if coop::is_candidate(candidate) {
                    self.conv_coop(candidate, input, kernel, bias, out, c, act)
                } else if candidate == "smem64" && tiled {
                    self.correlate_smem(c, input, kernel, bias, out, act)
                } else if candidate == "ubo_c1" {
                    self.correlate_c1_ubo8(c, input, kernel, bias, out, act)
                } else {
                    self.correlate_direct(c, input, kernel, bias, out, act)
                }
            });
        }
        self.correlate_direct(c, input, kernel, bias, out, act)
    }

    /// [`GpuKernels::correlate`] by `conv2d_smem_v4`: an implicit product on workgroup-memory
    /// tiles (co a multiple of 4).
    fn correlate_smem(
        &self,
        c: &Correlation,
        input: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        act: Activation,
    ) -> Result<()> {
        let (g, p) = (&c.g, c.params(act, bias.is_some()));
        let grid = [u(g.co.div_ceil(64)), u((g.n * g.oh * g.ow).div_ceil(64)), 1];
        // Without a bias the (unread) bias binding takes the output.
        let b = bias.unwrap_or(out);
        self.launch(CONV2D_SMEM_V4, &p, &[input, kernel, b, out], grid)
    }

    /// [`GpuKernels::correlate`] by `conv2d_c1_ubo8` (a 3×3 kernel on one input channel, see
    /// [`c1_windows`]): the kernel packed into uniform windows of 8 output channels, then one
    /// dispatch per window.
    fn correlate_c1_ubo8(
        &self,
        c: &Correlation,
        input: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        act: Activation,
    ) -> Result<()> {
        let Some(blocks) = c1_windows(c) else {
            // Only offered where it applies; a forced pick elsewhere runs the direct kernels.
            return self.correlate_direct(c, input, kernel, bias, out, act);
        };
        let g = &c.g;
        let b = bias.unwrap_or(out);
        let bytes = blocks as u64 * C1_WINDOW_STRIDE;
        self.with_uniform_windows(
            [input, kernel, b, out],
            bytes,
            |[input, kernel, b, out], packed| {
                let taps = blocks * C1_WINDOW_FLOATS;
                let pack = ConvParams {
                    co: u(g.co),
                    items: u(taps),
                    ..Default::default()
                };
                self.launch_ranges(CONV2D_C1_PACK, &pack, &[kernel, packed], grid_1d(taps, 256))?;
                // Two neighbouring pixels per invocation.
                let wpairs = g.ow.div_ceil(2);
                let items = g.n * g.oh * wpairs;
                for block in 0..blocks {
                    let window = GpuRange {
                        offset: block as u64 * C1_WINDOW_STRIDE,
                        size: (C1_WINDOW_FLOATS * 4) as u64,
                        ..packed
                    };
                    let p = ConvParams {
                        wblocks: u(wpairs),
                        items: u(items),
                        block: u(block),
                        ..c.params(act, bias.is_some())
                    };
                    let ranges = [input, b, out, window];
                    self.launch_ranges(CONV2D_C1_UBO8, &p, &ranges, grid_1d(items, 64))?;
                }
                Ok(())
            },
        )
    }

    /// [`GpuKernels::correlate`] by the register-blocked direct kernels.
    fn correlate_direct(
        &self,
        c: &Correlation,
        input: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        act: Activation,
    ) -> Result<()> {
        let g = &c.g;
        let v4 = g.co.is_multiple_of(4);
        // Output pixels per invocation along a row, and output channels per invocation.
        let (width, channels, entry) = if v4 {
            (4, 32, CONV2D_V4)
        } else {
            (4, 4, CONV2D_S)
        };
        // Over an upsampled input each block takes one phase of the columns (conv2d.wgsl's
        // `block_of`).
        let uw = c.up[1];
        let wblocks = uw * g.ow.div_ceil(uw).div_ceil(width);
        let items = g.n * g.oh * wblocks;
        let p = ConvParams {
            wblocks: u(wblocks),
            items: u(items),
            ..c.params(act, bias.is_some())
        };
        let [gx, gy, _] = grid_1d(items, 64);
        let gz = u(g.co.div_ceil(channels));
        // Without a bias the (unread) bias binding takes the output.
        let b = bias.unwrap_or(out);
        self.launch(entry, &p, &[input, kernel, b, out], [gx, gy, gz])
    }

    /// A convolution by `correlate` (the direct kernels).
    fn conv2d_direct(
        &self,
        x: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        y: &Tensor,
        s: &Conv2dShape,
        act: Activation,
    ) -> Result<()> {
        let g = Correlation::forward(s);
        // No input channels: x and the kernel have no buffers and the tap loops do not run;
        // bind the output in their place.
        let xin = if x.is_empty() { y } else { x };
        let kin = if kernel.is_empty() { y } else { kernel };
        self.correlate(&g, xin, kin, bias, y, act)
    }

    /// The kernel gradient as partial sums over chunks of pixels sized for `target`
    /// invocations, then their sum.
    fn conv2d_backward_kernel_in(
        &self,
        x: &Tensor,
        dz: &Tensor,
        dk: &Tensor,
        s: &Conv2dShape,
        target: usize,
    ) -> Result<()> {
        let (oh, ow) = s.out_hw();
        let pixels = s.n * oh * ow;
        let taps = s.kh * s.kw * s.c_in;
        let pointwise = s.kh == 1 && s.kw == 1 && s.is_unit_stride();
        if pointwise && s.c_in.is_multiple_of(16) && s.c_out.is_multiple_of(8) {
            // A plain xᵀ · dz over the pixels: no taps to compute, all loads vec4; 8 or 16
            // output channels per unit (conv2d_dk_1x1, conv2d_dk_1x1_16).
            let run = |wide: bool| -> Result<()> {
                let units = (s.c_in / 16) * (s.c_out / if wide { 16 } else { 8 });
                let (chunk, chunks) = chunking(target, units, pixels, MIN_CHUNK);
                let p = ConvParams {
                    ci: u(s.c_in),
                    co: u(s.c_out),
                    items: u(units * chunks),
                    chunk: u(chunk),
                    pixels: u(pixels),
                    ..Default::default()
                };
                let entry = if wide {
                    CONV2D_DK_1X1_16
                } else {
                    CONV2D_DK_1X1
                };
                self.partial_sums(entry, &p, [x, dz], dk, units * chunks, chunks)
            };
            // xᵀ · dz as a product over the pixels ([pixels, c_in] read transposed): on the
            // tensor cores for float16, split over the pixels into float32 sums.
            let product = MatmulDims {
                m: s.c_in,
                k: pixels,
                n: s.c_out,
                trans_a: true,
                trans_b: false,
            };
            let mut candidates = vec!["co8"];
            if s.c_out.is_multiple_of(16) {
                candidates.push("co16");
            }
            if self.coop_split_offered((x, dz), product)? {
                candidates.push(SPLIT_CANDIDATE);
            }
            if candidates.len() == 1 {
                return run(false);
            }
            // Software adapters load lane by lane: twice the channels per unit is 8 loads per
            // pixel for 256 products instead of 6 for 128 (lavapipe: 12-17% faster). GPUs want
            // the invocations.
            let class = format!("1x1 {}->{} p{}", s.c_in, s.c_out, bucket(pixels));
            let heuristic = if self.dev.ctx.software_kernels && s.c_out.is_multiple_of(16) {
                "co16"
            } else {
                "co8"
            };
            let choice = Choice::new("conv_dk_1x1", class, &candidates, heuristic);
            return self.tuned(choice, &mut |c| match c {
                SPLIT_CANDIDATE => self.coop_split_sum((x, dz), dk, product),
                c => run(c == "co16"),
            });
        }
        let v4 = s.c_out.is_multiple_of(4);
        let obs = if v4 {
            (s.c_out / 4).div_ceil(4)
        } else {
            s.c_out.div_ceil(4)
        };
        // Flattened taps per unit: all 9 in conv2d_dk9_v4, 8 in conv2d_dk_v4, 4 in conv2d_dk_s.
        let nine = v4 && taps == 9;
        let per_unit = match (v4, nine) {
            (true, true) => 9,
            (true, false) => 8,
            _ => 4,
        };
        let units = taps.div_ceil(per_unit) * obs;
        let (chunk, chunks) = chunking(target, units, pixels, MIN_CHUNK);
        let items = units * chunks;
        let p = ConvParams {
            items: u(items),
            chunk: u(chunk),
            pixels: u(pixels),
            taps: u(taps),
            ..Correlation::forward(s).params(Activation::Linear, false)
        };
        let entry = match (v4, nine) {
            (true, true) => CONV2D_DK9_V4,
            (true, false) => CONV2D_DK_V4,
            _ => CONV2D_DK_S,
        };
        self.partial_sums(entry, &p, [x, dz], dk, items, chunks)
    }

    /// The untuned choice for a 1×1 convolution: as a matrix product on software adapters
    /// once the output channels fill `matmul_16x8`'s 64-column tiles. Measured on lavapipe at
    /// batch 128, ms (1×1 convolution kernel → matrix product): 28×28 32→32 31 → 40, 14×14
    /// 32→64 16.8 → 10.7, 14×14 64→64 29 → 17, 7×7 64→128 10.2 → 6.2, 7×7 128→128 30 → 16.
    fn pointwise_heuristic(&self, s: &Conv2dShape) -> &'static str {
        if self.dev.ctx.software_kernels && s.c_out >= 64 {
            "product"
        } else {
            "direct"
        }
    }

    pub(super) fn conv2d_impl(
        &self,
        x: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        y: &Tensor,
        s: &Conv2dShape,
        act: Activation,
    ) -> Result<()> {
        if s.output_len() == 0 {
            return Ok(());
        }
        if s.kh == 1 && s.kw == 1 && s.is_unit_stride() && pointwise_as_product(s) {
            // A 1×1 convolution is the product [n·h·w, c_in] · [c_in, c_out].
            let dims = MatmulDims {
                m: s.n * s.h * s.w,
                k: s.c_in,
                n: s.c_out,
                trans_a: false,
                trans_b: false,
            };
            let class = format!("fwd {}x{}x{}", bucket(dims.m), s.c_in, s.c_out);
            let heuristic = self.pointwise_heuristic(s);
            return self.tuned(
                Choice::new("pointwise_conv", class, &POINTWISE, heuristic),
                &mut |c| {
                    if c == "product" {
                        self.matmul(x, kernel, bias, y, dims, act)
                    } else {
                        self.conv2d_direct(x, kernel, bias, y, s, act)
                    }
                },
            );
        }
        self.conv2d_direct(x, kernel, bias, y, s, act)
    }

    pub(super) fn conv2d_backward_input_impl(
        &self,
        dz: &Tensor,
        kernel: &Tensor,
        dx: &Tensor,
        s: &Conv2dShape,
    ) -> Result<()> {
        if s.input_len() == 0 {
            return Ok(());
        }
        if dz.is_empty() || kernel.is_empty() {
            // No output pixels or no output channels: nothing flows back.
            self.clear(dx);
            return Ok(());
        }
        // dx is the correlation of dz, upsampled by the strides, with the flipped kernel and
        // the complementary padding.
        let kt = self.flipped_kernel(kernel, s)?;
        let transposed = Conv2dShape {
            c_in: s.c_out,
            c_out: s.c_in,
            ..*s
        };
        let g = Correlation::of_input_grad(s);
        if s.kh == 1 && s.kw == 1 && s.is_unit_stride() && pointwise_as_product(&transposed) {
            // For a 1×1 kernel, kt is the transposed kernel [c_out, c_in]: dx = dz · kt, the
            // forward case of a 1×1 convolution with the channel counts swapped.
            let dims = MatmulDims {
                m: s.n * s.h * s.w,
                k: s.c_out,
                n: s.c_in,
                trans_a: false,
                trans_b: false,
            };
            let class = format!("dx {}x{}x{}", bucket(dims.m), s.c_out, s.c_in);
            let heuristic = self.pointwise_heuristic(&transposed);
            return self.tuned(
                Choice::new("pointwise_conv", class, &POINTWISE, heuristic),
                &mut |c| {
                    if c == "product" {
                        self.matmul(dz, &kt, None, dx, dims, Activation::Linear)
                    } else {
                        self.correlate(&g, dz, &kt, None, dx, Activation::Linear)
                    }
                },
            );
        }
        self.correlate(&g, dz, &kt, None, dx, Activation::Linear)
    }

    /// `kt[a, b, o, c] = kernel[kh-1-a, kw-1-b, c, o]` (`conv2d_flip`, into scratch): the
    /// kernel of the correlation that gives a convolution's input gradient.
    fn flipped_kernel(&self, kernel: &Tensor, s: &Conv2dShape) -> Result<Tensor> {
        let kt = self.scratch(&[s.kh, s.kw, s.c_out, s.c_in], kernel)?;
        let items = s.kernel_len();
        let p = ConvParams {
            ci: u(s.c_in),
            co: u(s.c_out),
            kh: u(s.kh),
            kw: u(s.kw),
            items: u(items),
            ..Default::default()
        };
        self.launch(CONV2D_FLIP, &p, &[kernel, &kt], grid_1d(items, 256))?;
        Ok(kt)
    }

    pub(super) fn conv2d_backward_kernel_impl(
        &self,
        x: &Tensor,
        dz: &Tensor,
        dk: &Tensor,
        s: &Conv2dShape,
    ) -> Result<()> {
        if dk.is_empty() {
            return Ok(());
        }
        let g = ConvGeometry::conv(s);
        let pixels = s.n * g.oh * g.ow;
        // (A 1×1 kernel gradient has its own tensor-core candidate among its partial sums.)
        let pointwise = s.kh == 1 && s.kw == 1 && s.is_unit_stride();
        if pixels > 0 && !pointwise && self.coop_conv_dk_offered((x, dz), &g)? {
            let candidates = ["partials", SPLIT_CANDIDATE];
            let choice = Choice::new("conv_dk_coop", general_class(&g), &candidates, "partials");
            return self.tuned(choice, &mut |c| {
                if c == SPLIT_CANDIDATE {
                    self.coop_conv_dk(x, dz, dk, &g)
                } else {
                    self.conv2d_backward_kernel_partials(x, dz, dk, s)
                }
            });
        }
        self.conv2d_backward_kernel_partials(x, dz, dk, s)
    }

    /// The kernel gradient as partial sums over chunks of pixels, then their sum.
    fn conv2d_backward_kernel_partials(
        &self,
        x: &Tensor,
        dz: &Tensor,
        dk: &Tensor,
        s: &Conv2dShape,
    ) -> Result<()> {
        let (oh, ow) = s.out_hw();
        let pixels = s.n * oh * ow;
        if pixels == 0 {
            self.clear(dk);
            return Ok(());
        }
        let forward = Correlation::forward(s);
        let class = format!("conv_dk {}", forward.class());
        self.tuned_partials(class, &mut |target| {
            self.conv2d_backward_kernel_in(x, dz, dk, s, target)
        })
    }

    pub(super) fn conv2d_backward_weights_impl(&self, g: &ConvWeightGrads<'_>) -> Result<()> {
        let (oh, ow) = g.s.out_hw();
        let rows = g.s.n * oh * ow;
        let dz = match g.act {
            Activation::Linear => {
                if g.s.c_out > 0 {
                    self.sum_rows(g.dy, rows, g.s.c_out, g.db)?;
                }
                g.dy.clone()
            }
            act => {
                let dz = self.scratch(g.y.shape(), g.y)?;
                if g.s.c_out > 0 {
                    let dims = (rows, g.s.c_out);
                    self.activation_bias_grad_impl(g.dy, g.y, &dz, g.db, dims, act)?;
                }
                dz
            }
        };
        self.conv2d_backward_kernel(g.x, &dz, g.dk, &g.s)
    }
}
