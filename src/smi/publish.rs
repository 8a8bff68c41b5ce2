//! The publishing side: a background thread per initialized runtime that writes its devices'
//! [`Snapshot`] a few times a second, atomically, and removes it when the runtime is dropped or
//! the process exits. The runtime says what it has ([`Watched`] devices and itself as their
//! owner, see `runtime/init.rs`); the files, their format and their lifetime are decided here.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::memory::{Arena, MemoryStats};
use crate::smi::dir;
use crate::smi::snapshot::{DeviceUse, Snapshot};

/// Between two snapshots: "a few times a second", and never a load on a training step (one
/// snapshot reads a few counters under the arenas' locks).
const PERIOD: Duration = Duration::from_millis(250);

/// Training steps `fit` has run in this process, and the last step time (f64 bits; 0 = none).
static STEPS: AtomicU64 = AtomicU64::new(0);
static STEP_SECONDS: AtomicU64 = AtomicU64::new(0);

/// Tells apart the files of several runtimes in one process.
static NEXT_RUNTIME: AtomicU64 = AtomicU64::new(0);

/// Files this process publishes, removed at exit.
static PUBLISHED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static EXITING: AtomicBool = AtomicBool::new(false);

/// Called by `fit` whenever it reads its running loss: the steps run so far and the mean time
/// of the last ones. Two atomic stores; nothing waits.
pub(crate) fn record_step(steps: u64, seconds: f64) {
    STEPS.store(steps, Ordering::Relaxed);
    STEP_SECONDS.store(seconds.to_bits(), Ordering::Relaxed);
}

fn published() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    // A list of paths: never torn by a panic.
    PUBLISHED.lock().unwrap_or_else(|e| e.into_inner())
}

/// A logical device as the publisher sees it: names, and weak handles to its arena and
/// command stream, so publishing never keeps a device (or the runtime) alive, and a runtime
/// dropped by its user is dropped at once, not after the publisher's next look.
pub(crate) struct Watched {
    /// The device's full name (`/device:GPU:0`).
    pub(crate) name: String,
    /// Its adapter's name.
    pub(crate) adapter: String,
    /// Its backend (`Vulkan`, `Gl`, ...; `CPU` for the host).
    pub(crate) backend: String,
    /// Its arena (GPUs only).
    pub(crate) arena: Option<Weak<Arena>>,
    /// The ops run on it so far.
    pub(crate) ops: Arc<AtomicU64>,
}

/// Starts publishing `watched`, the devices a runtime just created, for as long as `owner`
/// (that runtime) lives, unless `ANYGPU_SMI=0` in `env` (the runtime's environment); a refused
/// or unwritable directory is logged and publishing stays off (a monitor never stops a
/// program).
pub(crate) fn start<T: Send + Sync + 'static>(
    owner: Weak<T>,
    env: impl Fn(&str) -> Option<String>,
    watched: Vec<Watched>,
) {
    if env("ANYGPU_SMI").as_deref() == Some("0") {
        return;
    }
    let dir = dir::default_dir(env);
    if let Err(e) = dir::ensure_private(&dir) {
        log::warn!("not publishing for anygpu-smi: {e}");
        return;
    }
    let n = NEXT_RUNTIME.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    let path = dir.join(format!("{pid}-{n}.smi"));
    let temp = dir.join(format!(".{pid}-{n}.tmp"));
    published().push(path.clone());
    remove_at_exit();
    let spawned = std::thread::Builder::new()
        .name("anygpu-smi".into())
        .spawn(move || publish_loop(&owner, &watched, (&path, &temp)));
    if let Err(e) = spawned {
        log::warn!("not publishing for anygpu-smi: no thread: {e}");
    }
}

fn publish_loop<T>(owner: &Weak<T>, devices: &[Watched], (path, temp): (&Path, &Path)) {
    let mut warned = false;
    // `strong_count`, not `upgrade`: the publisher must never hold the runtime.
    while owner.strong_count() > 0 && !EXITING.load(Ordering::Relaxed) {
        let text = snapshot(devices).to_text();
        let written = std::fs::write(temp, text).and_then(|()| std::fs::rename(temp, path));
        if let (Err(e), false) = (written, warned) {
            log::warn!("anygpu-smi: cannot write {}: {e}", path.display());
            warned = true;
        }
        std::thread::sleep(PERIOD);
    }
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(temp);
    published().retain(|p| p != path);
}

/// The devices' state now.
fn snapshot(watched: &[Watched]) -> Snapshot {
    let devices = watched
        .iter()
        .map(|d| {
            let stats: Option<MemoryStats> = d
                .arena
                .as_ref()
                .and_then(Weak::upgrade)
                .map(|a| a.stats().into());
            DeviceUse {
                name: d.name.clone(),
                adapter: d.adapter.clone(),
                backend: d.backend.clone(),
                reserved: stats.map(|s| s.bytes_reserved),
                in_use: stats.map(|s| s.bytes_in_use),
                peak: stats.map(|s| s.peak_bytes_in_use),
                limit: stats.map(|s| s.bytes_limit),
                ops: Some(d.ops.load(Ordering::Relaxed)),
            }
        })
        .collect();
    let steps = STEPS.load(Ordering::Relaxed);
    let step_seconds = f64::from_bits(STEP_SECONDS.load(Ordering::Relaxed));
    Snapshot {
        pid: std::process::id(),
        started: crate::process::own_start_time(),
        program: program_name(),
        updated: crate::smi::now(),
        steps: Some(steps).filter(|&s| s > 0),
        step_seconds: Some(step_seconds).filter(|&s| s > 0.0),
        devices,
    }
}

fn program_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "?".into())
}

/// Registers, once, the removal of every published file when the process exits normally (a
/// killed process leaves its file; readers clean it).
fn remove_at_exit() {
    #[cfg(unix)]
    {
        static REGISTERED: std::sync::Once = std::sync::Once::new();
        extern "C" fn remove_published() {
            EXITING.store(true, Ordering::Relaxed);
            for path in published().iter() {
                let _ = std::fs::remove_file(path);
            }
        }
        extern "C" {
            fn atexit(callback: extern "C" fn()) -> std::os::raw::c_int;
        }
        REGISTERED.call_once(|| {
            // SAFETY: `atexit` is the C library's (std links it on every Unix) and takes a plain
            // function pointer; the callback only touches statics and the file system.
            unsafe {
                atexit(remove_published);
            }
        });
    }
}
