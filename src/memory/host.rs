//! A cache of host buffers for `CPU:0` tensors, the CPU side's counterpart of the GPU arenas.
//!
//! A training step allocates and frees the same large activations every time. Straight from the
//! system allocator, each buffer of a few MiB is a fresh `mmap` whose pages fault in on first
//! touch and are unmapped on free — a fifth of a CPU training step here. Keeping freed buffers
//! by size and handing them back (contents unspecified: ops overwrite their outputs) removes
//! that, as TensorFlow's CPU allocator does.
//!
//! Every allocation is fallible: a request the system allocator refuses is TensorFlow's OOM
//! error, not an abort. Under the NaN trap (see [`nan_trap`]) every buffer handed out is filled
//! with NaN, so a kernel that forgets an output element fails its test instead of passing on a
//! zero or a stale value.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use crate::error::{format_bytes, Error, Result};

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

/// The bits every buffer is filled with under the NaN trap: a quiet NaN (as f32) whose payload
/// `0xbad` says where it came from.
pub(crate) const TRAP_BITS: u32 = 0x7fc0_0bad;

/// Whether fresh buffers are NaN-filled: in the crate's unit tests and debug builds, and wherever
/// `ANYGPU_NAN_TRAP=1` (set by `.ci/run`, whose `cargo test --release` has neither: integration
/// tests link the library built without `cfg(test)`). Read once.
pub(crate) fn nan_trap() -> bool {
    static TRAP: OnceLock<bool> = OnceLock::new();
    *TRAP.get_or_init(|| {
        cfg!(any(test, debug_assertions))
            || std::env::var("ANYGPU_NAN_TRAP").is_ok_and(|v| v == "1")
    })
}

/// `len` copies of `value` in a new vector, or TensorFlow's OOM error when the system allocator
/// refuses the memory. `what` describes the request ("tensor with shape[..] and type float on
/// /job:localhost/replica:0/task:0/device:CPU:0") and is only built on failure.
///
/// # Errors
/// [`Error::ResourceExhausted`] naming `what`.
pub(crate) fn filled<T: Clone>(
    len: usize,
    value: T,
    what: impl FnOnce() -> String,
) -> Result<Vec<T>> {
    let mut buffer = Vec::new();
    if buffer.try_reserve_exact(len).is_err() {
        let bytes = len.saturating_mul(std::mem::size_of::<T>());
        return Err(Error::ResourceExhausted(format!(
            "OOM when allocating {} by allocator cpu: requested {}, which the system allocator \
             refused",
            what(),
            format_bytes(bytes as u64)
        )));
    }
    buffer.resize(len, value);
    Ok(buffer)
}

/// A buffer of `len` words with unspecified contents (NaN under the trap).
///
/// # Errors
/// As [`filled`].
pub(crate) fn take(len: usize, what: impl FnOnce() -> String) -> Result<Vec<u32>> {
    let fill = if nan_trap() { TRAP_BITS } else { 0 };
    if len >= MIN_POOLED_WORDS {
        // The pool only holds plain buffers; a poisoned lock still guards a valid map.
        let mut pool = pool().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mut buffer) = pool.free.get_mut(&len).and_then(Vec::pop) {
            pool.bytes -= len * 4;
            drop(pool);
            if nan_trap() {
                buffer.fill(fill);
            }
            return Ok(buffer);
        }
    }
    filled(len, fill, what)
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

    fn what() -> String {
        "a test buffer".into()
    }

    #[test]
    fn a_freed_buffer_of_the_same_size_is_handed_back() {
        let len = MIN_POOLED_WORDS + 12_345;
        let buffer = take(len, what).unwrap();
        let ptr = buffer.as_ptr();
        give(buffer);
        let again = take(len, what).unwrap();
        assert_eq!(again.as_ptr(), ptr);
        assert_eq!(again.len(), len);
    }

    #[test]
    fn under_the_trap_every_buffer_is_nan_even_a_reused_one() {
        assert!(nan_trap(), "unit tests always run with the trap");
        let len = MIN_POOLED_WORDS + 54_321;
        let mut buffer = take(len, what).unwrap();
        assert!(buffer.iter().all(|&w| f32::from_bits(w).is_nan()));
        buffer.fill(0);
        give(buffer);
        let again = take(len, what).unwrap();
        assert!(
            again.iter().all(|&w| w == TRAP_BITS),
            "a reused buffer is refilled"
        );
        assert!(take(3, what).unwrap().iter().all(|&w| w == TRAP_BITS));
    }

    #[test]
    fn a_refused_allocation_is_tensorflows_oom_error_not_an_abort() {
        // More than any address space: the system allocator refuses it whatever overcommit says.
        let err = take(usize::MAX / 8, || "tensor on CPU:0".into()).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::ResourceExhausted(_)), "{err:?}");
        assert!(
            text.starts_with("OOM when allocating tensor on CPU:0 by allocator cpu: requested"),
            "{text}"
        );
    }
}
