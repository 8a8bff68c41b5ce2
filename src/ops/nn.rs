//! The CNN ops: convolutions, pooling, activations, the loss, and optimizer updates, forward and
//! backward, on every device. Layout NHWC, kernels HWIO (Keras), f32.

use crate::error::{Error, Result};
use crate::ops::gpu::{Kernel, ShaderFamily};
use crate::ops::spec::{
    Activation, AdamParams, Conv2dShape, DepthwiseShape, Padding, PoolShape, SgdParams,
};
use crate::ops::{run, with_kernels};
use crate::placement::OpInfo;
use crate::tensor::{DType, Tensor};

/// Kernels of the CNN ops, on one device (see [`crate::ops::Kernels`]). Shapes are validated by
/// the front-ends before these are called; tensors are on the kernel's device.
pub(crate) trait NnKernels {
    /// `y = act(conv2d(x, kernel) + bias)`.
    fn conv2d(
        &self,
        x: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        y: &Tensor,
        s: &Conv2dShape,
        act: Activation,
    ) -> Result<()>;
    /// Gradient w.r.t. the input, from `dz` (w.r.t. the pre-activation output).
    fn conv2d_backward_input(
        &self,
        dz: &Tensor,
        kernel: &Tensor,
        dx: &Tensor,
        s: &Conv2dShape,
    ) -> Result<()>;
    /// Gradient w.r.t. the kernel.
    fn conv2d_backward_kernel(
        &self,
        x: &Tensor,
        dz: &Tensor,
        dk: &Tensor,
        s: &Conv2dShape,
    ) -> Result<()>;
    /// Depthwise 'same' convolution.
    fn depthwise(&self, x: &Tensor, kernel: &Tensor, y: &Tensor, s: &DepthwiseShape) -> Result<()>;
    /// Its gradient w.r.t. the input.
    fn depthwise_backward_input(
        &self,
        dy: &Tensor,
        kernel: &Tensor,
        dx: &Tensor,
        s: &DepthwiseShape,
    ) -> Result<()>;
    /// Its gradient w.r.t. the kernel.
    fn depthwise_backward_kernel(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dk: &Tensor,
        s: &DepthwiseShape,
    ) -> Result<()>;
    /// 2×2 stride-2 max-pool.
    fn maxpool(&self, x: &Tensor, y: &Tensor, s: &PoolShape) -> Result<()>;
    /// Routes each output gradient to the first max of its window.
    fn maxpool_backward(&self, x: &Tensor, dy: &Tensor, dx: &Tensor, s: &PoolShape) -> Result<()>;
    /// `y = act(x)`.
    fn activation(&self, x: &Tensor, y: &Tensor, act: Activation) -> Result<()>;
    /// `dz = dy * act'(z)`, computed from the activation's output `y`.
    fn activation_backward(&self, dy: &Tensor, y: &Tensor, dz: &Tensor, act: Activation)
        -> Result<()>;
    /// Row-wise softmax of `[rows, cols]`.
    fn softmax(&self, logits: &Tensor, probs: &Tensor, rows: usize, cols: usize) -> Result<()>;
    /// Sparse categorical cross-entropy fused with softmax: per-row loss and the gradient of
    /// the mean loss w.r.t. the logits.
    fn softmax_cross_entropy(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        loss: &Tensor,
        dlogits: &Tensor,
        rows: usize,
        cols: usize,
    ) -> Result<()>;
    /// Number of rows whose arg max equals the label, as an f32 in `out[0]`.
    fn accuracy_count(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        out: &Tensor,
        rows: usize,
        cols: usize,
    ) -> Result<()>;
    /// `w -= lr * g`.
    fn sgd(&self, w: &Tensor, g: &Tensor, p: &SgdParams) -> Result<()>;
    /// Keras' momentum / Nesterov update with velocity `v`.
    fn sgd_momentum(&self, w: &Tensor, g: &Tensor, v: &Tensor, p: &SgdParams) -> Result<()>;
    /// Keras' Adam update with moments `m`, `v`.
    fn adam(&self, w: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, p: &AdamParams)
        -> Result<()>;
}
