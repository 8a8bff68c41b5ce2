//! The TensorFlow GPU guide's multi-GPU snippet: a matmul on every logical GPU, then the sum of
//! the results on the CPU.
//!
//! ```text
//! $ WGPU_BACKEND=vulkan cargo run --example multi_device_matmul -- --virtual 256,256,256 --log-placement
//! Executing op _EagerConst in device /job:localhost/replica:0/task:0/device:GPU:0
//! Executing op _EagerConst in device /job:localhost/replica:0/task:0/device:GPU:0
//! Executing op MatMul in device /job:localhost/replica:0/task:0/device:GPU:0
//! ...
//! Executing op MatMul in device /job:localhost/replica:0/task:0/device:GPU:1
//! Executing op MatMul in device /job:localhost/replica:0/task:0/device:GPU:2
//! Executing op AddN in device /job:localhost/replica:0/task:0/device:CPU:0
//! [[66, 84], [147, 192]]
//! ```

use anygpu::{config, DeviceKind, Error, LogicalDeviceConfiguration, Tensor};
use clap::Parser;

/// Matmul on every logical GPU, add_n on the CPU.
#[derive(Parser)]
struct Args {
    /// Split GPU:0 into virtual devices of these MiB (e.g. 256,256,256).
    #[arg(long, value_delimiter = ',')]
    r#virtual: Vec<u64>,
    /// Let GPU memory grow on demand instead of reserving it.
    #[arg(long)]
    memory_growth: bool,
    /// Print where each op runs.
    #[arg(long)]
    log_placement: bool,
    /// Only these physical GPU indices are visible (e.g. 0 or 1,0).
    #[arg(long, value_delimiter = ',')]
    visible: Option<Vec<usize>>,
}

fn main() -> anygpu::Result<()> {
    env_logger::init();
    let args = Args::parse();
    let gpus = config::list_physical_devices(DeviceKind::Gpu);
    if let Some(indices) = &args.visible {
        let picked = indices
            .iter()
            .map(|&i| {
                gpus.get(i).cloned().ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "--visible {i}: there are {} physical GPUs",
                        gpus.len()
                    ))
                })
            })
            .collect::<anygpu::Result<Vec<_>>>()?;
        config::set_visible_devices(&picked, DeviceKind::Gpu)?;
    }
    let visible = config::get_visible_devices(DeviceKind::Gpu);
    if args.memory_growth {
        for gpu in &visible {
            config::set_memory_growth(gpu, true)?;
        }
    }
    if !args.r#virtual.is_empty() {
        let first = visible.first().ok_or_else(|| {
            anygpu::Error::InvalidArgument("--virtual needs a visible GPU to split".into())
        })?;
        let configs: Vec<_> = args
            .r#virtual
            .iter()
            .map(|&mib| LogicalDeviceConfiguration::new().memory_limit(mib))
            .collect();
        config::set_logical_device_configuration(first, &configs)?;
    }
    config::set_log_device_placement(args.log_placement);
    let mut logical = config::list_logical_devices(DeviceKind::Gpu)?;
    eprintln!(
        "{} physical GPUs, {} logical GPUs",
        visible.len(),
        logical.len()
    );
    if logical.is_empty() {
        eprintln!("no GPU: running the matmul on the CPU instead");
        logical = config::list_logical_devices(DeviceKind::Cpu)?;
    }

    let mut products = Vec::new();
    for gpu in &logical {
        let _scope = anygpu::with_device(gpu)?;
        let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
        let b = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])?;
        products.push(a.matmul(&b)?);
    }
    let sum = anygpu::device("/cpu:0", || {
        let refs: Vec<&Tensor> = products.iter().collect();
        Tensor::add_n(&refs)
    })??;
    let v = sum.to_vec::<f32>()?;
    println!("[[{}, {}], [{}, {}]]", v[0], v[1], v[2], v[3]);
    Ok(())
}
