//! Shapes and options shared by every backend's kernels.
//!
//! The CPU kernels (`ops::cpu`), the WGSL kernels (`shaders/`, driven by `ops::gpu`) and the f64
//! oracle (`ops::reference`) all take these, so the three can never disagree about what a shape
//! or a padding mode means. Layout is NHWC, kernels are Keras' HWIO, everything row-major.
//!
//! One file per family beside this one; the fused [`Activation`] and [`BinaryOp`] here.

mod activation;
mod conv;
mod norm;
mod optim;
mod pool;
pub use activation::*;
pub use conv::*;
pub use norm::*;
pub use optim::*;
pub use pool::*;

/// The activation fused into a kernel's output write (Keras' `activation=` argument).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// No activation (`None` / `"linear"` in Keras).
    #[default]
    Linear,
    /// `max(x, 0)`.
    Relu,
    /// Scaled exponential linear unit with Keras' constants [`SELU_ALPHA`] and [`SELU_SCALE`].
    Selu,
}

/// Keras' `selu` alpha.
pub const SELU_ALPHA: f64 = 1.673_263_242_354_377_3;
/// Keras' `selu` scale.
pub const SELU_SCALE: f64 = 1.050_700_987_355_480_5;

impl Activation {
    /// The code WGSL kernels receive in their params (`0` linear, `1` relu, `2` selu).
    pub fn code(self) -> u32 {
        match self {
            Activation::Linear => 0,
            Activation::Relu => 1,
            Activation::Selu => 2,
        }
    }
}

/// The product of `dims`; a wrapped count would size buffers wrongly, so overflow panics
/// (naming `what`) in release builds too.
fn elements(dims: &[usize], what: &str) -> usize {
    match crate::shape::product(dims) {
        Some(n) => n,
        None => panic!("the {what} {dims:?} has more elements than usize can count"),
    }
}

/// The element-wise binary ops, with bias-style broadcasting: the right operand's shape is a
/// suffix of the left's (`[rows, cols] + [cols]`) or equal to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
}

impl BinaryOp {
    /// Code passed to the WGSL kernel.
    pub fn code(self) -> u32 {
        match self {
            BinaryOp::Add => 0,
            BinaryOp::Sub => 1,
            BinaryOp::Mul => 2,
        }
    }

    /// Name in the placement log (TF's op names).
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "AddV2",
            BinaryOp::Sub => "Sub",
            BinaryOp::Mul => "Mul",
        }
    }
}
