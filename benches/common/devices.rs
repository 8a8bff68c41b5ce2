//! The devices a benchmark runs on, and the tags that name them in its groups.

use anygpu::{DeviceKind, KindFilter, LogicalDevice, Runtime};

/// `cpu0`, `gpu0-lavapipe`, `gpu1-llvmpipe`, ...: the device and the first word of its adapter.
pub fn tag(dev: &LogicalDevice) -> String {
    match dev.device_type() {
        DeviceKind::Cpu => format!("cpu{}", dev.index()),
        DeviceKind::Gpu => {
            let first = dev
                .adapter_name()
                .split(|c: char| !c.is_alphanumeric())
                .next()
                .unwrap_or("gpu")
                .to_lowercase();
            // Mesa's Vulkan software driver reports itself as llvmpipe; it is lavapipe.
            let name = if first == "llvmpipe" && dev.backend() == Some(wgpu::Backend::Vulkan) {
                "lavapipe".to_string()
            } else {
                first
            };
            format!("gpu{}-{name}", dev.index())
        }
    }
}

/// Every logical device, or those `ANYGPU_BENCH_DEVICES` names: comma-separated kinds
/// (`cpu`, `gpu`), devices (`cpu0`, `gpu1`) or whole tags (`gpu0-lavapipe`).
pub fn selected(rt: &Runtime) -> Vec<LogicalDevice> {
    let all = rt
        .list_logical_devices(KindFilter::All)
        .expect("the runtime lists its devices");
    let Ok(filter) = std::env::var("ANYGPU_BENCH_DEVICES") else {
        return all;
    };
    let wanted: Vec<String> = filter
        .split(',')
        .map(|s| s.trim().to_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    all.into_iter()
        .filter(|d| {
            let kind = match d.device_type() {
                DeviceKind::Cpu => "cpu",
                DeviceKind::Gpu => "gpu",
            };
            let short = format!("{kind}{}", d.index());
            wanted
                .iter()
                .any(|w| *w == kind || *w == short || tag(d) == *w)
        })
        .collect()
}
