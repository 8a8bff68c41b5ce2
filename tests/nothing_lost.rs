//! Nothing a run has done is lost:
//! - a training step is all or nothing: an error before the update (here an injected failure
//!   in one layer's backward pass) leaves every weight, every optimizer slot and the iteration
//!   count as they were, on one device and on a model split over two; and a batch of no
//!   examples moves nothing, not even SGD's momentum or Adam's moments;
//! - a run killed after an epoch and resumed from its `BackupAndRestore` checkpoint ends with
//!   the weights of a run never interrupted, bit for bit on CPU:0;
//! - a `fit` that fails keeps the history of the epochs it finished.

mod common;

use common::Flaky;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anygpu::data::Dataset;
use anygpu::distribute::MirroredStrategy;
use anygpu::nn::{
    Activation, Adam, BackupAndRestore, Callback, CsvLogger, Dense, FitContext, Loss, Metric,
    ModelCheckpoint, Optimizer, Sequential, Sgd, Verbosity,
};
use anygpu::{Error, LogicalDevice, Runtime, Tensor};

fn cpu_runtime(cpus: usize) -> Runtime {
    common::builder()
        .virtual_cpus(cpus)
        .build()
        .expect("a runtime of virtual CPUs builds")
}

/// Dense(4) on `lower` → Flaky Dense(4) on `lower` → Dense(3, softmax) on `upper`: the
/// failing layer sits below a layer whose backward pass has already run when it fails.
fn model(
    lower: &LogicalDevice,
    upper: &LogicalDevice,
    optimizer: Optimizer,
) -> (Sequential, Arc<AtomicBool>) {
    let fail = Arc::new(AtomicBool::new(false));
    let mut m = Sequential::with_seed(3);
    m.add_on(
        lower,
        Dense::new(4).activation(Activation::Selu).input_shape(&[3]),
    )
    .unwrap();
    m.add_on(
        lower,
        Flaky {
            fail_backward: Arc::clone(&fail),
            ..Flaky::new(Dense::new(4).activation(Activation::Selu))
        },
    )
    .unwrap();
    m.add_on(upper, Dense::new(3).activation(Activation::Softmax))
        .unwrap();
    // A metric besides accuracy, so that a resume has its series to restore too.
    let top2 = Metric::SparseTopKCategoricalAccuracy { k: 2 };
    m.compile(Loss::sparse_categorical_crossentropy(), optimizer, &[top2])
        .unwrap();
    (m, fail)
}

fn batch(device: &LogicalDevice, rows: usize) -> (Tensor, Tensor) {
    let x = Tensor::from_slice_on(&common::values(rows * 3, 7), &[rows, 3], device).unwrap();
    let labels: Vec<i32> = (0..rows as i32).map(|i| i % 3).collect();
    let y = Tensor::from_slice_on(&labels, &[rows], device).unwrap();
    (x, y)
}

/// Everything a step may change: weights, optimizer slots (by name), iterations.
type State = (Vec<Vec<f32>>, Vec<(String, Vec<f32>)>, u64);

fn state(m: &Sequential) -> State {
    let slots = m
        .optimizer_variables()
        .into_iter()
        .map(|(n, t)| (n, t.to_vec::<f32>().unwrap()))
        .collect();
    (m.get_weights().unwrap(), slots, m.iterations())
}

fn optimizers() -> [Optimizer; 2] {
    [Sgd::new(0.1).momentum(0.9).into(), Adam::new(0.01).into()]
}

fn failed_backward_changes_nothing(lower: &LogicalDevice, upper: &LogicalDevice) {
    for optimizer in optimizers() {
        let (mut m, fail) = model(lower, upper, optimizer.clone());
        let (x, y) = batch(lower, 6);
        m.train_step(&x, &y).unwrap();
        let before = state(&m);
        assert_eq!(before.2, 1);
        assert!(
            !before.1.is_empty(),
            "{optimizer}: the slots exist after one step"
        );

        fail.store(true, Ordering::SeqCst);
        let err = m.train_step(&x, &y).unwrap_err();
        assert!(err.to_string().contains("injected"), "{err}");
        assert_eq!(
            state(&m),
            before,
            "{optimizer}: a step that failed in the backward pass changes no weight, slot or \
             iteration count"
        );

        // And the model still trains as if the failed step never happened.
        fail.store(false, Ordering::SeqCst);
        let (mut twin, _) = model(lower, upper, optimizer.clone());
        twin.train_step(&x, &y).unwrap();
        twin.train_step(&x, &y).unwrap();
        m.train_step(&x, &y).unwrap();
        assert_eq!(state(&m), state(&twin), "{optimizer}");
    }
}

#[test]
fn a_failed_backward_pass_on_one_device_changes_nothing() {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    failed_backward_changes_nothing(&cpu, &cpu);
}

#[test]
fn a_failed_backward_pass_on_the_lower_device_of_a_split_model_changes_nothing() {
    let rt = cpu_runtime(2);
    let (c0, c1) = (rt.device("CPU:0").unwrap(), rt.device("CPU:1").unwrap());
    failed_backward_changes_nothing(&c0, &c1);
}

#[test]
fn an_empty_batch_moves_no_weight_momentum_or_adam_state() {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    for optimizer in optimizers() {
        let (mut m, _) = model(&cpu, &cpu, optimizer.clone());
        let (x, y) = batch(&cpu, 4);
        m.train_step(&x, &y).unwrap();
        let before = state(&m);
        let (empty_x, empty_y) = batch(&cpu, 0);
        let out = m.train_step(&empty_x, &empty_y).unwrap();
        assert_eq!(out.batch_size(), 0);
        assert!(
            out.loss().unwrap().is_nan(),
            "the mean loss of no examples is NaN"
        );
        assert_eq!(
            state(&m),
            before,
            "{optimizer}: an empty batch leaves weights, slots and iterations as they were"
        );
        // A misshapen empty batch is still an error.
        let wrong = Tensor::from_slice_on(&[0f32; 0], &[0, 5], &cpu).unwrap();
        assert!(m.train_step(&wrong, &empty_y).is_err());
    }
}

/// 30 examples of shape [3], 3 classes, shuffled each pass: 10 batches of 3.
fn dataset(prefetch: bool) -> Dataset {
    let labels: Vec<i32> = (0..30).map(|i| i % 3).collect();
    let ds = Dataset::from_tensor_slices(common::values(90, 11), &[3], labels)
        .unwrap()
        .shuffle(30, 5)
        .batch(3, false);
    if prefetch {
        ds.prefetch(2)
    } else {
        ds
    }
}

fn validation() -> Dataset {
    let labels: Vec<i32> = (0..9).map(|i| (i * 2) % 3).collect();
    Dataset::from_tensor_slices(common::values(27, 12), &[3], labels)
        .unwrap()
        .shuffle(9, 1)
        .batch(4, false)
}

/// Fails `fit` at the end of epoch `after` (after the callbacks before it ran): a kill right
/// after that epoch's checkpoint.
struct KillAfter(usize);

impl Callback for KillAfter {
    fn on_epoch_end(&mut self, fit: &mut FitContext<'_>) -> anygpu::Result<()> {
        if fit.epoch() == self.0 {
            return Err(Error::Model(format!("killed after epoch {}", self.0)));
        }
        Ok(())
    }
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("anygpu-nothing-lost-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `epochs` epochs straight, against the same run killed after epoch `kill` and resumed by a
/// fresh model and fresh datasets (as a new process would build them).
fn resume_matches_uninterrupted(steps_per_epoch: Option<usize>, prefetch: bool, name: &str) {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    let (epochs, kill) = (3, 2);
    let fresh = || {
        let (mut m, _) = model(&cpu, &cpu, Adam::new(0.02).into());
        m.set_verbose(Verbosity::Silent);
        m
    };

    let mut straight = fresh();
    let expected = straight
        .fit(
            &dataset(prefetch),
            epochs,
            steps_per_epoch,
            Some(&validation()),
        )
        .unwrap();

    let dir = scratch(name);
    let mut killed = fresh();
    let err = killed
        .fit_with_callbacks(
            &dataset(prefetch),
            epochs,
            steps_per_epoch,
            Some(&validation()),
            &mut [&mut BackupAndRestore::new(&dir), &mut KillAfter(kill)],
        )
        .unwrap_err();
    assert!(err.to_string().contains("killed"), "{err}");
    assert_eq!(
        killed.history().epochs(),
        kill,
        "the killed run keeps its epochs' history"
    );

    let mut resumed = fresh();
    let mut backup = BackupAndRestore::new(&dir);
    let history = resumed
        .fit_with_callbacks(
            &dataset(prefetch),
            epochs,
            steps_per_epoch,
            Some(&validation()),
            &mut [&mut backup],
        )
        .unwrap();
    assert_eq!(backup.restored_epochs(), Some(kill));
    assert_eq!(
        resumed.get_weights().unwrap(),
        straight.get_weights().unwrap(),
        "{name}: the resumed run ends with the uninterrupted run's weights, bit for bit"
    );
    assert_eq!(
        state(&resumed),
        state(&straight),
        "{name}: slots and iterations too"
    );
    assert_eq!(history.loss, expected.loss, "{name}: every epoch's loss");
    assert_eq!(history.val_loss, expected.val_loss, "{name}");
    assert_eq!(history.steps, expected.steps, "{name}");
    assert!(
        expected
            .metrics
            .contains_key("val_sparse_top_k_categorical_accuracy"),
        "{name}: {:?}",
        expected.metrics.keys()
    );
    assert_eq!(
        history.metrics, expected.metrics,
        "{name}: every other metric, each epoch in its place"
    );
    assert!(
        !backup.has_checkpoint(),
        "the checkpoint is deleted once every epoch ran"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_resumed_fit_continues_mid_pass_as_if_never_stopped() {
    // 4 steps an epoch over 10-batch passes: the kill falls in the middle of a pass.
    resume_matches_uninterrupted(Some(4), false, "mid-pass");
}

#[test]
fn a_resumed_fit_with_prefetch_and_whole_passes_continues_as_if_never_stopped() {
    resume_matches_uninterrupted(None, true, "whole-passes");
}

#[test]
fn a_checkpoint_of_another_optimizer_is_refused_and_changes_nothing() {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    let dir = scratch("other-optimizer");
    let (mut adam, _) = model(&cpu, &cpu, Adam::new(0.02).into());
    adam.set_verbose(Verbosity::Silent);
    let mut backup = BackupAndRestore::new(&dir).delete_checkpoint(false);
    adam.fit_with_callbacks(&dataset(false), 1, None, None, &mut [&mut backup])
        .unwrap();
    assert!(backup.has_checkpoint());

    let (mut sgd, _) = model(&cpu, &cpu, Sgd::new(0.1).momentum(0.9).into());
    let before = state(&sgd);
    let err = sgd
        .fit_with_callbacks(&dataset(false), 2, None, None, &mut [&mut backup])
        .unwrap_err()
        .to_string();
    assert!(err.contains("Adam(") && err.contains("SGD("), "{err}");
    assert_eq!(state(&sgd), before);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_resumed_mirrored_fit_restores_every_replica() {
    let rt = cpu_runtime(2);
    let cpus = rt.list_logical_devices("CPU").unwrap();
    let strategy = MirroredStrategy::with_devices(&cpus).unwrap();
    let fresh = || {
        strategy
            .scope(|| -> anygpu::Result<Sequential> {
                let mut m = Sequential::with_seed(3);
                m.add(Dense::new(4).activation(Activation::Selu).input_shape(&[3]))?;
                m.add(Dense::new(3).activation(Activation::Softmax))?;
                m.compile(
                    Loss::sparse_categorical_crossentropy(),
                    Sgd::new(0.1).momentum(0.9),
                    &[],
                )?;
                m.set_verbose(Verbosity::Silent);
                Ok(m)
            })
            .unwrap()
            .unwrap()
    };
    let mut straight = fresh();
    straight.fit(&dataset(false), 3, Some(4), None).unwrap();

    let dir = scratch("mirrored");
    let mut killed = fresh();
    killed
        .fit_with_callbacks(
            &dataset(false),
            3,
            Some(4),
            None,
            &mut [&mut BackupAndRestore::new(&dir), &mut KillAfter(2)],
        )
        .unwrap_err();
    let mut resumed = fresh();
    resumed
        .fit_with_callbacks(
            &dataset(false),
            3,
            Some(4),
            None,
            &mut [&mut BackupAndRestore::new(&dir)],
        )
        .unwrap();
    assert_eq!(state(&resumed), state(&straight));
    assert_eq!(
        resumed.replica_weights(1).unwrap(),
        straight.replica_weights(1).unwrap(),
        "the second replica is restored and trained like the first"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Arms the flaky layer at the end of epoch `after`: the next epoch's first step fails.
struct FailAfter(usize, Arc<AtomicBool>);

impl Callback for FailAfter {
    fn on_epoch_end(&mut self, fit: &mut FitContext<'_>) -> anygpu::Result<()> {
        if fit.epoch() == self.0 {
            self.1.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
}

#[test]
fn a_fit_that_fails_in_an_epoch_keeps_the_history_of_the_epochs_before() {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    let dir = scratch("partial-history");
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("history.csv");
    let (mut m, fail) = model(&cpu, &cpu, Sgd::new(0.1).into());
    m.set_verbose(Verbosity::Silent);
    let err = m
        .fit_with_callbacks(
            &dataset(false),
            5,
            Some(2),
            Some(&validation()),
            &mut [&mut CsvLogger::new(&csv), &mut FailAfter(3, fail)],
        )
        .unwrap_err();
    assert!(err.to_string().contains("injected"), "{err}");
    let h = m.history();
    assert_eq!(h.epochs(), 3, "epochs 1-3 finished before epoch 4 failed");
    assert_eq!(
        (h.val_loss.len(), h.steps.len()),
        (3, 3),
        "whole epochs only"
    );
    let rows = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(
        rows.lines().count(),
        4,
        "a header and one row per finished epoch:\n{rows}"
    );
    let header = "epoch,loss,sparse_top_k_categorical_accuracy,val_loss,\
                  val_sparse_top_k_categorical_accuracy\n0,";
    assert!(rows.starts_with(header), "{rows}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A checkpoint of one epoch of 10 steps over `data`, kept, in `dir`.
fn one_epoch_checkpoint(cpu: &LogicalDevice, dir: &std::path::Path, data: &Dataset) {
    let (mut m, _) = model(cpu, cpu, Adam::new(0.02).into());
    m.set_verbose(Verbosity::Silent);
    let mut backup = BackupAndRestore::new(dir).delete_checkpoint(false);
    m.fit_with_callbacks(data, 1, Some(10), None, &mut [&mut backup])
        .unwrap();
    assert!(backup.has_checkpoint());
}

/// Resumes a fresh model from `dir` with `data`; its error, and whether the model changed.
fn resume_error(cpu: &LogicalDevice, dir: &std::path::Path, data: &Dataset) -> (String, bool) {
    let (mut m, _) = model(cpu, cpu, Adam::new(0.02).into());
    m.set_verbose(Verbosity::Silent);
    let before = state(&m);
    let mut backup = BackupAndRestore::new(dir).delete_checkpoint(false);
    let err = m
        .fit_with_callbacks(data, 2, Some(10), None, &mut [&mut backup])
        .unwrap_err()
        .to_string();
    (err, state(&m) != before)
}

#[test]
fn a_checkpoint_of_other_training_data_is_refused_and_changes_nothing() {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    let dir = scratch("other-data");
    one_epoch_checkpoint(&cpu, &dir, &dataset(false));
    // Another batch size: the saved position (batches taken in the pass) means other examples.
    let rebatched = Dataset::from_tensor_slices(
        common::values(90, 11),
        &[3],
        (0..30).map(|i| i % 3).collect(),
    )
    .unwrap()
    .shuffle(30, 5)
    .batch(5, false);
    let (err, changed) = resume_error(&cpu, &dir, &rebatched);
    assert!(
        err.contains("batch(3, false)") && err.contains("batch(5, false)"),
        "{err}"
    );
    assert!(!changed, "a refused checkpoint changes nothing");
    // The same data with other steps per epoch.
    let (mut m, _) = model(&cpu, &cpu, Adam::new(0.02).into());
    m.set_verbose(Verbosity::Silent);
    let mut backup = BackupAndRestore::new(&dir).delete_checkpoint(false);
    let err = m
        .fit_with_callbacks(&dataset(false), 2, Some(7), None, &mut [&mut backup])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("10 steps an epoch") && err.contains("7 steps"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The checkpoint file's safetensors header (JSON) rewritten by `edit`, its length prefix
/// updated.
fn edit_header(path: &std::path::Path, edit: impl Fn(&str) -> String) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    let mut new = edit(header);
    assert_ne!(new, header, "the edit changed nothing");
    while !new.len().is_multiple_of(8) {
        new.push(' ');
    }
    let mut out = (new.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(new.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(path, out).unwrap();
}

#[test]
fn a_checkpoint_holding_nan_or_an_impossible_position_is_refused() {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    let dir = scratch("corrupt");
    one_epoch_checkpoint(&cpu, &dir, &dataset(false));
    let path = BackupAndRestore::new(&dir).checkpoint_path();
    let pristine = std::fs::read(&path).unwrap();

    // A NaN in the data of a weight (the first float of each float32 tensor but the history).
    let (n, header) = safetensors::SafeTensors::read_metadata(&pristine).unwrap();
    let (name, at) = header
        .tensors()
        .into_iter()
        .filter(|(name, info)| {
            !name.starts_with("history/") && info.dtype == safetensors::Dtype::F32
        })
        .map(|(name, info)| (name, info.data_offsets.0))
        .min()
        .unwrap();
    let mut corrupt = pristine.clone();
    let start = 8 + n + at;
    corrupt[start..start + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&path, &corrupt).unwrap();
    let (err, changed) = resume_error(&cpu, &dir, &dataset(false));
    assert!(
        err.contains("NaN") && err.contains("corrupt") && err.contains(&name),
        "{err}"
    );
    assert!(!changed);

    // More batches taken than the epochs done could take, on a dataset that repeats forever
    // (a replay would never end): refused at once.
    let forever = dataset(false).repeat(None);
    std::fs::remove_file(&path).unwrap();
    one_epoch_checkpoint(&cpu, &dir, &forever);
    edit_header(&path, |h| {
        let at = h.find("\"train_taken\":\"").unwrap() + "\"train_taken\":\"".len();
        let end = at + h[at..].find('"').unwrap();
        format!("{}{}{}", &h[..at], u64::MAX / 2, &h[end..])
    });
    let err = {
        let (mut m, _) = model(&cpu, &cpu, Adam::new(0.02).into());
        m.set_verbose(Verbosity::Silent);
        let mut backup = BackupAndRestore::new(&dir).delete_checkpoint(false);
        m.fit_with_callbacks(&forever, 2, Some(10), None, &mut [&mut backup])
            .unwrap_err()
            .to_string()
    };
    assert!(
        err.contains("batches were taken") && err.contains("corrupt"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn model_checkpoint_names_each_epochs_file_from_its_logs() {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    let (mut m, _) = model(&cpu, &cpu, Adam::new(0.02).into());
    m.set_verbose(Verbosity::Silent);
    let dir = scratch("model-checkpoint");
    std::fs::create_dir_all(&dir).unwrap();
    let pattern = dir.join("w-{epoch:02d}-{val_loss:.3f}.safetensors");
    let mut checkpoint = ModelCheckpoint::new(&pattern);
    let history = m
        .fit_with_callbacks(
            &dataset(false),
            2,
            None,
            Some(&validation()),
            &mut [&mut checkpoint],
        )
        .unwrap();
    for (epoch, val_loss) in history.val_loss.iter().enumerate() {
        let name = format!("w-{:02}-{val_loss:.3}.safetensors", epoch + 1);
        assert!(
            dir.join(&name).is_file(),
            "{name} in {:?}",
            std::fs::read_dir(&dir)
        );
    }
    // The last file holds the trained weights.
    let last = format!("w-02-{:.3}.safetensors", history.val_loss[1]);
    let (mut fresh, _) = model(&cpu, &cpu, Adam::new(0.02).into());
    fresh.load_weights(dir.join(last)).unwrap();
    assert_eq!(fresh.get_weights().unwrap(), m.get_weights().unwrap());

    // A key the logs lack fails the fit with the key named, Keras' KeyError.
    let mut wrong = ModelCheckpoint::new(dir.join("w-{val_auc}.safetensors"));
    let err = m
        .fit_with_callbacks(&dataset(false), 1, None, None, &mut [&mut wrong])
        .unwrap_err();
    assert!(
        err.to_string().contains("no 'val_auc' in the logs"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reads `key` from every epoch's logs, as EarlyStopping and ReduceLROnPlateau read it.
struct ReadLog(&'static str, Vec<Option<f64>>);

impl Callback for ReadLog {
    fn on_epoch_end(&mut self, fit: &mut FitContext<'_>) -> anygpu::Result<()> {
        let (value, keys) = fit.epoch_log(self.0);
        assert!(keys.iter().any(|k| k == "val_loss"), "{keys:?}");
        self.1.push(value);
        Ok(())
    }
}

#[test]
fn monitors_read_every_compiled_metric_from_the_epoch_logs() {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    let (mut m, _) = model(&cpu, &cpu, Adam::new(0.02).into());
    m.set_verbose(Verbosity::Silent);
    let key = "val_sparse_top_k_categorical_accuracy";
    let mut read = ReadLog(key, Vec::new());
    let history = m
        .fit_with_callbacks(
            &dataset(false),
            2,
            None,
            Some(&validation()),
            &mut [&mut read],
        )
        .unwrap();
    let expected: Vec<Option<f64>> = history.metrics[key].iter().copied().map(Some).collect();
    assert_eq!(read.1, expected);
}
