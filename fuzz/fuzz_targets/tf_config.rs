//! Fuzzes the `TF_CONFIG` check of `MultiWorkerMirroredStrategy`: any text is accepted or an
//! error, never a panic, for any rank and size.
//!
//! Run from the repository root with
//! `cargo +nightly fuzz run tf_config fuzz/corpus/tf_config fuzz/seeds/tf_config`
//! (the seeds are committed; the corpus it grows is not).

#![no_main]

use anygpu::distribute::tf_config::check_tf_config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (u8, u8, &str)| {
    let (rank, size, text) = input;
    let (rank, size) = (usize::from(rank % 8), usize::from(size % 8).max(1));
    if check_tf_config(text, rank, size).is_ok() {
        // Accepted only for a rank in the world.
        assert!(rank < size);
    }
});
