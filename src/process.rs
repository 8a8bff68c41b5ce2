//! What `/proc` tells about processes: when one started, and whether one still runs. Files that
//! name the process that wrote them (smi snapshots, temporary files of atomic writes) are
//! removed once that process has ended. Without a `/proc` nothing is known, and each caller
//! decides what that means.

use std::path::Path;

/// When process `pid` started, in clock ticks after boot: field 22 of `/proc/<pid>/stat`
/// (counted after the command name, which may hold spaces and parentheses). `None` without
/// `/proc` or such a process.
fn start_time(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(Path::new("/proc").join(pid).join("stat")).ok()?;
    let (_, after_name) = stat.rsplit_once(')')?;
    // Fields 3, 4, ... follow the name: field 22 is the 20th of them.
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// This process's start time, as an smi snapshot records it.
pub(crate) fn own_start_time() -> Option<u64> {
    static STARTED: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *STARTED.get_or_init(|| start_time("self"))
}

/// Whether process `pid` runs: `/proc/<pid>` exists and, when `started` is given, the process
/// there started then (else the PID was reused). `None` where there is no `/proc` to ask.
pub(crate) fn runs(pid: u32, started: Option<u64>) -> Option<bool> {
    if !Path::new("/proc/self").exists() {
        return None;
    }
    let pid = pid.to_string();
    if !Path::new("/proc").join(&pid).exists() {
        return Some(false);
    }
    Some(match (started, start_time(&pid)) {
        (Some(wrote), Some(runs)) => wrote == runs,
        _ => true,
    })
}

/// Whether process `pid` is known to have ended: `/proc` is there to ask and `/proc/<pid>` is
/// not. Without `/proc` nothing is known, so this is `false` and a caller removes nothing.
pub(crate) fn has_ended(pid: u32) -> bool {
    runs(pid, None) == Some(false)
}
