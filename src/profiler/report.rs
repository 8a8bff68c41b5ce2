//! The top-ops table: ops grouped by (op, device), largest time first.

use std::collections::HashMap;
use std::fmt;

use super::waits::WaitRecord;
use super::{KernelRecord, OpRecord};

/// How an op's time was taken (see the [module docs](super)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Timing {
    /// Its kernels' device time, from timestamp queries.
    Device,
    /// Host wall time with a wait for the device before the op returned (a GPU without
    /// timestamp queries).
    HostSynced,
    /// Host wall time of an op that runs on the host (CPU ops).
    Host,
}

impl Timing {
    fn label(self) -> &'static str {
        match self {
            Timing::Device => "device",
            Timing::HostSynced => "host (synced)",
            Timing::Host => "host",
        }
    }
}

/// One row of the top-ops table: every call of an op on one device.
#[derive(Clone, Debug, PartialEq)]
pub struct OpSummary {
    /// TF's op name, as in the placement log (`Conv2D`, `MatMul`).
    pub op: &'static str,
    /// The logical device (`/device:GPU:0`).
    pub device: String,
    /// Calls profiled.
    pub calls: u64,
    /// Kernels dispatched (0 on the CPU, or where no timestamps were taken).
    pub kernels: u64,
    /// The op's time in milliseconds, taken as [`OpSummary::timing`] says.
    pub total_ms: f64,
    /// Host time from the op's call to its return, in milliseconds (recording only, for GPU ops
    /// timed on the device).
    pub host_ms: f64,
    /// Bytes the op allocated, summed over its calls.
    pub bytes_allocated: u64,
    /// How `total_ms` was taken.
    pub timing: Timing,
}

impl OpSummary {
    /// Mean time per call, in milliseconds.
    pub fn mean_ms(&self) -> f64 {
        self.total_ms / self.calls.max(1) as f64
    }
}

/// One row of the kernels table: every dispatch of a kernel (a WGSL entry point) on one device,
/// timed on the device.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelSummary {
    /// The WGSL entry point (`matmul_v4`, `depthwise3x3_v4`).
    pub kernel: &'static str,
    /// The adapter's stream, as the trace names it.
    pub device: String,
    /// Dispatches timed.
    pub calls: u64,
    /// Device time in milliseconds.
    pub total_ms: f64,
}

/// What [`stop`](super::stop) returns: the profiled ops grouped by (op, device).
///
/// Its `Display` is what `top_ops.txt` holds: the top-ops table (op × device, calls, total and
/// mean time, each row's share of the profiled time), then the kernels timed on a device.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    ops: Vec<OpSummary>,
    kernels: Vec<KernelSummary>,
    waits: Vec<WaitSummary>,
}

impl Report {
    pub(crate) fn new(records: &[OpRecord], kernel_records: &[KernelRecord]) -> Report {
        let mut rows: HashMap<(&'static str, &str, Timing), OpSummary> = HashMap::new();
        for r in records {
            let row = rows
                .entry((r.name, r.device.as_str(), r.timing))
                .or_insert_with(|| OpSummary {
                    op: r.name,
                    device: r.device.clone(),
                    calls: 0,
                    kernels: 0,
                    total_ms: 0.0,
                    host_ms: 0.0,
                    bytes_allocated: 0,
                    timing: r.timing,
                });
            row.calls += 1;
            row.kernels += r.kernels as u64;
            row.host_ms += r.host_ns as f64 / 1e6;
            row.bytes_allocated += r.bytes;
            row.total_ms += match r.timing {
                Timing::Device => r.device_ns as f64 / 1e6,
                Timing::HostSynced | Timing::Host => r.host_ns as f64 / 1e6,
            };
        }
        let mut ops: Vec<OpSummary> = rows.into_values().collect();
        ops.sort_by(|a, b| {
            b.total_ms
                .total_cmp(&a.total_ms)
                .then_with(|| a.op.cmp(b.op))
                .then_with(|| a.device.cmp(&b.device))
        });
        let mut by_kernel: HashMap<(&'static str, &str), KernelSummary> = HashMap::new();
        for k in kernel_records {
            let row = by_kernel
                .entry((k.kernel, k.device.as_str()))
                .or_insert_with(|| KernelSummary {
                    kernel: k.kernel,
                    device: k.device.clone(),
                    calls: 0,
                    total_ms: 0.0,
                });
            row.calls += 1;
            row.total_ms += k.dur_ns as f64 / 1e6;
        }
        let mut kernels: Vec<KernelSummary> = by_kernel.into_values().collect();
        kernels.sort_by(|a, b| {
            b.total_ms
                .total_cmp(&a.total_ms)
                .then_with(|| a.kernel.cmp(b.kernel))
        });
        Report {
            ops,
            kernels,
            waits: Vec::new(),
        }
    }

    /// The report with its host waits, summed per cause and device, longest total first.
    pub(crate) fn with_waits(mut self, records: &[WaitRecord]) -> Report {
        let mut rows: HashMap<(&'static str, &str), WaitSummary> = HashMap::new();
        for w in records {
            let row = rows
                .entry((w.cause, w.device.as_str()))
                .or_insert_with(|| WaitSummary {
                    cause: w.cause,
                    device: w.device.clone(),
                    waits: 0,
                    total_ms: 0.0,
                    max_ms: 0.0,
                });
            let ms = w.dur_ns as f64 / 1e6;
            row.waits += 1;
            row.total_ms += ms;
            row.max_ms = row.max_ms.max(ms);
        }
        self.waits = rows.into_values().collect();
        self.waits.sort_by(|a, b| {
            b.total_ms
                .total_cmp(&a.total_ms)
                .then_with(|| a.cause.cmp(b.cause))
                .then_with(|| a.device.cmp(&b.device))
        });
        self
    }

    /// The host waits, one row per cause and device: each time the host blocked on a device
    /// (the profiler's own timestamp reads excepted).
    pub fn host_waits(&self) -> &[WaitSummary] {
        &self.waits
    }

    /// How many times the host waited for a device, all causes together.
    pub fn host_wait_count(&self) -> u64 {
        self.waits.iter().map(|w| w.waits).sum()
    }

    /// The rows, largest total time first.
    pub fn ops(&self) -> &[OpSummary] {
        &self.ops
    }

    /// The kernels timed on a device, largest total time first.
    pub fn kernels(&self) -> &[KernelSummary] {
        &self.kernels
    }

    /// Dispatches timed on a device.
    pub fn kernels_timed(&self) -> u64 {
        self.kernels.iter().map(|k| k.calls).sum()
    }

    /// The sum of every row's time, in milliseconds.
    pub fn total_ms(&self) -> f64 {
        self.ops.iter().map(|o| o.total_ms).sum()
    }
}

/// Host waits of one cause on one device: [`Report::host_waits`].
#[derive(Clone, Debug, PartialEq)]
pub struct WaitSummary {
    /// Why the host waited: `fit: logs every log_every steps`, `LossScaleOptimizer: are the
    /// gradients finite`, `read back to the host`, `synchronize`, ...
    pub cause: &'static str,
    /// The device waited for (its adapter's name).
    pub device: String,
    /// Times the host waited.
    pub waits: u64,
    /// Milliseconds waited in all.
    pub total_ms: f64,
    /// The longest wait, in milliseconds.
    pub max_ms: f64,
}

impl Report {
    /// The host-wait table of `top_ops.txt` (nothing when there were none).
    fn fmt_waits(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.waits.is_empty() {
            return Ok(());
        }
        let width = self
            .waits
            .iter()
            .map(|w| w.cause.len())
            .max()
            .unwrap_or(5)
            .max(5);
        writeln!(
            f,
            "\n{:<width$}  {:>6}  {:>10}  {:>9}  {:>9}  device",
            "host wait", "waits", "total ms", "mean ms", "max ms"
        )?;
        for w in &self.waits {
            writeln!(
                f,
                "{:<width$}  {:>6}  {:>10.3}  {:>9.4}  {:>9.3}  {}",
                w.cause,
                w.waits,
                w.total_ms,
                w.total_ms / w.waits.max(1) as f64,
                w.max_ms,
                w.device
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.total_ms();
        let width = self
            .ops
            .iter()
            .map(|o| o.op.len())
            .max()
            .unwrap_or(2)
            .max(2);
        let dev_width = self
            .ops
            .iter()
            .map(|o| o.device.len())
            .max()
            .unwrap_or(6)
            .max(6);
        writeln!(
            f,
            "{:<width$}  {:<dev_width$}  {:>6}  {:>10}  {:>9}  {:>6}  {:>9}  {:>10}  timing",
            "op", "device", "calls", "total ms", "mean ms", "%", "host ms", "allocated"
        )?;
        for o in &self.ops {
            let share = if total > 0.0 {
                100.0 * o.total_ms / total
            } else {
                0.0
            };
            writeln!(
                f,
                "{:<width$}  {:<dev_width$}  {:>6}  {:>10.3}  {:>9.4}  {:>6.1}  {:>9.3}  {:>10}  {}",
                o.op,
                o.device,
                o.calls,
                o.total_ms,
                o.mean_ms(),
                share,
                o.host_ms,
                crate::error::format_bytes(o.bytes_allocated),
                o.timing.label()
            )?;
        }
        writeln!(
            f,
            "{} op calls, {} kernels timed on a device, {total:.3} ms in all",
            self.ops.iter().map(|o| o.calls).sum::<u64>(),
            self.kernels_timed()
        )?;
        self.fmt_waits(f)?;
        if self.kernels.is_empty() {
            return Ok(());
        }
        let kernel_total: f64 = self.kernels.iter().map(|k| k.total_ms).sum();
        let width = self
            .kernels
            .iter()
            .map(|k| k.kernel.len())
            .max()
            .unwrap_or(6)
            .max(6);
        writeln!(
            f,
            "\n{:<width$}  {:>6}  {:>10}  {:>9}  {:>6}  device",
            "kernel", "calls", "total ms", "mean ms", "%"
        )?;
        for k in &self.kernels {
            writeln!(
                f,
                "{:<width$}  {:>6}  {:>10.3}  {:>9.4}  {:>6.1}  {}",
                k.kernel,
                k.calls,
                k.total_ms,
                k.total_ms / k.calls.max(1) as f64,
                100.0 * k.total_ms / kernel_total.max(f64::MIN_POSITIVE),
                k.device
            )?;
        }
        Ok(())
    }
}
