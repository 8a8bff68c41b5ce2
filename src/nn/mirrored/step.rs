//! The data-parallel training step in its four phases (see the module above): each replica's
//! gradients packed into flat tensors, their cross-replica sum, the update's allocations, the
//! updates; the workers' votes of a multi-worker job.

use std::ops::Range;

use crate::device::LogicalDevice;
use crate::distribute::{MirroredStrategy, Workers};
use crate::error::{Error, Result};
use crate::nn::autocast::StepCasts;
use crate::nn::objective::Objective;
use crate::nn::optimizer::OptimizerState;
use crate::nn::pass::{self};
use crate::nn::replica_group::{self, ReplicaGroup};
use crate::nn::step_output::{HostPart, StepOutput, StepPart};
use crate::tensor::{DType, Direction, Tensor};

use super::batch::Shard;
use super::HostBatch;
use super::{host_sums, on_every_replica, Job, ReplicaView};

/// Elements per packed transfer: well under the 128 MiB that every adapter can bind at once
/// (WebGPU's default `max_storage_buffer_binding_size`), so a model of any size can be packed.
const PACK_ELEMENTS: usize = 8 << 20;

/// Consecutive runs of tensors (by index) of at most [`PACK_ELEMENTS`] elements in all; a
/// larger tensor travels alone.
fn packs(lens: &[usize]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut total) = (0, 0);
    for (i, &len) in lens.iter().enumerate() {
        if i > start && total + len > PACK_ELEMENTS {
            out.push(start..i);
            (start, total) = (i, 0);
        }
        total += len;
    }
    if start < lens.len() {
        out.push(start..lens.len());
    }
    out
}

/// The tensors of each pack, laid end to end in new flat tensors on `device`.
fn pack(
    tensors: &[&Tensor],
    packs: &[Range<usize>],
    device: &LogicalDevice,
) -> Result<Vec<Tensor>> {
    packs
        .iter()
        .map(|r| Tensor::concat_flat(&tensors[r.clone()], device))
        .collect()
}

/// What a replica's forward and backward leave: its loss terms and packed gradients.
struct ReplicaGrads {
    part: StepPart,
    packed: Vec<Tensor>,
}

/// Forward, loss and backward of one replica's shard. The loss gradient is scaled by
/// `rows / global`, so that the replicas' gradients add up to that of the global batch's mean
/// loss, and by the loss scale `(objective, factor).1`.
fn replica_gradients(
    replica: &ReplicaView<'_>,
    batch: HostBatch<'_>,
    shard: Shard,
    (objective, factor): (&Objective, f32),
    (packs, total_replicas): (&[Range<usize>], usize),
) -> Result<ReplicaGrads> {
    let device = replica.device;
    let stages = replica.stages();
    let (x, y) = batch.upload(shard, device)?;
    let casts = StepCasts::enter();
    let (logits, saved) = pass::forward(&stages, &x, true)?;
    let share = shard.rows as f32 / batch.rows() as f32;
    let terms = pass::loss_terms(device, &logits, &y, objective, factor * share)?;
    drop(logits);
    let dlogits = terms.dlogits;
    let mut grads: Vec<Vec<Tensor>> = vec![Vec::new(); stages.len()];
    pass::backward(&stages, saved, dlogits, |i, g| {
        grads[i] = g;
        Ok(())
    })?;
    drop(casts);
    let states = mean_shares(replica, total_replicas)?;
    let all: Vec<&Tensor> = grads.iter().flatten().chain(&states).collect();
    Ok(ReplicaGrads {
        part: StepPart {
            loss_sum: terms.loss_sum,
            metrics: terms.metrics,
        },
        packed: pack(&all, packs, device)?,
    })
}

/// This replica's share of the mean of the non-trainable weights: each divided by the number
/// of replicas of the step (on every worker), so that the sum of phase 2 is their mean.
fn mean_shares(replica: &ReplicaView<'_>, total_replicas: usize) -> Result<Vec<Tensor>> {
    let share = 1.0 / total_replicas as f32;
    replica
        .non_trainable()
        .into_iter()
        .map(|t| {
            let _scope = t.device_handle().scope();
            t.scale(share)
        })
        .collect()
}

/// The request of a step's first vote, which a worker whose batch failed (`fit`'s
/// [`vote_failed_step`]) joins in place of the step.
const STEP_VOTE: &str = "training step (forward and backward)";

/// A worker whose step failed before it began (its next batch could not be read, say) joins
/// the step's first vote with the error, so that every worker's step fails alike with no
/// extra collective; the agreed error.
pub(crate) fn vote_failed_step(workers: &dyn Workers, error: &Error) -> Error {
    match workers.agree(STEP_VOTE, Err(error), &mut []) {
        Err(agreed) => agreed,
        // Unreachable: this worker voted failure. Its own error, rather than a panic.
        Ok(()) => Error::Model(error.to_string()),
    }
}

/// One synchronous data-parallel training step over `replicas` (the primary first).
pub(crate) fn train_step(
    strategy: &MirroredStrategy,
    replicas: &mut [ReplicaView<'_>],
    batch: HostBatch<'_>,
    objective: &Objective,
) -> Result<StepOutput> {
    let workers = strategy.workers();
    let shards = batch.worker_shards(strategy);
    let mut shapes: Vec<Vec<usize>> = replicas[0]
        .weights()
        .iter()
        .map(|w| w.shape().to_vec())
        .collect();
    if shapes.is_empty() {
        return Err(Error::Model(
            "fit: the model has no weights to train".into(),
        ));
    }
    // The gradients, then the non-trainable weights' shares of their mean.
    let trainable = shapes.len();
    shapes.extend(
        replicas[0]
            .non_trainable()
            .iter()
            .map(|t| t.shape().to_vec()),
    );
    let total_replicas = match workers {
        Some(w) => w.replicas().iter().sum(),
        None => replicas.len(),
    };
    let lens: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
    let grad_packs = packs(&lens);

    // 1. Forward and backward, every replica at once (with the loss scale every replica
    // shares).
    let factor = replicas[0]
        .optimizer
        .as_deref()
        .map_or(1.0, OptimizerState::loss_factor);
    let loss = (objective, factor);
    let gradients = replica_packs(
        replicas,
        batch,
        &shards,
        loss,
        (&grad_packs, &lens, trainable, total_replicas),
        workers.is_some(),
    );
    // A worker of a multi-worker job says how its part went before anyone waits for its
    // gradients, so that a failed worker stops every worker instead of leaving them waiting.
    if let Some(w) = workers {
        w.agree(STEP_VOTE, gradients.as_ref().map(drop), &mut [])?;
    }
    let (parts, packed) = gradients?;

    // 2. The sum over replicas (and workers), where the updates will run.
    let cross_worker = workers.is_some_and(|w| !w.same_kernels());
    let everywhere = strategy.same_kernels() && !cross_worker;
    let destinations: Vec<LogicalDevice> = if everywhere {
        replicas.iter().map(|r| r.device.clone()).collect()
    } else {
        vec![replicas[0].device.clone()]
    };
    let ops = strategy.cross_device_ops();
    // reduced[pack][destination]. Across workers every pack goes through the collective even
    // after one failed here, so that all workers run the same collectives; an error they all
    // agreed on (`Distributed`) is theirs alike and ends the step on every worker at once.
    let mut reduced = Vec::with_capacity(packed.len());
    let mut failed = None;
    // Sums across adapters go through host memory: the profiler names those waits.
    let _cause = crate::profiler::WaitCause::enter("MirroredStrategy: cross-device gradient sum");
    for values in &packed {
        match ops.reduce_sum(values, &destinations) {
            Ok(sums) => reduced.push(sums),
            Err(e @ Error::Distributed { .. }) => return Err(e),
            Err(e) if workers.is_none() => return Err(e),
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    drop(packed);

    // 3. Every allocation of the update: the gradients per weight on each destination, the
    // optimizer slots, and (mixed kernels) the buffers that carry the primary's state.
    let carry = !everywhere && (replicas.len() > 1 || cross_worker);
    let prepared = match failed {
        Some(e) => Err(e),
        None => prepare_update(replicas, &reduced, (&grad_packs, &shapes, trainable), carry),
    };
    drop(reduced);
    // Across workers the update starts only when every worker has everything it needs, and
    // the step's loss and accuracy become the sums over all workers.
    // The sums stay on the host: nothing may be allocated after this vote, since a worker that
    // failed after it would skip an update the others run.
    let mut global = None;
    if let Some(w) = workers {
        let mut sums = vec![0.0f64; 1 + objective.metrics.len()];
        let read = prepared
            .as_ref()
            .map_or(Ok(()), |_| host_sums(&parts, &mut sums));
        let local = prepared.as_ref().map(drop).and(read.as_ref().map(drop));
        w.agree("training step (update)", local, &mut sums)?;
        global = Some(HostPart {
            loss_sum: sums[0],
            metrics: sums[1..].to_vec(),
        });
    }
    let (grads, carriers, state_packs, applies, means) = prepared?;

    // 4. The updates.
    let updated = take_means(replicas, &means).and_then(|()| {
        if applies {
            update(
                replicas,
                &grads,
                (&carriers, &state_packs),
                ops,
                workers.filter(|_| cross_worker),
            )
        } else {
            replicas
                .iter_mut()
                .try_for_each(|r| r.optimizer().map(|o| o.finish_step(false)))
        }
    });
    if let (Err(e), Some(w)) = (&updated, workers) {
        // This worker's parameters may now differ from the others': end the job.
        w.abort(&format!(
            "training step (update) on worker {}: {e}",
            w.rank()
        ));
    }
    updated?;
    let out = match global {
        Some(sums) => StepOutput::from_host(sums, batch.rows()),
        None => StepOutput::new(parts, batch.rows()),
    };
    Ok(out.named(objective.metric_names()))
}

/// Phase 1 of a step: each replica's loss terms, and its packed gradients (`[pack][replica]`);
/// a replica without examples contributes zeros. The replicas with examples form the step's
/// [`ReplicaGroup`] (for `BatchNormalization(synchronized=True)`).
fn replica_packs(
    replicas: &[ReplicaView<'_>],
    batch: HostBatch<'_>,
    shards: &[Shard],
    loss: (&Objective, f32),
    (grad_packs, lens, trainable, total_replicas): (&[Range<usize>], &[usize], usize, usize),
    multi_worker: bool,
) -> Result<(Vec<StepPart>, Vec<Vec<Tensor>>)> {
    let working = shards.iter().filter(|s| s.rows > 0).count();
    let group = ReplicaGroup::new(working, multi_worker);
    let mut member = 0..;
    let jobs: Vec<Job<'_, Option<ReplicaGrads>>> = replicas
        .iter()
        .zip(shards)
        .map(|(r, &shard)| {
            let index = if shard.rows > 0 { member.next() } else { None };
            let group = group.clone();
            let job = move || match index {
                None => Ok(None),
                Some(i) => replica_group::run_in(&group, i, r.device.name(), || {
                    replica_gradients(r, batch, shard, loss, (grad_packs, total_replicas))
                })
                .map(Some),
            };
            (
                r.device.name(),
                Box::new(job) as Box<dyn FnOnce() -> _ + Send>,
            )
        })
        .collect();
    let results = on_every_replica(jobs)?;
    let mut parts = Vec::new();
    let mut packed: Vec<Vec<Tensor>> = vec![Vec::with_capacity(replicas.len()); grad_packs.len()];
    for (r, result) in replicas.iter().zip(results) {
        let tensors = match result {
            Some(g) => {
                parts.push(g.part);
                g.packed
            }
            None => {
                // Zero gradients, and this replica's moving statistics as they were.
                let zeros = lens[..trainable]
                    .iter()
                    .map(|&len| Tensor::zeros_on(&[len], DType::F32, r.device))
                    .collect::<Result<Vec<_>>>()?;
                let states = mean_shares(r, total_replicas)?;
                let all: Vec<&Tensor> = zeros.iter().chain(&states).collect();
                pack(&all, grad_packs, r.device)?
            }
        };
        for (pack, t) in packed.iter_mut().zip(tensors) {
            pack.push(t);
        }
    }
    Ok((parts, packed))
}

/// What phase 3 allocates: the gradients per weight (`[destination][weight]`, unscaled), the
/// carriers of the primary's state (`[pack][replica]`, empty when every replica updates
/// itself) and the packs of the state; and whether the step updates at all (loss scaling skips
/// a step whose gradients are not finite); and the means of the non-trainable weights
/// (`[destination][weight]`).
type Prepared = (
    Vec<Vec<Tensor>>,
    Vec<Vec<Tensor>>,
    Vec<Range<usize>>,
    bool,
    Vec<Vec<Tensor>>,
);

/// Phase 3 of a step: everything the update allocates.
fn prepare_update(
    replicas: &mut [ReplicaView<'_>],
    reduced: &[Vec<Tensor>],
    (grad_packs, shapes, trainable): (&[Range<usize>], &[Vec<usize>], usize),
    carry: bool,
) -> Result<Prepared> {
    let destinations = reduced.first().map_or(0, Vec::len);
    let mut grads: Vec<Vec<Tensor>> = vec![Vec::with_capacity(shapes.len()); destinations];
    for (pack, sums) in grad_packs.iter().zip(reduced) {
        for (dest, sum) in grads.iter_mut().zip(sums) {
            dest.extend(sum.split_flat(&shapes[pack.clone()])?);
        }
    }
    let means: Vec<Vec<Tensor>> = grads.iter_mut().map(|g| g.split_off(trainable)).collect();
    // Every destination (and every worker) holds the same sums, so the check decides alike for
    // all replicas: one replica's overflow skips the step everywhere.
    let Some(grads) = replicas[0].optimizer()?.unscaled(&grads)? else {
        return Ok((Vec::new(), Vec::new(), Vec::new(), false, means));
    };
    // Each destination clips its own copy of the summed gradients: every replica clips alike.
    let grads = {
        let opt = replicas[0].optimizer()?;
        grads
            .into_iter()
            .map(|dest| {
                opt.clipped(&[dest])
                    .map(|mut c| c.pop().unwrap_or_default())
            })
            .collect::<Result<Vec<_>>>()?
    };
    for r in replicas.iter_mut() {
        let layers = r.layers.clone();
        let opt = r.optimizer()?;
        for (i, l) in layers.iter().enumerate() {
            let weights: Vec<&Tensor> = l.weights().into_iter().map(|(_, t)| t).collect();
            opt.ensure_slots(i, &weights)?;
        }
    }
    // The fused updates' tables too, so that phase 4 allocates nothing.
    for (r, dest) in replicas.iter_mut().zip(&grads) {
        let layers = r.layers.clone();
        let (weights, layer_grads) = per_layer(&layers, dest);
        r.optimizer()?.prepare_all(&weights, &layer_grads)?;
    }
    let state_lens: Vec<usize> = replicas[0].state().iter().map(|t| t.len()).collect();
    let state_packs = packs(&state_lens);
    let carriers = if carry {
        state_packs
            .iter()
            .map(|p| {
                let len = state_lens[p.clone()].iter().sum::<usize>();
                replicas
                    .iter()
                    .map(|r| Tensor::empty_on(&[len], DType::F32, r.device))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?
    } else {
        Vec::new()
    };
    Ok((grads, carriers, state_packs, true, means))
}

/// Every replica's non-trainable weights set to their mean over the replicas (from its own
/// destination's copy, or the primary's when only the primary updates), in place.
fn take_means(replicas: &[ReplicaView<'_>], means: &[Vec<Tensor>]) -> Result<()> {
    let Some(first) = means.first() else {
        return Ok(());
    };
    for (i, r) in replicas.iter().enumerate() {
        let source = means.get(i).unwrap_or(first);
        for (t, mean) in r.non_trainable().into_iter().zip(source) {
            t.assign(mean)?;
        }
    }
    Ok(())
}

/// Phase 4 of a step, which allocates nothing: the updates, on every replica or on the
/// primary; then the primary's state goes to the other replicas through the carriers — first,
/// when `chief` is given (workers whose kernels differ), the chief's to every worker's primary.
fn update(
    replicas: &mut [ReplicaView<'_>],
    grads: &[Vec<Tensor>],
    (carriers, state_packs): (&[Vec<Tensor>], &[Range<usize>]),
    ops: &dyn crate::distribute::CrossDeviceOps,
    chief: Option<&dyn Workers>,
) -> Result<()> {
    for (r, grads) in replicas.iter_mut().zip(grads) {
        let layers = r.layers.clone();
        let (weights, layer_grads) = per_layer(&layers, grads);
        r.optimizer()?.apply_all(&weights, &layer_grads)?;
    }
    if !carriers.is_empty() {
        let states: Vec<Vec<&Tensor>> = replicas.iter().map(ReplicaView::state).collect();
        for (pack, carrier) in state_packs.iter().zip(carriers) {
            carrier[0].assign_flat(&states[0][pack.clone()], Direction::FromParts)?;
            if let Some(w) = chief {
                let mut words = carrier[0].words()?;
                w.broadcast("training step (optimizer state from worker 0)", &mut words)?;
                if w.rank() != 0 {
                    carrier[0].write_words(&words)?;
                    carrier[0].assign_flat(&states[0][pack.clone()], Direction::IntoParts)?;
                }
            }
            ops.broadcast_into(&carrier[0], &carrier[1..])?;
            for (state, c) in states.iter().zip(carrier).skip(1) {
                c.assign_flat(&state[pack.clone()], Direction::IntoParts)?;
            }
        }
    }
    for r in replicas.iter_mut() {
        r.optimizer()?.finish_step(true);
    }
    Ok(())
}

/// A replica's weights per layer and its flat gradients cut to match.
fn per_layer<'a>(
    layers: &[&'a dyn crate::nn::layers::Layer],
    grads: &[Tensor],
) -> (Vec<Vec<&'a Tensor>>, Vec<Vec<Tensor>>) {
    let mut next = grads.iter();
    layers
        .iter()
        .map(|&l| {
            let weights: Vec<&Tensor> = l.weights().into_iter().map(|(_, t)| t).collect();
            let layer_grads: Vec<Tensor> = next.by_ref().take(weights.len()).cloned().collect();
            (weights, layer_grads)
        })
        .unzip()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_stay_under_the_limit_and_keep_order() {
        assert_eq!(packs(&[3, 4, 5]), vec![0..3]);
        assert!(packs(&[]).is_empty());
        let big = PACK_ELEMENTS;
        // A tensor above the limit travels alone; the others fill packs in order.
        assert_eq!(packs(&[1, big + 1, 1, 1]), [0..1, 1..2, 2..4]);
        assert_eq!(packs(&[big / 2, big / 2, 1]), [0..2, 2..3]);
    }
}
