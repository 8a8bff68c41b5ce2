//! [`NnKernels`] on a GPU: the WGSL of `conv2d.wgsl`, `depthwise.wgsl`, `pool.wgsl`,
//! `softmax.wgsl` and `optim.wgsl`, plus the general kernels of [`super::kernels`] (activations,
//! `sum_rows` for the partial sums of the kernel gradients).
//!
//! Each method packs a `#[repr(C)]` mirror of its shader's `Params`, picks the entry point (the
//! `_v4` ones read and write `vec4<f32>` views and need channel counts that are multiples of 4),
//! and records one dispatch (two or three with the partial-sum reduction). Nothing waits.
//! The `pub(crate) const` lists say which kernels each op may dispatch, for placement.
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

use bytemuck::{Pod, Zeroable};

use crate::device::context::UNIFORM_SCRATCH_BYTES;
use crate::device::logical::GpuRange;
use crate::error::Result;
use crate::ops::gpu::kernels::{self as gk, GpuKernels};
use crate::ops::gpu::tune::{bucket, Choice};
use crate::ops::gpu::{grid_1d, row_chunk, Kernel, ShaderFamily, MAX_GROUPS_PER_DIM};
use crate::ops::nn_kernels::{pointwise_shape, unfused_maxpool_activation_bias_grad};
use crate::ops::spec::{Activation, AdamParams, Conv2dShape, DepthwiseShape, PoolShape, SgdParams};
use crate::ops::spec::{ActivationFn, Pool2dShape};
use crate::ops::spec::{ClipMode, RmspropParams};
use crate::ops::{
    ConvWeightGrads, DenseGrads, Kernels, MatmulDims, NnKernels, SeparableBackward,
    SeparableForward,
};
use crate::tensor::{DType, Tensor};

// ---- general (strided, dilated, grouped) convolutions ----
#[path = "conv_general.rs"]
mod conv_general;
use crate::ops::spec::ConvGeometry;
use conv_general::{CONV_GENERAL_DK, CONV_GENERAL_DX, CONV_GENERAL_FWD};

const fn conv(entry: &'static str) -> Kernel {
    Kernel::new(ShaderFamily::Conv2d, entry)
}
const fn dw(entry: &'static str) -> Kernel {
    Kernel::new(ShaderFamily::Depthwise, entry)
}
const fn pool(entry: &'static str) -> Kernel {
    Kernel::new(ShaderFamily::Pool, entry)
}
const fn sm(entry: &'static str) -> Kernel {
    Kernel::new(ShaderFamily::Softmax, entry)
}
const fn opt(entry: &'static str) -> Kernel {
    Kernel::new(ShaderFamily::Optim, entry)
}

pub(crate) const CONV2D_S: Kernel = conv("conv2d_s");
pub(crate) const CONV2D_V4: Kernel = conv("conv2d_v4");
pub(crate) const CONV2D_C1_UBO8: Kernel = conv("conv2d_c1_ubo8");
pub(crate) const CONV2D_C1_PACK: Kernel = conv("conv2d_c1_pack");
pub(crate) const CONV2D_SMEM_V4: Kernel = conv("conv2d_smem_v4");
pub(crate) const CONV2D_FLIP: Kernel = conv("conv2d_flip");
pub(crate) const CONV2D_DK_S: Kernel = conv("conv2d_dk_s");
pub(crate) const CONV2D_DK_V4: Kernel = conv("conv2d_dk_v4");
pub(crate) const CONV2D_DK9_V4: Kernel = conv("conv2d_dk9_v4");
pub(crate) const CONV2D_DK_1X1_16: Kernel = conv("conv2d_dk_1x1_16");
pub(crate) const CONV2D_DK_1X1: Kernel = conv("conv2d_dk_1x1");
pub(crate) const DEPTHWISE_S: Kernel = dw("depthwise_s");
pub(crate) const DEPTHWISE_V4: Kernel = dw("depthwise_v4");
pub(crate) const DEPTHWISE3X3_V4: Kernel = dw("depthwise3x3_v4");
pub(crate) const DEPTHWISE3X3_TILE_V4: Kernel = dw("depthwise3x3_tile_v4");
pub(crate) const DEPTHWISE_DK_S: Kernel = dw("depthwise_dk_s");
pub(crate) const DEPTHWISE_DK_V4: Kernel = dw("depthwise_dk_v4");
pub(crate) const DEPTHWISE3X3_DK_V4: Kernel = dw("depthwise3x3_dk_v4");
pub(crate) const MAXPOOL_S: Kernel = pool("maxpool_s");
pub(crate) const MAXPOOL_V4: Kernel = pool("maxpool_v4");
pub(crate) const MAXPOOL_BWD_S: Kernel = pool("maxpool_bwd_s");
pub(crate) const MAXPOOL_BWD_V4: Kernel = pool("maxpool_bwd_v4");
pub(crate) const MAXPOOL_ACT_GRAD_SUM_V4: Kernel = pool("maxpool_act_grad_sum_v4");
pub(crate) const SOFTMAX_ROWS: Kernel = sm("softmax_rows");
pub(crate) const SOFTMAX_XENT: Kernel = sm("softmax_xent");
pub(crate) const ACCURACY: Kernel = sm("accuracy");
pub(crate) const SGD: Kernel = opt("sgd");
pub(crate) const SGD_MOMENTUM: Kernel = opt("sgd_momentum");
pub(crate) const ADAM: Kernel = opt("adam");
// ---- RMSprop, weight decay, gradient clipping ----
pub(crate) const RMSPROP: Kernel = opt("rmsprop");
pub(crate) const RMSPROP_MOMENTUM: Kernel = opt("rmsprop_momentum");
pub(crate) const RMSPROP_CENTERED: Kernel = opt("rmsprop_centered");
pub(crate) const RMSPROP_CENTERED_MOMENTUM: Kernel = opt("rmsprop_centered_momentum");
pub(crate) const MOMENTUM_APPLY: Kernel = opt("momentum_apply");
pub(crate) const WEIGHT_DECAY: Kernel = opt("weight_decay");
pub(crate) const CLIP_NORM: Kernel = opt("clip_norm");
pub(crate) const CLIP_VALUE: Kernel = opt("clip_value");

/// Kernels of `Conv2D`.
pub(crate) const CONV2D: &[Kernel] = &[
    CONV_GENERAL_FWD,
    CONV2D_S,
    CONV2D_V4,
    CONV2D_C1_UBO8,
    CONV2D_C1_PACK,
    CONV2D_SMEM_V4,
    gk::MATMUL_16X8,
    gk::MATMUL_UBO8,
    gk::PACK_B8,
    gk::MATERIALIZE,
];
/// Kernels of `Conv2DBackpropInput`.
/// (1×1 kernels with 64+ input channels on software adapters: the product on the flipped
/// kernel.)
pub(crate) const CONV2D_BACKWARD_INPUT: &[Kernel] = &[
    CONV_GENERAL_DX,
    CONV2D_FLIP,
    CONV2D_S,
    CONV2D_V4,
    CONV2D_C1_UBO8,
    CONV2D_C1_PACK,
    CONV2D_SMEM_V4,
    gk::MATMUL_16X8,
    gk::MATMUL_UBO8,
    gk::PACK_B8,
    gk::MATERIALIZE,
];
/// Kernels of `Conv2DBackpropFilter` (partial sums, then `sum_rows`).
pub(crate) const CONV2D_BACKWARD_KERNEL: &[Kernel] = &[
    CONV_GENERAL_DK,
    CONV2D_DK_S,
    CONV2D_DK_V4,
    CONV2D_DK9_V4,
    CONV2D_DK_1X1_16,
    CONV2D_DK_1X1,
    gk::SUM_ROWS,
    gk::SUM_ROWS_V4,
    gk::SUM_ROWS_WG,
];
/// Kernels of `FusedConv2DWeightGrad`: the activation gradient with the bias', then the
/// kernel's.
pub(crate) const CONV2D_BACKWARD_WEIGHTS: &[Kernel] = &[
    gk::ACTIVATION_BACKWARD,
    gk::ACTIVATION_BACKWARD_V4,
    gk::ACT_GRAD_SUM_ROWS_V4,
    CONV_GENERAL_DK,
    CONV2D_DK_S,
    CONV2D_DK_V4,
    CONV2D_DK9_V4,
    CONV2D_DK_1X1_16,
    CONV2D_DK_1X1,
    gk::SUM_ROWS,
    gk::SUM_ROWS_V4,
    gk::SUM_ROWS_WG,
];
/// Kernels of `BiasAddGrad`.
pub(crate) const BIAS_GRAD: &[Kernel] = &[gk::SUM_ROWS, gk::SUM_ROWS_V4, gk::SUM_ROWS_WG];
/// Kernels of `FusedActivationBiasGrad`: fused, or the activation gradient and `BiasAddGrad`.
pub(crate) const ACTIVATION_BIAS_GRAD: &[Kernel] = &[
    gk::ACT_GRAD_SUM_ROWS_V4,
    gk::ACTIVATION_BACKWARD,
    gk::ACTIVATION_BACKWARD_V4,
    gk::SUM_ROWS,
    gk::SUM_ROWS_V4,
    gk::SUM_ROWS_WG,
];
/// Kernels of `FusedDenseGrad`: the activation gradient and its column sums, two products.
pub(crate) const DENSE_BACKWARD: &[Kernel] = &[
    gk::ACTIVATION_BACKWARD,
    gk::ACTIVATION_BACKWARD_V4,
    gk::ACT_GRAD_SUM_ROWS_V4,
    gk::SUM_ROWS,
    gk::SUM_ROWS_V4,
    gk::SUM_ROWS_WG,
    gk::MATMUL,
    gk::MATMUL_TALL,
    gk::MATMUL_V4,
    gk::MATMUL_16X8,
    gk::MATMUL_V4_SPLITK,
    gk::MATMUL_SMEM_V4,
    gk::MATMUL_SMEM128_V4,
    gk::MATMUL_UBO8,
    gk::PACK_B8,
    gk::MATERIALIZE,
    gk::MATMUL_SPLITK,
    gk::SPLITK_REDUCE,
    gk::SPLITK_REDUCE_V4,
];
/// Kernels of `DepthwiseConv2dNative` (and of its input gradient, the same correlation, or
/// `conv_general_dx` for the general shapes).
pub(crate) const DEPTHWISE: &[Kernel] = &[
    CONV_GENERAL_FWD,
    CONV_GENERAL_DX,
    DEPTHWISE_S,
    DEPTHWISE_V4,
    DEPTHWISE3X3_V4,
    DEPTHWISE3X3_TILE_V4,
];
/// Kernels of `DepthwiseConv2dNativeBackpropFilter`.
pub(crate) const DEPTHWISE_BACKWARD_KERNEL: &[Kernel] = &[
    CONV_GENERAL_DK,
    DEPTHWISE_DK_S,
    DEPTHWISE_DK_V4,
    DEPTHWISE3X3_DK_V4,
    gk::SUM_ROWS,
    gk::SUM_ROWS_V4,
    gk::SUM_ROWS_WG,
];
/// Kernels of `FusedSeparableConv2D`: the depthwise and the 1×1 convolution, unfused.
pub(crate) const SEPARABLE: &[Kernel] = &[
    DEPTHWISE_S,
    DEPTHWISE_V4,
    DEPTHWISE3X3_V4,
    DEPTHWISE3X3_TILE_V4,
    CONV2D_S,
    CONV2D_V4,
    CONV2D_C1_UBO8,
    CONV2D_C1_PACK,
    CONV2D_SMEM_V4,
    gk::MATMUL_16X8,
    gk::MATMUL_UBO8,
    gk::PACK_B8,
    gk::MATERIALIZE,
];
/// The kernels of `FusedSeparableConv2DGrad` after `$extra`: the forward depthwise again, the
/// activation gradient, the 1×1 convolution's and the depthwise convolution's gradients.
macro_rules! separable_backward_kernels {
    ($($extra:expr),*) => {
        &[
            $($extra,)*
            DEPTHWISE_S,
            DEPTHWISE_V4,
            DEPTHWISE3X3_V4,
            DEPTHWISE3X3_TILE_V4,
            gk::ACTIVATION_BACKWARD,
            gk::ACTIVATION_BACKWARD_V4,
            gk::SUM_ROWS,
            gk::SUM_ROWS_V4,
            gk::SUM_ROWS_WG,
            CONV2D_DK_S,
            CONV2D_DK_V4,
            CONV2D_DK9_V4,
            CONV2D_DK_1X1_16,
            CONV2D_DK_1X1,
            CONV2D_FLIP,
            CONV2D_S,
            CONV2D_V4,
            CONV2D_C1_UBO8,
            CONV2D_C1_PACK,
            CONV2D_SMEM_V4,
            gk::MATMUL_16X8,
            gk::MATMUL_UBO8,
            gk::PACK_B8,
            gk::MATERIALIZE,
            DEPTHWISE_DK_S,
            DEPTHWISE_DK_V4,
            DEPTHWISE3X3_DK_V4,
        ]
    };
}
/// Kernels of `FusedSeparableConv2DGrad`.
pub(crate) const SEPARABLE_BACKWARD: &[Kernel] = separable_backward_kernels!();
/// Kernels of `FusedSeparableConv2DMaxPoolGrad`: the max-pool's gradient, then those of
/// `FusedSeparableConv2DGrad`.
pub(crate) const SEPARABLE_MAX_POOL_BACKWARD: &[Kernel] =
    separable_backward_kernels!(MAXPOOL_BWD_S, MAXPOOL_BWD_V4);
/// Kernels of `MaxPool`.
pub(crate) const MAXPOOL: &[Kernel] = &[MAXPOOL_S, MAXPOOL_V4];
/// Kernels of `MaxPoolGrad`.
pub(crate) const MAXPOOL_BACKWARD: &[Kernel] = &[MAXPOOL_BWD_S, MAXPOOL_BWD_V4];
/// Kernels of `FusedMaxPoolActivationBiasGrad` (the fused pass, or the max-pool's gradient
/// then the activation's and the bias's).
pub(crate) const MAXPOOL_ACTIVATION_BIAS_GRAD: &[Kernel] = &[
    MAXPOOL_ACT_GRAD_SUM_V4,
    MAXPOOL_BWD_S,
    MAXPOOL_BWD_V4,
    gk::ACT_GRAD_SUM_ROWS_V4,
    gk::ACTIVATION_BACKWARD,
    gk::ACTIVATION_BACKWARD_V4,
    gk::SUM_ROWS,
    gk::SUM_ROWS_V4,
    gk::SUM_ROWS_WG,
];
/// Kernels of `Relu` / `Selu` / `Identity`.
pub(crate) const ACTIVATION: &[Kernel] = &[gk::ACTIVATION];
/// Kernels of `ReluGrad` / `SeluGrad`.
pub(crate) const ACTIVATION_BACKWARD: &[Kernel] =
    &[gk::ACTIVATION_BACKWARD, gk::ACTIVATION_BACKWARD_V4];
/// Kernels of `Softmax`.
pub(crate) const SOFTMAX: &[Kernel] = &[SOFTMAX_ROWS];
/// Kernels of `SparseSoftmaxCrossEntropyWithLogits`.
pub(crate) const SPARSE_XENT: &[Kernel] = &[SOFTMAX_XENT];
/// Kernels of `AccuracyCount`.
pub(crate) const ACCURACY_COUNT: &[Kernel] = &[ACCURACY];
/// Kernels of `ResourceApplyGradientDescent`.
pub(crate) const SGD_UPDATE: &[Kernel] = &[SGD];
/// Kernels of `ResourceApplyKerasMomentum`.
pub(crate) const MOMENTUM_UPDATE: &[Kernel] = &[SGD_MOMENTUM];
/// Kernels of `ResourceApplyAdam`.
pub(crate) const ADAM_UPDATE: &[Kernel] = &[ADAM];
/// Kernels of `ResourceApplyRMSProp` / `ResourceApplyCenteredRMSProp`.
pub(crate) const RMSPROP_UPDATE: &[Kernel] = &[
    RMSPROP,
    RMSPROP_MOMENTUM,
    RMSPROP_CENTERED,
    RMSPROP_CENTERED_MOMENTUM,
    MOMENTUM_APPLY,
];
/// Kernels of the decoupled weight decay.
pub(crate) const WEIGHT_DECAY_UPDATE: &[Kernel] = &[WEIGHT_DECAY];
/// Kernels of `ClipByNorm` / `ClipByValue`.
pub(crate) const CLIP: &[Kernel] = &[CLIP_NORM, CLIP_VALUE];

/// Invocations a partial-sum pass aims for on a GPU: enough to fill it, few enough that the
/// partials stay small.
const PARTIAL_TARGET: usize = 32_768;
/// The same on a software adapter, whose few cores are busy with a few dozen workgroups: more
/// chunks would only add partials to write and sum (the 1×1 kernel gradient at 7×7×128→128,
/// batch 128, on lavapipe: 31-35 ms with 32,768, 10-15 ms with 2,048; the depthwise kernel
/// gradients gain about a third).
const SOFTWARE_PARTIAL_TARGET: usize = 2_048;
/// The two ways of a 1×1 convolution: the convolution kernels, or a matrix product.
const POINTWISE: [&str; 2] = ["direct", "product"];

/// Whether a 1×1 convolution of `s` can run as a matrix product on the vec4 kernels.
fn pointwise_as_product(s: &Conv2dShape) -> bool {
    s.c_out.is_multiple_of(4)
        && s.c_in.is_multiple_of(4)
        && (s.n * s.h * s.w).div_ceil(128) <= MAX_GROUPS_PER_DIM
}

/// Fewest pixels (or image rows for the 3×3 depthwise filter gradient) one partial sums.
const MIN_CHUNK: usize = 32;

fn u(x: usize) -> u32 {
    // Shapes on a GPU are bounded by max_storage_buffer_binding_size (< 4 GiB), so every
    // element count and index fits in u32.
    x as u32
}

/// Mirror of `Params` in conv2d.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Default, Pod, Zeroable)]
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
    _pad0: u32,
    wblocks: u32,
    items: u32,
    chunk: u32,
    pixels: u32,
    taps: u32,
    /// `conv2d_c1_ubo8`'s block of 8 output channels.
    block: u32,
}

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
    chunk: u32,
    windows: u32,
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

/// Windows one invocation of `maxpool_act_grad_sum_v4` walks (lengthened past 65,535 chunks).
const POOL_GRAD_CHUNK: usize = 256;

/// Mirror of `Params` in softmax.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct SoftmaxParams {
    rows: u32,
    cols: u32,
    nan_bits: u32,
    inv_rows: f32,
}

/// Mirror of `Params` in optim.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Default, Pod, Zeroable)]
struct OptimParams {
    n: u32,
    lr: f32,
    momentum: f32,
    nesterov: u32,
    alpha: f32,
    one_minus_b1: f32,
    one_minus_b2: f32,
    eps: f32,
    rho: f32,
    one_minus_rho: f32,
    wd: f32,
    clip: f32,
    inverse_clip: f32,
    mode: u32,
    pad0: u32,
    pad1: u32,
}

/// The most positions one invocation of a partial-sum kernel loops over: Mesa's software
/// adapters silently cut a shader loop short after about 65,000 iterations.
const MAX_CHUNK: usize = 32_768;

/// How a reduction over `total` positions is cut for `units` independent sums, aiming for
/// `target` invocations: `(chunk, chunks)`, `chunk` positions per partial, at most
/// [`MAX_CHUNK`].
fn chunking(target: usize, units: usize, total: usize, min_chunk: usize) -> (usize, usize) {
    let max_chunks = total.div_ceil(min_chunk).max(1);
    let chunks = target
        .div_ceil(units.max(1))
        .clamp(1, max_chunks)
        .max(total.div_ceil(MAX_CHUNK));
    let chunk = total.div_ceil(chunks).max(1);
    (chunk, total.div_ceil(chunk).max(1))
}

/// One stride-1 correlation `out[n, i, j, o] = Σ in[n, i + a - pt, j + b - pl, c] · k[a, b, c, o]`
/// between `in` `[n, h, w, ci]` and `out` `[n, oh, ow, co]`.
struct Correlation {
    n: usize,
    h: usize,
    w: usize,
    ci: usize,
    co: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    pt: usize,
    pl: usize,
}

impl Correlation {
    /// The kernel params of this correlation, with `act` and the bias flag.
    fn params(&self, act: Activation, has_bias: bool) -> ConvParams {
        ConvParams {
            n: u(self.n),
            h: u(self.h),
            w: u(self.w),
            ci: u(self.ci),
            co: u(self.co),
            kh: u(self.kh),
            kw: u(self.kw),
            oh: u(self.oh),
            ow: u(self.ow),
            pt: u(self.pt),
            pl: u(self.pl),
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
/// multiple of 8, and every window in the uniform scratch buffer.
fn c1_windows(g: &Correlation) -> Option<usize> {
    let blocks = g.co / 8;
    let fits = g.ci == 1
        && g.kh == 3
        && g.kw == 3
        && g.co.is_multiple_of(8)
        && blocks > 0
        && blocks as u64 * C1_WINDOW_STRIDE <= UNIFORM_SCRATCH_BYTES;
    fits.then_some(blocks)
}

impl GpuKernels<'_> {
    /// Runs `out = act(correlate(input, kernel) + bias)`: when `co` is a multiple of 4, tuned
    /// between `conv2d_v4` and the workgroup-memory `conv2d_smem_v4`; `conv2d_s` otherwise.
    fn correlate(
        &self,
        g: &Correlation,
        input: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        act: Activation,
    ) -> Result<()> {
        let v4 = g.co.is_multiple_of(4);
        let pixels = g.n * g.oh * g.ow;
        // (A 1×1 correlation is already tuned against the products, workgroup tiles included.)
        let pointwise = g.kh * g.kw == 1;
        if v4 && !pointwise && pixels.div_ceil(64) <= MAX_GROUPS_PER_DIM && pixels > 0 {
            let class = format!("{}x{} {}->{} p{}", g.kh, g.kw, g.ci, g.co, bucket(pixels));
            let mut candidates = vec!["direct"];
            // Its uniform windows hold float32 weights: no float16 twin.
            if c1_windows(g).is_some() && input.dtype() == DType::F32 {
                candidates.push("ubo_c1");
            }
            let full_only = self.workgroup_tiles(&mut candidates, &["smem64"]);
            let choice = Choice::new("conv2d", class, &candidates, "direct").full_only(full_only);
            return self.tuned(choice, &mut |candidate| {
                if candidate == "smem64" {
                    self.correlate_smem(g, input, kernel, bias, out, act)
                } else if candidate == "ubo_c1" {
                    self.correlate_c1_ubo8(g, input, kernel, bias, out, act)
                } else {
                    self.correlate_direct(g, input, kernel, bias, out, act)
                }
            });
        }
        self.correlate_direct(g, input, kernel, bias, out, act)
    }

    /// [`GpuKernels::correlate`] by `conv2d_smem_v4`: an implicit product on workgroup-memory
    /// tiles (co a multiple of 4).
    fn correlate_smem(
        &self,
        g: &Correlation,
        input: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        act: Activation,
    ) -> Result<()> {
        let p = g.params(act, bias.is_some());
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
        g: &Correlation,
        input: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        act: Activation,
    ) -> Result<()> {
        let Some(blocks) = c1_windows(g) else {
            // Only offered where it applies; a forced pick elsewhere runs the direct kernels.
            return self.correlate_direct(g, input, kernel, bias, out, act);
        };
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
                        ..g.params(act, bias.is_some())
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
        g: &Correlation,
        input: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        act: Activation,
    ) -> Result<()> {
        let v4 = g.co.is_multiple_of(4);
        // Output pixels per invocation along a row, and output channels per invocation.
        let (width, channels, entry) = if v4 {
            (4, 32, CONV2D_V4)
        } else {
            (4, 4, CONV2D_S)
        };
        let wblocks = g.ow.div_ceil(width);
        let items = g.n * g.oh * wblocks;
        let p = ConvParams {
            wblocks: u(wblocks),
            items: u(items),
            ..g.params(act, bias.is_some())
        };
        let [gx, gy, _] = grid_1d(items, 64);
        let gz = u(g.co.div_ceil(channels));
        // Without a bias the (unread) bias binding takes the output.
        let b = bias.unwrap_or(out);
        self.launch(entry, &p, &[input, kernel, b, out], [gx, gy, gz])
    }

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
}

impl GpuKernels<'_> {
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
        let (oh, ow) = s.out_hw();
        let (pt, pl) = s.pad_top_left();
        let g = Correlation {
            n: s.n,
            h: s.h,
            w: s.w,
            ci: s.c_in,
            co: s.c_out,
            kh: s.kh,
            kw: s.kw,
            oh,
            ow,
            pt,
            pl,
        };
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
        let (pt, pl) = s.pad_top_left();
        let taps = s.kh * s.kw * s.c_in;
        if s.kh == 1 && s.kw == 1 && s.c_in.is_multiple_of(16) && s.c_out.is_multiple_of(8) {
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
            if !s.c_out.is_multiple_of(16) {
                return run(false);
            }
            // Software adapters load lane by lane: twice the channels per unit is 8 loads per
            // pixel for 256 products instead of 6 for 128 (lavapipe: 12-17% faster). GPUs want
            // the invocations.
            let class = format!("1x1 {}->{} p{}", s.c_in, s.c_out, bucket(pixels));
            let heuristic = if self.dev.ctx.software_kernels {
                "co16"
            } else {
                "co8"
            };
            let choice = Choice::new("conv_dk_1x1", class, &["co8", "co16"], heuristic);
            return self.tuned(choice, &mut |c| run(c == "co16"));
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
            n: u(s.n),
            h: u(s.h),
            w: u(s.w),
            ci: u(s.c_in),
            co: u(s.c_out),
            kh: u(s.kh),
            kw: u(s.kw),
            oh: u(oh),
            ow: u(ow),
            pt: u(pt),
            pl: u(pl),
            items: u(items),
            chunk: u(chunk),
            pixels: u(pixels),
            taps: u(taps),
            ..Default::default()
        };
        let entry = match (v4, nine) {
            (true, true) => CONV2D_DK9_V4,
            (true, false) => CONV2D_DK_V4,
            _ => CONV2D_DK_S,
        };
        self.partial_sums(entry, &p, [x, dz], dk, items, chunks)
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
        if s.output_len() == 0 {
            return Ok(());
        }
        if !s.is_unit_stride() {
            let g = ConvGeometry::conv(s);
            return self.conv_general_forward(x, kernel, bias, y, &g, act);
        }
        if s.kh == 1 && s.kw == 1 && pointwise_as_product(s) {
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

    fn conv2d_backward_input(
        &self,
        dz: &Tensor,
        kernel: &Tensor,
        dx: &Tensor,
        s: &Conv2dShape,
    ) -> Result<()> {
        if s.input_len() == 0 {
            return Ok(());
        }
        if !s.is_unit_stride() {
            return self.conv_general_backward_input(dz, kernel, dx, &ConvGeometry::conv(s));
        }
        if dz.is_empty() || kernel.is_empty() {
            // No output pixels or no output channels: nothing flows back.
            self.clear(dx);
            return Ok(());
        }
        let (oh, ow) = s.out_hw();
        let (pt, pl) = s.pad_top_left();
        // kt[a, b, o, c] = kernel[kh-1-a, kw-1-b, c, o]: dx is the forward correlation of dz
        // with kt and the complementary padding.
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
        let transposed = Conv2dShape {
            c_in: s.c_out,
            c_out: s.c_in,
            ..*s
        };
        let g = Correlation {
            n: s.n,
            h: oh,
            w: ow,
            ci: s.c_out,
            co: s.c_in,
            kh: s.kh,
            kw: s.kw,
            oh: s.h,
            ow: s.w,
            pt: s.kh - 1 - pt,
            pl: s.kw - 1 - pl,
        };
        if s.kh == 1 && s.kw == 1 && pointwise_as_product(&transposed) {
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

    fn conv2d_backward_kernel(
        &self,
        x: &Tensor,
        dz: &Tensor,
        dk: &Tensor,
        s: &Conv2dShape,
    ) -> Result<()> {
        if dk.is_empty() {
            return Ok(());
        }
        if !s.is_unit_stride() {
            return self.conv_general_backward_kernel(x, dz, dk, &ConvGeometry::conv(s));
        }
        let (oh, ow) = s.out_hw();
        let pixels = s.n * oh * ow;
        if pixels == 0 {
            self.clear(dk);
            return Ok(());
        }
        let class = format!(
            "conv_dk {}x{} {}->{} p{}",
            s.kh,
            s.kw,
            s.c_in,
            s.c_out,
            bucket(pixels)
        );
        self.tuned_partials(class, &mut |target| {
            self.conv2d_backward_kernel_in(x, dz, dk, s, target)
        })
    }

    fn depthwise(&self, x: &Tensor, kernel: &Tensor, y: &Tensor, s: &DepthwiseShape) -> Result<()> {
        if !s.is_same_unit() {
            let g = ConvGeometry::depthwise(s);
            return self.conv_general_forward(x, kernel, None, y, &g, Activation::Linear);
        }
        self.depthwise_launch(x, kernel, y, s, false)
    }

    fn depthwise_backward_input(
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

    fn depthwise_backward_kernel(
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

    fn maxpool(&self, x: &Tensor, y: &Tensor, s: &PoolShape) -> Result<()> {
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

    fn maxpool_backward(&self, x: &Tensor, dy: &Tensor, dx: &Tensor, s: &PoolShape) -> Result<()> {
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

    fn maxpool_activation_bias_grad(
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
        // Partial sums in float32 (the bias sums are `kept_f32`), one rounding at the end.
        self.float32_sums(db, |db| {
            let windows = s.n * s.h.div_ceil(2) * s.w.div_ceil(2);
            let chunk = row_chunk(windows, POOL_GRAD_CHUNK);
            let chunks = windows.div_ceil(chunk);
            let partials = if chunks == 1 {
                db.clone()
            } else {
                self.scratch(&[chunks, s.c], db)?
            };
            let p = PoolParams {
                act: act.code(),
                chunk: u(chunk),
                windows: u(windows),
                ..PoolParams::shape(s, c)
            };
            // Every window is partial when dpooled is empty; it is never read then.
            let dpooled = if dpooled.is_empty() { dz } else { dpooled };
            let grid = [u(c.div_ceil(64)), u(chunks), 1];
            self.launch(
                MAXPOOL_ACT_GRAD_SUM_V4,
                &p,
                &[y, dpooled, dz, &partials],
                grid,
            )?;
            if chunks > 1 {
                self.sum_rows(&partials, chunks, s.c, db)?;
            }
            Ok(())
        })
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
        // Unfused: on a GPU each step is its own dispatch anyway.
        let d = self.scratch(f.x.shape(), f.x)?;
        self.depthwise(f.x, f.depthwise, &d, &f.s)?;
        self.conv2d(
            &d,
            f.pointwise,
            f.bias,
            f.y,
            &pointwise_shape(&f.s, f.filters),
            f.act,
        )
    }

    fn separable_backward(&self, g: &SeparableBackward<'_>) -> Result<()> {
        let d = self.scratch(g.x.shape(), g.x)?;
        self.depthwise(g.x, g.depthwise, &d, &g.s)?;
        // A pooled gradient goes through the max-pool's own gradient first (unfused here).
        let dy = if g.pooled {
            let dy = self.scratch(g.y.shape(), g.y)?;
            let pool = PoolShape {
                n: g.s.n,
                h: g.s.h,
                w: g.s.w,
                c: g.filters,
            };
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
            self.depthwise_backward_input(&dd, g.depthwise, dx, &g.s)?;
        }
        Ok(())
    }

    // ---- batch normalization and dropout (`ops::gpu::norm`) ----
    fn batch_norm(&self, a: &crate::ops::nn_kernels::BatchNormArgs<'_>) -> Result<()> {
        self.batch_norm_impl(a)
    }

    fn batch_norm_backward(&self, g: &crate::ops::nn_kernels::BatchNormGradArgs<'_>) -> Result<()> {
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
        let g = ConvGeometry::depthwise(s);
        self.conv_general_forward(x, kernel, bias, y, &g, act)
    }

    fn conv2d_backward_weights(&self, g: &ConvWeightGrads<'_>) -> Result<()> {
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

    fn softmax_cross_entropy(
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

    fn accuracy_count(
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
        let n = w.len();
        if n == 0 {
            return Ok(());
        }
        let params = OptimParams {
            n: u(n),
            lr: p.lr,
            ..Default::default()
        };
        self.launch(SGD, &params, &[w, g], grid_1d(n, 256))
    }

    fn sgd_momentum(&self, w: &Tensor, g: &Tensor, v: &Tensor, p: &SgdParams) -> Result<()> {
        let n = w.len();
        if n == 0 {
            return Ok(());
        }
        let params = OptimParams {
            n: u(n),
            lr: p.lr,
            momentum: p.momentum,
            nesterov: u32::from(p.nesterov),
            ..Default::default()
        };
        self.launch(SGD_MOMENTUM, &params, &[w, g, v], grid_1d(n, 256))
    }

    fn adam(&self, w: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, p: &AdamParams) -> Result<()> {
        let n = w.len();
        if n == 0 {
            return Ok(());
        }
        // The bias correction in f64, as the CPU kernel and Keras compute it.
        let t = i32::try_from(p.step).unwrap_or(i32::MAX);
        let (b1, b2) = (f64::from(p.beta1), f64::from(p.beta2));
        let alpha = f64::from(p.lr) * (1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t));
        let params = OptimParams {
            n: u(n),
            lr: p.lr,
            alpha: alpha as f32,
            one_minus_b1: 1.0 - p.beta1,
            one_minus_b2: 1.0 - p.beta2,
            eps: p.epsilon,
            ..Default::default()
        };
        self.launch(ADAM, &params, &[w, g, m, v], grid_1d(n, 256))
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

    // ---- RMSprop, weight decay, gradient clipping ----

    fn rmsprop(
        &self,
        w: &Tensor,
        g: &Tensor,
        v: &Tensor,
        average: Option<&Tensor>,
        momentum: Option<&Tensor>,
        p: &RmspropParams,
    ) -> Result<()> {
        let n = w.len();
        if n == 0 {
            return Ok(());
        }
        let params = OptimParams {
            n: u(n),
            lr: p.lr,
            momentum: p.momentum,
            eps: p.epsilon,
            rho: p.rho,
            one_minus_rho: (1.0 - f64::from(p.rho)) as f32,
            ..Default::default()
        };
        let grid = grid_1d(n, 256);
        match (average, momentum) {
            (None, None) => self.launch(RMSPROP, &params, &[w, g, v], grid),
            (None, Some(s)) => self.launch(RMSPROP_MOMENTUM, &params, &[w, g, v, s], grid),
            (Some(a), None) => self.launch(RMSPROP_CENTERED, &params, &[w, g, a, v], grid),
            (Some(a), Some(s)) => {
                self.launch(RMSPROP_CENTERED_MOMENTUM, &params, &[g, a, v, s], grid)?;
                self.launch(MOMENTUM_APPLY, &params, &[w, s], grid)
            }
        }
    }

    fn weight_decay(&self, w: &Tensor, wd: f32, lr: f32) -> Result<()> {
        let n = w.len();
        if n == 0 {
            return Ok(());
        }
        let params = OptimParams {
            n: u(n),
            lr,
            wd,
            ..Default::default()
        };
        self.launch(WEIGHT_DECAY, &params, &[w], grid_1d(n, 256))
    }

    fn clip(
        &self,
        g: &Tensor,
        sum_squares: Option<&Tensor>,
        out: &Tensor,
        mode: ClipMode,
    ) -> Result<()> {
        let n = g.len();
        if n == 0 {
            return Ok(());
        }
        let (clip, global) = match mode {
            ClipMode::Norm(c) => (c, false),
            ClipMode::GlobalNorm(c) => (c, true),
            ClipMode::Value(c) => (c, false),
        };
        let params = OptimParams {
            n: u(n),
            clip,
            inverse_clip: (1.0 / f64::from(clip)) as f32,
            mode: u32::from(global),
            ..Default::default()
        };
        let grid = grid_1d(n, 256);
        match (mode, sum_squares) {
            (ClipMode::Value(_), _) => self.launch(CLIP_VALUE, &params, &[out, g], grid),
            (_, Some(ss)) => self.launch(CLIP_NORM, &params, &[out, g, ss], grid),
            (_, None) => Err(crate::error::Error::InvalidArgument(
                "ClipByNorm: no sum of squares to take the norm of".into(),
            )),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
