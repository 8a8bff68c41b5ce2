//! Devices: names, the physical devices found, and the logical devices ops run on.

pub(crate) mod context;
pub(crate) mod logical;
pub(crate) mod name;
pub(crate) mod physical;
pub(crate) mod stream;

pub use logical::LogicalDevice;
pub use name::{DeviceKind, DeviceSpec};
pub use physical::{DeviceDetails, GpuDetails, PhysicalDevice};
pub use stream::StreamStats;
