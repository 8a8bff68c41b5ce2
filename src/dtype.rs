//! Element types: what a tensor holds, below every module that sizes or names one.

use std::fmt;

/// Element types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float: activations, weights, gradients.
    F32,
    /// 16-bit IEEE float: what layers compute in under the `mixed_float16` policy (see
    /// [`crate::mixed_precision`]).
    F16,
    /// 32-bit signed integer: labels and indices.
    I32,
}

impl DType {
    /// TensorFlow's name: `float`, `half`, `int32`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::F16 => "half",
            DType::I32 => "int32",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F16 => 2,
            DType::F32 | DType::I32 => 4,
        }
    }

    /// Whether it is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16)
    }

    /// The 32-bit words that hold `len` elements (host storage is word-granular: two halves
    /// share a word).
    pub(crate) fn words(self, len: usize) -> usize {
        (len * self.size()).div_ceil(4)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type a tensor can hold.
pub trait Element: bytemuck::Pod + Send + Sync + fmt::Debug + 'static {
    /// Its [`DType`].
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}

impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}

impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
