//! [`RuntimeBuilder`]: a runtime's configuration in one expression (tests, libraries).

use std::collections::HashMap;

use crate::device::name::DeviceKind;
use crate::device::PhysicalDevice;
use crate::error::{Error, Result};

use super::{LogicalDeviceConfiguration, Runtime, SOFTWARE_AS_GPUS};

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
    /// exercise `ANYGPU_*` and `WGPU_BACKEND` without touching the process environment. The
    /// CPU kernels' `ANYGPU_NAN_TRAP`, `ANYGPU_CPU_SIMD` and `ANYGPU_WINOGRAD` are the
    /// process's, read from its environment alone (docs/environment.md).
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
