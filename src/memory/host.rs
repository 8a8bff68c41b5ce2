//! A cache of host buffers for `CPU:0` tensors, the CPU side's counterpart of the GPU arenas.
//!
//! A training step allocates and frees the same large activations every time. Straight from the
//! system allocator, each buffer of a few MiB is a fresh `mmap` whose pages fault in on first
//! touch and are unmapped on free — a fifth of a CPU training step here. Keeping freed buffers
//! by size and handing them back (contents unspecified: ops overwrite their outputs) removes
//! that, as TensorFlow's CPU allocator does.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Buffers smaller than this come from the system allocator directly (its own bins are fast).
const MIN_POOLED_WORDS: usize = 16 << 10;
/// Most bytes the cache keeps.
const MAX_POOLED_BYTES: usize = 512 << 20;
/// Most buffers kept per size.
const MAX_PER_SIZE: usize = 16;

#[derive(Default)]
struct Pool {
    free: HashMap<usize, Vec<Vec<u32>>>,
    bytes: usize,
}

fn pool() -> &'static Mutex<Pool> {
    static POOL: OnceLock<Mutex<Pool>> = OnceLock::new();
    POOL.get_or_init(Mutex::default)
}

/// A buffer of `len` words with unspecified contents.
pub(crate) fn take(len: usize) -> Vec<u32> {
    if len >= MIN_POOLED_WORDS {
        // The pool only holds plain buffers; a poisoned lock still guards a valid map.
        let mut pool = pool().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(buffer) = pool.free.get_mut(&len).and_then(Vec::pop) {
            pool.bytes -= len * 4;
            return buffer;
        }
    }
    vec![0; len]
}

/// Returns a buffer to the cache (or frees it when the cache is full).
pub(crate) fn give(buffer: Vec<u32>) {
    let len = buffer.len();
    if len < MIN_POOLED_WORDS {
        return;
    }
    let mut pool = pool().lock().unwrap_or_else(|e| e.into_inner());
    if pool.bytes + len * 4 > MAX_POOLED_BYTES {
        return;
    }
    let list = pool.free.entry(len).or_default();
    if list.len() < MAX_PER_SIZE {
        list.push(buffer);
        pool.bytes += len * 4;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_buffer_of_the_same_size_is_handed_back() {
        let len = MIN_POOLED_WORDS + 12_345;
        let buffer = take(len);
        let ptr = buffer.as_ptr();
        give(buffer);
        let again = take(len);
        assert_eq!(again.as_ptr(), ptr);
        assert_eq!(again.len(), len);
    }
}
