//! GPU memory: a best-fit-with-coalescing allocator ([`bfc`], pure bookkeeping) under an arena
//! per logical device ([`arena`], the wgpu buffers), and the statistics `tf.config` reports.

pub(crate) mod arena;
pub(crate) mod bfc;
pub(crate) mod host;

pub(crate) use arena::{Allocation, Arena, ArenaConfig};

/// `tf.config.experimental.get_memory_info`: bytes held by live tensors on a device.
///
/// These are allocator chunk sizes (requests rounded up to the alignment), as TensorFlow reports
/// them, not the bytes reserved from the driver; see [`MemoryStats::bytes_reserved`] for that.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes in use now.
    pub current: u64,
    /// The most bytes in use at once since creation or the last `reset_memory_stats`.
    pub peak: u64,
}

/// Every figure of the device's allocator (TensorFlow's `AllocatorStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Allocations since creation or the last reset (zero-byte requests not counted).
    pub num_allocs: u64,
    /// Bytes held by live allocations.
    pub bytes_in_use: u64,
    /// Peak of `bytes_in_use`.
    pub peak_bytes_in_use: u64,
    /// Largest single allocation since creation or the last reset.
    pub largest_alloc_size: u64,
    /// The device's cap: its memory limit.
    pub bytes_limit: u64,
    /// Bytes reserved from the driver as arena regions (wgpu buffers).
    pub bytes_reserved: u64,
    /// Peak of `bytes_reserved`.
    pub peak_bytes_reserved: u64,
    /// The largest request that would succeed now without growing.
    pub largest_free_block_bytes: u64,
    /// Regions (wgpu buffers) the arena holds.
    pub num_regions: u64,
}

impl From<bfc::Stats> for MemoryStats {
    fn from(s: bfc::Stats) -> Self {
        MemoryStats {
            num_allocs: s.num_allocs,
            bytes_in_use: s.bytes_in_use,
            peak_bytes_in_use: s.peak_bytes_in_use,
            largest_alloc_size: s.largest_alloc_size,
            bytes_limit: s.bytes_limit,
            bytes_reserved: s.bytes_reserved,
            peak_bytes_reserved: s.peak_bytes_reserved,
            largest_free_block_bytes: s.largest_free_block_bytes,
            num_regions: s.num_regions,
        }
    }
}
