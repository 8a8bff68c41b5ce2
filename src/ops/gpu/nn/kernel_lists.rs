//! The entry points of the CNN shaders and, per op, the kernels it may dispatch (the lists
//! placement checks an adapter against).

use super::conv_general::{CONV_GENERAL_DK, CONV_GENERAL_DX, CONV_GENERAL_FWD};
use crate::ops::gpu::kernels as gk;
use crate::ops::gpu::{Kernel, ShaderFamily};

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
// ---- fused optimizer update ----
pub(crate) const FUSED_UPDATE: Kernel = opt("fused_update");
pub(crate) const FUSED_UPDATE_REGIONS: Kernel = opt("fused_update_regions");
// ---- loss scaling on the device ----
pub(crate) const FINITE_CHECK: Kernel = opt("finite_check");
pub(crate) const FUSED_UPDATE_LS: Kernel = opt("fused_update_ls");
pub(crate) const FUSED_UPDATE_LS_REGIONS: Kernel = opt("fused_update_ls_regions");
pub(crate) const LOSS_SCALE_SEED: Kernel = opt("loss_scale_seed");
pub(crate) const LOSS_SCALE_ADVANCE: Kernel = opt("loss_scale_advance");
pub(crate) const LOSS_SCALE_UNSCALE: Kernel = opt("loss_scale_unscale");

/// Kernels of `Conv2D`.
pub(crate) const CONV2D: &[Kernel] = &[
    CONV2D_S,
    CONV2D_V4,
    CONV2D_C1_UBO8,
    CONV2D_C1_PACK,
    CONV2D_SMEM_V4,
    gk::MATMUL_16X8,
    gk::MATMUL_16X4,
    gk::MATMUL_UBO8,
    gk::PACK_B8,
    gk::MATERIALIZE,
];
/// Kernels of `Conv2DBackpropInput`.
/// (1×1 kernels with 64+ input channels on software adapters: the product on the flipped
/// kernel.)
pub(crate) const CONV2D_BACKWARD_INPUT: &[Kernel] = &[
    CONV2D_FLIP,
    CONV2D_S,
    CONV2D_V4,
    CONV2D_C1_UBO8,
    CONV2D_C1_PACK,
    CONV2D_SMEM_V4,
    gk::MATMUL_16X8,
    gk::MATMUL_16X4,
    gk::MATMUL_UBO8,
    gk::PACK_B8,
    gk::MATERIALIZE,
];
/// Kernels of `Conv2DBackpropFilter` (partial sums, then `sum_rows`).
pub(crate) const CONV2D_BACKWARD_KERNEL: &[Kernel] = &[
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
    gk::MATMUL_16X4,
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
/// The kernels of `FusedSeparableConv2D` and then `$extra`: the depthwise and the 1×1
/// convolution, unfused.
macro_rules! separable_kernels {
    ($($extra:expr),*) => {
        &[
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
            gk::MATMUL_16X4,
            gk::MATMUL_UBO8,
            gk::PACK_B8,
            gk::MATERIALIZE,
            $($extra,)*
        ]
    };
}
/// Kernels of `FusedSeparableConv2D`.
pub(crate) const SEPARABLE: &[Kernel] = separable_kernels!();
/// Kernels of `FusedSeparableConv2DMaxPool`: those of `FusedSeparableConv2D`, then the pool's.
pub(crate) const SEPARABLE_MAX_POOL: &[Kernel] = separable_kernels!(MAXPOOL_S, MAXPOOL_V4);
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
            gk::MATMUL_16X4,
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
/// Kernels of `FusedApplyGradients` (every variable of a step in one dispatch).
pub(crate) const FUSED_APPLY: &[Kernel] = &[FUSED_UPDATE, FUSED_UPDATE_REGIONS];
// ---- loss scaling on the device ----
/// Kernels of the fused update under loss scaling decided on the device.
pub(crate) const FUSED_APPLY_SCALED: &[Kernel] = &[FUSED_UPDATE_LS, FUSED_UPDATE_LS_REGIONS];
/// Kernels of the finiteness check over a fused update's gradients.
pub(crate) const LOSS_SCALE_CHECK: &[Kernel] = &[FINITE_CHECK];
/// Kernels of the loss gradient's seed.
pub(crate) const LOSS_SCALE_SEED_KERNELS: &[Kernel] = &[LOSS_SCALE_SEED];
/// Kernels of unscaling a gradient by the device's scale.
pub(crate) const LOSS_SCALE_UNSCALE_KERNELS: &[Kernel] = &[LOSS_SCALE_UNSCALE];
/// Kernels of Keras' loss-scale rules.
pub(crate) const LOSS_SCALE_UPDATE: &[Kernel] = &[LOSS_SCALE_ADVANCE];
