//! PLACEHOLDER (being replaced by the WGSL CNN kernels): every CNN op reports that this device
//! has no kernel for it, so placement runs it on the CPU.

use crate::error::{Error, Result};
use crate::ops::gpu::kernels::GpuKernels;
use crate::ops::spec::*;
use crate::ops::NnKernels;
use crate::tensor::Tensor;

impl GpuKernels<'_> {
    fn none(&self, op: &'static str) -> Result<()> {
        Err(Error::Unsupported { op, device: self.name.to_string(), missing: "no GPU kernel".into() })
    }
}

#[allow(unused_variables)]
impl NnKernels for GpuKernels<'_> {
    fn conv2d(&self, x: &Tensor, kernel: &Tensor, bias: Option<&Tensor>, y: &Tensor, s: &Conv2dShape, act: Activation) -> Result<()> { self.none("Conv2D") }
    fn conv2d_backward_input(&self, dz: &Tensor, kernel: &Tensor, dx: &Tensor, s: &Conv2dShape) -> Result<()> { self.none("Conv2DBackpropInput") }
    fn conv2d_backward_kernel(&self, x: &Tensor, dz: &Tensor, dk: &Tensor, s: &Conv2dShape) -> Result<()> { self.none("Conv2DBackpropFilter") }
    fn depthwise(&self, x: &Tensor, kernel: &Tensor, y: &Tensor, s: &DepthwiseShape) -> Result<()> { self.none("DepthwiseConv2dNative") }
    fn depthwise_backward_input(&self, dy: &Tensor, kernel: &Tensor, dx: &Tensor, s: &DepthwiseShape) -> Result<()> { self.none("x") }
    fn depthwise_backward_kernel(&self, x: &Tensor, dy: &Tensor, dk: &Tensor, s: &DepthwiseShape) -> Result<()> { self.none("x") }
    fn maxpool(&self, x: &Tensor, y: &Tensor, s: &PoolShape) -> Result<()> { self.none("x") }
    fn maxpool_backward(&self, x: &Tensor, dy: &Tensor, dx: &Tensor, s: &PoolShape) -> Result<()> { self.none("x") }
    fn activation(&self, x: &Tensor, y: &Tensor, act: Activation) -> Result<()> { self.activation_impl(x, y, act) }
    fn activation_backward(&self, dy: &Tensor, y: &Tensor, dz: &Tensor, act: Activation) -> Result<()> { self.activation_backward_impl(dy, y, dz, act) }
    fn softmax(&self, logits: &Tensor, probs: &Tensor, rows: usize, cols: usize) -> Result<()> { self.none("x") }
    fn softmax_cross_entropy(&self, logits: &Tensor, labels: &Tensor, loss: &Tensor, dlogits: &Tensor, rows: usize, cols: usize) -> Result<()> { self.none("x") }
    fn accuracy_count(&self, logits: &Tensor, labels: &Tensor, out: &Tensor, rows: usize, cols: usize) -> Result<()> { self.none("x") }
    fn sgd(&self, w: &Tensor, g: &Tensor, p: &SgdParams) -> Result<()> { self.none("x") }
    fn sgd_momentum(&self, w: &Tensor, g: &Tensor, v: &Tensor, p: &SgdParams) -> Result<()> { self.none("x") }
    fn adam(&self, w: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, p: &AdamParams) -> Result<()> { self.none("x") }
}
