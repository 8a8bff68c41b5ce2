//! Optimizer steps with Keras 3 semantics, updating weights and slots in place.

use rayon::prelude::*;

use crate::ops::spec::{AdamParams, SgdParams};

use super::{PAR_CHUNK, PAR_MIN_ELEMS};

multiversion! {
    /// `w -= lr * g`.
    fn sgd_leaf(w: &mut [f32], g: &[f32], lr: f32) {
        for (w, &g) in w.iter_mut().zip(g) {
            *w -= lr * g;
        }
    }
}

multiversion! {
    /// `v = m v - lr g; w += v` (nesterov: `w += m v - lr g` with the new `v`).
    fn momentum_leaf(w: &mut [f32], g: &[f32], v: &mut [f32], lr: f32, momentum: f32, nesterov: bool) {
        let it = w.iter_mut().zip(g).zip(v.iter_mut());
        if nesterov {
            for ((w, &g), v) in it {
                let nv = momentum * *v - lr * g;
                *v = nv;
                *w += momentum * nv - lr * g;
            }
        } else {
            for ((w, &g), v) in it {
                let nv = momentum * *v - lr * g;
                *v = nv;
                *w += nv;
            }
        }
    }
}

/// Constants of one Adam step.
#[derive(Clone, Copy)]
struct AdamStep {
    /// `lr * sqrt(1 - b2^t) / (1 - b1^t)`.
    alpha: f32,
    /// `1 - beta1`.
    one_minus_b1: f32,
    /// `1 - beta2`.
    one_minus_b2: f32,
    /// Epsilon, outside the square root.
    eps: f32,
}

multiversion! {
    /// `m += (g - m)(1 - b1); v += (g² - v)(1 - b2); w -= alpha m / (sqrt(v) + eps)`.
    fn adam_leaf(w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], c: AdamStep) {
        for (((w, &g), m), v) in w.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            let nm = *m + (g - *m) * c.one_minus_b1;
            let nv = *v + (g * g - *v) * c.one_minus_b2;
            *m = nm;
            *v = nv;
            *w -= c.alpha * nm / (nv.sqrt() + c.eps);
        }
    }
}

/// Plain SGD (Keras with `momentum == 0`): `w -= lr * g`. `p.momentum` is ignored.
pub(crate) fn sgd(w: &mut [f32], g: &[f32], p: &SgdParams) {
    assert_eq!(w.len(), g.len(), "sgd: w and g lengths differ");
    if w.len() < PAR_MIN_ELEMS {
        sgd_leaf(w, g, p.lr);
    } else {
        w.par_chunks_mut(PAR_CHUNK)
            .zip(g.par_chunks(PAR_CHUNK))
            .for_each(|(w, g)| sgd_leaf(w, g, p.lr));
    }
}

/// SGD with momentum, Keras' form: `v = momentum * v - lr * g; w += v`; with
/// `nesterov`, `w += momentum * v - lr * g` using the new `v`.
pub(crate) fn sgd_momentum(w: &mut [f32], g: &[f32], v: &mut [f32], p: &SgdParams) {
    assert_eq!(w.len(), g.len(), "sgd_momentum: w and g lengths differ");
    assert_eq!(w.len(), v.len(), "sgd_momentum: w and v lengths differ");
    let (lr, momentum, nesterov) = (p.lr, p.momentum, p.nesterov);
    if w.len() < PAR_MIN_ELEMS {
        momentum_leaf(w, g, v, lr, momentum, nesterov);
    } else {
        w.par_chunks_mut(PAR_CHUNK)
            .zip(g.par_chunks(PAR_CHUNK))
            .zip(v.par_chunks_mut(PAR_CHUNK))
            .for_each(|((w, g), v)| momentum_leaf(w, g, v, lr, momentum, nesterov));
    }
}

/// Adam, Keras 3's form, for 1-based step `p.step`:
/// `alpha = lr * sqrt(1 - b2^t) / (1 - b1^t)` (computed in f64);
/// `m += (g - m)(1 - b1); v += (g² - v)(1 - b2); w -= alpha * m / (sqrt(v) + eps)`.
pub(crate) fn adam(w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], p: &AdamParams) {
    assert_eq!(w.len(), g.len(), "adam: w and g lengths differ");
    assert_eq!(w.len(), m.len(), "adam: w and m lengths differ");
    assert_eq!(w.len(), v.len(), "adam: w and v lengths differ");
    let t = i32::try_from(p.step).unwrap_or(i32::MAX);
    let b1 = f64::from(p.beta1);
    let b2 = f64::from(p.beta2);
    let alpha = f64::from(p.lr) * (1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t));
    let c = AdamStep {
        alpha: alpha as f32,
        one_minus_b1: 1.0 - p.beta1,
        one_minus_b2: 1.0 - p.beta2,
        eps: p.epsilon,
    };
    if w.len() < PAR_MIN_ELEMS {
        adam_leaf(w, g, m, v, c);
    } else {
        w.par_chunks_mut(PAR_CHUNK)
            .zip(g.par_chunks(PAR_CHUNK))
            .zip(m.par_chunks_mut(PAR_CHUNK))
            .zip(v.par_chunks_mut(PAR_CHUNK))
            .for_each(|(((w, g), m), v)| adam_leaf(w, g, m, v, c));
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::ops::reference::{self as r, assert_close, random_vec, to_f64};

    #[test]
    pub(in crate::ops::cpu) fn steps_match_reference() {
        for len in [1, 3, 7, 13, 28, 100_003] {
            let w = random_vec(len, 1);
            let g = random_vec(len, 2);
            let v0 = random_vec(len, 3);
            let (w64, g64, v64) = (to_f64(&w), to_f64(&g), to_f64(&v0));

            let p = SgdParams {
                lr: 0.01,
                momentum: 0.0,
                nesterov: false,
            };
            let mut w1 = w.clone();
            sgd(&mut w1, &g, &p);
            assert_close(&w1, &r::sgd(&w64, &g64, &p), 1e-6, "sgd");

            for nesterov in [false, true] {
                let p = SgdParams {
                    lr: 0.01,
                    momentum: 0.9,
                    nesterov,
                };
                let (mut w1, mut v1) = (w.clone(), v0.clone());
                sgd_momentum(&mut w1, &g, &mut v1, &p);
                let (ew, ev) = r::sgd_momentum(&w64, &g64, &v64, &p);
                assert_close(&w1, &ew, 1e-6, "momentum w");
                assert_close(&v1, &ev, 1e-6, "momentum v");
            }

            let m0: Vec<f32> = random_vec(len, 4).iter().map(|v| 0.1 * v).collect();
            let s0: Vec<f32> = random_vec(len, 5).iter().map(|v| 0.01 * v.abs()).collect();
            for step in [1, 2, 1000] {
                let p = AdamParams {
                    lr: 0.001,
                    beta1: 0.9,
                    beta2: 0.999,
                    epsilon: 1e-7,
                    step,
                };
                let (mut w1, mut m1, mut s1) = (w.clone(), m0.clone(), s0.clone());
                adam(&mut w1, &g, &mut m1, &mut s1, &p);
                let (ew, em, es) = r::adam(&w64, &g64, &to_f64(&m0), &to_f64(&s0), &p);
                assert_close(&w1, &ew, 1e-6, "adam w");
                assert_close(&m1, &em, 1e-6, "adam m");
                assert_close(&s1, &es, 1e-6, "adam v");
            }
        }
    }
}
