//! An adapter's command stream: the pending encoder with its open compute pass, the params ring
//! (staged on the host, written once per submission), the bind-group cache, and the profiler's
//! timestamp queries.
//!
//! Host cost per dispatch is what this module is about. Consecutive dispatches share one compute
//! pass; their params go into one host buffer that a single `write_buffer` uploads at submission
//! (queue writes land before the submission's commands); the params binding has a dynamic
//! offset, so a bind group depends only on the tensors bound and is reused across steps (the
//! allocator hands a training step the same ranges every time).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::memory::Allocation;

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

/// Commands recorded before the pending command buffer is submitted without waiting.
pub(crate) const SUBMIT_THRESHOLD: usize = 64;

/// Dispatches timed per submission while the profiler runs (two queries each).
pub(crate) const TIMESTAMP_PAIRS: u32 = 256;

/// Slots of the params ring; a full ring forces a submission.
const PARAMS_SLOTS: u64 = 1024;

/// Bytes of one dispatch's params (the `Params` uniform of every shader fits).
pub(crate) const PARAMS_BYTES: usize = 256;

/// Bind groups kept per adapter before the cache starts over (a training step uses a few
/// hundred).
const BIND_GROUP_CACHE: usize = 4096;

/// What an adapter's command stream has recorded: [`LogicalDevice::stream_stats`].
///
/// [`LogicalDevice::stream_stats`]: crate::LogicalDevice::stream_stats
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Compute dispatches recorded.
    pub dispatches: u64,
    /// Command buffers submitted to the queue.
    pub submits: u64,
    /// Host time spent recording dispatches (parameters, bind group, pass), in nanoseconds.
    pub record_nanos: u64,
    /// Dispatches whose bind group came from the cache.
    pub bind_group_hits: u64,
    /// Compute pipelines compiled for the adapter, on any thread (its background compile
    /// threads included: `ANYGPU_COMPILE_THREADS`).
    pub pipelines_compiled: u64,
    /// Host time ops waited for pipelines, in nanoseconds: compiling the ones they needed,
    /// waiting for a background thread that had started one, or, before the tuner times
    /// anything, for the background compiles to finish. Most of a cold first step on a GPU.
    pub compile_nanos: u64,
}

impl std::ops::Sub for StreamStats {
    type Output = StreamStats;

    /// The work done between two readings (saturating, so readings in the wrong order give 0).
    fn sub(self, earlier: StreamStats) -> StreamStats {
        StreamStats {
            dispatches: self.dispatches.saturating_sub(earlier.dispatches),
            submits: self.submits.saturating_sub(earlier.submits),
            record_nanos: self.record_nanos.saturating_sub(earlier.record_nanos),
            bind_group_hits: self.bind_group_hits.saturating_sub(earlier.bind_group_hits),
            pipelines_compiled: self
                .pipelines_compiled
                .saturating_sub(earlier.pipelines_compiled),
            compile_nanos: self.compile_nanos.saturating_sub(earlier.compile_nanos),
        }
    }
}

impl std::ops::Add for StreamStats {
    type Output = StreamStats;

    /// Two devices' counters together.
    fn add(self, other: StreamStats) -> StreamStats {
        StreamStats {
            dispatches: self.dispatches + other.dispatches,
            submits: self.submits + other.submits,
            record_nanos: self.record_nanos + other.record_nanos,
            bind_group_hits: self.bind_group_hits + other.bind_group_hits,
            pipelines_compiled: self.pipelines_compiled + other.pipelines_compiled,
            compile_nanos: self.compile_nanos + other.compile_nanos,
        }
    }
}

/// Atomic counters behind [`StreamStats`].
#[derive(Default)]
pub(crate) struct StreamCounters {
    pub(crate) dispatches: AtomicU64,
    pub(crate) submits: AtomicU64,
    pub(crate) record_nanos: AtomicU64,
    pub(crate) bind_group_hits: AtomicU64,
}

impl StreamCounters {
    pub(crate) fn read(&self) -> StreamStats {
        StreamStats {
            dispatches: self.dispatches.load(Ordering::Relaxed),
            submits: self.submits.load(Ordering::Relaxed),
            record_nanos: self.record_nanos.load(Ordering::Relaxed),
            bind_group_hits: self.bind_group_hits.load(Ordering::Relaxed),
            ..StreamStats::default()
        }
    }
}

/// The pending work of one adapter. Field order matters: the open pass borrows the encoder (its
/// lifetime forgotten), so it is declared, and dropped, first.
pub(crate) struct Stream {
    /// The compute pass consecutive dispatches share; closed before any other command.
    pub(crate) pass: Option<wgpu::ComputePass<'static>>,
    pub(crate) encoder: Option<wgpu::CommandEncoder>,
    /// Commands in the pending encoder.
    pub(crate) recorded: usize,
    pub(crate) params: Params,
    pub(crate) bind_groups: BindGroupCache,
    /// Timestamp queries around dispatches, made on first use while the profiler runs.
    pub(crate) timestamps: Option<Timestamps>,
}

impl Stream {
    pub(crate) fn new(device: &wgpu::Device, limits: &wgpu::Limits) -> Stream {
        Stream {
            pass: None,
            encoder: None,
            recorded: 0,
            params: Params::new(device, limits),
            bind_groups: BindGroupCache::default(),
            timestamps: None,
        }
    }

    /// Ends the open compute pass, if any, so the encoder takes other commands.
    pub(crate) fn end_pass(&mut self) {
        self.pass = None;
    }

    /// The pending encoder (made on demand), with no pass open.
    pub(crate) fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.end_pass();
        self.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
        })
    }
}

/// The uniform ring dispatches read their params from, and the host copy of the slots taken
/// since the last submission.
pub(crate) struct Params {
    pub(crate) buffer: wgpu::Buffer,
    slot_size: u64,
    /// Bytes of the slots taken, slot `i` at `i * slot_size`.
    staged: Vec<u8>,
}

impl Params {
    fn new(device: &wgpu::Device, limits: &wgpu::Limits) -> Params {
        let slot_size = u64::from(limits.min_uniform_buffer_offset_alignment).max(256);
        Params {
            buffer: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("anygpu params ring"),
                size: slot_size * PARAMS_SLOTS,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            slot_size,
            staged: Vec::with_capacity((slot_size * 64) as usize),
        }
    }

    /// Whether every slot is taken (the pending work must be submitted first).
    pub(crate) fn is_full(&self) -> bool {
        self.staged.len() as u64 >= self.slot_size * PARAMS_SLOTS
    }

    /// Takes the next slot for `bytes` (at most [`PARAMS_BYTES`], zero-padded) and returns its
    /// offset: the dynamic offset of the dispatch's params binding.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> u32 {
        let offset = self.staged.len();
        let len = bytes.len().min(PARAMS_BYTES);
        self.staged.extend_from_slice(&bytes[..len]);
        self.staged.resize(offset + self.slot_size as usize, 0);
        // At most PARAMS_SLOTS * slot_size, far below u32::MAX.
        offset as u32
    }

    /// Writes the staged slots into the ring ahead of the submission that reads them, and
    /// starts over.
    pub(crate) fn flush(&mut self, queue: &wgpu::Queue) {
        if !self.staged.is_empty() {
            queue.write_buffer(&self.buffer, 0, &self.staged);
            self.staged.clear();
        }
    }
}

/// A bind group's identity: its layout and the tensor ranges bound (the params binding is the
/// same buffer for every dispatch, at a dynamic offset).
#[derive(Clone, PartialEq, Eq, Hash)]
struct BindKey {
    layout: wgpu::BindGroupLayout,
    ranges: Vec<(wgpu::Buffer, u64, u64)>,
}

/// Bind groups by [`BindKey`]. A cached bind group keeps its buffers alive, so the cache starts
/// over whenever an arena of the adapter releases a region (and when it grows past
/// [`BIND_GROUP_CACHE`]).
#[derive(Default)]
pub(crate) struct BindGroupCache {
    groups: HashMap<BindKey, wgpu::BindGroup>,
    /// The value of the adapter's released-regions counter the cache was filled under.
    epoch: u64,
}

impl BindGroupCache {
    /// The bind group for `ranges` under `layout` (params at binding 0 with a dynamic offset,
    /// `ranges[i]` at `bindings[i]`), and whether it came from the cache.
    pub(crate) fn get(
        &mut self,
        device: &wgpu::Device,
        params: &wgpu::Buffer,
        layout: &wgpu::BindGroupLayout,
        bindings: &[u32],
        ranges: &[GpuRange<'_>],
        released: &Arc<AtomicU64>,
    ) -> (wgpu::BindGroup, bool) {
        let epoch = released.load(Ordering::Relaxed);
        if epoch != self.epoch || self.groups.len() >= BIND_GROUP_CACHE {
            self.groups.clear();
            self.epoch = epoch;
        }
        let key = BindKey {
            layout: layout.clone(),
            ranges: ranges
                .iter()
                .map(|r| (r.buffer.clone(), r.offset, r.size))
                .collect(),
        };
        if let Some(group) = self.groups.get(&key) {
            return (group.clone(), true);
        }
        let mut entries = Vec::with_capacity(ranges.len() + 1);
        entries.push(wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: params,
                offset: 0,
                size: wgpu::BufferSize::new(PARAMS_BYTES as u64),
            }),
        });
        for (r, &binding) in ranges.iter().zip(bindings) {
            entries.push(wgpu::BindGroupEntry {
                binding,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: r.buffer,
                    offset: r.offset,
                    size: wgpu::BufferSize::new(r.size),
                }),
            });
        }
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout,
            entries: &entries,
        });
        self.groups.insert(key, group.clone());
        (group, false)
    }
}

/// The query set the profiler's dispatches write their begin and end times into, and the
/// kernels waiting for the next submission to be resolved and read.
pub(crate) struct Timestamps {
    pub(crate) queries: wgpu::QuerySet,
    pub(crate) resolve: wgpu::Buffer,
    /// (op, kernel) of query pair `i` (queries `2i` and `2i + 1`).
    pub(crate) pending: Vec<(Option<u64>, &'static str)>,
}

impl Timestamps {
    pub(crate) fn new(device: &wgpu::Device) -> Timestamps {
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
            pending: Vec::new(),
        }
    }

    /// Whether every query pair is taken.
    pub(crate) fn is_full(&self) -> bool {
        self.pending.len() as u32 == TIMESTAMP_PAIRS
    }
}
