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

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
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
    compiled: AtomicU64,
    wait_nanos: AtomicU64,
}

#[derive(Default)]
struct Queue {
    kernels: VecDeque<Kernel>,
    /// Modules whose entry points were queued (each once).
    queued: HashSet<ModuleKey>,
    running: usize,
    /// The cache is gone: threads stop after the kernel at hand.
    closed: bool,
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
                compiled: AtomicU64::new(0),
                wait_nanos: AtomicU64::new(0),
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

    /// Waits until the background threads have compiled everything queued (at most
    /// [`QUIET_WAIT`]): the tuner times candidates on a quiet host and driver, so that a compile
    /// beside a timed block cannot make a candidate look slow (its pick is kept on disk).
    pub(crate) fn wait_for_compiles(&self) {
        let start = Instant::now();
        let running = self
            .shared
            .wait_for_threads(lock(&self.shared.queue), QUIET_WAIT);
        self.shared.waited(start);
        if running > 0 {
            log::warn!("{running} background pipeline compiles still running after {QUIET_WAIT:?}");
        }
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
        let running = self.shared.wait_for_threads(queue, DROP_WAIT);
        if running > 0 {
            log::warn!("{running} pipeline compiles still running after {DROP_WAIT:?}; not waiting for them");
        }
    }
}

impl Shared {
    /// Counts the time since `start` as waited for pipelines.
    fn waited(&self, start: Instant) {
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.wait_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Waits (at most `limit`) until no background thread runs; returns how many still do.
    fn wait_for_threads(&self, mut queue: MutexGuard<'_, Queue>, limit: Duration) -> usize {
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
        queue.running
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
        if queue.closed || !queue.queued.insert(key) {
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
            if spawned.is_err() {
                // No thread: the ops compile what they use, as without background threads.
                break;
            }
            queue.running += 1;
        }
    }

    /// A background thread's loop: compiles queued kernels until the queue is empty.
    fn compile_queued(&self) {
        loop {
            let kernel = {
                let mut queue = lock(&self.queue);
                match queue.kernels.pop_front() {
                    Some(kernel) if !queue.closed => kernel,
                    _ => {
                        queue.running -= 1;
                        self.stopped.notify_all();
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

    /// Compiles `kernel` (its module is loaded: `check` passed).
    fn compile(&self, kernel: Kernel) -> std::result::Result<Arc<Pipeline>, String> {
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
        let layout = self.layout(&bindings, &uniform);
        let pipeline_layout = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(kernel.entry),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
        // Error scopes are per thread: this one sees only this pipeline's errors.
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
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
        if let Some(err) = pollster::block_on(scope.pop()) {
            return Err(format!(
                "compiling {}::{} failed: {err}",
                kernel.family.file(),
                kernel.entry
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

    #[test]
    fn entry_names_are_found_in_their_source() {
        let source = ShaderFamily::Matmul.source();
        assert_eq!(in_source(source, "splitk_reduce"), Some("splitk_reduce"));
        assert_eq!(in_source(source, "no_such_kernel"), None);
    }
}
