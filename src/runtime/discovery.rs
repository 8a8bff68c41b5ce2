//! Device enumeration: the wgpu adapters found once per runtime (ordered, de-duplicated,
//! filtered by `ANYGPU_VISIBLE_DEVICES`) as physical devices, and [`KindFilter`].

use crate::device::name::DeviceKind;
use crate::device::physical::{order_and_dedupe, parse_visible_env, AdapterEntry};
use crate::device::{DeviceDetails, PhysicalDevice};
use crate::error::{Error, Result};

use super::Runtime;

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
    pub(super) fn admits(self, kind: DeviceKind) -> bool {
        match self {
            KindFilter::All => true,
            KindFilter::Kind(k) => k == kind,
            KindFilter::Unknown => false,
        }
    }
}

pub(super) struct Discovery {
    pub(super) backends: wgpu::Backends,
    /// The physical GPU list: ordered, de-duplicated, filtered by `ANYGPU_VISIBLE_DEVICES`.
    pub(super) adapters: Vec<AdapterEntry>,
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
    pub(super) fn discovery(&self) -> &Discovery {
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
    pub(super) fn check_physical(
        &self,
        pd: &PhysicalDevice,
        kind: Option<DeviceKind>,
    ) -> Result<()> {
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
}
