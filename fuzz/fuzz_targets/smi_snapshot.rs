//! Fuzzes the parser of `anygpu-smi`'s snapshot files (written by other processes of the same
//! user, read by the tool): any text parses or is an error, never a panic; what parses
//! re-encodes to a text that parses to the same text again.
//!
//! Run from the repository root with
//! `cargo +nightly fuzz run smi_snapshot fuzz/corpus/smi_snapshot fuzz/seeds/smi_snapshot`
//! (the seeds are committed; the corpus it grows is not).

#![no_main]

use anygpu::smi::Snapshot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    if let Ok(snapshot) = Snapshot::parse(text) {
        let text = snapshot.to_text();
        let again = Snapshot::parse(&text).expect("a snapshot's text parses");
        assert_eq!(again.to_text(), text);
    }
});
