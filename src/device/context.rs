//! One adapter opened for compute: the wgpu device and queue, the pipeline cache, and the
//! command stream its logical devices share; uploads, copies, readbacks and waits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::device::physical::AdapterEntry;
use crate::device::stream::GpuRange;
use crate::device::stream::{
    default_first_submit, Stream, StreamCounters, StreamStats, Timestamps,
};
use crate::error::{Error, Result};
use crate::profiler::{self, DeviceInterval};
use crate::shader::coop::CoopSupport;
use crate::shader::pipelines::default_compile_threads;
use crate::shader::tune::{TuneConfig, Tuner};
use crate::shader::{grid_1d, Kernel, Pipeline, PipelineCache, ShaderFamily};

/// Whether `adapter` gets the kernels tuned for software adapters: its type, overridden by
/// `ANYGPU_KERNEL_CLASS=software|gpu` (for measuring one class's kernels on the other's
/// hardware; other values are ignored with a warning).
fn kernel_class(adapter: &wgpu::AdapterInfo, setting: Option<&str>) -> bool {
    let software = adapter.device_type == wgpu::DeviceType::Cpu;
    match setting {
        None => software,
        Some("software") => true,
        Some("gpu") => false,
        Some(other) => {
            log::warn!("ANYGPU_KERNEL_CLASS={other:?} ignored: use software or gpu");
            software
        }
    }
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
    /// How long a host wait on the device may take (`ANYGPU_WAIT_TIMEOUT_S`); `None`: no limit.
    wait_timeout: Option<std::time::Duration>,
    stream: Mutex<Stream>,
    /// Profiled submissions whose timestamps are still to be read: queued under the stream's
    /// lock, read after it is released (a wait under it would stall every thread recording on
    /// this adapter, and a hung device every one of them for good).
    timed: Mutex<Vec<TimedSubmission>>,
    /// The first error wgpu reported outside an error scope, surfaced by the next wait.
    device_error: Arc<Mutex<Option<String>>>,
    counters: StreamCounters,
    /// The adapter's kernel choices (autotuning).
    pub(crate) tuner: Tuner,
    /// Whether the tensor-core matrix products run here, and their self-check.
    pub(crate) coop: CoopSupport,
    /// Regions released by this adapter's arenas: the bind-group cache starts over when it moves.
    regions_released: Arc<AtomicU64>,
    /// A small buffer outside the arenas that kernels fill and then read as a uniform buffer
    /// (`matmul_ubo8`'s packed B): wgpu refuses a uniform binding of an arena buffer that the
    /// same dispatch also binds as read-write storage. A kernel sequence that uses it holds the
    /// lock while it records (threads of virtual devices share the adapter), and commands run
    /// in the order recorded, so one per adapter is enough.
    pub(crate) uniform_scratch: Mutex<wgpu::Buffer>,
    /// The last table of work a kernel read from a buffer of its own
    /// ([`GpuContext::with_table`]), and its words.
    table: Mutex<Option<(Vec<u32>, wgpu::Buffer)>>,
}

/// A profiled submission: its timestamps, copied into a buffer of their own, and what they
/// time.
struct TimedSubmission {
    readback: wgpu::Buffer,
    index: wgpu::SubmissionIndex,
    submitted: Instant,
    /// (op, kernel) of query pair `i`.
    kernels: Vec<(Option<u64>, &'static str)>,
}

/// A read back started by [`GpuContext::read_begin`]: its staging buffer (none for zero
/// bytes) and the submission that fills it.
pub(crate) struct PendingRead {
    staging: Option<wgpu::Buffer>,
    submission: Option<wgpu::SubmissionIndex>,
    /// The stream's number of that submission (see `Batching::drained`).
    number: u64,
    bytes: u64,
    /// The map's outcome once its callback ran, after [`GpuContext::read_try`] asked for it.
    mapping: Option<MapSlot>,
}

/// Where a staging buffer's map callback leaves its outcome.
type MapSlot = Arc<Mutex<Option<std::result::Result<(), wgpu::BufferAsyncError>>>>;

/// Asks for `staging` to be mapped; the outcome lands in the returned slot.
fn map_into_slot(staging: &wgpu::Buffer) -> MapSlot {
    let slot: MapSlot = Arc::default();
    let theirs = Arc::clone(&slot);
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        *theirs.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    });
    slot
}

/// How long a finished read waits for its map callback to run (see `read_finish`).
const MAP_CALLBACK_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Bytes of [`GpuContext::uniform_scratch`].
pub(crate) const UNIFORM_SCRATCH_BYTES: u64 = 32 << 10;

impl GpuContext {
    /// Opens `adapter` with its own limits and the optional features worth having.
    pub(crate) fn open(
        adapter: AdapterEntry,
        label: String,
        tune: TuneConfig,
    ) -> Result<Arc<GpuContext>> {
        let wanted =
            wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY;
        let request = |extra: wgpu::Features| {
            pollster::block_on(adapter.adapter.request_device(&wgpu::DeviceDescriptor {
                label: Some(&label),
                required_features: (adapter.features & wanted) | extra,
                // Without this a device gets wgpu's defaults (128 MiB bindings, 256 MiB buffers)
                // rather than what the adapter can do.
                required_limits: adapter.limits.clone(),
                experimental_features: CoopSupport::experimental(extra),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            }))
        };
        // Cooperative matrices (an experimental wgpu feature) only where our kernels can use
        // them; a device that refuses them opens without.
        let coop_features = CoopSupport::wanted(&adapter.adapter, adapter.features);
        let opened = match request(coop_features) {
            Err(e) if !coop_features.is_empty() => {
                log::warn!("{label}: opening with cooperative matrices failed ({e}); without");
                request(wgpu::Features::empty())
            }
            other => other,
        };
        let (device, queue) = opened.map_err(|e| Error::Gpu {
            device: label.clone(),
            message: format!("request_device failed: {e}"),
        })?;
        let device_error = Arc::new(Mutex::new(None::<String>));
        {
            let sink = Arc::clone(&device_error);
            let name = label.clone();
            // wgpu's default handler panics; we turn the error into a Result at the next wait.
            device.on_uncaptured_error(Arc::new(move |err: wgpu::Error| {
                let message = describe(&err);
                log::error!("wgpu error on {name}: {message}");
                let mut slot = sink.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert(message);
            }));
        }
        let compile_threads = tune
            .compile_threads
            .unwrap_or_else(|| default_compile_threads(&adapter.info));
        let pipelines =
            PipelineCache::new(&device, adapter.features, &adapter.limits, compile_threads);
        let software_kernels = kernel_class(&adapter.info, tune.kernel_class.as_deref());
        let stream = Stream::new(
            &device,
            &adapter.limits,
            tune.first_submit
                .unwrap_or_else(|| default_first_submit(&adapter.info)),
        );
        let wait_timeout = tune.wait_timeout;
        let tuner = Tuner::new(tune, &adapter.info);
        let coop = CoopSupport::new(&adapter.adapter, device.features());
        let uniform_scratch = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("anygpu uniform scratch"),
            size: UNIFORM_SCRATCH_BYTES,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::UNIFORM,
            mapped_at_creation: false,
        });
        Ok(Arc::new(GpuContext {
            tuner,
            coop,
            adapter,
            software_kernels,
            device,
            queue,
            pipelines,
            label,
            wait_timeout,
            stream: Mutex::new(stream),
            timed: Mutex::new(Vec::new()),
            device_error,
            counters: StreamCounters::default(),
            regions_released: Arc::new(AtomicU64::new(0)),
            uniform_scratch: Mutex::new(uniform_scratch),
            table: Mutex::new(None),
        }))
    }

    /// The pipeline for `kernel`, compiled on first use (and its file's other kernels compiled
    /// ahead while the tuner measures: they are its next candidates).
    pub(crate) fn pipeline(&self, kernel: Kernel, device_name: &str) -> Result<Arc<Pipeline>> {
        self.pipelines
            .get(kernel, device_name, self.tuner.measuring())
    }

    /// The counter this adapter's arenas bump when they release a region.
    pub(crate) fn regions_released(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.regions_released)
    }

    pub(crate) fn stats(&self) -> StreamStats {
        let compile = self.pipelines.stats();
        StreamStats {
            pipelines_compiled: compile.compiled,
            compile_nanos: compile.wait_nanos,
            ..self.counters.read()
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

    /// Submits what is pending, without waiting. Timestamps the profiler took are copied into
    /// a buffer of their own and queued for [`GpuContext::read_timed`], which the public entry
    /// points call once the stream's lock is released.
    fn submit(&self, stream: &mut Stream) -> Option<wgpu::SubmissionIndex> {
        stream.end_pass();
        let mut encoder = stream.encoder.take()?;
        stream.batching.count_submission();
        stream.params.flush(&self.queue);
        self.counters.submits.fetch_add(1, Ordering::Relaxed);
        let timed = stream.timestamps.as_mut().filter(|t| !t.pending.is_empty());
        let Some(timed) = timed else {
            return Some(self.queue.submit([encoder.finish()]));
        };
        let pairs = timed.pending.len() as u32;
        let bytes = u64::from(pairs) * 16;
        // A buffer per submission: the next one may resolve into `resolve` again before this
        // one's timestamps are read.
        let readback = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("anygpu profiler readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        encoder.resolve_query_set(&timed.queries, 0..pairs * 2, &timed.resolve, 0);
        encoder.copy_buffer_to_buffer(&timed.resolve, 0, &readback, 0, bytes);
        let submitted = Instant::now();
        let index = self.queue.submit([encoder.finish()]);
        let kernels = std::mem::take(&mut timed.pending);
        self.timed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(TimedSubmission {
                readback,
                index: index.clone(),
                submitted,
                kernels,
            });
        Some(index)
    }

    /// Waits for the profiled submissions queued so far and hands their timestamps to the
    /// profiler (the profiler's promise: each submission is waited for, so the step is slower
    /// and its kernels are not). Call with the stream's lock released.
    fn read_timed(&self) {
        let queued = std::mem::take(&mut *self.timed.lock().unwrap_or_else(|e| e.into_inner()));
        for t in queued {
            if let Err(e) = self.read_timestamps(&t) {
                log::warn!(
                    "profiler: timestamps of {} kernels on {} lost: {e}",
                    t.kernels.len(),
                    self.label
                );
            }
        }
    }

    /// Waits for `t`'s submission, reads its timestamps and records them.
    fn read_timestamps(&self, t: &TimedSubmission) -> Result<()> {
        let (submitted, kernels) = (t.submitted, &t.kernels);
        let bytes = kernels.len() as u64 * 16;
        let (tx, rx) = std::sync::mpsc::channel();
        t.readback
            .map_async(wgpu::MapMode::Read, ..bytes, move |r| {
                let _ = tx.send(r);
            });
        self.wait_for(Some(t.index.clone()), "reading the kernels' timestamps")?;
        let finished = Instant::now();
        rx.recv()
            .map_err(|_| self.gpu_error("the map callback never ran".into()))?
            .map_err(|e| self.gpu_error(format!("mapping the timestamps failed: {e}")))?;
        let ticks: Vec<u64> = {
            let view = t
                .readback
                .get_mapped_range(..bytes)
                .map_err(|e| self.gpu_error(format!("reading the timestamps failed: {e}")))?;
            bytemuck::pod_collect_to_vec(&view[..])
        };
        t.readback.unmap();
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
        if stream.timestamps.as_ref().is_some_and(Timestamps::is_full) {
            self.submit(stream);
        }
        let t = stream
            .timestamps
            .get_or_insert_with(|| Timestamps::new(&self.device));
        t.pending.push((profiler::current_op(), kernel));
        Some(t.pending.len() as u32 - 1)
    }

    /// Whether the device was opened with float16 in shaders.
    pub(crate) fn has_f16(&self) -> bool {
        self.device.features().contains(wgpu::Features::SHADER_F16)
    }

    /// Whether the profiler can time this adapter's kernels on the device.
    pub(crate) fn has_timestamps(&self) -> bool {
        self.device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY)
    }

    /// Records one command (not a dispatch) into the pending encoder and submits, without
    /// waiting, once the stream's threshold of commands is pending (see `stream::FIRST_SUBMIT`).
    fn record(&self, stream: &mut Stream, command: impl FnOnce(&mut wgpu::CommandEncoder)) {
        command(stream.encoder(&self.device));
        self.recorded_one(stream);
    }

    fn recorded_one(&self, stream: &mut Stream) {
        if stream.batching.count_command() {
            self.submit(stream);
        }
    }

    /// Records one compute dispatch: `params` (a `#[repr(C)]` struct's bytes) go to binding 0 as a
    /// uniform, `tensors` to the pipeline's storage bindings. Consecutive dispatches share one
    /// compute pass, except under the profiler, which times each in a pass of its own.
    pub(crate) fn dispatch(
        &self,
        pipeline: &Pipeline,
        params: &[u8],
        tensors: &[GpuRange<'_>],
        workgroups: [u32; 3],
    ) {
        debug_assert_eq!(
            tensors.len(),
            pipeline.bindings.len(),
            "tensors for the kernel's bindings"
        );
        let start = Instant::now();
        let mut guard = self.stream();
        let stream = &mut *guard;
        if stream.params.is_full() {
            // Every slot is spoken for by commands not yet submitted.
            self.submit(stream);
        }
        // Before the params slot is taken: it may submit, which starts the ring over.
        let timed = self.timestamp_pair(stream, pipeline.name);
        let offset = stream.params.push(params);
        let (group, hit) = stream.bind_groups.get(
            &self.device,
            &stream.params.buffer,
            &pipeline.layout,
            &pipeline.bindings,
            tensors,
            &self.regions_released,
        );
        let [x, y, z] = workgroups;
        match timed {
            Some(pair) => {
                stream.end_pass();
                let encoder = stream.encoder.get_or_insert_with(|| {
                    self.device
                        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
                });
                let timestamp_writes =
                    stream
                        .timestamps
                        .as_ref()
                        .map(|t| wgpu::ComputePassTimestampWrites {
                            query_set: &t.queries,
                            beginning_of_pass_write_index: Some(pair * 2),
                            end_of_pass_write_index: Some(pair * 2 + 1),
                        });
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes,
                });
                pass.set_pipeline(&pipeline.pipeline);
                pass.set_bind_group(0, &group, &[offset]);
                pass.dispatch_workgroups(x, y, z);
            }
            None => {
                if stream.pass.is_none() {
                    let encoder = stream.encoder.get_or_insert_with(|| {
                        self.device
                            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
                    });
                    let pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: None,
                        timestamp_writes: None,
                    });
                    // The pass locks the encoder until it is dropped; `Stream` drops it before
                    // any other use of the encoder.
                    stream.pass = Some(pass.forget_lifetime());
                }
                if let Some(pass) = stream.pass.as_mut() {
                    pass.set_pipeline(&pipeline.pipeline);
                    pass.set_bind_group(0, &group, &[offset]);
                    pass.dispatch_workgroups(x, y, z);
                }
            }
        }
        self.recorded_one(stream);
        drop(guard);
        self.read_timed();
        self.counters.dispatches.fetch_add(1, Ordering::Relaxed);
        if hit {
            self.counters
                .bind_group_hits
                .fetch_add(1, Ordering::Relaxed);
        }
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
        drop(stream);
        self.read_timed();
    }

    /// Records a copy of `len` 4-byte words from word `src_offset` of `src` to word
    /// `dst_offset` of `dst`, two ranges of one buffer, by a kernel: wgpu refuses
    /// `copy_buffer_to_buffer` within a buffer, and arena tensors share one. `device_name` is
    /// the logical device's, for errors.
    ///
    /// # Errors
    /// The kernel's pipeline fails to build.
    pub(crate) fn copy_within(
        &self,
        device_name: &str,
        (src, src_offset): (GpuRange<'_>, usize),
        (dst, dst_offset): (GpuRange<'_>, usize),
        len: usize,
    ) -> Result<()> {
        /// `shaders/elementwise.wgsl`'s params as `copy_range` reads them.
        #[repr(C)]
        #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
        struct CopyParams {
            len: u32,
            src_offset: u32,
            _op: u32,
            dst_offset: u32,
            _alpha: f32,
        }
        const COPY_RANGE: Kernel = Kernel::new(ShaderFamily::Elementwise, "copy_range");
        // Word counts and offsets within a binding (< 4 GiB) fit in u32.
        let params = CopyParams {
            len: len as u32,
            src_offset: src_offset as u32,
            _op: 0,
            dst_offset: dst_offset as u32,
            _alpha: 0.0,
        };
        let pipeline = self.pipeline(COPY_RANGE, device_name)?;
        let params = bytemuck::bytes_of(&params);
        self.dispatch(&pipeline, params, &[src, dst], grid_1d(len, 256));
        Ok(())
    }

    /// Records a zero fill of `bytes` (a multiple of 4) at `dst`.
    pub(crate) fn clear(&self, dst: GpuRange<'_>, bytes: u64) {
        let mut stream = self.stream();
        self.record(&mut stream, |encoder| {
            encoder.clear_buffer(dst.buffer, dst.offset, Some(bytes))
        });
        drop(stream);
        self.read_timed();
    }

    /// Runs `record` with a storage buffer outside the arenas holding `words`, a kernel's table
    /// of work (`to_f16_table`'s), for the dispatches it records. One buffer per adapter, kept
    /// while its size fits, so the kernel's bind group stays cached; new words are uploaded
    /// after everything recorded so far (the dispatches that read the old ones). The table
    /// stays locked while `record` runs, so another thread's table cannot come between its
    /// upload and its dispatches.
    pub(crate) fn with_table<R>(
        &self,
        words: &[u32],
        record: impl FnOnce(GpuRange<'_>) -> Result<R>,
    ) -> Result<R> {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let bytes: &[u8] = bytemuck::cast_slice(words);
        // Whole 256-byte blocks: a table a little longer than the last fits the same buffer.
        let size = (bytes.len() as u64).div_ceil(256).max(1) * 256;
        let range = |buffer: &wgpu::Buffer| {
            let size = buffer.size();
            record(GpuRange {
                buffer,
                offset: 0,
                size,
            })
        };
        if let Some((kept, buffer)) = table.as_ref() {
            if kept.as_slice() == words {
                return range(buffer);
            }
        }
        let buffer = match table.take() {
            Some((_, buffer)) if buffer.size() >= size => buffer,
            _ => self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("anygpu table"),
                size,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        };
        let whole = GpuRange {
            buffer: &buffer,
            offset: 0,
            size: buffer.size(),
        };
        self.upload(whole, bytes);
        *table = Some((words.to_vec(), buffer.clone()));
        range(&buffer)
    }

    /// Writes host bytes into a device range, after everything recorded so far: a copy from a
    /// staging buffer written as it is created, recorded in the stream like a dispatch, so an
    /// upload in the middle of a step (a batch, an optimizer's table) submits nothing early.
    /// (A queue write would land before everything pending, which may still use this memory
    /// under a tensor dropped since: that way needs a submission first, the fallback here when
    /// the staging buffer cannot be written.)
    pub(crate) fn upload(&self, dst: GpuRange<'_>, bytes: &[u8]) {
        // Whole words: the last one zero-padded (allocations are rounded to 256 bytes).
        let padded = (bytes.len() as u64).div_ceil(wgpu::COPY_BUFFER_ALIGNMENT)
            * wgpu::COPY_BUFFER_ALIGNMENT;
        if padded == 0 {
            return;
        }
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("anygpu upload"),
            size: padded,
            usage: wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        });
        let written = staging
            .get_mapped_range_mut(..)
            .map(|mut view| view.slice(..bytes.len()).copy_from_slice(bytes))
            .is_ok();
        staging.unmap();
        let mut stream = self.stream();
        if written {
            self.record(&mut stream, |encoder| {
                encoder.copy_buffer_to_buffer(&staging, 0, dst.buffer, dst.offset, padded);
            });
        } else {
            self.submit(&mut stream);
            let mut words = bytes.to_vec();
            words.resize(padded as usize, 0);
            self.queue.write_buffer(dst.buffer, dst.offset, &words);
        }
        // Under the lock: no other thread's commands come between the pending ones and these.
        drop(stream);
        self.read_timed();
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
        let pending = self.read_begin(src, bytes);
        self.read_finish(pending, consume)
    }

    // ---- reads finished later ----
    /// Starts a read back of `bytes` bytes of a device range: the copy into a staging buffer is
    /// recorded after everything recorded so far and submitted, nothing waits. Finish it with
    /// [`GpuContext::read_finish`], after recording more work if there is some: the host then
    /// waits only for the commands before the copy, while the device goes on with the rest.
    pub(crate) fn read_begin(&self, src: GpuRange<'_>, bytes: u64) -> PendingRead {
        let padded = bytes.div_ceil(wgpu::COPY_BUFFER_ALIGNMENT) * wgpu::COPY_BUFFER_ALIGNMENT;
        if padded == 0 {
            return PendingRead {
                staging: None,
                submission: None,
                number: 0,
                bytes,
                mapping: None,
            };
        }
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("anygpu readback"),
            size: padded,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let (submission, number) = {
            let mut stream = self.stream();
            self.record(&mut stream, |encoder| {
                encoder.copy_buffer_to_buffer(src.buffer, src.offset, &staging, 0, padded)
            });
            (self.submit(&mut stream), stream.batching.last_submission())
        };
        self.read_timed();
        PendingRead {
            staging: Some(staging),
            submission,
            number,
            bytes,
            mapping: None,
        }
    }

    /// Finishes a read [`GpuContext::read_begin`] started if the device is done with it,
    /// without waiting: `Ok(None)` while the copy is on its way (call again later, or
    /// [`GpuContext::read_finish`]), else the bytes handed to `consume`. Not a host wait.
    pub(crate) fn read_try<R>(
        &self,
        pending: &mut PendingRead,
        consume: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        let Some(staging) = &pending.staging else {
            return Ok(Some(consume(&[])));
        };
        let slot = Arc::clone(
            pending
                .mapping
                .get_or_insert_with(|| map_into_slot(staging)),
        );
        self.device
            .poll(wgpu::PollType::Poll)
            .map_err(|e| self.gpu_error(format!("polling the device failed: {e}")))?;
        let outcome = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        match outcome {
            None => Ok(None),
            Some(Err(e)) => Err(self.gpu_error(format!("mapping the readback buffer failed: {e}"))),
            Some(Ok(())) => {
                let view = staging.get_mapped_range(..).map_err(|e| {
                    self.gpu_error(format!("reading the readback buffer failed: {e}"))
                })?;
                let out = consume(&view[..pending.bytes as usize]);
                drop(view);
                staging.unmap();
                pending.staging = None;
                Ok(Some(out))
            }
        }
    }

    /// Finishes a read [`GpuContext::read_begin`] started: submits what was recorded since (so
    /// the device works on it while the host waits), waits for the copy and hands the bytes to
    /// `consume`.
    pub(crate) fn read_finish<R>(
        &self,
        pending: PendingRead,
        consume: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        let Some(staging) = pending.staging else {
            return Ok(consume(&[]));
        };
        self.flush();
        // The profiler names this wait (its own timestamp reads are not counted).
        let wait = crate::profiler::wait_begin("read back to the host");
        // A read `read_try` polled has asked for its map already.
        let slot = match pending.mapping {
            Some(slot) => slot,
            None => map_into_slot(&staging),
        };
        self.wait_for(pending.submission, "a read back to the host")?;
        self.stream().batching.drained(pending.number);
        self.take_error()?;
        let take = || slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        let mut outcome = take();
        // Another thread's poll may have collected the finished map and not yet run its
        // callback when ours returned: poll again until it has, for a bounded time.
        let deadline = Instant::now() + MAP_CALLBACK_GRACE;
        while outcome.is_none() && Instant::now() < deadline {
            self.device
                .poll(wgpu::PollType::Poll)
                .map_err(|e| self.gpu_error(format!("polling the device failed: {e}")))?;
            std::thread::yield_now();
            outcome = take();
        }
        outcome
            .ok_or_else(|| self.gpu_error("the map callback never ran".into()))?
            .map_err(|e| self.gpu_error(format!("mapping the readback buffer failed: {e}")))?;
        if let Some(w) = wait {
            w.end(&self.label);
        }
        let view = staging
            .get_mapped_range(..)
            .map_err(|e| self.gpu_error(format!("reading the readback buffer failed: {e}")))?;
        let out = consume(&view[..pending.bytes as usize]);
        drop(view);
        staging.unmap();
        Ok(out)
    }

    /// Submits the recorded commands without waiting, so the device works while the host
    /// goes on (before waiting on another device, for instance).
    pub(crate) fn flush(&self) {
        let mut stream = self.stream();
        self.submit(&mut stream);
        drop(stream);
        self.read_timed();
    }

    /// Submits what is pending and waits for the queue to drain.
    pub(crate) fn wait_idle(&self) -> Result<()> {
        let (submission, number) = {
            let mut stream = self.stream();
            (self.submit(&mut stream), stream.batching.last_submission())
        };
        self.read_timed();
        let wait = crate::profiler::wait_begin("synchronize");
        self.wait_for(submission, "a synchronization")?;
        self.stream().batching.drained(number);
        if let Some(w) = wait {
            w.end(&self.label);
        }
        self.take_error()
    }

    /// Blocks until `submission` (the latest with `None`) has finished on the device, for at
    /// most the wait timeout: past it, an error naming the device, `what` waited and the
    /// limit (a hung kernel or driver fails the wait instead of hanging the process).
    fn wait_for(&self, submission: Option<wgpu::SubmissionIndex>, what: &str) -> Result<()> {
        let wait = wgpu::PollType::Wait {
            submission_index: submission,
            timeout: self.wait_timeout,
        };
        match self.device.poll(wait) {
            Ok(_) => Ok(()),
            Err(wgpu::PollError::Timeout) => {
                let limit = self.wait_timeout.unwrap_or_default();
                Err(self.gpu_error(format!(
                    "{what}: the device did not finish within {limit:?} \
                     (ANYGPU_WAIT_TIMEOUT_S); a kernel or the driver may hang, or the work \
                     needs longer: raise the limit, or set it to 0 for none"
                )))
            }
            Err(e) => Err(self.gpu_error(format!("waiting for the device failed: {e}"))),
        }
    }

    /// A failure of this device, with the error wgpu reported on it first, if any (taken: it
    /// is reported once): a failed wait or map is most often the consequence of one (a
    /// submission wgpu refused).
    fn gpu_error(&self, message: String) -> Error {
        let mut slot = self.device_error.lock().unwrap_or_else(|e| e.into_inner());
        let message = match slot.take() {
            Some(cause) => format!("{message}; wgpu reported: {cause}"),
            None => message,
        };
        Error::Gpu {
            device: self.label.clone(),
            message,
        }
    }
}

/// What went wrong, in full: `wgpu::Error`'s `Display` names only the kind ("Validation Error");
/// the description says which command and which limit.
fn describe(err: &wgpu::Error) -> String {
    match err {
        wgpu::Error::Validation { description, .. } | wgpu::Error::Internal { description, .. } => {
            description.trim_end().to_string()
        }
        wgpu::Error::OutOfMemory { source } => format!("out of memory: {source}"),
    }
}

#[cfg(test)]
mod tests {
    use crate::{DeviceKind, Runtime, Tensor};

    #[test]
    fn profiled_timestamps_are_read_once_the_stream_lock_is_released() {
        let rt = Runtime::builder()
            .env("WGPU_BACKEND", Some("vulkan"))
            .build()
            .expect("runtime");
        let gpus = rt.list_logical_devices(DeviceKind::Gpu).expect("devices");
        let Some(dev) = gpus
            .iter()
            .find(|d| d.gpu().is_some_and(|g| g.ctx.has_timestamps()))
        else {
            assert!(
                std::env::var("ANYGPU_REQUIRE_ADAPTER").as_deref() != Ok("1"),
                "ANYGPU_REQUIRE_ADAPTER=1 but no Vulkan adapter with timestamp queries"
            );
            eprintln!("SKIPPED: no adapter with timestamp queries");
            return;
        };
        let ctx = &dev.gpu().expect("a GPU").ctx;
        let dir = std::env::temp_dir().join(format!("anygpu-timed-{}", std::process::id()));
        crate::profiler::start(&dir).expect("profiler");
        let x = Tensor::from_slice_on(&[1.0f32; 64], &[64], dev).expect("upload");
        // A profiled dispatch, recorded and not yet submitted.
        let _y = x.scale(2.0).expect("scale");
        {
            let mut stream = ctx.stream();
            ctx.submit(&mut stream);
            // Submitted with the lock held, and not waited for there: queued.
            assert_eq!(ctx.timed.lock().map(|t| t.len()).unwrap_or(0), 1);
        }
        ctx.read_timed();
        assert!(ctx.timed.lock().map(|t| t.is_empty()).unwrap_or(false));
        let report = crate::profiler::stop().expect("report").to_string();
        assert!(report.contains("scale"), "{report}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
