//! What a process publishes, and its file format: a few lines of text, one `key value` pair or
//! one tab-separated device per line, so a reader needs no parser library and a damaged file is
//! easy to refuse.
//!
//! ```text
//! anygpu-smi 1
//! pid 4242
//! started 81234567
//! program fashion_mnist
//! updated 1796398300.250
//! steps 120
//! step_seconds 0.0331
//! device /device:GPU:0 → llvmpipe (LLVM 15.0.6, 256 bits) → Vulkan → 1073741824 → 52428800 → 61865984 → 1073741824 → 5120
//! ```
//!
//! A device line (`→` standing for a tab): name, adapter, backend, then reserved, in use, peak
//! and limit in bytes and the ops run on the device (`-` where the device has no such figure:
//! the CPU has no arena).

use std::fmt::Write as _;

/// The first line of every file; a reader refuses any other.
const MAGIC: &str = "anygpu-smi 1";

/// Files larger than this are not ours (a snapshot of 64 devices is a few KiB).
pub const MAX_FILE_BYTES: u64 = 64 * 1024;

/// One logical device of a published process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceUse {
    /// `/device:GPU:0`.
    pub name: String,
    /// The adapter's name (`host CPU` for a CPU).
    pub adapter: String,
    /// `Vulkan`, `Metal`, ..., `CPU`.
    pub backend: String,
    /// Bytes reserved from the driver (TensorFlow reserves the whole budget unless growth is
    /// on).
    pub reserved: Option<u64>,
    /// Bytes held by live tensors ([`get_memory_info`](crate::config::get_memory_info)'s
    /// `current`).
    pub in_use: Option<u64>,
    /// Peak of `in_use`.
    pub peak: Option<u64>,
    /// The device's memory limit.
    pub limit: Option<u64>,
    /// Ops run so far on this logical device.
    pub ops: Option<u64>,
}

/// What one process's runtime published.
///
/// ```
/// use anygpu::smi::{DeviceUse, Snapshot};
/// let s = Snapshot {
///     pid: 42,
///     started: Some(81_234_567),
///     program: "train".into(),
///     updated: 1.5e9,
///     steps: Some(10),
///     step_seconds: Some(0.02),
///     devices: vec![DeviceUse { name: "/device:CPU:0".into(), ..DeviceUse::default() }],
/// };
/// assert_eq!(Snapshot::parse(&s.to_text()), Ok(s));
/// assert!(Snapshot::parse("not ours").is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// The process id.
    pub pid: u32,
    /// When the process started, in clock ticks after boot (field 22 of Linux's
    /// `/proc/<pid>/stat`): a reader tells the writer from a later process that got its PID.
    /// `None` where there is no `/proc`.
    pub started: Option<u64>,
    /// The program's name (its executable's file name).
    pub program: String,
    /// When this was written, seconds since the Unix epoch.
    pub updated: f64,
    /// Training steps run by `fit` in this process, when it trains.
    pub steps: Option<u64>,
    /// The time of a training step, seconds: the mean over the current epoch's steps so far,
    /// as `fit` last read its running loss.
    pub step_seconds: Option<f64>,
    /// The runtime's logical devices.
    pub devices: Vec<DeviceUse>,
}

/// Tabs and line breaks would split a field; a name never needs them.
fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

impl Snapshot {
    /// The file's text.
    pub fn to_text(&self) -> String {
        let mut out = format!("{MAGIC}\npid {}\n", self.pid);
        if let Some(t) = self.started {
            let _ = writeln!(out, "started {t}");
        }
        let _ = writeln!(out, "program {}", clean(&self.program));
        let _ = writeln!(out, "updated {:.3}", self.updated);
        if let Some(s) = self.steps {
            let _ = writeln!(out, "steps {s}");
        }
        if let Some(s) = self.step_seconds {
            let _ = writeln!(out, "step_seconds {s}");
        }
        for d in &self.devices {
            let _ = writeln!(
                out,
                "device {}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                clean(&d.name),
                clean(&d.adapter),
                clean(&d.backend),
                opt(d.reserved),
                opt(d.in_use),
                opt(d.peak),
                opt(d.limit),
                opt(d.ops)
            );
        }
        out
    }

    /// Parses a file's text.
    ///
    /// # Errors
    /// A message naming the first thing wrong (another format, a missing or malformed field).
    pub fn parse(text: &str) -> std::result::Result<Snapshot, String> {
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err(format!("does not start with '{MAGIC}'"));
        }
        let mut s = Snapshot::default();
        let (mut pid, mut updated) = (None, None);
        for (n, line) in lines.enumerate() {
            let line_no = n + 2;
            let (key, value) = line
                .split_once(' ')
                .ok_or_else(|| format!("line {line_no}: no value"))?;
            let bad = |what: &str| format!("line {line_no}: {key}: not {what}: '{value}'");
            match key {
                "pid" => pid = Some(value.parse().map_err(|_| bad("a process id"))?),
                "started" => s.started = Some(value.parse().map_err(|_| bad("a tick count"))?),
                "program" => s.program = value.to_string(),
                "updated" => {
                    let t: f64 = value.parse().map_err(|_| bad("a time"))?;
                    updated = Some(t).filter(|t| t.is_finite());
                }
                "steps" => s.steps = Some(value.parse().map_err(|_| bad("a count"))?),
                "step_seconds" => s.step_seconds = Some(value.parse().map_err(|_| bad("seconds"))?),
                "device" => s
                    .devices
                    .push(parse_device(value).map_err(|e| format!("line {line_no}: device: {e}"))?),
                // A newer writer's extra keys are skipped, not refused.
                _ => {}
            }
        }
        s.pid = pid.ok_or("no pid")?;
        s.updated = updated.ok_or("no valid 'updated' time")?;
        Ok(s)
    }
}

fn parse_device(value: &str) -> std::result::Result<DeviceUse, String> {
    let f: Vec<&str> = value.split('\t').collect();
    if f.len() != 8 {
        return Err(format!("{} fields, expected 8", f.len()));
    }
    let num = |i: usize| -> std::result::Result<Option<u64>, String> {
        match f[i] {
            "-" => Ok(None),
            v => v
                .parse()
                .map(Some)
                .map_err(|_| format!("field {}: not a number: '{v}'", i + 1)),
        }
    };
    Ok(DeviceUse {
        name: f[0].to_string(),
        adapter: f[1].to_string(),
        backend: f[2].to_string(),
        reserved: num(3)?,
        in_use: num(4)?,
        peak: num(5)?,
        limit: num(6)?,
        ops: num(7)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_round_trips_and_control_characters_cannot_split_one() {
        let s = Snapshot {
            pid: 7,
            started: Some(99),
            program: "a\tb\nc".into(),
            updated: 1_796_398_300.25,
            steps: None,
            step_seconds: Some(0.5),
            devices: vec![DeviceUse {
                name: "/device:GPU:0".into(),
                adapter: "llvm\tpipe".into(),
                backend: "Vulkan".into(),
                reserved: Some(1 << 30),
                in_use: Some(0),
                peak: Some(12),
                limit: Some(1 << 30),
                ops: None,
            }],
        };
        let back = Snapshot::parse(&s.to_text()).unwrap();
        assert_eq!(back.program, "a b c");
        assert_eq!(back.devices[0].adapter, "llvm pipe");
        assert_eq!(back.devices[0].reserved, Some(1 << 30));
        assert_eq!(
            (back.pid, back.started, back.updated, back.step_seconds),
            (7, Some(99), s.updated, Some(0.5))
        );
    }

    #[test]
    fn damaged_text_is_refused_with_the_reason() {
        let good = Snapshot {
            pid: 1,
            updated: 2.0,
            ..Snapshot::default()
        }
        .to_text();
        assert!(Snapshot::parse(&good).is_ok());
        assert!(Snapshot::parse("").is_err());
        assert!(Snapshot::parse(&good.replace("pid 1", "pid x")).is_err());
        assert!(Snapshot::parse(&good.replace("pid 1\n", "")).is_err());
        let truncated = format!("{good}device /device:GPU:0\tx\n");
        assert!(Snapshot::parse(&truncated)
            .unwrap_err()
            .contains("2 fields"));
    }
}
