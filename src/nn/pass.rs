//! One pass through a stack of layers — forward, the loss at the top, backward — shared by a
//! plain model and by every replica of a mirrored one.

use crate::device::LogicalDevice;
use crate::error::Result;
use crate::nn::layers::Layer;
use crate::nn::objective::Objective;
use crate::tensor::{DType, Tensor};

/// A layer, the device it runs on, and the dtype it computes in there (its policy's, or
/// float32 where the device has no float16 kernels).
#[derive(Clone, Copy)]
pub(crate) struct Stage<'a> {
    pub(crate) layer: &'a dyn Layer,
    pub(crate) device: &'a LogicalDevice,
    pub(crate) dtype: DType,
}

/// The forward pass to the last layer's output (logits for a softmax model). With
/// `training` (Keras' `training=True`: a training step) each layer runs its training pass and
/// what each layer's backward needs is returned; without, its inference pass, keeping
/// nothing. Inputs move to each layer's device.
pub(crate) fn forward(
    stages: &[Stage<'_>],
    x: &Tensor,
    training: bool,
) -> Result<(Tensor, Vec<Vec<Tensor>>)> {
    let keep = training;
    let mut saved = Vec::with_capacity(if keep { stages.len() } else { 0 });
    let mut h = x.clone();
    for s in stages {
        let _scope = s.device.scope();
        let input = h.arrive(s.dtype, s.device)?;
        let (out, kept) = s.layer.call(&input, training)?;
        if keep {
            saved.push(kept);
        }
        h = out;
    }
    Ok((h, saved))
}

pub(crate) use crate::nn::objective::LossTerms;

/// The loss and metrics of `logits` (the last layer's output) against `y` (moved to `device`
/// first), in float32 as Keras advises under mixed precision (float16 outputs are cast first).
/// `factor` multiplies the output's gradient: the loss scale times this part's share of the
/// batch (1 for none).
pub(crate) fn loss_terms(
    device: &LogicalDevice,
    logits: &Tensor,
    y: &Tensor,
    objective: &Objective,
    factor: f32,
) -> Result<LossTerms> {
    crate::nn::objective::loss_terms_on(device, objective, logits, y, factor)
}

/// Back from `dlogits` through the stages, handing each layer's weight gradients to
/// `on_grads(layer index, gradients)` as soon as they exist, last layer first, in float32
/// whatever dtype the layer computed in (the dtype of its variables). Each layer's
/// saved tensors are freed once its backward has run. A 2×2 max-pool and the layer before it
/// run as one pass when that layer has one for their (shared) device.
pub(crate) fn backward(
    stages: &[Stage<'_>],
    saved: Vec<Vec<Tensor>>,
    dlogits: Tensor,
    on_grads: impl FnMut(usize, Vec<Tensor>) -> Result<()>,
) -> Result<()> {
    backward_from(stages, saved, dlogits, false, on_grads).map(drop)
}

/// [`backward`] from the gradient `dy` of the last stage's output, for a run of layers that
/// may sit inside a model: with `input_grad`, the first layer also computes the gradient of
/// its input, which is returned (a pipeline stage hands it to the stage before).
pub(crate) fn backward_from(
    stages: &[Stage<'_>],
    mut saved: Vec<Vec<Tensor>>,
    dy: Tensor,
    input_grad: bool,
    mut on_grads: impl FnMut(usize, Vec<Tensor>) -> Result<()>,
) -> Result<Option<Tensor>> {
    let mut dy = dy;
    let mut i = stages.len();
    while i > 0 {
        i -= 1;
        let s = stages[i];
        let _scope = s.device.scope();
        let dy_here = dy.arrive(s.dtype, s.device)?;
        let layer_saved = std::mem::take(&mut saved[i]);
        let (dx, grads) = match through_max_pool(stages, &mut saved, i, &dy_here, input_grad)? {
            Some((dx, grads)) => {
                // The pool (no weights) and the layer before it, in one pass.
                on_grads(i, Vec::new())?;
                i -= 1;
                (dx, grads)
            }
            None => s
                .layer
                .backward(&layer_saved, &dy_here, i > 0 || input_grad)?,
        };
        drop(layer_saved);
        let grads = grads
            .iter()
            .map(|g| g.cast(DType::F32))
            .collect::<Result<Vec<_>>>()?;
        on_grads(i, grads)?;
        match dx {
            Some(dx) => dy = dx,
            None => return Ok(None),
        }
    }
    Ok(input_grad.then_some(dy))
}

/// When stage `i` is a 2×2 max-pool and the layer before it runs on the same device, that
/// layer's fused backward pass through the pool ([`Layer::backward_through_max_pool`]) from
/// the pool's output gradient `dpooled`, taking the layer's saved tensors; `None` (nothing
/// taken) when there is no such pair or the layer has no fused pass. `input_grad`: the first
/// of `stages` must give its input's gradient too.
fn through_max_pool(
    stages: &[Stage<'_>],
    saved: &mut [Vec<Tensor>],
    i: usize,
    dpooled: &Tensor,
    input_grad: bool,
) -> Result<Option<(Option<Tensor>, Vec<Tensor>)>> {
    if i == 0 || !stages[i].layer.is_max_pool_2x2() {
        return Ok(None);
    }
    let before = stages[i - 1];
    if !before.device.same_device(stages[i].device) || before.dtype != stages[i].dtype {
        return Ok(None);
    }
    let fused =
        before
            .layer
            .backward_through_max_pool(&saved[i - 1], dpooled, i - 1 > 0 || input_grad)?;
    if fused.is_some() {
        saved[i - 1].clear();
    }
    Ok(fused)
}
