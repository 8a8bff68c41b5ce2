//! Where ops run: device scopes (`with tf.device(...)`), default placement, soft placement and
//! the placement log.
//!
//! Resolution for an op: the innermost scope's spec (merged with the enclosing ones); without a
//! scope, the device of the op's first input; without inputs, the runtime's default device
//! (`GPU:0`, else `CPU:0`). If that device does not exist, is hidden, or cannot run the op (no
//! GPU kernel, or the adapter lacks what the kernel's shader needs), soft placement picks the
//! first device that can — GPUs in order, then `CPU:0` — and the log shows where it really ran;
//! with soft placement off it is an error in TensorFlow's words.

use std::cell::RefCell;
use std::sync::{Arc, Weak};

use crate::device::logical::Backend;
use crate::device::{DeviceSpec, LogicalDevice};
use crate::error::{Error, Result};
use crate::ops::gpu::Kernel;
use crate::runtime::{Runtime, RuntimeShared};
use crate::tensor::Tensor;

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
    runtime: Option<Weak<RuntimeShared>>,
}

thread_local! {
    static SCOPES: RefCell<Vec<Scope>> = const { RefCell::new(Vec::new()) };
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

fn push(spec: DeviceSpec, written: String, runtime: Option<Weak<RuntimeShared>>) -> DeviceScope {
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
        let runtime = runtime.map(|rt| Arc::downgrade(&rt.shared));
        Ok(push(spec, self.to_string(), runtime))
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
/// `Failed parsing device name` at scope entry. A well-formed name of a device that does not
/// exist is accepted here and handled by soft placement when an op runs.
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
        push(spec, self.name().to_string(), Some(self.0.runtime.clone()))
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
        Backend::Cpu => Ok(()),
        Backend::Gpu(g) => match op.gpu {
            None => Err(format!("no GPU kernel for {}", op.name)),
            Some(kernels) => kernels.iter().try_for_each(|k| g.ctx.pipelines.check(*k)),
        },
    }
}

/// Picks the device for `op` with these inputs, and logs the placement.
pub(crate) fn place(op: &OpInfo, inputs: &[&Tensor]) -> Result<LogicalDevice> {
    let scope = SCOPES.with(|s| s.borrow().last().cloned());
    let runtime = scope
        .as_ref()
        .and_then(|s| s.runtime.as_ref())
        .and_then(Weak::upgrade)
        .or_else(|| inputs.first().and_then(|t| t.device_handle().runtime()))
        .map(Runtime::from_shared)
        .unwrap_or_else(|| crate::config::runtime().clone());
    let devices = runtime.devices()?;
    let (requested, written) = match &scope {
        Some(scope) => {
            let found = devices
                .cpus
                .iter()
                .chain(devices.gpus.iter())
                .filter(|d| scope.spec.matches(d.device_type(), d.index()))
                // A partial spec (`/device:GPU:*`) takes the first match, GPUs before the CPU.
                .min_by_key(|d| (d.device_type() != crate::DeviceKind::Gpu, d.index()))
                .cloned();
            (found, Some(scope.written.clone()))
        }
        None => (
            Some(match inputs.first() {
                Some(t) => t.device_handle().clone(),
                None => runtime.default_device()?,
            }),
            None,
        ),
    };
    let why = match &requested {
        Some(device) => match can_run(device, op) {
            Ok(()) => {
                runtime.shared.log_placement(op.name, device);
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
        let supported = if op.gpu.is_some() { "GPU, CPU" } else { "CPU" };
        let spec = match &scope {
            Some(s) if requested.is_none() => s.spec.to_string(),
            _ => requested_name.clone(),
        };
        return Err(Error::Placement {
            spec,
            supported: supported.into(),
            available: runtime.shared.available_names(),
        });
    }
    let fallback = devices
        .gpus
        .iter()
        .chain(devices.cpus.iter())
        .find(|d| can_run(d, op).is_ok())
        .cloned()
        .unwrap_or_else(|| devices.cpus[0].clone());
    runtime
        .shared
        .warn_fallback(op.name, &requested_name, fallback.name(), &why);
    runtime.shared.log_placement(op.name, &fallback);
    Ok(fallback)
}
