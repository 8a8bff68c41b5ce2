//! Keras' `keras.mixed_precision`: dtype policies that let layers compute in float16 while
//! their variables stay float32.
//!
//! ```
//! use anygpu::mixed_precision::{self, Policy};
//! use anygpu::DType;
//! let policy = Policy::new("mixed_float16")?;
//! assert_eq!(policy.compute_dtype(), DType::F16);
//! assert_eq!(policy.variable_dtype(), DType::F32);
//! assert_eq!(mixed_precision::global_policy().name(), "float32");
//! assert!(Policy::new("mixed_bfloat16").is_err());
//! # Ok::<(), anygpu::Error>(())
//! ```
//!
//! Under `mixed_float16` a layer casts its input and its float32 variables to float16, computes
//! in float16 (products and sums accumulate in float32 inside the kernels) and hands float32
//! gradients to the optimizer; the loss and its softmax are computed in float32, and `compile`
//! wraps the optimizer in a [`LossScaleOptimizer`](crate::nn::LossScaleOptimizer) so that small
//! gradients do not underflow float16.
//!
//! A device without float16 kernels computes in float32 instead, with one warning per device:
//! `CPU:0` (its kernels are float32 only) and adapters without `SHADER_F16` (llvmpipe on GL).
//! The model trains the same; only the speed and memory gains are missing there.
//!
//! ```
//! use anygpu::nn::{Activation, Adam, Dense, Loss, Sequential};
//! use anygpu::DType;
//! anygpu::mixed_precision::set_global_policy("mixed_float16")?;
//! let _cpu = anygpu::with_device("/cpu:0")?;
//! let mut model = Sequential::new();
//! model.add(Dense::new(2).activation(Activation::Softmax).input_shape(&[3]))?;
//! model.compile(Loss::sparse_categorical_crossentropy(), Adam::default(), &[])?;
//! assert_eq!(model.optimizer().map(|o| o.name()), Some("LossScaleOptimizer"));
//! // CPU:0 has float32 kernels only: the layer computes in float32 there.
//! assert_eq!(model.layer_infos()[0].compute_dtype, DType::F32);
//! # Ok::<(), anygpu::Error>(())
//! ```
//!
//! More in `docs/mixed_precision.md`.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

use crate::device::LogicalDevice;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// A dtype policy (Keras' `DTypePolicy`): the dtype a layer computes in and the dtype of its
/// variables.
///
/// ```
/// use anygpu::mixed_precision::Policy;
/// assert_eq!(Policy::MIXED_FLOAT16.to_string(), "<DTypePolicy \"mixed_float16\">");
/// assert_eq!("float32".parse::<Policy>()?, Policy::FLOAT32);
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    mixed: bool,
}

impl Policy {
    /// `"float32"`: compute and variables in float32 (Keras' default).
    pub const FLOAT32: Policy = Policy { mixed: false };
    /// `"mixed_float16"`: compute in float16, variables in float32.
    pub const MIXED_FLOAT16: Policy = Policy { mixed: true };

    /// The policy of that name: `"float32"` or `"mixed_float16"`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for any other name, saying which ones Keras has that anygpu
    /// does not.
    pub fn new(name: &str) -> Result<Policy> {
        match name {
            "float32" => Ok(Policy::FLOAT32),
            "mixed_float16" => Ok(Policy::MIXED_FLOAT16),
            "mixed_bfloat16" | "float16" | "bfloat16" | "float64" => {
                Err(Error::InvalidArgument(format!(
                    "dtype policy '{name}' is not supported by anygpu; use 'float32' or \
                     'mixed_float16'"
                )))
            }
            _ => Err(Error::InvalidArgument(format!(
                "Cannot convert '{name}' to a mixed precision DTypePolicy. Valid policies are \
                 'float32' and 'mixed_float16'"
            ))),
        }
    }

    /// Keras' name of the policy.
    pub fn name(&self) -> &'static str {
        if self.mixed {
            "mixed_float16"
        } else {
            "float32"
        }
    }

    /// The dtype layers compute in.
    pub fn compute_dtype(&self) -> DType {
        if self.mixed {
            DType::F16
        } else {
            DType::F32
        }
    }

    /// The dtype of layers' variables: always float32.
    pub fn variable_dtype(&self) -> DType {
        DType::F32
    }

    /// Whether the policy computes in float16 (and so wants loss scaling).
    pub fn is_mixed(&self) -> bool {
        self.mixed
    }

    /// The dtype a layer under this policy computes in on `device`: the policy's, unless the
    /// device has no float16 kernels, in which case float32, with one warning per device.
    pub(crate) fn compute_dtype_on(&self, device: &LogicalDevice) -> DType {
        if !self.mixed {
            return DType::F32;
        }
        if device.has_f16() {
            return DType::F16;
        }
        static WARNED: Mutex<Option<HashSet<String>>> = Mutex::new(None);
        // Asked for every layer at every step: allocate only the first time.
        let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
        let warned = warned.get_or_insert_with(HashSet::new);
        if !warned.contains(device.full_name()) {
            warned.insert(device.full_name().to_string());
            log::warn!(
                "mixed_float16: {} ({}) has no float16 kernels; layers placed there compute in \
                 float32",
                device.full_name(),
                device.adapter_name()
            );
        }
        DType::F32
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy::FLOAT32
    }
}

impl FromStr for Policy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Policy> {
        Policy::new(s)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<DTypePolicy \"{}\">", self.name())
    }
}

/// What [`set_global_policy`] takes: a [`Policy`] or its name.
pub trait IntoPolicy {
    /// The policy.
    ///
    /// # Errors
    /// An unknown name.
    fn into_policy(self) -> Result<Policy>;
}

impl IntoPolicy for Policy {
    fn into_policy(self) -> Result<Policy> {
        Ok(self)
    }
}

impl IntoPolicy for &str {
    fn into_policy(self) -> Result<Policy> {
        Policy::new(self)
    }
}

impl IntoPolicy for &String {
    fn into_policy(self) -> Result<Policy> {
        Policy::new(self)
    }
}

static GLOBAL: AtomicU8 = AtomicU8::new(0);

/// Sets the policy of layers added to a model from now on
/// (`keras.mixed_precision.set_global_policy`); layers added before keep theirs.
///
/// ```no_run
/// anygpu::mixed_precision::set_global_policy("mixed_float16")?;
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidArgument`] for an unknown policy name; the global policy is unchanged.
pub fn set_global_policy(policy: impl IntoPolicy) -> Result<()> {
    let policy = policy.into_policy()?;
    GLOBAL.store(u8::from(policy.mixed), Ordering::Relaxed);
    Ok(())
}

/// The global policy (`keras.mixed_precision.global_policy`): `float32` unless set.
pub fn global_policy() -> Policy {
    Policy {
        mixed: GLOBAL.load(Ordering::Relaxed) != 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for p in [Policy::FLOAT32, Policy::MIXED_FLOAT16] {
            assert_eq!(Policy::new(p.name()).unwrap(), p);
        }
        let err = Policy::new("mixed_bfloat16").unwrap_err().to_string();
        assert!(err.contains("not supported by anygpu"), "{err}");
        let err = Policy::new("float17").unwrap_err().to_string();
        assert!(err.contains("Cannot convert 'float17'"), "{err}");
    }

    #[test]
    fn mixed_float16_computes_in_half_and_keeps_float32_variables() {
        let p = Policy::MIXED_FLOAT16;
        assert_eq!(
            (p.compute_dtype(), p.variable_dtype()),
            (DType::F16, DType::F32)
        );
        let f = Policy::FLOAT32;
        assert_eq!(
            (f.compute_dtype(), f.variable_dtype()),
            (DType::F32, DType::F32)
        );
    }
}
