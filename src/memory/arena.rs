//! One logical device's arena: [`Bfc`] bookkeeping over regions that are wgpu buffers.
//!
//! Growth on (`set_memory_growth(true)`): the first region is `min(limit, 2 MiB)`, each later
//! one doubles, never past the limit nor the adapter's `max_storage_buffer_binding_size` (so any
//! allocation can be bound as one range). As in TensorFlow's `BFCAllocator::Extend`, a request
//! larger than the next region's size doubles it until it fits, and then the region after it is
//! that same size, not double. Before an allocation fails, empty regions are released and it is
//! retried (TF's `DeallocateFreeRegions`); if it still fails, they stay released. Growth off
//! (TensorFlow's default): the whole limit is reserved when the device is created.
//!
//! On a software adapter (lavapipe, llvmpipe) a region is host memory. Lavapipe maps it and the
//! kernel commits pages only when they are first written, so a large reservation costs address
//! space rather than RAM until tensors fill it. Llvmpipe's GL driver zero-fills a buffer when it
//! is created (1 GiB: ~0.8 s and 1 GiB of RAM at every start), and a GL driver aborts rather than
//! report a refusal, so reserving there up front guarantees nothing: with
//! [`ArenaConfig::lazy_regions`] the regions are reserved in the bookkeeping at once (the figures
//! are TensorFlow's) and each region's buffer is created when its first block is allocated.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{format_bytes, Error, Result};
use crate::memory::bfc::{Bfc, Block, RegionId, Stats};

/// The first region's size under memory growth (TensorFlow starts at 2 MiB as well).
const FIRST_GROWTH_REGION: u64 = 2 << 20;

/// How an arena is set up.
#[derive(Clone, Debug)]
pub(crate) struct ArenaConfig {
    /// The device's full name, for messages.
    pub(crate) device: String,
    /// TF's allocator name, `GPU_0_bfc`.
    pub(crate) allocator: String,
    /// bytes_limit.
    pub(crate) limit: u64,
    /// Memory growth on or off.
    pub(crate) growth: bool,
    /// Largest region: the adapter's max_storage_buffer_binding_size (and max_buffer_size).
    pub(crate) max_region: u64,
    /// The adapter's min_storage_buffer_offset_alignment.
    pub(crate) alignment: u64,
    /// Create a region's buffer when its first block is allocated rather than when the region
    /// is reserved (see the module's docs).
    pub(crate) lazy_regions: bool,
    /// `ANYGPU_MEMORY_LOG=1`: log each region grown or released at info level.
    pub(crate) log_regions: bool,
    /// Counts the regions released, shared with the adapter's context: its cache of bind groups
    /// (which keep their buffers alive) is dropped when this moves.
    pub(crate) released: Arc<AtomicU64>,
}

/// A capped pool of device memory.
pub(crate) struct Arena {
    config: ArenaConfig,
    device: wgpu::Device,
    state: Mutex<ArenaState>,
}

struct ArenaState {
    bfc: Bfc,
    /// Each region's buffer; a lazy region has none until its first block is allocated.
    buffers: HashMap<RegionId, wgpu::Buffer>,
    /// Size of the next region to add under growth.
    next_region: u64,
}

/// Device memory held by one tensor: a range of an arena region. Returned on drop.
pub(crate) struct Allocation {
    arena: Arc<Arena>,
    block: Block,
    buffer: Option<wgpu::Buffer>,
}

impl Allocation {
    /// The region buffer; `None` only for a zero-byte allocation.
    pub(crate) fn buffer(&self) -> Option<&wgpu::Buffer> {
        self.buffer.as_ref()
    }

    /// Offset in the region, aligned for storage bindings.
    pub(crate) fn offset(&self) -> u64 {
        self.block.offset
    }

    /// Bytes reserved (the request rounded up to the alignment).
    pub(crate) fn size(&self) -> u64 {
        self.block.size
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.arena.lock().bfc.free(self.block);
    }
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("device", &self.arena.config.device)
            .field("block", &self.block)
            .finish()
    }
}

impl Arena {
    /// Creates the arena; without growth the whole limit is reserved now.
    pub(crate) fn new(device: wgpu::Device, mut config: ArenaConfig) -> Result<Arc<Arena>> {
        config.alignment = config.alignment.max(256).next_power_of_two();
        config.max_region = config.max_region / config.alignment * config.alignment;
        let bfc = Bfc::new(config.alignment, config.limit);
        let arena = Arc::new(Arena {
            state: Mutex::new(ArenaState {
                bfc,
                buffers: HashMap::new(),
                next_region: FIRST_GROWTH_REGION.min(config.limit),
            }),
            config,
            device,
        });
        if !arena.config.growth {
            arena.reserve_everything()?;
        }
        Ok(arena)
    }

    fn lock(&self) -> MutexGuard<'_, ArenaState> {
        // A panic while the lock was held cannot leave the bookkeeping half-updated (every
        // mutation is a single Bfc call), so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Without growth, regions of the largest size until the limit is covered.
    fn reserve_everything(&self) -> Result<()> {
        let mut state = self.lock();
        let align = self.config.alignment;
        let mut left = self.config.limit / align * align;
        while left > 0 {
            let size = left.min(self.config.max_region);
            self.add_region(&mut state, size, !self.config.lazy_regions)?;
            left -= size;
        }
        Ok(())
    }

    /// Adds a region of `size` bytes to the bookkeeping, and with `create` its buffer.
    fn add_region(&self, state: &mut ArenaState, size: u64, create: bool) -> Result<RegionId> {
        let id = state
            .bfc
            .add_region(size)
            .map_err(|_| self.exhausted(&state.bfc, size, None))?;
        if create {
            if let Err(err) = self.create_buffer(state, id, size) {
                // The new region is empty, so this removes it (and any other empty one) again.
                self.release_empty(state);
                return Err(err);
            }
        }
        if self.config.log_regions {
            log::info!(
                "{}: reserved region {} of {} ({} reserved of {})",
                self.config.allocator,
                id.0,
                format_bytes(size),
                format_bytes(state.bfc.stats().bytes_reserved),
                format_bytes(self.config.limit)
            );
        } else {
            log::debug!(
                "{}: region of {}",
                self.config.allocator,
                format_bytes(size)
            );
        }
        Ok(id)
    }

    /// Creates region `id`'s buffer of `size` bytes, or says that the driver refused it.
    fn create_buffer(
        &self,
        state: &mut ArenaState,
        id: RegionId,
        size: u64,
    ) -> Result<wgpu::Buffer> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(&self.config.allocator),
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if let Some(err) = pollster::block_on(scope.pop()) {
            return Err(Error::ResourceExhausted(format!(
                "the driver refused a region of {} for {}: {err}",
                format_bytes(size),
                self.config.device
            )));
        }
        state.buffers.insert(id, buffer.clone());
        Ok(buffer)
    }

    /// Allocates `bytes`; `what` describes the tensor for the error message
    /// (`"tensor with shape[1000,1000] and type float"`).
    ///
    /// # Errors
    /// `ResourceExhausted` (TensorFlow's OOM message plus the arena's figures) when the request
    /// does not fit under the limit now, or when the driver refuses a lazy region's buffer;
    /// `TooLarge` when it exceeds what one storage binding of the adapter can cover, so no arena
    /// could ever hold it. Either way no live allocation moves and the statistics are unchanged;
    /// under growth, regions that were empty may have been released while making room (TF's
    /// `DeallocateFreeRegions` does the same).
    pub(crate) fn allocate(self: &Arc<Self>, bytes: u64, what: Option<&str>) -> Result<Allocation> {
        let mut state = self.lock();
        let rounded = state.bfc.rounded(bytes);
        if rounded > self.config.limit {
            // TensorFlow reports this as an OOM too, and users search for that wording.
            return Err(self.exhausted(&state.bfc, bytes, what));
        }
        if rounded > self.config.max_region {
            return Err(Error::TooLarge {
                what: what
                    .map_or_else(|| format!("an allocation of {bytes} bytes"), str::to_string),
                device: self.config.device.clone(),
                requested: bytes,
                limit: self.config.max_region,
                limit_name: "max_storage_buffer_binding_size",
            });
        }
        let block = match state.bfc.allocate(bytes) {
            Some(block) => block,
            None => self.grow_and_allocate(&mut state, bytes, what)?,
        };
        log::trace!(
            "{}: allocated {} at region {} offset {}",
            self.config.allocator,
            block.size,
            block.region.0,
            block.offset
        );
        // A zero-byte allocation has no range to bind: ops over empty tensors record nothing.
        let buffer = if block.size == 0 {
            None
        } else {
            Some(self.region_buffer(&mut state, block)?)
        };
        Ok(Allocation {
            arena: Arc::clone(self),
            block,
            buffer,
        })
    }

    /// The buffer of `block`'s region, created now if the region is lazy and has none yet; if
    /// the driver refuses it, `block` is freed again and the error says so.
    fn region_buffer(&self, state: &mut ArenaState, block: Block) -> Result<wgpu::Buffer> {
        if let Some(buffer) = state.buffers.get(&block.region) {
            return Ok(buffer.clone());
        }
        let size = state
            .bfc
            .region_size(block.region)
            .expect("a block's region is in the bookkeeping");
        self.create_buffer(state, block.region, size)
            .inspect_err(|_| state.bfc.free(block))
    }

    fn grow_and_allocate(
        &self,
        state: &mut ArenaState,
        bytes: u64,
        what: Option<&str>,
    ) -> Result<Block> {
        if self.config.growth {
            let rounded = state.bfc.rounded(bytes);
            let mut next = state.next_region.max(self.config.alignment);
            let mut enlarged = false;
            while next < rounded {
                next = next.saturating_mul(2);
                enlarged = true;
            }
            let mut size = next;
            let available = self.config.limit - state.bfc.stats().bytes_reserved;
            if size > available {
                // The doubling overshoots: take what is left if that suffices, else make room
                // by handing empty regions back and try once more.
                if rounded > available {
                    self.release_empty(state);
                }
                let available = self.config.limit - state.bfc.stats().bytes_reserved;
                size = size.min(available);
            }
            let size =
                size.min(self.config.max_region) / self.config.alignment * self.config.alignment;
            if size >= rounded {
                self.add_region(state, size, true)?;
                // TF's Extend: a region enlarged to fit a request is followed by one of the same
                // size; otherwise the next one doubles.
                let following = if enlarged {
                    next
                } else {
                    next.saturating_mul(2)
                };
                state.next_region = following.min(self.config.max_region);
                if let Some(block) = state.bfc.allocate(bytes) {
                    return Ok(block);
                }
            }
        }
        Err(self.exhausted(&state.bfc, bytes, what))
    }

    fn release_empty(&self, state: &mut ArenaState) {
        for id in state.bfc.release_empty_regions() {
            if let Some(buffer) = state.buffers.remove(&id) {
                if self.config.log_regions {
                    log::info!(
                        "{}: released region {} of {}",
                        self.config.allocator,
                        id.0,
                        format_bytes(buffer.size())
                    );
                }
                // Dropped, not destroyed: commands already recorded may still read the region,
                // and wgpu frees it once they are done (and cached bind groups let it go).
                drop(buffer);
                self.config.released.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn exhausted(&self, bfc: &Bfc, bytes: u64, what: Option<&str>) -> Error {
        let stats = bfc.stats();
        let head = match what {
            Some(what) => format!(
                "OOM when allocating {what} on {} by allocator {}",
                self.config.device, self.config.allocator
            ),
            None => format!("out of memory on {}", self.config.device),
        };
        Error::ResourceExhausted(format!(
            "{head}: requested {}, limit {}, {} in use, largest free block {}",
            format_bytes(bytes),
            format_bytes(self.config.limit),
            format_bytes(stats.bytes_in_use),
            format_bytes(stats.largest_free_block_bytes),
        ))
    }

    /// Current statistics.
    pub(crate) fn stats(&self) -> Stats {
        self.lock().bfc.stats()
    }

    /// `reset_memory_stats`.
    pub(crate) fn reset_stats(&self) {
        self.lock().bfc.reset_stats()
    }

    /// Region sizes in creation order (for tests and the memory example).
    pub(crate) fn region_sizes(&self) -> Vec<u64> {
        self.lock()
            .bfc
            .regions()
            .into_iter()
            .map(|(_, size)| size)
            .collect()
    }
}
