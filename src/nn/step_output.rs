//! What training and evaluation steps leave on the devices, and the running sums over them:
//! nothing is read back to the host until asked.

use crate::error::Result;
use crate::tensor::{PendingWords, Tensor};

/// What one training step leaves on the device(s): the sum of the batch's per-example losses
/// and of each metric — one part per replica under a
/// [`MirroredStrategy`](crate::distribute::MirroredStrategy). Nothing is read back until asked.
#[derive(Clone, Debug)]
pub struct StepOutput {
    parts: Vec<StepPart>,
    /// Sums already on the host (a multi-worker step's, summed over the workers in its vote).
    host: Option<HostPart>,
    batch_size: usize,
    /// The metrics' names (Keras'), in the order of each part's sums.
    names: Vec<&'static str>,
}

/// Loss terms already read to the host: a multi-worker step builds its output from the sums
/// its last vote returned, since allocating device tensors after that vote could fail on one
/// worker alone.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct HostPart {
    pub(crate) loss_sum: f64,
    /// Each metric's sum, in the step's order.
    pub(crate) metrics: Vec<f64>,
}

impl HostPart {
    fn add(&mut self, other: &HostPart) {
        self.loss_sum += other.loss_sum;
        if self.metrics.len() < other.metrics.len() {
            self.metrics.resize(other.metrics.len(), 0.0);
        }
        for (a, b) in self.metrics.iter_mut().zip(&other.metrics) {
            *a += b;
        }
    }
}

/// One device's share of a [`StepOutput`].
#[derive(Clone, Debug)]
pub(crate) struct StepPart {
    /// Sum of the per-example losses, a scalar `f32` tensor.
    pub(crate) loss_sum: Tensor,
    /// Each metric's sum over the examples (`f32`, one element), in the model's metric order.
    pub(crate) metrics: Vec<Tensor>,
}

impl StepOutput {
    pub(crate) fn new(parts: Vec<StepPart>, batch_size: usize) -> StepOutput {
        StepOutput {
            parts,
            host: None,
            batch_size,
            names: Vec::new(),
        }
    }

    /// A step whose sums are on the host already.
    pub(crate) fn from_host(sums: HostPart, batch_size: usize) -> StepOutput {
        StepOutput {
            parts: Vec::new(),
            host: Some(sums),
            batch_size,
            names: Vec::new(),
        }
    }

    /// Names the metrics of the parts' sums.
    pub(crate) fn named(mut self, names: Vec<&'static str>) -> StepOutput {
        self.names = names;
        self
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
        let mut sum = self.host.as_ref().map_or(0.0, |h| h.loss_sum as f32);
        for p in &self.parts {
            sum += read_scalar(&p.loss_sum)?;
        }
        Ok(sum / self.batch_size.max(1) as f32)
    }

    /// Reads every metric's mean over the batch, with its Keras name, in `compile` order
    /// (waits for the step).
    ///
    /// # Errors
    /// A device error.
    pub fn metrics(&self) -> Result<Vec<(&'static str, f32)>> {
        let mut sums: Vec<f32> = self
            .host
            .as_ref()
            .map(|h| h.metrics.iter().map(|&v| v as f32).collect())
            .unwrap_or_default();
        for p in &self.parts {
            if sums.len() < p.metrics.len() {
                sums.resize(p.metrics.len(), 0.0);
            }
            for (s, t) in sums.iter_mut().zip(&p.metrics) {
                *s += read_scalar(t)?;
            }
        }
        let n = self.batch_size.max(1) as f32;
        Ok(self
            .names
            .iter()
            .zip(sums)
            .map(|(&name, s)| (name, s / n))
            .collect())
    }

    /// Reads the `accuracy` metric, when the model tracks it (waits for the step).
    ///
    /// # Errors
    /// A device error.
    pub fn accuracy(&self) -> Result<Option<f32>> {
        if !self.names.contains(&"accuracy") {
            return Ok(None);
        }
        Ok(self
            .metrics()?
            .into_iter()
            .find(|(n, _)| *n == "accuracy")
            .map(|(_, v)| v))
    }
}

fn read_scalar(t: &Tensor) -> Result<f32> {
    let _cause = crate::profiler::WaitCause::enter("reading a step's loss or metrics");
    Ok(t.to_vec::<f32>()?.first().copied().unwrap_or(0.0))
}

/// Running sums of a loop over batches, kept on the devices: one part per device.
#[derive(Default)]
pub(crate) struct Accumulator {
    parts: Vec<StepPart>,
    host: Option<HostPart>,
    names: Vec<&'static str>,
    pub(crate) examples: usize,
}

/// What a loop reads: the mean loss and each metric's mean, by name.
pub(crate) type Means = (f64, Vec<(&'static str, f64)>);

impl Accumulator {
    pub(crate) fn push(&mut self, step: StepOutput) -> Result<()> {
        if self.names.is_empty() {
            self.names = step.names;
        }
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
                    for (a, m) in acc.metrics.iter_mut().zip(&part.metrics) {
                        *a = a.add(m)?;
                    }
                }
            }
        }
        if let Some(h) = step.host {
            self.host.get_or_insert_with(HostPart::default).add(&h);
        }
        self.examples += step.batch_size;
        Ok(())
    }

    /// Reads `(mean loss, metrics)`; waits for the steps so far.
    pub(crate) fn read(&self) -> Result<Means> {
        self.read_begin()?.finish()
    }

    // ---- reads finished later ----
    /// Starts reading `(mean loss, metrics)` of the steps so far without waiting:
    /// [`PendingMeans::finish`] waits for those steps only, so work recorded in between (the
    /// next step) keeps the device busy meanwhile. The same sums as [`Accumulator::read`].
    pub(crate) fn read_begin(&self) -> Result<PendingMeans> {
        let part_reads = self
            .parts
            .iter()
            .map(|p| {
                Ok((
                    p.loss_sum.words_begin()?,
                    p.metrics
                        .iter()
                        .map(Tensor::words_begin)
                        .collect::<Result<Vec<_>>>()?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PendingMeans {
            parts: part_reads,
            host: self.host.clone(),
            examples: self.examples,
            names: self.names.clone(),
        })
    }
}

/// The sums of an [`Accumulator`] on their way to the host: [`Accumulator::read_begin`].
pub(crate) struct PendingMeans {
    /// Per part, its loss sum and each metric's sum.
    parts: Vec<(PendingWords, Vec<PendingWords>)>,
    host: Option<HostPart>,
    examples: usize,
    names: Vec<&'static str>,
}

impl PendingMeans {
    /// Waits for the sums and returns `(mean loss, metrics)`, added and divided in the order
    /// [`StepOutput::loss`] and [`StepOutput::metrics`] use.
    pub(crate) fn finish(self) -> Result<Means> {
        if self.parts.is_empty() && self.host.is_none() {
            return Ok((f64::NAN, Vec::new()));
        }
        let _cause = crate::profiler::WaitCause::enter("reading a step's loss or metrics");
        let scalar = |w: PendingWords| -> Result<f32> {
            Ok(w.finish()?.first().map_or(0.0, |&b| f32::from_bits(b)))
        };
        let mut loss = self.host.as_ref().map_or(0.0, |h| h.loss_sum as f32);
        let mut sums: Vec<f32> = self
            .host
            .as_ref()
            .map(|h| h.metrics.iter().map(|&v| v as f32).collect())
            .unwrap_or_default();
        for (l, metrics) in self.parts {
            loss += scalar(l)?;
            if sums.len() < metrics.len() {
                sums.resize(metrics.len(), 0.0);
            }
            for (s, m) in sums.iter_mut().zip(metrics) {
                *s += scalar(m)?;
            }
        }
        let n = self.examples.max(1) as f32;
        let metrics = self
            .names
            .iter()
            .zip(sums)
            .map(|(&name, s)| (name, f64::from(s / n)))
            .collect();
        let loss = if self.examples == 0 {
            f32::NAN
        } else {
            loss / n
        };
        Ok((f64::from(loss), metrics))
    }
}
