//! What a data-parallel step needs from a job of several worker processes, as a crate-private
//! trait: the default build has no implementation, and the step's code is the same with one
//! (`mpi::MpiWorld`, feature `mpi`) or without.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::distribute::CrossDeviceOps;

use crate::error::{Error, Result};

/// The other worker processes of a multi-worker job. Every method is a collective: every
/// worker calls it, in the same order. Each one checks that it pairs with the same collective
/// (its purpose and its length) on every worker before it moves data, and fails on every
/// worker alike when not.
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
    /// [`crate::Error::Distributed`] naming the lowest failed worker and its cause. `local`
    /// borrows the error: the caller keeps its result (`result.as_ref().map(drop)`).
    fn agree(
        &self,
        request: &str,
        local: std::result::Result<(), &Error>,
        sums: &mut [f64],
    ) -> Result<()>;

    /// The sum over every worker's replicas whose local level (within this worker) is
    /// `local`; what a multi-worker strategy's `CrossDeviceOps` is, even after
    /// `with_cross_device_ops` replaced the local level.
    fn cross_device_ops(self: Arc<Self>, local: Arc<dyn CrossDeviceOps>)
        -> Arc<dyn CrossDeviceOps>;

    /// Overwrites `words` with the chief's, once every worker agreed that it is at the same
    /// broadcast (`request`) with the same length.
    ///
    /// # Errors
    /// [`Error::Distributed`] on every worker when a worker is elsewhere or has another length
    /// (a model of another shape).
    fn broadcast(&self, request: &str, words: &mut [u32]) -> Result<()>;

    /// Ends the whole job (the last resort, when this worker's parameters may differ from
    /// the others'): prints `cause` and aborts every worker.
    fn abort(&self, cause: &str) -> !;
}

/// `local` made every worker's when there are `workers`: the same [`Error::Distributed`] on
/// every worker when any worker's `local` is an error (one vote), else `local`. Without
/// workers, `local` unchanged. For work outside a training step whose error only some workers
/// may see (a chief-only callback writing a file, say): a worker that returned such an error
/// alone would leave the others waiting for it in their next collective.
pub(crate) fn shared<T>(
    workers: Option<&dyn Workers>,
    request: &str,
    local: Result<T>,
) -> Result<T> {
    match workers {
        Some(w) => {
            w.agree(request, local.as_ref().map(drop), &mut [])?;
            local
        }
        None => local,
    }
}

/// Worker `rank`'s part of a global batch of `global` examples, cut among the replicas of all
/// workers (`replicas[k]` local replicas on worker `k`) in rank order, one example more for
/// the first `global % replicas`: the index of its first example, and each of its replicas'
/// example count. The one place that arithmetic lives: the step shards by it, and
/// `worker_batch_size` reports it.
pub(crate) fn worker_rows(global: usize, replicas: &[usize], rank: usize) -> (usize, Vec<usize>) {
    let total = replicas.iter().sum::<usize>().max(1);
    let rows = |i: usize| global / total + usize::from(i < global % total);
    let before: usize = replicas[..rank].iter().sum();
    let first = (0..before).map(rows).sum();
    (first, (before..before + replicas[rank]).map(rows).collect())
}

thread_local! {
    /// Whether this thread is running a replica's part of a step ([`as_replica_job`]).
    static IN_REPLICA_JOB: Cell<bool> = const { Cell::new(false) };
}

/// How many replica jobs are running in this process, on any thread.
static REPLICA_JOBS: AtomicUsize = AtomicUsize::new(0);

/// Runs `job` as a replica's part of a step: a panic inside it becomes that step's error on
/// every worker (the step catches it and votes), so the MPI panic hook, which aborts the job
/// for any other panic, must let it pass ([`in_replica_job`]). A flag, not the thread's name:
/// a single local replica runs on the caller's thread.
pub(crate) fn as_replica_job<T>(job: impl FnOnce() -> T) -> T {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            IN_REPLICA_JOB.with(|f| f.set(self.0));
            REPLICA_JOBS.fetch_sub(1, Ordering::SeqCst);
        }
    }
    // Reset on unwind too: the panic is caught above, and the thread goes on.
    REPLICA_JOBS.fetch_add(1, Ordering::SeqCst);
    let _reset = Reset(IN_REPLICA_JOB.with(|f| f.replace(true)));
    job()
}

/// Whether a panic on this thread belongs to a replica's job: the thread runs one, or it is a
/// rayon worker while one runs. A replica's CPU kernels run on rayon's threads, and rayon
/// hands a panic there on to the thread that called into it — the replica's, which catches it
/// — so such a panic becomes the step's error too, not the end of the job.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn in_replica_job() -> bool {
    IN_REPLICA_JOB.with(Cell::get)
        || (rayon::current_thread_index().is_some() && REPLICA_JOBS.load(Ordering::SeqCst) > 0)
}

/// FNV-1a (64 bits) of `bytes`: a checksum that, unlike `std`'s `DefaultHasher`, is the same
/// in every build and on every machine, so workers built apart still compare equal.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_is_the_published_function() {
        // The reference values of the FNV test suite.
        assert_eq!(fnv1a(*b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(*b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(*b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn worker_rows_cut_the_global_batch_in_rank_order() {
        // 10 over 2 + 2 replicas: 3, 3 on worker 0; 2, 2 on worker 1 from example 6.
        assert_eq!(worker_rows(10, &[2, 2], 0), (0, vec![3, 3]));
        assert_eq!(worker_rows(10, &[2, 2], 1), (6, vec![2, 2]));
        // 7 over 1 + 1; 1 over 1 + 1 (worker 1 gets nothing).
        assert_eq!(worker_rows(7, &[1, 1], 1), (4, vec![3]));
        assert_eq!(worker_rows(1, &[1, 1], 1), (1, vec![0]));
        // Uneven replica counts: 9 over 1 + 2.
        assert_eq!(worker_rows(9, &[1, 2], 1), (3, vec![3, 3]));
    }
}
