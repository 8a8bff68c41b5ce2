//! Initialization: the logical devices created once, at first use, from the configuration
//! (one context per visible adapter, one arena per logical device, memory budgets and growth).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::device::logical::{Backend, CpuDevice, GpuContext, GpuDevice, Owner, UnavailableGpu};
use crate::device::name::{full_name, physical_name, DeviceKind};
use crate::device::physical::AdapterEntry;
use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::memory::{Arena, ArenaConfig};
use crate::shader::tune::TuneConfig;
use crate::smi;

use super::configuration::{mib_to_bytes, MAX_MEMORY_LIMIT_MIB};
use super::{Config, Devices, Runtime, DEFAULT_GPU_MEMORY_LIMIT_MB};

/// Memory growth as initialization applies it.
#[derive(Clone, Copy)]
pub(super) struct Growth {
    /// For physical GPUs without virtual devices.
    physical: bool,
    /// What `ANYGPU_FORCE_GPU_ALLOW_GROWTH` imposes, if anything.
    forced: Option<bool>,
}

/// Budget of a whole physical GPU without `ANYGPU_GPU_MEMORY_LIMIT_MB`: the reported device
/// memory less a system reserve after TensorFlow's ([`system_reserve`]), else
/// [`DEFAULT_GPU_MEMORY_LIMIT_MB`].
fn physical_budget(adapter: &AdapterEntry) -> u64 {
    match adapter.memory_bytes {
        Some(total) => total.saturating_sub(system_reserve(total)).max(1 << 20),
        None => DEFAULT_GPU_MEMORY_LIMIT_MB << 20,
    }
}

/// The memory left to the system on a device of `total` bytes. TensorFlow's `MinSystemMemory`
/// leaves 225 MiB below 2 GiB, and otherwise 500, 1050, 1536 or 1800 MiB by CUDA compute
/// capability (up to 6.x, 7.x, 8.x, 9.0 on), which no wgpu adapter reports: here the device's
/// size stands in for its generation, with TF's amounts: 225 MiB below 2 GiB, 500 MiB below
/// 4 GiB, 1050 MiB below 16 GiB, 1800 MiB from there.
fn system_reserve(total: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    match total {
        t if t < 2 * GIB => 225 * MIB,
        t if t < 4 * GIB => 500 * MIB,
        t if t < 16 * GIB => 1050 * MIB,
        _ => 1800 * MIB,
    }
}

impl Runtime {
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
        self.publish(devices);
        Ok(devices)
    }

    /// Starts publishing `devices` for `anygpu-smi` (see [`crate::smi`]): their names, and weak
    /// handles to their arenas and op counters, watched for as long as this runtime lives.
    fn publish(&self, devices: &Devices) {
        let watched = devices
            .cpus
            .iter()
            .chain(&devices.gpus)
            .map(|d| smi::Watched {
                name: d.name().to_string(),
                adapter: d.adapter_name().to_string(),
                backend: d
                    .backend()
                    .map_or_else(|| "CPU".into(), |b| format!("{b:?}")),
                arena: d.gpu().map(|g| Arc::downgrade(&g.arena)),
                ops: Arc::clone(&d.0.ops_run),
            })
            .collect();
        smi::start(Arc::downgrade(&self.shared), |k| self.env(k), watched);
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
                                "memory_limit of {mib} MiB for a virtual device of physical \
                                 GPU {physical_index} is 2^64 bytes or more"
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
                        // llvmpipe's GL regions: see the arena's docs.
                        lazy_regions: ctx.adapter.info.device_type == wgpu::DeviceType::Cpu
                            && ctx.adapter.info.backend == wgpu::Backend::Gl,
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
}
