//! `tf.config`, process-wide: every function here forwards to one [`Runtime`] shared by the
//! whole process, created on first use. Configure before the first op, as in TensorFlow; after
//! that, setters that would change the devices fail with TensorFlow's messages.
//!
//! ```
//! use anygpu::{config, DeviceKind};
//! let gpus = config::list_physical_devices(DeviceKind::Gpu);
//! for gpu in &gpus {
//!     // Must happen before the runtime initializes (TensorFlow: before GPUs are used).
//!     config::set_memory_growth(gpu, true)?;
//! }
//! let logical = config::list_logical_devices("GPU")?;
//! println!("{} physical GPUs, {} logical GPUs", gpus.len(), logical.len());
//! # Ok::<(), anygpu::Error>(())
//! ```
//!
//! Libraries and tests that want no global state build their own with [`Runtime::builder`].

use std::sync::OnceLock;

use crate::device::{DeviceDetails, DeviceKind, LogicalDevice, PhysicalDevice};
use crate::error::Result;
use crate::memory::{MemoryInfo, MemoryStats};
use crate::runtime::Runtime;
pub use crate::runtime::{KindFilter, LogicalDeviceConfiguration, PlacementRecord};

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// The process-wide runtime behind this module.
pub fn runtime() -> &'static Runtime {
    RUNTIME.get_or_init(Runtime::new)
}

/// `tf.config.list_physical_devices`. See [`Runtime::list_physical_devices`].
pub fn list_physical_devices(kind: impl Into<KindFilter>) -> Vec<PhysicalDevice> {
    runtime().list_physical_devices(kind)
}

/// `tf.config.experimental.get_device_details`. See [`Runtime::get_device_details`].
pub fn get_device_details(device: &PhysicalDevice) -> Result<DeviceDetails> {
    runtime().get_device_details(device)
}

/// `tf.config.set_visible_devices`. See [`Runtime::set_visible_devices`].
pub fn set_visible_devices(devices: &[PhysicalDevice], kind: DeviceKind) -> Result<()> {
    runtime().set_visible_devices(devices, kind)
}

/// `tf.config.get_visible_devices`.
pub fn get_visible_devices(kind: impl Into<KindFilter>) -> Vec<PhysicalDevice> {
    runtime().get_visible_devices(kind)
}

/// `tf.config.threading`: threads within and between ops, process-wide.
///
/// ```
/// use anygpu::config::threading;
/// assert_eq!(threading::get_intra_op_parallelism_threads(), 0); // the system picks
/// ```
pub mod threading {
    use super::runtime;
    use crate::error::Result;

    /// `tf.config.threading.set_intra_op_parallelism_threads`. See
    /// [`crate::Runtime::set_intra_op_parallelism_threads`].
    pub fn set_intra_op_parallelism_threads(threads: usize) -> Result<()> {
        runtime().set_intra_op_parallelism_threads(threads)
    }

    /// `tf.config.threading.get_intra_op_parallelism_threads`.
    pub fn get_intra_op_parallelism_threads() -> usize {
        runtime().get_intra_op_parallelism_threads()
    }

    /// `tf.config.threading.set_inter_op_parallelism_threads`. See
    /// [`crate::Runtime::set_inter_op_parallelism_threads`].
    pub fn set_inter_op_parallelism_threads(threads: usize) -> Result<()> {
        runtime().set_inter_op_parallelism_threads(threads)
    }

    /// `tf.config.threading.get_inter_op_parallelism_threads`.
    pub fn get_inter_op_parallelism_threads() -> usize {
        runtime().get_inter_op_parallelism_threads()
    }
}

/// `tf.config.experimental.set_memory_growth`. See [`Runtime::set_memory_growth`].
pub fn set_memory_growth(device: &PhysicalDevice, enable: bool) -> Result<()> {
    runtime().set_memory_growth(device, enable)
}

/// `tf.config.experimental.get_memory_growth`: `None` until set.
pub fn get_memory_growth(device: &PhysicalDevice) -> Result<Option<bool>> {
    runtime().get_memory_growth(device)
}

/// `tf.config.set_logical_device_configuration`. See
/// [`Runtime::set_logical_device_configuration`].
pub fn set_logical_device_configuration(
    device: &PhysicalDevice,
    configs: &[LogicalDeviceConfiguration],
) -> Result<()> {
    runtime().set_logical_device_configuration(device, configs)
}

/// `tf.config.get_logical_device_configuration`.
pub fn get_logical_device_configuration(
    device: &PhysicalDevice,
) -> Result<Option<Vec<LogicalDeviceConfiguration>>> {
    runtime().get_logical_device_configuration(device)
}

/// `tf.config.list_logical_devices`; initializes the runtime.
pub fn list_logical_devices(kind: impl Into<KindFilter>) -> Result<Vec<LogicalDevice>> {
    runtime().list_logical_devices(kind)
}

/// `tf.debugging.set_log_device_placement`.
pub fn set_log_device_placement(enabled: bool) {
    runtime().set_log_device_placement(enabled)
}

/// Whether placement logging is on.
pub fn get_log_device_placement() -> bool {
    runtime().get_log_device_placement()
}

/// `tf.config.set_soft_device_placement`.
pub fn set_soft_device_placement(enabled: bool) {
    runtime().set_soft_device_placement(enabled)
}

/// `tf.config.get_soft_device_placement`.
pub fn get_soft_device_placement() -> bool {
    runtime().get_soft_device_placement()
}

/// `tf.config.experimental.get_memory_info`. See [`Runtime::get_memory_info`].
pub fn get_memory_info(device: &str) -> Result<MemoryInfo> {
    runtime().get_memory_info(device)
}

/// Every allocator figure of a GPU logical device.
pub fn get_memory_stats(device: &str) -> Result<MemoryStats> {
    runtime().get_memory_stats(device)
}

/// `tf.config.experimental.reset_memory_stats`.
pub fn reset_memory_stats(device: &str) -> Result<()> {
    runtime().reset_memory_stats(device)
}
