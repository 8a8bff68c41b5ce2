//! Keras' autocast variables within one training step: a layer reads its float32 weights in
//! its compute dtype (float16 under `mixed_float16`), and while a [`StepCasts`] lives on the
//! thread every read after the first gets the same copy, so the forward and the backward pass
//! cast each weight once per step, as PyTorch's autocast caches its casts. [`prefetch`] casts
//! a step's weights all at once before its forward pass: one op per device (one dispatch on a
//! GPU) instead of one per weight.

use std::cell::RefCell;
use std::sync::Arc;

use crate::error::Result;
use crate::tensor::{DType, Tensor};

thread_local! {
    /// The casts kept on this thread: `(weight, its copy)`. A step casts a few dozen weights,
    /// so a list beats a map.
    static CASTS: RefCell<Option<Vec<(Tensor, Tensor)>>> = const { RefCell::new(None) };
}

/// While it lives, [`cast`] keeps the copies it makes on this thread and hands them out again.
/// The weights must not change meanwhile: a step enters it for its forward and backward passes
/// and drops it before the optimizer updates the weights in place.
pub(crate) struct StepCasts {
    outer: Option<Vec<(Tensor, Tensor)>>,
}

impl StepCasts {
    pub(crate) fn enter() -> StepCasts {
        StepCasts {
            outer: CASTS.with(|c| c.replace(Some(Vec::new()))),
        }
    }
}

impl Drop for StepCasts {
    fn drop(&mut self) {
        CASTS.with(|c| *c.borrow_mut() = self.outer.take());
    }
}

/// Casts each `(weight, dtype)` this step has no copy of yet, in one op per device and pair of
/// dtypes, and keeps the copies for [`cast`]. Outside a step (nothing would keep them) it does
/// nothing.
///
/// # Errors
/// The casts' errors.
pub(crate) fn prefetch<'a>(wanted: impl IntoIterator<Item = (&'a Tensor, DType)>) -> Result<()> {
    let in_step = CASTS.with(|c| c.borrow().is_some());
    if !in_step {
        return Ok(());
    }
    // (device, from, to) and its weights, in the order first met.
    let mut batches: Vec<((String, DType, DType), Vec<Tensor>)> = Vec::new();
    for (weight, dtype) in wanted {
        if weight.dtype() == dtype || kept(weight, dtype).is_some() {
            continue;
        }
        let key = (weight.device().to_string(), weight.dtype(), dtype);
        let i = match batches.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                batches.push((key, Vec::new()));
                batches.len() - 1
            }
        };
        let batch = &mut batches[i].1;
        if !batch.iter().any(|w| Arc::ptr_eq(&w.0, &weight.0)) {
            batch.push(weight.clone());
        }
    }
    for ((_, _, dtype), weights) in batches {
        let Some(first) = weights.first() else {
            continue;
        };
        let copies = {
            // On the weights' device, whatever scope the step is in.
            let _scope = first.device_handle().scope();
            crate::ops::cast_all(&weights, dtype)?
        };
        CASTS.with(|c| {
            if let Some(casts) = c.borrow_mut().as_mut() {
                casts.extend(weights.into_iter().zip(copies));
            }
        });
    }
    Ok(())
}

/// This step's copy of `weight` in `dtype`, if made.
fn kept(weight: &Tensor, dtype: DType) -> Option<Tensor> {
    CASTS.with(|c| {
        c.borrow().as_ref().and_then(|casts| {
            casts
                .iter()
                .find(|(w, copy)| Arc::ptr_eq(&w.0, &weight.0) && copy.dtype() == dtype)
                .map(|(_, copy)| copy.clone())
        })
    })
}

/// `weight` in `dtype`: itself when it has that dtype, else this step's copy (made now if it
/// is the first read).
pub(crate) fn cast(weight: &Tensor, dtype: DType) -> Result<Tensor> {
    if weight.dtype() == dtype {
        return Ok(weight.clone());
    }
    if let Some(copy) = kept(weight, dtype) {
        return Ok(copy);
    }
    let copy = weight.cast(dtype)?;
    CASTS.with(|c| {
        if let Some(casts) = c.borrow_mut().as_mut() {
            casts.push((weight.clone(), copy.clone()));
        }
    });
    Ok(copy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu() -> crate::runtime::Runtime {
        crate::runtime::Runtime::builder().build().expect("runtime")
    }

    #[test]
    fn a_step_casts_each_weight_once_and_nothing_is_kept_after_it() {
        let rt = cpu();
        let _s = rt.cpu().expect("cpu").scope();
        let w = Tensor::from_slice(&[1.0f32, 2.5], &[2]).unwrap();
        let v = Tensor::from_slice(&[3.0f32], &[1]).unwrap();
        let same = |a: &Tensor, b: &Tensor| Arc::ptr_eq(&a.0, &b.0);
        {
            let _step = StepCasts::enter();
            let a = cast(&w, DType::F16).unwrap();
            let b = cast(&w, DType::F16).unwrap();
            assert!(same(&a, &b), "the second read gets the first copy");
            assert_eq!(b.dtype(), DType::F16);
            let c = cast(&v, DType::F16).unwrap();
            assert!(!same(&a, &c), "another weight gets its own copy");
            assert_eq!(c.to_vec::<half::f16>().unwrap(), [half::f16::from_f32(3.0)]);
            assert!(
                same(&cast(&w, DType::F32).unwrap(), &w),
                "its own dtype: itself"
            );
            {
                // A nested step keeps its own casts and gives the outer ones back.
                let _inner = StepCasts::enter();
                assert!(!same(&cast(&w, DType::F16).unwrap(), &a));
            }
            assert!(same(&cast(&w, DType::F16).unwrap(), &a));
        }
        // Outside a step (evaluate, predict) every read casts afresh.
        let a = cast(&w, DType::F16).unwrap();
        let b = cast(&w, DType::F16).unwrap();
        assert!(!same(&a, &b));
        assert_eq!(
            a.to_vec::<half::f16>().unwrap(),
            [half::f16::from_f32(1.0), half::f16::from_f32(2.5)]
        );
    }

    #[test]
    fn prefetch_casts_each_weight_once_for_the_step_and_nothing_outside_one() {
        let rt = cpu();
        let _s = rt.cpu().expect("cpu").scope();
        let w = Tensor::from_slice(&[1.0f32, 2.5, -3.0], &[3]).unwrap();
        let v = Tensor::from_slice(&[0.1f32], &[1]).unwrap();
        let h = w.cast(DType::F16).unwrap();
        let kept_count = || CASTS.with(|c| c.borrow().as_ref().map(Vec::len));
        prefetch([(&w, DType::F16)]).unwrap();
        assert_eq!(kept_count(), None, "outside a step nothing is kept");
        let _step = StepCasts::enter();
        // Twice the same weight, one already in its compute dtype: two casts kept.
        prefetch([
            (&w, DType::F16),
            (&v, DType::F16),
            (&w, DType::F16),
            (&h, DType::F16),
        ])
        .unwrap();
        assert_eq!(kept_count(), Some(2));
        let a = cast(&w, DType::F16).unwrap();
        assert_eq!(kept_count(), Some(2), "the read finds the prefetched copy");
        assert_eq!(
            a.to_vec::<half::f16>().unwrap(),
            [1.0, 2.5, -3.0].map(half::f16::from_f32)
        );
        assert_eq!(
            cast(&v, DType::F16).unwrap().to_vec::<half::f16>().unwrap(),
            [half::f16::from_f32(0.1)]
        );
        prefetch([(&w, DType::F16)]).unwrap();
        assert_eq!(
            kept_count(),
            Some(2),
            "a second prefetch casts nothing again"
        );
    }
}
