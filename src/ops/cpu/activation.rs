//! The activations with their own kernel ([`ActivationFn`]) on the CPU: the formulas of
//! `shaders/activation.wgsl`, in the same stable forms (no `exp` of a large positive argument,
//! no `1 - (value near 1)`), with the standard library's `exp_m1`, `ln_1p` and `tanh`.

use rayon::prelude::*;

use crate::ops::cpu::{PAR_CHUNK, PAR_MIN_ELEMS};
use crate::ops::spec::{ActivationFn, SELU_ALPHA, SELU_SCALE};

const SCALE: f32 = SELU_SCALE as f32;
const SCALE_ALPHA: f32 = (SELU_SCALE * SELU_ALPHA) as f32;
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_COEFF: f32 = 0.044715;

/// `1 / (1 + e^-x)` from `e^-|x|`, which never overflows.
#[inline]
pub(crate) fn sigmoid(x: f32) -> f32 {
    let e = (-x.abs()).exp();
    let s = 1.0 / (1.0 + e);
    if x >= 0.0 {
        s
    } else {
        e * s
    }
}

/// `(σ(x), 1 - σ(x))`, the complement not formed by a subtraction, so that `σ(1 - σ)` stays
/// accurate in both tails.
#[inline]
fn sigmoid_pair(x: f32) -> (f32, f32) {
    let e = (-x.abs()).exp();
    let r = 1.0 / (1.0 + e);
    if x >= 0.0 {
        (r, e * r)
    } else {
        (e * r, r)
    }
}

/// `e^(-x²/2)·e^extra` without the rounding of `x²` in the exponent (`x = hi + lo`, `hi²`
/// exact): the large exponent `-x²/2` of the normal tails would otherwise lose its last bits.
#[inline]
fn exp_neg_half_sq(x: f32, extra: f32) -> f32 {
    let ax = x.abs();
    let hi = f32::from_bits(ax.to_bits() & 0xffff_f000);
    let lo = ax - hi;
    (-0.5 * hi * hi).exp() * (-0.5 * lo * (ax + hi) + extra).exp()
}

/// `Φ(x) = erfc(-x/√2) / 2`, about 1e-7 relative everywhere (Numerical Recipes' `erfcc`
/// Chebyshev fit; see `shaders/activation.wgsl`).
#[inline]
pub(crate) fn normal_cdf(x: f32) -> f32 {
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_204
                                + t * (1.488_515_9 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let tail = 0.5 * t * exp_neg_half_sq(x, poly);
    if x < 0.0 {
        tail
    } else {
        1.0 - tail
    }
}

fn gelu_tanh_arg(x: f32) -> f32 {
    SQRT_2_OVER_PI * (x + GELU_COEFF * x * x * x)
}

/// `act(x)` for one value.
#[inline]
pub(crate) fn act(x: f32, act: ActivationFn) -> f32 {
    match act {
        ActivationFn::Linear => x,
        ActivationFn::Relu {
            negative_slope,
            max_value,
            threshold,
        } => {
            let mut pos = if threshold != 0.0 {
                if x > threshold {
                    x
                } else {
                    0.0
                }
            } else {
                x.max(0.0)
            };
            if let Some(m) = max_value {
                pos = pos.min(m);
            }
            // Without a slope, no `0 * inf` (NaN) at x = -inf: relu(-inf) = 0, as in TF.
            if negative_slope == 0.0 {
                return pos;
            }
            pos - negative_slope * (threshold - x).max(0.0)
        }
        ActivationFn::Elu => {
            if x > 0.0 {
                x
            } else {
                x.exp_m1()
            }
        }
        ActivationFn::Selu => {
            if x > 0.0 {
                SCALE * x
            } else {
                SCALE_ALPHA * x.exp_m1()
            }
        }
        ActivationFn::Gelu { approximate: false } => x * normal_cdf(x),
        // 0.5 x (1 + tanh(u)) = x σ(2u), which does not cancel for large negative x.
        ActivationFn::Gelu { approximate: true } => x * sigmoid(2.0 * gelu_tanh_arg(x)),
        ActivationFn::Sigmoid => sigmoid(x),
        ActivationFn::Tanh => x.tanh(),
        ActivationFn::Swish => x * sigmoid(x),
        ActivationFn::Softplus => x.max(0.0) + (-x.abs()).exp().ln_1p(),
    }
}

/// `act'(x)` from the input, TensorFlow's value at the kinks.
#[inline]
pub(crate) fn grad_from_input(x: f32, act: ActivationFn) -> f32 {
    let step = |b: bool| if b { 1.0 } else { 0.0 };
    match act {
        ActivationFn::Linear => 1.0,
        ActivationFn::Relu {
            negative_slope,
            max_value,
            threshold,
        } => {
            if negative_slope != 0.0 && max_value.is_none() && threshold == 0.0 {
                return if x > 0.0 { 1.0 } else { negative_slope };
            }
            let pos = match max_value {
                Some(m) if threshold == 0.0 && m == 6.0 => step(x > 0.0 && x < 6.0),
                Some(m) => step(x > threshold && x <= m),
                None => step(x > threshold),
            };
            pos + if x < threshold { negative_slope } else { 0.0 }
        }
        ActivationFn::Elu => {
            if x > 0.0 {
                1.0
            } else {
                x.exp()
            }
        }
        // SeluGrad's: scale at 0.
        ActivationFn::Selu => {
            if x >= 0.0 {
                SCALE
            } else {
                SCALE_ALPHA * x.exp()
            }
        }
        ActivationFn::Gelu { approximate: false } => {
            normal_cdf(x) + x * FRAC_1_SQRT_2PI * exp_neg_half_sq(x, 0.0)
        }
        ActivationFn::Gelu { approximate: true } => {
            let (s, c) = sigmoid_pair(2.0 * gelu_tanh_arg(x));
            let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_COEFF * x * x);
            s + x * 2.0 * s * c * du
        }
        ActivationFn::Sigmoid => {
            let (s, c) = sigmoid_pair(x);
            s * c
        }
        // 1 - tanh² = 4e / (1 + e)², e = e^(-2|x|): no cancellation in the tails.
        ActivationFn::Tanh => {
            let e = (-2.0 * x.abs()).exp();
            let r = 1.0 / (1.0 + e);
            4.0 * e * r * r
        }
        ActivationFn::Swish => {
            let (s, c) = sigmoid_pair(x);
            s * (1.0 + x * c)
        }
        ActivationFn::Softplus => sigmoid(x),
    }
}

/// `act'(.)` from the output `y`, for the activations where
/// [`ActivationFn::grad_from_output`] holds (the others get 1).
#[inline]
pub(crate) fn grad_from_output(y: f32, act: ActivationFn) -> f32 {
    match act {
        ActivationFn::Relu {
            negative_slope,
            max_value,
            ..
        } => {
            if y > 0.0 {
                match max_value {
                    Some(m) if y >= m => 0.0,
                    _ => 1.0,
                }
            } else if y < 0.0 || max_value.is_none() {
                // y = 0 without a clip is x = 0 (or below, with no slope): leaky_relu's slope.
                negative_slope
            } else {
                0.0
            }
        }
        ActivationFn::Elu => {
            if y > 0.0 {
                1.0
            } else {
                y + 1.0
            }
        }
        ActivationFn::Selu => {
            if y >= 0.0 {
                SCALE
            } else {
                y + SCALE_ALPHA
            }
        }
        ActivationFn::Sigmoid => y * (1.0 - y),
        ActivationFn::Tanh => (1.0 - y) * (1.0 + y),
        // σ(x) = 1 - e^-y.
        ActivationFn::Softplus => -(-y).exp_m1(),
        _ => 1.0,
    }
}

multiversion! {
    /// `y = max(x, 0)`: the ReLU layer's, without the per-element match, vectorized.
    fn relu_leaf(x: &[f32], y: &mut [f32]) {
        for (y, &x) in y.iter_mut().zip(x) {
            *y = x.max(0.0);
        }
    }
}

multiversion! {
    /// `dz = dy` where ReLU's output `y` is positive, else 0: its gradient, vectorized.
    fn relu_grad_leaf(dy: &[f32], y: &[f32], dz: &mut [f32]) {
        for ((dz, &d), &y) in dz.iter_mut().zip(dy).zip(y) {
            *dz = d * if y > 0.0 { 1.0 } else { 0.0 };
        }
    }
}

/// `y[i] = act(x[i])`.
pub(crate) fn activation_fn_forward(x: &[f32], y: &mut [f32], a: ActivationFn) {
    assert_eq!(x.len(), y.len(), "activation_fn: x and y lengths differ");
    let relu = a == ActivationFn::RELU;
    let leaf = |x: &[f32], y: &mut [f32]| {
        if relu {
            return relu_leaf(x, y);
        }
        for (y, &x) in y.iter_mut().zip(x) {
            *y = act(x, a);
        }
    };
    if x.len() < PAR_MIN_ELEMS {
        leaf(x, y);
    } else {
        y.par_chunks_mut(PAR_CHUNK)
            .zip(x.par_chunks(PAR_CHUNK))
            .for_each(|(y, x)| leaf(x, y));
    }
}

/// `dz[i] = dy[i] * act'(.)` from `t`, the activation's input, or its output when
/// `from_output`.
pub(crate) fn activation_fn_backward(
    dy: &[f32],
    t: &[f32],
    dz: &mut [f32],
    a: ActivationFn,
    from_output: bool,
) {
    assert_eq!(
        dy.len(),
        t.len(),
        "activation_fn_backward: dy and t lengths differ"
    );
    assert_eq!(
        dy.len(),
        dz.len(),
        "activation_fn_backward: dy and dz lengths differ"
    );
    let relu = from_output && a == ActivationFn::RELU;
    let leaf = |dy: &[f32], t: &[f32], dz: &mut [f32]| {
        if relu {
            return relu_grad_leaf(dy, t, dz);
        }
        for ((dz, &d), &t) in dz.iter_mut().zip(dy).zip(t) {
            let g = if from_output {
                grad_from_output(t, a)
            } else {
                grad_from_input(t, a)
            };
            *dz = d * g;
        }
    };
    if dy.len() < PAR_MIN_ELEMS {
        leaf(dy, t, dz);
    } else {
        dz.par_chunks_mut(PAR_CHUNK)
            .zip(dy.par_chunks(PAR_CHUNK).zip(t.par_chunks(PAR_CHUNK)))
            .for_each(|(dz, (dy, t))| leaf(dy, t, dz));
    }
}
