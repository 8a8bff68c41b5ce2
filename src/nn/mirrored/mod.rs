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
//!
//! The replicas here, with evaluation and prediction; the batch's slices in `batch.rs`; the
//! training step in `step.rs`.

use std::panic::{self, AssertUnwindSafe};
use std::thread;

use crate::device::LogicalDevice;
use crate::distribute::{as_replica_job, MirroredStrategy, Workers};
use crate::error::{Error, Result};
use crate::mixed_precision::Policy;
use crate::nn::layers::{set_variable, variables, Layer};
use crate::nn::objective::Objective;
use crate::nn::optimizer::{Optimizer, OptimizerState};
use crate::nn::pass::{self, Stage};
use crate::nn::step_output::{StepOutput, StepPart};
use crate::tensor::{DType, Tensor};

mod batch;
mod step;
pub(crate) use batch::HostBatch;
pub(crate) use step::{train_step, vote_failed_step};

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
