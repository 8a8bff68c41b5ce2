//! The crate's one error type.
//!
//! Where TensorFlow has a message for the same condition we use its wording, so that a user who
//! searches for the text finds the TensorFlow explanation too. Every variant that concerns a
//! device names it, and every size error carries the request and the limit.

use std::path::PathBuf;

/// Everything that can go wrong in anygpu.
///
/// The variants map onto TensorFlow's exception types: `InvalidArgument` is TF's `ValueError`,
/// `AlreadyInitialized` its `RuntimeError`, `ResourceExhausted` its `ResourceExhaustedError`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A bad argument: wrong kind of device, missing memory limit, unknown flag value.
    #[error("{0}")]
    InvalidArgument(String),

    /// A configuration call after the runtime was initialized (TF's RuntimeError).
    #[error("{0} cannot be modified after being initialized")]
    AlreadyInitialized(&'static str),

    /// A threading setter after the runtime was initialized (TF's RuntimeError, its wording:
    /// `Intra op parallelism cannot be modified after initialization.`).
    #[error("{0} parallelism cannot be modified after initialization.")]
    ThreadingInitialized(&'static str),

    /// A device string that is not a device name at all (with TF's hint).
    #[error(
        "Failed parsing device name: '{0}'. Note a valid device string should at least contain \
         a device type and a device index, like \"GPU:0\"."
    )]
    DeviceNameParse(String),

    /// A physical device that is not in `list_physical_devices`, or of another kind.
    #[error("Unrecognized device: {0}")]
    UnrecognizedDevice(String),

    /// A well-formed device name that matches no logical device.
    #[error("No matching devices found for '{spec}'. Available devices: [{available}]")]
    NoMatchingDevice {
        /// The name as the user wrote it.
        spec: String,
        /// The logical devices that exist, comma separated.
        available: String,
    },

    /// A device name that matches several logical devices (TF's sentence).
    #[error("Multiple devices match the provided string '{spec}': {matches}.")]
    MultipleDevicesMatch {
        /// The name as the user wrote it.
        spec: String,
        /// The full names of the devices it matched, quoted and joined by " and ".
        matches: String,
    },

    /// An op could not be placed and soft placement is off (TF's InvalidArgumentError text).
    #[error(
        "Could not satisfy device specification '{spec}'. enable_soft_placement=0. \
         Supported device types [{supported}]. All available devices [{available}]."
    )]
    Placement {
        /// The requested device, as a full name (`/job:localhost/replica:0/task:0/device:GPU:7`).
        spec: String,
        /// The device types among the existing devices that can run the op, GPU first.
        supported: String,
        /// Every logical device, CPUs first, by full name.
        available: String,
    },

    /// A device cannot run an op: no kernel, or the adapter lacks a feature or limit it needs.
    #[error("op {op} is not supported on {device}: {missing}")]
    Unsupported {
        /// The op's name, as in the placement log.
        op: &'static str,
        /// The device that cannot run it.
        device: String,
        /// What is missing (a feature, a limit, a dtype).
        missing: String,
    },

    /// Out of memory now: the request does not fit in what the device's arena has left.
    #[error("{0}")]
    ResourceExhausted(String),

    /// A single request that can never fit on the device, whatever is freed.
    #[error(
        "{what} of {} exceeds {device} {limit_name} ({})",
        format_bytes(*requested),
        format_bytes(*limit)
    )]
    TooLarge {
        /// What was asked for ("tensor with shape[..] and type float").
        what: String,
        /// The device.
        device: String,
        /// Bytes asked for.
        requested: u64,
        /// The limit that stops it.
        limit: u64,
        /// The limit's name (`max_storage_buffer_binding_size`, `memory_limit`).
        limit_name: &'static str,
    },

    /// Shapes that do not fit together, naming the op and both shapes.
    #[error("{op}: incompatible shapes {lhs:?} and {rhs:?}{hint}")]
    ShapeMismatch {
        /// The op.
        op: &'static str,
        /// First operand's shape.
        lhs: Vec<usize>,
        /// Second operand's shape.
        rhs: Vec<usize>,
        /// Extra explanation, starting with ": " or empty.
        hint: String,
    },

    /// A tensor of the wrong dtype for an op.
    #[error("{op}: expected a tensor of type {expected}, got {got}")]
    DType {
        /// The op.
        op: &'static str,
        /// The dtype the op takes.
        expected: &'static str,
        /// The dtype it was given.
        got: &'static str,
    },

    /// No GPU adapter was found while `ANYGPU_REQUIRE_ADAPTER=1` demands one.
    #[error(
        "no GPU adapter found and ANYGPU_REQUIRE_ADAPTER=1 is set (backends: {backends}); \
         install a driver, or Mesa's software adapters: apt-get install mesa-vulkan-drivers libvulkan1 libegl-mesa0"
    )]
    NoAdapter {
        /// The backends that were searched.
        backends: String,
    },

    /// The GPU driver or wgpu reported a failure (device lost, validation, map failure).
    #[error("GPU error on {device}: {message}")]
    Gpu {
        /// The device.
        device: String,
        /// wgpu's message.
        message: String,
    },

    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A data file is malformed (bad magic number, truncated, inconsistent counts).
    #[error("{}: {message}", path.display())]
    Data {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },

    /// Something that can exist once exists already (TF's AlreadyExistsError): a second
    /// profiler.
    #[error("{0}")]
    AlreadyExists(String),

    /// A service is not there (TF's UnavailableError): stopping a profiler that is not running,
    /// a GPU whose adapter failed to open or reserve its budget, a device whose runtime was
    /// dropped.
    #[error("{0}")]
    Unavailable(String),

    /// A model was used in a way its state does not allow (fit before compile, bad weights file).
    #[error("{0}")]
    Model(String),

    /// A multi-worker job cannot go on (feature `mpi`): a worker failed, and every worker
    /// returns this error naming it; or the cluster as `TF_CONFIG` describes it is not the one
    /// MPI started (TF's `UnavailableError` / `ValueError` for these).
    #[error("{request} on worker {rank} of {workers}: {cause}")]
    Distributed {
        /// The worker (MPI rank) that failed; the lowest one when several did.
        rank: usize,
        /// How many workers the job has.
        workers: usize,
        /// What all workers were doing: "training step", "TF_CONFIG", ...
        request: String,
        /// The failed worker's own error message.
        cause: String,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Formats a byte count the way our messages do: `64.0 MiB`, `256 B`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::format_bytes;

    #[test]
    fn byte_counts_read_naturally() {
        assert_eq!(format_bytes(256), "256 B");
        assert_eq!(format_bytes(64 << 20), "64.0 MiB");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
    }
}
