//! The flags behind `tf.config`: which GPUs are visible (`--visible`, a worker's own GPU, none
//! when the layers train on CPU:0), logical devices cut from a GPU or from CPU:0 (`--virtual`,
//! `--virtual-cpus`), memory growth, and which devices the layers go to.

use anygpu::{config, DeviceKind, LogicalDevice, LogicalDeviceConfiguration, PhysicalDevice};

use crate::args::{device_name, Args, Strategy};
use crate::distributed;
use crate::BoxError;

/// `tf.config.set_visible_devices`: `--visible`'s GPUs; under multi-worker without `--device`
/// the GPU of this worker's local rank (Horovod's recipe: set before anything starts a device,
/// so that no worker reserves the others' GPUs); and none when the layers train on CPU:0 (TF's
/// advice too: their memory is then not reserved). Returns whether the layers go to CPU:0.
pub fn set_visible(args: &Args, gpus: &[PhysicalDevice], chief: bool) -> Result<bool, BoxError> {
    if let Some(indices) = &args.visible {
        let picked = indices
            .iter()
            .map(|&i| {
                gpus.get(i)
                    .cloned()
                    .ok_or_else(|| format!("--visible {i}: there are {} physical GPUs", gpus.len()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        config::set_visible_devices(&picked, DeviceKind::Gpu)?;
    }
    let multi = args.strategy == Some(Strategy::MultiWorker);
    if multi && args.device.is_none() && args.visible.is_none() && !gpus.is_empty() {
        let mine = gpus[distributed::local_rank() % gpus.len()].clone();
        config::set_visible_devices(&[mine], DeviceKind::Gpu)?;
    }
    // With no --device and only software adapters (Mesa's llvmpipe, lavapipe: the CPU
    // rasterizing), CPU:0's native kernels are far faster, so the default goes there.
    let software_only = !gpus.is_empty()
        && config::get_visible_devices(DeviceKind::Gpu)
            .iter()
            .all(|pd| {
                config::get_device_details(pd)
                    .ok()
                    .and_then(|d| d.gpu)
                    .is_some_and(|g| g.adapter_type == "Cpu")
            });
    let cpu_split = args.split && args.virtual_cpus.is_some();
    let mirrored = args.strategy == Some(Strategy::Mirrored);
    let on_cpu = match args.device.as_deref() {
        _ if cpu_split => true,
        Some(spec) => device_name(spec)? == "/device:CPU:0",
        None => {
            let cpu_default = software_only && !args.split && !mirrored && args.r#virtual.is_none();
            if cpu_default && chief {
                println!(
                    "Every GPU is a software adapter: training on /device:CPU:0 \
                     (--device gpu:0 trains on the adapter anyway)"
                );
            }
            cpu_default
        }
    };
    if on_cpu && (!args.split || cpu_split) && args.r#virtual.is_none() {
        config::set_visible_devices(&[], DeviceKind::Gpu)?;
    }
    Ok(on_cpu)
}

/// `tf.config.set_logical_device_configuration`: `--virtual-cpus` cuts CPU:0 into logical CPUs
/// of these thread counts, `--virtual` the first visible GPU into logical GPUs of these MiB.
pub fn set_virtual_devices(args: &Args) -> Result<(), BoxError> {
    if let Some(threads) = &args.virtual_cpus {
        let cpu = config::list_physical_devices(DeviceKind::Cpu)
            .first()
            .cloned()
            .ok_or("--virtual-cpus: no CPU listed")?;
        let configs: Vec<_> = threads
            .iter()
            .map(|&n| LogicalDeviceConfiguration::new().threads(n))
            .collect();
        config::set_logical_device_configuration(&cpu, &configs)?;
    }
    if let Some(mibs) = &args.r#virtual {
        let visible = config::get_visible_devices(DeviceKind::Gpu);
        let first = visible
            .first()
            .ok_or("--virtual: there is no visible GPU to cut into logical GPUs")?;
        let configs: Vec<_> = mibs
            .iter()
            .map(|&m| LogicalDeviceConfiguration::new().memory_limit(m))
            .collect();
        config::set_logical_device_configuration(first, &configs)?;
    }
    Ok(())
}

/// `tf.config.experimental.set_memory_growth(gpu, True)` on every visible GPU (`--memory-growth`)
/// but one cut into virtual devices, which cannot grow (TensorFlow's rule).
pub fn set_memory_growth(args: &Args) -> Result<(), BoxError> {
    if !args.memory_growth {
        return Ok(());
    }
    for (i, gpu) in config::get_visible_devices(DeviceKind::Gpu)
        .iter()
        .enumerate()
    {
        if !(i == 0 && args.r#virtual.is_some()) {
            config::set_memory_growth(gpu, true)?;
        }
    }
    Ok(())
}

/// As the guide prints it: every physical GPU, and the logical ones the visible GPUs became
/// (hidden GPUs count as physical only: "2 Physical GPUs, 1 Logical GPU" after --visible 0).
pub fn print_gpus(physical: usize, logical: &[LogicalDevice]) {
    println!("{physical} Physical GPUs, {} Logical GPUs", logical.len());
    for d in logical {
        println!("  {} on {}", d.name(), adapter(d));
    }
}

/// The devices of the tutorial's three blocks: one device (`--device`, or the default); with
/// `--split` the logical GPUs, or the logical CPUs of `--virtual-cpus`, in turn.
pub fn for_layers(
    args: &Args,
    logical_gpus: &[LogicalDevice],
    on_cpu: bool,
) -> Result<Vec<LogicalDevice>, BoxError> {
    let three = |devices: &[LogicalDevice]| -> Vec<LogicalDevice> {
        (0..3).map(|i| devices[i % devices.len()].clone()).collect()
    };
    if args.split && args.virtual_cpus.is_some() {
        return Ok(three(&config::list_logical_devices("CPU")?));
    }
    if args.split && logical_gpus.is_empty() {
        println!("--split: no GPU visible; every block on /device:CPU:0");
        return Ok(vec![config::runtime().cpu()?]);
    }
    if args.split {
        return Ok(three(logical_gpus));
    }
    let multi = args.strategy == Some(Strategy::MultiWorker);
    Ok(vec![match args.device.as_deref() {
        None if on_cpu => config::runtime().cpu()?,
        // Horovod's rule: the workers on one machine take one GPU each, by local rank (the
        // only one visible, see `set_visible`).
        None if multi && !logical_gpus.is_empty() => logical_gpus[0].clone(),
        None => config::runtime().default_device()?,
        Some(spec) => config::runtime().device(&device_name(spec)?)?,
    }])
}

/// `llvmpipe (LLVM 15.0.6, 256 bits), Vulkan`: the adapter and its backend (Mesa names its
/// Vulkan and GL software drivers alike).
pub fn adapter(d: &LogicalDevice) -> String {
    match d.backend() {
        Some(b) => format!("{}, {b:?}", d.adapter_name()),
        None => d.adapter_name().to_string(),
    }
}
