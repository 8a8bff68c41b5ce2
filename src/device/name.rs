//! Device names as TensorFlow writes them, parsed and formatted.
//!
//! Accepted forms (case-insensitive device type):
//! `/job:localhost/replica:0/task:0/device:GPU:0`, `/device:GPU:0`, `/physical_device:GPU:0`,
//! `/gpu:0`, `gpu:0`, `GPU:0`, `CPU:0`, `/cpu:0`, and partial specs such as `/device:GPU:*` or
//! `/job:localhost` that scopes merge into the enclosing one. As in TensorFlow, a well-formed
//! name of a type that does not exist here (`unknown_device:0`, `TPU:0`) parses, and then
//! matches no device.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The kind of a device: TensorFlow's `device_type` string.
///
/// Parses `"GPU"`, `"gpu"`, `"CPU"`, `"cpu"`; displays TensorFlow's upper-case spelling.
///
/// ```
/// use anygpu::DeviceKind;
/// let kind: DeviceKind = "gpu".parse()?;
/// assert_eq!(kind, DeviceKind::Gpu);
/// assert_eq!(kind.to_string(), "GPU");
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceKind {
    /// The host processor: `CPU:0`.
    Cpu,
    /// A wgpu adapter: `GPU:i`.
    Gpu,
}

impl DeviceKind {
    /// TensorFlow's spelling: `"CPU"` or `"GPU"`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "CPU",
            DeviceKind::Gpu => "GPU",
        }
    }

    /// Parses a kind, returning `None` for anything that is not `CPU` or `GPU` (any case).
    pub fn parse(s: &str) -> Option<DeviceKind> {
        if s.eq_ignore_ascii_case("gpu") {
            Some(DeviceKind::Gpu)
        } else if s.eq_ignore_ascii_case("cpu") {
            Some(DeviceKind::Cpu)
        } else {
            None
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DeviceKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        DeviceKind::parse(s).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "unknown device type '{s}': expected \"CPU\" or \"GPU\""
            ))
        })
    }
}

/// A parsed, possibly partial, device name (TensorFlow's `DeviceSpec`).
///
/// Every field is optional: `/device:GPU:*` names a kind but no index, `/job:localhost` only a
/// job. [`DeviceSpec::merged_into`] fills the missing fields from an enclosing scope.
///
/// ```
/// use anygpu::{DeviceKind, DeviceSpec};
/// let spec: DeviceSpec = "/job:localhost/replica:0/task:0/device:GPU:1".parse()?;
/// assert_eq!(spec.kind, Some(DeviceKind::Gpu));
/// assert_eq!(spec.index, Some(1));
/// assert_eq!("gpu:1".parse::<DeviceSpec>()?, DeviceSpec::new(DeviceKind::Gpu, 1));
/// assert!("GPU:".parse::<DeviceSpec>().is_err());
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DeviceSpec {
    /// Job name; only `localhost` exists in a single process.
    pub job: Option<String>,
    /// Replica number; only 0 exists.
    pub replica: Option<u32>,
    /// Task number; only 0 exists.
    pub task: Option<u32>,
    /// Device kind.
    pub kind: Option<DeviceKind>,
    /// Device index within its kind.
    pub index: Option<usize>,
    /// Whether the name used the `/physical_device:` prefix.
    pub physical: bool,
    /// A device type other than CPU or GPU (`TPU`, `unknown_device`), as written; such a spec
    /// matches no device. `None` when `kind` says the type, or no type was given.
    pub other_kind: Option<String>,
}

impl DeviceSpec {
    /// A fully specified device: `kind:index`.
    pub fn new(kind: DeviceKind, index: usize) -> DeviceSpec {
        DeviceSpec {
            kind: Some(kind),
            index: Some(index),
            ..DeviceSpec::default()
        }
    }

    /// Parses any of the accepted forms (see the module docs).
    ///
    /// # Errors
    /// `Failed parsing device name: '...'` (with TF's hint) for anything else, e.g. `"GPU"`,
    /// `"GPU:"`, `"GPU:CPU"`.
    pub fn parse(name: &str) -> Result<DeviceSpec> {
        let fail = || Error::DeviceNameParse(name.to_string());
        let trimmed = name.trim();
        if trimmed.is_empty() {
            return Ok(DeviceSpec::default());
        }
        let mut spec = DeviceSpec::default();
        let body = trimmed.strip_prefix('/').unwrap_or(trimmed);
        let parts: Vec<&str> = body.split('/').collect();
        for (i, part) in parts.iter().enumerate() {
            let (key, rest) = part.split_once(':').ok_or_else(fail)?;
            match key.to_ascii_lowercase().as_str() {
                "job" if !rest.is_empty() && spec.job.is_none() => spec.job = Some(rest.into()),
                "replica" if spec.replica.is_none() => {
                    spec.replica = Some(rest.parse().map_err(|_| fail())?)
                }
                "task" if spec.task.is_none() => {
                    spec.task = Some(rest.parse().map_err(|_| fail())?)
                }
                "device" | "physical_device" if i + 1 == parts.len() => {
                    spec.physical = key.eq_ignore_ascii_case("physical_device");
                    let (kind, index) = rest.split_once(':').ok_or_else(fail)?;
                    spec.set_kind_index(kind, index).ok_or_else(fail)?;
                }
                // The legacy short form: `gpu:0`, `/cpu:0`, `GPU:0`, `unknown_device:0`.
                _ if i + 1 == parts.len() && is_device_type(key) => {
                    spec.set_kind_index(key, rest).ok_or_else(fail)?;
                }
                _ => return Err(fail()),
            }
        }
        Ok(spec)
    }

    fn set_kind_index(&mut self, kind: &str, index: &str) -> Option<()> {
        if !is_device_type(kind) {
            return None;
        }
        self.kind = DeviceKind::parse(kind);
        self.other_kind = self.kind.is_none().then(|| kind.to_string());
        self.index = match index {
            "*" => None,
            digits if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
                Some(digits.parse().ok()?)
            }
            _ => return None,
        };
        Some(())
    }

    /// This spec with the fields it leaves open taken from `outer`, as nested `tf.device` scopes
    /// merge: the inner scope's fields win.
    pub fn merged_into(&self, outer: &DeviceSpec) -> DeviceSpec {
        // A different kind in the inner scope makes the outer index meaningless.
        let names_kind = self.kind.is_some() || self.other_kind.is_some();
        let same_kind =
            !names_kind || (self.kind, &self.other_kind) == (outer.kind, &outer.other_kind);
        let (kind, other_kind) = if names_kind {
            (self.kind, self.other_kind.clone())
        } else {
            (outer.kind, outer.other_kind.clone())
        };
        DeviceSpec {
            job: self.job.clone().or_else(|| outer.job.clone()),
            replica: self.replica.or(outer.replica),
            task: self.task.or(outer.task),
            kind,
            index: self.index.or(if same_kind { outer.index } else { None }),
            physical: self.physical,
            other_kind,
        }
    }

    /// Whether a local logical device `kind:index` satisfies this spec.
    pub fn matches(&self, kind: DeviceKind, index: usize) -> bool {
        self.other_kind.is_none()
            && self.job.as_deref().is_none_or(|j| j == "localhost")
            && self.replica.is_none_or(|r| r == 0)
            && self.task.is_none_or(|t| t == 0)
            && self.kind.is_none_or(|k| k == kind)
            && self.index.is_none_or(|i| i == index)
    }

    /// Whether the spec names one device completely (kind and index).
    pub fn is_complete(&self) -> bool {
        self.kind.is_some() && self.index.is_some()
    }

    /// The spec as TensorFlow writes a requested device in its placement errors: job, replica
    /// and task filled in with the local ones where the spec leaves them open
    /// (`GPU:7` -> `/job:localhost/replica:0/task:0/device:GPU:7`).
    ///
    /// ```
    /// use anygpu::DeviceSpec;
    /// let spec: DeviceSpec = "GPU:7".parse()?;
    /// assert_eq!(spec.local_full_name(), "/job:localhost/replica:0/task:0/device:GPU:7");
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn local_full_name(&self) -> String {
        DeviceSpec {
            job: Some(self.job.clone().unwrap_or_else(|| "localhost".into())),
            replica: Some(self.replica.unwrap_or(0)),
            task: Some(self.task.unwrap_or(0)),
            physical: false,
            ..self.clone()
        }
        .to_string()
    }
}

/// Whether `s` can be a device type in a name: a letter, then letters, digits or `_` (the
/// syntax of TensorFlow's `DeviceNameUtils`).
fn is_device_type(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl FromStr for DeviceSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        DeviceSpec::parse(s)
    }
}

impl fmt::Display for DeviceSpec {
    /// The canonical form of what is specified, e.g. `/job:localhost/device:GPU:1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(job) = &self.job {
            write!(f, "/job:{job}")?;
        }
        if let Some(replica) = self.replica {
            write!(f, "/replica:{replica}")?;
        }
        if let Some(task) = self.task {
            write!(f, "/task:{task}")?;
        }
        let kind = self
            .kind
            .map(DeviceKind::as_str)
            .or(self.other_kind.as_deref());
        if let Some(kind) = kind {
            let prefix = if self.physical {
                "physical_device"
            } else {
                "device"
            };
            match self.index {
                Some(i) => write!(f, "/{prefix}:{kind}:{i}")?,
                None => write!(f, "/{prefix}:{kind}:*")?,
            }
        }
        Ok(())
    }
}

/// `/device:GPU:0`: the name `list_logical_devices` returns.
pub(crate) fn logical_name(kind: DeviceKind, index: usize) -> String {
    format!("/device:{kind}:{index}")
}

/// `/job:localhost/replica:0/task:0/device:GPU:0`: the name a tensor's `device()` returns.
pub(crate) fn full_name(kind: DeviceKind, index: usize) -> String {
    format!("/job:localhost/replica:0/task:0/device:{kind}:{index}")
}

/// `/physical_device:GPU:0`.
pub(crate) fn physical_name(kind: DeviceKind, index: usize) -> String {
    format!("/physical_device:{kind}:{index}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_accepted_form_parses_to_the_same_device() {
        let forms = [
            "/job:localhost/replica:0/task:0/device:GPU:1",
            "/device:GPU:1",
            "/physical_device:GPU:1",
            "/gpu:1",
            "gpu:1",
            "GPU:1",
            "/GPU:1",
            "device:gpu:1",
        ];
        for form in forms {
            let spec = DeviceSpec::parse(form).expect(form);
            assert_eq!(spec.kind, Some(DeviceKind::Gpu), "{form}");
            assert_eq!(spec.index, Some(1), "{form}");
        }
        for form in ["CPU:0", "/cpu:0", "/device:CPU:0"] {
            let spec = DeviceSpec::parse(form).expect(form);
            assert_eq!((spec.kind, spec.index), (Some(DeviceKind::Cpu), Some(0)));
        }
    }

    #[test]
    fn malformed_names_fail_with_tensorflows_message() {
        for bad in [
            "GPU",
            "GPU:",
            "GPU:CPU",
            "/device:GPU",
            "gpu:-1",
            "/job:",
            "9PU:0",
        ] {
            let err = DeviceSpec::parse(bad).expect_err(bad);
            assert_eq!(
                err.to_string(),
                format!(
                    "Failed parsing device name: '{bad}'. Note a valid device string should at \
                     least contain a device type and a device index, like \"GPU:0\"."
                )
            );
        }
    }

    #[test]
    fn a_well_formed_name_of_an_unknown_type_parses_and_matches_nothing() {
        for name in ["unknown_device:0", "TPU:0", "/device:XLA_GPU:1"] {
            let spec = DeviceSpec::parse(name).expect(name);
            assert_eq!(spec.kind, None, "{name}");
            assert!(!spec.matches(DeviceKind::Gpu, 0), "{name}");
            assert!(!spec.matches(DeviceKind::Cpu, 0), "{name}");
        }
        let spec = DeviceSpec::parse("unknown_device:0").unwrap();
        assert_eq!(
            spec.local_full_name(),
            "/job:localhost/replica:0/task:0/device:unknown_device:0"
        );
        // An enclosing GPU scope does not lend its index to another type.
        let outer = DeviceSpec::parse("GPU:1").unwrap();
        assert_eq!(
            DeviceSpec::parse("TPU:*")
                .unwrap()
                .merged_into(&outer)
                .index,
            None
        );
    }

    #[test]
    fn partial_specs_merge_into_the_outer_scope() {
        let outer = DeviceSpec::parse("/job:localhost/device:GPU:1").unwrap();
        let inner = DeviceSpec::parse("/device:GPU:*").unwrap();
        assert_eq!(inner.merged_into(&outer).index, Some(1));
        let inner = DeviceSpec::parse("/cpu:0").unwrap();
        let merged = inner.merged_into(&outer);
        assert_eq!(
            (merged.kind, merged.index),
            (Some(DeviceKind::Cpu), Some(0))
        );
        assert_eq!(merged.job.as_deref(), Some("localhost"));
    }

    #[test]
    fn display_round_trips() {
        let spec = DeviceSpec::parse("/job:localhost/replica:0/task:0/device:GPU:2").unwrap();
        assert_eq!(
            spec.to_string(),
            "/job:localhost/replica:0/task:0/device:GPU:2"
        );
        assert_eq!(DeviceSpec::parse(&spec.to_string()).unwrap(), spec);
    }
}
