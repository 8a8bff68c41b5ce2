//! Parallel reductions whose result is the same, bit for bit, on every run and with any number
//! of threads: tasks are cut into contiguous groups (at most 32, by the task count alone),
//! each folded in task order, and the groups' results are added in group order. (rayon's
//! `fold` + `reduce` group tasks by how work happened to be stolen, so the sums' rounding
//! varied from run to run, and a resumed training run could not match an uninterrupted one.)

use std::ops::AddAssign;

use rayon::prelude::*;

use super::PAR_MIN_ELEMS;

/// Groups the tasks are cut into: enough for 16 cores, and fixed, so that the grouping, and
/// with it the rounding, depends on neither scheduling nor the thread count.
const GROUPS: usize = 32;

/// Elements of a vector sum ([`add_parts`]) per rayon task.
const SUM_CHUNK: usize = 4096;

/// Each group's fold of tasks `0..tasks` from `init()`, in group order: at most [`GROUPS`]
/// results, none for no tasks.
pub(crate) fn ordered_parts<A: Send>(
    tasks: usize,
    init: impl Fn() -> A + Sync,
    fold: impl Fn(A, usize) -> A + Sync,
) -> Vec<A> {
    let groups = tasks.min(GROUPS);
    (0..groups)
        .into_par_iter()
        .map(|g| (g * tasks / groups..(g + 1) * tasks / groups).fold(init(), &fold))
        .collect()
}

/// The groups' results ([`ordered_parts`]) added in group order by `add`; `None` for no tasks.
pub(crate) fn ordered_reduce<A: Send>(
    tasks: usize,
    init: impl Fn() -> A + Sync,
    fold: impl Fn(A, usize) -> A + Sync,
    add: impl Fn(A, A) -> A,
) -> Option<A> {
    ordered_parts(tasks, init, fold).into_iter().reduce(add)
}

/// Vector partial sums: `fold(acc, t)` adds task `t`'s terms into its group's `len` zeros, and
/// the groups' vectors are added ([`add_parts`]); `len` zeros for no tasks.
pub(crate) fn ordered_sums<T>(
    tasks: usize,
    len: usize,
    fold: impl Fn(&mut [T], usize) + Sync,
) -> Vec<T>
where
    T: Copy + Default + AddAssign + Send + Sync,
{
    let parts = ordered_parts(
        tasks,
        || vec![T::default(); len],
        |mut acc, t| {
            fold(&mut acc, t);
            acc
        },
    );
    add_parts(parts).unwrap_or_else(|| vec![T::default(); len])
}

/// `parts[0] + parts[1] + ...` element by element, each element's terms added in part order
/// (the bits of a sequential fold), over chunks of the elements in parallel: a kernel
/// gradient's 32 partial sums of 512 KiB took one thread 1-2 ms to add while the other waited.
/// `None` for no parts.
///
/// # Panics
/// When the parts' lengths differ (a caller's bug).
pub(crate) fn add_parts<T>(parts: Vec<Vec<T>>) -> Option<Vec<T>>
where
    T: Copy + AddAssign + Send + Sync,
{
    let mut parts = parts.into_iter();
    let mut total = parts.next()?;
    let rest: Vec<Vec<T>> = parts.collect();
    assert!(
        rest.iter().all(|p| p.len() == total.len()),
        "add_parts: partial sums of different lengths"
    );
    let add_chunk = |(c, out): (usize, &mut [T])| {
        let range = c * SUM_CHUNK..c * SUM_CHUNK + out.len();
        for part in &rest {
            out.iter_mut()
                .zip(&part[range.clone()])
                .for_each(|(o, &p)| *o += p);
        }
    };
    if total.len() * rest.len() < PAR_MIN_ELEMS {
        total.chunks_mut(SUM_CHUNK).enumerate().for_each(add_chunk);
    } else {
        total
            .par_chunks_mut(SUM_CHUNK)
            .enumerate()
            .for_each(add_chunk);
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sums of `add_parts` are a sequential fold's, bit for bit, in parallel or not.
    #[test]
    fn parts_add_in_part_order() {
        let mut state = 0x2545_f491_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        // Below and above the parallel threshold; the magnitudes differ so that the order of
        // the additions changes the rounding.
        for (count, len) in [(3, 10), (32, 131_072 / 16 + 5)] {
            let parts: Vec<Vec<f32>> = (0..count)
                .map(|p| (0..len).map(|_| next() * 10f32.powi(p % 5)).collect())
                .collect();
            let sequential = parts.clone().into_iter().reduce(|mut a, b| {
                a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
                a
            });
            let bits =
                |v: Option<Vec<f32>>| v.map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            assert_eq!(bits(add_parts(parts)), bits(sequential));
        }
        assert_eq!(add_parts::<f32>(Vec::new()), None);
    }

    /// `ordered_sums` folds every task once, and sums to zeros without tasks.
    #[test]
    fn ordered_sums_count_every_task() {
        let sums = ordered_sums(100, 3, |acc: &mut [f64], t| {
            acc[0] += 1.0;
            acc[1] += t as f64;
        });
        assert_eq!(sums, vec![100.0, 4950.0, 0.0]);
        assert_eq!(ordered_sums(0, 2, |_: &mut [f64], _| {}), vec![0.0, 0.0]);
    }
}
