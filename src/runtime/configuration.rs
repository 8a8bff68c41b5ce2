//! The configuration while it is mutable: [`LogicalDeviceConfiguration`], and `tf.config`'s
//! setters and getters (visibility, memory growth, virtual devices, threading, placement
//! logging), which check their arguments first and then refuse a change after initialization.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::device::name::DeviceKind;
use crate::device::PhysicalDevice;
use crate::error::{Error, Result};

use super::{KindFilter, PlacementCallback, PlacementRecord, Runtime};

/// Memory budget of a GPU whose backend reports no memory size (Metal, DX12, GL), unless
/// `ANYGPU_GPU_MEMORY_LIMIT_MB` says otherwise. Modest on purpose: without memory growth the
/// whole budget is reserved at initialization, and a GL driver commits what it reserves
/// (llvmpipe's regions are created as tensors arrive instead: 1 GiB would take ~0.8 s and
/// 1 GiB of host memory at every start).
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
    pub(super) memory_limit: Option<u64>,
    pub(super) threads: Option<usize>,
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

/// `mib` MiB in bytes; `None` when that is 2^64 bytes or more.
pub(super) fn mib_to_bytes(mib: u64) -> Option<u64> {
    mib.checked_mul(1 << 20)
}

/// The largest memory limit, in MiB, whose size in bytes fits in 64 bits.
pub(super) const MAX_MEMORY_LIMIT_MIB: u64 = u64::MAX >> 20;

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

impl fmt::Display for LogicalDeviceConfiguration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.memory_limit {
            Some(mib) => write!(f, "LogicalDeviceConfiguration(memory_limit={mib})"),
            None => f.write_str("LogicalDeviceConfiguration(memory_limit=None)"),
        }
    }
}

impl Runtime {
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
}
