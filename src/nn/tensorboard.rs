//! Keras' `TensorBoard` callback: the learning curves of a `fit`, live in `tensorboard
//! --logdir`.

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::nn::callbacks::{BatchLogs, Callback, FitContext};
use crate::nn::event_file::{self, EventFile, Histogram, Value};

/// Buckets of a weight histogram (TensorFlow's `tf.summary.histogram` default).
const HISTOGRAM_BUCKETS: usize = 30;

/// Writes TensorBoard event files during `fit` (Keras'
/// `keras.callbacks.TensorBoard(log_dir, histogram_freq, update_freq)`), so `tensorboard
/// --logdir LOG_DIR` shows the run as it trains. No TensorFlow or Python is needed to write
/// them.
///
/// As Keras lays them out:
/// * `LOG_DIR/train/events.out.tfevents.<secs>.<host>.<pid>.v2`: after every epoch
///   `epoch_loss`, `epoch_accuracy` (with the accuracy metric) and `epoch_learning_rate`, at
///   the 0-based epoch as step; with [`update_freq(n)`](TensorBoard::update_freq), every `n`
///   training steps `batch_loss` (and `batch_accuracy`), the epoch's running means, at the
///   step's number counted over the run; with [`histogram_freq(n)`](TensorBoard::histogram_freq),
///   every `n` epochs a histogram of each weight (`conv2d/kernel/histogram`, ...);
/// * `LOG_DIR/validation/events...`: `epoch_loss` and `epoch_accuracy` on the validation data.
///
/// Each `fit` starts new files (as Keras does), and every event is on disk as soon as it is
/// written, so TensorBoard follows a run while it trains.
///
/// ```
/// use anygpu::data::Dataset;
/// use anygpu::nn::{Activation, Dense, Loss, Sequential, Sgd, TensorBoard, Verbosity};
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let mut model = Sequential::new();
/// model.add(Dense::new(2).activation(Activation::Softmax).input_shape(&[2]))?;
/// model.compile(Loss::sparse_categorical_crossentropy(), Sgd::default(), &[])?;
/// model.set_verbose(Verbosity::Silent);
/// let data = Dataset::from_tensor_slices(vec![0.5; 8], &[2], vec![0, 1, 0, 1])?.batch(2, false);
/// let logs = std::env::temp_dir().join(format!("anygpu-doc-tb-{}", std::process::id()));
/// let mut tensorboard = TensorBoard::new(&logs).update_freq(1);
/// model.fit_with_callbacks(&data, 2, None, Some(&data), &mut [&mut tensorboard])?;
/// assert!(tensorboard.train_file().is_some_and(|f| f.starts_with(logs.join("train"))));
/// assert!(tensorboard.validation_file().is_some());
/// # std::fs::remove_dir_all(&logs).ok();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TensorBoard {
    log_dir: PathBuf,
    update_freq: u64,
    histogram_freq: usize,
    train: Option<EventFile>,
    validation: Option<EventFile>,
}

impl TensorBoard {
    /// Logs into `log_dir` (created when needed): per epoch only, no histograms (Keras'
    /// defaults).
    pub fn new(log_dir: impl AsRef<Path>) -> TensorBoard {
        TensorBoard {
            log_dir: log_dir.as_ref().to_path_buf(),
            update_freq: 0,
            histogram_freq: 0,
            train: None,
            validation: None,
        }
    }

    /// Keras' `update_freq` as a number: also log the running loss every `steps` training
    /// steps (Keras' `"batch"` is 1); 0, Keras' `"epoch"`, logs per epoch only. Each logged
    /// step waits for the device to finish it, so a small `steps` slows training a little.
    pub fn update_freq(mut self, steps: u64) -> TensorBoard {
        self.update_freq = steps;
        self
    }

    /// Keras' `histogram_freq`: a histogram of every weight after every `epochs`-th epoch
    /// (the first, then every `epochs` after it, as Keras counts); 0, never.
    pub fn histogram_freq(mut self, epochs: usize) -> TensorBoard {
        self.histogram_freq = epochs;
        self
    }

    /// The log directory.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    /// The training event file of the last `fit`, once it started.
    pub fn train_file(&self) -> Option<&Path> {
        self.train.as_ref().map(EventFile::path)
    }

    /// The validation event file of the last `fit`, once it logged a validation value.
    pub fn validation_file(&self) -> Option<&Path> {
        self.validation.as_ref().map(EventFile::path)
    }

    fn train_writer(&mut self) -> Result<&mut EventFile> {
        if self.train.is_none() {
            self.train = Some(EventFile::create(&self.log_dir.join("train"))?);
        }
        Ok(self.train.as_mut().expect("created above"))
    }

    fn validation_writer(&mut self) -> Result<&mut EventFile> {
        if self.validation.is_none() {
            self.validation = Some(EventFile::create(&self.log_dir.join("validation"))?);
        }
        Ok(self.validation.as_mut().expect("created above"))
    }
}

/// Scalar events for the `(tag, value)` pairs that have a value.
fn scalars(step: i64, values: &[(&str, Option<f64>)]) -> Vec<Vec<u8>> {
    let now = event_file::wall_time();
    values
        .iter()
        .filter_map(|(tag, v)| {
            v.map(|v| event_file::summary_event(now, step, tag, Value::Scalar(v as f32)))
        })
        .collect()
}

impl Callback for TensorBoard {
    fn on_train_begin(&mut self, fit: &mut FitContext<'_>) -> Result<()> {
        // Across workers only the chief writes.
        if !fit.model.is_chief() {
            return Ok(());
        }
        // New files for every fit; the previous ones stay for TensorBoard to show.
        self.train = None;
        self.validation = None;
        self.train_writer().map(|_| ())
    }

    fn train_batch_interval(&self) -> Option<u64> {
        Some(self.update_freq).filter(|&n| n > 0)
    }

    fn on_train_batch_end(&mut self, fit: &mut FitContext<'_>, logs: &BatchLogs) -> Result<()> {
        if !fit.model.is_chief() {
            return Ok(());
        }
        let step = i64::try_from(logs.step).unwrap_or(i64::MAX);
        let events = scalars(
            step,
            &[
                ("batch_loss", Some(logs.loss)),
                ("batch_accuracy", logs.accuracy),
            ],
        );
        self.train_writer()?.append(&events)
    }

    fn on_epoch_end(&mut self, fit: &mut FitContext<'_>) -> Result<()> {
        if !fit.model.is_chief() {
            return Ok(());
        }
        let index = fit.epoch().saturating_sub(1);
        let step = i64::try_from(index).unwrap_or(i64::MAX);
        let h = fit.history();
        let at = |series: &[f64]| series.get(index).copied();
        // The rate the next step uses (a schedule's, or as a callback set it), as Keras logs.
        let learning_rate = fit.model().learning_rate().map(f64::from);
        let mut train = scalars(
            step,
            &[
                ("epoch_loss", at(&h.loss)),
                ("epoch_accuracy", at(&h.accuracy)),
                ("epoch_learning_rate", learning_rate),
            ],
        );
        let mut validation = scalars(
            step,
            &[
                ("epoch_loss", at(&h.val_loss)),
                ("epoch_accuracy", at(&h.val_accuracy)),
            ],
        );
        // The other metrics, `epoch_<name>` in each run (Keras' tags).
        for (key, series) in &h.metrics {
            let (run, name) = match key.strip_prefix("val_") {
                Some(name) => (&mut validation, name),
                None => (&mut train, key.as_str()),
            };
            run.extend(scalars(step, &[(&format!("epoch_{name}"), at(series))]));
        }
        if self.histogram_freq > 0 && index.is_multiple_of(self.histogram_freq) {
            let now = event_file::wall_time();
            for (name, weight) in fit.model().named_weights() {
                // A weight with a non-finite value has no histogram; its loss says enough.
                if let Some(hist) = Histogram::of(&weight.to_vec::<f32>()?, HISTOGRAM_BUCKETS) {
                    let tag = format!("{name}/histogram");
                    train.push(event_file::summary_event(
                        now,
                        step,
                        &tag,
                        Value::Histogram(&hist),
                    ));
                }
            }
        }
        self.train_writer()?.append(&train)?;
        if !validation.is_empty() {
            self.validation_writer()?.append(&validation)?;
        }
        Ok(())
    }
}
