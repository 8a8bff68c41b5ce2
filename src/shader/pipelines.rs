//! Per-adapter cache of compiled kernels: shader modules, bind group layouts and compute
//! pipelines, each made once, on first use.
//!
//! A driver compiles a pipeline on the host, and a first training step that tunes its kernels
//! asks for a hundred of them one after another: the tuner runs each candidate of an op, and the
//! candidates are mostly entry points of one shader file. So on hardware adapters, while the
//! tuner measures, the first kernel asked of a file sends the file's other entry points to
//! background threads; by the time the tuner gets to them they are ready, or being finished by
//! the thread that started them (an op never compiles a kernel twice, and never waits behind a
//! queue: it compiles what it needs itself when no thread has started it). The tuner's waits
//! wait for the queue to drain too, so no compile runs beside a timed block. Outside tuning
//! nothing is compiled ahead: a program that runs a few kernels compiles just those. Software
//! adapters compile on the cores that run their kernels, so they get no background threads
//! unless asked (`ANYGPU_COMPILE_THREADS`).
//!
//! What goes wrong stays with the kernel it went wrong on: a compile the driver refuses
//! (validation, internal or out-of-memory errors, each caught in its own error scope) or one
//! that panics leaves an error in that kernel's slot, which the op that uses it reports; the
//! background thread goes on with its queue. A compile stuck in the driver costs one wait of
//! [`QUIET_WAIT`], after which nothing more is compiled ahead on that adapter. A dropped cache
//! waits (at most [`DROP_WAIT`]) for its threads and joins them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{capabilities_of, validate_source, EntryInfo, Kernel, ShaderFamily, Validated};
use crate::error::{Error, Result};

/// Compute pipelines first handed to an op in this process, on any adapter: the tuner's hint
/// that a candidate's first run included compiling (some drivers, lavapipe among them, finish
/// compiling at the first dispatch).
pub(crate) static PIPELINES_FIRST_USED: AtomicU64 = AtomicU64::new(0);

/// Background compile threads an adapter gets by default: one per core but the one recording,
/// at most 8 (more would only take cores from the host side of other work); none for software
/// adapters, nor on GL, whose driver compiles under the context lock that every submission takes
/// too (wgpu's GL backend has one), so a background compile would hold up the ops rather than
/// run beside them.
pub(crate) fn default_compile_threads(adapter: &wgpu::AdapterInfo) -> usize {
    if adapter.device_type == wgpu::DeviceType::Cpu || adapter.backend == wgpu::Backend::Gl {
        return 0;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.saturating_sub(1).min(8)
}

/// A family in one precision: the key of a compiled module.
type ModuleKey = (ShaderFamily, bool);

/// A compiled kernel and the bind group layout its bindings follow.
pub(crate) struct Pipeline {
    /// The kernel's entry point, as the profiler names it.
    pub(crate) name: &'static str,
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
    /// The storage bindings the entry point uses, ascending: the i-th tensor passed to a
    /// dispatch goes to `bindings[i]`.
    pub(crate) bindings: Vec<u32>,
}

/// A bind group layout's bindings besides the params: all of them, and the uniform ones.
type LayoutKey = (Vec<u32>, Vec<u32>);

/// What [`PipelineCache::stats`] reports.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CompileStats {
    /// Pipelines compiled, on any thread.
    pub(crate) compiled: u64,
    /// Host time ops spent getting pipelines they asked for compiled: compiling them, waiting
    /// for a background thread that had started, or for the queue to drain before a timing.
    pub(crate) wait_nanos: u64,
}

/// Per-adapter cache of shader modules, layouts and pipelines; see the module docs.
pub(crate) struct PipelineCache {
    shared: Arc<Shared>,
}

/// A pipeline being compiled, or compiled (or the reason it could not be).
#[derive(Default)]
struct Slot {
    pipeline: OnceLock<std::result::Result<Arc<Pipeline>, String>>,
    /// Handed to an op at least once (see [`PIPELINES_FIRST_USED`]).
    used: AtomicBool,
}

/// What the cache and its background threads share.
struct Shared {
    device: wgpu::Device,
    capabilities: naga::valid::Capabilities,
    limits: wgpu::Limits,
    modules: Mutex<HashMap<ModuleKey, std::result::Result<ModuleInfo, String>>>,
    layouts: Mutex<HashMap<LayoutKey, wgpu::BindGroupLayout>>,
    pipelines: Mutex<HashMap<Kernel, Arc<Slot>>>,
    /// Kernels for the background threads, and how many threads run.
    queue: Mutex<Queue>,
    /// Signalled when a background thread stops.
    stopped: Condvar,
    threads: usize,
    /// How long [`PipelineCache::wait_for_compiles`] waits at most ([`QUIET_WAIT`]).
    quiet_wait: Duration,
    compiled: AtomicU64,
    wait_nanos: AtomicU64,
    /// A kernel whose compile panics or hangs, to test what the cache does then.
    #[cfg(test)]
    fault: Option<(&'static str, Fault)>,
}

#[derive(Default)]
struct Queue {
    kernels: VecDeque<Kernel>,
    /// Modules whose entry points were queued (each once).
    queued: HashSet<ModuleKey>,
    running: usize,
    /// The background threads started, joined when the cache is dropped.
    handles: Vec<JoinHandle<()>>,
    /// The cache is gone: threads stop after the kernel at hand.
    closed: bool,
    /// A wait for the threads ran out of time (a compile stuck in the driver): nothing more is
    /// queued, and later waits do not wait again.
    stalled: bool,
}

struct ModuleInfo {
    module: wgpu::ShaderModule,
    /// Each entry point's workgroup size and storage bindings.
    entries: HashMap<String, EntryInfo>,
    /// Bytes of workgroup memory the module declares.
    workgroup_bytes: u64,
}

/// Entry point `name` as a slice of the family's source, at its declaration (`fn name(`): it
/// lives as long as a [`Kernel`]'s entry name must (a float16 twin's entry points have the
/// names of the float32 source's), and where it lies is its place in the file.
fn in_source(source: &'static str, name: &str) -> Option<&'static str> {
    let at = source.find(&format!("fn {name}("))? + "fn ".len();
    Some(&source[at..at + name.len()])
}

impl ModuleInfo {
    fn entry(&self, kernel: Kernel) -> std::result::Result<&EntryInfo, String> {
        self.entries.get(kernel.entry).ok_or_else(|| {
            format!(
                "{} has no entry point {}",
                kernel.family.file(),
                kernel.entry
            )
        })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every map here is only ever inserted into: one left by a panic is still consistent.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl PipelineCache {
    /// A cache for `device`; `threads` background compile threads (0: none).
    pub(crate) fn new(
        device: &wgpu::Device,
        features: wgpu::Features,
        limits: &wgpu::Limits,
        threads: usize,
    ) -> PipelineCache {
        PipelineCache {
            shared: Arc::new(Shared {
                device: device.clone(),
                capabilities: capabilities_of(features),
                limits: limits.clone(),
                modules: Mutex::new(HashMap::new()),
                layouts: Mutex::new(HashMap::new()),
                pipelines: Mutex::new(HashMap::new()),
                queue: Mutex::new(Queue::default()),
                stopped: Condvar::new(),
                threads,
                quiet_wait: QUIET_WAIT,
                compiled: AtomicU64::new(0),
                wait_nanos: AtomicU64::new(0),
                #[cfg(test)]
                fault: None,
            }),
        }
    }

    /// Whether the adapter can run `kernel`, decided from the shader itself: naga validates the
    /// family against the adapter's capabilities (f16, subgroups, ...), and the entry point's
    /// workgroup size and the module's workgroup memory are checked against its limits.
    /// `Err` holds what is missing, for `Error::Unsupported` and soft placement.
    pub(crate) fn check(&self, kernel: Kernel) -> std::result::Result<(), String> {
        self.shared.check(kernel)
    }

    /// The pipeline for `kernel`, compiled on first use; `ahead` (the tuner is measuring): the
    /// first use of a file's kernel has its siblings compiled in the background.
    pub(crate) fn get(
        &self,
        kernel: Kernel,
        device_name: &str,
        ahead: bool,
    ) -> Result<Arc<Pipeline>> {
        let shared = &self.shared;
        let known = lock(&shared.pipelines).get(&kernel).cloned();
        let slot = match known {
            Some(slot) => slot,
            None => {
                shared.check(kernel).map_err(|missing| Error::Unsupported {
                    op: kernel.entry,
                    device: device_name.to_string(),
                    missing,
                })?;
                let slot = Arc::clone(lock(&shared.pipelines).entry(kernel).or_default());
                if ahead {
                    Shared::queue_siblings(shared, kernel);
                }
                slot
            }
        };
        let pipeline = match slot.pipeline.get() {
            Some(done) => done.clone(),
            None => {
                let start = Instant::now();
                let done = slot.pipeline.get_or_init(|| shared.compile(kernel)).clone();
                shared.waited(start);
                done
            }
        };
        // Read first: every dispatch passes here, and a write would bounce the line between cores.
        if !slot.used.load(Ordering::Relaxed) && !slot.used.swap(true, Ordering::Relaxed) {
            PIPELINES_FIRST_USED.fetch_add(1, Ordering::Relaxed);
        }
        pipeline.map_err(|message| Error::Gpu {
            device: device_name.to_string(),
            message,
        })
    }

    /// Puts `pipeline` in `kernel`'s place, as if compiled (a test runs code that dispatches
    /// `kernel` on a stand-in: the tensor-core kernels' emulation where there are none).
    #[cfg(test)]
    pub(crate) fn replace_for_test(&self, kernel: Kernel, pipeline: Pipeline) {
        let slot = Slot::default();
        let _ = slot.pipeline.set(Ok(Arc::new(pipeline)));
        lock(&self.shared.pipelines).insert(kernel, Arc::new(slot));
    }

    /// Waits until the background threads have compiled everything queued (at most
    /// [`QUIET_WAIT`]): the tuner times candidates on a quiet host and driver, so that a compile
    /// beside a timed block cannot make a candidate look slow (its pick is kept on disk). A
    /// wait that runs out of time stops the background compiles for good (the ops compile what
    /// they use), so that a compile stuck in the driver costs it once, not at every timing.
    pub(crate) fn wait_for_compiles(&self) {
        let shared = &self.shared;
        let start = Instant::now();
        let mut queue = lock(&shared.queue);
        if queue.stalled {
            return;
        }
        queue = shared.wait_for_threads(queue, shared.quiet_wait);
        if queue.running > 0 {
            queue.stalled = true;
            queue.kernels.clear();
            log::warn!(
                "{} background pipeline compiles still running after {:?}: no more kernels are \
                 compiled ahead on this adapter (each compiles when first used)",
                queue.running,
                shared.quiet_wait
            );
        }
        drop(queue);
        shared.waited(start);
    }

    /// Pipelines compiled so far, and the time ops waited for them.
    pub(crate) fn stats(&self) -> CompileStats {
        CompileStats {
            compiled: self.shared.compiled.load(Ordering::Relaxed),
            wait_nanos: self.shared.wait_nanos.load(Ordering::Relaxed),
        }
    }
}

/// How long dropping a cache waits for its background threads to finish the compiles they
/// started (a driver torn down under a compiling thread may crash it).
const DROP_WAIT: Duration = Duration::from_secs(10);

/// How long [`PipelineCache::wait_for_compiles`] waits at most (a file's kernels compile in
/// well under a second on a GPU driver; a hung one must not hang the tuner).
const QUIET_WAIT: Duration = Duration::from_secs(60);

impl Drop for PipelineCache {
    fn drop(&mut self) {
        let mut queue = lock(&self.shared.queue);
        queue.closed = true;
        queue.kernels.clear();
        let mut queue = self.shared.wait_for_threads(queue, DROP_WAIT);
        if queue.running > 0 {
            log::warn!(
                "{} pipeline compiles still running after {DROP_WAIT:?}; not waiting for them",
                queue.running
            );
            return;
        }
        // Every thread has counted itself out and is returning: joined, they have dropped
        // their share of the device's objects before the caller goes on (to exit, say).
        let handles = std::mem::take(&mut queue.handles);
        drop(queue);
        for handle in handles {
            let _ = handle.join();
        }
    }
}

impl Shared {
    /// Counts the time since `start` as waited for pipelines.
    fn waited(&self, start: Instant) {
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.wait_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Waits (at most `limit`) until no background thread runs, and hands the queue back
    /// (`running` is how many still do).
    fn wait_for_threads<'a>(
        &self,
        mut queue: MutexGuard<'a, Queue>,
        limit: Duration,
    ) -> MutexGuard<'a, Queue> {
        let deadline = Instant::now() + limit;
        while queue.running > 0 {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            queue = self
                .stopped
                .wait_timeout(queue, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        queue
    }

    fn check(&self, kernel: Kernel) -> std::result::Result<(), String> {
        let mut modules = lock(&self.modules);
        let info = modules
            .entry((kernel.family, kernel.half))
            .or_insert_with(|| self.load(kernel.family, kernel.half))
            .as_ref()
            .map_err(Clone::clone)?;
        let entry = info.entry(kernel)?;
        let size = &entry.workgroup_size;
        let invocations: u32 = size.iter().product();
        let l = &self.limits;
        if invocations > l.max_compute_invocations_per_workgroup
            || size[0] > l.max_compute_workgroup_size_x
            || size[1] > l.max_compute_workgroup_size_y
            || size[2] > l.max_compute_workgroup_size_z
        {
            return Err(format!(
                "workgroup size {size:?} exceeds max_compute_invocations_per_workgroup ({})",
                l.max_compute_invocations_per_workgroup
            ));
        }
        if info.workgroup_bytes > u64::from(l.max_compute_workgroup_storage_size) {
            return Err(format!(
                "{} bytes of workgroup memory exceed max_compute_workgroup_storage_size ({})",
                info.workgroup_bytes, l.max_compute_workgroup_storage_size
            ));
        }
        let storage = entry.bindings.len() - entry.uniform.len();
        if storage as u32 > l.max_storage_buffers_per_shader_stage {
            return Err(format!(
                "{storage} storage buffers exceed max_storage_buffers_per_shader_stage ({})",
                l.max_storage_buffers_per_shader_stage
            ));
        }
        Ok(())
    }

    fn load(&self, family: ShaderFamily, half: bool) -> std::result::Result<ModuleInfo, String> {
        let source = family.source_in(half)?;
        let Validated {
            entries,
            workgroup_bytes,
            ..
        } = validate_source(family.file(), &source, self.capabilities)?;
        log::debug!(
            "compiling {}{} for {:?}",
            family.file(),
            if half { " (float16)" } else { "" },
            self.device
        );
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(family.file()),
                source: wgpu::ShaderSource::Wgsl(source),
            });
        Ok(ModuleInfo {
            module,
            entries,
            workgroup_bytes,
        })
    }

    /// Queues the other entry points of `kernel`'s module for the background threads (once per
    /// module), and starts threads up to the cache's count.
    fn queue_siblings(shared: &Arc<Shared>, kernel: Kernel) {
        if shared.threads == 0 {
            return;
        }
        let key = (kernel.family, kernel.half);
        let source = kernel.family.source();
        let mut siblings: Vec<&'static str> = {
            let modules = lock(&shared.modules);
            let Some(Ok(info)) = modules.get(&key) else {
                return;
            };
            info.entries
                .keys()
                .filter(|name| name.as_str() != kernel.entry)
                .filter_map(|name| in_source(source, name))
                .collect()
        };
        // In the order of the file: deterministic, and files list their usual picks first.
        siblings.sort_by_key(|name| name.as_ptr());
        let mut queue = lock(&shared.queue);
        if queue.closed || queue.stalled || !queue.queued.insert(key) {
            return;
        }
        queue
            .kernels
            .extend(siblings.into_iter().map(|entry| Kernel { entry, ..kernel }));
        while queue.running < shared.threads && queue.running < queue.kernels.len() {
            let worker = Arc::clone(shared);
            let spawned = std::thread::Builder::new()
                .name("anygpu-compile".into())
                .spawn(move || worker.compile_queued());
            let Ok(handle) = spawned else {
                // No thread: the ops compile what they use, as without background threads.
                break;
            };
            queue.handles.retain(|h| !h.is_finished());
            queue.handles.push(handle);
            queue.running += 1;
        }
    }

    /// A background thread's loop: compiles queued kernels until the queue is empty.
    fn compile_queued(&self) {
        let mut worker = CountedOut {
            shared: self,
            counted: false,
        };
        loop {
            let kernel = {
                let mut queue = lock(&self.queue);
                match queue.kernels.pop_front() {
                    Some(kernel) if !queue.closed => kernel,
                    _ => {
                        // Under the lock that found the queue empty: a kernel queued after
                        // this starts a thread of its own.
                        worker.count_out(&mut queue);
                        return;
                    }
                }
            };
            if self.check(kernel).is_err() {
                continue;
            }
            let slot = Arc::clone(lock(&self.pipelines).entry(kernel).or_default());
            slot.pipeline.get_or_init(|| self.compile(kernel));
        }
    }

    /// Compiles `kernel` (its module is loaded: `check` passed). A panic in wgpu or the driver
    /// is this kernel's error, as a failed compile is: the op that uses the kernel reports it,
    /// and the background thread that met it goes on with its queue.
    fn compile(&self, kernel: Kernel) -> std::result::Result<Arc<Pipeline>, String> {
        catch_unwind(AssertUnwindSafe(|| self.compile_unguarded(kernel))).unwrap_or_else(|panic| {
            let why = panic
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("a panic without a message");
            Err(format!(
                "compiling {}::{} panicked: {why}",
                kernel.family.file(),
                kernel.entry
            ))
        })
    }

    fn compile_unguarded(&self, kernel: Kernel) -> std::result::Result<Arc<Pipeline>, String> {
        #[cfg(test)]
        if let Some((entry, fault)) = self.fault {
            if entry == kernel.entry {
                fault.strike(entry);
            }
        }
        let (module, bindings, uniform) = {
            let modules = lock(&self.modules);
            let info = modules
                .get(&(kernel.family, kernel.half))
                .and_then(|m| m.as_ref().ok())
                .ok_or_else(|| format!("{} failed to load", kernel.family.file()))?;
            let entry = info.entry(kernel)?;
            (
                info.module.clone(),
                entry.bindings.clone(),
                entry.uniform.clone(),
            )
        };
        // Error scopes are per thread: these see only this pipeline's errors. Validation is
        // what a shader the adapter cannot take gives; a driver that fails to compile one gives
        // an internal error (or out of memory), which without a scope would land in the
        // device's error sink and fail whatever op waits next.
        let scopes = [
            wgpu::ErrorFilter::Validation,
            wgpu::ErrorFilter::Internal,
            wgpu::ErrorFilter::OutOfMemory,
        ]
        .map(|filter| self.device.push_error_scope(filter));
        let layout = self.layout(&bindings, &uniform);
        let pipeline_layout = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(kernel.entry),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(kernel.entry),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some(kernel.entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &[],
                    // Our kernels write workgroup memory before reading it; zeroing it first
                    // would cost a pass over it per workgroup.
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
        // The innermost scope first.
        let errors: Vec<String> = scopes
            .into_iter()
            .rev()
            .filter_map(|scope| pollster::block_on(scope.pop()))
            .map(|err| err.to_string())
            .collect();
        if !errors.is_empty() {
            return Err(format!(
                "compiling {}::{} failed: {}",
                kernel.family.file(),
                kernel.entry,
                errors.join("; ")
            ));
        }
        self.compiled.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(Pipeline {
            name: kernel.entry,
            pipeline,
            layout,
            bindings,
        }))
    }

    fn layout(&self, bindings: &[u32], uniform: &[u32]) -> wgpu::BindGroupLayout {
        let mut layouts = lock(&self.layouts);
        layouts
            .entry((bindings.to_vec(), uniform.to_vec()))
            .or_insert_with(|| {
                let mut entries = vec![wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        // One bind group serves every dispatch over the same tensors: the
                        // params slot is a dynamic offset into the ring.
                        has_dynamic_offset: true,
                        min_binding_size: None,
                    },
                    count: None,
                }];
                entries.extend(bindings.iter().map(|&binding| wgpu::BindGroupLayoutEntry {
                    binding,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: if uniform.contains(&binding) {
                            wgpu::BufferBindingType::Uniform
                        } else {
                            wgpu::BufferBindingType::Storage { read_only: false }
                        },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                }));
                self.device
                    .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                        label: Some("anygpu tensors"),
                        entries: &entries,
                    })
            })
            .clone()
    }
}

/// A background thread's share of [`Queue::running`], given back however the thread stops: a
/// thread that unwound without it would leave every later wait for the threads waiting its
/// full time.
struct CountedOut<'a> {
    shared: &'a Shared,
    counted: bool,
}

impl CountedOut<'_> {
    fn count_out(&mut self, queue: &mut Queue) {
        if !self.counted {
            self.counted = true;
            queue.running -= 1;
            self.shared.stopped.notify_all();
        }
    }
}

impl Drop for CountedOut<'_> {
    fn drop(&mut self) {
        if !self.counted {
            let shared = self.shared;
            self.count_out(&mut lock(&shared.queue));
        }
    }
}

/// What a test makes a kernel's compile do.
#[cfg(test)]
#[derive(Clone, Copy, Debug)]
enum Fault {
    Panic,
    Hang(Duration),
}

#[cfg(test)]
impl Fault {
    fn strike(self, entry: &str) {
        match self {
            Fault::Panic => panic!("{entry}: a fault the test asked for"),
            Fault::Hang(time) => std::thread::sleep(time),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn software_adapters_and_gl_compile_on_the_ops_thread_and_gpus_on_all_but_one_core() {
        use wgpu::{Backend, DeviceType};
        let threads = |device_type, backend| {
            default_compile_threads(&wgpu::AdapterInfo::new(device_type, backend))
        };
        assert_eq!(threads(DeviceType::Cpu, Backend::Vulkan), 0);
        assert_eq!(threads(DeviceType::DiscreteGpu, Backend::Gl), 0);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let gpu = threads(DeviceType::DiscreteGpu, Backend::Vulkan);
        assert_eq!(gpu, (cores - 1).min(8));
        assert_eq!(threads(DeviceType::IntegratedGpu, Backend::Metal), gpu);
    }

    /// A Vulkan device of the first adapter there is (lavapipe here), or `None` (the test
    /// skips, unless `ANYGPU_REQUIRE_ADAPTER=1`).
    fn vulkan_device() -> Option<(wgpu::Device, wgpu::Features, wgpu::Limits)> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: wgpu::Backends::VULKAN,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapter =
            pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default()));
        let Ok(adapter) = adapter else {
            assert!(
                std::env::var("ANYGPU_REQUIRE_ADAPTER").as_deref() != Ok("1"),
                "ANYGPU_REQUIRE_ADAPTER=1 but no Vulkan adapter"
            );
            eprintln!("SKIPPED: no Vulkan adapter");
            return None;
        };
        let (device, _queue) =
            pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor::default()))
                .expect("a device");
        Some((device, wgpu::Features::empty(), wgpu::Limits::default()))
    }

    /// `elementwise.wgsl`'s kernel `entry`.
    fn elementwise(entry: &str) -> Kernel {
        let family = ShaderFamily::Elementwise;
        let entry = in_source(family.source(), entry).expect("an entry point");
        Kernel::new(family, entry)
    }

    /// A cache of `threads` threads on `device` whose compile of `entry` meets `fault`.
    fn faulty(
        (device, features, limits): &(wgpu::Device, wgpu::Features, wgpu::Limits),
        threads: usize,
        entry: &str,
        fault: Fault,
    ) -> PipelineCache {
        let mut cache = PipelineCache::new(device, *features, limits, threads);
        let shared = Arc::get_mut(&mut cache.shared).expect("not shared yet");
        shared.fault = Some((elementwise(entry).entry, fault));
        cache
    }

    #[test]
    fn a_compile_that_panics_is_its_kernels_error_and_the_threads_go_on() {
        let Some(device) = vulkan_device() else {
            return;
        };
        for threads in [0, 2] {
            let cache = faulty(&device, threads, "scale", Fault::Panic);
            // As the tuner asks: the file's other kernels go to the threads.
            let binary = cache.get(elementwise("binary"), "GPU:0", true);
            assert!(binary.is_ok(), "{threads} threads");
            let start = Instant::now();
            cache.wait_for_compiles();
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{threads} threads"
            );
            assert_eq!(lock(&cache.shared.queue).running, 0);
            let err = cache
                .get(elementwise("scale"), "GPU:0", true)
                .err()
                .expect("the kernel that panicked fails");
            assert!(
                err.to_string().contains("scale panicked") && err.to_string().contains("GPU:0"),
                "{err}"
            );
            assert!(cache.get(elementwise("copy_range"), "GPU:0", true).is_ok());
            if threads > 0 {
                // Compiled by the threads, past the one that panicked.
                assert!(cache.stats().compiled >= 4, "{:?}", cache.stats());
            }
        }
    }

    #[test]
    fn threads_and_ops_racing_for_a_files_kernels_compile_each_once() {
        let Some((device, features, limits)) = vulkan_device() else {
            return;
        };
        let cache = PipelineCache::new(&device, features, &limits, 4);
        let family = ShaderFamily::Elementwise;
        let validated =
            validate_source(family.file(), family.source(), capabilities_of(features)).unwrap();
        let mut kernels: Vec<Kernel> = validated
            .entries
            .keys()
            .map(|name| elementwise(name))
            .collect();
        assert!(kernels.len() >= 6, "{} entry points", kernels.len());
        // Six ops, each asking for every kernel of the file from a different one on, while the
        // first use sends them all to four background threads.
        std::thread::scope(|s| {
            for _ in 0..6 {
                let mine = kernels.clone();
                kernels.rotate_left(1);
                let cache = &cache;
                s.spawn(move || {
                    for kernel in mine {
                        cache.get(kernel, "GPU:0", true).expect("compiles");
                    }
                });
            }
        });
        cache.wait_for_compiles();
        assert_eq!(cache.stats().compiled, kernels.len() as u64);
    }

    #[test]
    fn a_stuck_compile_stops_the_background_compiles_once() {
        let Some(device) = vulkan_device() else {
            return;
        };
        let hang = Duration::from_millis(1500);
        // `scale` is the first sibling in the file after `binary`.
        let mut cache = faulty(&device, 1, "scale", Fault::Hang(hang));
        Arc::get_mut(&mut cache.shared)
            .expect("not shared yet")
            .quiet_wait = Duration::from_millis(200);
        let weak = Arc::downgrade(&cache.shared);
        let start = Instant::now();
        assert!(cache.get(elementwise("binary"), "GPU:0", true).is_ok());
        cache.wait_for_compiles();
        let first = start.elapsed();
        assert!(
            first >= Duration::from_millis(200) && first < hang,
            "{first:?}"
        );
        assert!(lock(&cache.shared.queue).stalled);
        // The next waits do not wait, and no other file is queued.
        let again = Instant::now();
        cache.wait_for_compiles();
        assert!(
            again.elapsed() < Duration::from_millis(100),
            "{:?}",
            again.elapsed()
        );
        let reduce = Kernel::new(
            ShaderFamily::Reduce,
            in_source(ShaderFamily::Reduce.source(), "sum_all").expect("sum_all"),
        );
        assert!(cache.get(reduce, "GPU:0", true).is_ok());
        assert!(lock(&cache.shared.queue).kernels.is_empty());
        // Dropped, the cache waits for the stuck compile and joins its thread, which lets go
        // of the device's objects.
        drop(cache);
        assert!(start.elapsed() >= hang);
        assert!(weak.upgrade().is_none(), "a thread still holds the cache");
    }

    #[test]
    fn entry_names_are_found_in_their_source() {
        let source = ShaderFamily::Matmul.source();
        assert_eq!(in_source(source, "splitk_reduce"), Some("splitk_reduce"));
        assert_eq!(in_source(source, "no_such_kernel"), None);
    }
}
