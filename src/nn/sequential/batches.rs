//! What a batch must look like: a tensor batch and a host batch checked against the model's
//! input shape and its compiled loss, and a host batch moved to the first and last layers'
//! devices.

use crate::data::Batch;
use crate::error::{Error, Result};
use crate::nn::mirrored::HostBatch;
use crate::tensor::{DType, Tensor};

use super::Sequential;

impl Sequential {
    pub(in crate::nn) fn check_batch(
        &self,
        what: &'static str,
        x: &Tensor,
        y: Option<&Tensor>,
    ) -> Result<usize> {
        let input = self.input_shape().unwrap_or(&[]);
        let shape = x.shape();
        if shape.len() != input.len() + 1 || shape[1..] != *input {
            return Err(Error::ShapeMismatch {
                op: "Sequential",
                lhs: shape.to_vec(),
                rhs: input.to_vec(),
                hint: format!(
                    ": {what} expects a batch of shape [batch, {}]",
                    input
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        x.expect_dtype(what, DType::F32)?;
        let n = shape[0];
        if let Some(y) = y {
            self.objective(what)?.check_targets(
                what,
                (y.shape(), y.dtype()),
                n,
                self.output_shape().unwrap_or(&[]),
            )?;
        }
        Ok(n)
    }

    /// Checks a host batch's shape as [`check_batch`](Sequential::check_batch) does a tensor's.
    pub(in crate::nn) fn check_host_batch(&self, what: &'static str, batch: &Batch) -> Result<()> {
        let input = self.input_shape().unwrap_or(&[]);
        let shape = &batch.x_shape;
        if shape.len() != input.len() + 1 {
            return Err(Error::InvalidArgument(format!(
                "{what}: the dataset yields elements of shape {shape:?}, not batches of examples \
                 of shape {input:?}; call .batch(batch_size) on it"
            )));
        }
        if shape[1..] != *input || batch.batch_size() != shape[0] {
            return Err(Error::ShapeMismatch {
                op: "Sequential",
                lhs: shape.clone(),
                rhs: input.to_vec(),
                hint: format!(
                    ": {what} expects batches of shape [batch, {input:?}] with one target per \
                     example, got {}",
                    batch.batch_size()
                ),
            });
        }
        let (target_shape, dtype) = match batch.has_float_targets() {
            true => {
                let mut t = vec![shape[0]];
                t.extend_from_slice(&batch.target_shape);
                (t, DType::F32)
            }
            false => (vec![shape[0]], DType::I32),
        };
        self.objective(what)?.check_targets(
            what,
            (&target_shape, dtype),
            shape[0],
            self.output_shape().unwrap_or(&[]),
        )
    }

    pub(in crate::nn) fn batch_tensors(
        &self,
        what: &str,
        batch: &Batch,
    ) -> Result<(Tensor, Tensor)> {
        let input = self.input_shape().unwrap_or(&[]);
        if batch.x_shape.len() != input.len() + 1 {
            return Err(Error::InvalidArgument(format!(
                "{what}: the dataset yields elements of shape {:?}, not batches of examples of \
                 shape {input:?}; call .batch(batch_size) on it",
                batch.x_shape
            )));
        }
        let first = &self.entries[0].device;
        let last = &self.entries[self.entries.len() - 1].device;
        let x = Tensor::from_slice_on(&batch.x, &batch.x_shape, first)?;
        let y = HostBatch::from(batch).labels(0..batch.batch_size(), last)?;
        Ok((x, y))
    }
}
