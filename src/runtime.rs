//! The runtime: configuration while it is mutable, then the frozen set of logical devices.
//!
//! One implementation serves both ways in: [`crate::config`] forwards to a process-wide
//! [`Runtime`], and [`Runtime::builder`] makes independent ones (tests, libraries).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

use crate::device::logical::{Backend, CpuDevice, GpuContext, GpuDevice, Owner, UnavailableGpu};
use crate::device::name::{full_name, physical_name, DeviceKind, DeviceSpec};
use crate::device::physical::{order_and_dedupe, parse_visible_env, AdapterEntry};
use crate::device::{DeviceDetails, LogicalDevice, PhysicalDevice};
use crate::error::{Error, Result};
use crate::memory::{Arena, ArenaConfig, MemoryInfo, MemoryStats};
use crate::ops::gpu::tune::TuneConfig;

/// Memory budget of a GPU whose backend reports no memory size (Metal, DX12, GL), unless
/// `ANYGPU_GPU_MEMORY_LIMIT_MB` says otherwise. Modest on purpose: without memory growth the
/// whole budget is reserved at initialization, and GL drivers commit what they reserve
/// (llvmpipe: 1 GiB of host memory, about 2.5 s).
pub const DEFAULT_GPU_MEMORY_LIMIT_MB: u64 = 1024;

/// One virtual device cut from a physical one (`tf.config.LogicalDeviceConfiguration`).
///
/// ```
/// use anygpu::LogicalDeviceConfiguration;
/// let half_gig = LogicalDeviceConfiguration::new().memory_limit(512);
/// assert_eq!(half_gig.memory_limit_mib(), Some(512));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LogicalDeviceConfiguration {
    memory_limit: Option<u64>,
    threads: Option<usize>,
}

impl LogicalDeviceConfiguration {
    /// A configuration with no memory limit (valid for CPUs only).
    pub fn new() -> Self {
        Self::default()
    }

    /// Caps the logical device at `mib` MiB (TF's `memory_limit`, in MiB as in TF).
    pub fn memory_limit(mut self, mib: u64) -> Self {
        self.memory_limit = Some(mib);
        self
    }

    /// The cap in MiB, if set.
    pub fn memory_limit_mib(&self) -> Option<u64> {
        self.memory_limit
    }

    /// Runs a virtual CPU's kernels on `threads` threads of its own (CPUs only; not in
    /// TensorFlow, where every CPU device shares one pool). Two virtual CPUs of one thread each
    /// are then two devices that work at the same time, the stand-in for two GPUs on a small
    /// machine.
    ///
    /// ```
    /// use anygpu::{DeviceKind, LogicalDeviceConfiguration, Runtime};
    /// let rt = Runtime::builder().configure()?;
    /// let cpu = &rt.list_physical_devices(DeviceKind::Cpu)[0];
    /// let one = LogicalDeviceConfiguration::new().threads(1);
    /// rt.set_logical_device_configuration(cpu, &[one, one])?;
    /// let cpus = rt.list_logical_devices("CPU")?;
    /// assert_eq!(cpus[1].threads(), 1);
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = Some(threads);
        self
    }

    /// The thread count, if set.
    pub fn thread_count(&self) -> Option<usize> {
        self.threads
    }
}

/// Which devices a listing asks for: every kind, one kind, or a kind string that names none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KindFilter {
    /// Every device.
    All,
    /// Devices of one kind.
    Kind(DeviceKind),
    /// A kind string that is neither CPU nor GPU: matches nothing (TF returns an empty list).
    Unknown,
}

impl From<DeviceKind> for KindFilter {
    fn from(kind: DeviceKind) -> Self {
        KindFilter::Kind(kind)
    }
}

impl From<Option<DeviceKind>> for KindFilter {
    fn from(kind: Option<DeviceKind>) -> Self {
        kind.map_or(KindFilter::All, KindFilter::Kind)
    }
}

/// TensorFlow's device types are case-sensitive: `"GPU"` and `"CPU"` name kinds, `"gpu"` names
/// none (`tf.config.list_physical_devices("gpu")` is `[]`).
///
/// ```
/// use anygpu::{DeviceKind, KindFilter};
/// assert_eq!(KindFilter::from("GPU"), KindFilter::Kind(DeviceKind::Gpu));
/// assert_eq!(KindFilter::from("gpu"), KindFilter::Unknown);
/// ```
impl From<&str> for KindFilter {
    fn from(s: &str) -> Self {
        match s {
            "GPU" => KindFilter::Kind(DeviceKind::Gpu),
            "CPU" => KindFilter::Kind(DeviceKind::Cpu),
            _ => KindFilter::Unknown,
        }
    }
}

impl KindFilter {
    fn admits(self, kind: DeviceKind) -> bool {
        match self {
            KindFilter::All => true,
            KindFilter::Kind(k) => k == kind,
            KindFilter::Unknown => false,
        }
    }
}

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

struct Discovery {
    backends: wgpu::Backends,
    /// The physical GPU list: ordered, de-duplicated, filtered by `ANYGPU_VISIBLE_DEVICES`.
    adapters: Vec<AdapterEntry>,
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

/// Whether `adapter` can run compute shaders at all: not the no-op backend, and not a GL
/// context too old for compute (NVIDIA's EGL hands wgpu a GL 3.3 one, which would be listed
/// and then fail at device creation). Others are left out with a note in the log.
fn runs_compute(adapter: &wgpu::Adapter) -> bool {
    let info = adapter.get_info();
    let compute = adapter
        .get_downlevel_capabilities()
        .flags
        .contains(wgpu::DownlevelFlags::COMPUTE_SHADERS);
    if info.backend == wgpu::Backend::Noop || !compute {
        log::info!(
            "skipping adapter {} ({:?}): no compute shaders",
            info.name,
            info.backend
        );
        return false;
    }
    true
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

    fn discovery(&self) -> &Discovery {
        self.shared.discovery.get_or_init(|| {
            let backends = match self.env("WGPU_BACKEND") {
                Some(list) => wgpu::Backends::from_comma_list(&list),
                None => wgpu::Backends::all(),
            };
            let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
                backends,
                flags: wgpu::InstanceFlags::from_env_or_default(),
                ..wgpu::InstanceDescriptor::new_without_display_handle()
            });
            let found = pollster::block_on(instance.enumerate_adapters(backends));
            let found: Vec<AdapterEntry> = found
                .into_iter()
                .filter(runs_compute)
                .map(AdapterEntry::new)
                .collect();
            let mut adapters = order_and_dedupe(found);
            if let Some(list) = self.env("ANYGPU_VISIBLE_DEVICES") {
                let picked = parse_visible_env(&list, adapters.len());
                adapters = picked.iter().map(|&i| adapters[i].clone()).collect();
            }
            for (i, a) in adapters.iter().enumerate() {
                log::info!(
                    "found /physical_device:GPU:{i}: {} ({:?}, {:?})",
                    a.info.name,
                    a.info.backend,
                    a.info.device_type
                );
            }
            Discovery { backends, adapters }
        })
    }

    /// `tf.config.list_physical_devices`: the CPU and one entry per GPU adapter.
    ///
    /// GPUs come in a stable order: discrete, integrated, virtual, then software (CPU-type)
    /// adapters; within a type Vulkan/Metal/DX12 before GL; then by PCI bus id and name. One GPU
    /// reached through several backends is listed once. `WGPU_BACKEND` narrows the backends
    /// searched, `ANYGPU_VISIBLE_DEVICES` the GPUs (see the crate docs). Listing never
    /// initializes the runtime; an unknown kind string gives an empty list.
    pub fn list_physical_devices(&self, kind: impl Into<KindFilter>) -> Vec<PhysicalDevice> {
        let kind = kind.into();
        let mut out = Vec::new();
        if kind.admits(DeviceKind::Cpu) {
            out.push(PhysicalDevice::new(DeviceKind::Cpu, 0));
        }
        if kind.admits(DeviceKind::Gpu) {
            let n = self.discovery().adapters.len();
            out.extend((0..n).map(|i| PhysicalDevice::new(DeviceKind::Gpu, i)));
        }
        out
    }

    /// Checks that `pd` is one of ours (and of `kind`, if given).
    fn check_physical(&self, pd: &PhysicalDevice, kind: Option<DeviceKind>) -> Result<()> {
        let known = match pd.device_type() {
            DeviceKind::Cpu => pd.index() == 0,
            DeviceKind::Gpu => pd.index() < self.discovery().adapters.len(),
        };
        if !known || kind.is_some_and(|k| k != pd.device_type()) {
            return Err(Error::UnrecognizedDevice(pd.to_string()));
        }
        Ok(())
    }

    /// `tf.config.experimental.get_device_details`: what the adapter behind `pd` is and can do.
    ///
    /// # Errors
    /// `Unrecognized device` for a device not in [`Runtime::list_physical_devices`].
    pub fn get_device_details(&self, pd: &PhysicalDevice) -> Result<DeviceDetails> {
        self.check_physical(pd, None)?;
        Ok(match pd.device_type() {
            DeviceKind::Cpu => DeviceDetails {
                device_name: format!(
                    "host CPU ({} threads)",
                    std::thread::available_parallelism().map_or(1, |n| n.get())
                ),
                device_type: DeviceKind::Cpu,
                backend: "native".into(),
                gpu: None,
            },
            DeviceKind::Gpu => self.discovery().adapters[pd.index()].details(),
        })
    }

    /// The wgpu backends searched (from `WGPU_BACKEND`, all by default).
    pub fn backends(&self) -> wgpu::Backends {
        self.discovery().backends
    }

    /// `tf.config.set_visible_devices`: makes only `devices` of `kind` visible.
    ///
    /// Hidden GPUs get no logical device; visible ones are numbered from `GPU:0` in list order.
    /// `set_visible_devices(&[], DeviceKind::Gpu)` leaves only the CPU.
    ///
    /// # Errors
    /// `Unrecognized device` for a device not listed or not of `kind`; an error when the CPU
    /// would be hidden; `Visible devices cannot be modified after being initialized` once
    /// initialized (setting the value already in place is a no-op).
    pub fn set_visible_devices(&self, devices: &[PhysicalDevice], kind: DeviceKind) -> Result<()> {
        for d in devices {
            self.check_physical(d, Some(kind))?;
        }
        let mut config = self.config();
        match kind {
            DeviceKind::Cpu => {
                if devices.is_empty() {
                    return Err(Error::InvalidArgument(
                        "CPU cannot be hidden: set_visible_devices must keep /physical_device:CPU:0"
                            .into(),
                    ));
                }
                Ok(())
            }
            DeviceKind::Gpu => {
                let mut picked: Vec<usize> = devices.iter().map(PhysicalDevice::index).collect();
                picked.sort_unstable();
                picked.dedup();
                let current = config
                    .visible_gpus
                    .clone()
                    .unwrap_or_else(|| (0..self.discovery().adapters.len()).collect());
                if picked == current {
                    return Ok(());
                }
                if self.is_initialized() {
                    return Err(Error::AlreadyInitialized("Visible devices"));
                }
                config.visible_gpus = Some(picked);
                Ok(())
            }
        }
    }

    /// `tf.config.get_visible_devices`: the visible physical devices of `kind`.
    pub fn get_visible_devices(&self, kind: impl Into<KindFilter>) -> Vec<PhysicalDevice> {
        let visible = self.config().visible_gpus.clone();
        self.list_physical_devices(kind)
            .into_iter()
            .filter(|d| {
                d.device_type() == DeviceKind::Cpu
                    || visible.as_ref().is_none_or(|v| v.contains(&d.index()))
            })
            .collect()
    }

    /// `tf.config.experimental.set_memory_growth`: let `pd`'s arena grow on demand instead of
    /// reserving its whole budget at initialization.
    ///
    /// As in TensorFlow, growth is process-wide in effect: every visible GPU must agree, and
    /// any virtual-device configuration turns growth off for every GPU (the value set here is
    /// kept and still returned by [`Runtime::get_memory_growth`]).
    ///
    /// # Errors
    /// `Cannot set memory growth on device when virtual devices configured` for a device with
    /// a virtual configuration (checked first, as TF does); `Cannot set memory growth on
    /// non-GPU and non-Pluggable devices` for the CPU; `Physical devices cannot be modified
    /// after being initialized` for a change after initialization (the same value is a no-op).
    pub fn set_memory_growth(&self, pd: &PhysicalDevice, enable: bool) -> Result<()> {
        self.check_physical(pd, None)?;
        let mut config = self.config();
        let has_virtual = match pd.device_type() {
            DeviceKind::Cpu => config.virtual_cpus.is_some(),
            DeviceKind::Gpu => config.virtual_gpus.contains_key(&pd.index()),
        };
        if has_virtual {
            return Err(Error::InvalidArgument(
                "Cannot set memory growth on device when virtual devices configured".into(),
            ));
        }
        if pd.device_type() != DeviceKind::Gpu {
            return Err(Error::InvalidArgument(
                "Cannot set memory growth on non-GPU and non-Pluggable devices".into(),
            ));
        }
        if config.growth.get(&pd.index()) == Some(&enable) {
            return Ok(());
        }
        if self.is_initialized() {
            return Err(Error::AlreadyInitialized("Physical devices"));
        }
        config.growth.insert(pd.index(), enable);
        Ok(())
    }

    /// `tf.config.experimental.get_memory_growth`: the value last set, `None` until set.
    ///
    /// Like TensorFlow's, it reports the setting, not its effect: a virtual-device
    /// configuration turns growth off without changing what this returns.
    pub fn get_memory_growth(&self, pd: &PhysicalDevice) -> Result<Option<bool>> {
        self.check_physical(pd, None)?;
        Ok(self.config().growth.get(&pd.index()).copied())
    }

    /// `tf.config.set_logical_device_configuration`: cuts `pd` into one logical device per entry.
    ///
    /// A GPU entry needs a memory limit (MiB); each becomes a logical GPU with its own capped
    /// arena on the adapter's shared queue. While any GPU has virtual devices, memory growth is
    /// off for every GPU, as in TF. Several logical CPUs are allowed (without memory limits).
    /// The arguments are checked before the initialization state, as TF does.
    ///
    /// ```
    /// use anygpu::{LogicalDeviceConfiguration, Runtime};
    /// let rt = Runtime::builder().configure()?;
    /// if let Some(gpu) = rt.list_physical_devices("GPU").first() {
    ///     // 2^44 MiB is 2^64 bytes: refused instead of wrapping to a 0-byte device.
    ///     let huge = LogicalDeviceConfiguration::new().memory_limit(1 << 44);
    ///     assert!(rt.set_logical_device_configuration(gpu, &[huge]).is_err());
    /// }
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// `Setting memory limit is required for GPU virtual devices`; a memory limit on a CPU; a
    /// memory limit of 0 MiB or of more than 2^64 bytes; `Virtual devices cannot be modified
    /// after being initialized` for a change after initialization (the same value is a no-op).
    pub fn set_logical_device_configuration(
        &self,
        pd: &PhysicalDevice,
        configs: &[LogicalDeviceConfiguration],
    ) -> Result<()> {
        self.check_physical(pd, None)?;
        check_virtual_configs(pd, configs)?;
        let mut config = self.config();
        let current = match pd.device_type() {
            DeviceKind::Cpu => config.virtual_cpus.clone(),
            DeviceKind::Gpu => config.virtual_gpus.get(&pd.index()).cloned(),
        };
        if current.as_deref() == Some(configs) {
            return Ok(());
        }
        if self.is_initialized() {
            return Err(Error::AlreadyInitialized("Virtual devices"));
        }
        match pd.device_type() {
            DeviceKind::Cpu => {
                config.virtual_cpus = (!configs.is_empty()).then(|| configs.to_vec());
            }
            DeviceKind::Gpu if configs.is_empty() => {
                config.virtual_gpus.remove(&pd.index());
            }
            DeviceKind::Gpu => {
                config.virtual_gpus.insert(pd.index(), configs.to_vec());
                if config.growth.values().any(|&g| g) {
                    log::warn!(
                        "memory growth is off for every GPU: {} has virtual devices now",
                        pd.name()
                    );
                }
            }
        }
        Ok(())
    }

    /// `tf.config.get_logical_device_configuration`: `None` when none was set.
    pub fn get_logical_device_configuration(
        &self,
        pd: &PhysicalDevice,
    ) -> Result<Option<Vec<LogicalDeviceConfiguration>>> {
        self.check_physical(pd, None)?;
        let config = self.config();
        Ok(match pd.device_type() {
            DeviceKind::Cpu => config.virtual_cpus.clone(),
            DeviceKind::Gpu => config.virtual_gpus.get(&pd.index()).cloned(),
        })
    }

    /// `tf.config.threading.set_intra_op_parallelism_threads`: the threads one op may use on
    /// the CPU (0, the default: every core). Each logical CPU then runs its kernels on a pool
    /// of that many threads, unless its [`LogicalDeviceConfiguration::threads`] says otherwise.
    ///
    /// ```
    /// let rt = anygpu::Runtime::builder().configure()?;
    /// rt.set_intra_op_parallelism_threads(1)?;
    /// assert_eq!(rt.get_intra_op_parallelism_threads(), 1);
    /// assert_eq!(rt.list_logical_devices("CPU")?[0].threads(), 1);
    /// let err = rt.set_intra_op_parallelism_threads(2).unwrap_err();
    /// assert_eq!(err.to_string(), "Intra op parallelism cannot be modified after initialization.");
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// TF's `Intra op parallelism cannot be modified after initialization.` for a change after
    /// initialization (the same value is a no-op).
    pub fn set_intra_op_parallelism_threads(&self, threads: usize) -> Result<()> {
        let mut config = self.config();
        if config.intra_op_threads == threads {
            return Ok(());
        }
        if self.is_initialized() {
            return Err(Error::ThreadingInitialized("Intra op"));
        }
        config.intra_op_threads = threads;
        Ok(())
    }

    /// `tf.config.threading.get_intra_op_parallelism_threads` (0: the system picks).
    pub fn get_intra_op_parallelism_threads(&self) -> usize {
        self.config().intra_op_threads
    }

    /// `tf.config.threading.set_inter_op_parallelism_threads`: the threads for running
    /// independent ops at once (0, the default: the system picks). Recorded and reported, with
    /// TF's rules; anygpu runs each op on the thread that calls it (a mirrored step has a
    /// thread per replica), so nothing uses it yet.
    ///
    /// # Errors
    /// TF's `Inter op parallelism cannot be modified after initialization.` for a change after
    /// initialization (the same value is a no-op).
    pub fn set_inter_op_parallelism_threads(&self, threads: usize) -> Result<()> {
        let mut config = self.config();
        if config.inter_op_threads == threads {
            return Ok(());
        }
        if self.is_initialized() {
            return Err(Error::ThreadingInitialized("Inter op"));
        }
        config.inter_op_threads = threads;
        Ok(())
    }

    /// `tf.config.threading.get_inter_op_parallelism_threads` (0: the system picks).
    pub fn get_inter_op_parallelism_threads(&self) -> usize {
        self.config().inter_op_threads
    }

    /// `tf.debugging.set_log_device_placement`: print `Executing op X in device Y` for every
    /// op. May change at any time.
    pub fn set_log_device_placement(&self, enabled: bool) {
        self.shared.log_placement.store(enabled, Ordering::Relaxed);
    }

    /// Whether placement logging is on.
    pub fn get_log_device_placement(&self) -> bool {
        self.shared.log_placement.load(Ordering::Relaxed)
    }

    /// `tf.config.set_soft_device_placement`: when on (the default), an op asked for on a device
    /// that does not exist or cannot run it runs on the best device that can.
    pub fn set_soft_device_placement(&self, enabled: bool) {
        self.shared.soft_placement.store(enabled, Ordering::Relaxed);
    }

    /// Whether soft placement is on.
    pub fn get_soft_device_placement(&self) -> bool {
        self.shared.soft_placement.load(Ordering::Relaxed)
    }

    /// Calls `callback` for every op executed while placement logging is on, so tests and tools
    /// can see where ops ran without parsing stderr. `None` removes it.
    pub fn set_placement_callback(
        &self,
        callback: Option<impl Fn(&PlacementRecord) + Send + Sync + 'static>,
    ) {
        let callback = callback.map(|c| Arc::new(c) as PlacementCallback);
        *self
            .shared
            .placement_callback
            .write()
            .unwrap_or_else(|e| e.into_inner()) = callback;
    }

    /// Whether the devices exist yet (the configuration is frozen once they do).
    pub fn is_initialized(&self) -> bool {
        self.shared.devices.get().is_some()
    }

    /// Initializes now if not yet done.
    ///
    /// # Errors
    /// `Memory growth cannot differ between GPU devices`, `NoAdapter` under
    /// `ANYGPU_REQUIRE_ADAPTER=1`, or a driver failure opening an adapter.
    pub fn initialize(&self) -> Result<()> {
        self.devices().map(|_| ())
    }

    pub(crate) fn devices(&self) -> Result<&Devices> {
        if let Some(d) = self.shared.devices.get() {
            return Ok(d);
        }
        // Create and publish under the config lock: concurrent first uses create devices once,
        // and a setter either runs before (and is applied) or after (and sees the runtime
        // initialized), never in between.
        let config = self.config();
        if let Some(d) = self.shared.devices.get() {
            return Ok(d);
        }
        let devices = self.create_devices(&config)?;
        self.shared.initializations.fetch_add(1, Ordering::Relaxed);
        let devices = self.shared.devices.get_or_init(|| devices);
        drop(config);
        crate::smi::start(&self.shared, devices);
        Ok(devices)
    }

    /// How many times this runtime created its devices: 1 once initialized, whatever the
    /// number of threads that raced to first use. For tests.
    #[doc(hidden)]
    pub fn initialization_count(&self) -> usize {
        self.shared.initializations.load(Ordering::Relaxed)
    }

    fn create_devices(&self, config: &Config) -> Result<Devices> {
        let discovery = self.discovery();
        if discovery.adapters.is_empty()
            && self.env("ANYGPU_REQUIRE_ADAPTER").as_deref() == Some("1")
        {
            return Err(Error::NoAdapter {
                backends: format!("{:?}", discovery.backends),
            });
        }
        let visible: Vec<usize> = config
            .visible_gpus
            .clone()
            .unwrap_or_else(|| (0..discovery.adapters.len()).collect());
        let growth = self.effective_growth(config, &visible)?;
        let env_budget = self.env_budget()?;
        let owner = Arc::downgrade(&self.shared) as Owner;
        let cpu_configs = config
            .virtual_cpus
            .clone()
            .unwrap_or_else(|| vec![Default::default()]);
        let cpus = cpu_configs
            .iter()
            .enumerate()
            .map(|(i, c)| {
                // A thread count of its own, else the intra-op count, else the shared pool.
                let intra = (config.intra_op_threads > 0).then_some(config.intra_op_threads);
                let threads = c.threads.or(intra);
                let cpu = CpuDevice::new(&format!("CPU:{i}"), threads)?;
                Ok(LogicalDevice::new(
                    DeviceKind::Cpu,
                    i,
                    owner.clone(),
                    Backend::Cpu(cpu),
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let log_regions = self
            .env("ANYGPU_MEMORY_LOG")
            .is_some_and(|v| v != "0" && !v.is_empty());
        let mut gpus: Vec<LogicalDevice> = Vec::new();
        for (physical_index, &adapter_index) in visible.iter().enumerate() {
            let adapter = discovery.adapters[adapter_index].clone();
            let limits: Vec<(u64, bool)> = match config.virtual_gpus.get(&adapter_index) {
                Some(v) => v
                    .iter()
                    .map(|c| {
                        // Checked when it was set; refused again rather than wrapped.
                        let mib = c.memory_limit.unwrap_or(0);
                        mib_to_bytes(mib).map(|bytes| (bytes, true)).ok_or_else(|| {
                            Error::InvalidArgument(format!(
                                "memory_limit of {mib} MiB is 2^64 bytes or more"
                            ))
                        })
                    })
                    .collect::<Result<_>>()?,
                None => vec![(
                    env_budget.unwrap_or_else(|| physical_budget(&adapter)),
                    false,
                )],
            };
            let unavailable = |gpus: &mut Vec<LogicalDevice>, cause: &Error| {
                let index = gpus.len();
                log::warn!(
                    "{} ({}, {:?}) is unavailable: {cause}; every other device keeps working",
                    full_name(DeviceKind::Gpu, index),
                    adapter.info.name,
                    adapter.info.backend
                );
                gpus.push(LogicalDevice::new(
                    DeviceKind::Gpu,
                    index,
                    owner.clone(),
                    Backend::Unavailable(UnavailableGpu {
                        physical_index,
                        adapter: adapter.info.name.clone(),
                        backend: adapter.info.backend,
                        reason: cause.to_string(),
                    }),
                ));
            };
            let opened = match self.shared.injected_failures.get(&adapter_index) {
                Some(cause) => Err(Error::Gpu {
                    device: physical_name(DeviceKind::Gpu, adapter_index),
                    message: cause.clone(),
                }),
                None => {
                    let tune = TuneConfig::from_env(|key| self.env(key));
                    GpuContext::open(
                        adapter.clone(),
                        full_name(DeviceKind::Gpu, gpus.len()),
                        tune,
                    )
                }
            };
            let ctx = match opened {
                Ok(ctx) => ctx,
                Err(cause) => {
                    for _ in &limits {
                        unavailable(&mut gpus, &cause);
                    }
                    continue;
                }
            };
            for (bytes, is_virtual) in limits {
                let index = gpus.len();
                let name = full_name(DeviceKind::Gpu, index);
                let l = &ctx.adapter.limits;
                let arena = Arena::new(
                    ctx.device.clone(),
                    ArenaConfig {
                        device: name.clone(),
                        allocator: format!("GPU_{index}_bfc"),
                        limit: bytes,
                        // With virtual devices anywhere, TF allows no growth on any GPU, unless
                        // ANYGPU_FORCE_GPU_ALLOW_GROWTH=true says otherwise.
                        growth: if is_virtual {
                            growth.forced == Some(true)
                        } else {
                            growth.physical
                        },
                        max_region: l.max_storage_buffer_binding_size.min(l.max_buffer_size),
                        alignment: u64::from(l.min_storage_buffer_offset_alignment),
                        log_regions,
                        released: ctx.regions_released(),
                    },
                );
                let arena = match arena {
                    Ok(arena) => arena,
                    Err(cause) => {
                        unavailable(&mut gpus, &cause);
                        continue;
                    }
                };
                log::info!(
                    "Created device {name} with {} MB memory: -> device: {physical_index}, name: {}, backend: {:?}",
                    bytes >> 20,
                    ctx.adapter.info.name,
                    ctx.adapter.info.backend
                );
                gpus.push(LogicalDevice::new(
                    DeviceKind::Gpu,
                    index,
                    owner.clone(),
                    Backend::Gpu(GpuDevice {
                        ctx: Arc::clone(&ctx),
                        arena,
                        physical_index,
                    }),
                ));
            }
        }
        Ok(Devices { cpus, gpus })
    }

    /// The growth setting every visible GPU uses, after `ANYGPU_FORCE_GPU_ALLOW_GROWTH`.
    ///
    /// TF's `allow_growth` is one process-wide option: GPUs with a growth setting must agree,
    /// and a virtual configuration on any visible GPU turns growth off for all of them.
    fn effective_growth(&self, config: &Config, visible: &[usize]) -> Result<Growth> {
        let settings: HashSet<Option<bool>> = visible
            .iter()
            .filter(|i| !config.virtual_gpus.contains_key(i))
            .map(|i| config.growth.get(i).copied())
            .collect();
        if settings.len() > 1 {
            return Err(Error::InvalidArgument(
                "Memory growth cannot differ between GPU devices".into(),
            ));
        }
        let any_virtual = visible.iter().any(|i| config.virtual_gpus.contains_key(i));
        let configured = !any_virtual && settings.into_iter().next().flatten().unwrap_or(false);
        let forced = match self.env("ANYGPU_FORCE_GPU_ALLOW_GROWTH").as_deref() {
            None => None,
            Some(v @ ("true" | "false")) => {
                log::warn!("ANYGPU_FORCE_GPU_ALLOW_GROWTH={v} overrides the memory growth setting");
                Some(v == "true")
            }
            Some(other) => {
                log::error!(
                    "ANYGPU_FORCE_GPU_ALLOW_GROWTH='{other}' is neither 'true' nor 'false'; ignored"
                );
                None
            }
        };
        Ok(Growth {
            physical: forced.unwrap_or(configured),
            forced,
        })
    }

    /// `ANYGPU_GPU_MEMORY_LIMIT_MB` in bytes, if set to a positive number of MiB.
    ///
    /// # Errors
    /// `InvalidArgument` for a number of MiB that is 2^64 bytes or more, rather than a budget
    /// wrapped to a few bytes.
    fn env_budget(&self) -> Result<Option<u64>> {
        let Some(v) = self.env("ANYGPU_GPU_MEMORY_LIMIT_MB") else {
            return Ok(None);
        };
        match v.trim().parse::<u64>() {
            Ok(mib) if mib > 0 => mib_to_bytes(mib).map(Some).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "ANYGPU_GPU_MEMORY_LIMIT_MB={mib} is 2^64 bytes or more \
                     (at most {MAX_MEMORY_LIMIT_MIB} MiB)"
                ))
            }),
            _ => {
                log::warn!(
                    "ANYGPU_GPU_MEMORY_LIMIT_MB='{v}' is not a positive number of MiB; ignored"
                );
                Ok(None)
            }
        }
    }

    /// `tf.config.list_logical_devices`. Initializes the runtime.
    pub fn list_logical_devices(&self, kind: impl Into<KindFilter>) -> Result<Vec<LogicalDevice>> {
        let kind = kind.into();
        Ok(self
            .devices()?
            .all()
            .filter(|d| kind.admits(d.device_type()))
            .cloned()
            .collect())
    }

    /// The logical device a name denotes (`"GPU:1"`, `"/device:CPU:0"`, ...).
    ///
    /// A well-formed name of a type that does not exist here (`unknown_device:0`) matches
    /// nothing, as in TensorFlow.
    ///
    /// ```
    /// let rt = anygpu::Runtime::builder().virtual_cpus(2).build()?;
    /// assert_eq!(rt.device("cpu:1")?.name(), "/device:CPU:1");
    /// let err = rt.device("unknown_device:0").unwrap_err();
    /// assert!(err.to_string().starts_with("No matching devices found for 'unknown_device:0'"));
    /// let err = rt.device("/device:CPU:*").unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     "Multiple devices match the provided string '/device:CPU:*': \
    ///      '/job:localhost/replica:0/task:0/device:CPU:0' and \
    ///      '/job:localhost/replica:0/task:0/device:CPU:1'."
    /// );
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// `Failed parsing device name` (with TF's hint), `No matching devices found for '...'`, or
    /// `Multiple devices match the provided string` for a partial name that fits several.
    pub fn device(&self, name: &str) -> Result<LogicalDevice> {
        let spec = DeviceSpec::parse(name)?;
        let devices = self.devices()?;
        let matches: Vec<&LogicalDevice> = devices
            .all()
            .filter(|d| spec.matches(d.device_type(), d.index()))
            .collect();
        match matches.as_slice() {
            [one] => Ok((*one).clone()),
            [] => Err(Error::NoMatchingDevice {
                spec: name.to_string(),
                available: self.shared.available_names(),
            }),
            many => Err(Error::MultipleDevicesMatch {
                spec: name.to_string(),
                matches: many
                    .iter()
                    .map(|d| format!("'{}'", d.full_name()))
                    .collect::<Vec<_>>()
                    .join(" and "),
            }),
        }
    }

    /// `CPU:0`.
    pub fn cpu(&self) -> Result<LogicalDevice> {
        Ok(self.devices()?.cpus[0].clone())
    }

    /// Where ops go when nothing says otherwise: the first available logical GPU on a hardware
    /// adapter, else `CPU:0`.
    ///
    /// Software adapters (wgpu's `DeviceType::Cpu`: lavapipe, llvmpipe, WARP) are listed and
    /// usable like any GPU, but never win the default over `CPU:0`, whose native kernels are
    /// faster on the same cores: name them (a device scope, a device handle) to use them. A GPU
    /// marked unavailable (its adapter failed at initialization) is skipped too.
    ///
    /// Under [`RuntimeBuilder::software_adapters_as_gpus`] (or
    /// `ANYGPU_SOFTWARE_ADAPTERS_AS_GPUS=1`) software adapters count as GPUs here, exactly as
    /// TensorFlow counts its GPUs: the first available GPU is the default, whatever its
    /// adapter, and soft placement falls back to it first. That is TF's own rule, made
    /// testable on machines whose only GPUs are software ones (CI).
    ///
    /// ```
    /// use anygpu::{DeviceKind, Runtime};
    /// let rt = Runtime::builder().software_adapters_as_gpus(true).build()?;
    /// let default = rt.default_device()?;
    /// match rt.list_logical_devices("GPU")?.first() {
    ///     Some(gpu) if gpu.is_available() => assert_eq!(default, *gpu),
    ///     _ => assert_eq!(default.device_type(), DeviceKind::Cpu),
    /// }
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn default_device(&self) -> Result<LogicalDevice> {
        let devices = self.devices()?;
        let counts = |d: &&LogicalDevice| {
            d.is_available() && (self.shared.software_as_gpus || !d.is_software())
        };
        Ok(devices
            .gpus
            .iter()
            .find(counts)
            .unwrap_or(&devices.cpus[0])
            .clone())
    }

    /// Whether software adapters count as GPUs for default and soft placement
    /// ([`RuntimeBuilder::software_adapters_as_gpus`]).
    pub fn software_adapters_as_gpus(&self) -> bool {
        self.shared.software_as_gpus
    }

    /// The arena of the GPU logical device `name`; `cpu_message` is the error for a CPU.
    fn gpu_arena(&self, name: &str, cpu_message: &str) -> Result<Arc<Arena>> {
        let device = self.device(name)?;
        if let Some(err) = device.unavailable_error() {
            return Err(err);
        }
        match device.gpu() {
            Some(g) => Ok(Arc::clone(&g.arena)),
            None => Err(Error::InvalidArgument(format!("{cpu_message} '{name}'"))),
        }
    }

    /// `tf.config.experimental.get_memory_info`: current and peak bytes of live tensors.
    ///
    /// # Errors
    /// `Allocator stats not available for device 'CPU:0'` for the CPU; name errors as
    /// [`Runtime::device`].
    pub fn get_memory_info(&self, device: &str) -> Result<MemoryInfo> {
        let stats = self.gpu_arena(device, ALLOCATOR_STATS)?.stats();
        Ok(MemoryInfo {
            current: stats.bytes_in_use,
            peak: stats.peak_bytes_in_use,
        })
    }

    /// Every allocator figure of a GPU logical device.
    pub fn get_memory_stats(&self, device: &str) -> Result<MemoryStats> {
        Ok(self.gpu_arena(device, ALLOCATOR_STATS)?.stats().into())
    }

    /// `tf.config.experimental.reset_memory_stats`: peak back to current; allocation count and
    /// largest allocation cleared.
    ///
    /// # Errors
    /// `Cannot reset memory stats for device 'CPU:0'` for the CPU (TF's words); name errors as
    /// [`Runtime::device`].
    pub fn reset_memory_stats(&self, device: &str) -> Result<()> {
        self.gpu_arena(device, "Cannot reset memory stats for device")?
            .reset_stats();
        Ok(())
    }

    /// Sizes of a GPU logical device's arena regions, in creation order.
    pub fn memory_regions(&self, device: &str) -> Result<Vec<u64>> {
        Ok(self.gpu_arena(device, ALLOCATOR_STATS)?.region_sizes())
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

    /// Logs an op's placement when placement logging is on.
    pub(crate) fn log_placement(&self, op: &'static str, device: &LogicalDevice) {
        if !self.log_placement.load(Ordering::Relaxed) {
            return;
        }
        let pipeline = crate::placement::pipeline_position();
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

/// Memory growth as initialization applies it.
#[derive(Clone, Copy)]
struct Growth {
    /// For physical GPUs without virtual devices.
    physical: bool,
    /// What `ANYGPU_FORCE_GPU_ALLOW_GROWTH` imposes, if anything.
    forced: Option<bool>,
}

/// TF's error for allocator statistics of a CPU, followed by the device as written.
const ALLOCATOR_STATS: &str = "Allocator stats not available for device";

/// `mib` MiB in bytes; `None` when that is 2^64 bytes or more.
fn mib_to_bytes(mib: u64) -> Option<u64> {
    mib.checked_mul(1 << 20)
}

/// The largest memory limit, in MiB, whose size in bytes fits in 64 bits.
const MAX_MEMORY_LIMIT_MIB: u64 = u64::MAX >> 20;

/// What `set_logical_device_configuration` refuses whatever the runtime's state: limits on
/// CPUs, missing, zero or overflowing limits on GPUs.
fn check_virtual_configs(
    pd: &PhysicalDevice,
    configs: &[LogicalDeviceConfiguration],
) -> Result<()> {
    match pd.device_type() {
        DeviceKind::Cpu => {
            if configs.iter().any(|c| c.memory_limit.is_some()) {
                return Err(Error::InvalidArgument(
                    "Setting memory limit on CPU virtual devices is currently not supported".into(),
                ));
            }
            if configs.iter().any(|c| c.threads == Some(0)) {
                return Err(Error::InvalidArgument(format!(
                    "threads must be at least 1 for the virtual devices of {}",
                    pd.name()
                )));
            }
        }
        DeviceKind::Gpu => {
            if configs.iter().any(|c| c.threads.is_some()) {
                return Err(Error::InvalidArgument(format!(
                    "threads applies to CPU virtual devices only, not to {}",
                    pd.name()
                )));
            }
            for c in configs {
                match c.memory_limit {
                    None => {
                        return Err(Error::InvalidArgument(
                            "Setting memory limit is required for GPU virtual devices".into(),
                        ))
                    }
                    Some(0) => {
                        return Err(Error::InvalidArgument(format!(
                            "memory_limit must be at least 1 MiB for the virtual devices of {}",
                            pd.name()
                        )))
                    }
                    Some(mib) if mib_to_bytes(mib).is_none() => {
                        return Err(Error::InvalidArgument(format!(
                            "memory_limit of {mib} MiB for a virtual device of {} is 2^64 bytes \
                             or more (at most {MAX_MEMORY_LIMIT_MIB} MiB)",
                            pd.name()
                        )))
                    }
                    Some(_) => {}
                }
            }
        }
    }
    Ok(())
}

/// Budget of a whole physical GPU without `ANYGPU_GPU_MEMORY_LIMIT_MB`: the reported device
/// memory less TensorFlow's system reserve, else [`DEFAULT_GPU_MEMORY_LIMIT_MB`].
fn physical_budget(adapter: &AdapterEntry) -> u64 {
    match adapter.memory_bytes {
        Some(total) => total.saturating_sub(system_reserve(total)).max(1 << 20),
        None => DEFAULT_GPU_MEMORY_LIMIT_MB << 20,
    }
}

/// TensorFlow's reserve for the system on a device of `total` bytes: 225 MiB below 2 GiB, 500 MiB
/// below 4 GiB, 1 GiB below 16 GiB, 1.8 GiB above.
fn system_reserve(total: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    match total {
        t if t < 2 * GIB => 225 * MIB,
        t if t < 4 * GIB => 500 * MIB,
        t if t < 16 * GIB => 1050 * MIB,
        _ => 1843 * MIB,
    }
}

/// Builds a [`Runtime`] with its configuration in one expression, initialized by `build`.
///
/// ```
/// use anygpu::Runtime;
/// let rt = Runtime::builder()
///     .memory_growth(true)
///     .log_device_placement(false)
///     .build()?;
/// assert!(rt.is_initialized());
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct RuntimeBuilder {
    env: HashMap<String, Option<String>>,
    visible_gpus: Option<Vec<usize>>,
    memory_growth: Option<bool>,
    virtual_gpus: Vec<(usize, Vec<u64>)>,
    virtual_cpus: Option<usize>,
    log_placement: bool,
    soft_placement: Option<bool>,
    injected_failures: HashMap<usize, String>,
}

impl RuntimeBuilder {
    /// Overrides an environment variable for this runtime only (`None` = unset), so tests can
    /// exercise `ANYGPU_*` and `WGPU_BACKEND` without touching the process environment.
    pub fn env(mut self, key: &str, value: Option<&str>) -> Self {
        self.env.insert(key.to_string(), value.map(str::to_string));
        self
    }

    /// Only these physical GPU indices are visible (`set_visible_devices`).
    pub fn visible_gpus(mut self, indices: &[usize]) -> Self {
        self.visible_gpus = Some(indices.to_vec());
        self
    }

    /// Memory growth on every visible GPU without virtual devices.
    pub fn memory_growth(mut self, enable: bool) -> Self {
        self.memory_growth = Some(enable);
        self
    }

    /// Cuts physical GPU `index` into virtual devices of these MiB.
    pub fn virtual_gpus(mut self, index: usize, memory_limits_mib: &[u64]) -> Self {
        self.virtual_gpus.push((index, memory_limits_mib.to_vec()));
        self
    }

    /// `count` logical CPUs.
    pub fn virtual_cpus(mut self, count: usize) -> Self {
        self.virtual_cpus = Some(count);
        self
    }

    /// Placement logging.
    pub fn log_device_placement(mut self, enabled: bool) -> Self {
        self.log_placement = enabled;
        self
    }

    /// Software adapters (lavapipe, llvmpipe, WARP) count as GPUs for default and soft
    /// placement, as TensorFlow counts its GPUs (see [`Runtime::default_device`]); the same as
    /// `ANYGPU_SOFTWARE_ADAPTERS_AS_GPUS=1`, which this overrides. Off by default: `CPU:0` is
    /// faster than a software adapter on the same cores.
    pub fn software_adapters_as_gpus(self, enabled: bool) -> Self {
        let value = if enabled { "1" } else { "0" };
        self.env(SOFTWARE_AS_GPUS, Some(value))
    }

    /// Soft placement (on by default).
    pub fn soft_device_placement(mut self, enabled: bool) -> Self {
        self.soft_placement = Some(enabled);
        self
    }

    /// Makes physical GPU `index` fail to open with `cause` at initialization, as a broken
    /// driver would: for tests that one bad adapter leaves every other device working.
    #[doc(hidden)]
    pub fn fail_adapter_for_tests(mut self, index: usize, cause: &str) -> Self {
        self.injected_failures.insert(index, cause.to_string());
        self
    }

    /// Applies the configuration and initializes.
    ///
    /// # Errors
    /// Whatever the corresponding setter or initialization would return.
    pub fn build(self) -> Result<Runtime> {
        let rt = self.configure()?;
        rt.initialize()?;
        Ok(rt)
    }

    /// Applies the configuration without initializing, for further `set_*` calls.
    pub fn configure(self) -> Result<Runtime> {
        let rt = Runtime::with_env(self.env, self.injected_failures);
        let gpus = rt.list_physical_devices(DeviceKind::Gpu);
        let gpu = |i: usize| {
            gpus.get(i)
                .cloned()
                .ok_or_else(|| Error::UnrecognizedDevice(format!("/physical_device:GPU:{i}")))
        };
        if let Some(indices) = &self.visible_gpus {
            let picked = indices
                .iter()
                .map(|&i| gpu(i))
                .collect::<Result<Vec<_>>>()?;
            rt.set_visible_devices(&picked, DeviceKind::Gpu)?;
        }
        if let Some(enable) = self.memory_growth {
            let visible = rt.get_visible_devices(DeviceKind::Gpu);
            for pd in &visible {
                if !self.virtual_gpus.iter().any(|(i, _)| *i == pd.index()) {
                    rt.set_memory_growth(pd, enable)?;
                }
            }
        }
        for (index, limits) in &self.virtual_gpus {
            let configs: Vec<_> = limits
                .iter()
                .map(|&mib| LogicalDeviceConfiguration::new().memory_limit(mib))
                .collect();
            rt.set_logical_device_configuration(&gpu(*index)?, &configs)?;
        }
        if let Some(n) = self.virtual_cpus {
            let cpu = PhysicalDevice::new(DeviceKind::Cpu, 0);
            rt.set_logical_device_configuration(&cpu, &vec![LogicalDeviceConfiguration::new(); n])?;
        }
        rt.set_log_device_placement(self.log_placement);
        if let Some(soft) = self.soft_placement {
            rt.set_soft_device_placement(soft);
        }
        Ok(rt)
    }
}

impl fmt::Display for LogicalDeviceConfiguration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.memory_limit {
            Some(mib) => write!(f, "LogicalDeviceConfiguration(memory_limit={mib})"),
            None => f.write_str("LogicalDeviceConfiguration(memory_limit=None)"),
        }
    }
}
