//! Optimizer steps with Keras 3 semantics, updating weights and slots in place.

use rayon::prelude::*;

use crate::ops::spec::{AdamParams, ClipMode, RmspropParams, SgdParams};

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

// ---- RMSprop, weight decay, gradient clipping ----

/// Constants of one RMSprop step.
#[derive(Clone, Copy)]
pub(crate) struct RmspropStep {
    lr: f32,
    rho: f32,
    /// `1 - rho`, from Keras' Python floats (f64), rounded once.
    one_minus_rho: f32,
    momentum: f32,
    eps: f32,
}

impl RmspropStep {
    pub(crate) fn new(p: &RmspropParams) -> RmspropStep {
        RmspropStep {
            lr: p.lr,
            rho: p.rho,
            one_minus_rho: (1.0 - f64::from(p.rho)) as f32,
            momentum: p.momentum,
            eps: p.epsilon,
        }
    }
}

multiversion! {
    /// Keras 3's RMSprop in Keras' operation order; `a` (average gradient) and `m` (momentum)
    /// are empty when the step has none.
    fn rmsprop_leaf(w: &mut [f32], g: &[f32], v: &mut [f32], a: &mut [f32], m: &mut [f32], c: RmspropStep) {
        for i in 0..w.len() {
            let gi = g[i];
            let nv = c.rho * v[i] + c.one_minus_rho * (gi * gi);
            v[i] = nv;
            let denominator = if a.is_empty() {
                nv + c.eps
            } else {
                let na = c.rho * a[i] + c.one_minus_rho * gi;
                a[i] = na;
                nv - na * na + c.eps
            };
            let increment = c.lr * gi / denominator.sqrt();
            if m.is_empty() {
                w[i] -= increment;
            } else {
                let nm = c.momentum * m[i] + increment;
                m[i] = nm;
                w[i] -= nm;
            }
        }
    }
}

/// Keras 3's RMSprop step; `average` with `centered`, `momentum` with a momentum != 0.
pub(crate) fn rmsprop(
    w: &mut [f32],
    g: &[f32],
    v: &mut [f32],
    average: Option<&mut [f32]>,
    momentum: Option<&mut [f32]>,
    p: &RmspropParams,
) {
    assert_eq!(w.len(), g.len(), "rmsprop: w and g lengths differ");
    assert_eq!(w.len(), v.len(), "rmsprop: w and v lengths differ");
    let a = average.unwrap_or_default();
    let m = momentum.unwrap_or_default();
    assert!(
        a.is_empty() || a.len() == w.len(),
        "rmsprop: average length"
    );
    assert!(
        m.is_empty() || m.len() == w.len(),
        "rmsprop: momentum length"
    );
    rmsprop_leaf(w, g, v, a, m, RmspropStep::new(p));
}

multiversion! {
    /// `w -= w * wd * lr`.
    fn decay_leaf(w: &mut [f32], wd: f32, lr: f32) {
        for w in w.iter_mut() {
            *w -= *w * wd * lr;
        }
    }
}

/// Keras' decoupled weight decay: `w = w - w * wd * lr`.
pub(crate) fn weight_decay(w: &mut [f32], wd: f32, lr: f32) {
    if w.len() < PAR_MIN_ELEMS {
        decay_leaf(w, wd, lr);
    } else {
        w.par_chunks_mut(PAR_CHUNK)
            .for_each(|w| decay_leaf(w, wd, lr));
    }
}

/// The factor and bounds one clip applies: `out = min(max(g * mul / div, lo), hi)`.
#[derive(Clone, Copy)]
pub(crate) struct ClipStep {
    pub(crate) mul: f32,
    pub(crate) div: f32,
    pub(crate) lo: f32,
    pub(crate) hi: f32,
}

impl ClipStep {
    /// The step of `mode` for a sum of squares `sum_squares` (the gradient's own for
    /// [`ClipMode::Norm`], every gradient's for [`ClipMode::GlobalNorm`]), in float32 in
    /// Keras' order: `g * c / max(norm, c)` (a norm of 0 stays 0), or
    /// `g * (c * min(1 / norm, 1 / c) + (norm - norm))`, or the bounds `±c`.
    pub(crate) fn new(mode: ClipMode, sum_squares: f32) -> ClipStep {
        let open = ClipStep {
            mul: 1.0,
            div: 1.0,
            lo: f32::NEG_INFINITY,
            hi: f32::INFINITY,
        };
        match mode {
            ClipMode::Norm(c) => {
                let norm = if sum_squares > 0.0 {
                    sum_squares.sqrt()
                } else {
                    sum_squares
                };
                ClipStep {
                    mul: c,
                    div: norm.max(c),
                    ..open
                }
            }
            ClipMode::GlobalNorm(c) => {
                let norm = sum_squares.sqrt();
                let inverse_c = (1.0 / f64::from(c)) as f32;
                ClipStep {
                    // Keras adds `norm - norm`: NaN for a norm that is not finite.
                    mul: if norm.is_finite() {
                        c * (1.0 / norm).min(inverse_c)
                    } else {
                        f32::NAN
                    },
                    ..open
                }
            }
            ClipMode::Value(c) => ClipStep {
                lo: -c,
                hi: c,
                ..open
            },
        }
    }
}

multiversion! {
    /// `out = clamp(g * mul / div)`.
    fn clip_leaf(g: &[f32], out: &mut [f32], c: ClipStep) {
        for (o, &g) in out.iter_mut().zip(g) {
            // Comparisons, not f32::max/min, so that a NaN stays NaN (a global norm that is
            // not finite makes every gradient NaN, as in Keras).
            let x = g * c.mul / c.div;
            *o = if x < c.lo {
                c.lo
            } else if x > c.hi {
                c.hi
            } else {
                x
            };
        }
    }
}

/// A clipped copy of `g` (see [`ClipStep::new`]).
pub(crate) fn clip(g: &[f32], out: &mut [f32], mode: ClipMode, sum_squares: f32) {
    assert_eq!(g.len(), out.len(), "clip: g and out lengths differ");
    let c = ClipStep::new(mode, sum_squares);
    if g.len() < PAR_MIN_ELEMS {
        clip_leaf(g, out, c);
    } else {
        g.par_chunks(PAR_CHUNK)
            .zip(out.par_chunks_mut(PAR_CHUNK))
            .for_each(|(g, o)| clip_leaf(g, o, c));
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

            // A reachable centered state: the average gradient's square below the velocity.
            let a0: Vec<f32> = random_vec(len, 6)
                .iter()
                .zip(&s0)
                .map(|(r, s)| r * s.sqrt())
                .collect();
            for (centered, momentum) in [(false, 0.0), (false, 0.9), (true, 0.0), (true, 0.5)] {
                let p = RmspropParams {
                    lr: 0.001,
                    rho: 0.9,
                    momentum,
                    epsilon: 1e-7,
                    centered,
                };
                let (mut w1, mut s1, mut a1, mut m1) =
                    (w.clone(), s0.clone(), a0.clone(), v0.clone());
                rmsprop(
                    &mut w1,
                    &g,
                    &mut s1,
                    centered.then_some(&mut a1[..]),
                    (momentum != 0.0).then_some(&mut m1[..]),
                    &p,
                );
                let (a64, m64) = (to_f64(&a0), to_f64(&v0));
                let (ew, es, ea, em) = r::rmsprop(
                    &w64,
                    &g64,
                    &to_f64(&s0),
                    centered.then_some(&a64[..]),
                    (momentum != 0.0).then_some(&m64[..]),
                    &p,
                );
                assert_close(&w1, &ew, 1e-5, "rmsprop w");
                assert_close(&s1, &es, 1e-6, "rmsprop v");
                if let Some(ea) = ea {
                    assert_close(&a1, &ea, 1e-6, "rmsprop average");
                }
                if let Some(em) = em {
                    assert_close(&m1, &em, 1e-5, "rmsprop momentum");
                }
            }

            let mut w1 = w.clone();
            weight_decay(&mut w1, 0.004, 0.01);
            assert_close(
                &w1,
                &r::weight_decay(&w64, 0.004, 0.01),
                1e-7,
                "weight decay",
            );

            let sum_squares: f64 = g64.iter().map(|g| g * g).sum();
            for mode in [
                ClipMode::Norm(0.5),
                ClipMode::Norm(1e6),
                ClipMode::GlobalNorm(0.5),
                ClipMode::GlobalNorm(2.0 * sum_squares.sqrt() as f32),
                ClipMode::Value(0.25),
            ] {
                let mut out = vec![f32::NAN; len];
                clip(&g, &mut out, mode, sum_squares as f32);
                assert_close(&out, &r::clip(&g64, mode, sum_squares), 1e-6, "clip");
            }
        }
    }
}
