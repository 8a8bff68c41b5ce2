//! Logical devices: what ops run on. A GPU's logical devices (one, or several virtual ones) share
//! one [`GpuContext`] — the adapter's wgpu `Device` and `Queue` and its command stream — and each
//! has its own capped [`Arena`].

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Weak};

pub(crate) use crate::device::context::GpuContext;
use crate::device::name::{full_name, logical_name, DeviceKind};
pub(crate) use crate::device::stream::GpuRange;
use crate::device::stream::StreamStats;
use crate::error::{Error, Result};
use crate::memory::Arena;
use crate::shader::tune::TuningDecision;

/// A logical device: TensorFlow's `LogicalDevice`, and the handle ops and tensors use.
///
/// Cheap to clone. `name()` is `/device:GPU:0`, [`LogicalDevice::full_name`] the
/// `/job:localhost/replica:0/task:0/device:GPU:0` form tensors report.
#[derive(Clone)]
pub struct LogicalDevice(pub(crate) Arc<DeviceCore>);

/// The runtime that created a device, type-erased: the device layer sits below the runtime and
/// does not name it (`runtime.rs` turns an owner back into its runtime). Weak, so that a device
/// outliving its runtime can tell it was dropped.
pub(crate) type Owner = Weak<dyn Any + Send + Sync>;

pub(crate) struct DeviceCore {
    pub(crate) kind: DeviceKind,
    pub(crate) index: usize,
    pub(crate) name: String,
    pub(crate) full_name: String,
    /// The runtime that created the device, as an [`Owner`].
    pub(crate) owner: Owner,
    pub(crate) backend: Backend,
    /// Ops placed on this device so far (`ops::run`), for `anygpu-smi`.
    pub(crate) ops_run: Arc<std::sync::atomic::AtomicU64>,
}

pub(crate) enum Backend {
    Cpu(CpuDevice),
    Gpu(GpuDevice),
    /// A GPU whose adapter failed to open or to reserve its budget: listed, never used.
    Unavailable(UnavailableGpu),
}

/// A logical CPU: its own thread pool when it was given a thread count (virtual CPUs with
/// `threads`, or `set_intra_op_parallelism_threads`), else the process-wide rayon pool.
#[derive(Default)]
pub(crate) struct CpuDevice {
    pub(crate) pool: Option<rayon::ThreadPool>,
}

impl CpuDevice {
    /// A device whose kernels run on `threads` threads of their own (`None`: the shared pool).
    pub(crate) fn new(name: &str, threads: Option<usize>) -> crate::error::Result<CpuDevice> {
        let Some(threads) = threads else {
            return Ok(CpuDevice::default());
        };
        let label = name.to_string();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(move |i| format!("anygpu {label} #{i}"))
            .build()
            .map_err(|e| {
                crate::error::Error::ResourceExhausted(format!(
                    "{threads} threads for {name} could not be started: {e}"
                ))
            })?;
        Ok(CpuDevice { pool: Some(pool) })
    }

    /// Runs `f` where this device's kernels run: on its pool, or on the calling thread with the
    /// shared pool.
    pub(crate) fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }
}

/// What is known of a GPU logical device that could not be created.
pub(crate) struct UnavailableGpu {
    /// Index of the physical GPU (after visibility) it was to be cut from.
    pub(crate) physical_index: usize,
    /// The adapter's name.
    pub(crate) adapter: String,
    /// The adapter's wgpu backend.
    pub(crate) backend: wgpu::Backend,
    /// Why it is unavailable (the driver's or the arena's error).
    pub(crate) reason: String,
}

impl UnavailableGpu {
    /// The error an op or a tensor placed on the device `full_name` gets.
    pub(crate) fn error(&self, full_name: &str) -> Error {
        Error::Unavailable(format!(
            "{full_name} ({}) is unavailable: {}",
            self.adapter, self.reason
        ))
    }
}

/// A GPU logical device: its arena on the shared adapter context.
pub(crate) struct GpuDevice {
    pub(crate) ctx: Arc<GpuContext>,
    pub(crate) arena: Arc<Arena>,
    /// Index of the physical GPU (after visibility) this device is cut from.
    pub(crate) physical_index: usize,
}

impl LogicalDevice {
    pub(crate) fn new(
        kind: DeviceKind,
        index: usize,
        owner: Owner,
        backend: Backend,
    ) -> LogicalDevice {
        LogicalDevice(Arc::new(DeviceCore {
            kind,
            index,
            name: logical_name(kind, index),
            full_name: full_name(kind, index),
            owner,
            backend,
            ops_run: Arc::default(),
        }))
    }

    /// `/device:GPU:0`.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// `/job:localhost/replica:0/task:0/device:GPU:0`.
    pub fn full_name(&self) -> &str {
        &self.0.full_name
    }

    /// `GPU` or `CPU`.
    pub fn device_type(&self) -> DeviceKind {
        self.0.kind
    }

    /// Index among the logical devices of its kind.
    pub fn index(&self) -> usize {
        self.0.index
    }

    /// The adapter's name for a GPU (`"llvmpipe (LLVM 15.0.6, 256 bits)"`), `"host CPU"` else.
    pub fn adapter_name(&self) -> &str {
        match &self.0.backend {
            Backend::Cpu(_) => "host CPU",
            Backend::Gpu(g) => &g.ctx.adapter.info.name,
            Backend::Unavailable(u) => &u.adapter,
        }
    }

    /// The wgpu backend (`Vulkan`, `Gl`, ...) of a GPU, `None` for the CPU.
    pub fn backend(&self) -> Option<wgpu::Backend> {
        match &self.0.backend {
            Backend::Cpu(_) => None,
            Backend::Gpu(g) => Some(g.ctx.adapter.info.backend),
            Backend::Unavailable(u) => Some(u.backend),
        }
    }

    /// Index of the (visible) physical GPU this logical device lives on; `None` for the CPU.
    pub fn physical_index(&self) -> Option<usize> {
        match &self.0.backend {
            Backend::Cpu(_) => None,
            Backend::Gpu(g) => Some(g.physical_index),
            Backend::Unavailable(u) => Some(u.physical_index),
        }
    }

    /// Whether ops can run here: `false` for a GPU whose adapter failed to open or to reserve
    /// its budget at initialization (see [`LogicalDevice::unavailable_reason`]).
    ///
    /// ```
    /// let rt = anygpu::Runtime::builder().build()?;
    /// assert!(rt.cpu()?.is_available());
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn is_available(&self) -> bool {
        !matches!(self.0.backend, Backend::Unavailable(_))
    }

    /// Why the device is unavailable (the driver's or the allocator's error), `None` when it is
    /// available. Ops placed on an unavailable device fail with this reason; every other
    /// device keeps working.
    pub fn unavailable_reason(&self) -> Option<&str> {
        match &self.0.backend {
            Backend::Unavailable(u) => Some(&u.reason),
            _ => None,
        }
    }

    /// The error for using an unavailable device, `None` when it is available.
    pub(crate) fn unavailable_error(&self) -> Option<Error> {
        match &self.0.backend {
            Backend::Unavailable(u) => Some(u.error(self.full_name())),
            _ => None,
        }
    }

    /// Whether this is a GPU on a software adapter (wgpu's `DeviceType::Cpu`: lavapipe,
    /// llvmpipe, WARP), which default placement passes over.
    pub fn is_software(&self) -> bool {
        self.adapter_info()
            .is_some_and(|info| info.device_type == wgpu::DeviceType::Cpu)
    }

    /// Counters of the commands recorded on this device's adapter since it was opened; `None`
    /// for the CPU. Virtual siblings share one adapter stream, so they report the same numbers.
    ///
    /// Take two readings and subtract them to see what a piece of work cost on the host:
    ///
    /// ```
    /// # fn main() -> anygpu::Result<()> {
    /// # let rt = anygpu::Runtime::builder().build()?;
    /// let gpus = rt.list_logical_devices("GPU")?;
    /// if let Some(gpu) = gpus.first() {
    ///     let before = gpu.stream_stats().unwrap_or_default();
    ///     let _s = gpu.scope();
    ///     let a = anygpu::Tensor::from_vec(vec![1.0f32; 64], &[8, 8])?;
    ///     let _b = a.matmul(&a)?;
    ///     let spent = gpu.stream_stats().unwrap_or_default() - before;
    ///     assert!(spent.dispatches >= 1);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn stream_stats(&self) -> Option<StreamStats> {
        self.gpu().map(|g| g.ctx.stats())
    }

    /// The kernel choices the autotuner made on this device's adapter in this process, in
    /// order (empty for the CPU): for each op family and shape class, the candidate picked,
    /// whether it was measured, read from the on-disk cache or is the heuristic, and the
    /// measured times. See `ANYGPU_AUTOTUNE` in the crate docs.
    pub fn tuning_decisions(&self) -> Vec<TuningDecision> {
        self.gpu()
            .map(|g| g.ctx.tuner.decisions())
            .unwrap_or_default()
    }

    /// The threads a CPU device's kernels run on, as rayon counts them where they run: the
    /// device's own pool (see [`crate::LogicalDeviceConfiguration::threads`] and
    /// [`crate::Runtime::set_intra_op_parallelism_threads`]) or the shared one (every core);
    /// 0 for a GPU.
    ///
    /// ```
    /// let rt = anygpu::Runtime::builder().build()?;
    /// assert!(rt.cpu()?.threads() >= 1);
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn threads(&self) -> usize {
        match &self.0.backend {
            Backend::Cpu(cpu) => cpu.run(rayon::current_num_threads),
            Backend::Gpu(_) | Backend::Unavailable(_) => 0,
        }
    }

    /// Runs `f` on the threads this device's kernels run on: inside a CPU's own pool, where
    /// each kernel `f` launches starts without a hand-off to the pool and back (two thread
    /// wake-ups per op otherwise); on the calling thread for a GPU or the shared pool. `f`
    /// holds one of the pool's threads until it returns, so it must not wait for other work on
    /// this device.
    pub(crate) fn run_on_own_threads<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.0.backend {
            Backend::Cpu(cpu) => cpu.run(f),
            Backend::Gpu(_) | Backend::Unavailable(_) => f(),
        }
    }

    /// Ops run on this logical device so far (what `anygpu-smi` shows).
    ///
    /// ```
    /// use anygpu::Tensor;
    /// let rt = anygpu::Runtime::builder().build()?; // kept alive while its devices are used
    /// let cpu = rt.cpu()?;
    /// let before = cpu.ops_run();
    /// let _scope = cpu.scope();
    /// let x = Tensor::from_slice_on(&[1.0f32, 2.0], &[2], &cpu)?;
    /// x.add(&x)?;
    /// assert_eq!(cpu.ops_run(), before + 1);
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn ops_run(&self) -> u64 {
        self.0.ops_run.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits until every op submitted to this device has finished (a no-op on the CPU).
    ///
    /// Benchmarks call this inside the timed region; ordinary code never needs it, since reading
    /// a tensor waits for exactly what it needs.
    pub fn synchronize(&self) -> Result<()> {
        match &self.0.backend {
            Backend::Cpu(_) | Backend::Unavailable(_) => Ok(()),
            Backend::Gpu(g) => g.ctx.wait_idle(),
        }
    }

    /// The adapter's identity (`None` for the CPU): equal for logical devices that run the
    /// same compiled kernels.
    pub(crate) fn adapter_info(&self) -> Option<&wgpu::AdapterInfo> {
        self.gpu().map(|g| &g.ctx.adapter.info)
    }

    /// Whether the device has float16 kernels: a GPU whose adapter offers `SHADER_F16` (the
    /// CPU's kernels are float32 only).
    pub fn has_f16(&self) -> bool {
        self.gpu().is_some_and(|g| g.ctx.has_f16())
    }

    pub(crate) fn gpu(&self) -> Option<&GpuDevice> {
        match &self.0.backend {
            Backend::Cpu(_) | Backend::Unavailable(_) => None,
            Backend::Gpu(g) => Some(g),
        }
    }

    /// Same device (not merely the same name: two runtimes can both have a GPU:0).
    pub fn same_device(&self, other: &LogicalDevice) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Whether both are GPU logical devices on one adapter context (virtual siblings).
    pub(crate) fn shares_context_with(&self, other: &LogicalDevice) -> bool {
        match (self.gpu(), other.gpu()) {
            (Some(a), Some(b)) => Arc::ptr_eq(&a.ctx, &b.ctx),
            _ => false,
        }
    }
}

impl PartialEq for LogicalDevice {
    fn eq(&self, other: &Self) -> bool {
        self.same_device(other)
    }
}

impl Eq for LogicalDevice {}

impl fmt::Debug for LogicalDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "LogicalDevice(name='{}', device_type='{}')",
            self.0.name, self.0.kind
        )
    }
}

impl fmt::Display for LogicalDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.name)
    }
}
