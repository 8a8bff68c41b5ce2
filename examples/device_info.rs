//! `nvidia-smi -L` for anygpu: every physical device with its index, adapter, backend, type,
//! driver, memory, the limits that matter, and whether it is visible.
//!
//! ```text
//! $ WGPU_BACKEND=vulkan,gl cargo run --example device_info
//! CPU:0  host CPU (2 threads)                      native
//! GPU:0  llvmpipe (LLVM 15.0.6, 256 bits)          Vulkan  Cpu  llvmpipe  Mesa 22.3.6 (LLVM 15.0.6)
//!        memory 2.0 GiB  max buffer 2.0 GiB  max binding 128.0 MiB  workgroup 1024 inv / 32.0 KiB
//!        f16 yes  subgroups yes  timestamps yes  visible yes
//! GPU:1  llvmpipe (LLVM 15.0.6, 256 bits)          Gl  Cpu  ...
//! ```
//!
//! `--json` prints the same as JSON for scripts.

use anygpu::{config, format_bytes, KindFilter};
use serde_json::json;

fn main() -> anygpu::Result<()> {
    env_logger::init();
    let as_json = std::env::args().any(|a| a == "--json");
    let visible = config::get_visible_devices(KindFilter::All);
    let mut rows = Vec::new();
    for pd in config::list_physical_devices(KindFilter::All) {
        let d = config::get_device_details(&pd)?;
        let is_visible = visible.contains(&pd);
        let short = pd
            .name()
            .trim_start_matches("/physical_device:")
            .to_string();
        if as_json {
            rows.push(match &d.gpu {
                None => json!({"device": short, "name": d.device_name, "backend": d.backend, "visible": is_visible}),
                Some(g) => json!({
                    "device": short, "name": d.device_name, "backend": d.backend,
                    "type": g.adapter_type, "driver": g.driver, "driver_info": g.driver_info,
                    "vendor_id": g.vendor_id, "device_id": g.device_id, "pci_bus_id": g.pci_bus_id,
                    "memory_bytes": g.memory_bytes, "max_buffer_size": g.max_buffer_size,
                    "max_storage_buffer_binding_size": g.max_storage_buffer_binding_size,
                    "max_compute_invocations_per_workgroup": g.max_compute_invocations_per_workgroup,
                    "max_compute_workgroup_storage_size": g.max_compute_workgroup_storage_size,
                    "shader_f16": g.shader_f16, "subgroups": g.subgroups,
                    "timestamp_query": g.timestamp_query, "visible": is_visible,
                }),
            });
            continue;
        }
        match &d.gpu {
            None => println!("{short:<6} {:<40} {}", d.device_name, d.backend),
            Some(g) => {
                let yes = |b: bool| if b { "yes" } else { "no" };
                println!(
                    "{short:<6} {:<40} {}  {}  {}  {}",
                    d.device_name, d.backend, g.adapter_type, g.driver, g.driver_info
                );
                println!(
                    "       memory {}  max buffer {}  max binding {}  workgroup {} inv / {}",
                    g.memory_bytes.map_or("not reported".into(), format_bytes),
                    format_bytes(g.max_buffer_size),
                    format_bytes(g.max_storage_buffer_binding_size),
                    g.max_compute_invocations_per_workgroup,
                    format_bytes(u64::from(g.max_compute_workgroup_storage_size)),
                );
                println!(
                    "       f16 {}  subgroups {}  timestamps {}  visible {}",
                    yes(g.shader_f16),
                    yes(g.subgroups),
                    yes(g.timestamp_query),
                    yes(is_visible)
                );
            }
        }
    }
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
    }
    Ok(())
}
