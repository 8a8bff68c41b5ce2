//! The arena against raw wgpu buffers: allocate + free pairs of mixed sizes through the BFC
//! arena vs `device.create_buffer` + drop for each request, per GPU. Also prints the
//! fragmentation (bytes reserved / peak bytes in use) after replaying an allocation trace shaped
//! like a training step of the tutorial CNN.

use std::time::{Duration, Instant};

use anygpu::{DType, Runtime, Tensor};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// Mixed request sizes (floats): parameters, activations and gradients of the tutorial CNN at
/// batch 128, plus small scalars.
const SIZES: [usize; 8] = [
    1,
    10,
    320,
    1152 * 128,
    128 * 28 * 28 * 32,
    128 * 14 * 14 * 64,
    288,
    16_384,
];

fn runtime() -> Runtime {
    let backends = std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "vulkan,gl".into());
    Runtime::builder()
        .env("WGPU_BACKEND", Some(&backends))
        .memory_growth(true)
        .build()
        .expect("runtime")
}

fn arena_vs_buffers(c: &mut Criterion) {
    let rt = runtime();
    for device in rt.list_logical_devices("GPU").expect("devices") {
        let label = format!(
            "gpu{}-{}",
            device.index(),
            device
                .adapter_name()
                .split_whitespace()
                .next()
                .unwrap_or("gpu")
        );
        let mut group = c.benchmark_group(format!("alloc_free/{label}"));
        group
            .sample_size(20)
            .measurement_time(Duration::from_secs(3));
        group.throughput(Throughput::Elements(SIZES.len() as u64));
        group.bench_function("arena", |b| {
            b.iter(|| {
                for &n in &SIZES {
                    let t = Tensor::empty_on(&[n], DType::F32, &device).expect("alloc");
                    drop(t);
                }
            })
        });
        let wgpu_device = raw_device(&device);
        group.bench_function("create_buffer", |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    for &n in &SIZES {
                        let buffer = wgpu_device.create_buffer(&wgpu::BufferDescriptor {
                            label: None,
                            size: (n * 4).div_ceil(256) as u64 * 256,
                            usage: wgpu::BufferUsages::STORAGE
                                | wgpu::BufferUsages::COPY_DST
                                | wgpu::BufferUsages::COPY_SRC,
                            mapped_at_creation: false,
                        });
                        drop(buffer);
                    }
                }
                start.elapsed()
            })
        });
        group.finish();
        fragmentation(&rt, &device);
    }
}

/// A device of its own on the same adapter, for the raw-buffer baseline.
fn raw_device(device: &anygpu::LogicalDevice) -> wgpu::Device {
    let backends = device
        .backend()
        .map(wgpu::Backends::from)
        .unwrap_or(wgpu::Backends::all());
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let adapter = pollster::block_on(instance.enumerate_adapters(backends))
        .into_iter()
        .find(|a| a.get_info().name == device.adapter_name())
        .expect("the adapter is still there");
    let (d, _q) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        required_limits: adapter.limits(),
        ..Default::default()
    }))
    .expect("device");
    d
}

/// Replays a forward/backward-shaped trace (activations kept until their gradient is made) and
/// reports reserved / peak in use.
fn fragmentation(rt: &Runtime, device: &anygpu::LogicalDevice) {
    let name = device.name().to_string();
    let _ = rt.reset_memory_stats(&name);
    let layers = [
        128 * 28 * 28 * 32,
        128 * 28 * 28 * 32,
        128 * 14 * 14 * 32,
        128 * 14 * 14 * 64,
        128 * 14 * 14 * 64,
        128 * 7 * 7 * 64,
        128 * 7 * 7 * 128,
        128 * 3 * 3 * 128,
        128 * 128,
        128 * 10,
    ];
    for _step in 0..3 {
        let acts: Vec<Tensor> = layers
            .iter()
            .map(|&n| Tensor::empty_on(&[n], DType::F32, device).expect("act"))
            .collect();
        let mut grads = Vec::new();
        for (i, &n) in layers.iter().enumerate().rev() {
            grads.push(Tensor::empty_on(&[n], DType::F32, device).expect("grad"));
            if grads.len() > 2 {
                grads.remove(0);
            }
            let _ = &acts[i];
        }
    }
    if let Ok(s) = rt.get_memory_stats(&name) {
        println!(
            "fragmentation on {name}: reserved {} / peak in use {} = {:.2}",
            anygpu::format_bytes(s.peak_bytes_reserved),
            anygpu::format_bytes(s.peak_bytes_in_use),
            s.peak_bytes_reserved as f64 / s.peak_bytes_in_use.max(1) as f64
        );
    }
}

criterion_group!(benches, arena_vs_buffers);
criterion_main!(benches);
