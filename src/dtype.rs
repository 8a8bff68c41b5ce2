//! Element types: what a tensor holds, below every module that sizes or names one.

use std::fmt;

/// Element types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float: activations, weights, gradients.
    F32,
    /// 32-bit signed integer: labels and indices.
    I32,
}

impl DType {
    /// TensorFlow's name: `float`, `int32`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::I32 => "int32",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        4
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

impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
