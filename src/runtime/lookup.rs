//! The initialized devices by name and kind (TF's names, the default device) and their memory
//! statistics.

use std::sync::Arc;

use crate::device::name::DeviceSpec;
use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::memory::{Arena, MemoryInfo, MemoryStats};

use super::{KindFilter, Runtime};

/// TF's error for allocator statistics of a CPU, followed by the device as written.
const ALLOCATOR_STATS: &str = "Allocator stats not available for device";

impl Runtime {
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
    /// Under [`RuntimeBuilder::software_adapters_as_gpus`](crate::RuntimeBuilder::software_adapters_as_gpus) (or
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
    /// ([`RuntimeBuilder::software_adapters_as_gpus`](crate::RuntimeBuilder::software_adapters_as_gpus)).
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
