//! A global batch's host slices ([`HostBatch`]) and how they are cut among the replicas (and
//! among the workers of a multi-worker job), then uploaded to each replica's device.

use std::ops::Range;

use crate::data::Batch;
use crate::device::LogicalDevice;
use crate::distribute::{worker_rows, MirroredStrategy};
use crate::error::Result;
use crate::tensor::Tensor;

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
pub(super) struct Shard {
    pub(super) first: usize,
    pub(super) rows: usize,
}

impl HostBatch<'_> {
    /// The shards of a training step. A worker of a multi-worker job takes its replicas'
    /// part of the global batch (TF's auto-shard by data): the batch is cut among the replicas
    /// of all workers, in rank order, as [`MirroredStrategy::replica_batch_sizes`] cuts it
    /// among local ones.
    pub(super) fn worker_shards(&self, strategy: &MirroredStrategy) -> Vec<Shard> {
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

    pub(super) fn shards(&self, strategy: &MirroredStrategy) -> Vec<Shard> {
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
    pub(super) fn upload(&self, shard: Shard, device: &LogicalDevice) -> Result<(Tensor, Tensor)> {
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
