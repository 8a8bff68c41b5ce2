//! Optimizer steps (SGD, momentum, Adam, RMSprop, weight decay) and gradient clipping.

use crate::ops::spec::{AdamParams, SgdParams};
use crate::ops::spec::{ClipMode, RmspropParams};

/// One plain SGD step: returns `w - lr * g`.
pub fn sgd(w: &[f64], g: &[f64], p: &SgdParams) -> Vec<f64> {
    let lr = f64::from(p.lr);
    w.iter().zip(g).map(|(&w, &g)| w - lr * g).collect()
}

/// One Keras momentum-SGD step: returns `(w', v')` with `v' = momentum * v - lr * g` and
/// `w' = w + v'`, or with `nesterov` `w' = w + momentum * v' - lr * g`.
pub fn sgd_momentum(w: &[f64], g: &[f64], v: &[f64], p: &SgdParams) -> (Vec<f64>, Vec<f64>) {
    let (lr, mu) = (f64::from(p.lr), f64::from(p.momentum));
    let mut w_new = Vec::with_capacity(w.len());
    let mut v_new = Vec::with_capacity(w.len());
    for i in 0..w.len() {
        let nv = mu * v[i] - lr * g[i];
        v_new.push(nv);
        w_new.push(if p.nesterov {
            w[i] + mu * nv - lr * g[i]
        } else {
            w[i] + nv
        });
    }
    (w_new, v_new)
}

/// One Keras 3 Adam step for 1-based step `t = p.step`: returns `(w', m', v')` with
/// `m' = m + (g - m)(1 - b1)`, `v' = v + (g² - v)(1 - b2)`,
/// `w' = w - lr * sqrt(1 - b2^t) / (1 - b1^t) * m' / (sqrt(v') + eps)`.
pub fn adam(
    w: &[f64],
    g: &[f64],
    m: &[f64],
    v: &[f64],
    p: &AdamParams,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (lr, b1, b2, eps) = (
        f64::from(p.lr),
        f64::from(p.beta1),
        f64::from(p.beta2),
        f64::from(p.epsilon),
    );
    let t = p.step as i32;
    let alpha = lr * (1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t));
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..w.len() {
        let nm = m[i] + (g[i] - m[i]) * (1.0 - b1);
        let nv = v[i] + (g[i] * g[i] - v[i]) * (1.0 - b2);
        out.0.push(w[i] - alpha * nm / (nv.sqrt() + eps));
        out.1.push(nm);
        out.2.push(nv);
    }
    out
}

/// Slots of one RMSprop step: `(w', velocity', average_gradient', momentum')`, the optional
/// ones present when the step had them.
pub type RmspropState = (Vec<f64>, Vec<f64>, Option<Vec<f64>>, Option<Vec<f64>>);

/// One Keras 3 RMSprop step: `v' = rho v + (1 - rho) g²`; centered: `a' = rho a + (1 - rho) g`,
/// `d = v' - a'² + eps`, else `d = v' + eps`; `inc = lr g / sqrt(d)`; with momentum
/// `m' = momentum m + inc; w' = w - m'`, else `w' = w - inc`.
pub fn rmsprop(
    w: &[f64],
    g: &[f64],
    v: &[f64],
    average: Option<&[f64]>,
    momentum: Option<&[f64]>,
    p: &RmspropParams,
) -> RmspropState {
    let (lr, rho, mu, eps) = (
        f64::from(p.lr),
        f64::from(p.rho),
        f64::from(p.momentum),
        f64::from(p.epsilon),
    );
    let mut out: RmspropState = (
        Vec::new(),
        Vec::new(),
        average.map(|_| Vec::new()),
        momentum.map(|_| Vec::new()),
    );
    for i in 0..w.len() {
        let nv = rho * v[i] + (1.0 - rho) * g[i] * g[i];
        out.1.push(nv);
        let denominator = match (average, out.2.as_mut()) {
            (Some(a), Some(na)) => {
                let a = rho * a[i] + (1.0 - rho) * g[i];
                na.push(a);
                nv - a * a + eps
            }
            _ => nv + eps,
        };
        let increment = lr * g[i] / denominator.sqrt();
        match (momentum, out.3.as_mut()) {
            (Some(m), Some(nm)) => {
                let m = mu * m[i] + increment;
                nm.push(m);
                out.0.push(w[i] - m);
            }
            _ => out.0.push(w[i] - increment),
        }
    }
    out
}

/// Keras' decoupled weight decay, before an update: `w - w * wd * lr`.
pub fn weight_decay(w: &[f64], wd: f64, lr: f64) -> Vec<f64> {
    w.iter().map(|&w| w - w * wd * lr).collect()
}

/// A clipped gradient. `sum_squares` is the sum of squares the norm comes from: the gradient's
/// own for [`ClipMode::Norm`], every gradient's for [`ClipMode::GlobalNorm`] (unused by
/// [`ClipMode::Value`]).
pub fn clip(g: &[f64], mode: ClipMode, sum_squares: f64) -> Vec<f64> {
    match mode {
        ClipMode::Norm(c) => {
            let c = f64::from(c);
            let norm = if sum_squares > 0.0 {
                sum_squares.sqrt()
            } else {
                sum_squares
            };
            g.iter().map(|&g| g * c / norm.max(c)).collect()
        }
        ClipMode::GlobalNorm(c) => {
            let c = f64::from(c);
            let norm = sum_squares.sqrt();
            // Keras adds `norm - norm`: NaN for a norm that is not finite.
            let scale = if norm.is_finite() {
                c * (1.0 / norm).min(1.0 / c)
            } else {
                f64::NAN
            };
            g.iter().map(|&g| g * scale).collect()
        }
        ClipMode::Value(c) => {
            let c = f64::from(c);
            g.iter().map(|&g| g.max(-c).min(c)).collect()
        }
    }
}
