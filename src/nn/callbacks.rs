//! Keras callbacks for [`Sequential::fit_with_callbacks`]: the [`Callback`] trait, what a
//! callback sees ([`FitContext`]), and two of Keras' own: [`ModelCheckpoint`] (the weights
//! after every epoch) and [`CsvLogger`] (the history after every epoch).
//! [`BackupAndRestore`](crate::nn::BackupAndRestore), which also resumes, is in
//! `checkpoint.rs`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::atomic_file::write_atomically;
use crate::data::{BatchIter, Dataset};
use crate::error::{Error, Result};
use crate::nn::history::History;
use crate::nn::sequential::Sequential;

/// Hooks into [`Sequential::fit_with_callbacks`] (Keras' `keras.callbacks.Callback`).
///
/// Every hook gets the model and the run's state through a [`FitContext`]; an error from a hook
/// ends `fit` with that error (the epochs completed stay in
/// [`Sequential::history`]). Hooks run in the order the callbacks are given.
///
/// ```
/// use anygpu::nn::{Callback, FitContext};
///
/// /// Prints the loss after every epoch.
/// struct PrintLoss;
/// impl Callback for PrintLoss {
///     fn on_epoch_end(&mut self, fit: &mut FitContext<'_>) -> anygpu::Result<()> {
///         println!("epoch {}: loss {:?}", fit.epoch(), fit.history().last("loss"));
///         Ok(())
///     }
/// }
/// ```
pub trait Callback {
    /// Before the first epoch runs: [`BackupAndRestore`](crate::nn::BackupAndRestore)
    /// restores a checkpoint here, after which [`FitContext::epoch`] is the number of epochs
    /// already done.
    ///
    /// # Errors
    /// Ends `fit` before any training.
    fn on_train_begin(&mut self, fit: &mut FitContext<'_>) -> Result<()> {
        let _ = fit;
        Ok(())
    }

    /// Before every epoch (Keras' `on_epoch_begin`); [`FitContext::epoch`] is the 0-based
    /// index of the epoch about to run.
    ///
    /// # Errors
    /// Ends `fit` before the epoch.
    fn on_epoch_begin(&mut self, fit: &mut FitContext<'_>) -> Result<()> {
        let _ = fit;
        Ok(())
    }

    /// After every epoch, once its entries (validation included) are in the history.
    ///
    /// # Errors
    /// Ends `fit`; the epoch stays in the history.
    fn on_epoch_end(&mut self, fit: &mut FitContext<'_>) -> Result<()> {
        let _ = fit;
        Ok(())
    }

    /// How often [`on_train_batch_end`](Callback::on_train_batch_end) runs: after every
    /// training step whose number ([`BatchLogs::step`]) is a multiple of this; `None` (the
    /// default) or 0, never. Reading the running loss waits for the device, so a callback asks
    /// only for the steps it needs.
    fn train_batch_interval(&self) -> Option<u64> {
        None
    }

    /// After a training step, at the interval [`train_batch_interval`](Callback::train_batch_interval)
    /// asks for, with the epoch's running loss and accuracy (Keras' `on_train_batch_end(batch,
    /// logs)`). The step is not yet in the history, and [`FitContext::epoch`] is the epochs
    /// finished before it.
    ///
    /// # Errors
    /// Ends `fit`; the epoch in progress is not recorded.
    fn on_train_batch_end(&mut self, fit: &mut FitContext<'_>, logs: &BatchLogs) -> Result<()> {
        let _ = (fit, logs);
        Ok(())
    }

    /// After the last epoch, when every epoch succeeded.
    ///
    /// # Errors
    /// Ends `fit` with this error, the whole history recorded.
    fn on_train_end(&mut self, fit: &mut FitContext<'_>) -> Result<()> {
        let _ = fit;
        Ok(())
    }
}

/// The running metrics after a training step, for [`Callback::on_train_batch_end`].
///
/// ```
/// use anygpu::nn::BatchLogs;
/// let logs = BatchLogs { step: 12, batch: 1, loss: 0.5, accuracy: None };
/// assert_eq!(logs.step, 12);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchLogs {
    /// Training steps run so far in this run, the one just finished included (1 after the
    /// first step; counted across epochs, restored ones included, as Keras' TensorBoard counts
    /// its batch steps).
    pub step: u64,
    /// The step's 0-based index in its epoch (Keras' `batch`).
    pub batch: usize,
    /// Mean loss over the epoch's examples so far.
    pub loss: f64,
    /// Accuracy over the epoch's examples so far (with the `accuracy` metric).
    pub accuracy: Option<f64>,
}

/// Where a training pipeline stands: enough to rebuild the same stream of batches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Position {
    /// The pass the training iterator is in, `None` when the next epoch starts a new one.
    pub(crate) iter_pass: Option<u64>,
    /// Batches already taken from that pass.
    pub(crate) taken: u64,
    /// The training dataset's pass counter ([`Dataset::passes_started`]).
    pub(crate) passes: u64,
    /// The validation dataset's pass counter.
    pub(crate) validation_passes: Option<u64>,
}

impl Position {
    /// Moves both datasets to this position; the training iterator (when mid-pass), with its
    /// pass number and the batches taken, is returned.
    ///
    /// `max_taken` bounds the batches replayed: what the epochs done could have taken (a
    /// dataset that repeats forever never runs out, whatever the file says).
    pub(crate) fn resume(
        &self,
        dataset: &Dataset,
        validation: Option<&Dataset>,
        max_taken: u64,
    ) -> Result<Option<(BatchIter, u64, u64)>> {
        let resumed = match self.iter_pass {
            None => None,
            Some(_) if self.taken > max_taken => {
                return Err(Error::InvalidArgument(format!(
                    "fit: the checkpoint says {} batches were taken from the current pass, more \
                     than its epochs could take ({max_taken}): it is corrupt",
                    self.taken
                )))
            }
            Some(pass) => {
                dataset.set_passes_started(pass);
                let mut iter = dataset.iter();
                for skipped in 0..self.taken {
                    if iter.next().is_none() {
                        return Err(Error::InvalidArgument(format!(
                            "fit: the checkpoint stopped after batch {} of pass {pass}, but \
                             this dataset's pass ends after {skipped}: resume with the \
                             dataset the checkpoint was written with",
                            self.taken
                        )));
                    }
                }
                Some((iter, pass, self.taken))
            }
        };
        dataset.set_passes_started(self.passes);
        if let (Some(v), Some(p)) = (validation, self.validation_passes) {
            v.set_passes_started(p);
        }
        Ok(resumed)
    }
}

/// What a [`Callback`] sees of a `fit` in progress: the model, the epochs done and how many
/// were asked for.
pub struct FitContext<'a> {
    pub(crate) model: &'a mut Sequential,
    /// Epochs done: restored ones included.
    pub(crate) epochs_done: usize,
    pub(crate) epochs: usize,
    /// Where the datasets stand after `epochs_done` epochs (set by `fit` after every epoch;
    /// set by a restore before the first).
    pub(crate) position: Option<Position>,
    /// What a checkpoint's position is only valid for: the training data's batch size, batches
    /// per pass and steps per epoch (a resume with other ones would continue elsewhere).
    pub(crate) data: String,
}

impl FitContext<'_> {
    /// The model being trained.
    pub fn model(&self) -> &Sequential {
        self.model
    }

    /// The history so far ([`Sequential::history`]).
    pub fn history(&self) -> &History {
        self.model.history()
    }

    /// Epochs done so far, 1-based after an epoch (Keras passes the 0-based index of the
    /// epoch just finished; this is that plus one).
    pub fn epoch(&self) -> usize {
        self.epochs_done
    }

    /// The `epochs` given to `fit`.
    pub fn epochs(&self) -> usize {
        self.epochs
    }

    /// The model, to change: its weights ([`Sequential::set_weights`]), its learning rate
    /// ([`Sequential::set_learning_rate`]), `stop_training`.
    pub fn model_mut(&mut self) -> &mut Sequential {
        self.model
    }

    /// Asks `fit` to stop once this epoch is done (Keras' `self.model.stop_training = True`).
    pub fn stop_training(&mut self) {
        self.model.set_stop_training(true);
    }

    /// Logs the learning rate of the epoch just finished (`logs["learning_rate"]`), once per
    /// epoch whoever asks: [`History::learning_rate`].
    pub fn log_learning_rate(&mut self) {
        let Some(lr) = self.model.learning_rate() else {
            return;
        };
        let history = &mut self.model.history;
        if history.learning_rate.len() < history.epochs() {
            history.learning_rate.push(f64::from(lr));
        }
    }

    /// The value of `key` in the last epoch's logs (`loss`, `accuracy`, `val_loss`,
    /// `val_accuracy`, `learning_rate`), and the keys those logs have.
    pub fn epoch_log(&self, key: &str) -> (Option<f64>, Vec<&'static str>) {
        let history = self.model.history();
        let epochs = history.epochs();
        let keys: Vec<&'static str> = [
            "loss",
            "accuracy",
            "val_loss",
            "val_accuracy",
            "learning_rate",
        ]
        .into_iter()
        .filter(|k| {
            history
                .get(k)
                .is_some_and(|s| epochs > 0 && s.len() == epochs)
        })
        .collect();
        let value = keys.contains(&key).then(|| history.last(key)).flatten();
        (value, keys)
    }
}

/// Saves the model's weights after every epoch (Keras'
/// `ModelCheckpoint(filepath, save_weights_only=True)`), atomically, with
/// [`Sequential::save_weights`].
///
/// `{epoch}` in the file name becomes the epoch's number (1-based, as Keras formats it), so
/// every epoch keeps its own file; without it, each save replaces the last.
///
/// ```
/// use anygpu::nn::ModelCheckpoint;
/// let every = ModelCheckpoint::new("runs/weights-{epoch}.safetensors");
/// assert_eq!(every.path_for(3), std::path::Path::new("runs/weights-3.safetensors"));
/// ```
#[derive(Clone, Debug)]
pub struct ModelCheckpoint {
    filepath: String,
}

impl ModelCheckpoint {
    /// Saves to `filepath` after every epoch.
    pub fn new(filepath: impl AsRef<Path>) -> ModelCheckpoint {
        ModelCheckpoint {
            filepath: filepath.as_ref().to_string_lossy().into_owned(),
        }
    }

    /// The file written after epoch `epoch` (1-based).
    pub fn path_for(&self, epoch: usize) -> PathBuf {
        PathBuf::from(self.filepath.replace("{epoch}", &epoch.to_string()))
    }
}

impl Callback for ModelCheckpoint {
    fn on_epoch_end(&mut self, fit: &mut FitContext<'_>) -> Result<()> {
        // Across workers only the chief writes (their weights are the same).
        if !fit.model.is_chief() {
            return Ok(());
        }
        fit.model.save_weights(self.path_for(fit.epochs_done))
    }
}

/// Writes the history to a CSV file after every epoch (Keras' `CSVLogger`): a header
/// `epoch,accuracy,loss,val_accuracy,val_loss` (the columns the run has, Keras' sorted order),
/// then one row per epoch, `epoch` counted from 0 as Keras does.
///
/// Differences from Keras: the whole file is rewritten atomically after every epoch from the
/// model's history (which a resumed run restores), rather than appended to, so a crash never
/// leaves half a row and a resumed run's file has every epoch once.
///
/// ```
/// use anygpu::nn::{CsvLogger, History};
/// let h = History { loss: vec![0.5, 0.25], ..History::default() };
/// assert_eq!(CsvLogger::format(&h), "epoch,loss\n0,0.5\n1,0.25\n");
/// ```
#[derive(Clone, Debug)]
pub struct CsvLogger {
    path: PathBuf,
}

impl CsvLogger {
    /// Writes to `path`.
    pub fn new(path: impl AsRef<Path>) -> CsvLogger {
        CsvLogger {
            path: path.as_ref().to_path_buf(),
        }
    }

    /// The CSV text of `history`.
    pub fn format(history: &History) -> String {
        let mut columns: Vec<(&str, &[f64])> = [
            ("accuracy", &history.accuracy[..]),
            ("loss", &history.loss[..]),
            ("val_accuracy", &history.val_accuracy[..]),
            ("val_loss", &history.val_loss[..]),
        ]
        .into_iter()
        .chain(history.metrics.iter().map(|(k, v)| (k.as_str(), &v[..])))
        .filter(|(_, values)| !values.is_empty())
        .collect();
        columns.sort_by(|a, b| a.0.cmp(b.0));
        let mut out = String::from("epoch");
        for (name, _) in &columns {
            let _ = write!(out, ",{name}");
        }
        out.push('\n');
        for epoch in 0..history.epochs() {
            let _ = write!(out, "{epoch}");
            for (_, values) in &columns {
                match values.get(epoch) {
                    Some(v) => {
                        let _ = write!(out, ",{v}");
                    }
                    None => out.push(','),
                }
            }
            out.push('\n');
        }
        out
    }
}

impl Callback for CsvLogger {
    fn on_epoch_end(&mut self, fit: &mut FitContext<'_>) -> Result<()> {
        if !fit.model.is_chief() {
            return Ok(());
        }
        write_atomically(&self.path, Self::format(fit.history()).as_bytes())
    }
}
