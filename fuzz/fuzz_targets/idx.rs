//! Fuzzes the IDX parser: any input must give `Ok` with consistent dimensions or an `Err`,
//! never a panic, an overflow or an out-of-bounds read.
//!
//! Run with `cargo +nightly fuzz run idx` from the repository root.

#![no_main]

use std::path::Path;

use anygpu::data::idx::parse_idx;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    match parse_idx(bytes, Path::new("fuzz-input")) {
        Ok(array) => {
            let count = array
                .dims
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d));
            assert_eq!(count, Some(array.data.len()));
            // What parses must re-encode to the same bytes.
            let encoded = array.to_bytes().expect("a parsed array re-encodes");
            assert_eq!(encoded.as_slice(), bytes);
        }
        Err(e) => {
            // Every error names the input.
            assert!(e.to_string().starts_with("fuzz-input: "));
        }
    }
});
