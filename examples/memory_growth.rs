//! The TensorFlow guide's "watch nvidia-smi" moment, as a table: allocate and free tensors of
//! growing size with memory growth on, then off, then on two virtual devices, and print what
//! each device has reserved from the driver next to what tensors use.
//!
//! ```text
//! $ WGPU_BACKEND=vulkan cargo run --example memory_growth
//! scenario        device   tensor     in use     peak       reserved    regions
//! growth on       GPU:0    1.0 MiB    1.0 MiB    1.0 MiB    2.0 MiB     1
//! growth on       GPU:0    4.0 MiB    5.0 MiB    5.0 MiB    6.0 MiB     2
//! growth on       GPU:0    16.0 MiB   20.0 MiB   20.0 MiB   22.0 MiB    3
//! growth on       GPU:0    32.0 MiB   48.0 MiB   48.0 MiB   54.0 MiB    4
//! growth on       GPU:0    64.0 MiB   96.0 MiB   96.0 MiB   118.0 MiB   5
//! growth off      GPU:0    1.0 MiB    1.0 MiB    1.0 MiB    256.0 MiB   2
//! ...
//! 2 virtual       GPU:1    64.0 MiB   96.0 MiB   96.0 MiB   128.0 MiB   1
//! ```
//!
//! `ANYGPU_GPU_MEMORY_LIMIT_MB` (default here: 256) sets the budget of the whole GPU.

use anygpu::{format_bytes, DType, Runtime, Tensor};

const SIZES_MIB: [usize; 5] = [1, 4, 16, 32, 64];

fn main() -> anygpu::Result<()> {
    env_logger::init();
    let limit = std::env::var("ANYGPU_GPU_MEMORY_LIMIT_MB").unwrap_or_else(|_| "256".into());
    if Runtime::new().list_physical_devices("GPU").is_empty() {
        println!("no GPU adapter found: install a driver or Mesa (mesa-vulkan-drivers) and retry");
        return Ok(());
    }
    println!(
        "{:<15} {:<8} {:<10} {:<10} {:<10} {:<11} regions",
        "scenario", "device", "tensor", "in use", "peak", "reserved"
    );
    let base = || {
        Runtime::builder()
            .env("ANYGPU_GPU_MEMORY_LIMIT_MB", Some(&limit))
            .visible_gpus(&[0])
    };
    run(
        "growth on",
        &base().memory_growth(true).build()?,
        &["GPU:0"],
    )?;
    run(
        "growth off",
        &base().memory_growth(false).build()?,
        &["GPU:0"],
    )?;
    run(
        "2 virtual",
        &base().virtual_gpus(0, &[128, 128]).build()?,
        &["GPU:0", "GPU:1"],
    )?;
    Ok(())
}

/// Allocates each size, keeps the previous tensor alive (so growth has to add regions), frees
/// it, and prints the figures after each step.
fn run(scenario: &str, rt: &Runtime, devices: &[&str]) -> anygpu::Result<()> {
    for name in devices {
        let device = rt.device(name)?;
        let mut previous: Option<Tensor> = None;
        for mib in SIZES_MIB {
            let tensor = match Tensor::zeros_on(&[mib << 18], DType::F32, &device) {
                Ok(t) => t,
                Err(e) => {
                    println!(
                        "{scenario:<15} {name:<8} {:<10} {e}",
                        format!("{mib}.0 MiB")
                    );
                    continue;
                }
            };
            let s = rt.get_memory_stats(name)?;
            println!(
                "{scenario:<15} {name:<8} {:<10} {:<10} {:<10} {:<11} {}",
                format_bytes((mib as u64) << 20),
                format_bytes(s.bytes_in_use),
                format_bytes(s.peak_bytes_in_use),
                format_bytes(s.bytes_reserved),
                s.num_regions
            );
            previous = Some(tensor);
        }
        drop(previous);
    }
    Ok(())
}
