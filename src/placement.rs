//! Where ops run: device scopes (`with tf.device(...)`), default placement, soft placement and
//! the placement log.
//!
//! Resolution for an op: the innermost scope's spec (merged with the enclosing ones); without a
//! scope, the runtime's default device (the first GPU on a hardware adapter, else `CPU:0`) when
//! the op has no inputs or its first input is on a CPU — inputs are copied there, as in
//! TensorFlow — and the first input's device when that is a GPU. If the device does not exist,
//! is hidden, or cannot run the op (no GPU kernel, or the adapter lacks what the kernel's
//! shader needs), soft placement picks the default device if it can, else the first device that
//! can — GPUs in order, then the CPUs — and the log shows where it really ran; with soft
//! placement off it is an error in TensorFlow's words. A GPU marked unavailable at
//! initialization is never picked, and an op asked for there fails with the reason.
//!
//! The runtime an op runs on is the scope's (entered through a runtime or a device handle),
//! else its first input's, else the process-wide one. A runtime that was dropped is an error,
//! never a silent switch to the process-wide runtime.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use crate::device::logical::{Backend, Owner};
use crate::device::{DeviceKind, DeviceSpec, LogicalDevice};
use crate::error::{Error, Result};
use crate::runtime::{owner_runtime, Runtime};
use crate::shader::Kernel;

/// What an op needs from a device, for placement.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpInfo {
    /// TF's op name, as the placement log prints it.
    pub(crate) name: &'static str,
    /// The GPU kernels the op dispatches; `None`: the op has no GPU kernel.
    pub(crate) gpu: Option<&'static [Kernel]>,
}

#[derive(Clone)]
struct Scope {
    spec: DeviceSpec,
    /// The spec as the user wrote it, for messages.
    written: String,
    /// Set when the scope was entered through a runtime or a device handle.
    runtime: Option<Owner>,
}

thread_local! {
    static SCOPES: RefCell<Vec<Scope>> = const { RefCell::new(Vec::new()) };
    /// `(stage, micro-batch)` while this thread runs a pipelined step's work, for the log.
    static PIPELINE: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

/// While alive, the placement log tags this thread's ops with a pipeline stage and
/// micro-batch; dropping it restores the previous tag.
pub(crate) struct PipelineTag {
    previous: Option<(usize, usize)>,
    // Thread-local state: the guard must not cross threads.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl PipelineTag {
    pub(crate) fn new(stage: usize, micro_batch: usize) -> PipelineTag {
        let previous = PIPELINE.with(|p| p.replace(Some((stage, micro_batch))));
        PipelineTag {
            previous,
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for PipelineTag {
    fn drop(&mut self) {
        PIPELINE.with(|p| p.set(self.previous));
    }
}

/// The `(stage, micro-batch)` this thread is working on, inside a pipelined step.
pub(crate) fn pipeline_position() -> Option<(usize, usize)> {
    PIPELINE.with(Cell::get)
}

/// A device scope; leaving it (dropping the guard) restores the enclosing one.
///
/// Created by [`with_device`], [`Runtime::with_device`] or [`LogicalDevice::scope`]. Scopes are
/// per thread and must be dropped in reverse order of creation (as Rust's scoping does).
#[must_use = "the scope ends when the guard is dropped"]
pub struct DeviceScope {
    depth: usize,
    // Scopes are thread-local: the guard must not cross threads.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for DeviceScope {
    fn drop(&mut self) {
        SCOPES.with(|s| s.borrow_mut().truncate(self.depth));
    }
}

fn push(spec: DeviceSpec, written: String, runtime: Option<Owner>) -> DeviceScope {
    SCOPES.with(|s| {
        let mut scopes = s.borrow_mut();
        let depth = scopes.len();
        let merged = match scopes.last() {
            Some(outer) => spec.merged_into(&outer.spec),
            None => spec,
        };
        let runtime = runtime.or_else(|| scopes.last().and_then(|o| o.runtime.clone()));
        scopes.push(Scope {
            spec: merged,
            written,
            runtime,
        });
        DeviceScope {
            depth,
            _not_send: std::marker::PhantomData,
        }
    })
}

/// The error for using a device or tensor whose [`Runtime`] was dropped.
fn dropped_runtime(what: &str) -> Error {
    Error::Unavailable(format!(
        "the Runtime that owns {what} was dropped; keep it alive while its devices and tensors \
         are used (ops on them are not sent to the process-wide runtime)"
    ))
}

/// The runtime an owner link names, or the dropped-runtime error about `what`.
fn upgrade(runtime: &Owner, what: &str) -> Result<Runtime> {
    owner_runtime(runtime)
        .map(Runtime::from_shared)
        .ok_or_else(|| dropped_runtime(what))
}

/// Enters a scope; the outermost one initializes its runtime, as `tf.device` does.
fn enter(spec: DeviceSpec, written: String, runtime: Option<Owner>) -> Result<DeviceScope> {
    let outermost = SCOPES.with(|s| s.borrow().is_empty());
    if outermost {
        match &runtime {
            Some(weak) => upgrade(weak, &written)?.initialize()?,
            None => crate::config::runtime().initialize()?,
        }
    }
    Ok(push(spec, written, runtime))
}

/// Something that names a device for a scope: a string such as `"GPU:1"` or a [`LogicalDevice`].
pub trait IntoDeviceScope {
    /// Enters the scope.
    ///
    /// # Errors
    /// `Failed parsing device name` for a string that is not a device name.
    fn enter(self, runtime: Option<&Runtime>) -> Result<DeviceScope>;
}

impl IntoDeviceScope for &str {
    fn enter(self, runtime: Option<&Runtime>) -> Result<DeviceScope> {
        let spec = DeviceSpec::parse(self)?;
        let runtime = runtime.map(|rt| Arc::downgrade(&rt.shared) as Owner);
        enter(spec, self.to_string(), runtime)
    }
}

impl IntoDeviceScope for &String {
    fn enter(self, runtime: Option<&Runtime>) -> Result<DeviceScope> {
        self.as_str().enter(runtime)
    }
}

impl IntoDeviceScope for &LogicalDevice {
    fn enter(self, _runtime: Option<&Runtime>) -> Result<DeviceScope> {
        Ok(self.scope())
    }
}

/// `with tf.device(name):` as a guard, on the process-wide runtime (or, for a
/// [`LogicalDevice`], on the runtime it belongs to).
///
/// ```
/// let _scope = anygpu::with_device("/cpu:0")?;
/// let t = anygpu::Tensor::from_slice(&[1.0f32, 2.0], &[2])?;
/// assert_eq!(t.device(), "/job:localhost/replica:0/task:0/device:CPU:0");
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// `Failed parsing device name` at scope entry; the outermost scope initializes the runtime,
/// so its errors too. A well-formed name of a device that does not exist is accepted here and
/// handled by soft placement when an op runs.
pub fn with_device(device: impl IntoDeviceScope) -> Result<DeviceScope> {
    device.enter(None)
}

/// Runs `f` inside a device scope: `with tf.device(name): f()`.
///
/// ```
/// let sum = anygpu::device("CPU:0", || {
///     let a = anygpu::Tensor::from_slice(&[1.0f32, 2.0], &[2])?;
///     a.add(&a)?.to_vec::<f32>()
/// })??;
/// assert_eq!(sum, [2.0, 4.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
pub fn device<R>(device: impl IntoDeviceScope, f: impl FnOnce() -> R) -> Result<R> {
    let _scope = device.enter(None)?;
    Ok(f())
}

impl Runtime {
    /// A device scope resolved against this runtime (not the process-wide one).
    pub fn with_device(&self, device: impl IntoDeviceScope) -> Result<DeviceScope> {
        device.enter(Some(self))
    }

    /// Runs `f` inside a device scope of this runtime.
    pub fn device_scope<R>(
        &self,
        device: impl IntoDeviceScope,
        f: impl FnOnce() -> R,
    ) -> Result<R> {
        let _scope = self.with_device(device)?;
        Ok(f())
    }
}

impl LogicalDevice {
    /// A scope that places ops on this device.
    pub fn scope(&self) -> DeviceScope {
        // Fully qualified, so nested partial specs merge into this exact device.
        let spec = DeviceSpec {
            job: Some("localhost".into()),
            replica: Some(0),
            task: Some(0),
            ..DeviceSpec::new(self.device_type(), self.index())
        };
        push(spec, self.name().to_string(), Some(self.0.owner.clone()))
    }
}

/// The innermost scope's merged spec, if any, as text (for messages and tests).
pub fn current_device_spec() -> Option<String> {
    SCOPES.with(|s| s.borrow().last().map(|s| s.spec.to_string()))
}

/// Whether `device` can run `op`: the CPU runs everything; a GPU needs every kernel of the op
/// to exist and pass its adapter's checks. `Err` says what is missing.
pub(crate) fn can_run(device: &LogicalDevice, op: &OpInfo) -> std::result::Result<(), String> {
    match &device.0.backend {
        Backend::Cpu(_) => Ok(()),
        Backend::Unavailable(u) => Err(u.reason.clone()),
        Backend::Gpu(g) => match op.gpu {
            None => Err(format!("no GPU kernel for {}", op.name)),
            Some(kernels) => kernels.iter().try_for_each(|k| g.ctx.pipelines.check(*k)),
        },
    }
}

/// Without a scope, whether an op follows its first input rather than going to the default
/// device: only when that input is on a GPU (TF would copy it to the default device too; we
/// keep work on the GPU it was put on). Inputs on a CPU go to the default device, as in TF.
fn follows_first_input(first_input: Option<DeviceKind>) -> bool {
    first_input == Some(DeviceKind::Gpu)
}

/// The runtime `op` resolves against: the scope's, else the first input's, else the
/// process-wide one; a dropped one is an error.
fn runtime_for(scope: Option<&Scope>, first_input: Option<&LogicalDevice>) -> Result<Runtime> {
    if let Some(scope) = scope {
        if let Some(weak) = &scope.runtime {
            return upgrade(weak, &scope.written);
        }
    }
    match first_input {
        Some(device) => upgrade(
            &device.0.owner,
            &format!("a tensor on {}", device.full_name()),
        ),
        None => Ok(crate::config::runtime().clone()),
    }
}

/// Picks the device for `op`, whose first input (if any) is on `first_input`, and logs the
/// placement.
pub(crate) fn place(op: &OpInfo, first_input: Option<&LogicalDevice>) -> Result<LogicalDevice> {
    let scope = SCOPES.with(|s| s.borrow().last().cloned());
    let runtime = runtime_for(scope.as_ref(), first_input)?;
    let devices = runtime.devices()?;
    let default = runtime.default_device()?;
    let (requested, written) = match &scope {
        Some(scope) => {
            let found = devices
                .cpus
                .iter()
                .chain(devices.gpus.iter())
                .filter(|d| scope.spec.matches(d.device_type(), d.index()))
                // A partial spec (`/device:GPU:*`) takes the first match: available devices
                // first, GPUs before CPUs.
                .min_by_key(|d| {
                    (
                        !d.is_available(),
                        d.device_type() != DeviceKind::Gpu,
                        d.index(),
                    )
                })
                .cloned();
            (found, Some(scope.written.clone()))
        }
        None => (
            Some(match first_input {
                Some(d) if follows_first_input(Some(d.device_type())) => d.clone(),
                _ => default.clone(),
            }),
            None,
        ),
    };
    if let Some(err) = requested
        .as_ref()
        .and_then(LogicalDevice::unavailable_error)
    {
        return Err(err);
    }
    let why = match &requested {
        Some(device) => match can_run(device, op) {
            Ok(()) => {
                runtime
                    .shared
                    .log_placement(op.name, device, pipeline_position());
                return Ok(device.clone());
            }
            Err(missing) => missing,
        },
        None => "no such device".to_string(),
    };
    let requested_name = match (&requested, &written) {
        (Some(d), _) => d.name().to_string(),
        (None, Some(w)) => w.clone(),
        (None, None) => String::new(),
    };
    if !runtime.shared.soft_placement() {
        // TF's message: the requested device as a full name, the device types among the
        // existing devices that can run the op (GPU first), then every device.
        let spec = match (&scope, &requested) {
            (_, Some(d)) => d.full_name().to_string(),
            (Some(s), None) => s.spec.local_full_name(),
            (None, None) => String::new(),
        };
        let gpu_can = devices.gpus.iter().any(|d| can_run(d, op).is_ok());
        let supported = if gpu_can { "GPU, CPU" } else { "CPU" };
        return Err(Error::Placement {
            spec,
            supported: supported.into(),
            available: runtime.shared.available_names(),
        });
    }
    let fallback = std::iter::once(&default)
        .chain(devices.gpus.iter())
        .chain(devices.cpus.iter())
        .find(|d| can_run(d, op).is_ok())
        .cloned()
        .unwrap_or_else(|| devices.cpus[0].clone());
    runtime
        .shared
        .warn_fallback(op.name, &requested_name, fallback.name(), &why);
    runtime
        .shared
        .log_placement(op.name, &fallback, pipeline_position());
    Ok(fallback)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_scope_only_an_input_on_a_gpu_keeps_the_op_off_the_default_device() {
        assert!(follows_first_input(Some(DeviceKind::Gpu)));
        assert!(
            !follows_first_input(Some(DeviceKind::Cpu)),
            "CPU inputs go to the default device"
        );
        assert!(!follows_first_input(None), "no inputs: the default device");
    }
}
