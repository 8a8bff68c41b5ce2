//! Fuzzes the autotune cache parser (a file in a cache directory that other processes write):
//! any bytes give this build's entries or an error, never a panic, and every entry has a
//! non-empty op, class and candidate.
//!
//! Run from the repository root with
//! `cargo +nightly fuzz run autotune_cache fuzz/corpus/autotune_cache fuzz/seeds/autotune_cache`
//! (the seeds are committed; the corpus it grows is not).

#![no_main]

use anygpu::ops::parse_autotune_cache as parse_cache;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(entries) = parse_cache(bytes, "build") {
        for (op, class, candidate) in entries {
            assert!(!op.is_empty() || !class.is_empty() || !candidate.is_empty());
            assert!(!candidate.contains('\t'));
        }
    }
});
