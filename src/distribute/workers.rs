//! What a data-parallel step needs from a job of several worker processes, as a crate-private
//! trait: the default build has no implementation, and the step's code is the same with one
//! (`mpi::MpiWorld`, feature `mpi`) or without.

use std::fmt;

use crate::error::Result;

/// The other worker processes of a multi-worker job. Every method is a collective: every
/// worker calls it, in the same order, with arguments of the same lengths.
pub(crate) trait Workers: Send + Sync + fmt::Debug {
    /// This worker's index (its MPI rank); worker 0 is the chief.
    fn rank(&self) -> usize;

    /// Local replicas of every worker, in rank order.
    fn replicas(&self) -> &[usize];

    /// Whether every worker's replicas run the same kernels, so that the same update gives the
    /// same bits on every worker; otherwise the chief's state is sent to the others each step.
    fn same_kernels(&self) -> bool;

    /// The workers agree on how `request` went: `Ok` (and `sums` replaced by their sums over
    /// the workers) when it went well on every worker, else on every worker the same
    /// [`crate::Error::Distributed`] naming the lowest failed worker and its cause.
    fn agree(&self, request: &str, local: Result<()>, sums: &mut [f64]) -> Result<()>;

    /// Overwrites `words` with the chief's.
    fn broadcast(&self, words: &mut [u32]);

    /// Ends the whole job (the last resort, when this worker's parameters may differ from
    /// the others'): prints `cause` and aborts every worker.
    fn abort(&self, cause: &str) -> !;
}
