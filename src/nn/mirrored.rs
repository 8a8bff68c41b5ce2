//! A model under [`MirroredStrategy`]: the copies of its layers on the other replicas, and the
//! data-parallel training step, evaluation and prediction.
//!
//! A step runs in four phases, so that running out of memory on any replica leaves every replica
//! as it was:
//! 1. every replica, on its own thread, takes its slice of the batch through forward, loss and
//!    backward, and packs its weight gradients into flat tensors (one per 8 Mi elements);
//! 2. the strategy's [`CrossDeviceOps`](crate::distribute::CrossDeviceOps) sums them;
//! 3. everything the update needs is allocated: the summed gradients unpacked per weight, the
//!    optimizer slots, the buffers that carry the primary's state to the others;
//! 4. the updates, which allocate nothing: on every replica when all run the same kernels;
//!    otherwise on the primary, whose weights and slots are then copied to the others.
//!
//! Non-trainable weights (a `BatchNormalization`'s moving statistics) are updated by each
//! replica's own training pass, from its own batch statistics, so they drift apart; they
//! travel in phase 2 with the gradients, each divided by the number of replicas, and every
//! replica takes their sum — the mean over replicas, as tf.keras' `ON_READ`/`MEAN` variables
//! read — after the update. (Keras 3 declares them with `aggregation="none"` and leaves each
//! replica its own: replicas then read differently, which this crate never allows.)
//!
//! What phase 4 cannot survive is a device lost halfway through it: the error says which, and
//! the replicas may then differ until the weights are set again.
//!
//! On a worker of a multi-worker job (the strategy has [`Workers`]) the same step cuts the
//! global batch among the replicas of all workers, and the workers vote twice, so that a
//! failure anywhere fails the step everywhere and nobody waits in a collective for a worker
//! that has stopped: after phase 1, and after phase 3 (the vote also sums the loss and
//! accuracy over the workers). Between the two the sum of phase 2 crosses the workers. A
//! failure in phase 4 aborts the job, since that worker's parameters may differ.

use std::ops::Range;
use std::panic::{self, AssertUnwindSafe};
use std::thread;

use crate::data::Batch;
use crate::device::LogicalDevice;
use crate::distribute::{as_replica_job, worker_rows, MirroredStrategy, Workers};
use crate::error::{Error, Result};
use crate::mixed_precision::Policy;
use crate::nn::layers::{set_variable, variables, Layer};
use crate::nn::objective::Objective;
use crate::nn::optimizer::{Optimizer, OptimizerState};
use crate::nn::pass::{self, Stage};
use crate::nn::replica_group::{self, ReplicaGroup};
use crate::nn::step_output::{HostPart, StepOutput, StepPart};
use crate::tensor::{DType, Direction, Tensor};

/// The replicas of a mirrored model after the first (the model's own layers are replica 0).
pub(crate) struct Mirrors {
    pub(crate) strategy: MirroredStrategy,
    pub(crate) replicas: Vec<Replica>,
}

/// One more copy of the model: every layer, with its own weights and optimizer state.
pub(crate) struct Replica {
    pub(crate) device: LogicalDevice,
    pub(crate) layers: Vec<Box<dyn Layer>>,
    pub(crate) optimizer: Option<OptimizerState>,
}

/// A replica as a training step sees it.
pub(crate) struct ReplicaView<'a> {
    pub(crate) device: &'a LogicalDevice,
    pub(crate) layers: Vec<&'a dyn Layer>,
    /// Each layer's dtype policy (the model's, on every replica).
    pub(crate) policies: Vec<Policy>,
    pub(crate) optimizer: Option<&'a mut OptimizerState>,
}

impl ReplicaView<'_> {
    fn stages(&self) -> Vec<Stage<'_>> {
        self.layers
            .iter()
            .zip(&self.policies)
            .map(|(&layer, policy)| Stage {
                layer,
                device: self.device,
                dtype: policy.compute_dtype_on(self.device),
            })
            .collect()
    }

    /// Every trainable weight, in model order: what has gradients.
    fn weights(&self) -> Vec<&Tensor> {
        self.layers
            .iter()
            .flat_map(|l| l.weights().into_iter().map(|(_, t)| t))
            .collect()
    }

    /// Every non-trainable weight, in model order (moving statistics).
    fn non_trainable(&self) -> Vec<&Tensor> {
        self.layers
            .iter()
            .flat_map(|l| l.non_trainable_weights().into_iter().map(|(_, t)| t))
            .collect()
    }

    /// Weights (trainable and not) and optimizer slots, layer by layer: what must be equal on
    /// every replica.
    fn state(&self) -> Vec<&Tensor> {
        let mut out = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            out.extend(variables(*l).into_iter().map(|(_, t)| t));
            if let Some(opt) = &self.optimizer {
                out.extend(opt.slot_tensors(i));
            }
        }
        out
    }

    fn optimizer(&mut self) -> Result<&mut OptimizerState> {
        self.optimizer.as_deref_mut().ok_or_else(|| {
            Error::Model(format!(
                "fit: the replica on {} has no optimizer; compile the model",
                self.device
            ))
        })
    }
}

/// A copy of `layer` whose weights (trainable and not) live on `device`.
fn copy_layer(layer: &dyn Layer, device: &LogicalDevice) -> Result<Box<dyn Layer>> {
    let mut copy = layer.boxed_clone();
    let weights = variables(layer)
        .into_iter()
        .map(|(_, w)| w.to_device(device))
        .collect::<Result<Vec<_>>>()?;
    for (j, w) in weights.into_iter().enumerate() {
        set_variable(copy.as_mut(), j, w)?;
    }
    Ok(copy)
}

/// Overwrites `layer`'s weights with the chief's: one broadcast of all of them, once every
/// worker has read its own (a worker that cannot read fails them all, rather than leaving the
/// others waiting in the broadcast).
fn from_chief(workers: &dyn Workers, layer: &dyn Layer) -> Result<()> {
    let weights: Vec<&Tensor> = variables(layer).into_iter().map(|(_, t)| t).collect();
    if weights.is_empty() {
        return Ok(());
    }
    let local = weights
        .iter()
        .map(|t| t.words())
        .collect::<Result<Vec<_>>>();
    workers.agree(
        "creating the model (weights from worker 0)",
        local.as_ref().map(drop),
        &mut [],
    )?;
    let local = local?;
    let mut words: Vec<u32> = local.concat();
    workers.broadcast("creating the model (weights from worker 0)", &mut words)?;
    if workers.rank() != 0 {
        let mut rest = &words[..];
        for t in weights {
            let (mine, next) = rest.split_at(t.len());
            t.write_words(mine)?;
            rest = next;
        }
    }
    Ok(())
}

impl Mirrors {
    /// No layers yet, on every device of `strategy` but the first.
    pub(crate) fn new(strategy: MirroredStrategy) -> Mirrors {
        let replicas = strategy.devices()[1..]
            .iter()
            .map(|d| Replica {
                device: d.clone(),
                layers: Vec::new(),
                optimizer: None,
            })
            .collect();
        Mirrors { strategy, replicas }
    }

    /// Copies the primary's layer `index` (appended, or replacing the old copy) onto every
    /// replica. All copies are made before any is installed: on error nothing changes.
    ///
    /// On a worker of a multi-worker job the primary first takes the chief's weights, so that
    /// every worker starts identical whatever its seed.
    pub(crate) fn mirror_layer(&mut self, index: usize, primary: &dyn Layer) -> Result<()> {
        if let Some(workers) = self.strategy.workers() {
            from_chief(workers, primary)?;
        }
        let copies = self
            .replicas
            .iter()
            .map(|r| copy_layer(primary, &r.device))
            .collect::<Result<Vec<_>>>()?;
        for (r, copy) in self.replicas.iter_mut().zip(copies) {
            match r.layers.get_mut(index) {
                Some(slot) => *slot = copy,
                None => r.layers.push(copy),
            }
        }
        Ok(())
    }

    /// Drops the copies of layers `len..` (undoing an `add` that failed).
    pub(crate) fn truncate(&mut self, len: usize) {
        for r in &mut self.replicas {
            r.layers.truncate(len);
        }
    }

    /// A fresh optimizer state on every replica.
    pub(crate) fn compile(&mut self, config: &Optimizer, layers: usize) {
        for r in &mut self.replicas {
            r.optimizer = Some(OptimizerState::new(config.clone(), layers));
        }
    }
}

/// The host slices of a global batch.
#[derive(Clone, Copy)]
pub(crate) struct HostBatch<'a> {
    pub(crate) x: &'a [f32],
    pub(crate) x_shape: &'a [usize],
    /// Integer labels (empty with float targets).
    pub(crate) y: &'a [i32],
    /// Float targets, `target_shape` per example (empty with labels).
    pub(crate) y_values: &'a [f32],
    pub(crate) target_shape: &'a [usize],
}

impl<'a> From<&'a Batch> for HostBatch<'a> {
    fn from(b: &'a Batch) -> Self {
        HostBatch {
            x: &b.x,
            x_shape: &b.x_shape,
            y: &b.y,
            y_values: &b.y_values,
            target_shape: &b.target_shape,
        }
    }
}

/// One replica's slice of a batch: `rows` examples from example `first`.
#[derive(Clone, Copy)]
struct Shard {
    first: usize,
    rows: usize,
}

impl HostBatch<'_> {
    /// The shards of a training step. A worker of a multi-worker job takes its replicas'
    /// part of the global batch (TF's auto-shard by data): the batch is cut among the replicas
    /// of all workers, in rank order, as [`MirroredStrategy::replica_batch_sizes`] cuts it
    /// among local ones.
    fn worker_shards(&self, strategy: &MirroredStrategy) -> Vec<Shard> {
        let Some(workers) = strategy.workers() else {
            return self.shards(strategy);
        };
        let (mut first, rows) = worker_rows(self.rows(), workers.replicas(), workers.rank());
        rows.into_iter()
            .map(|rows| {
                let s = Shard { first, rows };
                first += rows;
                s
            })
            .collect()
    }

    fn shards(&self, strategy: &MirroredStrategy) -> Vec<Shard> {
        let mut first = 0;
        strategy
            .replica_batch_sizes(self.rows())
            .into_iter()
            .map(|rows| {
                let s = Shard { first, rows };
                first += rows;
                s
            })
            .collect()
    }

    /// Examples in the batch.
    pub(crate) fn rows(&self) -> usize {
        self.x_shape.first().copied().unwrap_or(0)
    }

    /// The shard's examples and targets on `device`.
    fn upload(&self, shard: Shard, device: &LogicalDevice) -> Result<(Tensor, Tensor)> {
        let rows = shard.first..shard.first + shard.rows;
        Ok((
            self.examples(rows.clone(), device)?,
            self.labels(rows, device)?,
        ))
    }

    /// Examples `rows` on `device`.
    pub(crate) fn examples(&self, rows: Range<usize>, device: &LogicalDevice) -> Result<Tensor> {
        let example: usize = self.x_shape[1..].iter().product();
        let mut shape = self.x_shape.to_vec();
        shape[0] = rows.len();
        Tensor::from_slice_on(
            &self.x[rows.start * example..rows.end * example],
            &shape,
            device,
        )
    }

    /// The targets of examples `rows` on `device`: int32 labels `[rows]`, or float32 targets
    /// `[rows, ...target_shape]`.
    pub(crate) fn labels(&self, rows: Range<usize>, device: &LogicalDevice) -> Result<Tensor> {
        if self.y_values.is_empty() {
            return Tensor::from_slice_on(&self.y[rows.clone()], &[rows.len()], device);
        }
        let per: usize = self.target_shape.iter().product();
        let mut shape = vec![rows.len()];
        shape.extend_from_slice(self.target_shape);
        Tensor::from_slice_on(
            &self.y_values[rows.start * per..rows.end * per],
            &shape,
            device,
        )
    }
}

/// A replica's job: its device's name (for messages) and the work.
type Job<'a, T> = (&'a str, Box<dyn FnOnce() -> Result<T> + Send + 'a>);

/// Runs one job per replica, each on its own thread (inline when there is one), and returns
/// their results in replica order, or the first replica's error. A panic in a job becomes that
/// replica's error, with one replica as with several (on a worker of a multi-worker job, the
/// step's vote then fails the step everywhere instead of the panic aborting the job).
fn on_every_replica<T: Send>(jobs: Vec<Job<'_, T>>) -> Result<Vec<T>> {
    let panicked = |device: &str, panic: Box<dyn std::any::Any + Send>| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Error::Model(format!("the replica on {device} panicked: {why}"))
    };
    if jobs.len() == 1 {
        return jobs
            .into_iter()
            .map(|(device, job)| {
                // Unwind-safe in practice: a job reads its replica's weights and makes new
                // tensors (phases 1 and evaluation write no parameter), so a panic leaves no
                // state half-updated.
                panic::catch_unwind(AssertUnwindSafe(|| as_replica_job(job)))
                    .unwrap_or_else(|p| Err(panicked(device, p)))
            })
            .collect();
    }
    let results: Vec<Result<T>> = thread::scope(|s| {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|(device, job)| {
                let handle = thread::Builder::new()
                    .name(format!("anygpu replica {device}"))
                    .spawn_scoped(s, || as_replica_job(job));
                (device, handle)
            })
            .collect();
        handles
            .into_iter()
            .map(|(device, h)| match h {
                Ok(h) => h.join().unwrap_or_else(|p| Err(panicked(device, p))),
                Err(e) => Err(Error::Model(format!(
                    "could not start a thread for the replica on {device}: {e}"
                ))),
            })
            .collect()
    });
    results.into_iter().collect()
}

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
        let opt = r.optimizer()?;
        let mut next = grads.iter();
        for (i, l) in layers.iter().enumerate() {
            let weights: Vec<&Tensor> = l.weights().into_iter().map(|(_, t)| t).collect();
            let layer_grads: Vec<Tensor> = next.by_ref().take(weights.len()).cloned().collect();
            opt.apply(i, &weights, &layer_grads)?;
        }
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

/// Adds this worker's loss sum and metric sums into `sums` (read from the devices).
fn host_sums(parts: &[StepPart], sums: &mut [f64]) -> Result<()> {
    for p in parts {
        sums[0] += f64::from(scalar(&p.loss_sum)?);
        for (s, m) in sums[1..].iter_mut().zip(&p.metrics) {
            *s += f64::from(scalar(m)?);
        }
    }
    Ok(())
}

fn scalar(t: &Tensor) -> Result<f32> {
    Ok(t.to_vec::<f32>()?.first().copied().unwrap_or(0.0))
}

/// The loss terms of a batch, each replica taking its shard (no gradients).
pub(crate) fn evaluate_batch(
    strategy: &MirroredStrategy,
    replicas: &[ReplicaView<'_>],
    batch: HostBatch<'_>,
    objective: &Objective,
) -> Result<StepOutput> {
    let jobs: Vec<Job<'_, Option<StepPart>>> = replicas
        .iter()
        .zip(batch.shards(strategy))
        .map(|(r, shard)| {
            let job = Box::new(move || {
                if shard.rows == 0 {
                    return Ok(None);
                }
                let (x, y) = batch.upload(shard, r.device)?;
                let (logits, _) = pass::forward(&r.stages(), &x, false)?;
                let terms = pass::loss_terms(r.device, &logits, &y, objective, 1.0)?;
                Ok(Some(StepPart {
                    loss_sum: terms.loss_sum,
                    metrics: terms.metrics,
                }))
            });
            (r.device.name(), job as Box<dyn FnOnce() -> _ + Send>)
        })
        .collect();
    let parts = on_every_replica(jobs)?.into_iter().flatten().collect();
    Ok(StepOutput::new(parts, batch.rows()).named(objective.metric_names()))
}

/// The model's last-layer output for a batch, each replica taking its shard, gathered in
/// order on the primary.
pub(crate) fn predict(
    strategy: &MirroredStrategy,
    replicas: &[ReplicaView<'_>],
    x: &[f32],
    x_shape: &[usize],
    output_shape: &[usize],
) -> Result<Tensor> {
    let rows = x_shape.first().copied().unwrap_or(0);
    let labels = vec![0i32; rows];
    let batch = HostBatch {
        x,
        x_shape,
        y: &labels,
        y_values: &[],
        target_shape: &[],
    };
    let shards = batch.shards(strategy);
    let jobs: Vec<Job<'_, Option<Tensor>>> = replicas
        .iter()
        .zip(&shards)
        .map(|(r, &shard)| {
            let job = Box::new(move || {
                if shard.rows == 0 {
                    return Ok(None);
                }
                let (x, _) = batch.upload(shard, r.device)?;
                Ok(Some(pass::forward(&r.stages(), &x, false)?.0))
            });
            (r.device.name(), job as Box<dyn FnOnce() -> _ + Send>)
        })
        .collect();
    let outputs = on_every_replica(jobs)?;
    let per_row: usize = output_shape.iter().product();
    let mut shape = vec![rows];
    shape.extend_from_slice(output_shape);
    let out = Tensor::empty_on(&shape, DType::F32, replicas[0].device)?;
    for (shard, output) in shards.iter().zip(outputs) {
        if let Some(o) = output {
            o.copy_elements_to(0, &out, shard.first * per_row, shard.rows * per_row)?;
        }
    }
    Ok(out)
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
