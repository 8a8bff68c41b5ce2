//! Logical devices: what ops run on. A GPU's logical devices (one, or several virtual ones) share
//! one [`GpuContext`] — the adapter's wgpu `Device` and `Queue` and its command stream — and each
//! has its own capped [`Arena`].

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use crate::device::name::{full_name, logical_name, DeviceKind};
use crate::device::physical::AdapterEntry;
use crate::error::{Error, Result};
use crate::memory::{Allocation, Arena};
use crate::ops::gpu::PipelineCache;
use crate::profiler::{self, DeviceInterval};
use crate::runtime::RuntimeShared;

/// Ops recorded before the pending command buffer is submitted without waiting.
const SUBMIT_THRESHOLD: usize = 64;

/// Dispatches timed per submission while the profiler runs (two queries each).
const TIMESTAMP_PAIRS: u32 = 256;

/// A logical device: TensorFlow's `LogicalDevice`, and the handle ops and tensors use.
///
/// Cheap to clone. `name()` is `/device:GPU:0`, [`LogicalDevice::full_name`] the
/// `/job:localhost/replica:0/task:0/device:GPU:0` form tensors report.
#[derive(Clone)]
pub struct LogicalDevice(pub(crate) Arc<DeviceCore>);

pub(crate) struct DeviceCore {
    pub(crate) kind: DeviceKind,
    pub(crate) index: usize,
    pub(crate) name: String,
    pub(crate) full_name: String,
    pub(crate) runtime: Weak<RuntimeShared>,
    pub(crate) backend: Backend,
}

pub(crate) enum Backend {
    Cpu,
    Gpu(GpuDevice),
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
        runtime: Weak<RuntimeShared>,
        backend: Backend,
    ) -> LogicalDevice {
        LogicalDevice(Arc::new(DeviceCore {
            kind,
            index,
            name: logical_name(kind, index),
            full_name: full_name(kind, index),
            runtime,
            backend,
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
            Backend::Cpu => "host CPU",
            Backend::Gpu(g) => &g.ctx.adapter.info.name,
        }
    }

    /// The wgpu backend (`Vulkan`, `Gl`, ...) of a GPU, `None` for the CPU.
    pub fn backend(&self) -> Option<wgpu::Backend> {
        match &self.0.backend {
            Backend::Cpu => None,
            Backend::Gpu(g) => Some(g.ctx.adapter.info.backend),
        }
    }

    /// Index of the (visible) physical GPU this logical device lives on; `None` for the CPU.
    pub fn physical_index(&self) -> Option<usize> {
        match &self.0.backend {
            Backend::Cpu => None,
            Backend::Gpu(g) => Some(g.physical_index),
        }
    }

    /// Counters of the commands recorded on this device's adapter since it was opened; `None`
    /// for the CPU. Virtual siblings share one adapter stream, so they report the same numbers.
    ///
    /// Take two readings and subtract them to see what a piece of work cost on the host:
    ///
    /// ```
    /// # fn main() -> anygpu::Result<()> {
    /// # let rt = anygpu::Runtime::builder().build()?;
    /// let gpus = rt.list_logical_devices(anygpu::KindFilter::Gpu)?;
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

    /// Waits until every op submitted to this device has finished (a no-op on the CPU).
    ///
    /// Benchmarks call this inside the timed region; ordinary code never needs it, since reading
    /// a tensor waits for exactly what it needs.
    pub fn synchronize(&self) -> Result<()> {
        match &self.0.backend {
            Backend::Cpu => Ok(()),
            Backend::Gpu(g) => g.ctx.wait_idle(),
        }
    }

    /// The adapter's identity (`None` for the CPU): equal for logical devices that run the
    /// same compiled kernels.
    pub(crate) fn adapter_info(&self) -> Option<&wgpu::AdapterInfo> {
        self.gpu().map(|g| &g.ctx.adapter.info)
    }

    pub(crate) fn gpu(&self) -> Option<&GpuDevice> {
        match &self.0.backend {
            Backend::Cpu => None,
            Backend::Gpu(g) => Some(g),
        }
    }

    pub(crate) fn runtime(&self) -> Option<Arc<RuntimeShared>> {
        self.0.runtime.upgrade()
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

/// Whether `adapter` gets the kernels tuned for software adapters: its type, overridden by
/// `ANYGPU_KERNEL_CLASS=software|gpu` (for measuring one class's kernels on the other's
/// hardware; other values are ignored with a warning).
fn kernel_class(adapter: &wgpu::AdapterInfo) -> bool {
    let software = adapter.device_type == wgpu::DeviceType::Cpu;
    match std::env::var("ANYGPU_KERNEL_CLASS").as_deref() {
        Err(_) => software,
        Ok("software") => true,
        Ok("gpu") => false,
        Ok(other) => {
            log::warn!("ANYGPU_KERNEL_CLASS={other:?} ignored: use software or gpu");
            software
        }
    }
}

/// What an adapter's command stream has recorded: [`LogicalDevice::stream_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Compute dispatches recorded.
    pub dispatches: u64,
    /// Command buffers submitted to the queue.
    pub submits: u64,
    /// Host time spent recording dispatches (parameters, bind group, pass), in nanoseconds.
    pub record_nanos: u64,
}

impl std::ops::Sub for StreamStats {
    type Output = StreamStats;

    /// The work done between two readings (saturating, so readings in the wrong order give 0).
    fn sub(self, earlier: StreamStats) -> StreamStats {
        StreamStats {
            dispatches: self.dispatches.saturating_sub(earlier.dispatches),
            submits: self.submits.saturating_sub(earlier.submits),
            record_nanos: self.record_nanos.saturating_sub(earlier.record_nanos),
        }
    }
}

/// Atomic counters behind [`StreamStats`].
#[derive(Default)]
struct StreamCounters {
    dispatches: AtomicU64,
    submits: AtomicU64,
    record_nanos: AtomicU64,
}

/// One adapter opened for compute: wgpu `Device` + `Queue`, the pipeline cache, and the pending
/// command stream shared by the adapter's logical devices.
pub(crate) struct GpuContext {
    pub(crate) adapter: AdapterEntry,
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) pipelines: PipelineCache,
    /// Whether kernels are picked for a software adapter (few wide cores, loads are gathers)
    /// rather than for a GPU: the adapter's type, unless `ANYGPU_KERNEL_CLASS` says otherwise.
    pub(crate) software_kernels: bool,
    /// Name used in messages: the first logical device on this adapter.
    pub(crate) label: String,
    stream: Mutex<Stream>,
    /// The first error wgpu reported outside an error scope, surfaced by the next wait.
    device_error: Arc<Mutex<Option<String>>>,
    counters: StreamCounters,
}

/// The pending command encoder and the uniform ring its dispatches take parameters from.
struct Stream {
    encoder: Option<wgpu::CommandEncoder>,
    recorded: usize,
    params: wgpu::Buffer,
    params_slot: u64,
    params_slots: u64,
    slot_size: u64,
    /// Timestamp queries around dispatches, made on first use while the profiler runs.
    timestamps: Option<Timestamps>,
}

/// The query set the profiler's dispatches write their begin and end times into, and the
/// kernels waiting for the next submission to be resolved and read.
struct Timestamps {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// (op, kernel) of query pair `i` (queries `2i` and `2i + 1`).
    pending: Vec<(Option<u64>, &'static str)>,
}

impl Timestamps {
    fn new(device: &wgpu::Device) -> Timestamps {
        let bytes = u64::from(TIMESTAMP_PAIRS) * 2 * 8;
        Timestamps {
            queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("anygpu profiler timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: TIMESTAMP_PAIRS * 2,
            }),
            resolve: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("anygpu profiler resolve"),
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            readback: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("anygpu profiler readback"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            pending: Vec::new(),
        }
    }
}

/// A tensor's bytes on the GPU, as a binding range.
#[derive(Clone, Copy)]
pub(crate) struct GpuRange<'a> {
    pub(crate) buffer: &'a wgpu::Buffer,
    pub(crate) offset: u64,
    pub(crate) size: u64,
}

impl<'a> GpuRange<'a> {
    pub(crate) fn of(alloc: &'a Allocation) -> Option<GpuRange<'a>> {
        Some(GpuRange {
            buffer: alloc.buffer()?,
            offset: alloc.offset(),
            size: alloc.size(),
        })
    }
}

impl GpuContext {
    /// Opens `adapter` with its own limits and the optional features worth having.
    pub(crate) fn open(adapter: AdapterEntry, label: String) -> Result<Arc<GpuContext>> {
        let wanted =
            wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY;
        let (device, queue) =
            pollster::block_on(adapter.adapter.request_device(&wgpu::DeviceDescriptor {
                label: Some(&label),
                required_features: adapter.features & wanted,
                // Without this a device gets wgpu's defaults (128 MiB bindings, 256 MiB buffers)
                // rather than what the adapter can do.
                required_limits: adapter.limits.clone(),
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            }))
            .map_err(|e| Error::Gpu {
                device: label.clone(),
                message: format!("request_device failed: {e}"),
            })?;
        let device_error = Arc::new(Mutex::new(None::<String>));
        {
            let sink = Arc::clone(&device_error);
            let name = label.clone();
            // wgpu's default handler panics; we turn the error into a Result at the next wait.
            device.on_uncaptured_error(Arc::new(move |err: wgpu::Error| {
                log::error!("wgpu error on {name}: {err}");
                let mut slot = sink.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert_with(|| err.to_string());
            }));
        }
        let slot_size = u64::from(adapter.limits.min_uniform_buffer_offset_alignment).max(256);
        let params_slots = 1024;
        let params = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("anygpu params ring"),
            size: slot_size * params_slots,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let pipelines = PipelineCache::new(&device, &adapter);
        let software_kernels = kernel_class(&adapter.info);
        Ok(Arc::new(GpuContext {
            adapter,
            software_kernels,
            device,
            queue,
            pipelines,
            label,
            stream: Mutex::new(Stream {
                encoder: None,
                recorded: 0,
                params,
                params_slot: 0,
                params_slots,
                slot_size,
                timestamps: None,
            }),
            device_error,
            counters: StreamCounters::default(),
        }))
    }

    fn stats(&self) -> StreamStats {
        StreamStats {
            dispatches: self.counters.dispatches.load(Ordering::Relaxed),
            submits: self.counters.submits.load(Ordering::Relaxed),
            record_nanos: self.counters.record_nanos.load(Ordering::Relaxed),
        }
    }

    fn stream(&self) -> MutexGuard<'_, Stream> {
        // Stream state is a pending encoder and counters; a panic mid-record leaves at worst an
        // encoder with fewer commands, which is still valid to submit or drop.
        self.stream.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_error(&self) -> Result<()> {
        let mut slot = self.device_error.lock().unwrap_or_else(|e| e.into_inner());
        match slot.take() {
            Some(message) => Err(Error::Gpu {
                device: self.label.clone(),
                message,
            }),
            None => Ok(()),
        }
    }

    /// Submits what is pending, without waiting, unless the profiler timed some of it: then it
    /// waits, reads the timestamps and hands them to the profiler.
    fn submit(&self, stream: &mut Stream) -> Option<wgpu::SubmissionIndex> {
        let mut encoder = stream.encoder.take()?;
        stream.recorded = 0;
        stream.params_slot = 0;
        self.counters.submits.fetch_add(1, Ordering::Relaxed);
        let timed = stream.timestamps.as_mut().filter(|t| !t.pending.is_empty());
        let Some(timed) = timed else {
            return Some(self.queue.submit([encoder.finish()]));
        };
        let pairs = timed.pending.len() as u32;
        let bytes = u64::from(pairs) * 16;
        encoder.resolve_query_set(&timed.queries, 0..pairs * 2, &timed.resolve, 0);
        encoder.copy_buffer_to_buffer(&timed.resolve, 0, &timed.readback, 0, bytes);
        let submitted = Instant::now();
        let index = self.queue.submit([encoder.finish()]);
        let kernels = std::mem::take(&mut timed.pending);
        if let Err(e) = self.read_timestamps(timed, index.clone(), submitted, &kernels) {
            log::warn!(
                "profiler: timestamps of {pairs} kernels on {} lost: {e}",
                self.label
            );
        }
        Some(index)
    }

    /// Waits for `index`, reads the timestamps of `kernels` and records them.
    fn read_timestamps(
        &self,
        timed: &Timestamps,
        index: wgpu::SubmissionIndex,
        submitted: Instant,
        kernels: &[(Option<u64>, &'static str)],
    ) -> Result<()> {
        let bytes = kernels.len() as u64 * 16;
        let (tx, rx) = std::sync::mpsc::channel();
        timed
            .readback
            .map_async(wgpu::MapMode::Read, ..bytes, move |r| {
                let _ = tx.send(r);
            });
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: None,
            })
            .map_err(|e| self.gpu_error(format!("waiting for the device failed: {e}")))?;
        let finished = Instant::now();
        rx.recv()
            .map_err(|_| self.gpu_error("the map callback never ran".into()))?
            .map_err(|e| self.gpu_error(format!("mapping the timestamps failed: {e}")))?;
        let ticks: Vec<u64> = {
            let view = timed
                .readback
                .get_mapped_range(..bytes)
                .map_err(|e| self.gpu_error(format!("reading the timestamps failed: {e}")))?;
            bytemuck::pod_collect_to_vec(&view[..])
        };
        timed.readback.unmap();
        let period = f64::from(self.queue.get_timestamp_period());
        let intervals: Vec<DeviceInterval> = kernels
            .iter()
            .zip(ticks.chunks_exact(2))
            .map(|(&(op, kernel), t)| DeviceInterval {
                op,
                kernel,
                begin_ns: (t[0] as f64 * period) as u64,
                end_ns: (t[1].max(t[0]) as f64 * period) as u64,
            })
            .collect();
        let short = self
            .label
            .rsplit_once("/device:")
            .map_or(self.label.as_str(), |(_, d)| d);
        let track = format!("{short} ({})", self.adapter.info.name);
        profiler::record_kernels(&track, submitted, finished, &intervals);
        Ok(())
    }

    /// A query pair for the dispatch of `kernel` being recorded, when the profiler runs and the
    /// adapter has timestamp queries; submits first when every pair is taken.
    fn timestamp_pair(&self, stream: &mut Stream, kernel: &'static str) -> Option<u32> {
        if !profiler::is_running() || !self.has_timestamps() {
            return None;
        }
        let full = |t: &Timestamps| t.pending.len() as u32 == TIMESTAMP_PAIRS;
        if stream.timestamps.as_ref().is_some_and(full) {
            self.submit(stream);
        }
        let t = stream
            .timestamps
            .get_or_insert_with(|| Timestamps::new(&self.device));
        t.pending.push((profiler::current_op(), kernel));
        Some(t.pending.len() as u32 - 1)
    }

    /// Whether the profiler can time this adapter's kernels on the device.
    pub(crate) fn has_timestamps(&self) -> bool {
        self.device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY)
    }

    /// Records one command into the pending encoder (created on demand) and submits, without
    /// waiting, once [`SUBMIT_THRESHOLD`] commands are pending.
    fn record(&self, stream: &mut Stream, command: impl FnOnce(&mut wgpu::CommandEncoder)) {
        let encoder = stream.encoder.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
        });
        command(encoder);
        stream.recorded += 1;
        if stream.recorded >= SUBMIT_THRESHOLD {
            self.submit(stream);
        }
    }

    /// Records one compute dispatch: `params` (a `#[repr(C)]` struct's bytes) go to binding 0 as a
    /// uniform, `tensors` to bindings 1.. as read-write storage ranges.
    pub(crate) fn dispatch(
        &self,
        pipeline: &crate::ops::gpu::Pipeline,
        params: &[u8],
        tensors: &[GpuRange<'_>],
        workgroups: [u32; 3],
    ) {
        let start = Instant::now();
        let mut stream = self.stream();
        // First, since it may submit, which recycles the params ring.
        let timed = self.timestamp_pair(&mut stream, pipeline.name);
        if stream.params_slot == stream.params_slots {
            // Every slot is spoken for by commands not yet submitted; submit them first so the
            // slots can be rewritten (queue writes are ordered after earlier submissions).
            self.submit(&mut stream);
        }
        let slot_offset = stream.params_slot * stream.slot_size;
        stream.params_slot += 1;
        let mut padded = [0u8; 256];
        let len = params.len().min(256);
        padded[..len].copy_from_slice(&params[..len]);
        self.queue
            .write_buffer(&stream.params, slot_offset, &padded);
        let mut entries = Vec::with_capacity(tensors.len() + 1);
        entries.push(wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &stream.params,
                offset: slot_offset,
                size: wgpu::BufferSize::new(256),
            }),
        });
        debug_assert_eq!(
            tensors.len(),
            pipeline.bindings.len(),
            "tensors for the kernel's bindings"
        );
        for (t, &binding) in tensors.iter().zip(&pipeline.bindings) {
            entries.push(wgpu::BindGroupEntry {
                binding,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: t.buffer,
                    offset: t.offset,
                    size: wgpu::BufferSize::new(t.size),
                }),
            });
        }
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.layout,
            entries: &entries,
        });
        let mut encoder = stream.encoder.take().unwrap_or_else(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
        });
        {
            let timestamp_writes = timed.zip(stream.timestamps.as_ref()).map(|(pair, t)| {
                wgpu::ComputePassTimestampWrites {
                    query_set: &t.queries,
                    beginning_of_pass_write_index: Some(pair * 2),
                    end_of_pass_write_index: Some(pair * 2 + 1),
                }
            });
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes,
            });
            pass.set_pipeline(&pipeline.pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(workgroups[0], workgroups[1], workgroups[2]);
        }
        stream.encoder = Some(encoder);
        stream.recorded += 1;
        if stream.recorded >= SUBMIT_THRESHOLD {
            self.submit(&mut stream);
        }
        drop(stream);
        self.counters.dispatches.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.counters
            .record_nanos
            .fetch_add(nanos, Ordering::Relaxed);
    }

    /// Records a copy between two device ranges (virtual siblings share the context).
    pub(crate) fn copy(&self, src: GpuRange<'_>, dst: GpuRange<'_>, bytes: u64) {
        let mut stream = self.stream();
        self.record(&mut stream, |encoder| {
            encoder.copy_buffer_to_buffer(src.buffer, src.offset, dst.buffer, dst.offset, bytes)
        });
    }

    /// Records a zero fill of `bytes` (a multiple of 4) at `dst`.
    pub(crate) fn clear(&self, dst: GpuRange<'_>, bytes: u64) {
        let mut stream = self.stream();
        self.record(&mut stream, |encoder| {
            encoder.clear_buffer(dst.buffer, dst.offset, Some(bytes))
        });
    }

    /// Writes host bytes into a device range, after everything recorded so far.
    pub(crate) fn upload(&self, dst: GpuRange<'_>, bytes: &[u8]) {
        let mut stream = self.stream();
        // Queue writes land before the commands of the next submission. Pending commands may
        // still use this memory under a tensor that was dropped since, so they go first.
        self.submit(&mut stream);
        let len = bytes.len() as u64 / wgpu::COPY_BUFFER_ALIGNMENT * wgpu::COPY_BUFFER_ALIGNMENT;
        if len > 0 {
            self.queue
                .write_buffer(dst.buffer, dst.offset, &bytes[..len as usize]);
        }
        let tail = &bytes[len as usize..];
        if !tail.is_empty() {
            let mut padded = [0u8; 4];
            padded[..tail.len()].copy_from_slice(tail);
            self.queue
                .write_buffer(dst.buffer, dst.offset + len, &padded);
        }
    }

    /// Reads `bytes` bytes of a device range back to the host, waiting for the commands that
    /// produce them (and, the queue being in order, those before), and hands the mapped bytes
    /// to `consume`: the one host-side touch of the data (a reduction sums straight from it).
    pub(crate) fn read_with<R>(
        &self,
        src: GpuRange<'_>,
        bytes: u64,
        consume: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        let padded = bytes.div_ceil(wgpu::COPY_BUFFER_ALIGNMENT) * wgpu::COPY_BUFFER_ALIGNMENT;
        if padded == 0 {
            return Ok(consume(&[]));
        }
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("anygpu readback"),
            size: padded,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let submission = {
            let mut stream = self.stream();
            self.record(&mut stream, |encoder| {
                encoder.copy_buffer_to_buffer(src.buffer, src.offset, &staging, 0, padded)
            });
            self.submit(&mut stream)
        };
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            // The receiver waits below; if it is gone there is no one to tell.
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: submission,
                timeout: None,
            })
            .map_err(|e| self.gpu_error(format!("waiting for the device failed: {e}")))?;
        self.take_error()?;
        rx.recv()
            .map_err(|_| self.gpu_error("the map callback never ran".into()))?
            .map_err(|e| self.gpu_error(format!("mapping the readback buffer failed: {e}")))?;
        let view = staging
            .get_mapped_range(..)
            .map_err(|e| self.gpu_error(format!("reading the readback buffer failed: {e}")))?;
        let out = consume(&view[..bytes as usize]);
        drop(view);
        staging.unmap();
        Ok(out)
    }

    /// Submits the recorded commands without waiting, so the device works while the host
    /// goes on (before waiting on another device, for instance).
    pub(crate) fn flush(&self) {
        let mut stream = self.stream();
        self.submit(&mut stream);
    }

    /// Submits what is pending and waits for the queue to drain.
    pub(crate) fn wait_idle(&self) -> Result<()> {
        let submission = {
            let mut stream = self.stream();
            self.submit(&mut stream)
        };
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: submission,
                timeout: None,
            })
            .map_err(|e| self.gpu_error(format!("waiting for the device failed: {e}")))?;
        self.take_error()
    }

    fn gpu_error(&self, message: String) -> Error {
        Error::Gpu {
            device: self.label.clone(),
            message,
        }
    }
}
