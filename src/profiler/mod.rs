//! A per-op profiler: TensorFlow's `tf.profiler.experimental.start(logdir)` / `stop()`.
//!
//! While it runs, every op records its name, device, host time and the bytes it allocated; on a
//! GPU with timestamp queries (`TIMESTAMP_QUERY`: Vulkan, Metal, DX12 and GL adapters, Mesa's
//! software ones included) every kernel it dispatched is timed on the device itself. `stop()`
//! writes `trace.json` (Chrome trace events: open it in <https://ui.perfetto.dev> or
//! `chrome://tracing`) and `top_ops.txt` into the directory, and returns a [`Report`] whose
//! `Display` is the top-ops table.
//!
//! ```
//! use anygpu::{profiler, Tensor};
//!
//! let dir = std::env::temp_dir().join(format!("anygpu-profile-doc-{}", std::process::id()));
//! profiler::start(&dir)?;
//! let a = Tensor::from_vec(vec![1.0f32; 64 * 64], &[64, 64])?;
//! let _b = a.matmul(&a)?;
//! let report = profiler::stop()?;
//! assert!(report.ops().iter().any(|op| op.op == "MatMul"));
//! assert!(dir.join("trace.json").exists());
//! println!("{report}");
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok::<(), anygpu::Error>(())
//! ```
//!
//! How each op is timed:
//! * **device**: the sum of its kernels' device times, from timestamp queries written around each
//!   dispatch. Dispatches are then recorded one compute pass each and every submission is waited
//!   for, so the step as a whole runs slower than without the profiler; the kernels do not.
//! * **host (synced)**: a GPU without timestamp queries; the op waits for the device before it
//!   returns, and the wall time of the call is its time.
//! * **host**: CPU ops, timed on the host.
//!
//! With the profiler off nothing changes: no query sets, no waits, one atomic load per op.
//!
//! Differences from TensorFlow: the output is one Chrome trace and a text table, not the
//! TensorBoard profile plugin's `.xplane.pb`; only one profiler runs per process, as in TF.

mod report;
mod trace;
// ---- host waits ----
mod waits;
pub(crate) use waits::{wait_begin, WaitCause};

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::error::{Error, Result};

pub use report::{KernelSummary, OpSummary, Report, Timing, WaitSummary};

/// Whether a profiler is running: the one check the hot paths make.
static RUNNING: AtomicBool = AtomicBool::new(false);
/// The running session's records.
static SESSION: Mutex<Option<Session>> = Mutex::new(None);
/// Op ids, unique within the process.
static NEXT_OP: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The ops open on this thread, innermost last: kernels and allocations belong to it.
    static OPEN: RefCell<Vec<OpenOp>> = const { RefCell::new(Vec::new()) };
    /// A small id per thread for the trace's host tracks.
    static THREAD: Cell<u64> = const { Cell::new(0) };
}

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

/// Starts profiling into `logdir` (created if missing): TensorFlow's
/// `tf.profiler.experimental.start(logdir)`.
///
/// # Errors
/// `AlreadyExists` ("Another profiler is running.") when a profiler runs; `Io` when the directory
/// cannot be created.
pub fn start(logdir: impl AsRef<Path>) -> Result<()> {
    let dir = logdir.as_ref().to_path_buf();
    let mut session = lock();
    if session.is_some() {
        return Err(Error::AlreadyExists("Another profiler is running.".into()));
    }
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
        path: dir.clone(),
        source,
    })?;
    *session = Some(Session {
        dir,
        origin: Instant::now(),
        ops: Vec::new(),
        kernels: Vec::new(),
        spans: Vec::new(),
        waits: Vec::new(),
        early: HashMap::new(),
    });
    RUNNING.store(true, Ordering::SeqCst);
    Ok(())
}

/// Stops profiling, writes `trace.json` and `top_ops.txt` into the directory given to
/// [`start`], and returns the report: TensorFlow's `tf.profiler.experimental.stop()`.
///
/// Call it after the work to profile has finished on the devices (a read, or
/// `LogicalDevice::synchronize`): kernels whose submissions were still pending are left out.
///
/// # Errors
/// `Unavailable` ("Cannot export profiling results. No profiler is running.") when none runs;
/// `Io` when a file cannot be written (the report is lost with it, as the files are its record).
pub fn stop() -> Result<Report> {
    let session = {
        let mut guard = lock();
        RUNNING.store(false, Ordering::SeqCst);
        guard.take()
    };
    let session = session.ok_or_else(|| {
        Error::Unavailable("Cannot export profiling results. No profiler is running.".into())
    })?;
    let report = Report::new(&session.ops, &session.kernels).with_waits(&session.waits);
    let write = |name: &str, text: String| {
        let path = session.dir.join(name);
        std::fs::write(&path, text).map_err(|source| Error::Io { path, source })
    };
    write("trace.json", trace::chrome_trace(&session))?;
    write("top_ops.txt", report.to_string())?;
    Ok(report)
}

/// Whether a profiler is running.
pub fn is_running() -> bool {
    RUNNING.load(Ordering::Relaxed)
}

/// A named span on the host track of the trace while it lives, like TensorFlow's
/// `tf.profiler.experimental.Trace("train", step_num=3)`; a no-op when no profiler runs.
///
/// ```
/// let _step = anygpu::profiler::Trace::new("train step 3");
/// // ... the step's ops ...
/// ```
#[must_use = "the span ends when the Trace is dropped"]
pub struct Trace {
    open: Option<(String, u64)>,
}

impl Trace {
    /// Opens a span called `name` (nothing is recorded when no profiler runs).
    pub fn new(name: impl Into<String>) -> Trace {
        let open = with_session(|s| (name.into(), s.now_ns()));
        Trace { open }
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        if let Some((name, start_ns)) = self.open.take() {
            with_session(|s| {
                let end = s.now_ns();
                s.spans.push(SpanRecord {
                    name,
                    thread: thread_id(),
                    start_ns,
                    dur_ns: end.saturating_sub(start_ns),
                });
            });
        }
    }
}

/// An op being profiled on this thread: returned by [`op_begin`], closed by [`OpScope::end`].
pub(crate) struct OpScope {
    id: u64,
    name: &'static str,
    device: String,
    start: Instant,
}

struct OpenOp {
    id: u64,
    bytes: u64,
}

/// One op as recorded.
pub(crate) struct OpRecord {
    pub(crate) id: u64,
    pub(crate) name: &'static str,
    pub(crate) device: String,
    pub(crate) thread: u64,
    pub(crate) start_ns: u64,
    pub(crate) host_ns: u64,
    pub(crate) bytes: u64,
    /// Device time of its own kernels (not those of ops nested in it).
    pub(crate) device_ns: u64,
    pub(crate) kernels: usize,
    pub(crate) timing: Timing,
}

/// One kernel timed on a device.
pub(crate) struct KernelRecord {
    pub(crate) op: Option<u64>,
    pub(crate) kernel: &'static str,
    pub(crate) device: String,
    /// Start on the session's clock, aligned as [`record_kernels`] explains.
    pub(crate) start_ns: u64,
    pub(crate) dur_ns: u64,
}

/// A [`Trace`] span.
pub(crate) struct SpanRecord {
    pub(crate) name: String,
    pub(crate) thread: u64,
    pub(crate) start_ns: u64,
    pub(crate) dur_ns: u64,
}

pub(crate) struct Session {
    dir: PathBuf,
    origin: Instant,
    pub(crate) ops: Vec<OpRecord>,
    pub(crate) kernels: Vec<KernelRecord>,
    pub(crate) spans: Vec<SpanRecord>,
    /// Host waits (see `waits.rs`).
    pub(crate) waits: Vec<waits::WaitRecord>,
    /// Device time and kernels of ops still open when their kernels were read.
    early: HashMap<u64, (u64, usize)>,
}

impl Session {
    fn now_ns(&self) -> u64 {
        nanos(self.origin.elapsed())
    }

    fn ns_at(&self, t: Instant) -> u64 {
        nanos(t.saturating_duration_since(self.origin))
    }
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn lock() -> MutexGuard<'static, Option<Session>> {
    // The records are plain data; a panic while one was pushed leaves them usable.
    SESSION.lock().unwrap_or_else(|e| e.into_inner())
}

fn with_session<R>(f: impl FnOnce(&mut Session) -> R) -> Option<R> {
    if !is_running() {
        return None;
    }
    lock().as_mut().map(f)
}

fn thread_id() -> u64 {
    THREAD.with(|t| {
        if t.get() == 0 {
            t.set(NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
        }
        t.get()
    })
}

/// Opens op `name` on `device` when a profiler runs (`None`, at the cost of one atomic load,
/// when none does). Kernels dispatched and tensors allocated on this thread until
/// [`OpScope::end`] belong to it.
pub(crate) fn op_begin(name: &'static str, device: &str) -> Option<OpScope> {
    if !is_running() {
        return None;
    }
    let id = NEXT_OP.fetch_add(1, Ordering::Relaxed);
    OPEN.with(|open| open.borrow_mut().push(OpenOp { id, bytes: 0 }));
    Some(OpScope {
        id,
        name,
        device: device.to_string(),
        start: Instant::now(),
    })
}

impl OpScope {
    /// Closes the op. `timing` says how its time was taken: for a GPU without timestamp
    /// queries the caller has waited for the device before calling this.
    pub(crate) fn end(self, timing: Timing) {
        let host = self.start.elapsed();
        let bytes = OPEN.with(|open| {
            let mut open = open.borrow_mut();
            // Ops close innermost first; an op left open by a panic is dropped with it.
            let at = open.iter().rposition(|o| o.id == self.id);
            at.map(|i| open.drain(i..).next().map_or(0, |o| o.bytes))
                .unwrap_or(0)
        });
        let thread = thread_id();
        with_session(|s| {
            let start_ns = s.ns_at(self.start);
            let (device_ns, kernels) = s.early.remove(&self.id).unwrap_or_default();
            s.ops.push(OpRecord {
                id: self.id,
                name: self.name,
                device: self.device,
                thread,
                start_ns,
                host_ns: nanos(host),
                bytes,
                device_ns,
                kernels,
                timing,
            });
        });
    }
}

/// The innermost op open on this thread, for a kernel being dispatched (`None` outside ops or
/// when no profiler runs).
pub(crate) fn current_op() -> Option<u64> {
    if !is_running() {
        return None;
    }
    OPEN.with(|open| open.borrow().last().map(|o| o.id))
}

/// Counts `bytes` allocated on this thread against the innermost open op.
pub(crate) fn note_allocation(bytes: u64) {
    if !is_running() {
        return;
    }
    OPEN.with(|open| {
        if let Some(op) = open.borrow_mut().last_mut() {
            op.bytes += bytes;
        }
    });
}

/// A kernel's device interval from timestamp queries, in nanoseconds on the device's clock.
pub(crate) struct DeviceInterval {
    pub(crate) op: Option<u64>,
    pub(crate) kernel: &'static str,
    pub(crate) begin_ns: u64,
    pub(crate) end_ns: u64,
}

/// Records the kernels of one submission to `device`, which was submitted at `submitted` and
/// seen finished at `finished`.
///
/// Device clocks are not the host's, so each submission is placed on the host timeline: its
/// first kernel starts at the submission if that leaves its last one ending before the host saw
/// it finish, else as late as needed to end then. Durations are the device's own.
pub(crate) fn record_kernels(
    device: &str,
    submitted: Instant,
    finished: Instant,
    intervals: &[DeviceInterval],
) {
    let (Some(first), Some(last)) = (
        intervals.iter().map(|k| k.begin_ns).min(),
        intervals.iter().map(|k| k.end_ns).max(),
    ) else {
        return;
    };
    with_session(|s| {
        let lower = s.ns_at(submitted);
        let upper = s.ns_at(finished).saturating_sub(last.saturating_sub(first));
        let base = if lower <= upper { lower } else { upper };
        for k in intervals {
            let dur_ns = k.end_ns.saturating_sub(k.begin_ns);
            s.kernels.push(KernelRecord {
                op: k.op,
                kernel: k.kernel,
                device: device.to_string(),
                start_ns: base + k.begin_ns.saturating_sub(first),
                dur_ns,
            });
            // Ops are recorded when they end, usually before their kernels' submission is
            // read (then the op is among the last few); a submission inside an op (a full
            // stream) is read first, and the op collects its time when it ends.
            if let Some(id) = k.op {
                match s.ops.iter_mut().rev().find(|o| o.id == id) {
                    Some(op) => {
                        op.device_ns += dur_ns;
                        op.kernels += 1;
                    }
                    None => {
                        let early = s.early.entry(id).or_default();
                        early.0 += dur_ns;
                        early.1 += 1;
                    }
                }
            }
        }
    });
}
