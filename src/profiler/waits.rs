//! Host waits: each time the host blocks on a device while a profiler runs — a tensor read
//! back, a `synchronize`, the tuner timing a candidate — with its cause and duration, so that
//! what stalls a training step has a name. The profiler's own waits (each submission's
//! timestamps, read under the profiler only) are not host waits of the program and are not
//! recorded.
//!
//! The cause is the outermost [`WaitCause`] open on the waiting thread (the caller that knows
//! why: `fit`'s log reads, loss scaling's finiteness check), else what the device layer was
//! doing ("read back to the host", "synchronize").

use std::cell::Cell;
use std::time::Instant;

use super::{is_running, nanos, thread_id, with_session};

thread_local! {
    /// The cause named for this thread's waits, if any.
    static CAUSE: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// One host wait as recorded.
pub(crate) struct WaitRecord {
    pub(crate) cause: &'static str,
    pub(crate) device: String,
    pub(crate) thread: u64,
    pub(crate) start_ns: u64,
    pub(crate) dur_ns: u64,
}

/// Names the host waits this thread makes while it lives. An outer cause stays: `fit` reading
/// its logs names the reads a `StepOutput` makes for it.
pub(crate) struct WaitCause {
    set: bool,
}

impl WaitCause {
    /// Names the waits from here until the guard drops (unless an outer cause is named).
    pub(crate) fn enter(cause: &'static str) -> WaitCause {
        let set = CAUSE.with(|c| {
            if c.get().is_some() {
                return false;
            }
            c.set(Some(cause));
            true
        });
        WaitCause { set }
    }
}

impl Drop for WaitCause {
    fn drop(&mut self) {
        if self.set {
            CAUSE.with(|c| c.set(None));
        }
    }
}

/// A host wait being timed: [`wait_begin`], then [`HostWait::end`] once the device answered.
pub(crate) struct HostWait {
    start: Instant,
    what: &'static str,
}

/// Starts timing a host wait; `what` is its cause when no [`WaitCause`] names one. `None`
/// (one atomic load) when no profiler runs.
pub(crate) fn wait_begin(what: &'static str) -> Option<HostWait> {
    is_running().then(|| HostWait {
        start: Instant::now(),
        what,
    })
}

impl HostWait {
    /// Records the wait on `device`, from its start to now.
    pub(crate) fn end(self, device: &str) {
        let dur = self.start.elapsed();
        let cause = CAUSE.with(Cell::get).unwrap_or(self.what);
        let thread = thread_id();
        with_session(|s| {
            let start_ns = s.ns_at(self.start);
            s.waits.push(WaitRecord {
                cause,
                device: device.to_string(),
                thread,
                start_ns,
                dur_ns: nanos(dur),
            });
        });
    }
}
