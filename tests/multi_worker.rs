//! MultiWorkerMirroredStrategy under `mpirun -n 2` (feature `mpi`): the same losses and weights
//! as one process with the global batch (1 and 2 local replicas per worker), bit-identical
//! parameters on every worker after every step (checksums through an MPI min/max), uneven
//! and tiny global batches, a worker on a GPU next to one on the CPU, a failing worker that
//! stops every worker with its rank and cause (in a step, outside one in `fit`, and a panic in
//! a single local replica), `BackupAndRestore` from the chief's checkpoint, a local
//! `CrossDeviceOps` under the MPI level, workers with different local replica counts in sync,
//! `TF_CONFIG` that disagrees with MPI, loss scaling that skips a step on every worker, and
//! workers out of step (different steps per epoch, models of different shapes, a panic on a
//! kernel thread, a malformed batch on one worker) failing alike instead of hanging, and
//! `BatchNormalization(synchronized=True)` refused on every worker.
//!
//! A binary of its own (`harness = false`): every worker must run the same collectives in the
//! same order, so the cases run one after another on the main thread, in the order below.
//! ```text
//! cargo build --release --features mpi --tests
//! mpirun -n 2 target/release/deps/multi_worker-<hash>     # .ci/run finds the file
//! ```
//! A failed assertion panics, and the MPI panic hook aborts the whole job: `mpirun` exits
//! non-zero naming the rank. With `--panic-on-rank K` the binary instead checks that last
//! resort: worker K panics outside a step while the others wait in a collective; with
//! `--error-on-rank K`, worker K ends through `exit_on_error` with an error of its own.
//! Run without `mpirun`, it is a job of one worker.

mod common;

use common::{assert_close, Flaky};

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anygpu::data::Dataset;
use anygpu::distribute::{HierarchicalAllReduce, MultiWorkerMirroredStrategy};
use anygpu::nn::{
    Activation, Adam, BackupAndRestore, BatchNormalization, Callback, CsvLogger, Dense, FitContext,
    Flatten, Loss, LossScaleOptimizer, Optimizer, Sequential, Sgd,
};
use anygpu::{Error, LogicalDevice, Runtime, Tensor};

/// The small CNN of tests/distribute.rs from `seed`, compiled.
fn compiled_cnn(seed: u64, optimizer: Optimizer) -> anygpu::Result<Sequential> {
    common::compiled(common::small_cnn(seed)?, optimizer)
}

/// A runtime with CPU:0 alone, and a strategy over it (a collective).
fn cpu_worker() -> (Runtime, LogicalDevice, MultiWorkerMirroredStrategy) {
    let rt = common::builder()
        .visible_gpus(&[])
        .build()
        .expect("a CPU runtime");
    let cpu = rt.cpu().expect("CPU:0");
    let strategy = MultiWorkerMirroredStrategy::with_tf_config(std::slice::from_ref(&cpu), None)
        .expect("a strategy");
    (rt, cpu, strategy)
}

/// `steps` global batches of `batch` synthetic examples, on the CPU.
fn batches(cpu: &LogicalDevice, batch: usize, steps: usize) -> Vec<(Tensor, Tensor)> {
    let (x, y) = common::synthetic(batch * steps, 11);
    (0..steps)
        .map(|s| {
            let rows = s * batch..(s + 1) * batch;
            (
                Tensor::from_slice_on(&x[rows.start * 64..rows.end * 64], &[batch, 8, 8, 1], cpu)
                    .expect("a batch uploads"),
                Tensor::from_slice_on(&y[rows], &[batch], cpu).expect("labels upload"),
            )
        })
        .collect()
}

/// Trains the same global batches in this process alone (on `cpu`, no strategy) and across
/// the workers (each over `local`), from the same seed; checks that the losses and weights
/// agree to float tolerance and that every worker holds the same bits after every step.
fn trains_like_one_process(
    local: &[LogicalDevice],
    cpu: &LogicalDevice,
    batch: usize,
    optimizer: Optimizer,
) {
    let steps = 3;
    let data = batches(cpu, batch, steps);
    let mut reference = {
        let _on = cpu.scope();
        compiled_cnn(5, optimizer.clone()).expect("the one-process model builds")
    };
    let want_losses: Vec<f32> = data
        .iter()
        .map(|(x, y)| reference.train_on_batch(x, y).expect("a one-process step"))
        .collect();

    let strategy = MultiWorkerMirroredStrategy::with_tf_config(local, None).expect("a strategy");
    assert_eq!(
        strategy.num_replicas_in_sync(),
        local.len() * strategy.num_workers()
    );
    let mut model = strategy
        .scope(|| compiled_cnn(5, optimizer))
        .expect("one scope")
        .expect("the multi-worker model builds");
    assert!(
        strategy.weights_in_sync(&model).expect("checksums"),
        "the workers start from different weights"
    );
    for (step, (x, y)) in data.iter().enumerate() {
        let loss = model.train_on_batch(x, y).expect("a multi-worker step");
        assert_close(
            &format!("global loss of step {step}"),
            &[loss],
            &[want_losses[step]],
            1e-4,
        );
        assert!(
            strategy.weights_in_sync(&model).expect("checksums"),
            "step {step}: the workers' parameters differ"
        );
    }
    let want = reference.get_weights().expect("reference weights");
    let got = model.get_weights().expect("multi-worker weights");
    assert_eq!(got.len(), want.len(), "number of weight tensors");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_close(&format!("weight {i}"), g, w, 1e-4);
    }
}

/// 2 workers × batch B/2 give the losses and weights of one process with batch B.
fn one_replica_per_worker_trains_like_one_process() {
    let (_rt, cpu, _) = cpu_worker();
    trains_like_one_process(std::slice::from_ref(&cpu), &cpu, 16, Sgd::new(0.1).into());
    trains_like_one_process(std::slice::from_ref(&cpu), &cpu, 16, Adam::default().into());
}

/// Each worker with 2 virtual CPUs: 4 replicas in all; an even and an uneven global batch.
fn two_virtual_cpus_per_worker_train_like_one_process() {
    let rt = common::builder()
        .visible_gpus(&[])
        .virtual_cpus(2)
        .build()
        .expect("2 CPUs");
    let cpus = rt.list_logical_devices("CPU").expect("CPUs");
    trains_like_one_process(&cpus, &cpus[0], 16, Adam::default().into());
    // 10 over 4 replicas: 3, 3 on worker 0; 2, 2 on worker 1.
    trains_like_one_process(&cpus, &cpus[0], 10, Sgd::new(0.1).into());
}

/// Uneven global batches: 7 over 2 workers (4 + 3), and 1 (worker 1 has no examples and
/// contributes zeros, yet updates like the others).
fn uneven_global_batches_train_like_one_process() {
    let (_rt, cpu, strategy) = cpu_worker();
    if strategy.num_workers() == 2 {
        let mine = strategy.worker_batch_size(7);
        assert_eq!(mine, [4, 3][strategy.worker_index()]);
        assert_eq!(
            strategy.worker_batch_size(1),
            [1, 0][strategy.worker_index()]
        );
    }
    trains_like_one_process(std::slice::from_ref(&cpu), &cpu, 7, Adam::default().into());
    trains_like_one_process(std::slice::from_ref(&cpu), &cpu, 1, Adam::default().into());
}

/// Worker 0 on GPU:0 (lavapipe), the others on the CPU: different kernels, so the chief's
/// state is sent to the others each step; still bit-identical, and close to one process.
fn a_gpu_worker_next_to_a_cpu_worker() {
    let gpu_here = common::gpus_at_least(1, "a_gpu_worker_next_to_a_cpu_worker").is_some();
    // Every worker must take the same path: the lowest worker without a GPU skips for all.
    let (_probe, _, all) = cpu_worker();
    let ready = all.agree(
        "looking for a GPU",
        match gpu_here {
            true => Ok(()),
            false => Err(Error::Unavailable("no GPU".into())),
        },
    );
    if let Err(e) = ready {
        eprintln!("SKIPPED a_gpu_worker_next_to_a_cpu_worker: {e}");
        return;
    }
    let rt = common::builder()
        .visible_gpus(&[0])
        .memory_growth(true)
        .build()
        .expect("a GPU runtime");
    let device = match all.worker_index() {
        0 => rt.device("/gpu:0").expect("GPU:0"),
        _ => rt.cpu().expect("CPU:0"),
    };
    let cpu = rt.cpu().expect("CPU:0");
    trains_like_one_process(
        std::slice::from_ref(&device),
        &cpu,
        12,
        Adam::default().into(),
    );
}

/// Worker 1 runs out of memory in forward (a 1 MiB virtual GPU): every worker gets the same
/// error naming worker 1 and the cause, within the step; no worker updates; the job goes on.
/// Then a bad file on worker 1 only, through `agree`.
fn a_failing_worker_stops_every_worker() {
    let (_rt, cpu, strategy) = cpu_worker();
    let last = strategy.num_workers() - 1;
    // Only the last worker opens the GPU.
    let gpu_rt = (strategy.worker_index() == last).then(|| {
        common::builder()
            .visible_gpus(&[0])
            .virtual_gpus(0, &[1])
            .build()
    });
    let gpu = gpu_rt
        .as_ref()
        .and_then(|rt| rt.as_ref().ok())
        .and_then(|rt| rt.device("/gpu:0").ok())
        .filter(|d| d.is_available());
    let ready = strategy.agree(
        "looking for a GPU",
        match (strategy.worker_index() == last, &gpu) {
            (true, None) => Err(Error::Unavailable("no GPU to run out of memory on".into())),
            _ => Ok(()),
        },
    );
    if ready.is_ok() && strategy.num_workers() > 1 {
        // The last worker on a 1 MiB GPU, the others on the CPU.
        let device = match (strategy.worker_index() == last, &gpu) {
            (true, Some(g)) => g.clone(),
            _ => cpu.clone(),
        };
        let oom = MultiWorkerMirroredStrategy::with_tf_config(std::slice::from_ref(&device), None)
            .expect("a strategy");
        let mut model = oom
            .scope(|| compiled_cnn(2, Adam::default().into()))
            .expect("scope")
            .expect("the weights fit in 1 MiB");
        let before = model.get_weights().expect("weights");
        // 1024 examples: the last worker's 512 × 8×8×4 floats of one activation are 1 MiB.
        let data = batches(&cpu, 1024, 1);
        let start = Instant::now();
        let err = model
            .train_on_batch(&data[0].0, &data[0].1)
            .expect_err("the last worker runs out of memory");
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the error took {:?}",
            start.elapsed()
        );
        match &err {
            Error::Distributed { rank, cause, .. } => {
                assert_eq!(*rank, last, "{err}");
                assert!(cause.contains("OOM when allocating"), "{err}");
            }
            other => panic!("expected Error::Distributed, got {other}"),
        }
        let message = err.to_string();
        assert!(
            message.contains(&format!("on worker {last} of")),
            "{message}"
        );
        assert_eq!(
            model.get_weights().expect("weights"),
            before,
            "an update ran"
        );
        assert!(oom.weights_in_sync(&model).expect("checksums"));
    } else if let Err(e) = ready {
        eprintln!("SKIPPED the out-of-memory part: {e}");
    }

    // A file only the last worker lacks.
    let dir = std::env::temp_dir().join(format!("anygpu-mw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let path = dir.join("weights.safetensors");
    let mut model = strategy
        .scope(|| compiled_cnn(4, Sgd::new(0.1).into()))
        .expect("scope")
        .expect("a model");
    model.save_weights(&path).expect("weights saved");
    if strategy.worker_index() == last && last > 0 {
        std::fs::remove_file(&path).expect("removed");
    }
    let err = strategy.agree("loading weights", model.load_weights(&path));
    let _ = std::fs::remove_dir_all(&dir);
    if last > 0 {
        let err = err.expect_err("the last worker lacks the file");
        let message = err.to_string();
        assert!(
            message.starts_with(&format!("loading weights on worker {last} of")),
            "{message}"
        );
        assert!(message.contains("weights.safetensors"), "{message}");
    } else {
        err.expect("one worker has its file");
    }
}

/// Fails its hook `hook` when this worker (`me`) is worker `rank`.
struct FailOn {
    me: usize,
    rank: usize,
    hook: &'static str,
}

impl FailOn {
    fn check(&self, hook: &str) -> anygpu::Result<()> {
        if hook == self.hook && self.me == self.rank {
            return Err(Error::Model(format!("{hook} fails on purpose")));
        }
        Ok(())
    }
}

impl Callback for FailOn {
    fn train_batch_interval(&self) -> Option<u64> {
        Some(1)
    }

    fn on_train_batch_end(
        &mut self,
        _fit: &mut FitContext<'_>,
        _logs: &anygpu::nn::BatchLogs,
    ) -> anygpu::Result<()> {
        self.check("on_train_batch_end")
    }

    fn on_epoch_end(&mut self, _fit: &mut FitContext<'_>) -> anygpu::Result<()> {
        self.check("on_epoch_end")
    }
}

/// An error only one worker sees outside a training step — a chief-only callback that cannot
/// write its file, a callback failing on the last worker, a batch of the wrong shape on the
/// last worker — ends `fit` on every worker with the same `Error::Distributed` naming that
/// worker, well within the CI timeout (before the fix, the failed worker returned and the
/// others waited for it in their next step's vote).
fn an_error_outside_a_step_stops_every_worker() {
    let (_rt, _cpu, strategy) = cpu_worker();
    let (rank, last) = (strategy.worker_index(), strategy.num_workers() - 1);
    let mut model = strategy
        .scope(|| compiled_cnn(3, Sgd::new(0.1).into()))
        .expect("scope")
        .expect("a model");
    let (x, y) = common::synthetic(16, 5);
    let data = Dataset::from_tensor_slices(x, &[8, 8, 1], y)
        .expect("a dataset")
        .batch(8, false);
    let check = |err: Error, worker: usize, cause: &str| match &err {
        Error::Distributed { rank, cause: c, .. } => {
            assert_eq!(*rank, worker, "{err}");
            assert!(c.contains(cause), "{err}");
        }
        other => panic!("expected Error::Distributed, got {other}"),
    };

    // CsvLogger writes on the chief only: a path under a regular file fails there alone.
    let dir = std::env::temp_dir().join(format!("anygpu-mw-cb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let file = dir.join("not-a-dir");
    std::fs::write(&file, b"").expect("a file");
    let mut csv = CsvLogger::new(file.join("history.csv"));
    let start = Instant::now();
    let err = model
        .fit_with_callbacks(&data, 2, None, None, &mut [&mut csv])
        .expect_err("the chief cannot write its CSV");
    check(err, 0, "history.csv");
    let _ = std::fs::remove_dir_all(&dir);

    // A callback failing on the last worker only, after a batch and after an epoch.
    for hook in ["on_train_batch_end", "on_epoch_end"] {
        let mut fail = FailOn {
            me: rank,
            rank: last,
            hook,
        };
        let err = model
            .fit_with_callbacks(&data, 2, None, None, &mut [&mut fail])
            .expect_err("the last worker's callback fails");
        check(err, last, "fails on purpose");
    }

    // The last worker's batches have the wrong shape: its step fails in the step's vote.
    let bad = match rank == last {
        true => {
            let (x, y) = common::synthetic(16, 5);
            Dataset::from_tensor_slices(x, &[8, 4, 2], y)
                .expect("a dataset")
                .batch(8, false)
        }
        false => data.clone(),
    };
    let err = model
        .fit(&bad, 1, None, None)
        .expect_err("the last worker's batch has the wrong shape");
    check(err, last, "");
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "the errors took {:?}",
        start.elapsed()
    );
    // The job goes on: every worker still trains, in step.
    model
        .fit(&data, 1, None, None)
        .expect("fit after the errors");
    assert!(strategy.weights_in_sync(&model).expect("checksums"));
}

/// `BackupAndRestore` in a directory of each worker's own (no shared filesystem): only the
/// chief writes a checkpoint, and a new `fit` resumes every worker from the chief's.
fn backup_and_restore_resumes_every_worker_from_the_chiefs_checkpoint() {
    let (_rt, _cpu, strategy) = cpu_worker();
    let rank = strategy.worker_index();
    let dir = std::env::temp_dir().join(format!("anygpu-mw-backup-{}-{rank}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (x, y) = common::synthetic(16, 9);
    let data = Dataset::from_tensor_slices(x, &[8, 8, 1], y)
        .expect("a dataset")
        .batch(8, false);
    let model = || {
        strategy
            .scope(|| compiled_cnn(6, Adam::default().into()))
            .expect("scope")
            .expect("a model")
    };
    let mut first = model();
    let mut backup = BackupAndRestore::new(&dir).delete_checkpoint(false);
    first
        .fit_with_callbacks(&data, 1, None, None, &mut [&mut backup])
        .expect("one epoch");
    assert_eq!(backup.has_checkpoint(), rank == 0, "only the chief writes");

    let mut resumed = model();
    let mut backup = BackupAndRestore::new(&dir);
    let history = resumed
        .fit_with_callbacks(&data, 2, None, None, &mut [&mut backup])
        .expect("a resumed fit");
    assert_eq!(backup.restored_epochs(), Some(1), "worker {rank} resumed");
    assert_eq!(history.epochs(), 2);
    assert_eq!(resumed.iterations(), 4);
    assert!(strategy.weights_in_sync(&resumed).expect("checksums"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A local `CrossDeviceOps` set on a worker's strategy replaces the local level only: the sum
/// still crosses the workers.
fn with_cross_device_ops_keeps_the_workers() {
    let (_rt, cpu, strategy) = cpu_worker();
    let replaced = strategy
        .mirrored()
        .clone()
        .with_cross_device_ops(HierarchicalAllReduce);
    let ones = Tensor::from_slice_on(&[1.0f32; 4], &[4], &cpu).expect("ones");
    let sums = replaced
        .cross_device_ops()
        .reduce_sum(&[ones], std::slice::from_ref(&cpu))
        .expect("a sum");
    assert_eq!(
        sums[0].to_vec::<f32>().expect("read"),
        vec![strategy.num_workers() as f32; 4]
    );
}

/// Workers with different numbers of local replicas (2 virtual CPUs on the chief, 1 on the
/// others) compare equal in `weights_in_sync`, before and after training.
fn uneven_local_replicas_are_in_sync() {
    let (_probe, _, all) = cpu_worker();
    let threads = if all.worker_index() == 0 { 2 } else { 1 };
    let rt = common::builder()
        .visible_gpus(&[])
        .virtual_cpus(threads)
        .build()
        .expect("CPUs");
    let cpus = rt.list_logical_devices("CPU").expect("CPUs");
    let strategy = MultiWorkerMirroredStrategy::with_tf_config(&cpus, None).expect("a strategy");
    let mut model = strategy
        .scope(|| compiled_cnn(8, Sgd::new(0.1).into()))
        .expect("scope")
        .expect("a model");
    assert!(strategy.weights_in_sync(&model).expect("checksums"));
    let data = batches(&cpus[0], 9, 2);
    for (x, y) in &data {
        model.train_on_batch(x, y).expect("a step");
    }
    assert!(strategy.weights_in_sync(&model).expect("checksums"));
}

/// A panic in a replica's forward pass on the last worker, with one local replica (it runs
/// on the calling thread): every worker's step fails with the same `Error::Distributed`, no
/// worker updates, and the job goes on (before, the MPI panic hook aborted the job, since it
/// spared only threads named "anygpu replica").
fn a_panic_in_a_single_replica_step_fails_the_step_everywhere() {
    let (_rt, cpu, strategy) = cpu_worker();
    let last = strategy.num_workers() - 1;
    let flaky = Flaky::new(
        Dense::new(3)
            .activation(Activation::Softmax)
            .input_shape(&[64]),
    );
    let panic = flaky.panic_forward.clone();
    let mut model = strategy
        .scope(|| -> anygpu::Result<Sequential> {
            let mut m = Sequential::with_seed(3);
            m.add(flaky)?;
            m.compile(Loss::sparse_categorical_crossentropy(), Sgd::new(0.1), &[])?;
            Ok(m)
        })
        .expect("scope")
        .expect("a model");
    let (x, y) = common::synthetic(8, 4);
    let x = Tensor::from_slice_on(&x, &[8, 64], &cpu).expect("x");
    let y = Tensor::from_slice_on(&y, &[8], &cpu).expect("y");
    let before = model.get_weights().expect("weights");
    // Each worker is a process of its own: only the last one's layer panics.
    panic.store(strategy.worker_index() == last, Ordering::SeqCst);
    let err = model
        .train_on_batch(&x, &y)
        .expect_err("the last worker panics");
    panic.store(false, Ordering::SeqCst);
    match &err {
        Error::Distributed { rank, cause, .. } => {
            assert_eq!(*rank, last, "{err}");
            assert!(cause.contains("injected: forward panics"), "{err}");
        }
        other => panic!("expected Error::Distributed, got {other}"),
    }
    assert_eq!(
        model.get_weights().expect("weights"),
        before,
        "an update ran"
    );
    model
        .train_on_batch(&x, &y)
        .expect("a step after the panic");
    assert!(strategy.weights_in_sync(&model).expect("checksums"));
}

/// A worker whose dataset gives a step more than the others' fails `fit` on every worker
/// before the first step, naming the counts, instead of pairing its extra step's collectives
/// with the others' validation; the workers stay usable and in sync.
fn workers_with_different_steps_per_epoch_fail_fit_alike() {
    let (_rt, _cpu, strategy) = cpu_worker();
    let mut model = strategy
        .scope(|| compiled_cnn(5, Sgd::new(0.05).into()))
        .expect("scope")
        .expect("a model");
    // 16 examples on worker 0, 24 on worker 1 (batch 8): 2 steps against 3.
    let n = 16 + 8 * strategy.worker_index().min(1);
    let (x, y) = common::synthetic(n, 6);
    let data = Dataset::from_tensor_slices(x, &[8, 8, 1], y)
        .expect("a dataset")
        .batch(8, false);
    let result = model.fit(&data, 1, None, None);
    if strategy.num_workers() == 1 {
        result.expect("one worker agrees with itself");
        return;
    }
    match result {
        Err(Error::Distributed { request, cause, .. }) => {
            assert_eq!(request, "fit: steps per epoch");
            assert!(cause.contains("steps an epoch"), "{cause}");
        }
        other => panic!("expected Error::Distributed, got {other:?}"),
    }
    assert!(strategy.weights_in_sync(&model).expect("checksums"));
}

/// Asks `fit` to stop once `after` epochs are done.
struct StopAfter {
    after: usize,
}

impl Callback for StopAfter {
    fn on_epoch_end(&mut self, fit: &mut FitContext<'_>) -> anygpu::Result<()> {
        if fit.epoch() >= self.after {
            fit.stop_training();
        }
        Ok(())
    }
}

/// A stop one worker's callback asks for (an EarlyStopping whose validation loss, computed on
/// that worker's own devices, differs from the others') stops every worker after the same
/// epoch, in sync, instead of leaving the others waiting in the next epoch.
fn a_stop_asked_by_one_worker_stops_every_worker() {
    let (_rt, _cpu, strategy) = cpu_worker();
    let mut model = strategy
        .scope(|| compiled_cnn(5, Sgd::new(0.05).into()))
        .expect("scope")
        .expect("a model");
    let (x, y) = common::synthetic(16, 6);
    let data = Dataset::from_tensor_slices(x, &[8, 8, 1], y)
        .expect("a dataset")
        .batch(8, false);
    let after = if strategy.worker_index() == 0 { 2 } else { 99 };
    let mut stop = StopAfter { after };
    let history = model
        .fit_with_callbacks(&data, 4, None, None, &mut [&mut stop])
        .expect("fit");
    assert_eq!(history.epochs(), 2, "worker {}", strategy.worker_index());
    assert!(strategy.weights_in_sync(&model).expect("checksums"));
}

/// Workers that build models of different shapes fail the model's creation alike (the first
/// broadcast of the chief's weights carries another length), with a message saying so.
fn models_of_different_shapes_fail_on_every_worker() {
    let (_rt, _cpu, strategy) = cpu_worker();
    let units = 3 + strategy.worker_index().min(1);
    let made = strategy
        .scope(|| -> anygpu::Result<Sequential> {
            let mut m = Sequential::with_seed(1);
            m.add(Dense::new(units).input_shape(&[4]))?;
            Ok(m)
        })
        .expect("scope");
    if strategy.num_workers() == 1 {
        made.expect("one worker");
        return;
    }
    match made {
        Err(Error::Distributed { cause, .. }) => {
            assert!(cause.contains("out of step"), "{cause}");
            assert!(cause.contains("values"), "{cause}");
        }
        other => panic!("expected Error::Distributed, got {other:?}"),
    }
    // The next collective pairs again.
    strategy
        .agree("after a failed creation", Ok(()))
        .expect("the workers are back in step");
}

/// A [`Dense`] layer whose forward pass panics on one of rayon's threads (where the CPU
/// kernels run) while `panic_forward` is set.
#[derive(Debug, Clone)]
struct PanicsInKernel(Flaky);

impl anygpu::nn::Layer for PanicsInKernel {
    fn class_name(&self) -> &'static str {
        "Dense"
    }
    fn base_name(&self) -> &'static str {
        "dense"
    }
    fn declared_input_shape(&self) -> Option<&[usize]> {
        self.0.declared_input_shape()
    }
    fn activation(&self) -> Activation {
        anygpu::nn::Layer::activation(&self.0)
    }
    fn compute_output_shape(&self, input_shape: &[usize]) -> anygpu::Result<Vec<usize>> {
        self.0.compute_output_shape(input_shape)
    }
    fn build(&mut self, shape: &[usize], seed: u64, device: &LogicalDevice) -> anygpu::Result<()> {
        self.0.build(shape, seed, device)
    }
    fn weights(&self) -> Vec<(&'static str, &Tensor)> {
        self.0.weights()
    }
    fn set_weight(&mut self, index: usize, value: Tensor) -> anygpu::Result<()> {
        self.0.set_weight(index, value)
    }
    fn forward(&self, x: &Tensor) -> anygpu::Result<(Tensor, Vec<Tensor>)> {
        if self.0.panic_forward.load(Ordering::SeqCst) {
            use rayon::prelude::*;
            (0..64).into_par_iter().for_each(|i| {
                assert!(
                    rayon::current_thread_index().is_none() || i != 63,
                    "injected: a kernel thread panics"
                );
            });
        }
        self.0.inner.forward(x)
    }
    fn backward(
        &self,
        saved: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> anygpu::Result<(Option<Tensor>, Vec<Tensor>)> {
        self.0.backward(saved, dy, need_dx)
    }
    fn boxed_clone(&self) -> Box<dyn anygpu::nn::Layer> {
        Box::new(self.clone())
    }
}

/// A panic on one of rayon's threads inside a replica's kernels fails the step on every
/// worker, as a panic on the replica's own thread does, instead of aborting the job.
fn a_panic_on_a_kernel_thread_fails_the_step_everywhere() {
    let (_rt, cpu, strategy) = cpu_worker();
    let last = strategy.num_workers() - 1;
    let layer = PanicsInKernel(Flaky::new(
        Dense::new(3)
            .activation(Activation::Softmax)
            .input_shape(&[64]),
    ));
    let panic = layer.0.panic_forward.clone();
    let mut model = strategy
        .scope(|| -> anygpu::Result<Sequential> {
            let mut m = Sequential::with_seed(3);
            m.add(layer)?;
            m.compile(Loss::sparse_categorical_crossentropy(), Sgd::new(0.1), &[])?;
            Ok(m)
        })
        .expect("scope")
        .expect("a model");
    let (x, y) = common::synthetic(8, 4);
    let x = Tensor::from_slice_on(&x, &[8, 64], &cpu).expect("x");
    let y = Tensor::from_slice_on(&y, &[8], &cpu).expect("y");
    panic.store(strategy.worker_index() == last, Ordering::SeqCst);
    let err = model
        .train_on_batch(&x, &y)
        .expect_err("the last worker's kernel thread panics");
    panic.store(false, Ordering::SeqCst);
    match &err {
        Error::Distributed { rank, cause, .. } => {
            assert_eq!(*rank, last, "{err}");
            assert!(cause.contains("injected: a kernel thread panics"), "{err}");
        }
        other => panic!("expected Error::Distributed, got {other}"),
    }
    model
        .train_on_batch(&x, &y)
        .expect("a step after the panic");
    assert!(strategy.weights_in_sync(&model).expect("checksums"));
}

/// A worker whose own batch is malformed (another example shape) fails `train_on_batch` on
/// every worker alike: its input error joins the step's vote instead of returning before it,
/// which left the others waiting in the step's collectives.
fn a_local_input_error_in_train_on_batch_fails_every_worker() {
    let (_rt, cpu, strategy) = cpu_worker();
    let last = strategy.num_workers() - 1;
    let mut model = strategy
        .scope(|| compiled_cnn(8, Sgd::new(0.05).into()))
        .expect("scope")
        .expect("a model");
    let (x, y) = common::synthetic(8, 2);
    let shape: &[usize] = if strategy.worker_index() == last {
        &[8, 4, 16, 1]
    } else {
        &[8, 8, 8, 1]
    };
    let x = Tensor::from_slice_on(&x, shape, &cpu).expect("x");
    let y = Tensor::from_slice_on(&y, &[8], &cpu).expect("y");
    let before = model.get_weights().expect("weights");
    match model.train_on_batch(&x, &y) {
        Err(Error::Distributed { rank, .. }) => assert_eq!(rank, last),
        other => panic!("expected Error::Distributed, got {other:?}"),
    }
    assert_eq!(
        model.get_weights().expect("weights"),
        before,
        "an update ran"
    );
    assert!(strategy.weights_in_sync(&model).expect("checksums"));
}

/// `BatchNormalization(synchronized=True)` synchronizes the replicas of one process only: a
/// multi-worker step refuses it on every worker, naming the option, and updates nothing.
fn synchronized_batch_norm_is_refused_on_every_worker() {
    let (_rt, cpu, strategy) = cpu_worker();
    let mut model = strategy
        .scope(|| {
            let mut m = Sequential::with_seed(4);
            m.add(Flatten::new().input_shape(&[8, 8, 1]))?;
            m.add(BatchNormalization::new().synchronized(true))?;
            m.add(Dense::new(10).activation(Activation::Softmax))?;
            common::compiled(m, Sgd::new(0.05).into())
        })
        .expect("scope")
        .expect("a model");
    let (x, y) = batches(&cpu, 8, 1).remove(0);
    let before = model.get_weights().expect("weights");
    let err = model
        .train_on_batch(&x, &y)
        .expect_err("refused")
        .to_string();
    assert!(err.contains("synchronized=True"), "{err}");
    assert_eq!(
        model.get_weights().expect("weights"),
        before,
        "an update ran"
    );
}

/// `TF_CONFIG` describing another job fails on every worker, naming the worker and why.
fn tf_config_that_disagrees_with_mpi_is_an_error() {
    let (_rt, cpu, probe) = cpu_worker();
    let devices = std::slice::from_ref(&cpu);
    let (rank, size) = (probe.worker_index(), probe.num_workers());
    let hosts: Vec<String> = (0..size).map(|i| format!("\"host{i}:2222\"")).collect();
    let config = |hosts: &[String], index: usize| {
        format!(
            r#"{{"cluster": {{"worker": [{}]}}, "task": {{"type": "worker", "index": {index}}}}}"#,
            hosts.join(", ")
        )
    };
    // The right one.
    MultiWorkerMirroredStrategy::with_tf_config(devices, Some(&config(&hosts, rank)))
        .expect("TF_CONFIG that matches MPI");
    // One worker too many.
    let mut more = hosts.clone();
    more.push("\"extra:2222\"".into());
    let err = MultiWorkerMirroredStrategy::with_tf_config(devices, Some(&config(&more, rank)))
        .expect_err("a worker too many");
    let message = err.to_string();
    assert!(
        message.contains(&format!(
            "TF_CONFIG lists {} workers but MPI started {size} processes",
            size + 1
        )),
        "{message}"
    );
    assert!(message.contains("on worker 0 of"), "{message}");
    // Indices in reverse: worker 0 (the lowest that disagrees) is named, when there are two.
    if size > 1 {
        let err = MultiWorkerMirroredStrategy::with_tf_config(
            devices,
            Some(&config(&hosts, size - 1 - rank)),
        )
        .expect_err("swapped indices");
        let message = err.to_string();
        assert!(
            message.contains(&format!(
                "starting MultiWorkerMirroredStrategy on worker 0 of {size}: TF_CONFIG makes this \
                 process task worker:{} (worker {}), but MPI started it as rank 0",
                size - 1,
                size - 1
            )),
            "{message}"
        );
    }
}

/// The last resort: worker `k` panics outside any step while the others wait for it in a
/// collective; the panic hook aborts the job (`mpirun` exits non-zero within seconds).
fn panic_on(k: usize) {
    let (_rt, _cpu, strategy) = cpu_worker();
    if strategy.worker_index() == k {
        panic!("worker {k} panics on purpose");
    }
    // Never completes: worker k is gone.
    let _ = strategy.agree("waiting for the panicking worker", Ok(()));
    eprintln!(
        "[worker {}] a collective completed without worker {k}",
        strategy.worker_index()
    );
    std::process::exit(3);
}

/// `exit_on_error`: worker `k` ends `main` with an error of its own while the others wait for
/// it in a collective; the job is aborted (`mpirun` exits non-zero within seconds) instead of
/// worker `k` blocking in `MPI_Finalize` at exit.
fn error_on(k: usize) {
    let (_rt, _cpu, strategy) = cpu_worker();
    if strategy.worker_index() == k {
        MultiWorkerMirroredStrategy::exit_on_error::<(), _>(Err(Error::Model(format!(
            "worker {k} fails on purpose"
        ))));
    }
    let _ = strategy.agree("waiting for the failed worker", Ok(()));
    eprintln!(
        "[worker {}] a collective completed without worker {k}",
        strategy.worker_index()
    );
    std::process::exit(3);
}

/// Dynamic loss scaling across workers: a global batch whose second half (worker 1's, with two
/// workers) holds an infinity skips the step on every worker and halves every worker's scale;
/// a finite batch then updates everywhere. No vote of its own: the summed gradients decide.
fn loss_scaling_skips_the_step_on_every_worker() {
    let (_rt, cpu, strategy) = cpu_worker();
    let mut model = strategy
        .scope(|| {
            let mut m = Sequential::with_seed(3);
            m.add(
                Dense::new(3)
                    .activation(Activation::Softmax)
                    .input_shape(&[4]),
            )?;
            let opt = LossScaleOptimizer::new(Sgd::new(0.1)).initial_scale(8.0);
            m.compile(Loss::sparse_categorical_crossentropy(), opt, &[])?;
            Ok::<_, Error>(m)
        })
        .expect("one scope")
        .expect("the multi-worker model builds");
    let before = model.get_weights().expect("weights");
    let overflowing = [0.5, 0.1, 0.2, 0.9, f32::INFINITY, 1.0, 0.0, 0.0];
    let x = Tensor::from_slice_on(&overflowing, &[2, 4], &cpu).expect("x");
    let y = Tensor::from_slice_on(&[0i32, 1], &[2], &cpu).expect("y");
    model
        .train_step(&x, &y)
        .expect("a skipped step is no error");
    assert_eq!(model.loss_scale(), Some(4.0));
    assert_eq!(model.iterations(), 0);
    assert_eq!(model.get_weights().expect("weights"), before);
    let x = Tensor::from_slice_on(&[0.5f32, 0.1, 0.2, 0.9, 0.3, 1.0, 0.0, 0.0], &[2, 4], &cpu)
        .expect("x");
    model.train_step(&x, &y).expect("a step");
    assert_eq!(model.iterations(), 1);
    assert_ne!(model.get_weights().expect("weights"), before);
    assert!(
        strategy.weights_in_sync(&model).expect("checksums"),
        "the workers' parameters differ"
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--error-on-rank") {
        let k = args.get(i + 1).and_then(|k| k.parse().ok()).unwrap_or(1);
        error_on(k);
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--panic-on-rank") {
        let k = args.get(i + 1).and_then(|k| k.parse().ok()).unwrap_or(1);
        panic_on(k);
        return;
    }
    let cases: [(&str, fn()); 18] = [
        (
            "a_stop_asked_by_one_worker_stops_every_worker",
            a_stop_asked_by_one_worker_stops_every_worker,
        ),
        (
            "one_replica_per_worker_trains_like_one_process",
            one_replica_per_worker_trains_like_one_process,
        ),
        (
            "two_virtual_cpus_per_worker_train_like_one_process",
            two_virtual_cpus_per_worker_train_like_one_process,
        ),
        (
            "uneven_global_batches_train_like_one_process",
            uneven_global_batches_train_like_one_process,
        ),
        (
            "a_gpu_worker_next_to_a_cpu_worker",
            a_gpu_worker_next_to_a_cpu_worker,
        ),
        (
            "a_failing_worker_stops_every_worker",
            a_failing_worker_stops_every_worker,
        ),
        (
            "an_error_outside_a_step_stops_every_worker",
            an_error_outside_a_step_stops_every_worker,
        ),
        (
            "backup_and_restore_resumes_every_worker_from_the_chiefs_checkpoint",
            backup_and_restore_resumes_every_worker_from_the_chiefs_checkpoint,
        ),
        (
            "with_cross_device_ops_keeps_the_workers",
            with_cross_device_ops_keeps_the_workers,
        ),
        (
            "uneven_local_replicas_are_in_sync",
            uneven_local_replicas_are_in_sync,
        ),
        (
            "a_panic_in_a_single_replica_step_fails_the_step_everywhere",
            a_panic_in_a_single_replica_step_fails_the_step_everywhere,
        ),
        (
            "workers_with_different_steps_per_epoch_fail_fit_alike",
            workers_with_different_steps_per_epoch_fail_fit_alike,
        ),
        (
            "models_of_different_shapes_fail_on_every_worker",
            models_of_different_shapes_fail_on_every_worker,
        ),
        (
            "a_panic_on_a_kernel_thread_fails_the_step_everywhere",
            a_panic_on_a_kernel_thread_fails_the_step_everywhere,
        ),
        (
            "a_local_input_error_in_train_on_batch_fails_every_worker",
            a_local_input_error_in_train_on_batch_fails_every_worker,
        ),
        (
            "synchronized_batch_norm_is_refused_on_every_worker",
            synchronized_batch_norm_is_refused_on_every_worker,
        ),
        (
            "tf_config_that_disagrees_with_mpi_is_an_error",
            tf_config_that_disagrees_with_mpi_is_an_error,
        ),
        (
            "loss_scaling_skips_the_step_on_every_worker",
            loss_scaling_skips_the_step_on_every_worker,
        ),
    ];
    // `--exact NAME` runs one case (on every worker alike), as libtest would.
    let only = args.iter().skip(1).find(|a| !a.starts_with('-'));
    for (name, case) in cases {
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let start = Instant::now();
        case();
        eprintln!(
            "test {name} ... ok ({:.1} s)",
            start.elapsed().as_secs_f64()
        );
    }
}
