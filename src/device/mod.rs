//! Devices: names, the physical devices found, and the logical devices ops run on.

pub(crate) mod logical;
pub(crate) mod name;
pub(crate) mod physical;

pub use logical::{LogicalDevice, StreamStats};
pub use name::{DeviceKind, DeviceSpec};
pub use physical::{DeviceDetails, GpuDetails, PhysicalDevice};
