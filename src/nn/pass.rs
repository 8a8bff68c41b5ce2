//! One pass through a stack of layers — forward, the loss at the top, backward — shared by a
//! plain model and by every replica of a mirrored one.

use crate::device::LogicalDevice;
use crate::error::Result;
use crate::nn::autocast;
use crate::nn::layers::{BackwardPlan, FusedGrads, Layer, StemConv};
use crate::nn::objective::Objective;
use crate::ops::spec::{Activation as OpActivation, ActivationFn};
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
/// nothing. Inputs move to each layer's device. A layer followed by a 2×2 max-pool on its
/// device may run the pool too ([`Layer::call_through_max_pool`]), and one followed by an
/// activation layer that activation ([`Layer::call_with_activation`]).
pub(crate) fn forward(
    stages: &[Stage<'_>],
    x: &Tensor,
    training: bool,
) -> Result<(Tensor, Vec<Vec<Tensor>>)> {
    let keep = training;
    if training {
        // The weights every layer reads in its compute dtype, cast at once (a training step
        // keeps the copies for the backward pass too).
        autocast::prefetch(stages.iter().flat_map(|s| {
            let dtype = s.dtype;
            s.layer.autocast_weights().iter().map(move |w| (w, dtype))
        }))?;
    }
    let mut saved = Vec::with_capacity(if keep { stages.len() } else { 0 });
    let mut h = x.clone();
    let mut i = 0;
    while i < stages.len() {
        let s = stages[i];
        let _scope = s.device.scope();
        let input = h.arrive(s.dtype, s.device)?;
        if let Some(stem) = stem_at(stages, i)? {
            let next = stages[i + 1].layer;
            if let Some((pooled, kept, y)) = next.call_through_stem(&stem, &input, training)? {
                // The stem keeps nothing: the next layer keeps its input.
                if keep {
                    saved.extend([Vec::new(), kept, y.into_iter().collect()]);
                }
                h = pooled;
                i += 3;
                continue;
            }
        }
        if pool_follows(stages, i) {
            if let Some((pooled, kept, y)) = s.layer.call_through_max_pool(&input, training)? {
                // The pool keeps its input, as its own forward pass would, unless the layer
                // kept what it needs to answer for the pool's backward pass.
                if keep {
                    saved.push(kept);
                    saved.push(y.into_iter().collect());
                }
                h = pooled;
                i += 2;
                continue;
            }
        }
        if let Some((out, kept)) = into_reader(stages, i, &input, training)? {
            // The activation keeps nothing; the layer after it kept what its backward pass
            // needs of the normalization, which goes backward as after `call_with_activation`.
            if keep {
                saved.extend(kept);
            }
            h = out;
            i += 3;
            continue;
        }
        if let Some(act) = activation_follows(stages, i) {
            if mean_follows(stages, i + 1) {
                let fused = s
                    .layer
                    .call_with_activation_and_mean(&input, act, training)?;
                if let Some((pooled, kept)) = fused {
                    // The activation and the pooling keep nothing: this layer's backward
                    // pass answers for both ([`fused_mean`]).
                    if keep {
                        saved.extend([kept, Vec::new(), Vec::new()]);
                    }
                    h = pooled;
                    i += 3;
                    continue;
                }
            }
            if let Some((out, kept)) = s.layer.call_with_activation(&input, act, training)? {
                // The activation layer keeps nothing: this layer's backward pass answers
                // for it ([`fused_activation`]).
                if keep {
                    saved.extend([kept, Vec::new()]);
                }
                h = out;
                i += 2;
                continue;
            }
        }
        let (out, kept) = s.layer.call(&input, training)?;
        if keep {
            saved.push(kept);
        }
        h = out;
        i += 1;
    }
    Ok((h, saved))
}

/// Stages `i` to `i + 2` in a training pass, when stage `i`'s output through stage `i + 1`'s
/// activation need not be written ([`Layer::call_with_activation_deferred`]) because stage `i +
/// 2` forms it where it reads it ([`Layer::reads_normalized_input`], all three in one place,
/// no 2×2 max-pool after it to take over): stage `i + 2`'s output and the three stages' saved
/// tensors. `None` otherwise, nothing run.
fn into_reader(
    stages: &[Stage<'_>],
    i: usize,
    input: &Tensor,
    training: bool,
) -> Result<Option<(Tensor, [Vec<Tensor>; 3])>> {
    let Some(act) = activation_follows(stages, i) else {
        return Ok(None);
    };
    let Some(reader) = stages.get(i + 2) else {
        return Ok(None);
    };
    let fits = training
        && same_place(&stages[i], reader)
        && !pool_follows(stages, i + 2)
        && reader
            .layer
            .reads_normalized_input(input.shape(), reader.dtype);
    if !fits {
        return Ok(None);
    }
    let Some((deferred, kept)) = stages[i].layer.call_with_activation_deferred(input, act)? else {
        return Ok(None);
    };
    let (out, reader_kept) = reader.layer.call_normalized(&deferred)?;
    Ok(Some((out, [kept, Vec::new(), reader_kept])))
}

/// The convolution the first stage offers the second to run inside its pass through the 2×2
/// max-pool after it ([`Layer::call_through_stem`]), all three in one place; only at `i == 0`
/// (the model's first layer, whose input gradient is not needed).
fn stem_at(stages: &[Stage<'_>], i: usize) -> Result<Option<StemConv>> {
    let fits = i == 0 && stages.len() > 2 && same_place(&stages[0], &stages[1]);
    if !fits || !pool_follows(stages, 1) {
        return Ok(None);
    }
    stages[0].layer.as_stem(stages[0].dtype)
}

/// Whether stage `i + 1` is a 2×2 max-pool on stage `i`'s device and dtype, which stage `i`
/// may take over.
fn pool_follows(stages: &[Stage<'_>], i: usize) -> bool {
    stages
        .get(i + 1)
        .is_some_and(|pool| pool.layer.is_max_pool_2x2() && same_place(&stages[i], pool))
}

/// The activation of stage `i + 1` when it is an activation layer on stage `i`'s device and
/// dtype, which stage `i` may apply as it writes its output ([`Layer::call_with_activation`]).
fn activation_follows(stages: &[Stage<'_>], i: usize) -> Option<ActivationFn> {
    let next = stages.get(i + 1)?;
    let act = next.layer.as_activation()?;
    same_place(&stages[i], next).then_some(act)
}

/// Whether stage `i + 1` is a global average pooling on stage `i`'s device and dtype, which
/// the layer before stage `i` may run with stage `i`'s activation
/// ([`Layer::call_with_activation_and_mean`]).
fn mean_follows(stages: &[Stage<'_>], i: usize) -> bool {
    stages
        .get(i + 1)
        .is_some_and(|pool| pool.layer.is_global_average_pool() && same_place(&stages[i], pool))
}

/// The activation of stage `i - 1` when stage `i` is a global average pooling that the
/// forward pass ran, with that activation, inside stage `i - 2`'s
/// ([`Layer::call_with_activation_and_mean`]: the pooling and the activation kept nothing,
/// the layer below them kept what its backward pass needs).
fn fused_mean(
    stages: &[Stage<'_>],
    saved: &[Vec<Tensor>],
    i: usize,
    dy_preactivated: bool,
) -> Option<ActivationFn> {
    let ran_inside = i > 1
        && saved[i].is_empty()
        && saved[i - 1].is_empty()
        && !saved[i - 2].is_empty()
        && mean_follows(stages, i - 1);
    if !ran_inside || dy_preactivated {
        return None;
    }
    activation_follows(stages, i - 2)
}

/// The activation of stage `i` when the forward pass ran it inside stage `i - 1`'s
/// ([`activation_follows`]; the activation stage kept nothing then, the layer below kept
/// what [`Layer::backward_with_activation`] needs).
fn fused_activation(
    stages: &[Stage<'_>],
    saved: &[Vec<Tensor>],
    i: usize,
    dy_preactivated: bool,
) -> Option<ActivationFn> {
    let ran_inside = i > 0 && saved[i].is_empty() && !saved[i - 1].is_empty();
    if !ran_inside || dy_preactivated {
        return None;
    }
    activation_follows(stages, i - 1)
}

/// Weight gradients in float32, whatever dtype the layer computed them in (the dtype of its
/// variables).
fn in_f32(grads: &[Tensor]) -> Result<Vec<Tensor>> {
    grads.iter().map(|g| g.cast(DType::F32)).collect()
}

/// Whether two stages compute on the same device in the same dtype.
fn same_place(a: &Stage<'_>, b: &Stage<'_>) -> bool {
    a.device.same_device(b.device) && a.dtype == b.dtype
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
/// run as one pass when that layer has one for their (shared) device; so do the seams between
/// layers on one device where the upper one can apply the lower one's activation gradient as
/// it writes its input gradient ([`Layer::backward_fused`]): the lower one then starts from
/// its pre-activation gradient and never reads its output again. An activation layer the
/// forward pass ran inside the layer below it ([`Layer::call_with_activation`]) goes backward
/// inside that layer's pass too ([`Layer::backward_with_activation`]).
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
    // Whether `dy` already carries the activation gradient of the layer it goes to.
    let mut dy_preactivated = false;
    let mut i = stages.len();
    while i > 0 {
        i -= 1;
        let s = stages[i];
        let _scope = s.device.scope();
        let dy_here = dy.arrive(s.dtype, s.device)?;
        if i == 2 && saved[0].is_empty() {
            if let Some(stem) = stem_at(stages, 0)? {
                if input_grad {
                    // The stem ran inside the next layer's pass and kept nothing; the input's
                    // gradient needs its output: run it again and go through the layers.
                    recompute_stem(stages, &mut saved)?;
                } else {
                    let layer = stages[1].layer;
                    let grads = layer.backward_through_stem(&stem, &saved[1], &dy_here)?;
                    let Some((stem_grads, grads)) = grads else {
                        return Err(crate::Error::Model(format!(
                            "{}: call_through_stem ran but backward_through_stem gave nothing",
                            layer.class_name()
                        )));
                    };
                    saved.clear();
                    on_grads(2, Vec::new())?;
                    for (j, g) in [(1, grads), (0, stem_grads)] {
                        on_grads(j, in_f32(&g)?)?;
                    }
                    return Ok(None);
                }
            }
        }
        // A layer whose forward pass ran the activation after it (and the pooling after
        // that) answers for them: `(its stage, its pass)`.
        let answered = if let Some(act) = fused_mean(stages, &saved, i, dy_preactivated) {
            let below = i - 2;
            let layer = stages[below].layer;
            let need_dx = below > 0 || input_grad;
            let fused =
                layer.backward_with_activation_from_mean(&saved[below], &dy_here, act, need_dx)?;
            let Some(fused) = fused else {
                return Err(crate::Error::Model(format!(
                    "{}: call_with_activation_and_mean ran but \
                     backward_with_activation_from_mean gave nothing",
                    layer.class_name()
                )));
            };
            Some((below, fused))
        } else if let Some(act) = fused_activation(stages, &saved, i, dy_preactivated) {
            let below = i - 1;
            if below == 1 && !input_grad {
                if let Some((stem_grads, grads)) = into_stem(stages, &saved, &dy_here, act)? {
                    answered_for(&mut saved, (1, i), grads, &mut on_grads)?;
                    on_grads(0, in_f32(&stem_grads)?)?;
                    return Ok(None);
                }
            }
            let layer = stages[below].layer;
            let need_dx = below > 0 || input_grad;
            // `None`: the layer below did not run the activation (an activation layer that
            // keeps nothing ran on its own); it goes backward as any other layer.
            let fused = layer.backward_with_activation(&saved[below], &dy_here, act, need_dx)?;
            fused.map(|fused| (below, fused))
        } else {
            None
        };
        if let Some((below, (dx, grads))) = answered {
            answered_for(&mut saved, (below, i), grads, &mut on_grads)?;
            i = below;
            match dx {
                Some(dx) => dy = dx,
                None => return Ok(None),
            }
            continue;
        }
        let at = (i, &dy_here, dy_preactivated);
        let fused = through_fused(stages, &mut saved, at, input_grad)?;
        // `layer`: the stage that ran (`i - 1` when it took over the pool at `i`).
        let (layer, dx, grads, dx_preactivated) = match fused {
            Some((layer, g)) => (layer, g.dx, g.weights, g.dx_preactivated),
            None if dy_preactivated => {
                return Err(crate::Error::Model(format!(
                    "{}: the layer promised a backward pass from its pre-activation gradient \
                     (preactivation_grad) but backward_fused gave none",
                    s.layer.class_name()
                )));
            }
            None => {
                let layer_saved = std::mem::take(&mut saved[i]);
                match through_max_pool(stages, &mut saved, i, &dy_here, input_grad)? {
                    Some((dx, grads)) => (i - 1, dx, grads, false),
                    None => {
                        let (dx, grads) =
                            s.layer
                                .backward(&layer_saved, &dy_here, i > 0 || input_grad)?;
                        (i, dx, grads, false)
                    }
                }
            }
        };
        if layer < i {
            // The pool (no weights) and the layer before it ran as one pass.
            on_grads(i, Vec::new())?;
            i = layer;
        }
        dy_preactivated = dx_preactivated;
        on_grads(i, in_f32(&grads)?)?;
        match dx {
            Some(dx) => dy = dx,
            None => return Ok(None),
        }
    }
    Ok(input_grad.then_some(dy))
}

/// After stage `below`'s backward pass answered for the stages above it up to `i` (which
/// kept nothing): its saved tensors freed, and every stage's weight gradients handed on, last
/// first (`grads` stage `below`'s, none above it).
fn answered_for(
    saved: &mut [Vec<Tensor>],
    (below, i): (usize, usize),
    grads: Vec<Tensor>,
    on_grads: &mut impl FnMut(usize, Vec<Tensor>) -> Result<()>,
) -> Result<()> {
    saved[below].clear();
    for above in (below + 1..=i).rev() {
        on_grads(above, Vec::new())?;
    }
    on_grads(below, in_f32(&grads)?)
}

/// Stage 1's backward pass, with stage 2's activation `act` fused in it, and the first
/// layer's weight gradients in one ([`Layer::backward_into_stem`]): `(the first layer's
/// gradients, stage 1's)`, when the first layer is a stem on stage 1's device that kept its
/// input and stage 1 has such a pass; `None` otherwise.
fn into_stem(
    stages: &[Stage<'_>],
    saved: &[Vec<Tensor>],
    dy: &Tensor,
    act: ActivationFn,
) -> Result<Option<(Vec<Tensor>, Vec<Tensor>)>> {
    if !same_place(&stages[0], &stages[1]) {
        return Ok(None);
    }
    let Some(stem) = stages[0].layer.as_stem(stages[0].dtype)? else {
        return Ok(None);
    };
    let Some(x) = stages[0].layer.kept_input(&saved[0]) else {
        return Ok(None);
    };
    stages[1]
        .layer
        .backward_into_stem(&stem, x, &saved[1], dy, act)
}

/// Runs the stem again from its input (what the next layer kept, see [`stem_at`]) and leaves
/// `saved` as the layers' own passes would have: the stem's, and the next layer's with the
/// stem's output as its input.
fn recompute_stem(stages: &[Stage<'_>], saved: &mut [Vec<Tensor>]) -> Result<()> {
    let Some(x) = saved[1].first().cloned() else {
        return Err(crate::Error::Model(format!(
            "{}: nothing kept by call_through_stem",
            stages[1].layer.class_name()
        )));
    };
    let _scope = stages[0].device.scope();
    let (out, kept) = stages[0].layer.call(&x, true)?;
    saved[0] = kept;
    saved[1][0] = out;
    Ok(())
}

/// The stage whose backward pass starts at stage `i` (the layer before a pool it takes over,
/// or `i`), and whether that pass computes its input's gradient.
fn backward_target(stages: &[Stage<'_>], i: usize, input_grad: bool) -> (usize, bool, bool) {
    let pooled = i > 0 && pool_follows(stages, i - 1);
    let layer = if pooled { i - 1 } else { i };
    (layer, pooled, layer > 0 || input_grad)
}

/// The activation of the layer before `layer` that `layer` may differentiate for it as it
/// writes its `dx` (see [`Layer::preactivation_grad`]).
fn input_activation(stages: &[Stage<'_>], layer: usize, need_dx: bool) -> Option<OpActivation> {
    if !need_dx || layer == 0 || !same_place(&stages[layer - 1], &stages[layer]) {
        return None;
    }
    stages[layer - 1].layer.preactivation_grad()
}

/// The backward pass from stage `i` through [`Layer::backward_fused`]: `(layer, grads)`, the
/// stage that ran (`i`, or `i - 1` when it took over the pool at `i`) and what it returned;
/// `None` when there is nothing to fuse at the seams beyond the pool (that is
/// [`through_max_pool`]'s) or the layer has no such pass; its saved tensors are then left
/// alone. `dy_preactivated`: `dy` already carries the activation gradient of stage `i`.
fn through_fused(
    stages: &[Stage<'_>],
    saved: &mut [Vec<Tensor>],
    (i, dy, dy_preactivated): (usize, &Tensor, bool),
    input_grad: bool,
) -> Result<Option<(usize, FusedGrads)>> {
    let (layer, pooled, need_dx) = backward_target(stages, i, input_grad);
    let below = input_activation(stages, layer, need_dx);
    if !dy_preactivated && below.is_none() {
        return Ok(None);
    }
    let plan = BackwardPlan {
        need_dx,
        through_max_pool: pooled,
        dy_preactivated,
        input_activation: below.unwrap_or(OpActivation::Linear),
    };
    let fused = stages[layer]
        .layer
        .backward_fused(&saved[layer], dy, plan)?;
    Ok(fused.map(|g| {
        saved[layer].clear();
        if pooled {
            saved[i].clear();
        }
        (layer, g)
    }))
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
    let (layer, pooled, need_dx) = backward_target(stages, i, input_grad);
    if !pooled {
        return Ok(None);
    }
    let fused = stages[layer]
        .layer
        .backward_through_max_pool(&saved[layer], dpooled, need_dx)?;
    if fused.is_some() {
        saved[layer].clear();
    }
    Ok(fused)
}
