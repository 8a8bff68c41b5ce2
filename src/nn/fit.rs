//! `model.fit` and `model.evaluate`: the loops over a [`Dataset`], the progress bar and the
//! per-epoch lines.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::data::{Batch, BatchIter, Dataset};
use crate::distribute::{shared, MirroredStrategy, Workers};
use crate::error::{Error, Result};
use crate::nn::callbacks::{BatchLogs, Callback, FitContext, Position};
use crate::nn::history::{Evaluation, History};
use crate::nn::mirrored;
use crate::nn::pass;
use crate::nn::sequential::Sequential;
use crate::nn::step_output::{Accumulator, Means, PendingMeans, StepOutput, StepPart};
use crate::nn::verbosity::Verbosity;

impl Sequential {
    /// Trains for `epochs` epochs (`model.fit(dataset, epochs, steps_per_epoch,
    /// validation_data)`).
    ///
    /// Each epoch runs `steps_per_epoch` batches, or one pass over a finite dataset when it is
    /// `None`. With `steps_per_epoch`, batches continue across epochs from one iterator over
    /// the dataset, as Keras does with a repeated `tf.data` pipeline; if the dataset runs out,
    /// a new pass starts within the epoch (Keras ends the epoch short there, warning that the
    /// input ran out of data). After each epoch the model is evaluated on `validation`.
    ///
    /// The per-step loss and correct count are accumulated on the device with
    /// [`Tensor::add`](crate::Tensor::add) and read every [`set_log_every`](Sequential::set_log_every) steps and at
    /// the end of the epoch, so the device is not stalled every step. A read at a log step is
    /// started there and finished once the next step is recorded: the host waits for the log
    /// step while the device already runs the next one (the progress bar is a step behind). With
    /// [`Verbosity::ProgressBar`] each epoch shows a progress bar with the running loss,
    /// accuracy and images/s, then a line such as
    /// `429/429 - 12s - 28ms/step - accuracy: 0.8622 - loss: 0.3800 - val_accuracy: 0.8790 - val_loss: 0.3341`.
    ///
    /// Each finished epoch is recorded in [`history`](Sequential::history) at once (Keras'
    /// `model.history`), so a `fit` that fails in epoch 9 leaves the history of epochs 1–8
    /// there; callbacks ([`fit_with_callbacks`](Sequential::fit_with_callbacks)) can also write
    /// it out, or checkpoint the whole run, after every epoch.
    ///
    /// # Errors
    /// [`Error::Model`] before `compile`; [`Error::InvalidArgument`] for an unbatched or
    /// empty dataset, or an infinite one without `steps_per_epoch`; shape and device errors.
    pub fn fit(
        &mut self,
        dataset: &Dataset,
        epochs: usize,
        steps_per_epoch: Option<usize>,
        validation: Option<&Dataset>,
    ) -> Result<History> {
        self.fit_with_callbacks(dataset, epochs, steps_per_epoch, validation, &mut [])
    }

    /// [`fit`](Sequential::fit) with Keras callbacks (`model.fit(..., callbacks=[...])`):
    /// [`BackupAndRestore`](crate::nn::BackupAndRestore) to checkpoint every epoch and resume
    /// a killed run, [`ModelCheckpoint`](crate::nn::ModelCheckpoint),
    /// [`CsvLogger`](crate::nn::CsvLogger), [`TensorBoard`](crate::nn::TensorBoard), or a
    /// [`Callback`] of your own.
    ///
    /// ```
    /// use anygpu::data::Dataset;
    /// use anygpu::nn::{Activation, CsvLogger, Dense, Loss, Sequential, Sgd, Verbosity};
    /// let _cpu = anygpu::with_device("/cpu:0")?;
    /// let mut model = Sequential::new();
    /// model.add(Dense::new(2).activation(Activation::Softmax).input_shape(&[2]))?;
    /// model.compile(Loss::sparse_categorical_crossentropy(), Sgd::default(), &[])?;
    /// model.set_verbose(Verbosity::Silent);
    /// let data = Dataset::from_tensor_slices(vec![0.5; 8], &[2], vec![0, 1, 0, 1])?.batch(2, false);
    /// let csv = std::env::temp_dir().join(format!("anygpu-doc-{}.csv", std::process::id()));
    /// model.fit_with_callbacks(&data, 2, None, None, &mut [&mut CsvLogger::new(&csv)])?;
    /// assert_eq!(std::fs::read_to_string(&csv)?.lines().count(), 3); // header + 2 epochs
    /// # std::fs::remove_file(&csv).ok();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`fit`](Sequential::fit), and the callbacks' errors.
    pub fn fit_with_callbacks(
        &mut self,
        dataset: &Dataset,
        epochs: usize,
        steps_per_epoch: Option<usize>,
        validation: Option<&Dataset>,
        callbacks: &mut [&mut dyn Callback],
    ) -> Result<History> {
        if self.input_shape().is_none() {
            self.build(dataset.example_shape())?;
        }
        self.require_built("fit")?;
        self.compiled("fit")?;
        let steps = match (steps_per_epoch, dataset.len()) {
            (Some(0), _) => {
                return Err(Error::InvalidArgument(
                    "fit: steps_per_epoch must be positive".into(),
                ))
            }
            (Some(s), _) => s,
            (None, Some(0)) => {
                return Err(Error::InvalidArgument(
                    "fit: the dataset is empty; there is nothing to train on".into(),
                ))
            }
            (None, Some(n)) => n,
            (None, None) => {
                return Err(Error::InvalidArgument(
                    "fit: when providing an infinite dataset, you must specify the number of \
                     steps to run (steps_per_epoch)"
                        .into(),
                ))
            }
        };
        self.history = History::default();
        self.stop_training = false;
        // On a worker of a multi-worker job, every result only this worker may see (a
        // chief-only callback's file, a failed restore, validation) goes through a vote, so that
        // all workers stop together with the same error instead of some waiting in their next
        // collective for one that returned.
        let strategy = self.strategy().cloned();
        let workers = strategy.as_ref().and_then(MirroredStrategy::workers);
        if let Some(w) = workers {
            steps_agree(w, steps)?;
        }
        let data = format!("{}; {steps} steps an epoch", dataset.describe());
        let mut run = FitContext {
            model: self,
            epochs_done: 0,
            epochs,
            position: None,
            data,
        };
        for cb in callbacks.iter_mut() {
            let done = cb.on_train_begin(&mut run);
            shared(workers, "fit: a callback's on_train_begin", done)?;
        }
        // Where a restored checkpoint left the pipeline; else a new pass at the first batch.
        let resumed = match run.position.take() {
            Some(position) => {
                let max_taken = (run.epochs_done as u64).saturating_mul(steps as u64);
                position.resume(dataset, validation, max_taken)
            }
            None => Ok(None),
        };
        let mut train = shared(workers, "fit: resuming the dataset", resumed)?;
        for epoch in run.epochs_done..epochs {
            if steps_per_epoch.is_none() {
                // One whole pass per epoch.
                train = None;
            }
            run.epochs_done = epoch;
            for cb in callbacks.iter_mut() {
                let done = cb.on_epoch_begin(&mut run);
                shared(workers, "fit: a callback's on_epoch_begin", done)?;
            }
            run.model.fit_epoch(
                dataset,
                &mut train,
                (epoch, epochs, steps),
                validation,
                (&mut *callbacks, workers),
            )?;
            run.epochs_done = epoch + 1;
            run.position = Some(Position {
                iter_pass: train
                    .as_ref()
                    .filter(|_| steps_per_epoch.is_some())
                    .map(|(_, pass, _)| *pass),
                taken: train.as_ref().map_or(0, |(_, _, taken)| *taken),
                passes: dataset.passes_started(),
                validation_passes: validation.map(Dataset::passes_started),
            });
            for cb in callbacks.iter_mut() {
                let done = cb.on_epoch_end(&mut run);
                shared(workers, "fit: a callback's on_epoch_end", done)?;
            }
            if let Some(w) = workers {
                // A stop one worker's callback asked for (EarlyStopping on the validation loss
                // of its own devices, a GPU's next to a CPU's) stops them all: the others
                // would wait in the next epoch's collectives.
                let mut stops = [f64::from(u8::from(run.model.stop_training))];
                w.agree("fit: stop_training", Ok(()), &mut stops)?;
                run.model.stop_training = stops[0] > 0.0;
            }
            if run.model.stop_training {
                break;
            }
        }
        for cb in callbacks.iter_mut() {
            let done = cb.on_train_end(&mut run);
            shared(workers, "fit: a callback's on_train_end", done)?;
        }
        Ok(self.history.clone())
    }

    /// One epoch: `steps` batches from `train` (the iterator, its pass and the batches taken
    /// from it; a new pass when `None` or spent), then validation; the epoch's entries go into
    /// the history together, once all exist. The callbacks' batch hooks run at the steps they
    /// ask for.
    fn fit_epoch(
        &mut self,
        dataset: &Dataset,
        train: &mut Option<(BatchIter, u64, u64)>,
        (epoch, epochs, steps): (usize, usize, usize),
        validation: Option<&Dataset>,
        (callbacks, workers): (&mut [&mut dyn Callback], Option<&dyn Workers>),
    ) -> Result<()> {
        let bar = self.epoch_bar(epoch, epochs, steps);
        let start = Instant::now();
        let mut acc = Accumulator::default();
        let mut last_read: Means = (f64::NAN, Vec::new());
        let steps_before: u64 = self.history.steps.iter().map(|&s| s as u64).sum();
        let wants = |cb: &dyn Callback, global: u64| {
            cb.train_batch_interval()
                .is_some_and(|n| n > 0 && global.is_multiple_of(n))
        };
        // A log read started at a log step (its step, the examples by then).
        let mut late: Option<(PendingMeans, usize, usize)> = None;
        for step in 0..steps {
            let _span = crate::profiler::is_running().then(|| {
                crate::profiler::Trace::new(format!(
                    "train step {}",
                    steps_before + step as u64 + 1
                ))
            });
            let batch = next_batch(dataset, train);
            let out = match (batch, workers) {
                // Across workers a batch that cannot be read (or has the wrong shape) fails the
                // step's first vote in place of the step: every worker fails alike, and no
                // collective is added to a step.
                (Ok(b), Some(w)) => match self.check_host_batch("fit", &b) {
                    Ok(()) => self.train_batch(&b)?,
                    Err(e) => return Err(mirrored::vote_failed_step(w, &e)),
                },
                (Err(e), Some(w)) => return Err(mirrored::vote_failed_step(w, &e)),
                (batch, None) => self.train_batch(&batch?)?,
            };
            acc.push(out)?;
            if let Some((read, at, examples)) = late.take() {
                // The logs of the last log step, read now that this step is recorded: the
                // device runs this step while the host waits for that one.
                let _cause = crate::profiler::WaitCause::enter(LOG_CAUSE);
                last_read = read.finish()?;
                shown(
                    bar.as_ref(),
                    &last_read,
                    (steps_before, at, examples),
                    start,
                );
            }
            let done = step + 1;
            let global = steps_before + done as u64;
            let batch_hook = callbacks.iter().any(|cb| wants(&**cb, global));
            if done == steps || batch_hook {
                // The epoch's last logs, and those a callback's batch hook reads, at once.
                let _cause = crate::profiler::WaitCause::enter(LOG_CAUSE);
                last_read = acc.read()?;
                shown(
                    bar.as_ref(),
                    &last_read,
                    (steps_before, done, acc.examples),
                    start,
                );
            } else if done % self.log_every == 0 {
                // Started now, finished after the next step is recorded.
                late = Some((acc.read_begin()?, done, acc.examples));
            }
            if batch_hook {
                let logs = BatchLogs {
                    step: global,
                    batch: step,
                    loss: last_read.0,
                    accuracy: metric(&last_read, "accuracy"),
                };
                let mut run = FitContext {
                    model: self,
                    epochs_done: epoch,
                    epochs,
                    position: None,
                    data: String::new(),
                };
                for cb in callbacks.iter_mut() {
                    if wants(&**cb, global) {
                        let done = cb.on_train_batch_end(&mut run, &logs);
                        shared(workers, "fit: a callback's on_train_batch_end", done)?;
                    }
                }
            }
        }
        let elapsed = start.elapsed();
        if let Some(bar) = &bar {
            bar.finish_and_clear();
        }
        // Every worker evaluates the whole validation set on its own devices.
        let val = match validation {
            Some(v) => Some(shared(workers, "fit: validation", self.evaluate(v, None))?),
            None => None,
        };
        let history = &mut self.history;
        history.loss.push(last_read.0);
        for &(name, value) in &last_read.1 {
            history.push_metric("", name, value);
        }
        history.steps.push(steps);
        let secs = elapsed.as_secs_f64();
        history.epoch_seconds.push(secs);
        history
            .images_per_second
            .push(acc.examples as f64 / secs.max(1e-9));
        if let Some(v) = &val {
            history.val_loss.push(v.loss);
            if let Some(a) = v.accuracy {
                history.val_accuracy.push(a);
            }
            for (name, &value) in &v.metrics {
                history.push_metric("val_", name, value);
            }
        }
        if self.progress() != Verbosity::Silent {
            if self.progress() == Verbosity::OneLinePerEpoch {
                println!("Epoch {}/{epochs}", epoch + 1);
            }
            println!("{}", epoch_line(steps, elapsed, &last_read, val.as_ref()));
        }
        Ok(())
    }

    fn epoch_bar(&self, epoch: usize, epochs: usize, steps: usize) -> Option<ProgressBar> {
        if self.progress() != Verbosity::ProgressBar {
            return None;
        }
        println!("Epoch {}/{epochs}", epoch + 1);
        let bar = ProgressBar::new(steps as u64);
        let style = ProgressStyle::with_template(
            "{pos:>5}/{len:<5} [{bar:30.cyan/blue}] {elapsed_precise} - {msg}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        Some(bar)
    }

    /// Mean loss and accuracy over a dataset (`model.evaluate(dataset, steps)`): one pass, or
    /// `steps` batches.
    ///
    /// ```
    /// use anygpu::data::Dataset;
    /// use anygpu::nn::{Activation, Dense, Loss, Metric, Sequential, Sgd};
    /// let mut model = Sequential::new();
    /// model.add(Dense::new(3).activation(Activation::Softmax).input_shape(&[2]))?;
    /// model.compile(Loss::sparse_categorical_crossentropy(), Sgd::default(), &[Metric::Accuracy])?;
    /// let test = Dataset::from_tensor_slices(vec![0.5; 10], &[2], vec![0, 1, 2, 0, 1])?.batch(2, false);
    /// let result = model.evaluate(&test, None)?;
    /// assert_eq!(result.examples, 5);
    /// assert!(result.loss > 0.0 && result.accuracy.is_some());
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Model`] before `compile`; [`Error::InvalidArgument`] for an empty, unbatched or
    /// infinite (without `steps`) dataset.
    pub fn evaluate(&self, dataset: &Dataset, steps: Option<usize>) -> Result<Evaluation> {
        self.require_built("evaluate")?;
        let objective = self.objective("evaluate")?;
        if steps.is_none() && dataset.len().is_none() {
            return Err(Error::InvalidArgument(
                "evaluate: when providing an infinite dataset, you must specify the number of \
                 steps to run"
                    .into(),
            ));
        }
        let mut acc = Accumulator::default();
        let replicas = self.replica_layers();
        for (i, batch) in dataset.iter().take(steps.unwrap_or(usize::MAX)).enumerate() {
            self.check_host_batch("evaluate", &batch)?;
            let out = match self.strategy() {
                Some(strategy) => {
                    mirrored::evaluate_batch(strategy, &replicas, (&batch).into(), &objective)?
                }
                None => {
                    let (x, y) = self.batch_tensors("evaluate", &batch)?;
                    let stages = self.stages();
                    let (logits, _) = pass::forward(&stages, &x, false)?;
                    let last = stages[stages.len() - 1].device;
                    let terms = pass::loss_terms(last, &logits, &y, &objective, 1.0)?;
                    let part = StepPart {
                        loss_sum: terms.loss_sum,
                        metrics: terms.metrics,
                    };
                    StepOutput::new(vec![part], batch.batch_size()).named(objective.metric_names())
                }
            };
            acc.push(out)?;
            if (i + 1) % self.log_every == 0 {
                // Bounds how far the host runs ahead of the device.
                let _cause = crate::profiler::WaitCause::enter("evaluate: logs (log_every)");
                acc.read()?;
            }
        }
        if acc.examples == 0 {
            return Err(Error::InvalidArgument(
                "evaluate: the dataset is empty".into(),
            ));
        }
        let (loss, metrics) = acc.read()?;
        Ok(Evaluation {
            loss,
            accuracy: metric(&(loss, metrics.clone()), "accuracy"),
            examples: acc.examples,
            metrics: metrics
                .into_iter()
                .filter(|(n, _)| *n != "accuracy")
                .map(|(n, v)| (n.to_string(), v))
                .collect(),
        })
    }
}

/// The cause the profiler gives `fit`'s log reads.
const LOG_CAUSE: &str = "fit: logs (log_every, epoch end)";

/// Shows logs read at step `done` of the epoch (after `before` steps in earlier epochs, with
/// `examples` seen): the progress bar and `anygpu-smi`'s step count and time.
fn shown(
    bar: Option<&ProgressBar>,
    read: &Means,
    (before, done, examples): (u64, usize, usize),
    start: Instant,
) {
    crate::smi::record_step(
        before + done as u64,
        start.elapsed().as_secs_f64() / done as f64,
    );
    if let Some(bar) = bar {
        bar.set_position(done as u64);
        bar.set_message(progress_message(read, examples, start.elapsed()));
    }
}

/// The next training batch: from the current pass, or from a new one when there is none or it
/// is spent (counting the batches taken, for checkpoints).
fn next_batch(dataset: &Dataset, train: &mut Option<(BatchIter, u64, u64)>) -> Result<Batch> {
    if let Some((iter, _, taken)) = train.as_mut() {
        if let Some(b) = iter.next() {
            *taken += 1;
            return Ok(b);
        }
    }
    let pass = dataset.passes_started();
    let mut iter = dataset.iter();
    let b = iter
        .next()
        .ok_or_else(|| Error::InvalidArgument("fit: the dataset is empty".into()))?;
    *train = Some((iter, pass, 1));
    Ok(b)
}

/// The value of metric `name` in `read`.
fn metric(read: &Means, name: &str) -> Option<f64> {
    read.1.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
}

/// ` - accuracy: 0.8622 - loss: 0.3800`: the loss and the metrics in Keras' (sorted) order.
fn fmt_metrics(prefix: &str, (loss, metrics): &Means) -> String {
    let mut all: Vec<(&str, f64)> = metrics.iter().map(|&(n, v)| (n, v)).collect();
    all.push(("loss", *loss));
    all.sort_by(|a, b| a.0.cmp(b.0));
    let mut s = String::new();
    for (name, value) in all {
        let _ = write!(s, " - {prefix}{name}: {value:.4}");
    }
    s
}

fn progress_message(read: &Means, examples: usize, elapsed: Duration) -> String {
    let ips = examples as f64 / elapsed.as_secs_f64().max(1e-9);
    let metrics = fmt_metrics("", read);
    format!("{} - {ips:.0} images/s", metrics.trim_start_matches(" - "))
}

/// `429/429 - 12s - 28ms/step - accuracy: 0.8622 - loss: 0.3800 - val_accuracy: ... - val_loss: ...`
fn epoch_line(steps: usize, elapsed: Duration, train: &Means, val: Option<&Evaluation>) -> String {
    let secs = elapsed.as_secs_f64();
    let mut line = format!(
        "{steps}/{steps} - {:.0}s - {:.0}ms/step{}",
        secs,
        secs * 1e3 / steps.max(1) as f64,
        fmt_metrics("", train)
    );
    if let Some(v) = val {
        let mut metrics: Vec<(&'static str, f64)> =
            v.accuracy.map(|a| ("accuracy", a)).into_iter().collect();
        // The names come from the objective's static names; look them up to keep them 'static.
        for (name, &value) in &v.metrics {
            if let Some(n) = train.1.iter().map(|(n, _)| *n).find(|n| n == name) {
                metrics.push((n, value));
            }
        }
        line.push_str(&fmt_metrics("val_", &(v.loss, metrics)));
    }
    line
}

/// Every worker of a multi-worker job runs the same number of steps an epoch, or none starts:
/// a worker with a step more would wait in a collective the others never join. One vote on
/// the sum of the counts and of their squares: they equal `n·steps` and `n·steps²` on a worker
/// exactly when every worker has its `steps` (the counts' variance is then zero).
fn steps_agree(workers: &dyn Workers, steps: usize) -> Result<()> {
    let mine = steps as f64;
    let mut sums = [mine, mine * mine];
    workers.agree("fit: steps per epoch", Ok(()), &mut sums)?;
    let n = workers.replicas().len() as f64;
    if sums == [n * mine, n * mine * mine] {
        return Ok(());
    }
    Err(Error::Distributed {
        rank: workers.rank(),
        workers: workers.replicas().len(),
        request: "fit: steps per epoch".into(),
        cause: format!(
            "this worker's dataset gives {steps} steps an epoch, the workers' mean is {}: every \
             worker must read the same number of global batches (the same dataset, or \
             steps_per_epoch)",
            sums[0] / n
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_line_reads_like_keras() {
        let line = epoch_line(
            429,
            Duration::from_millis(12_012),
            &(0.38, vec![("accuracy", 0.8622)]),
            None,
        );
        assert_eq!(
            line,
            "429/429 - 12s - 28ms/step - accuracy: 0.8622 - loss: 0.3800"
        );
    }
}
