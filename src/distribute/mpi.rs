//! `tf.distribute.MultiWorkerMirroredStrategy` over MPI (feature `mpi`): one worker per
//! process, started by `mpirun`, a hostfile or Slurm's `srun`.
//!
//! A worker mirrors its model over its local devices like [`MirroredStrategy`]; what it adds
//! is a [`CrossDeviceOps`], [`MpiAllReduce`], whose sum runs in three levels: the local
//! replicas' gradients through [`HierarchicalAllReduce`] (or the local `CrossDeviceOps` that
//! [`MirroredStrategy::with_cross_device_ops`] set), one MPI all-reduce of the packed
//! `f32` sums between the workers (from one thread), and the result back to the local
//! replicas. Before every collective that carries data, every worker votes on how its part went,
//! what the collective is for and how long it is (one all-gather of three words per worker), so
//! a worker that fails, or whose control flow went elsewhere, ends the step on every worker with
//! the same [`Error::Distributed`] instead of leaving them waiting in a collective.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use ::mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use ::mpi::environment::Universe;
use ::mpi::topology::{Communicator, SimpleCommunicator};
use ::mpi::Threading;

use crate::device::LogicalDevice;
use crate::distribute::cross_device::CrossDeviceOps;
#[cfg(doc)]
use crate::distribute::cross_device::HierarchicalAllReduce;
use crate::distribute::strategy::{MirroredStrategy, StrategyScope};
use crate::distribute::tf_config::check_tf_config;
use crate::distribute::{fnv1a, in_replica_job, worker_rows, Workers};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// MPI as this process has it: initialized once, finalized at exit.
struct Process {
    /// Held during every call into MPI: the library is initialized for
    /// `MPI_THREAD_SERIALIZED`, so calls from several threads must not overlap. Taken at exit
    /// (`MPI_Finalize`).
    universe: Mutex<Option<Universe>>,
    rank: usize,
    size: usize,
}

static PROCESS: OnceLock<std::result::Result<Process, String>> = OnceLock::new();

extern "C" {
    // libc's, always linked: finalizes MPI when the process exits, since a `static` is never
    // dropped and Open MPI reports a worker that exits without `MPI_Finalize` as a failure.
    fn atexit(callback: extern "C" fn()) -> std::os::raw::c_int;
}

extern "C" fn finalize() {
    if let Some(Ok(process)) = PROCESS.get() {
        // A thread stuck in a collective holds the lock; exiting must not wait for it.
        if let Ok(mut universe) = process.universe.try_lock() {
            drop(universe.take());
        }
    }
}

/// MPI, initialized on first use.
fn process() -> Result<&'static Process> {
    let state = PROCESS.get_or_init(|| {
        let Some((universe, threading)) = ::mpi::initialize_with_threading(Threading::Serialized)
        else {
            return Err(
                "MPI was initialized outside anygpu; let MultiWorkerMirroredStrategy \
                        initialize it"
                    .into(),
            );
        };
        if threading < Threading::Serialized {
            return Err(format!(
                "the MPI library offers {threading:?} threading; anygpu needs Serialized"
            ));
        }
        // SAFETY: `finalize` is a plain function that touches only the `static` above.
        if unsafe { atexit(finalize) } != 0 {
            log::warn!("could not register MPI_Finalize at exit");
        }
        install_panic_hook();
        let world = universe.world();
        let (rank, size) = (world.rank(), world.size());
        Ok(Process {
            universe: Mutex::new(Some(universe)),
            rank: usize::try_from(rank).unwrap_or(0),
            size: usize::try_from(size).unwrap_or(1),
        })
    });
    state.as_ref().map_err(|cause| Error::Distributed {
        rank: 0,
        workers: 0,
        request: "initializing MPI".into(),
        cause: cause.clone(),
    })
}

/// Runs `f` on the world communicator, alone.
fn with_world<R>(process: &Process, f: impl FnOnce(&SimpleCommunicator) -> R) -> R {
    let _serialized = process
        .universe
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    f(&SimpleCommunicator::world())
}

/// A panic outside a replica's job (those become step errors that every worker agrees on,
/// with one local replica as with several) may leave this worker's parameters different from
/// the others', or leave them waiting in a collective: after the usual message, the whole job
/// is aborted.
fn install_panic_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        if in_replica_job() {
            return;
        }
        let rank = PROCESS
            .get()
            .and_then(|p| p.as_ref().ok())
            .map_or(0, |p| p.rank);
        abort_job(rank, &format!("panicked: {info}"));
    }));
}

/// Prints why and aborts every worker (`MPI_Abort`); Open MPI's `mpirun` then ends the
/// others and names this rank.
fn abort_job(rank: usize, cause: &str) -> ! {
    eprintln!("[worker {rank}] {cause}; aborting every worker");
    // No lock: another thread may be waiting in a collective that will never complete.
    SimpleCommunicator::world().abort(1)
}

/// Time spent in the all-reduce between workers, over the steps so far
/// ([`MultiWorkerMirroredStrategy::all_reduce_times`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AllReduceTimes {
    /// All-reduces run (one per training step for models under 8 Mi parameters).
    pub calls: u64,
    /// Time inside `MPI_Allreduce` (waiting for the slowest worker included).
    pub mpi: Duration,
    /// The whole [`MpiAllReduce::reduce_sum`]: the local reduction, the read to the host, the
    /// vote, `MPI_Allreduce` and the upload to the local replicas.
    pub total: Duration,
}

/// This worker's place in the job; the [`Workers`] of its strategy.
struct MpiWorld {
    process: &'static Process,
    /// Local replicas of every worker, in rank order.
    replicas: Vec<usize>,
    same_kernels: bool,
    times: Mutex<AllReduceTimes>,
}

impl fmt::Debug for MpiWorld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MpiWorld")
            .field("rank", &self.process.rank)
            .field("workers", &self.process.size)
            .field("replicas", &self.replicas)
            .field("same_kernels", &self.same_kernels)
            .finish()
    }
}

impl MpiWorld {
    fn size(&self) -> usize {
        self.process.size
    }

    fn all_reduce_u64(&self, value: u64, op: SystemOperation) -> u64 {
        let mut out = 0u64;
        with_world(self.process, |w| w.all_reduce_into(&value, &mut out, op));
        out
    }

    /// The vote before every collective that carries data: each worker says whether its part
    /// went well, what the collective is for (a hash of `request`) and how many values it
    /// will carry (`len`), in one fixed-size all-gather. So a collective only ever pairs with
    /// the same collective on every worker: workers whose control flow went apart (a worker
    /// with one step more, a model of another shape) fail here, all of them alike, instead of
    /// pairing a vote with a gradient sum and hanging or aborting in MPI.
    ///
    /// A failed worker's error comes first (the lowest one tells everyone why); then a worker
    /// that is elsewhere, or at the same collective with another length, against the chief.
    fn vote(
        &self,
        request: &str,
        local: std::result::Result<(), &Error>,
        len: usize,
    ) -> Result<()> {
        let size = self.size();
        let mine = [
            u64::from(local.is_err()),
            fnv1a(request.bytes()),
            len as u64,
        ];
        let mut all = vec![0u64; 3 * size];
        with_world(self.process, |w| w.all_gather_into(&mine[..], &mut all[..]));
        let worker = |r: usize| &all[3 * r..3 * r + 3];
        let failed: Vec<usize> = (0..size).filter(|&r| worker(r)[0] != 0).collect();
        if let Some(&first) = failed.first() {
            return Err(self.failure(request, local, &failed, first));
        }
        let chief = worker(0);
        let apart: Vec<usize> = (1..size)
            .filter(|&r| worker(r)[1..] != chief[1..])
            .collect();
        let Some(&first) = apart.first() else {
            return Ok(());
        };
        let what = |r: usize| match worker(r)[1] == chief[1] {
            true => format!("the same collective with {} values", worker(r)[2]),
            false => "another collective".to_string(),
        };
        let others: Vec<String> = apart.iter().map(|&r| format!("{r}: {}", what(r))).collect();
        Err(Error::Distributed {
            rank: first,
            workers: size,
            request: request.into(),
            cause: format!(
                "the workers are out of step: worker 0 is at this collective with {} values, \
                 worker(s) {} — their data or models differ (a shard with more steps, a \
                 model of another shape)",
                chief[2],
                others.join("; ")
            ),
        })
    }

    /// [`Error::Distributed`] for the failed workers (`first` the lowest): it broadcasts its
    /// message to the others.
    fn failure(
        &self,
        request: &str,
        local: std::result::Result<(), &Error>,
        failed: &[usize],
        first: usize,
    ) -> Error {
        // The lowest failed worker tells everyone why: its message's length, then the bytes.
        let mut message = match (&local, first == self.rank()) {
            (Err(e), true) => e.to_string().into_bytes(),
            _ => Vec::new(),
        };
        let mut len = message.len() as u64;
        with_world(self.process, |w| {
            let root = w.process_at_rank(first as i32);
            root.broadcast_into(&mut len);
            message.resize(usize::try_from(len).unwrap_or(0), 0);
            root.broadcast_into(&mut message[..]);
        });
        let mut cause = String::from_utf8_lossy(&message).into_owned();
        if failed.len() > 1 {
            let others: Vec<String> = failed[1..].iter().map(usize::to_string).collect();
            cause.push_str(&format!(" (worker(s) {} failed too)", others.join(", ")));
        }
        Error::Distributed {
            rank: first,
            workers: self.size(),
            request: request.into(),
            cause,
        }
    }
}

impl Workers for MpiWorld {
    fn rank(&self) -> usize {
        self.process.rank
    }

    fn replicas(&self) -> &[usize] {
        &self.replicas
    }

    fn same_kernels(&self) -> bool {
        self.same_kernels
    }

    fn agree(
        &self,
        request: &str,
        local: std::result::Result<(), &Error>,
        sums: &mut [f64],
    ) -> Result<()> {
        self.vote(request, local, sums.len())?;
        if !sums.is_empty() {
            let send = sums.to_vec();
            with_world(self.process, |w| {
                w.all_reduce_into(&send[..], sums, SystemOperation::sum())
            });
        }
        Ok(())
    }

    fn cross_device_ops(
        self: Arc<Self>,
        local: Arc<dyn CrossDeviceOps>,
    ) -> Arc<dyn CrossDeviceOps> {
        Arc::new(MpiAllReduce { world: self, local })
    }

    fn broadcast(&self, request: &str, words: &mut [u32]) -> Result<()> {
        self.vote(request, Ok(()), words.len())?;
        with_world(self.process, |w| w.process_at_rank(0).broadcast_into(words));
        Ok(())
    }

    fn abort(&self, cause: &str) -> ! {
        abort_job(self.rank(), cause)
    }
}

/// The [`CrossDeviceOps`] of a [`MultiWorkerMirroredStrategy`]: a sum over every replica of
/// every worker, in three levels — the local replicas through [`HierarchicalAllReduce`] onto
/// the first destination, one `MPI_Allreduce` of the packed `f32` sum from this thread, then
/// the result back to every local destination. Before the `MPI_Allreduce` the workers vote
/// on their local reductions, so a worker that failed (out of memory, say) fails the sum on
/// every worker with [`Error::Distributed`] instead of leaving them waiting.
///
/// The strategy makes it; [`MultiWorkerMirroredStrategy::mirrored`] hands it out as
/// `cross_device_ops()`.
///
/// ```no_run
/// // mpirun -n 2 target/debug/examples/...
/// use anygpu::distribute::{CrossDeviceOps, MultiWorkerMirroredStrategy};
/// use anygpu::Tensor;
/// let strategy = MultiWorkerMirroredStrategy::new()?;
/// let devices = strategy.mirrored().devices().to_vec();
/// let ones = Tensor::from_slice_on(&[1.0f32; 4], &[4], &devices[0])?;
/// let sums = strategy.mirrored().cross_device_ops().reduce_sum(&[ones], &devices[..1])?;
/// // One replica per worker: the sum is the number of workers.
/// assert_eq!(sums[0].to_vec::<f32>()?[0], strategy.num_workers() as f32);
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Clone)]
pub struct MpiAllReduce {
    world: Arc<MpiWorld>,
    /// The sum within this worker: [`HierarchicalAllReduce`] unless
    /// [`MirroredStrategy::with_cross_device_ops`] replaced it.
    local: Arc<dyn CrossDeviceOps>,
}

impl fmt::Debug for MpiAllReduce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MpiAllReduce")
            .field("world", &self.world)
            .field("local", &self.local)
            .finish()
    }
}

impl CrossDeviceOps for MpiAllReduce {
    fn reduce_sum(&self, values: &[Tensor], destinations: &[LogicalDevice]) -> Result<Vec<Tensor>> {
        let start = Instant::now();
        let first = destinations.first().ok_or_else(|| {
            Error::InvalidArgument("reduce_sum: no destination for the sum".into())
        })?;
        let local = self
            .local
            .reduce_sum(values, std::slice::from_ref(first))
            .and_then(|sums| sums[0].to_vec::<f32>());
        // The length of the sum to come is in the vote: every worker's model has the same
        // gradient size, or none goes on.
        let len = values.first().map_or(0, Tensor::len);
        self.world.vote(
            "training step (local reduction)",
            local.as_ref().map(drop),
            len,
        )?;
        let send = local?;
        let mut sum = vec![0.0f32; send.len()];
        let mpi_start = Instant::now();
        with_world(self.world.process, |w| {
            w.all_reduce_into(&send[..], &mut sum[..], SystemOperation::sum())
        });
        let mpi = mpi_start.elapsed();
        let on_first = Tensor::from_slice_on(&sum, values[0].shape(), first)?;
        let out = self.local.reduce_sum(&[on_first], destinations);
        let mut times = self
            .world
            .times
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        times.calls += 1;
        times.mpi += mpi;
        times.total += start.elapsed();
        out
    }

    /// Local only: every worker broadcasts among its own replicas.
    fn broadcast_into(&self, value: &Tensor, destinations: &[Tensor]) -> Result<()> {
        self.local.broadcast_into(value, destinations)
    }
}

/// Synchronous data parallelism over several processes (TensorFlow's
/// `tf.distribute.MultiWorkerMirroredStrategy`), on MPI. Feature `mpi`.
///
/// Each process started by `mpirun -n N` (or a hostfile, or Slurm's `srun`) is a *worker*;
/// MPI's rank is its index, and worker 0 is the *chief*. Inside a worker the strategy mirrors
/// over the worker's local devices like a [`MirroredStrategy`]. A model created in
/// [`scope`](MultiWorkerMirroredStrategy::scope) takes the chief's weights, so every worker
/// starts identical. Each training step cuts the *global* batch — the dataset's batch size, as
/// in TensorFlow — among the replicas of all workers in rank order (every worker reads the same
/// dataset and keeps its shard: TF's auto-shard by data), sums the gradients over all of them
/// ([`MpiAllReduce`]) and applies the same update everywhere; after every step every worker's
/// parameters are bit-identical. When workers run different kernels (one on a GPU, one on the
/// CPU) the chief updates and sends its weights and optimizer slots to the others.
///
/// Only the chief prints progress and writes files in `fit` (`ModelCheckpoint`, `CsvLogger`,
/// `BackupAndRestore`, `TensorBoard`); the loss and accuracy `fit` reports are the global
/// batch's on every worker. `evaluate` and `predict` run locally over the whole data on every
/// worker.
///
/// A worker that fails inside a step (out of memory, a device error, a panic in a replica's
/// forward or backward pass, with one local replica or several) fails that step on every
/// worker, within the step, with the same [`Error::Distributed`] naming the failed worker and
/// its cause, and no worker updates. In `fit`, an error only some workers see outside a step
/// (a batch that cannot be read, a callback such as the chief's file writers, validation, a
/// restore) is voted on too, so `fit` returns the same error on every worker. A panic
/// elsewhere, or a device lost halfway through an update, aborts the whole job (`MPI_Abort`):
/// the last resort, since that worker's parameters may then differ. End `main` with
/// [`exit_on_error`](MultiWorkerMirroredStrategy::exit_on_error): `MPI_Finalize` at exit
/// waits for every worker, so a worker that returned an error of its own would wait there
/// forever while the others wait for it.
///
/// ```no_run
/// // mpirun -n 2 target/release/examples/fashion_mnist --strategy multi-worker
/// use anygpu::distribute::MultiWorkerMirroredStrategy;
/// use anygpu::nn::{self, Adam, Loss, Metric};
///
/// let strategy = MultiWorkerMirroredStrategy::new()?;
/// println!("worker {} of {}", strategy.worker_index(), strategy.num_workers());
/// let mut model = strategy.scope(|| -> anygpu::Result<_> {
///     let mut model = nn::tutorial_cnn(0, &[])?;
///     model.compile(Loss::sparse_categorical_crossentropy(), Adam::default(), &[Metric::Accuracy])?;
///     Ok(model)
/// })??;
/// // Global batch 128: 64 examples per worker with one device each.
/// assert_eq!(strategy.worker_batch_size(128), 128 / strategy.num_workers());
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct MultiWorkerMirroredStrategy {
    local: MirroredStrategy,
    world: Arc<MpiWorld>,
}

impl MultiWorkerMirroredStrategy {
    /// A worker over the local devices [`MirroredStrategy::new`] picks (every visible logical
    /// GPU, else the CPU), in the job MPI started; `TF_CONFIG` is checked when set
    /// ([`with_tf_config`](MultiWorkerMirroredStrategy::with_tf_config)).
    ///
    /// A collective: every worker must call it.
    ///
    /// # Errors
    /// As [`with_tf_config`](MultiWorkerMirroredStrategy::with_tf_config).
    pub fn new() -> Result<MultiWorkerMirroredStrategy> {
        let devices = MirroredStrategy::new().map(|s| s.devices().to_vec());
        Self::start(devices, std::env::var("TF_CONFIG").ok().as_deref())
    }

    /// A worker over `devices`; `TF_CONFIG` is checked when set.
    ///
    /// # Errors
    /// As [`with_tf_config`](MultiWorkerMirroredStrategy::with_tf_config).
    pub fn with_devices(devices: &[LogicalDevice]) -> Result<MultiWorkerMirroredStrategy> {
        Self::start(
            Ok(devices.to_vec()),
            std::env::var("TF_CONFIG").ok().as_deref(),
        )
    }

    /// A worker over `devices`, with `tf_config` in place of the `TF_CONFIG` variable (`None`:
    /// MPI's world alone decides). For parity with TensorFlow, a `TF_CONFIG` such as
    /// `{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker",
    /// "index": 1}}` must describe the job MPI started: as many workers (a `chief` entry
    /// counts as worker 0, then the `worker` list), and this task's index as this process's
    /// rank. Addresses are not used: MPI connects the workers.
    ///
    /// A collective: every worker must call it, and all fail alike when one's devices or
    /// `TF_CONFIG` are wrong.
    ///
    /// ```no_run
    /// use anygpu::distribute::MultiWorkerMirroredStrategy;
    /// let cpu = anygpu::Runtime::builder().build()?.cpu()?;
    /// // Under `mpirun -n 2`: TF_CONFIG names 3 workers, MPI started 2.
    /// let tf_config = r#"{"cluster": {"worker": ["a:1", "b:1", "c:1"]},
    ///                     "task": {"type": "worker", "index": 0}}"#;
    /// let err = MultiWorkerMirroredStrategy::with_tf_config(&[cpu], Some(tf_config)).unwrap_err();
    /// assert!(err.to_string().contains("TF_CONFIG lists 3 workers but MPI started 2"));
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Distributed`] on every worker, naming the lowest worker whose devices are not
    /// a valid [`MirroredStrategy`] or whose `TF_CONFIG` disagrees with MPI (or does not
    /// parse), and why; MPI that cannot be initialized.
    pub fn with_tf_config(
        devices: &[LogicalDevice],
        tf_config: Option<&str>,
    ) -> Result<MultiWorkerMirroredStrategy> {
        Self::start(Ok(devices.to_vec()), tf_config)
    }

    fn start(
        devices: Result<Vec<LogicalDevice>>,
        tf_config: Option<&str>,
    ) -> Result<MultiWorkerMirroredStrategy> {
        let process = process()?;
        let (rank, size) = (process.rank, process.size);
        let local = tf_config
            .map_or(Ok(()), |text| check_tf_config(text, rank, size))
            .and(devices)
            .and_then(|d| MirroredStrategy::with_devices(&d));
        let mut probe = MpiWorld {
            process,
            replicas: Vec::new(),
            same_kernels: true,
            times: Mutex::default(),
        };
        probe.agree(
            "starting MultiWorkerMirroredStrategy",
            local.as_ref().map(drop),
            &mut [],
        )?;
        let local = local?;
        let mine = local.num_replicas_in_sync() as u64;
        let mut replicas = vec![0u64; size];
        with_world(process, |w| w.all_gather_into(&mine, &mut replicas[..]));
        probe.replicas = replicas.into_iter().map(|n| n as usize).collect();
        // Workers whose devices report the same adapters (or all CPUs) run the same kernels.
        // FNV-1a, not `DefaultHasher`: workers may be built apart, and std's hasher may differ.
        let adapters: String = local
            .devices()
            .iter()
            .map(|d| format!("{:?};", d.adapter_info()))
            .collect();
        let kernels = fnv1a(adapters.into_bytes());
        let low = probe.all_reduce_u64(kernels, SystemOperation::min());
        let high = probe.all_reduce_u64(kernels, SystemOperation::max());
        probe.same_kernels = low == high;
        let world = Arc::new(probe);
        log::info!(
            "Using MultiWorkerMirroredStrategy: worker {rank} of {size}, local devices {:?}, \
             {} replicas in sync",
            local.devices().iter().map(|d| d.name()).collect::<Vec<_>>(),
            world.replicas.iter().sum::<usize>()
        );
        let local = local.with_workers(world.clone());
        Ok(MultiWorkerMirroredStrategy { local, world })
    }

    /// This worker's index, MPI's rank (`strategy.cluster_resolver.task_id`).
    pub fn worker_index(&self) -> usize {
        self.world.rank()
    }

    /// The number of workers, MPI's world size.
    pub fn num_workers(&self) -> usize {
        self.world.size()
    }

    /// Whether this is worker 0, the one that prints and writes files.
    pub fn is_chief(&self) -> bool {
        self.worker_index() == 0
    }

    /// Replicas in all workers together (`strategy.num_replicas_in_sync`).
    pub fn num_replicas_in_sync(&self) -> usize {
        self.world.replicas.iter().sum()
    }

    /// The strategy over this worker's own devices, which knows the other workers: what a
    /// model created in the scope reports as its [`Sequential::strategy`](crate::nn::Sequential::strategy).
    pub fn mirrored(&self) -> &MirroredStrategy {
        &self.local
    }

    /// This worker's local devices, the primary first.
    pub fn local_devices(&self) -> &[LogicalDevice] {
        self.local.devices()
    }

    /// How many examples of a global batch of `global` this worker takes: the batch is cut
    /// among all replicas of all workers in rank order, one example more for the first
    /// `global % replicas`.
    pub fn worker_batch_size(&self, global: usize) -> usize {
        worker_rows(global, &self.world.replicas, self.worker_index())
            .1
            .iter()
            .sum()
    }

    /// Runs `f` in the strategy's scope: a [`Sequential`](crate::nn::Sequential) created there is mirrored on the
    /// local devices and starts from the chief's weights.
    ///
    /// # Errors
    /// As [`MirroredStrategy::scope`].
    pub fn scope<R>(&self, f: impl FnOnce() -> R) -> Result<R> {
        self.local.scope(f)
    }

    /// Enters the scope until the guard is dropped.
    ///
    /// # Errors
    /// As [`MirroredStrategy::enter`].
    pub fn enter(&self) -> Result<StrategyScope> {
        self.local.enter()
    }

    /// A collective check that every worker's `local` result is `Ok` (say, each worker loaded
    /// its data): `Ok` on every worker, or on every worker the same [`Error::Distributed`]
    /// naming the lowest failed worker, `request` and the cause. Lets a job stop together on
    /// an error that only some workers see, instead of some waiting for the others.
    ///
    /// ```no_run
    /// # use anygpu::distribute::MultiWorkerMirroredStrategy;
    /// let strategy = MultiWorkerMirroredStrategy::new()?;
    /// // Every worker loads its data; if one cannot, all stop here with its error.
    /// let data = strategy.agree("loading Fashion-MNIST", anygpu::data::fashion_mnist::load());
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Distributed`] when `local` or another worker's result is an error.
    pub fn agree<T>(&self, request: &str, local: Result<T>) -> Result<T> {
        self.world
            .agree(request, local.as_ref().map(drop), &mut [])?;
        local
    }

    /// Whether every worker's `local` checksum is the same, compared through an MPI min and
    /// max reduction (`nn` hashes a model's weights with it); `None` is a worker that already
    /// knows it differs, which makes the answer `false` everywhere. A collective.
    ///
    /// # Errors
    /// `local` or another worker's is an error; then on every worker alike.
    pub(crate) fn checksums_agree(
        &self,
        request: &str,
        local: Result<Option<u64>>,
    ) -> Result<bool> {
        let sum = self.agree(request, local)?;
        // A worker out of step takes part as the lowest and the highest checksum at once.
        let low = self
            .world
            .all_reduce_u64(sum.unwrap_or(0), SystemOperation::min());
        let high = self
            .world
            .all_reduce_u64(sum.unwrap_or(u64::MAX), SystemOperation::max());
        Ok(sum.is_some() && low == high)
    }

    /// Time spent summing gradients between workers so far.
    pub fn all_reduce_times(&self) -> AllReduceTimes {
        *self
            .world
            .times
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The end of a worker's `main`: `result`'s value, or else exit with its error without
    /// leaving the other workers waiting. `MPI_Finalize`, which runs at exit, waits for every
    /// worker; so an error every worker has ([`Error::Distributed`], from a training step,
    /// [`agree`](MultiWorkerMirroredStrategy::agree) or `fit`'s callbacks) exits normally with
    /// status 1, while an error only this worker may have aborts the whole job
    /// (`MPI_Abort`) instead of blocking in `MPI_Finalize` while the others block in their
    /// next collective. Before MPI starts, the error is printed and the process exits with 1.
    ///
    /// ```no_run
    /// use anygpu::distribute::MultiWorkerMirroredStrategy;
    /// fn run() -> anygpu::Result<()> {
    ///     let strategy = MultiWorkerMirroredStrategy::new()?;
    ///     // ... build, fit ...
    ///     Ok(())
    /// }
    /// MultiWorkerMirroredStrategy::exit_on_error(run());
    /// ```
    pub fn exit_on_error<T, E: Into<Box<dyn std::error::Error>>>(
        result: std::result::Result<T, E>,
    ) -> T {
        let error = match result {
            Ok(value) => return value,
            Err(e) => e.into(),
        };
        let Some(Ok(process)) = PROCESS.get() else {
            eprintln!("error: {error}");
            std::process::exit(1);
        };
        if let Some(Error::Distributed { .. }) = error.downcast_ref::<Error>() {
            eprintln!("[worker {}] error: {error}", process.rank);
            std::process::exit(1);
        }
        abort_job(process.rank, &format!("error: {error}"))
    }

    /// Prints `cause` as this worker's and aborts every worker (`MPI_Abort`): for an error
    /// only this worker has, where the others may be waiting for it in a collective (an
    /// error that [`agree`](MultiWorkerMirroredStrategy::agree) or a training step returned is
    /// every worker's, and needs no abort).
    pub fn abort(&self, cause: &dyn fmt::Display) -> ! {
        abort_job(self.worker_index(), &format!("error: {cause}"))
    }
}
