//! The runtime: configuration while it is mutable, then the frozen set of logical devices.
//!
//! One implementation serves both ways in: [`crate::config`] forwards to a process-wide
//! [`Runtime`], and [`Runtime::builder`] makes independent ones (tests, libraries).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

use crate::device::logical::Owner;
use crate::device::LogicalDevice;

mod builder;
mod configuration;
mod discovery;
mod init;
mod lookup;
pub use builder::RuntimeBuilder;
pub use configuration::{LogicalDeviceConfiguration, DEFAULT_GPU_MEMORY_LIMIT_MB};
use discovery::Discovery;
pub use discovery::KindFilter;

/// An op's placement, as the placement callback receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementRecord {
    /// TF's op name (`MatMul`, `AddN`, `Conv2D`, ...).
    pub op: &'static str,
    /// Full name of the device the op ran on.
    pub device: String,
    /// `(stage, micro-batch)` when the op ran in a pipelined training step
    /// ([`Pipeline`](crate::nn::Pipeline)), both counted from 0.
    pub pipeline: Option<(usize, usize)>,
}

type PlacementCallback = Arc<dyn Fn(&PlacementRecord) + Send + Sync>;

/// A set of devices and their configuration: TensorFlow's eager context.
///
/// Configure it (visibility, memory growth, virtual devices), then use it: the first call that
/// needs devices initializes it and freezes the configuration.
///
/// ```
/// use anygpu::{Runtime, Tensor};
/// let rt = Runtime::builder().build()?;
/// let gpus = rt.list_logical_devices("GPU")?;
/// let on = gpus.first().cloned().unwrap_or(rt.cpu()?);
/// let a = Tensor::from_slice_on(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &on)?;
/// assert_eq!(a.matmul(&a)?.to_vec::<f32>()?, [7.0, 10.0, 15.0, 22.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Clone)]
pub struct Runtime {
    pub(crate) shared: Arc<RuntimeShared>,
}

pub(crate) struct RuntimeShared {
    env: HashMap<String, Option<String>>,
    discovery: OnceLock<Discovery>,
    config: Mutex<Config>,
    devices: OnceLock<Devices>,
    log_placement: AtomicBool,
    soft_placement: AtomicBool,
    placement_callback: RwLock<Option<PlacementCallback>>,
    warned_fallbacks: Mutex<HashSet<(&'static str, String)>>,
    /// Times the devices were created (see [`Runtime::initialization_count`]).
    initializations: AtomicUsize,
    /// Physical GPU index -> cause: adapters that fail to open, for tests of one bad adapter.
    injected_failures: HashMap<usize, String>,
    /// Software adapters count as GPUs for default and soft placement
    /// (`ANYGPU_SOFTWARE_ADAPTERS_AS_GPUS`), read once.
    software_as_gpus: bool,
}

/// The runtime behind a device's [`Owner`], while it lives.
pub(crate) fn owner_runtime(owner: &Owner) -> Option<Arc<RuntimeShared>> {
    owner.upgrade()?.downcast::<RuntimeShared>().ok()
}

impl LogicalDevice {
    /// The runtime that created this device, while it lives.
    pub(crate) fn runtime(&self) -> Option<Arc<RuntimeShared>> {
        owner_runtime(&self.0.owner)
    }
}

#[derive(Clone, Debug, Default)]
struct Config {
    /// Visible physical GPU indices, in list order; `None` = all.
    visible_gpus: Option<Vec<usize>>,
    growth: HashMap<usize, bool>,
    virtual_gpus: HashMap<usize, Vec<LogicalDeviceConfiguration>>,
    virtual_cpus: Option<Vec<LogicalDeviceConfiguration>>,
    /// `tf.config.threading`: threads within an op (0: the system picks) ...
    intra_op_threads: usize,
    /// ... and between ops (0: the system picks; recorded, see the setter).
    inter_op_threads: usize,
}

pub(crate) struct Devices {
    pub(crate) cpus: Vec<LogicalDevice>,
    pub(crate) gpus: Vec<LogicalDevice>,
}

impl Devices {
    fn all(&self) -> impl Iterator<Item = &LogicalDevice> {
        self.cpus.iter().chain(self.gpus.iter())
    }
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("initialized", &self.is_initialized())
            .finish_non_exhaustive()
    }
}

impl Default for Runtime {
    fn default() -> Self {
        Runtime::new()
    }
}

impl Runtime {
    /// A runtime that reads its environment variables from the process, not yet initialized.
    pub fn new() -> Runtime {
        Runtime::with_env(HashMap::new(), HashMap::new())
    }

    fn with_env(
        env: HashMap<String, Option<String>>,
        injected_failures: HashMap<usize, String>,
    ) -> Runtime {
        let software_as_gpus =
            software_adapters_as_gpus(env_lookup(&env, SOFTWARE_AS_GPUS).as_deref());
        Runtime {
            shared: Arc::new(RuntimeShared {
                env,
                discovery: OnceLock::new(),
                config: Mutex::new(Config::default()),
                devices: OnceLock::new(),
                log_placement: AtomicBool::new(false),
                soft_placement: AtomicBool::new(true),
                placement_callback: RwLock::new(None),
                warned_fallbacks: Mutex::new(HashSet::new()),
                initializations: AtomicUsize::new(0),
                injected_failures,
                software_as_gpus,
            }),
        }
    }

    /// A builder for a configured, initialized runtime.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    pub(crate) fn from_shared(shared: Arc<RuntimeShared>) -> Runtime {
        Runtime { shared }
    }

    fn config(&self) -> MutexGuard<'_, Config> {
        // Config holds plain values, each updated in one assignment: never torn by a panic.
        self.shared.config.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn env(&self, key: &str) -> Option<String> {
        self.shared.env_var(key)
    }
}

/// `key` from a runtime's overrides (`None` there = unset), else from the process environment.
fn env_lookup(overrides: &HashMap<String, Option<String>>, key: &str) -> Option<String> {
    match overrides.get(key) {
        Some(value) => value.clone(),
        None => std::env::var(key).ok(),
    }
}

/// The switch that makes software adapters count as GPUs for placement.
const SOFTWARE_AS_GPUS: &str = "ANYGPU_SOFTWARE_ADAPTERS_AS_GPUS";

/// `ANYGPU_SOFTWARE_ADAPTERS_AS_GPUS`: `1`/`true` on, unset, empty, `0`/`false` off; anything
/// else is off with a warning.
fn software_adapters_as_gpus(value: Option<&str>) -> bool {
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        Some("1" | "true") => true,
        None | Some("" | "0" | "false") => false,
        Some(other) => {
            log::warn!("{SOFTWARE_AS_GPUS}={other:?} ignored: use 1 or 0");
            false
        }
    }
}

impl RuntimeShared {
    pub(crate) fn env_var(&self, key: &str) -> Option<String> {
        env_lookup(&self.env, key)
    }

    pub(crate) fn soft_placement(&self) -> bool {
        self.soft_placement.load(Ordering::Relaxed)
    }

    pub(crate) fn available_names(&self) -> String {
        self.devices
            .get()
            .map(|d| {
                d.all()
                    .map(|d| d.full_name().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    }

    /// Logs an op's placement when placement logging is on; `pipeline` is the thread's
    /// `(stage, micro-batch)` inside a pipelined step (`placement::pipeline_position`, passed in
    /// so that the runtime never imports the placement above it).
    pub(crate) fn log_placement(
        &self,
        op: &'static str,
        device: &LogicalDevice,
        pipeline: Option<(usize, usize)>,
    ) {
        if !self.log_placement.load(Ordering::Relaxed) {
            return;
        }
        let line = match pipeline {
            Some((stage, micro)) => format!(
                "Executing op {op} in device {} (pipeline stage {stage}, micro-batch {micro})",
                device.full_name()
            ),
            None => format!("Executing op {op} in device {}", device.full_name()),
        };
        eprintln!("{line}");
        log::info!(target: "anygpu::placement", "{line}");
        let callback = self
            .placement_callback
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(callback) = callback {
            callback(&PlacementRecord {
                op,
                device: device.full_name().to_string(),
                pipeline,
            });
        }
    }

    /// Warns once per op and requested device that soft placement moved it.
    pub(crate) fn warn_fallback(&self, op: &'static str, requested: &str, actual: &str, why: &str) {
        let mut warned = self
            .warned_fallbacks
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if warned.insert((op, requested.to_string())) {
            log::warn!(
                "{op} cannot run on {requested} ({why}); soft placement runs it on {actual}"
            );
        }
    }
}
