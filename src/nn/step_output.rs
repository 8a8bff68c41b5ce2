//! What training and evaluation steps leave on the devices, and the running sums over them:
//! nothing is read back to the host until asked.

use crate::error::Result;
use crate::tensor::Tensor;

/// What one training step leaves on the device(s): the sum of the batch's per-example losses
/// and its number of correct predictions — one part per replica under a
/// [`MirroredStrategy`](crate::distribute::MirroredStrategy). Nothing is read back until asked.
#[derive(Clone, Debug)]
pub struct StepOutput {
    parts: Vec<StepPart>,
    /// Sums already on the host (a multi-worker step's, summed over the workers in its vote).
    host: Option<HostPart>,
    batch_size: usize,
}

/// Loss terms already read to the host: a multi-worker step builds its output from the sums
/// its last vote returned, since allocating device tensors after that vote could fail on one
/// worker alone.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct HostPart {
    pub(crate) loss_sum: f64,
    pub(crate) correct: Option<f64>,
}

impl HostPart {
    fn add(&mut self, other: HostPart) {
        self.loss_sum += other.loss_sum;
        self.correct = match (self.correct, other.correct) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
    }
}

/// One device's share of a [`StepOutput`].
#[derive(Clone, Debug)]
pub(crate) struct StepPart {
    /// Sum of the per-example losses, a scalar `f32` tensor.
    pub(crate) loss_sum: Tensor,
    /// Correct predictions (`f32`, shape `[1]`) when the model tracks accuracy.
    pub(crate) correct: Option<Tensor>,
}

impl StepOutput {
    pub(crate) fn new(parts: Vec<StepPart>, batch_size: usize) -> StepOutput {
        StepOutput {
            parts,
            host: None,
            batch_size,
        }
    }

    /// A step whose sums are on the host already.
    pub(crate) fn from_host(sums: HostPart, batch_size: usize) -> StepOutput {
        StepOutput {
            parts: Vec::new(),
            host: Some(sums),
            batch_size,
        }
    }

    /// Examples in the batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Reads the mean loss of the batch (waits for the step); NaN for an empty batch.
    ///
    /// # Errors
    /// A device error.
    pub fn loss(&self) -> Result<f32> {
        if self.batch_size == 0 {
            return Ok(f32::NAN);
        }
        let mut sum = self.host.map_or(0.0, |h| h.loss_sum as f32);
        for p in &self.parts {
            sum += read_scalar(&p.loss_sum)?;
        }
        Ok(sum / self.batch_size.max(1) as f32)
    }

    /// Reads the fraction of correct predictions, when the model tracks accuracy (waits for
    /// the step).
    ///
    /// # Errors
    /// A device error.
    pub fn accuracy(&self) -> Result<Option<f32>> {
        let mut sum = self.host.and_then(|h| h.correct).map(|c| c as f32);
        for c in self.parts.iter().filter_map(|p| p.correct.as_ref()) {
            *sum.get_or_insert(0.0) += read_scalar(c)?;
        }
        Ok(sum.map(|s| s / self.batch_size.max(1) as f32))
    }
}

fn read_scalar(t: &Tensor) -> Result<f32> {
    Ok(t.to_vec::<f32>()?.first().copied().unwrap_or(0.0))
}

/// Running sums of a loop over batches, kept on the devices: one part per device.
#[derive(Default)]
pub(crate) struct Accumulator {
    parts: Vec<StepPart>,
    host: Option<HostPart>,
    pub(crate) examples: usize,
}

impl Accumulator {
    pub(crate) fn push(&mut self, step: StepOutput) -> Result<()> {
        for part in step.parts {
            let device = part.loss_sum.device_handle();
            match self
                .parts
                .iter_mut()
                .find(|p| p.loss_sum.device_handle().same_device(device))
            {
                None => self.parts.push(part),
                Some(acc) => {
                    // On the part's device: unscoped, an op on CPU tensors would go to the
                    // default device (a GPU, when there is a hardware one).
                    let _on_part = crate::placement::with_device(device)?;
                    acc.loss_sum = acc.loss_sum.add(&part.loss_sum)?;
                    acc.correct = match (acc.correct.take(), part.correct) {
                        (Some(a), Some(c)) => Some(a.add(&c)?),
                        (a, c) => a.or(c),
                    };
                }
            }
        }
        if let Some(h) = step.host {
            self.host.get_or_insert_with(HostPart::default).add(h);
        }
        self.examples += step.batch_size;
        Ok(())
    }

    /// Reads `(mean loss, accuracy)`; waits for the steps so far.
    pub(crate) fn read(&self) -> Result<(f64, Option<f64>)> {
        if self.parts.is_empty() && self.host.is_none() {
            return Ok((f64::NAN, None));
        }
        let total = StepOutput {
            parts: self.parts.clone(),
            host: self.host,
            batch_size: self.examples,
        };
        Ok((total.loss()? as f64, total.accuracy()?.map(f64::from)))
    }
}
