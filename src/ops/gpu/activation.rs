//! `activation.wgsl` driven: the activations with their own kernel ([`ActivationFn`]), forward
//! and backward, one element per invocation.

use bytemuck::{Pod, Zeroable};

use crate::error::Result;
use crate::ops::gpu::kernels::GpuKernels;
use crate::ops::gpu::{grid_1d, Kernel, ShaderFamily};
use crate::ops::spec::ActivationFn;
use crate::tensor::Tensor;

pub(crate) const ACT_FWD: Kernel = Kernel::new(ShaderFamily::Activation, "act_fwd");
pub(crate) const ACT_BWD: Kernel = Kernel::new(ShaderFamily::Activation, "act_bwd");

/// Mirror of `Params` in activation.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct ActParams {
    n: u32,
    kind: u32,
    from_output: u32,
    has_max: u32,
    slope: f32,
    max_value: f32,
    threshold: f32,
    pad: u32,
}

impl ActParams {
    fn new(n: usize, act: ActivationFn, from_output: bool) -> ActParams {
        let (slope, max_value, threshold) = match act {
            ActivationFn::Relu {
                negative_slope,
                max_value,
                threshold,
            } => (negative_slope, max_value, threshold),
            _ => (0.0, None, 0.0),
        };
        ActParams {
            // Shapes on a GPU are bounded by max_storage_buffer_binding_size (< 4 GiB).
            n: n as u32,
            kind: act.code(),
            from_output: u32::from(from_output),
            has_max: u32::from(max_value.is_some()),
            slope,
            max_value: max_value.unwrap_or(0.0),
            threshold,
            pad: 0,
        }
    }
}

impl GpuKernels<'_> {
    /// `y = act(x)`.
    pub(crate) fn activation_fn_impl(
        &self,
        x: &Tensor,
        y: &Tensor,
        act: ActivationFn,
    ) -> Result<()> {
        let p = ActParams::new(x.len(), act, false);
        self.launch(ACT_FWD, &p, &[x, y], grid_1d(x.len(), 256))
    }

    /// `dz = dy * act'(.)` from `t`, the input or (`from_output`) the output.
    pub(crate) fn activation_fn_backward_impl(
        &self,
        dy: &Tensor,
        t: &Tensor,
        dz: &Tensor,
        act: ActivationFn,
        from_output: bool,
    ) -> Result<()> {
        let p = ActParams::new(t.len(), act, from_output);
        self.launch(ACT_BWD, &p, &[t, dy, dz], grid_1d(t.len(), 256))
    }
}
