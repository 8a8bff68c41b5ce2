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
    /// first step; counted across epochs, restored ones included, so that a resumed run's
    /// TensorBoard curve continues where it stopped: Keras' TensorBoard counts from 0 again).
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
    /// Asked from `on_train_batch_end`, Keras stops at once, mid-epoch; here the epoch's
    /// remaining steps still run (under `MultiWorkerMirroredStrategy` every worker would
    /// have to agree on a stop at every step).
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
    /// `val_accuracy`, `learning_rate`, and every other compiled metric's key, such as
    /// `val_sparse_top_k_categorical_accuracy`), and the keys those logs have.
    pub fn epoch_log(&self, key: &str) -> (Option<f64>, Vec<String>) {
        let history = self.model.history();
        let epochs = history.epochs();
        let fixed = [
            "loss",
            "accuracy",
            "val_loss",
            "val_accuracy",
            "learning_rate",
        ];
        let keys: Vec<String> = fixed
            .into_iter()
            .map(str::to_string)
            .chain(history.metrics.keys().cloned())
            .filter(|k| {
                history
                    .get(k)
                    .is_some_and(|s| epochs > 0 && s.len() == epochs)
            })
            .collect();
        let value = keys
            .iter()
            .any(|k| k == key)
            .then(|| history.last(key))
            .flatten();
        (value, keys)
    }
}

/// Saves the model's weights after every epoch (Keras'
/// `ModelCheckpoint(filepath, save_weights_only=True)`), atomically, with
/// [`Sequential::save_weights`].
///
/// The file name is formatted as Keras' `filepath.format(epoch=epoch + 1, **logs)` is: `{epoch}`
/// becomes the epoch's number (1-based), `{val_loss}` or any other key of the epoch's logs its
/// value, with Python's format specs for widths and precisions (`{epoch:02d}`,
/// `{val_loss:.2f}`, `{loss:.3e}`), so every epoch keeps its own file; without a
/// placeholder, each save replaces the last. A key the logs do not have fails the save with
/// an error naming it (Keras' `KeyError`).
///
/// Differences from Keras: the weights are saved after every epoch (no `monitor`,
/// `save_best_only`, `mode` or `save_freq` in steps); `EarlyStopping(restore_best_weights)`
/// keeps the best epoch's weights instead.
///
/// ```
/// use anygpu::nn::ModelCheckpoint;
/// let every = ModelCheckpoint::new("runs/weights-{epoch:02d}-{val_loss:.2f}.safetensors");
/// let logs = |key: &str| (key == "val_loss").then_some(0.2951);
/// let path = every.path_for(3, logs)?;
/// assert_eq!(path, std::path::Path::new("runs/weights-03-0.30.safetensors"));
/// # Ok::<(), anygpu::Error>(())
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

    /// The file written after epoch `epoch` (1-based), the other placeholders read from
    /// `logs` (a key's value after that epoch, as [`History::last`] gives it).
    ///
    /// # Errors
    /// `InvalidArgument` for a placeholder that is not closed, names a key `logs` has no
    /// value for, or has a format spec this formatter does not know.
    pub fn path_for(&self, epoch: usize, logs: impl Fn(&str) -> Option<f64>) -> Result<PathBuf> {
        let invalid = |what: String| {
            Error::InvalidArgument(format!(
                "ModelCheckpoint filepath '{}': {what}",
                self.filepath
            ))
        };
        let mut out = String::with_capacity(self.filepath.len());
        let mut rest = self.filepath.as_str();
        while let Some(open) = rest.find(['{', '}']) {
            out.push_str(&rest[..open]);
            let (brace, after) = (&rest[open..=open], &rest[open + 1..]);
            // `{{` and `}}` are literal braces, as in Python.
            if after.starts_with(brace) {
                out.push_str(brace);
                rest = &after[1..];
                continue;
            }
            if brace == "}" {
                return Err(invalid(
                    "a '}' without its '{' (write '}}' for a brace)".into(),
                ));
            }
            let close = after
                .find('}')
                .ok_or_else(|| invalid("a '{' without its '}' (write '{{' for a brace)".into()))?;
            let (key, spec) = after[..close]
                .split_once(':')
                .unwrap_or((&after[..close], ""));
            let value =
                match key {
                    "epoch" => Value::Int(epoch as i64),
                    key => Value::Float(logs(key).ok_or_else(|| {
                        invalid(format!("no '{key}' in the logs of epoch {epoch}"))
                    })?),
                };
            out.push_str(
                &value
                    .format(spec)
                    .map_err(|e| invalid(format!("{{{key}:{spec}}}: {e}")))?,
            );
            rest = &after[close + 1..];
        }
        out.push_str(rest);
        Ok(PathBuf::from(out))
    }
}

/// A value a file name's placeholder formats.
enum Value {
    Int(i64),
    Float(f64),
}

impl Value {
    /// The value under a Python format spec `[0][width][.precision][d|f|e]`: `d` for the
    /// epoch, `f` or `e` for a log's value; no type gives the epoch's digits and the value's
    /// shortest round-trip digits (Python's `str` of a float, but for its exponent form).
    fn format(&self, spec: &str) -> std::result::Result<String, String> {
        let (zero, spec) = match spec.strip_prefix('0') {
            Some(rest) => (true, rest),
            None => (false, spec),
        };
        let (kind, spec) = match spec.char_indices().last() {
            Some((at, c @ ('d' | 'f' | 'e'))) => (Some(c), &spec[..at]),
            _ => (None, spec),
        };
        let (width, precision) = spec.split_once('.').unwrap_or((spec, ""));
        let number = |s: &str| -> std::result::Result<Option<usize>, String> {
            match s {
                "" => Ok(None),
                s => s
                    .parse()
                    .map(Some)
                    .map_err(|_| format!("'{s}' is not a number")),
            }
        };
        let (width, precision) = (number(width)?.unwrap_or(0), number(precision)?);
        let body = match (self, kind) {
            (Value::Int(i), None | Some('d')) if precision.is_none() => i.to_string(),
            (Value::Int(_), _) => return Err("the epoch takes 'd' and a width only".into()),
            (Value::Float(_), Some('d')) => return Err("'d' is for the epoch".into()),
            (Value::Float(v), Some('f')) => format!("{v:.*}", precision.unwrap_or(6)),
            (Value::Float(v), Some('e')) => {
                python_exponent(&format!("{v:.*e}", precision.unwrap_or(6)))
            }
            (Value::Float(v), None) if precision.is_none() => v.to_string(),
            (Value::Float(_), _) => return Err("a value takes 'f' or 'e' with a precision".into()),
        };
        let pad = width.saturating_sub(body.len());
        Ok(match (zero, body.strip_prefix('-')) {
            (true, Some(digits)) => format!("-{}{digits}", "0".repeat(pad)),
            (true, None) => format!("{}{body}", "0".repeat(pad)),
            (false, _) => format!("{}{body}", " ".repeat(pad)),
        })
    }
}

/// Rust's `1.5e-3` as Python writes it: `1.5e-03` (a sign and at least two exponent digits).
fn python_exponent(rust: &str) -> String {
    match rust.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => rust.to_string(),
    }
}

impl Callback for ModelCheckpoint {
    fn on_epoch_end(&mut self, fit: &mut FitContext<'_>) -> Result<()> {
        // Across workers only the chief writes (their weights are the same).
        if !fit.model.is_chief() {
            return Ok(());
        }
        let path = {
            let history = fit.history();
            self.path_for(fit.epochs_done, |key| history.last(key))?
        };
        fit.model.save_weights(path)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn path(filepath: &str, epoch: usize) -> Result<String> {
        let logs = |key: &str| match key {
            "loss" => Some(0.123456789),
            "val_loss" => Some(1.0 / 3.0),
            "val_accuracy" => Some(0.91875),
            "learning_rate" => Some(0.00015),
            _ => None,
        };
        let path = ModelCheckpoint::new(filepath).path_for(epoch, logs)?;
        Ok(path.to_string_lossy().into_owned())
    }

    #[test]
    fn file_names_format_as_pythons_str_format() {
        // Each expectation is Python's `filepath.format(epoch=..., loss=..., ...)`.
        let cases = [
            ("w-{epoch}.st", 7, "w-7.st"),
            ("w-{epoch:02d}.st", 7, "w-07.st"),
            ("w-{epoch:03}.st", 12, "w-012.st"),
            ("w-{epoch:4d}.st", 12, "w-  12.st"),
            ("w-{val_loss:.2f}.st", 1, "w-0.33.st"),
            ("{epoch:02d}-{val_accuracy:.3f}", 3, "03-0.919"),
            ("{loss:.0f}/{loss:08.3f}", 1, "0/0000.123"),
            ("lr-{learning_rate:.2e}", 1, "lr-1.50e-04"),
            ("lr-{learning_rate:e}", 1, "lr-1.500000e-04"),
            ("{val_loss:f}", 1, "0.333333"),
            ("{{epoch}}-{epoch}", 5, "{epoch}-5"),
            ("plain.safetensors", 9, "plain.safetensors"),
        ];
        for (filepath, epoch, expected) in cases {
            assert_eq!(path(filepath, epoch).unwrap(), expected, "{filepath}");
        }
        // Without a spec a value has its shortest round-trip digits, as Python's str.
        assert_eq!(path("{val_accuracy}", 1).unwrap(), "0.91875");
    }

    #[test]
    fn a_placeholder_the_logs_lack_or_a_malformed_one_is_an_error_naming_it() {
        let message = |filepath: &str| path(filepath, 2).unwrap_err().to_string();
        let missing = message("w-{val_auc:.2f}");
        assert!(
            missing.contains("no 'val_auc' in the logs of epoch 2"),
            "{missing}"
        );
        assert!(missing.contains("'w-{val_auc:.2f}'"), "{missing}");
        assert!(message("w-{epoch").contains("a '{' without its '}'"));
        assert!(message("w-}").contains("a '}' without its '{'"));
        assert!(message("{epoch:.2f}").contains("the epoch takes 'd'"));
        assert!(message("{loss:d}").contains("'d' is for the epoch"));
        assert!(message("{loss:x}").contains("'x' is not a number"));
    }
}
