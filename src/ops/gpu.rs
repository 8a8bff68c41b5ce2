//! The GPU side of every op: the thin functions that bind tensors and dispatch the kernels of
//! [`crate::shader`] (one file per shader family, CNN kernels in `nn/`), after the binding
//! convention stated there.

// ---- activations and pooling layers ----
pub(crate) mod activation;
pub(crate) mod pooling;
// ----
pub(crate) mod cast;
pub(crate) mod coop;
pub(crate) mod kernels;
pub(crate) mod loss;
mod matmul;
pub(crate) mod nn;
pub(crate) mod norm;
pub(crate) mod regions;

// The kernel registry and the tuner, where the dispatchers name them.
pub(crate) use crate::shader::{
    grid_1d, row_chunk, tune, Kernel, ShaderFamily, MAX_GROUPS_PER_DIM,
};
