//! Keras' `BackupAndRestore`: the whole state of a `fit` in one file after every epoch, and a
//! restarted `fit` that continues from it exactly as if it had never stopped.
//!
//! The file, `backup_dir/checkpoint.safetensors`, holds as tensors the weights (named as
//! `save_weights` names them), the optimizer slots (`optimizer/<layer>/<weight>/<slot>`) and
//! the history so far (`history/loss`, ... as f64); its metadata holds the optimizer, its
//! iteration count, the epochs done and where the training and validation datasets stand (the
//! shuffle of a pass is a function of its number, so a pass number and the batches taken from
//! it are the whole state of the pipeline). It is written atomically: a kill at any moment
//! leaves the previous epoch's checkpoint or this one, never a mix.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors};

use crate::atomic_file::write_atomically;
use crate::distribute::{shared, Workers};
use crate::error::{Error, Result};
use crate::nn::callbacks::{Callback, FitContext, Position};
use crate::nn::history::History;
use crate::nn::optimizer::LossScale;
use crate::nn::sequential::Sequential;
use crate::nn::weights::{self, Blob};

/// The file name inside the backup directory.
const FILE: &str = "checkpoint.safetensors";
const FORMAT: &str = "anygpu.nn.Checkpoint";
const VERSION: &str = "1";

/// Checkpoints a `fit` after every epoch and resumes it after an interruption (Keras'
/// `keras.callbacks.BackupAndRestore(backup_dir, delete_checkpoint=True)`).
///
/// After each epoch it saves the weights, the optimizer slots and iteration count, where the
/// datasets' iterators stand (shuffle order and position) and the history so far. When `fit`
/// starts and the directory holds a checkpoint, the model is restored from it and training
/// continues with the next epoch: a run killed after epoch 3 and started again with the same
/// model, optimizer and datasets ends with the same weights, bit for bit on the CPU, as one
/// never interrupted, and with the history of every epoch. When every epoch has run, the
/// checkpoint is deleted (unless [`delete_checkpoint(false)`](BackupAndRestore::delete_checkpoint)),
/// so the next `fit` starts afresh.
///
/// On the workers of a multi-worker job only the chief writes the checkpoint, and when `fit`
/// starts the chief's checkpoint (or its absence) decides for every worker: the chief sends
/// the file to the others, so every worker resumes from the same epoch and state without a
/// shared filesystem.
///
/// ```
/// use anygpu::data::Dataset;
/// use anygpu::nn::{Activation, Adam, BackupAndRestore, Dense, Loss, Sequential, Verbosity};
/// let dir = std::env::temp_dir().join(format!("anygpu-doc-backup-{}", std::process::id()));
/// let model = || -> anygpu::Result<Sequential> {
///     let _cpu = anygpu::with_device("/cpu:0")?;
///     let mut m = Sequential::with_seed(7);
///     m.add(Dense::new(2).activation(Activation::Softmax).input_shape(&[2]))?;
///     m.compile(Loss::sparse_categorical_crossentropy(), Adam::default(), &[])?;
///     m.set_verbose(Verbosity::Silent);
///     Ok(m)
/// };
/// let data = || Dataset::from_tensor_slices(vec![0.5, 0.1, 0.2, 0.9], &[2], vec![0, 1]);
///
/// // A run stopped after its first epoch, checkpoint kept...
/// let mut first = model()?;
/// let mut backup = BackupAndRestore::new(&dir).delete_checkpoint(false);
/// first.fit_with_callbacks(&data()?.batch(1, false), 1, None, None, &mut [&mut backup])?;
/// assert!(backup.has_checkpoint());
/// // ... resumed by a new process: epoch 2 only.
/// let mut resumed = model()?;
/// let mut backup = BackupAndRestore::new(&dir);
/// let history = resumed.fit_with_callbacks(&data()?.batch(1, false), 2, None, None, &mut [&mut backup])?;
/// assert_eq!(backup.restored_epochs(), Some(1));
/// assert_eq!(history.epochs(), 2);
/// assert_eq!(resumed.iterations(), 4);
/// assert!(!backup.has_checkpoint()); // deleted once every epoch ran
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct BackupAndRestore {
    dir: PathBuf,
    delete_checkpoint: bool,
    restored: Option<usize>,
}

impl BackupAndRestore {
    /// Checkpoints into `backup_dir` (created when needed), deleting the checkpoint when
    /// training completes, as Keras does.
    pub fn new(backup_dir: impl AsRef<Path>) -> BackupAndRestore {
        BackupAndRestore {
            dir: backup_dir.as_ref().to_path_buf(),
            delete_checkpoint: true,
            restored: None,
        }
    }

    /// Keras' `delete_checkpoint`: whether to delete the checkpoint when every epoch has run.
    pub fn delete_checkpoint(mut self, delete: bool) -> BackupAndRestore {
        self.delete_checkpoint = delete;
        self
    }

    /// The checkpoint file: `backup_dir/checkpoint.safetensors`.
    pub fn checkpoint_path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// Whether the directory holds a checkpoint a `fit` would resume from.
    pub fn has_checkpoint(&self) -> bool {
        self.checkpoint_path().is_file()
    }

    /// The epochs the last `fit` found done in the checkpoint it resumed from; `None` when it
    /// started afresh.
    pub fn restored_epochs(&self) -> Option<usize> {
        self.restored
    }
}

impl Callback for BackupAndRestore {
    fn on_train_begin(&mut self, fit: &mut FitContext<'_>) -> Result<()> {
        self.restored = None;
        let path = self.checkpoint_path();
        // Across workers the chief's checkpoint decides, for every worker: without a shared
        // filesystem the others may have none, or an older one, and would resume elsewhere.
        let strategy = fit.model.strategy().cloned();
        let bytes = match strategy.as_ref().and_then(|s| s.workers()) {
            Some(workers) => chief_checkpoint(workers, &path)?,
            None if self.has_checkpoint() => Some(read(&path)?),
            None => None,
        };
        let Some(bytes) = bytes else {
            return Ok(());
        };
        let data = fit.data.clone();
        let (epochs_done, position) = restore(fit.model, &bytes, &path, &data)?;
        fit.epochs_done = epochs_done;
        fit.position = Some(position);
        self.restored = Some(epochs_done);
        Ok(())
    }

    fn on_epoch_end(&mut self, fit: &mut FitContext<'_>) -> Result<()> {
        // Across workers only the chief writes; every worker restores from the chief's file,
        // which the chief sends them (`chief_checkpoint`).
        if !fit.model.is_chief() {
            return Ok(());
        }
        let position = fit.position.ok_or_else(|| {
            Error::Model("BackupAndRestore: fit recorded no dataset position".into())
        })?;
        std::fs::create_dir_all(&self.dir).map_err(|source| Error::Io {
            path: self.dir.clone(),
            source,
        })?;
        save(
            fit.model,
            (fit.epochs_done, position, &fit.data),
            &self.checkpoint_path(),
        )
    }

    fn on_train_end(&mut self, fit: &mut FitContext<'_>) -> Result<()> {
        if !fit.model.is_chief() {
            return Ok(());
        }
        if self.delete_checkpoint && self.has_checkpoint() {
            let path = self.checkpoint_path();
            std::fs::remove_file(&path).map_err(|source| Error::Io { path, source })?;
            // Keras removes the backup directory; ours may hold the user's other files.
            let _ = std::fs::remove_dir(&self.dir);
        }
        Ok(())
    }
}

/// Where the history's other metrics go: `history/metrics/<Keras key>`.
const METRICS_PREFIX: &str = "history/metrics/";

/// The history's series, by tensor name: the fixed ones, then every other metric's.
fn history_series(h: &History) -> Vec<(String, Vec<f64>)> {
    let fixed = [
        ("history/loss", h.loss.clone()),
        ("history/accuracy", h.accuracy.clone()),
        ("history/val_loss", h.val_loss.clone()),
        ("history/val_accuracy", h.val_accuracy.clone()),
        ("history/epoch_seconds", h.epoch_seconds.clone()),
        ("history/images_per_second", h.images_per_second.clone()),
        ("history/steps", h.steps.iter().map(|&s| s as f64).collect()),
        ("history/learning_rate", h.learning_rate.clone()),
    ];
    let metrics = h
        .metrics
        .iter()
        .map(|(key, series)| (format!("{METRICS_PREFIX}{key}"), series.clone()));
    fixed
        .into_iter()
        .map(|(name, series)| (name.to_string(), series))
        .chain(metrics)
        .collect()
}

fn optimizer_description(model: &Sequential) -> String {
    model.optimizer().map(|o| o.to_string()).unwrap_or_default()
}

/// Writes `model`'s checkpoint: `(epochs_done, position, data)` are where `fit` stands and the
/// description of the data that position is valid for.
fn save(
    model: &Sequential,
    (epochs_done, position, data): (usize, Position, &str),
    path: &Path,
) -> Result<()> {
    // Read once, from the device where it holds them: a checkpoint must not be stale.
    let (iterations, loss_scale) = model.training_state()?;
    let mut blobs = Vec::new();
    for (name, t) in model.named_weights() {
        blobs.push(Blob::from_tensor(name, t)?);
    }
    for (name, t) in model.optimizer_variables() {
        blobs.push(Blob::from_tensor(format!("optimizer/{name}"), t)?);
    }
    for (name, series) in history_series(model.history()) {
        blobs.push(Blob::f64s(&name, &series));
    }
    let opt = |v: Option<u64>| v.map(|p| p.to_string()).unwrap_or_default();
    let metadata = HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("version".to_string(), VERSION.to_string()),
        ("model".to_string(), model.name().to_string()),
        ("optimizer".to_string(), optimizer_description(model)),
        ("iterations".to_string(), iterations.to_string()),
        // The constant rate as callbacks left it (empty under a schedule, whose rate follows
        // from the iterations).
        (
            "learning_rate".to_string(),
            model
                .optimizer()
                .filter(|o| o.options().schedule.is_none())
                .and_then(|_| model.learning_rate())
                .map(|lr| lr.to_string())
                .unwrap_or_default(),
        ),
        // Keras' dynamic_scale and step_counter (empty without loss scaling).
        (
            "loss_scale".to_string(),
            loss_scale.map(|l| l.scale.to_string()).unwrap_or_default(),
        ),
        (
            "loss_scale_counter".to_string(),
            loss_scale
                .map(|l| l.counter.to_string())
                .unwrap_or_default(),
        ),
        ("epochs_done".to_string(), epochs_done.to_string()),
        ("data".to_string(), data.to_string()),
        ("train_iter_pass".to_string(), opt(position.iter_pass)),
        ("train_taken".to_string(), position.taken.to_string()),
        ("train_passes".to_string(), position.passes.to_string()),
        (
            "validation_passes".to_string(),
            opt(position.validation_passes),
        ),
    ]);
    write_atomically(path, &weights::serialize(&blobs, metadata, "checkpoint")?)
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The chief's checkpoint at `path` (`None`: it has none), on every worker: the chief reads
/// it, the workers agree that it could, then it is broadcast (its length, then its bytes as
/// little-endian words). A collective.
fn chief_checkpoint(workers: &dyn Workers, path: &Path) -> Result<Option<Vec<u8>>> {
    let local = match workers.rank() {
        0 if path.is_file() => read(path).map(Some),
        _ => Ok(None),
    };
    let local = shared(
        Some(workers),
        "BackupAndRestore: reading worker 0's checkpoint",
        local,
    )?;
    // [present, length low word, length high word]
    let len = local.as_ref().map_or(0, |b| b.len() as u64);
    let mut head = [u32::from(local.is_some()), len as u32, (len >> 32) as u32];
    workers.broadcast("BackupAndRestore: the checkpoint's size", &mut head)?;
    if head[0] == 0 {
        return Ok(None);
    }
    let len = usize::try_from(u64::from(head[1]) | u64::from(head[2]) << 32).map_err(|_| {
        Error::Model("BackupAndRestore: worker 0's checkpoint does not fit in memory".into())
    })?;
    let mut words = vec![0u32; len.div_ceil(4)];
    if let Some(bytes) = &local {
        for (w, chunk) in words.iter_mut().zip(bytes.chunks(4)) {
            let mut b = [0u8; 4];
            b[..chunk.len()].copy_from_slice(chunk);
            *w = u32::from_le_bytes(b);
        }
    }
    workers.broadcast("BackupAndRestore: worker 0's checkpoint", &mut words)?;
    let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    bytes.truncate(len);
    Ok(Some(bytes))
}

/// Restores `model` from the checkpoint `bytes` (read from `path`) for a fit over `data` (see
/// `FitContext::data`): everything is read and checked first, then written. Returns the epochs
/// done and the datasets' position.
pub(crate) fn restore(
    model: &mut Sequential,
    bytes: &[u8],
    path: &Path,
    data: &str,
) -> Result<(usize, Position)> {
    let err = |m: String| Error::Model(format!("BackupAndRestore('{}'): {m}", path.display()));
    let (_, header) = SafeTensors::read_metadata(bytes)
        .map_err(|e| err(format!("not a safetensors file: {e}")))?;
    let file =
        SafeTensors::deserialize(bytes).map_err(|e| err(format!("not a safetensors file: {e}")))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let text = |key: &str| meta.get(key).map(String::as_str).unwrap_or("");
    if text("format") != FORMAT || text("version") != VERSION {
        return Err(err(format!(
            "not a checkpoint of this version (format '{}', version '{}')",
            text("format"),
            text("version")
        )));
    }
    let number = |key: &str| -> Result<u64> {
        text(key)
            .parse()
            .map_err(|_| err(format!("metadata '{key}' is not a number: '{}'", text(key))))
    };
    let optional = |key: &str| -> Result<Option<u64>> {
        match text(key) {
            "" => Ok(None),
            _ => number(key).map(Some),
        }
    };
    let optimizer = optimizer_description(model);
    if text("optimizer") != optimizer {
        return Err(err(format!(
            "the checkpoint was written with optimizer {}, but the model is compiled with {}",
            text("optimizer"),
            if optimizer.is_empty() {
                "none"
            } else {
                &optimizer
            }
        )));
    }
    // A position in other data is no position: refuse rather than continue elsewhere. (Files
    // written before the description was recorded have none to compare.)
    if !text("data").is_empty() && text("data") != data {
        return Err(err(format!(
            "the checkpoint was written for training data '{}', but this fit has '{data}': \
             resume with the same data set, batch size and steps per epoch, or start afresh",
            text("data")
        )));
    }
    let iterations = number("iterations")?;
    let loss_scale = match (text("loss_scale"), optional("loss_scale_counter")?) {
        ("", _) | (_, None) => None,
        (scale, Some(counter)) => Some(LossScale {
            scale: scale
                .parse()
                .ok()
                .filter(|s: &f32| s.is_finite() && *s > 0.0)
                .ok_or_else(|| err(format!("metadata 'loss_scale' is not a scale: '{scale}'")))?,
            counter,
        }),
    };
    if loss_scale.is_some() != model.loss_scale_state().is_some() {
        return Err(err(
            "the checkpoint and the model disagree on loss scaling (LossScaleOptimizer)".into(),
        ));
    }
    let epochs_done = usize::try_from(number("epochs_done")?)
        .map_err(|_| err("epochs_done does not fit in usize".into()))?;
    let position = Position {
        iter_pass: optional("train_iter_pass")?,
        taken: number("train_taken")?,
        passes: number("train_passes")?,
        validation_passes: optional("validation_passes")?,
    };
    // Training never saves a NaN or an infinity on purpose (loss scaling skips such steps): a
    // checkpoint holding one is corrupt, and resuming from it would train garbage.
    let finite = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
        let values = weights::f32_tensor(&file, name, shape, err)?;
        match values.iter().position(|v| !v.is_finite()) {
            Some(i) => Err(err(format!(
                "'{name}' holds {} at element {i}: the checkpoint is corrupt",
                values[i]
            ))),
            None => Ok(values),
        }
    };
    let weights = model
        .weight_layout()
        .iter()
        .map(|(name, shape)| finite(name, shape))
        .collect::<Result<Vec<_>>>()?;
    let slots = model
        .optimizer_layout()
        .iter()
        .map(|(name, shape)| finite(&format!("optimizer/{name}"), shape))
        .collect::<Result<Vec<_>>>()?;
    let mut history = History::default();
    {
        let series = |name: &str| -> Result<Vec<f64>> {
            let view = file
                .tensor(name)
                .map_err(|_| err(format!("'{name}' is missing")))?;
            if view.dtype() != Dtype::F64 {
                return Err(err(format!("'{name}' is not f64")));
            }
            Ok(view
                .data()
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect())
        };
        history.loss = series("history/loss")?;
        history.accuracy = series("history/accuracy")?;
        history.val_loss = series("history/val_loss")?;
        history.val_accuracy = series("history/val_accuracy")?;
        history.epoch_seconds = series("history/epoch_seconds")?;
        history.images_per_second = series("history/images_per_second")?;
        history.steps = series("history/steps")?
            .into_iter()
            .map(|s| s as usize)
            .collect();
        // Written only by versions that log the learning rate.
        history.learning_rate = series("history/learning_rate").unwrap_or_default();
        // The other metrics' series (none in files written before they were kept), each at
        // most one value an epoch: a longer one would put values against the wrong epochs.
        for name in file.names() {
            let Some(key) = name.strip_prefix(METRICS_PREFIX) else {
                continue;
            };
            let values = series(name)?;
            if values.len() > epochs_done {
                return Err(err(format!(
                    "'{name}' has {} values for {epochs_done} epochs",
                    values.len()
                )));
            }
            history.metrics.insert(key.to_string(), values);
        }
    }
    if history.epochs() != epochs_done {
        return Err(err(format!(
            "the history has {} epochs, the metadata says {epochs_done}",
            history.epochs()
        )));
    }
    let learning_rate = match text("learning_rate") {
        "" => None,
        lr => Some(
            lr.parse::<f32>()
                .ok()
                .filter(|lr| lr.is_finite() && *lr >= 0.0)
                .ok_or_else(|| err(format!("metadata 'learning_rate' is not a rate: '{lr}'")))?,
        ),
    };
    model.restore_training_state(&weights, &slots, (iterations, loss_scale))?;
    if let Some(lr) = learning_rate {
        model.set_learning_rate(lr)?;
    }
    model.history = history;
    Ok((epochs_done, position))
}
