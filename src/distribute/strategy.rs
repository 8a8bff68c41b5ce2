//! `tf.distribute.MirroredStrategy`: the replica devices, the strategy scope, and how a global
//! batch is cut among the replicas.

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::device::LogicalDevice;
use crate::distribute::cross_device::{CrossDeviceOps, HierarchicalAllReduce};
use crate::distribute::Workers;
use crate::error::{Error, Result};
use crate::runtime::Runtime;

thread_local! {
    /// The strategies whose scope this thread is in, innermost last.
    static CURRENT: RefCell<Vec<MirroredStrategy>> = const { RefCell::new(Vec::new()) };
}

/// Synchronous data parallelism over several logical devices (TensorFlow's
/// `tf.distribute.MirroredStrategy`).
///
/// A model created inside [`scope`](MirroredStrategy::scope) is *mirrored*: every replica
/// device holds a copy of each weight and optimizer slot, identical at creation. Each training
/// step cuts the global batch among the replicas (the first `batch % replicas` get one example
/// more), runs forward and backward on all of them at once — one thread per replica, so
/// replicas on different adapters really compute concurrently — sums the gradients across
/// replicas with the [`CrossDeviceOps`] (into the mean over the global batch) and applies the
/// same update on every replica. After every step the replicas' weights are bit-identical.
///
/// Any logical devices can be replicas: GPUs of different vendors, software adapters, virtual
/// GPUs cut from one adapter, the CPU. Virtual siblings share their adapter's queue, so they
/// add no compute: two virtual GPUs on one adapter train no faster than one, they only split
/// its memory.
///
/// ```
/// use anygpu::distribute::MirroredStrategy;
/// use anygpu::nn::{self, Adam, Loss, Metric, Verbosity};
/// use anygpu::{data::Dataset, Runtime};
///
/// let rt = Runtime::builder().virtual_cpus(2).build()?;
/// let strategy = MirroredStrategy::with_devices(&rt.list_logical_devices("CPU")?)?;
/// assert_eq!(strategy.num_replicas_in_sync(), 2);
/// let mut model = strategy.scope(|| -> anygpu::Result<_> {
///     let mut model = nn::tutorial_cnn(0, &[])?;
///     model.compile(Loss::sparse_categorical_crossentropy(), Adam::default(), &[Metric::Accuracy])?;
///     Ok(model)
/// })??;
/// model.set_verbose(Verbosity::Silent);
/// // A global batch of 5: 3 examples on CPU:0, 2 on CPU:1.
/// assert_eq!(strategy.replica_batch_sizes(5), [3, 2]);
/// let data = Dataset::from_tensor_slices(vec![0.5f32; 5 * 784], &[28, 28, 1], vec![0, 1, 2, 3, 4])?;
/// model.fit(&data.batch(5, false), 1, None, None)?;
/// assert_eq!(model.replica_weights(1)?, model.get_weights()?);
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Clone)]
pub struct MirroredStrategy(Arc<Inner>);

struct Inner {
    devices: Vec<LogicalDevice>,
    cross_device_ops: Arc<dyn CrossDeviceOps>,
    /// The other processes of a multi-worker job; `None` for a single process.
    workers: Option<Arc<dyn Workers>>,
}

impl fmt::Debug for MirroredStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MirroredStrategy")
            .field("devices", &self.0.devices)
            .field("cross_device_ops", &self.0.cross_device_ops)
            .field("workers", &self.0.workers)
            .finish()
    }
}

/// Two handles are equal when they are clones of one strategy (the same replicas alone do not
/// make two strategies equal, as in TensorFlow).
impl PartialEq for MirroredStrategy {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for MirroredStrategy {}

/// `('/job:localhost/replica:0/task:0/device:GPU:0', ...)`, as TensorFlow prints device tuples.
fn device_tuple(devices: &[LogicalDevice]) -> String {
    let names: Vec<String> = devices
        .iter()
        .map(|d| format!("'{}'", d.full_name()))
        .collect();
    match names.len() {
        1 => format!("({},)", names[0]),
        _ => format!("({})", names.join(", ")),
    }
}

impl MirroredStrategy {
    /// Every visible logical GPU of the process-wide runtime ([`crate::config`]) as a replica
    /// — virtual GPUs count — or every logical CPU when there is none
    /// (`tf.distribute.MirroredStrategy()`, TF's `all_local_devices`). A GPU marked
    /// unavailable at initialization is left out. Software adapters count as the GPUs they are
    /// listed as, unlike for default placement: on a machine whose only GPUs are lavapipe and
    /// llvmpipe, pass `&[cpu]` to [`with_devices`](MirroredStrategy::with_devices) to train on
    /// `CPU:0`, whose kernels are faster on the same cores.
    ///
    /// # Errors
    /// The runtime's initialization errors.
    pub fn new() -> Result<MirroredStrategy> {
        MirroredStrategy::for_runtime(crate::config::runtime())
    }

    /// [`new`](MirroredStrategy::new) for an explicit runtime.
    ///
    /// ```
    /// use anygpu::distribute::MirroredStrategy;
    /// let rt = anygpu::Runtime::builder().visible_gpus(&[]).virtual_cpus(2).build()?;
    /// let strategy = MirroredStrategy::for_runtime(&rt)?;
    /// let names: Vec<&str> = strategy.devices().iter().map(|d| d.name()).collect();
    /// assert_eq!(names, ["/device:CPU:0", "/device:CPU:1"]);
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// The runtime's initialization errors.
    pub fn for_runtime(runtime: &Runtime) -> Result<MirroredStrategy> {
        let mut devices: Vec<LogicalDevice> = runtime
            .list_logical_devices("GPU")?
            .into_iter()
            .filter(LogicalDevice::is_available)
            .collect();
        if devices.is_empty() {
            devices = runtime.list_logical_devices("CPU")?;
        }
        MirroredStrategy::with_devices(&devices)
    }

    /// The given devices as replicas, in this order; the first is the *primary*, where
    /// [`crate::nn::Sequential::get_weights`] and friends read (`MirroredStrategy(devices=[...])`).
    ///
    /// ```
    /// use anygpu::distribute::MirroredStrategy;
    /// let err = MirroredStrategy::with_devices(&[]).unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     "Got an empty `devices` list. Please make sure the `devices` you pass in is not empty."
    /// );
    /// let cpu = anygpu::Runtime::builder().build()?.cpu()?;
    /// let err = MirroredStrategy::with_devices(&[cpu.clone(), cpu]).unwrap_err();
    /// assert!(err.to_string().starts_with("No duplicates allowed in `devices` argument: "));
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty list, a device listed twice (TensorFlow's
    /// messages), devices of different runtimes, or of one that was dropped.
    pub fn with_devices(devices: &[LogicalDevice]) -> Result<MirroredStrategy> {
        if devices.is_empty() {
            return Err(Error::InvalidArgument(
                "Got an empty `devices` list. Please make sure the `devices` you pass in is not \
                 empty."
                    .into(),
            ));
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].iter().any(|e| e.same_device(d)) {
                return Err(Error::InvalidArgument(format!(
                    "No duplicates allowed in `devices` argument: {}",
                    device_tuple(devices)
                )));
            }
        }
        if let Some(orphan) = devices.iter().find(|d| d.runtime().is_none()) {
            return Err(Error::InvalidArgument(format!(
                "{orphan} belongs to a runtime that was dropped; keep the Runtime alive while \
                 its devices are in use"
            )));
        }
        let runtime = devices[0].runtime();
        let same_runtime = |d: &LogicalDevice| match (d.runtime(), &runtime) {
            (Some(a), Some(b)) => Arc::ptr_eq(&a, b),
            _ => false,
        };
        if !devices.iter().all(same_runtime) {
            return Err(Error::InvalidArgument(format!(
                "the devices of a MirroredStrategy must come from one runtime: {}",
                device_tuple(devices)
            )));
        }
        log::info!(
            "Using MirroredStrategy with devices {}",
            device_tuple(devices)
        );
        Ok(MirroredStrategy(Arc::new(Inner {
            devices: devices.to_vec(),
            cross_device_ops: Arc::new(HierarchicalAllReduce),
            workers: None,
        })))
    }

    /// The devices named (`"/gpu:0"`, `"GPU:1"`, `"/cpu:0"`, ...) in the process-wide runtime
    /// (`MirroredStrategy(devices=["/gpu:0", "/gpu:1"])`).
    ///
    /// ```
    /// use anygpu::distribute::MirroredStrategy;
    /// let strategy = MirroredStrategy::with_device_names(&["/cpu:0"])?;
    /// assert_eq!(strategy.num_replicas_in_sync(), 1);
    /// assert!(MirroredStrategy::with_device_names(&["/gpu:99"]).is_err());
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// A name that matches no device; then as [`with_devices`](MirroredStrategy::with_devices).
    pub fn with_device_names(names: &[&str]) -> Result<MirroredStrategy> {
        let runtime = crate::config::runtime();
        let devices = names
            .iter()
            .map(|n| runtime.device(n))
            .collect::<Result<Vec<_>>>()?;
        MirroredStrategy::with_devices(&devices)
    }

    /// The same replicas, summing gradients with `ops` instead of the default
    /// [`HierarchicalAllReduce`] (`MirroredStrategy(cross_device_ops=...)`).
    ///
    /// On a worker of a multi-worker job (the strategy of a `MultiWorkerMirroredStrategy`),
    /// `ops` replaces the local level only: the sum still crosses the workers, so a worker
    /// never trains alone. Pass a local `CrossDeviceOps` there, not the strategy's own.
    pub fn with_cross_device_ops(self, ops: impl CrossDeviceOps + 'static) -> MirroredStrategy {
        let ops: Arc<dyn CrossDeviceOps> = Arc::new(ops);
        let cross_device_ops = match &self.0.workers {
            Some(w) => w.clone().cross_device_ops(ops),
            None => ops,
        };
        MirroredStrategy(Arc::new(Inner {
            devices: self.0.devices.clone(),
            cross_device_ops,
            workers: self.0.workers.clone(),
        }))
    }

    /// The same replicas as one worker of a multi-worker job: the gradients are summed by
    /// this strategy's `CrossDeviceOps` locally, then over every worker.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn with_workers(&self, workers: Arc<dyn Workers>) -> MirroredStrategy {
        MirroredStrategy(Arc::new(Inner {
            devices: self.0.devices.clone(),
            cross_device_ops: workers
                .clone()
                .cross_device_ops(self.0.cross_device_ops.clone()),
            workers: Some(workers),
        }))
    }

    /// The other processes, when this strategy is one worker of a multi-worker job.
    pub(crate) fn workers(&self) -> Option<&dyn Workers> {
        self.0.workers.as_deref()
    }

    /// Whether this process writes files and prints progress: always, except on the workers
    /// of a multi-worker job other than the chief (worker 0).
    pub(crate) fn is_chief(&self) -> bool {
        self.workers().is_none_or(|w| w.rank() == 0)
    }

    /// The number of replicas (`strategy.num_replicas_in_sync`).
    pub fn num_replicas_in_sync(&self) -> usize {
        self.0.devices.len()
    }

    /// The replica devices, the primary first (`strategy.extended.worker_devices`).
    pub fn devices(&self) -> &[LogicalDevice] {
        &self.0.devices
    }

    /// What sums the gradients across replicas.
    pub fn cross_device_ops(&self) -> &dyn CrossDeviceOps {
        self.0.cross_device_ops.as_ref()
    }

    /// How a global batch of `global` examples is cut: replica `i` takes `global / n` examples,
    /// one more for the first `global % n` replicas, so nothing is dropped (a replica may get
    /// none when the batch is smaller than the number of replicas).
    ///
    /// ```
    /// # use anygpu::distribute::MirroredStrategy;
    /// # let rt = anygpu::Runtime::builder().virtual_cpus(3).build()?;
    /// let strategy = MirroredStrategy::with_devices(&rt.list_logical_devices("CPU")?)?;
    /// assert_eq!(strategy.replica_batch_sizes(128), [43, 43, 42]);
    /// assert_eq!(strategy.replica_batch_sizes(2), [1, 1, 0]);
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn replica_batch_sizes(&self, global: usize) -> Vec<usize> {
        let n = self.num_replicas_in_sync();
        (0..n)
            .map(|i| global / n + usize::from(i < global % n))
            .collect()
    }

    /// Whether every replica runs the same compiled kernels — all on the CPU, or all on
    /// adapters that report the same device and driver — so that the same update from the
    /// same inputs gives the same bits everywhere. Mixed replicas may differ in the last bit
    /// (fused multiply-adds, a GPU's `sqrt` and division precision); for them the primary's
    /// updated weights are copied to the others instead.
    pub(crate) fn same_kernels(&self) -> bool {
        let first = self.0.devices[0].adapter_info();
        self.0.devices.iter().all(|d| d.adapter_info() == first)
    }

    /// Runs `f` inside the strategy's scope (`with strategy.scope():`): a
    /// [`crate::nn::Sequential`] created there is mirrored on every replica.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when this thread is already in the scope of another strategy
    /// (TensorFlow's "Mixing different tf.distribute.Strategy objects").
    pub fn scope<R>(&self, f: impl FnOnce() -> R) -> Result<R> {
        let _scope = self.enter()?;
        Ok(f())
    }

    /// Enters the scope until the guard is dropped (the RAII form of
    /// [`scope`](MirroredStrategy::scope)).
    ///
    /// ```
    /// use anygpu::distribute::{self, MirroredStrategy};
    /// let strategy = MirroredStrategy::with_device_names(&["/cpu:0"])?;
    /// {
    ///     let _scope = strategy.enter()?;
    ///     assert!(distribute::has_strategy());
    /// }
    /// assert!(!distribute::has_strategy());
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`scope`](MirroredStrategy::scope).
    pub fn enter(&self) -> Result<StrategyScope> {
        CURRENT.with(|c| {
            let mut stack = c.borrow_mut();
            if let Some(outer) = stack.last() {
                if !Arc::ptr_eq(&outer.0, &self.0) {
                    return Err(Error::InvalidArgument(format!(
                        "Mixing different tf.distribute.Strategy objects: {self:?} is not {outer:?}"
                    )));
                }
            }
            stack.push(self.clone());
            Ok(StrategyScope {
                depth: stack.len() - 1,
                _not_send: PhantomData,
            })
        })
    }
}

/// The scope of a [`MirroredStrategy`], left when dropped.
#[must_use = "the scope ends when the guard is dropped"]
pub struct StrategyScope {
    depth: usize,
    // Scopes are per thread: the guard must not cross threads.
    _not_send: PhantomData<*const ()>,
}

impl fmt::Debug for StrategyScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StrategyScope")
            .field("depth", &self.depth)
            .finish()
    }
}

impl Drop for StrategyScope {
    fn drop(&mut self) {
        CURRENT.with(|c| c.borrow_mut().truncate(self.depth));
    }
}

/// The strategy whose scope this thread is in, if any (`tf.distribute.get_strategy()`, which
/// returns a default strategy where we return `None`).
pub fn get_strategy() -> Option<MirroredStrategy> {
    CURRENT.with(|c| c.borrow().last().cloned())
}

/// Whether this thread is inside a strategy's scope (`tf.distribute.has_strategy()`).
pub fn has_strategy() -> bool {
    CURRENT.with(|c| !c.borrow().is_empty())
}
