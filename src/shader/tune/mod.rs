//! Kernels picked by measurement: on first use of an (op, shape class) on an adapter, every
//! candidate variant runs on the real inputs, the fastest is kept, and the choice is cached on
//! disk per adapter. TensorFlow does the same for cuDNN's convolution algorithms
//! (`TF_CUDNN_USE_AUTOTUNE`); CubeCL (Burn) autotunes every kernel family.
//!
//! `ANYGPU_AUTOTUNE`:
//! * `off`: the heuristics (the adapter's class picks: software adapters one set, GPUs another);
//! * `on` (default): a warm-up and two timed runs per candidate, the candidates an op lists for
//!   its class; a candidate already twice as slow as the best stops early;
//! * `full`: five timed runs per candidate.
//!
//! The cache is one text file per adapter (name, backend, driver, vendor and device ids) under
//! `ANYGPU_CACHE_DIR`, else `$XDG_CACHE_HOME/anygpu`, else `~/.cache/anygpu`. Each entry's key
//! holds the crate version and a hash of every WGSL source, so an entry from another build is
//! never used. An unreadable or corrupt file is a warning, and tuning goes on in memory; so is
//! an unwritable directory, and one owned by another user or writable by others (anyone who can
//! write there could pick our kernels or redirect our writes). The file is read only when it is
//! a regular file of at most 4 MiB (a link, FIFO or device is a warning, never opened). A save
//! merges with what other processes saved meanwhile, under a lock file, and replaces the file
//! through a newly created temporary file.
//!
//! Within a process one thread tunes a key; others wanting it wait for its choice (timings
//! taken side by side would slow each other down).
//!
//! The cache file's reading and writing live in `cache.rs`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::shader::pipelines::PIPELINES_FIRST_USED;
use crate::shader::ShaderFamily;

mod cache;
pub use cache::parse_cache;
use cache::{cached_in, fnv1a, load, sanitize, usable_dir, FNV_OFFSET};

/// How much to tune: `ANYGPU_AUTOTUNE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TuneMode {
    /// The heuristics, no measurement.
    Off,
    /// Each candidate timed in one block after a warm-up and a probe (the default).
    On,
    /// Each candidate timed in four blocks, extra candidates too.
    Full,
}

impl TuneMode {
    /// Reads `ANYGPU_AUTOTUNE`'s value; unknown values give `On` with a warning.
    pub(crate) fn parse(value: Option<&str>) -> TuneMode {
        match value.map(str::trim) {
            None | Some("") | Some("on") | Some("1") => TuneMode::On,
            Some("off") | Some("0") => TuneMode::Off,
            Some("full") => TuneMode::Full,
            Some(other) => {
                log::warn!("ANYGPU_AUTOTUNE={other:?} ignored: use off, on or full");
                TuneMode::On
            }
        }
    }

    fn timed_runs(self) -> u32 {
        match self {
            TuneMode::Off => 0,
            TuneMode::On => 1,
            TuneMode::Full => 4,
        }
    }
}

/// Where a kernel choice came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecisionSource {
    /// Measured in this process.
    Measured,
    /// Read from the on-disk cache.
    Cached,
    /// The heuristic (autotuning off, or forced for a test).
    Heuristic,
}

/// One kernel choice on an adapter: what `LogicalDevice::tuning_decisions` lists.
#[derive(Clone, Debug, PartialEq)]
pub struct TuningDecision {
    /// The op family (`matmul`, `sum_rows`, `pointwise_conv`, ...).
    pub op: &'static str,
    /// The shape class the choice holds for.
    pub class: String,
    /// The candidate picked.
    pub candidate: String,
    /// Each candidate's measured time per run in milliseconds (empty unless measured).
    pub timings_ms: Vec<(String, f64)>,
    /// Where the choice came from.
    pub source: DecisionSource,
}

/// How long one timed block of runs aims to last.
const BLOCK: Duration = Duration::from_millis(2);
/// Most runs in one block (small kernels on fast GPUs).
const MAX_REPS: u32 = 64;
/// A candidate whose warm-up (compilation included) takes this many times the best run so far
/// is not timed further.
const WARM_UP_CUTOFF: u32 = 4;
/// Candidates within this factor of the fastest are timed again...
const CLOSE_CALL: f64 = 1.3;
/// ...this many more times each, in turns (each contender then has its best of two).
const REMATCH_ROUNDS: u32 = 1;

/// The tuner's time: the monotonic clock, or in unit tests a virtual one that the test's
/// candidates advance, so that what a test asserts does not depend on the machine's load.
#[derive(Default)]
struct Clock {
    /// Virtual nanoseconds.
    #[cfg(test)]
    virtual_nanos: Option<std::sync::Arc<AtomicU64>>,
}

impl Clock {
    /// The time since an arbitrary origin.
    fn now(&self) -> Duration {
        #[cfg(test)]
        if let Some(nanos) = &self.virtual_nanos {
            return Duration::from_nanos(nanos.load(Ordering::Relaxed));
        }
        static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed()
    }
}

/// The time per run of `reps` runs of `candidate` back to back, then one wait.
fn time_block(
    clock: &Clock,
    run: &mut dyn FnMut(&str) -> Result<()>,
    sync: &dyn Fn() -> Result<()>,
    candidate: &str,
    reps: u32,
) -> Result<Duration> {
    let start = clock.now();
    for _ in 0..reps {
        run(candidate)?;
    }
    sync()?;
    Ok(clock.now().saturating_sub(start) / reps)
}

/// The most background compile threads `ANYGPU_COMPILE_THREADS` may ask for per adapter.
const MAX_COMPILE_THREADS: usize = 64;

/// What the runtime hands each adapter's tuner.
#[derive(Clone, Debug)]
pub(crate) struct TuneConfig {
    pub(crate) mode: TuneMode,
    /// The cache directory; `None`: no disk cache.
    pub(crate) cache_dir: Option<PathBuf>,
    /// `ANYGPU_AUTOTUNE_FORCE=name`: every op with a candidate of that name uses it, untimed
    /// (tests run each candidate against the reference this way).
    pub(crate) force: Option<String>,
    /// `ANYGPU_KERNEL_CLASS`: the adapter class the heuristics assume (`software`, `gpu`).
    pub(crate) kernel_class: Option<String>,
    /// `ANYGPU_COMPILE_THREADS`: background compile threads per adapter (`None`: the
    /// adapter's default, see `pipelines::default_compile_threads`).
    pub(crate) compile_threads: Option<usize>,
    /// `ANYGPU_FIRST_SUBMIT`: commands before the first submission after a drained queue
    /// (`None`: the stream's default; the stream caps it at its usual batch of commands).
    pub(crate) first_submit: Option<usize>,
    /// `ANYGPU_WAIT_TIMEOUT_S`: how long the host waits for the device before a wait fails
    /// (`None`: no limit; default [`WAIT_TIMEOUT`]).
    pub(crate) wait_timeout: Option<Duration>,
}

/// How long the host waits for a GPU to finish what it waits for by default: ten minutes, far
/// past any one step's kernels, so that a hung kernel or driver fails the wait with an error
/// naming the device instead of hanging the process.
pub(crate) const WAIT_TIMEOUT: Duration = Duration::from_secs(600);

impl TuneConfig {
    /// From the environment values (the runtime's, which tests can override).
    pub(crate) fn from_env(env: impl Fn(&str) -> Option<String>) -> TuneConfig {
        let cache_dir = env("ANYGPU_CACHE_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                env("XDG_CACHE_HOME")
                    .filter(|d| !d.is_empty())
                    .map(|d| PathBuf::from(d).join("anygpu"))
            })
            .or_else(|| {
                env("HOME")
                    .filter(|d| !d.is_empty())
                    .map(|h| PathBuf::from(h).join(".cache").join("anygpu"))
            });
        TuneConfig {
            mode: TuneMode::parse(env("ANYGPU_AUTOTUNE").as_deref()),
            cache_dir,
            force: env("ANYGPU_AUTOTUNE_FORCE").filter(|f| !f.is_empty()),
            kernel_class: env("ANYGPU_KERNEL_CLASS").filter(|c| !c.is_empty()),
            compile_threads: count(&env, "ANYGPU_COMPILE_THREADS", 0, "threads (0: none)")
                .map(|n| n.min(MAX_COMPILE_THREADS)),
            first_submit: count(&env, "ANYGPU_FIRST_SUBMIT", 1, "commands, 1 or more"),
            wait_timeout: wait_timeout(&env),
        }
    }
}

/// `ANYGPU_WAIT_TIMEOUT_S`: seconds (fractions allowed; `0`, or more than a `Duration` holds:
/// no limit), [`WAIT_TIMEOUT`] when unset; another value is logged and ignored.
fn wait_timeout(env: &impl Fn(&str) -> Option<String>) -> Option<Duration> {
    let name = "ANYGPU_WAIT_TIMEOUT_S";
    let Some(value) = env(name).filter(|v| !v.is_empty()) else {
        return Some(WAIT_TIMEOUT);
    };
    match value.trim().parse::<f64>() {
        Ok(s) if s >= 0.0 => (s > 0.0)
            .then(|| Duration::try_from_secs_f64(s).ok())
            .flatten(),
        _ => {
            log::warn!("{name}={value:?} ignored: use a number of seconds (0: no limit)");
            Some(WAIT_TIMEOUT)
        }
    }
}

/// The number variable `name` holds, when it is one of at least `least`; another value is
/// logged (the message asks for a number of `what`) and ignored, as an empty one is.
fn count(
    env: &impl Fn(&str) -> Option<String>,
    name: &str,
    least: usize,
    what: &str,
) -> Option<usize> {
    let value = env(name).filter(|v| !v.is_empty())?;
    match value.trim().parse::<usize>() {
        Ok(n) if n >= least => Some(n),
        _ => {
            log::warn!("{name}={value:?} ignored: use a number of {what}");
            None
        }
    }
}

/// One kernel choice to make: the op family, the shape class, its candidates and the untuned
/// pick.
pub(crate) struct Choice<'a> {
    pub(crate) op: &'static str,
    pub(crate) class: String,
    pub(crate) candidates: &'a [&'static str],
    /// Candidates timed only under `ANYGPU_AUTOTUNE=full`.
    pub(crate) full_only: &'a [&'static str],
    pub(crate) heuristic: &'static str,
}

impl<'a> Choice<'a> {
    pub(crate) fn new(
        op: &'static str,
        class: String,
        candidates: &'a [&'static str],
        heuristic: &'static str,
    ) -> Choice<'a> {
        Choice {
            op,
            class,
            candidates,
            full_only: &[],
            heuristic,
        }
    }

    /// Adds candidates timed only under `ANYGPU_AUTOTUNE=full`.
    pub(crate) fn full_only(self, full_only: &'a [&'static str]) -> Choice<'a> {
        Choice { full_only, ..self }
    }
}

/// One adapter's kernel choices.
pub(crate) struct Tuner {
    config: TuneConfig,
    /// The cache file, when there is a directory.
    file: Option<PathBuf>,
    /// Key prefix: the crate version and the hash of every shader.
    build: String,
    state: Mutex<TunerState>,
    /// Signalled when a thread stops tuning a key (`TunerState::tuning` shrinks).
    tuned: Condvar,
    /// Measurements started so far. A candidate built on another tuned op (a convolution run
    /// as a product) tunes that op inside its own warm-up; this count tells the warm-up to
    /// run again, so the nested tuning's time is not charged to the candidate.
    measurements: AtomicU64,
    /// Measurements running now, on any thread: while one runs, its candidates' kernels are
    /// asked for one after another (the pipeline cache compiles ahead then).
    running: AtomicUsize,
    clock: Clock,
}

/// Counts a measurement as running until dropped.
struct Running<'a>(&'a AtomicUsize);

impl<'a> Running<'a> {
    fn start(count: &'a AtomicUsize) -> Running<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        Running(count)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct TunerState {
    /// Op → shape class → choice: from the file, measured, or the heuristic. Nested so that a
    /// lookup borrows the caller's strings instead of building a key.
    choices: HashMap<String, HashMap<String, Known>>,
    /// The decisions listed so far (each key once), in order.
    decisions: Vec<TuningDecision>,
    /// A warning about the file has been given.
    warned: bool,
    /// The keys (op, class) being tuned, and by which thread.
    tuning: HashMap<(&'static str, String), ThreadId>,
}

/// What [`Tuner::claim`] found for a key.
enum Claim<'t> {
    /// A choice is known: run it.
    Known(&'static str),
    /// This thread tunes the key; the guard lets the others go when dropped.
    Tune(TuningGuard<'t>),
}

/// Marks a key as being tuned by this thread until dropped (on an error or panic too).
struct TuningGuard<'t> {
    tuner: &'t Tuner,
    /// `None` when this thread already held the key (a nested run of it).
    key: Option<(&'static str, String)>,
}

impl Drop for TuningGuard<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.tuner.lock().tuning.remove(&key);
            self.tuner.tuned.notify_all();
        }
    }
}

/// A choice the tuner knows.
struct Known {
    candidate: String,
    /// Measured (here or by an earlier process): written to the cache file.
    persist: bool,
    /// Already in `decisions` (a choice read from the file is listed on first use).
    listed: bool,
}

impl Tuner {
    pub(crate) fn new(config: TuneConfig, adapter: &wgpu::AdapterInfo) -> Tuner {
        let shaders = ShaderFamily::ALL
            .iter()
            .fold(FNV_OFFSET, |h, f| fnv1a(h, f.source().as_bytes()));
        let build = format!("{}+{shaders:016x}", env!("CARGO_PKG_VERSION"));
        Tuner::with_build(config, adapter, build)
    }

    /// [`Tuner::new`] with the build key given (tests pose as another build).
    fn with_build(config: TuneConfig, adapter: &wgpu::AdapterInfo, build: String) -> Tuner {
        let identity = format!(
            "{} {:?} {} {:04x}:{:04x}",
            adapter.name, adapter.backend, adapter.driver_info, adapter.vendor, adapter.device
        );
        let tuning = config.mode != TuneMode::Off && config.force.is_none();
        let file = config
            .cache_dir
            .as_deref()
            .filter(|d| tuning && usable_dir(d))
            .map(|d| {
                d.join(format!(
                    "autotune-{}-{:016x}.txt",
                    sanitize(&adapter.name),
                    fnv1a(FNV_OFFSET, identity.as_bytes())
                ))
            });
        let mut state = TunerState::default();
        if tuning {
            if let Some(path) = &file {
                match load(path, &build) {
                    Ok(entries) => {
                        for (op, class, candidate) in entries {
                            let known = Known {
                                candidate,
                                persist: true,
                                listed: false,
                            };
                            state.choices.entry(op).or_default().insert(class, known);
                        }
                    }
                    Err(e) => {
                        log::warn!(
                            "autotune cache {} unreadable ({e}); tuning in memory",
                            path.display()
                        );
                        state.warned = true;
                    }
                }
            }
        }
        Tuner {
            config,
            file,
            build,
            state: Mutex::new(state),
            tuned: Condvar::new(),
            measurements: AtomicU64::new(0),
            running: AtomicUsize::new(0),
            clock: Clock::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TunerState> {
        // Plain maps; a panic in another thread leaves them usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The known choice for (op, class), or the right to tune it: while another thread tunes
    /// it, waits for that thread's choice (or its failure, and then tunes it itself).
    fn claim(&self, op: &'static str, class: &str, candidates: &[&'static str]) -> Claim<'_> {
        let me = std::thread::current().id();
        let key = (op, class.to_string());
        let mut state = self.lock();
        loop {
            if let Some(pick) = cached_in(&mut state, op, class, candidates) {
                return Claim::Known(pick);
            }
            match state.tuning.get(&key) {
                // The key is tuned inside one of its own candidates: measure it here too, as
                // before, rather than wait for ourselves.
                Some(owner) if *owner == me => {
                    return Claim::Tune(TuningGuard {
                        tuner: self,
                        key: None,
                    })
                }
                Some(_) => {
                    state = self
                        .tuned
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                    // A warm-up that waited here is run again, like one that tuned a nested op.
                    self.measurements.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    state.tuning.insert(key.clone(), me);
                    return Claim::Tune(TuningGuard {
                        tuner: self,
                        key: Some(key),
                    });
                }
            }
        }
    }

    /// Whether candidates are being timed on this adapter now (on any thread).
    pub(crate) fn measuring(&self) -> bool {
        self.running.load(Ordering::Relaxed) > 0
    }

    /// Whether `ANYGPU_AUTOTUNE_FORCE` names the candidate every op runs.
    pub(crate) fn forced(&self) -> bool {
        self.config.force.is_some()
    }

    /// Whether every op runs its heuristic pick (`ANYGPU_AUTOTUNE=off`, nothing forced): the
    /// other candidates are never run.
    pub(crate) fn off(&self) -> bool {
        self.config.mode == TuneMode::Off && !self.forced()
    }

    /// Tells a warm-up in progress that work besides its candidate ran in it (a one-time
    /// check), so that it runs again before it counts.
    pub(crate) fn note_outside_work(&self) {
        self.measurements.fetch_add(1, Ordering::Relaxed);
    }

    /// The decisions taken in this process (measured, cached or heuristic), in order.
    pub(crate) fn decisions(&self) -> Vec<TuningDecision> {
        self.lock().decisions.clone()
    }

    /// Runs `choice`'s op with one of its candidates (`run(name)` runs one). On the first call
    /// for the key, with tuning on and several candidates, each runs a few times after a
    /// warm-up (`sync` waits for the device), the fastest is recorded, and it runs once more
    /// last so the output is its own.
    pub(crate) fn run(
        &self,
        choice: &Choice<'_>,
        sync: &dyn Fn() -> Result<()>,
        run: &mut dyn FnMut(&str) -> Result<()>,
    ) -> Result<()> {
        let (op, class, heuristic) = (choice.op, choice.class.as_str(), choice.heuristic);
        let extended: Vec<&'static str>;
        let candidates = if choice.full_only.is_empty()
            || (self.config.mode != TuneMode::Full && self.config.force.is_none())
        {
            choice.candidates
        } else {
            extended = [choice.candidates, choice.full_only].concat();
            &extended
        };
        if let Some(forced) = &self.config.force {
            let pick = candidates
                .iter()
                .find(|c| **c == forced.as_str())
                .copied()
                .unwrap_or(heuristic);
            return run(pick);
        }
        if self.config.mode == TuneMode::Off || candidates.len() < 2 {
            self.note_heuristic(op, class, heuristic);
            return run(heuristic);
        }
        let claim = match self.claim(op, class, candidates) {
            Claim::Known(pick) => return run(pick),
            Claim::Tune(guard) => guard,
        };
        // The heuristic first: a candidate far slower than it is then cut after its warm-up.
        let ordered: Vec<&'static str> = std::iter::once(heuristic)
            .filter(|h| candidates.contains(h))
            .chain(candidates.iter().copied().filter(|c| *c != heuristic))
            .collect();
        let (pick, timings) = self.measure(&ordered, sync, run)?;
        log::info!(
            "autotune: {op} [{class}] -> {pick} ({})",
            timings
                .iter()
                .map(|(c, ms)| format!("{c} {ms:.3} ms"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        {
            let mut state = self.lock();
            let known = Known {
                candidate: pick.to_string(),
                persist: true,
                listed: true,
            };
            state
                .choices
                .entry(op.to_string())
                .or_default()
                .insert(class.to_string(), known);
            state.decisions.push(TuningDecision {
                op,
                class: class.to_string(),
                candidate: pick.to_string(),
                timings_ms: timings,
                source: DecisionSource::Measured,
            });
        }
        // The choice is known: threads waiting for it go on while this one saves.
        drop(claim);
        self.save();
        run(pick)
    }

    /// Records the heuristic's choice, once per key.
    fn note_heuristic(&self, op: &'static str, class: &str, candidate: &'static str) {
        let mut state = self.lock();
        let state = &mut *state;
        let by_class = state.choices.entry(op.to_string()).or_default();
        if by_class.contains_key(class) {
            return;
        }
        let known = Known {
            candidate: candidate.to_string(),
            persist: false,
            listed: true,
        };
        by_class.insert(class.to_string(), known);
        state.decisions.push(TuningDecision {
            op,
            class: class.to_string(),
            candidate: candidate.to_string(),
            timings_ms: Vec::new(),
            source: DecisionSource::Heuristic,
        });
    }

    /// Times every candidate; returns the fastest and each one's time per run.
    ///
    /// A wait for the device costs tens of microseconds on a real GPU, as much as a small
    /// kernel, so each timed block runs a candidate enough times back to back to last about
    /// [`BLOCK`] before one wait, and the best block counts.
    fn measure(
        &self,
        candidates: &[&'static str],
        sync: &dyn Fn() -> Result<()>,
        run: &mut dyn FnMut(&str) -> Result<()>,
    ) -> Result<(&'static str, Vec<(String, f64)>)> {
        self.measurements.fetch_add(1, Ordering::Relaxed);
        let _running = Running::start(&self.running);
        let blocks = self.config.mode.timed_runs();
        let mut best: Option<(&'static str, Duration)> = None;
        // (candidate, best time per run, runs per timed block) of those not cut.
        let mut timed: Vec<(&'static str, Duration, u32)> = Vec::new();
        let mut timings = Vec::new();
        sync()?;
        for &candidate in candidates {
            // The warm-up compiles the pipelines and touches the memory. One that takes more
            // than WARM_UP_CUTOFF times the best run so far cannot win (this keeps the cold
            // start short on software adapters, where a losing candidate's run can take
            // 100 ms). Some drivers compile at the first dispatch (lavapipe: 100 ms for a
            // kernel written out at length, more than five runs of the candidate it beats), so
            // a warm-up over the cut-off that used a pipeline for the first time gets a second
            // before it counts.
            let created = PIPELINES_FIRST_USED.load(Ordering::Relaxed);
            let mut warm_up = loop {
                let nested = self.measurements.load(Ordering::Relaxed);
                let start = self.clock.now();
                run(candidate)?;
                sync()?;
                if self.measurements.load(Ordering::Relaxed) == nested {
                    break self.clock.now().saturating_sub(start);
                }
            };
            let over_cutoff = |t: Duration| best.is_some_and(|(_, b)| t > b * WARM_UP_CUTOFF);
            let compiled = PIPELINES_FIRST_USED.load(Ordering::Relaxed) != created;
            if over_cutoff(warm_up) && compiled {
                let start = self.clock.now();
                run(candidate)?;
                sync()?;
                warm_up = self.clock.now().saturating_sub(start);
            }
            if over_cutoff(warm_up) {
                timings.push((candidate.to_string(), warm_up.as_secs_f64() * 1e3));
                continue;
            }
            let probe = time_block(&self.clock, &mut *run, sync, candidate, 1)?;
            let reps = (BLOCK.as_secs_f64() / probe.as_secs_f64().max(1e-9)).ceil();
            let reps = reps.clamp(1.0, f64::from(MAX_REPS)) as u32;
            let mut per_run = probe;
            // A probe that lasted a block is one (a software adapter's large kernels: one run
            // fewer per candidate, a third of the cold start).
            let blocks = if probe >= BLOCK {
                blocks.saturating_sub(1)
            } else {
                blocks
            };
            for _ in 0..blocks {
                // Already twice as slow as the best: no need to be sure how slow.
                if best.is_some_and(|(_, b)| per_run > b * 2) {
                    break;
                }
                per_run = per_run.min(time_block(&self.clock, &mut *run, sync, candidate, reps)?);
            }
            timed.push((candidate, per_run, reps));
            if best.is_none_or(|(_, b)| per_run < b) {
                best = Some((candidate, per_run));
            }
        }
        // A close call gets a rematch, the contenders taking turns: one timed block each
        // decides otherwise, and a burst of load on the machine (a busy 2-core VM, whose
        // neighbours steal tens of milliseconds) can land on either.
        if let Some((_, b)) = best {
            let close = |t: Duration| t.as_secs_f64() <= b.as_secs_f64() * CLOSE_CALL;
            let contenders = timed.iter().filter(|(_, t, _)| close(*t)).count();
            if contenders > 1 {
                for _ in 0..REMATCH_ROUNDS {
                    for (candidate, per_run, reps) in timed.iter_mut() {
                        if close(*per_run) {
                            let t = time_block(&self.clock, &mut *run, sync, candidate, *reps)?;
                            *per_run = (*per_run).min(t);
                        }
                    }
                }
                best = timed
                    .iter()
                    .min_by_key(|(_, t, _)| *t)
                    .map(|&(c, t, _)| (c, t));
            }
        }
        for (candidate, per_run, _) in &timed {
            timings.push((candidate.to_string(), per_run.as_secs_f64() * 1e3));
        }
        timings.sort_by_key(|(c, _)| candidates.iter().position(|x| x == c));
        let pick = best.map_or(candidates[0], |(c, _)| c);
        Ok((pick, timings))
    }
}

/// A shape class: each dimension rounded up to a power of two (shapes that round alike run
/// alike), or kept exact below 8.
pub(crate) fn bucket(x: usize) -> usize {
    if x < 8 {
        x
    } else {
        x.next_power_of_two()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> wgpu::AdapterInfo {
        wgpu::AdapterInfo {
            name: "Test GPU (unit)".into(),
            vendor: 0x10de,
            device: 0x2335,
            driver_info: "1.0".into(),
            ..wgpu::AdapterInfo::new(wgpu::DeviceType::DiscreteGpu, wgpu::Backend::Vulkan)
        }
    }

    fn config(dir: &std::path::Path) -> TuneConfig {
        TuneConfig {
            mode: TuneMode::On,
            cache_dir: Some(dir.to_path_buf()),
            force: None,
            kernel_class: None,
            compile_threads: None,
            first_submit: None,
            wait_timeout: Some(WAIT_TIMEOUT),
        }
    }

    /// A tuner for `dir` whose time is virtual: candidates take the time they `spend`, whatever
    /// the machine's load (a test that slept measured the load too, and failed under it).
    fn test_tuner(dir: &std::path::Path) -> Tuner {
        virtual_time(Tuner::new(config(dir), &info()))
    }

    fn virtual_time(mut tuner: Tuner) -> Tuner {
        tuner.clock.virtual_nanos = Some(std::sync::Arc::new(AtomicU64::new(0)));
        tuner
    }

    /// Lets `ms` virtual milliseconds pass on `tuner`'s clock.
    fn spend(tuner: &Tuner, ms: u64) {
        let nanos = tuner.clock.virtual_nanos.as_ref().expect("a test tuner");
        nanos.fetch_add(ms * 1_000_000, Ordering::Relaxed);
    }

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("anygpu-tune-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&d).ok();
        d
    }

    /// Runs one tuned op whose candidate `slow` sleeps; returns what ran, in order.
    fn tune_once(tuner: &Tuner) -> Vec<String> {
        tune_class(tuner, "128x128x1024")
    }

    /// [`tune_once`] for another shape class.
    fn tune_class(tuner: &Tuner, class: &str) -> Vec<String> {
        let mut ran = Vec::new();
        tuner
            .run(
                &Choice::new("matmul", class.into(), &["slow", "fast"], "slow"),
                &|| Ok(()),
                &mut |c| {
                    if c == "slow" {
                        spend(tuner, 3);
                    }
                    ran.push(c.to_string());
                    Ok(())
                },
            )
            .unwrap();
        ran
    }

    #[test]
    fn the_fastest_candidate_is_measured_kept_and_run_last() {
        let dir = temp("measure");
        let tuner = test_tuner(&dir);
        let ran = tune_once(&tuner);
        assert_eq!(ran.last().map(String::as_str), Some("fast"));
        assert!(ran.iter().filter(|c| *c == "slow").count() >= 2);
        let d = &tuner.decisions()[0];
        assert_eq!(
            (d.candidate.as_str(), d.source),
            ("fast", DecisionSource::Measured)
        );
        assert_eq!(d.timings_ms.len(), 2);
        // The same key again: no measuring.
        assert_eq!(tune_once(&tuner), ["fast"]);
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_candidate_whose_warm_up_is_far_slower_is_not_timed_further() {
        let dir = temp("cutoff");
        let tuner = test_tuner(&dir);
        let mut ran = Vec::new();
        // Listed first, but the heuristic (fast) is measured first, and slow is cut.
        let choice = Choice::new("sum_rows", "1024x32".into(), &["slow", "fast"], "fast");
        tuner
            .run(&choice, &|| Ok(()), &mut |c| {
                if c == "slow" {
                    spend(&tuner, 3);
                }
                ran.push(c.to_string());
                Ok(())
            })
            .unwrap();
        assert_eq!(ran.first().map(String::as_str), Some("fast"), "{ran:?}");
        // Its warm-up, then it is cut (a second warm-up only when a pipeline was created
        // meanwhile, which another test running at the same time may do).
        let slow_runs = ran.iter().filter(|c| *c == "slow").count();
        assert!((1..=2).contains(&slow_runs), "{ran:?}");
        assert_eq!(ran.last().map(String::as_str), Some("fast"));
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_close_call_is_timed_again_so_one_slow_block_does_not_decide_it() {
        // `better` is faster, but its one timed block (the second run) lands in a burst of
        // load: within CLOSE_CALL of `heuristic`, it is timed again and wins.
        let dir = temp("rematch");
        let tuner = test_tuner(&dir);
        let mut runs_of_better = 0;
        let pick = std::cell::Cell::new("");
        let choice = Choice::new(
            "matmul",
            "v4 8x8x8".into(),
            &["heuristic", "better"],
            "heuristic",
        );
        tuner
            .run(&choice, &|| Ok(()), &mut |c| {
                let ms = if c == "better" {
                    runs_of_better += 1;
                    if runs_of_better == 2 {
                        12
                    } else {
                        7
                    }
                } else {
                    10
                };
                spend(&tuner, ms);
                pick.set(if c == "better" { "better" } else { "heuristic" });
                Ok(())
            })
            .unwrap();
        assert_eq!(pick.get(), "better", "the last run is the pick");
        assert!(
            runs_of_better >= 4,
            "warm-up, probe, rematches: {runs_of_better}"
        );
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_candidate_slow_only_on_its_first_run_still_wins() {
        // A driver that compiles at the first dispatch makes the first run of every candidate
        // slow; the faster kernel must not be cut for it.
        let dir = temp("compile");
        let tuner = test_tuner(&dir);
        let mut first_runs = std::collections::HashSet::new();
        let choice = Choice::new("conv2d", "3x3".into(), &["direct", "better"], "direct");
        let pick = std::cell::Cell::new("");
        tuner
            .run(&choice, &|| Ok(()), &mut |c| {
                let compiling = if first_runs.insert(c.to_string()) {
                    PIPELINES_FIRST_USED.fetch_add(1, Ordering::Relaxed);
                    20
                } else {
                    0
                };
                let kernel = if c == "better" { 1 } else { 2 };
                spend(&tuner, compiling + kernel);
                pick.set(if c == "better" { "better" } else { "direct" });
                Ok(())
            })
            .unwrap();
        assert_eq!(pick.get(), "better", "the last run is the pick");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_nested_tuning_is_not_charged_to_the_candidate_that_triggered_it() {
        // `product` runs another tuned op; its first warm-up tunes that op (slowly), and that
        // must not count against it.
        let dir = temp("nested");
        let tuner = test_tuner(&dir);
        let sleep = |ms| spend(&tuner, ms);
        let outer = Choice::new(
            "pointwise_conv",
            "fwd 8x8x8".into(),
            &["direct", "product"],
            "direct",
        );
        let inner = Choice::new("matmul", "v4 8x8x8".into(), &["slow", "fast"], "slow");
        tuner
            .run(&outer, &|| Ok(()), &mut |c| {
                if c == "direct" {
                    sleep(4);
                    return Ok(());
                }
                tuner.run(&inner, &|| Ok(()), &mut |c| {
                    sleep(if c == "slow" { 30 } else { 1 });
                    Ok(())
                })
            })
            .unwrap();
        let picks: Vec<_> = tuner
            .decisions()
            .iter()
            .map(|d| d.candidate.clone())
            .collect();
        assert_eq!(picks, ["fast", "product"]);
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_second_process_reads_the_choice_from_the_cache() {
        let dir = temp("cache");
        tune_once(&test_tuner(&dir));
        let again = test_tuner(&dir);
        assert_eq!(tune_once(&again), ["fast"]);
        assert_eq!(again.decisions()[0].source, DecisionSource::Cached);
        // Another build's entries are never used.
        let other = virtual_time(Tuner::with_build(config(&dir), &info(), "0.0.0+0".into()));
        assert!(tune_once(&other).len() > 1);
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_corrupt_or_unwritable_cache_means_tuning_in_memory() {
        let dir = temp("corrupt");
        let tuner = test_tuner(&dir);
        tune_once(&tuner);
        let file = tuner.file.clone().unwrap();
        for garbage in [
            &b"\x00\xff garbage"[..],
            b"",
            b"# anygpu autotune cache v1: key<TAB>candidate\nno tab here\n",
        ] {
            std::fs::write(&file, garbage).unwrap();
            let t = test_tuner(&dir);
            assert!(tune_once(&t).len() > 1, "tuned again after {garbage:?}");
            // ... and the file is whole again.
            let next = test_tuner(&dir);
            assert_eq!(tune_once(&next), ["fast"], "after {garbage:?}");
        }
        // A file where the directory should be: nothing can be written, tuning still works.
        let blocked = temp("blocked");
        std::fs::write(&blocked, b"not a directory").unwrap();
        let t = virtual_time(Tuner::new(config(&blocked.join("sub")), &info()));
        assert_eq!(tune_once(&t).last().map(String::as_str), Some("fast"));
        assert_eq!(tune_once(&t), ["fast"]);
        std::fs::remove_file(blocked).ok();
        std::fs::remove_dir_all(dir).ok();
    }

    /// `temp(name)`, created with mode 0700 (as a first save would).
    #[cfg(unix)]
    fn private_temp(name: &str) -> PathBuf {
        use std::os::unix::fs::DirBuilderExt;
        let dir = temp(name);
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        dir
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_a_link_to_dev_zero_or_a_huge_file_as_the_cache_is_ignored_at_once() {
        let dir = private_temp("special");
        let file = test_tuner(&dir).file.unwrap();
        let plant: [(&str, &dyn Fn()); 3] = [
            ("a FIFO", &|| {
                let made = std::process::Command::new("mkfifo").arg(&file).status();
                assert!(made.unwrap().success());
            }),
            ("a link to /dev/zero", &|| {
                std::os::unix::fs::symlink("/dev/zero", &file).unwrap();
            }),
            // Sparse: read whole it would take a second and 2 GiB of memory.
            ("a 2 GiB file", &|| {
                let f = std::fs::File::create(&file).unwrap();
                f.set_len(2 << 30).unwrap();
            }),
        ];
        for (what, plant) in plant {
            plant();
            // On a thread, so that a hang fails the test instead of stalling it.
            let (tx, rx) = std::sync::mpsc::channel();
            let cfg = config(&dir);
            std::thread::spawn(move || {
                // The test may have given up waiting.
                let _ = tx.send(virtual_time(Tuner::new(cfg, &info())));
            });
            let tuner = rx
                .recv_timeout(Duration::from_millis(300))
                .unwrap_or_else(|_| panic!("{what} as the cache file was read or waited on"));
            assert!(tune_once(&tuner).len() > 1, "{what}: tuned again");
            // The save replaced it with a real cache file.
            let next = test_tuner(&dir);
            assert_eq!(tune_once(&next), ["fast"], "after {what}");
            std::fs::remove_file(&file).unwrap();
        }
        std::fs::remove_dir_all(dir).ok();
    }

    #[cfg(unix)]
    #[test]
    fn a_cache_directory_others_can_write_to_is_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let dir = temp("shared");
        let tuner = test_tuner(&dir);
        tune_once(&tuner);
        let file = tuner.file.clone().unwrap();
        let saved = std::fs::read(&file).unwrap();
        for mode in [0o777, 0o770] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
            // Anyone could have written this file: it is neither read nor written.
            let t = test_tuner(&dir);
            assert!(tune_once(&t).len() > 1, "mode {mode:o}: tuned again");
            assert_eq!(std::fs::read(&file).unwrap(), saved, "mode {mode:o}");
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::remove_dir_all(dir).ok();
    }

    #[cfg(unix)]
    #[test]
    fn a_save_does_not_follow_a_link_planted_at_the_old_temporary_name() {
        let dir = private_temp("planted");
        let victim_dir = private_temp("victim");
        let victim = victim_dir.join("precious");
        std::fs::write(&victim, b"precious").unwrap();
        let tuner = test_tuner(&dir);
        let file = tuner.file.clone().unwrap();
        // The name saves went through before: `<file>.tmp<pid>`.
        let old_temp = file.with_extension(format!("tmp{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &old_temp).unwrap();
        tune_once(&tuner);
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        let meta = std::fs::symlink_metadata(&file).unwrap();
        assert!(meta.file_type().is_file(), "the cache file is no link");
        assert_eq!(tune_once(&test_tuner(&dir)), ["fast"]);
        std::fs::remove_dir_all(dir).ok();
        std::fs::remove_dir_all(victim_dir).ok();
    }

    #[test]
    fn processes_saving_different_keys_merge_their_choices() {
        // Two processes, both started before either saved.
        let dir = temp("merge");
        let first = test_tuner(&dir);
        let second = test_tuner(&dir);
        assert!(tune_class(&first, "8x8x8").len() > 1);
        assert!(tune_class(&second, "16x16x16").len() > 1);
        let third = test_tuner(&dir);
        assert_eq!(tune_class(&third, "8x8x8"), ["fast"], "the first's choice");
        assert_eq!(tune_class(&third, "16x16x16"), ["fast"], "the second's");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn threads_tuning_one_key_at_once_measure_it_once() {
        let dir = temp("threads");
        let tuner = test_tuner(&dir);
        let start = std::sync::Barrier::new(2);
        let mut ran: Vec<Vec<String>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        tune_once(&tuner)
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        ran.sort_by_key(Vec::len);
        assert_eq!(
            ran[0],
            ["fast"],
            "the other thread's choice, untimed: {ran:?}"
        );
        assert!(ran[1].len() > 1, "{ran:?}");
        assert_eq!(tuner.decisions().len(), 1);
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn off_and_forced_modes_measure_nothing() {
        let dir = temp("off");
        let off = virtual_time(Tuner::new(
            TuneConfig {
                mode: TuneMode::Off,
                ..config(&dir)
            },
            &info(),
        ));
        assert_eq!(tune_once(&off), ["slow"]);
        assert_eq!(off.decisions()[0].source, DecisionSource::Heuristic);
        let forced = virtual_time(Tuner::new(
            TuneConfig {
                force: Some("fast".into()),
                ..config(&dir)
            },
            &info(),
        ));
        assert_eq!(tune_once(&forced), ["fast"]);
        assert!(!dir.exists(), "nothing written");
    }

    #[test]
    fn modes_parse_like_the_docs_say() {
        assert_eq!(TuneMode::parse(None), TuneMode::On);
        assert_eq!(TuneMode::parse(Some("off")), TuneMode::Off);
        assert_eq!(TuneMode::parse(Some("full")), TuneMode::Full);
        assert_eq!(TuneMode::parse(Some("sideways")), TuneMode::On);
        assert_eq!(bucket(5), 5);
        assert_eq!(bucket(100), 128);
    }

    #[test]
    fn compile_threads_parse_like_the_docs_say() {
        let threads = |value: &str| {
            TuneConfig::from_env(|k| (k == "ANYGPU_COMPILE_THREADS").then(|| value.to_string()))
                .compile_threads
        };
        assert_eq!(threads("0"), Some(0));
        assert_eq!(threads(" 3 "), Some(3));
        assert_eq!(threads("100000"), Some(MAX_COMPILE_THREADS));
        // Not a number, or unset: the adapter's default.
        assert_eq!(threads("many"), None);
        assert_eq!(threads(""), None);
        assert_eq!(TuneConfig::from_env(|_| None).compile_threads, None);
    }

    #[test]
    fn wait_timeout_parses_like_the_docs_say() {
        let parse = |value: Option<&str>| {
            TuneConfig::from_env(|k| {
                (k == "ANYGPU_WAIT_TIMEOUT_S")
                    .then(|| value.map(str::to_string))
                    .flatten()
            })
            .wait_timeout
        };
        assert_eq!(parse(None), Some(WAIT_TIMEOUT));
        assert_eq!(parse(Some("")), Some(WAIT_TIMEOUT));
        assert_eq!(parse(Some("30")), Some(Duration::from_secs(30)));
        assert_eq!(parse(Some(" 0.25 ")), Some(Duration::from_millis(250)));
        assert_eq!(parse(Some("0")), None);
        assert_eq!(parse(Some("1e300")), None);
        for bad in ["-1", "ten", "NaN"] {
            assert_eq!(parse(Some(bad)), Some(WAIT_TIMEOUT), "{bad}");
        }
    }

    #[test]
    fn first_submit_parses_like_the_docs_say() {
        let first = |value: &str| {
            TuneConfig::from_env(|k| (k == "ANYGPU_FIRST_SUBMIT").then(|| value.to_string()))
                .first_submit
        };
        assert_eq!(first(" 16 "), Some(16));
        assert_eq!(first("1000"), Some(1000));
        // Zero, not a number, or unset: the stream's default.
        assert_eq!(first("0"), None);
        assert_eq!(first("-4"), None);
        assert_eq!(first("soon"), None);
        assert_eq!(first(""), None);
        assert_eq!(TuneConfig::from_env(|_| None).first_submit, None);
    }
}
