//! Physical devices: wgpu adapters found, ordered, de-duplicated and filtered by
//! `ANYGPU_VISIBLE_DEVICES`, plus the host CPU.

use std::fmt;

use crate::device::name::{physical_name, DeviceKind};

/// A physical device, as `tf.config.list_physical_devices` returns it.
///
/// `name` is `/physical_device:GPU:0`; GPUs are numbered in the stable order described in
/// [`crate::config::list_physical_devices`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PhysicalDevice {
    kind: DeviceKind,
    index: usize,
    name: String,
}

impl PhysicalDevice {
    pub(crate) fn new(kind: DeviceKind, index: usize) -> PhysicalDevice {
        PhysicalDevice {
            kind,
            index,
            name: physical_name(kind, index),
        }
    }

    /// `/physical_device:GPU:0`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `GPU` or `CPU` (TensorFlow's `device_type`).
    pub fn device_type(&self) -> DeviceKind {
        self.kind
    }

    /// Index among the physical devices of its kind.
    pub fn index(&self) -> usize {
        self.index
    }
}

impl fmt::Display for PhysicalDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PhysicalDevice(name='{}', device_type='{}')",
            self.name, self.kind
        )
    }
}

/// What `get_device_details` reports (TF's `get_device_details` dictionary, typed).
///
/// For the CPU only `device_name`, `device_type` and `backend` are meaningful and `gpu` is
/// `None` (TensorFlow returns an empty dictionary there).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct DeviceDetails {
    /// Adapter name (`"llvmpipe (LLVM 15.0.6, 256 bits)"`), or `"host CPU"`.
    pub device_name: String,
    /// `GPU` or `CPU`.
    pub device_type: DeviceKind,
    /// `Vulkan`, `Metal`, `Dx12`, `Gl`, or `native` for the CPU.
    pub backend: String,
    /// Adapter facts; `None` for the CPU.
    pub gpu: Option<GpuDetails>,
}

/// The adapter facts that matter for compute, read from wgpu.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct GpuDetails {
    /// PCI vendor id (or the backend's equivalent; Mesa uses 0x10005).
    pub vendor_id: u32,
    /// PCI device id (0 when the backend has none).
    pub device_id: u32,
    /// `DiscreteGpu`, `IntegratedGpu`, `VirtualGpu`, `Cpu` (software) or `Other`.
    pub adapter_type: String,
    /// Driver name.
    pub driver: String,
    /// Driver version and build details.
    pub driver_info: String,
    /// PCI bus id (`0000:01:00.0`), when the backend reports one.
    pub pci_bus_id: Option<String>,
    /// Device memory in bytes where the backend reports it: the largest device-local heap on
    /// Vulkan. `None` elsewhere (wgpu exposes no memory size on Metal, DX12 or GL).
    pub memory_bytes: Option<u64>,
    /// The largest `wgpu::Buffer` the adapter can create.
    pub max_buffer_size: u64,
    /// The largest range one storage binding can cover; arena regions never exceed it.
    pub max_storage_buffer_binding_size: u64,
    /// Storage buffers one shader stage can bind.
    pub max_storage_buffers_per_shader_stage: u32,
    /// Alignment of storage binding offsets.
    pub min_storage_buffer_offset_alignment: u32,
    /// Workgroup shared memory in bytes.
    pub max_compute_workgroup_storage_size: u32,
    /// Invocations in one workgroup.
    pub max_compute_invocations_per_workgroup: u32,
    /// Workgroup size limits (x, y, z).
    pub max_compute_workgroup_size: [u32; 3],
    /// Workgroups per dispatch dimension.
    pub max_compute_workgroups_per_dimension: u32,
    /// `SHADER_F16`: half-precision arithmetic in shaders.
    pub shader_f16: bool,
    /// `SUBGROUP`: subgroup operations in compute shaders.
    pub subgroups: bool,
    /// `TIMESTAMP_QUERY`: GPU timestamps.
    pub timestamp_query: bool,
}

/// One adapter as discovered, with everything read once.
#[derive(Clone, Debug)]
pub(crate) struct AdapterEntry {
    pub(crate) adapter: wgpu::Adapter,
    pub(crate) info: wgpu::AdapterInfo,
    pub(crate) limits: wgpu::Limits,
    pub(crate) features: wgpu::Features,
    pub(crate) memory_bytes: Option<u64>,
}

impl AdapterEntry {
    pub(crate) fn new(adapter: wgpu::Adapter) -> AdapterEntry {
        let memory_bytes = device_memory(&adapter);
        AdapterEntry {
            info: adapter.get_info(),
            limits: adapter.limits(),
            features: adapter.features(),
            memory_bytes,
            adapter,
        }
    }

    pub(crate) fn details(&self) -> DeviceDetails {
        let l = &self.limits;
        DeviceDetails {
            device_name: self.info.name.clone(),
            device_type: DeviceKind::Gpu,
            backend: format!("{:?}", self.info.backend),
            gpu: Some(GpuDetails {
                vendor_id: self.info.vendor,
                device_id: self.info.device,
                adapter_type: format!("{:?}", self.info.device_type),
                driver: self.info.driver.clone(),
                driver_info: self.info.driver_info.clone(),
                pci_bus_id: Some(self.info.device_pci_bus_id.clone()).filter(|s| !s.is_empty()),
                memory_bytes: self.memory_bytes,
                max_buffer_size: l.max_buffer_size,
                max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
                max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
                min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
                max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
                max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
                max_compute_workgroup_size: [
                    l.max_compute_workgroup_size_x,
                    l.max_compute_workgroup_size_y,
                    l.max_compute_workgroup_size_z,
                ],
                max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
                shader_f16: self.features.contains(wgpu::Features::SHADER_F16),
                subgroups: self.features.contains(wgpu::Features::SUBGROUP),
                timestamp_query: self.features.contains(wgpu::Features::TIMESTAMP_QUERY),
            }),
        }
    }

    /// Sort key: discrete, integrated, virtual, other, software; native APIs before GL; then PCI
    /// bus id and name, so the order does not depend on the driver's enumeration order.
    fn order_key(&self) -> (u8, u8, String, String) {
        let type_rank = match self.info.device_type {
            wgpu::DeviceType::DiscreteGpu => 0,
            wgpu::DeviceType::IntegratedGpu => 1,
            wgpu::DeviceType::VirtualGpu => 2,
            wgpu::DeviceType::Other => 3,
            wgpu::DeviceType::Cpu => 4,
        };
        let backend_rank = match self.info.backend {
            wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 => 0,
            wgpu::Backend::Gl => 1,
            _ => 2,
        };
        (
            type_rank,
            backend_rank,
            self.info.device_pci_bus_id.clone(),
            self.info.name.clone(),
        )
    }

    /// Whether `self` and `other` are one physical GPU seen through two backends.
    fn same_hardware(&self, other: &AdapterEntry) -> bool {
        let (a, b) = (&self.info, &other.info);
        if !a.device_pci_bus_id.is_empty() && a.device_pci_bus_id == b.device_pci_bus_id {
            return true;
        }
        // Without a bus id on both sides, fall back to the PCI ids, but only across backends:
        // two identical cards on one backend are two devices. Software adapters have no PCI
        // identity (device id 0) and always count on their own.
        let bus_ids_known = !a.device_pci_bus_id.is_empty() && !b.device_pci_bus_id.is_empty();
        !bus_ids_known
            && a.backend != b.backend
            && a.device_type != wgpu::DeviceType::Cpu
            && a.vendor != 0
            && a.device != 0
            && (a.vendor, a.device) == (b.vendor, b.device)
    }
}

/// Orders adapters and drops the second sighting of one GPU through another backend.
pub(crate) fn order_and_dedupe(mut adapters: Vec<AdapterEntry>) -> Vec<AdapterEntry> {
    adapters.sort_by_key(AdapterEntry::order_key);
    let mut kept: Vec<AdapterEntry> = Vec::with_capacity(adapters.len());
    for entry in adapters {
        if let Some(first) = kept.iter().find(|k| k.same_hardware(&entry)) {
            log::debug!(
                "{} ({:?}) is {} ({:?}) seen through another backend; listing it once",
                entry.info.name,
                entry.info.backend,
                first.info.name,
                first.info.backend
            );
        } else {
            kept.push(entry);
        }
    }
    kept
}

/// Parses `ANYGPU_VISIBLE_DEVICES` as CUDA parses `CUDA_VISIBLE_DEVICES`: comma-separated
/// indices into the adapter list, read up to the first entry that is not a listed GPU (not a
/// number, negative, out of range, or a repeat), which ends the list with a warning: `0,-1,1`
/// keeps only GPU 0. An empty string hides every GPU.
pub(crate) fn parse_visible_env(value: &str, adapters: usize) -> Vec<usize> {
    let mut picked = Vec::new();
    if value.trim().is_empty() {
        return picked;
    }
    for item in value.split(',').map(str::trim) {
        let problem = match item.parse::<usize>() {
            Ok(i) if i < adapters && !picked.contains(&i) => {
                picked.push(i);
                continue;
            }
            Ok(i) if i < adapters => format!("GPU {i} is listed twice"),
            Ok(_) => format!("only {adapters} GPU(s) were found"),
            Err(_) => "not a GPU index".to_string(),
        };
        log::warn!(
            "ANYGPU_VISIBLE_DEVICES='{value}': stopping at '{item}' ({problem}); as with \
             CUDA_VISIBLE_DEVICES, the entries before it are visible"
        );
        break;
    }
    picked
}

/// The device memory the backend reports, if it reports any (see [`GpuDetails::memory_bytes`]).
fn device_memory(adapter: &wgpu::Adapter) -> Option<u64> {
    #[cfg(any(target_os = "linux", target_os = "windows", target_os = "android"))]
    if adapter.get_info().backend == wgpu::Backend::Vulkan {
        return vulkan_device_local_heap(adapter);
    }
    let _ = adapter;
    None
}

/// The largest DEVICE_LOCAL memory heap, read through wgpu's Vulkan HAL.
#[cfg(any(target_os = "linux", target_os = "windows", target_os = "android"))]
fn vulkan_device_local_heap(adapter: &wgpu::Adapter) -> Option<u64> {
    // VK_MEMORY_HEAP_DEVICE_LOCAL_BIT.
    const DEVICE_LOCAL: u32 = 0x1;
    // SAFETY: the HAL adapter is only used to read immutable physical-device properties while
    // `adapter` (which owns it) is borrowed; nothing is created or destroyed through it.
    unsafe {
        let hal = adapter.as_hal::<wgpu::hal::api::Vulkan>()?;
        let instance = hal.shared_instance().raw_instance();
        let props = instance.get_physical_device_memory_properties(hal.raw_physical_device());
        let count = (props.memory_heap_count as usize).min(props.memory_heaps.len());
        props.memory_heaps[..count]
            .iter()
            .filter(|heap| heap.flags.as_raw() & DEVICE_LOCAL != 0)
            .map(|heap| heap.size)
            .max()
    }
}

#[cfg(test)]
mod tests {
    use super::parse_visible_env;

    #[test]
    fn visible_devices_stop_at_the_first_invalid_entry_like_cuda() {
        assert_eq!(parse_visible_env("0,-1,1", 3), [0]);
        assert_eq!(parse_visible_env("2,0", 3), [2, 0]);
        assert_eq!(parse_visible_env("1,9,0", 3), [1]);
        assert_eq!(parse_visible_env("x,1", 3), Vec::<usize>::new());
        assert_eq!(parse_visible_env("1,1,0", 3), [1]);
        assert_eq!(parse_visible_env(" 1 , 0 ", 3), [1, 0]);
        assert_eq!(parse_visible_env("", 3), Vec::<usize>::new());
        assert_eq!(parse_visible_env("0,,1", 3), [0]);
    }
}
