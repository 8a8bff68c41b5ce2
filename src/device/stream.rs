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

/// Commands recorded before the pending command buffer is submitted without waiting, once the
/// device has work: enough to keep a submission's host cost small beside what it runs.
pub(crate) const SUBMIT_THRESHOLD: usize = 64;

/// Commands recorded before the first submission after the host waited for the queue to drain,
/// on hardware GPUs (the default of `ANYGPU_FIRST_SUBMIT`): the device idles until that
/// submission, so it goes out early, and each next one after twice as many commands, up to
/// [`SUBMIT_THRESHOLD`]. (A training step that waits for its loss would otherwise leave the
/// device idle while the host records the step's first 64 dispatches.)
pub(crate) const FIRST_SUBMIT: usize = 8;

/// The first submission's commands on `adapter` by default: [`FIRST_SUBMIT`] on hardware GPUs;
/// [`SUBMIT_THRESHOLD`] on software adapters, which gain nothing from it (lavapipe's
/// `vkQueueSubmit` waits while an earlier submission runs: a step took as long, with the host
/// blocked in it, in `fashion_mnist --device gpu:0 --time-steps 20` on lavapipe, 2026-12-06).
pub(crate) fn default_first_submit(adapter: &wgpu::AdapterInfo) -> usize {
    if adapter.device_type == wgpu::DeviceType::Cpu {
        SUBMIT_THRESHOLD
    } else {
        FIRST_SUBMIT
    }
}

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
    /// When the pending encoder is submitted.
    pub(crate) batching: Batching,
    pub(crate) params: Params,
    pub(crate) bind_groups: BindGroupCache,
    /// Timestamp queries around dispatches, made on first use while the profiler runs.
    pub(crate) timestamps: Option<Timestamps>,
}

impl Stream {
    /// A stream whose first submission after a drained queue goes out after `first_submit`
    /// commands (clamped to 1..=[`SUBMIT_THRESHOLD`]).
    pub(crate) fn new(device: &wgpu::Device, limits: &wgpu::Limits, first_submit: usize) -> Stream {
        Stream {
            pass: None,
            encoder: None,
            batching: Batching::new(first_submit),
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

/// When the pending commands go to the queue: after [`SUBMIT_THRESHOLD`] of them while the
/// device has work, after fewer once the host has waited for the queue to drain (see
/// [`FIRST_SUBMIT`]).
#[derive(Debug)]
pub(crate) struct Batching {
    /// Commands in the pending encoder.
    recorded: usize,
    /// Commands the pending encoder takes before it is submitted.
    threshold: usize,
    /// The threshold after a drained queue, 1 to [`SUBMIT_THRESHOLD`].
    first: usize,
    /// Command buffers submitted so far: which submission a wait was for.
    submitted: u64,
}

impl Batching {
    /// Batching whose first submission after a drained queue (and the very first) goes out
    /// after `first` commands, clamped to 1..=[`SUBMIT_THRESHOLD`].
    pub(crate) fn new(first: usize) -> Batching {
        let first = first.clamp(1, SUBMIT_THRESHOLD);
        Batching {
            recorded: 0,
            threshold: first,
            first,
            submitted: 0,
        }
    }

    /// Counts one more command in the pending encoder; true when it is time to submit.
    pub(crate) fn count_command(&mut self) -> bool {
        self.recorded += 1;
        self.recorded >= self.threshold
    }

    /// Counts the pending encoder's submission; the next one waits for twice as many
    /// commands, up to [`SUBMIT_THRESHOLD`].
    pub(crate) fn count_submission(&mut self) {
        self.recorded = 0;
        self.submitted += 1;
        self.threshold = (self.threshold * 2).min(SUBMIT_THRESHOLD);
    }

    /// The number of the last submission (0 before the first).
    pub(crate) fn last_submission(&self) -> u64 {
        self.submitted
    }

    /// The host has waited for submission `number` to finish: when none came after it the
    /// queue is empty, and the next submission goes out after `first` commands.
    pub(crate) fn drained(&mut self, number: u64) {
        if number == self.submitted {
            self.threshold = self.first;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The commands, of `commands` recorded one after another, at which a submission goes out.
    fn submissions(b: &mut Batching, commands: usize) -> Vec<usize> {
        (1..=commands)
            .filter(|_| {
                let due = b.count_command();
                if due {
                    b.count_submission();
                }
                due
            })
            .collect()
    }

    #[test]
    fn submissions_ramp_up_from_the_first_and_start_over_when_the_queue_drains() {
        let mut b = Batching::new(FIRST_SUBMIT);
        assert_eq!(submissions(&mut b, 184), [8, 24, 56, 120, 184]);
        // A wait for the last submission (the waits submit what is pending first).
        b.drained(b.last_submission());
        assert_eq!(submissions(&mut b, 30), [8, 24]);
    }

    #[test]
    fn a_wait_with_later_submissions_behind_it_leaves_the_batching_as_it_is() {
        let mut b = Batching::new(FIRST_SUBMIT);
        assert_eq!(submissions(&mut b, 56), [8, 24, 56]);
        let read = b.last_submission();
        assert_eq!(submissions(&mut b, 64), [64]);
        // The read's submission finished; the one after it may still run.
        b.drained(read);
        assert_eq!(submissions(&mut b, 64), [64]);
        b.drained(b.last_submission());
        assert_eq!(submissions(&mut b, 8), [8]);
    }

    #[test]
    fn software_adapters_submit_the_usual_batch_from_the_first() {
        let info = |t| wgpu::AdapterInfo::new(t, wgpu::Backend::Vulkan);
        assert_eq!(
            default_first_submit(&info(wgpu::DeviceType::Cpu)),
            SUBMIT_THRESHOLD
        );
        for t in [
            wgpu::DeviceType::DiscreteGpu,
            wgpu::DeviceType::IntegratedGpu,
        ] {
            assert_eq!(default_first_submit(&info(t)), FIRST_SUBMIT);
        }
    }

    #[test]
    fn the_first_submission_is_clamped_to_the_usual_batch() {
        assert_eq!(submissions(&mut Batching::new(0), 4), [1, 3]);
        assert_eq!(submissions(&mut Batching::new(1000), 130), [64, 128]);
        assert_eq!(
            submissions(&mut Batching::new(SUBMIT_THRESHOLD), 130),
            [64, 128]
        );
    }
}
