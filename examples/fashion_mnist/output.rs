//! Where a training run's files go: the output folder (`--out`, else a new `runs/<timestamp>`)
//! with model.safetensors, history.json, history.csv, learning_curves.png and tensorboard/,
//! and the checkpoint folder (`--checkpoint-dir`). Both are checked before anything trains.
//!
//! Only the chief (worker 0 of a multi-worker job, or the one process) writes; every result
//! file replaces its predecessor whole (`anygpu::nn::write_atomically`, and the library's
//! callbacks and `save_weights`), so a killed run never leaves a torn file.

use std::path::{Path, PathBuf};

use anygpu::mixed_precision;
use anygpu::nn::{
    write_atomically, BackupAndRestore, Callback, CsvLogger, Evaluation, History, Sequential,
    TensorBoard,
};
use serde::Serialize;

use crate::args::Args;
use crate::BoxError;

/// Training steps between the running losses logged for TensorBoard: a few points per epoch
/// of the default 429 steps, each read costing one wait for the device.
const TENSORBOARD_UPDATE_FREQ: u64 = 50;

/// The files of a training run and the callbacks that write them during `fit`.
pub struct Output {
    /// `None` on workers other than the chief: they write nothing.
    dir: Option<PathBuf>,
    /// `--checkpoint-dir` (keras.callbacks.BackupAndRestore); on the other workers too, which
    /// resume from what the chief sends them.
    backup: Option<BackupAndRestore>,
    csv: CsvLogger,
    tensorboard: TensorBoard,
    /// `--resume`.
    resume: bool,
    batch_size: usize,
    seed: u64,
}

impl Output {
    /// The folders of a training run, created and checked for writing before anything trains.
    /// An existing, non-empty `--out` needs `--overwrite` or `--resume`; a checkpoint found in
    /// `--checkpoint-dir` needs `--resume` (continue it) or `--overwrite` (discard it).
    pub fn prepare(args: &Args, chief: bool) -> Result<Output, BoxError> {
        let (dir, backup) = match &args.checkpoint_dir {
            // Deleted by `save` once the trained model is saved, not when fit ends.
            Some(ckpt) if chief => (
                Some(prepare_out_dir(args)?),
                Some(prepare_checkpoint(ckpt, args)?.delete_checkpoint(false)),
            ),
            Some(ckpt) => (None, Some(BackupAndRestore::new(ckpt))),
            None if chief => (Some(prepare_out_dir(args)?), None),
            None => (None, None),
        };
        // Every worker runs the same callbacks (their hooks vote across workers); the library's
        // write only on the chief, so the others' paths are never created.
        let base = dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("runs/(worker 0 writes)"));
        let log_dir = args
            .tensorboard
            .clone()
            .unwrap_or_else(|| base.join("tensorboard"));
        Ok(Output {
            dir,
            backup,
            csv: CsvLogger::new(base.join("history.csv")),
            tensorboard: TensorBoard::new(&log_dir)
                .update_freq(TENSORBOARD_UPDATE_FREQ)
                .histogram_freq(1),
            resume: args.resume,
            batch_size: args.batch_size,
            seed: args.seed,
        })
    }

    /// Says where the run goes, before `fit` (chief only).
    pub fn announce(&self) {
        if self.dir.is_none() {
            return;
        }
        if let (true, Some(backup)) = (self.resume, &self.backup) {
            println!(
                "resuming the run checkpointed in {}",
                checkpoint_dir(backup).display()
            );
        }
        println!(
            "TensorBoard logs in {0} (view: tensorboard --logdir {0})",
            self.tensorboard.log_dir().display()
        );
    }

    /// The callbacks for `fit`: BackupAndRestore (with `--checkpoint-dir`), CSVLogger and
    /// TensorBoard.
    pub fn callbacks(&mut self) -> Vec<&mut dyn Callback> {
        let mut callbacks: Vec<&mut dyn Callback> = Vec::new();
        if let Some(backup) = &mut self.backup {
            callbacks.push(backup);
        }
        callbacks.push(&mut self.csv);
        callbacks.push(&mut self.tensorboard);
        callbacks
    }

    /// After `fit` failed with `error`: the chief keeps the epochs that finished in
    /// history.json and says how to continue. Returns `error` itself, never rewrapped (across
    /// workers its type decides whether they exit together or abort), and never replaced by a
    /// failure to write the history, which is only reported.
    pub fn fit_failed(
        &self,
        model: &Sequential,
        steps_per_epoch: usize,
        error: anygpu::Error,
    ) -> anygpu::Error {
        let Some(dir) = &self.dir else {
            return error;
        };
        let history = model.history();
        let path = dir.join("history.json");
        match self.write_history(&path, model, history, None, steps_per_epoch) {
            Ok(()) => eprintln!(
                "(the {} finished epoch(s) are in {})",
                history.epochs(),
                path.display()
            ),
            Err(e) => eprintln!("warning: the finished epochs were not saved: {e}"),
        }
        if let Some(backup) = self.backup.as_ref().filter(|b| b.has_checkpoint()) {
            let dir = checkpoint_dir(backup);
            eprintln!(
                "(continue with --resume --checkpoint-dir {})",
                dir.display()
            );
        }
        error
    }

    /// The trained model: model.safetensors, history.json and learning_curves.png (chief
    /// only); then the checkpoint, the run's only copy until now, is deleted.
    pub fn save(
        &self,
        model: &Sequential,
        test: &Evaluation,
        steps_per_epoch: usize,
    ) -> Result<(), BoxError> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        let history = model.history();
        let weights = dir.join("model.safetensors");
        model.save_weights(&weights)?;
        println!("throughput: {:.0} images/s in fit", mean_ips(history));
        let json = dir.join("history.json");
        self.write_history(&json, model, history, Some(test), steps_per_epoch)?;
        // A failed evaluation or save can still be resumed: the checkpoint goes last.
        if let Some(backup) = self.backup.as_ref().filter(|b| b.has_checkpoint()) {
            std::fs::remove_file(backup.checkpoint_path())?;
        }
        match crate::plot::learning_curves(&dir.join("learning_curves.png"), history) {
            Ok(()) => println!(
                "wrote {}, history.json and learning_curves.png",
                weights.display()
            ),
            Err(e) => {
                println!("wrote {} and history.json", weights.display());
                eprintln!("warning: no learning-curve chart: {e}");
            }
        }
        Ok(())
    }

    /// history.json, replaced whole.
    fn write_history(
        &self,
        path: &Path,
        model: &Sequential,
        history: &History,
        test: Option<&Evaluation>,
        steps_per_epoch: usize,
    ) -> Result<(), BoxError> {
        let json = HistoryJson::new(model, history, test, self, steps_per_epoch);
        write_atomically(path, serde_json::to_string_pretty(&json)?.as_bytes())?;
        Ok(())
    }
}

/// Mean images per second over the epochs.
pub fn mean_ips(history: &History) -> f64 {
    match history.epochs() {
        0 => 0.0,
        n => history.images_per_second.iter().sum::<f64>() / n as f64,
    }
}

#[derive(Serialize)]
struct EpochLog {
    epoch: usize,
    loss: f64,
    accuracy: Option<f64>,
    val_loss: Option<f64>,
    val_accuracy: Option<f64>,
    seconds: f64,
    images_per_second: f64,
}

/// history.json: the history, the test result and what the run was.
#[derive(Serialize)]
struct HistoryJson {
    epochs: Vec<EpochLog>,
    loss: Vec<f64>,
    accuracy: Vec<f64>,
    val_loss: Vec<f64>,
    val_accuracy: Vec<f64>,
    /// `None` when training failed before the test.
    test_loss: Option<f64>,
    test_accuracy: Option<f64>,
    images_per_second: f64,
    devices: Vec<String>,
    adapters: Vec<String>,
    layer_devices: Vec<(String, String)>,
    /// The replicas under `--strategy mirrored` (empty otherwise).
    replicas: Vec<String>,
    optimizer: String,
    batch_size: usize,
    steps_per_epoch: usize,
    params: usize,
    seed: u64,
    /// The global dtype policy: `float32` or `mixed_float16`.
    policy: String,
    /// Optimizer steps applied (steps that loss scaling skipped are not counted).
    iterations: u64,
    /// The loss scale at the end, under mixed precision.
    loss_scale: Option<f32>,
}

impl HistoryJson {
    fn new(
        model: &Sequential,
        history: &History,
        test: Option<&Evaluation>,
        out: &Output,
        steps_per_epoch: usize,
    ) -> HistoryJson {
        let devices = model.devices();
        let epochs = (0..history.epochs())
            .map(|i| EpochLog {
                epoch: i + 1,
                loss: history.loss[i],
                accuracy: history.accuracy.get(i).copied(),
                val_loss: history.val_loss.get(i).copied(),
                val_accuracy: history.val_accuracy.get(i).copied(),
                seconds: history.epoch_seconds.get(i).copied().unwrap_or(0.0),
                images_per_second: history.images_per_second.get(i).copied().unwrap_or(0.0),
            })
            .collect();
        HistoryJson {
            epochs,
            loss: history.loss.clone(),
            accuracy: history.accuracy.clone(),
            val_loss: history.val_loss.clone(),
            val_accuracy: history.val_accuracy.clone(),
            test_loss: test.map(|t| t.loss),
            test_accuracy: test.and_then(|t| t.accuracy),
            images_per_second: mean_ips(history),
            devices: devices.iter().map(|d| d.name().to_string()).collect(),
            adapters: devices
                .iter()
                .map(|d| d.adapter_name().to_string())
                .collect(),
            layer_devices: model
                .layer_infos()
                .into_iter()
                .map(|l| (l.name, l.device))
                .collect(),
            replicas: model
                .strategy()
                .map(|s| s.devices().iter().map(|d| d.name().to_string()).collect())
                .unwrap_or_default(),
            optimizer: model.optimizer().map(|o| o.to_string()).unwrap_or_default(),
            batch_size: out.batch_size,
            steps_per_epoch,
            params: model.count_params(),
            seed: out.seed,
            policy: mixed_precision::global_policy().name().to_string(),
            iterations: model.iterations(),
            loss_scale: model.loss_scale(),
        }
    }
}

/// The output directory, created and checked for writing before anything trains: `--out` (an
/// existing, non-empty one only with `--overwrite` or `--resume`), else a new
/// `runs/<timestamp>` that no earlier run has.
fn prepare_out_dir(args: &Args) -> Result<PathBuf, BoxError> {
    let dir = match &args.out {
        Some(dir) => {
            let non_empty = std::fs::read_dir(dir)
                .map(|mut entries| entries.next().is_some())
                .unwrap_or(false);
            if non_empty && !args.overwrite && !args.resume {
                return Err(format!(
                    "--out {}: the directory is not empty (an earlier run?); pass --overwrite to \
                     replace its files, or name another directory",
                    dir.display()
                )
                .into());
            }
            std::fs::create_dir_all(dir).map_err(|e| format!("--out {}: {e}", dir.display()))?;
            dir.clone()
        }
        None => new_run_dir(&default_out_dir())?,
    };
    // A file written and removed now, rather than an error after hours of training.
    let probe = dir.join(format!(".write-test-{}", std::process::id()));
    std::fs::write(&probe, b"ok")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| format!("--out {}: cannot write there: {e}", dir.display()))?;
    Ok(dir)
}

/// `base`, or `base-2`, `base-3`, ...: the first that did not exist, created here (so two runs
/// started in the same second get different directories).
fn new_run_dir(base: &Path) -> Result<PathBuf, BoxError> {
    if let Some(parent) = base.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let name = base
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    for n in 1..10_000 {
        let candidate = match n {
            1 => base.to_path_buf(),
            n => base.with_file_name(format!("{name}-{n}")),
        };
        match std::fs::create_dir(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("{}: {e}", candidate.display()).into()),
        }
    }
    Err(format!("{}: no free run directory name", base.display()).into())
}

/// The `--checkpoint-dir` callback. A checkpoint already there is resumed with `--resume`,
/// discarded with `--overwrite`, and otherwise an error: a new run never silently continues,
/// or silently replaces, an earlier one.
fn prepare_checkpoint(dir: &Path, args: &Args) -> Result<BackupAndRestore, BoxError> {
    let backup = BackupAndRestore::new(dir);
    match (backup.has_checkpoint(), args.resume, args.overwrite) {
        (true, false, false) => Err(format!(
            "--checkpoint-dir {}: it holds the checkpoint of an earlier run; pass --resume to \
             continue it, or --overwrite to start afresh",
            dir.display()
        )
        .into()),
        (true, false, true) => {
            let path = backup.checkpoint_path();
            std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(backup)
        }
        (false, true, _) => Err(format!(
            "--resume: there is no checkpoint in {} ({} is missing)",
            dir.display(),
            backup.checkpoint_path().display()
        )
        .into()),
        _ => {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("--checkpoint-dir {}: {e}", dir.display()))?;
            Ok(backup)
        }
    }
}

/// The `--checkpoint-dir` a [`BackupAndRestore`] writes into.
fn checkpoint_dir(backup: &BackupAndRestore) -> PathBuf {
    let file = backup.checkpoint_path();
    file.parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// `./runs/YYYYMMDD-HHMMSS` (UTC).
fn default_out_dir() -> PathBuf {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    Path::new("runs").join(format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(out: &Path, flags: &[&str]) -> Args {
        let out = out.to_string_lossy().into_owned();
        Args::parse_from([&["fashion_mnist", "--out", &out], flags].concat())
    }

    /// A fresh folder of this test's own; `out` inside it does not exist yet.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("fashion-mnist-out-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The error every worker of a job returns when one of them failed a step.
    fn agreed_error() -> anygpu::Error {
        anygpu::Error::Distributed {
            rank: 1,
            workers: 2,
            request: "training step".into(),
            cause: "out of memory".into(),
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_non_empty_out_needs_overwrite_or_resume() {
        let dir = scratch("non-empty");
        std::fs::write(dir.join("model.safetensors"), b"an earlier run").unwrap();
        let refused = Output::prepare(&args(&dir, &[]), true).err().unwrap();
        assert!(refused.to_string().contains("--overwrite"), "{refused}");
        assert!(Output::prepare(&args(&dir, &["--overwrite"]), true).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn workers_other_than_the_chief_create_and_write_nothing() {
        let dir = scratch("worker");
        let out_dir = dir.join("out");
        let out = Output::prepare(&args(&out_dir, &[]), false).unwrap();
        let model = Sequential::with_seed(0);
        let error = out.fit_failed(&model, 10, agreed_error());
        assert!(
            matches!(error, anygpu::Error::Distributed { rank: 1, .. }),
            "{error}"
        );
        let test = Evaluation {
            loss: 0.5,
            accuracy: Some(0.8),
            examples: 10,
            metrics: Default::default(),
        };
        out.save(&model, &test, 10).unwrap();
        assert!(
            !out_dir.exists(),
            "a worker other than the chief created --out"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failed_fit_leaves_the_finished_epochs_in_a_whole_history_json() {
        let dir = scratch("partial");
        let out = Output::prepare(&args(&dir, &[]), true).unwrap();
        let model = Sequential::with_seed(0);
        let error = out.fit_failed(&model, 10, agreed_error());
        assert!(
            matches!(error, anygpu::Error::Distributed { .. }),
            "{error}"
        );
        // Only the history: no temporary file is left beside it.
        assert_eq!(names(&dir), ["history.json"]);
        let text = std::fs::read_to_string(dir.join("history.json")).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["steps_per_epoch"], 10);
        assert!(json["test_loss"].is_null());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_history_that_cannot_be_written_does_not_replace_the_training_error() {
        let dir = scratch("unwritable");
        let out = Output::prepare(&args(&dir, &[]), true).unwrap();
        // history.json cannot be written where a directory stands.
        std::fs::create_dir(dir.join("history.json")).unwrap();
        let error = out.fit_failed(&Sequential::with_seed(0), 10, agreed_error());
        assert!(
            matches!(error, anygpu::Error::Distributed { .. }),
            "{error}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
