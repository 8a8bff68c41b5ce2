//! The replicas of one mirrored training step as a group that a layer can synchronize across:
//! Keras' `BatchNormalization(synchronized=True)` sums its per-replica moments (and, in the
//! backward pass, its per-replica gradient sums) over every replica of the step before it
//! normalizes.
//!
//! A mirrored step runs each replica's forward and backward pass on its own thread
//! (`nn/mirrored.rs`); [`run_in`] marks the thread as replica `i` of a [`ReplicaGroup`], and a
//! layer asks [`current`] for it. [`ReplicaGroup::all_reduce_sum`] is a rendezvous of small
//! host vectors: every replica calls it the same number of times in the same order (each runs
//! the same layers), each call returns the sum over replicas, added in replica order so that
//! every run gives the same bits. A replica whose job fails or panics breaks the group, and
//! every replica waiting in it, or arriving later, gets an error instead of waiting forever.

use std::cell::RefCell;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::error::{Error, Result};

/// The replicas of one step that take part in synchronized layers.
#[derive(Debug)]
pub(crate) struct ReplicaGroup {
    size: usize,
    /// Whether the step's replicas span several workers (processes): the group holds only this
    /// worker's replicas, so synchronizing over it would be wrong.
    multi_worker: bool,
    round: Mutex<Round>,
    done: Condvar,
}

/// The rendezvous in progress.
#[derive(Debug, Default)]
struct Round {
    /// Completed rendezvous so far: a waiter is done when it changes.
    generation: u64,
    /// Each replica's contribution to the current rendezvous.
    parts: Vec<Option<Vec<f64>>>,
    /// The sum of the last completed rendezvous.
    sum: Vec<f64>,
    /// Why the group is broken, once a replica failed.
    broken: Option<String>,
}

thread_local! {
    /// The group and index of the replica this thread runs, during [`run_in`].
    static CURRENT: RefCell<Option<(Arc<ReplicaGroup>, usize)>> = const { RefCell::new(None) };
}

impl ReplicaGroup {
    /// A group of `size` replicas; `multi_worker` when the step spans workers.
    pub(crate) fn new(size: usize, multi_worker: bool) -> Arc<ReplicaGroup> {
        Arc::new(ReplicaGroup {
            size,
            multi_worker,
            round: Mutex::new(Round {
                parts: vec![None; size],
                ..Round::default()
            }),
            done: Condvar::new(),
        })
    }

    /// Replicas in the group.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Whether the step spans several workers (see [`ReplicaGroup::new`]).
    pub(crate) fn multi_worker(&self) -> bool {
        self.multi_worker
    }

    fn lock(&self) -> MutexGuard<'_, Round> {
        // A panic while the lock is held leaves the round as consistent as before it: the
        // fields are plain data written in one place each.
        self.round.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The element-wise sum of `values` over every replica of the group (this one is
    /// `index`), in replica order. Waits for the others.
    ///
    /// # Errors
    /// [`Error::Model`] naming `what` when another replica failed before it got here, or when
    /// the replicas' vectors differ in length.
    pub(crate) fn all_reduce_sum(
        &self,
        index: usize,
        values: Vec<f64>,
        what: &str,
    ) -> Result<Vec<f64>> {
        let broken = |why: &str| {
            Error::Model(format!(
                "{what}: another replica of the step failed, so the synchronized sum cannot \
                 complete: {why}"
            ))
        };
        let mut round = self.lock();
        if let Some(why) = &round.broken {
            return Err(broken(why));
        }
        let generation = round.generation;
        round.parts[index] = Some(values);
        if round.parts.iter().all(Option::is_some) {
            let parts: Vec<Vec<f64>> = round.parts.iter_mut().filter_map(Option::take).collect();
            let len = parts[0].len();
            if parts.iter().any(|p| p.len() != len) {
                let lens: Vec<usize> = parts.iter().map(Vec::len).collect();
                let why = format!("the replicas sent vectors of lengths {lens:?}");
                round.broken = Some(why.clone());
                self.done.notify_all();
                return Err(Error::Model(format!("{what}: {why}")));
            }
            let mut sum = vec![0.0; len];
            for part in &parts {
                sum.iter_mut().zip(part).for_each(|(s, v)| *s += v);
            }
            round.sum = sum.clone();
            round.generation += 1;
            self.done.notify_all();
            return Ok(sum);
        }
        // The next rendezvous cannot complete before this replica joins it, so `sum` still
        // holds this one's when the generation moves on.
        while round.generation == generation && round.broken.is_none() {
            round = self.done.wait(round).unwrap_or_else(|p| p.into_inner());
        }
        if round.generation != generation {
            return Ok(round.sum.clone());
        }
        Err(broken(round.broken.as_deref().unwrap_or_default()))
    }

    /// Breaks the group: every replica waiting in [`ReplicaGroup::all_reduce_sum`], or calling
    /// it later, gets an error naming `why`.
    pub(crate) fn abort(&self, why: String) {
        let mut round = self.lock();
        round.broken.get_or_insert(why);
        self.done.notify_all();
    }
}

/// Runs `job` as replica `index` of `group` on this thread: [`current`] returns them inside.
/// An error or a panic of the job breaks the group ([`ReplicaGroup::abort`]) so that no other
/// replica waits for this one.
pub(crate) fn run_in<T>(
    group: &Arc<ReplicaGroup>,
    index: usize,
    device: &str,
    job: impl FnOnce() -> Result<T>,
) -> Result<T> {
    /// Restores the thread's previous group, and breaks this one if the job unwinds.
    struct Leave<'a> {
        group: &'a ReplicaGroup,
        device: &'a str,
        previous: Option<(Arc<ReplicaGroup>, usize)>,
    }
    impl Drop for Leave<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.group
                    .abort(format!("the replica on {} panicked", self.device));
            }
            CURRENT.with(|c| *c.borrow_mut() = self.previous.take());
        }
    }
    let previous = CURRENT.with(|c| c.borrow_mut().replace((group.clone(), index)));
    let _leave = Leave {
        group,
        device,
        previous,
    };
    let result = job();
    if let Err(e) = &result {
        group.abort(format!("the replica on {device}: {e}"));
    }
    result
}

/// The group and index of the replica running on this thread, inside [`run_in`].
pub(crate) fn current() -> Option<(Arc<ReplicaGroup>, usize)> {
    CURRENT.with(|c| c.borrow().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_in_replica_order_over_several_rounds() {
        let group = ReplicaGroup::new(3, false);
        let sums: Vec<Vec<Vec<f64>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|i| {
                    let group = group.clone();
                    s.spawn(move || {
                        run_in(&group, i, "test", || {
                            let (g, at) = current().expect("inside run_in");
                            (0..4)
                                .map(|round| {
                                    let v = vec![(i + 1) as f64, (round * 10 + at) as f64];
                                    g.all_reduce_sum(at, v, "test")
                                })
                                .collect::<Result<Vec<_>>>()
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("no panic").expect("no error"))
                .collect()
        });
        for per_replica in &sums {
            for (round, sum) in per_replica.iter().enumerate() {
                assert_eq!(sum, &vec![6.0, (30 * round + 3) as f64]);
            }
        }
        assert!(current().is_none(), "run_in restores the thread");
    }

    #[test]
    fn a_failed_replica_releases_the_others() {
        let group = ReplicaGroup::new(2, false);
        let (waiting, failing) = std::thread::scope(|s| {
            let g = group.clone();
            let waiting = s.spawn(move || {
                run_in(&g, 0, "gpu:0", || g.all_reduce_sum(0, vec![1.0], "moments"))
            });
            let g = group.clone();
            let failing = s.spawn(move || {
                run_in(&g, 1, "gpu:1", || -> Result<Vec<f64>> {
                    Err(Error::Model("out of memory".into()))
                })
            });
            (
                waiting.join().expect("no panic"),
                failing.join().expect("no panic"),
            )
        });
        let err = waiting
            .expect_err("the waiting replica is released")
            .to_string();
        assert!(
            err.contains("moments") && err.contains("out of memory"),
            "{err}"
        );
        assert!(failing.is_err());
        // A later call fails at once.
        assert!(group.all_reduce_sum(0, vec![1.0], "again").is_err());
    }

    #[test]
    fn a_panicking_replica_releases_the_others() {
        let group = ReplicaGroup::new(2, false);
        let waiting = std::thread::scope(|s| {
            let g = group.clone();
            let waiting = s.spawn(move || {
                run_in(&g, 0, "cpu:0", || g.all_reduce_sum(0, vec![1.0], "moments"))
            });
            let g = group.clone();
            let panicking =
                s.spawn(move || run_in(&g, 1, "cpu:1", || -> Result<()> { panic!("kernel bug") }));
            assert!(panicking.join().is_err());
            waiting.join().expect("no panic")
        });
        let err = waiting.expect_err("released").to_string();
        assert!(err.contains("panicked"), "{err}");
    }
}
