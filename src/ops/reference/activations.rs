//! The activations with their own kernel (`ActivationFn`: Keras' relu, elu, selu, gelu,
//! sigmoid, tanh, swish, softplus), their gradients, and `erfc` / the normal CDF.

use crate::ops::spec::ActivationFn;
use crate::ops::spec::{Activation, SELU_ALPHA, SELU_SCALE};

use super::*;

/// `erfc(z)` in f64 to ~1e-15 relative: the Taylor series of `erf` below 2, the continued
/// fraction `e^{-z²} / (√π (z + ½/(z + 1/(z + 3/2/(z + ...)))))` above.
pub fn erfc(z: f64) -> f64 {
    if z < 0.0 {
        return 2.0 - erfc(-z);
    }
    if z < 2.0 {
        // erf(z) = 2/√π Σ (-1)^k z^(2k+1) / (k! (2k+1)); terms stay below e^4.
        let (mut term, mut sum, z2) = (z, z, z * z);
        for k in 1..200 {
            term *= -z2 / k as f64;
            let add = term / (2 * k + 1) as f64;
            sum += add;
            if add.abs() < 1e-18 * sum.abs() {
                break;
            }
        }
        return 1.0 - 2.0 / std::f64::consts::PI.sqrt() * sum;
    }
    let mut f = z;
    for k in (1..=120).rev() {
        f = z + (k as f64 / 2.0) / f;
    }
    (-z * z).exp() / (std::f64::consts::PI.sqrt() * f)
}

/// The standard normal distribution function `Φ(x) = erfc(-x / √2) / 2`.
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * erfc(-x / std::f64::consts::SQRT_2)
}

fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// Keras' `gelu(approximate=True)` argument: `√(2/π) (x + 0.044715 x³)`.
fn gelu_tanh_arg(x: f64) -> f64 {
    0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x)
}

/// `act(x)` for one value, by each activation's definition (see [`ActivationFn`]).
pub fn act_fn(x: f64, act: ActivationFn) -> f64 {
    match act {
        ActivationFn::Linear => x,
        ActivationFn::Relu {
            negative_slope,
            max_value,
            threshold,
        } => {
            let t = f64::from(threshold);
            let pos = if t != 0.0 {
                if x > t {
                    x
                } else {
                    0.0
                }
            } else {
                x.max(0.0)
            };
            let pos = max_value.map_or(pos, |m| pos.min(f64::from(m)));
            pos - f64::from(negative_slope) * (t - x).max(0.0)
        }
        ActivationFn::Elu => {
            if x > 0.0 {
                x
            } else {
                x.exp_m1()
            }
        }
        ActivationFn::Selu => activate(x, Activation::Selu),
        ActivationFn::Gelu { approximate: false } => x * normal_cdf(x),
        // 0.5 x (1 + tanh(u)) = x σ(2u).
        ActivationFn::Gelu { approximate: true } => x * sigmoid(2.0 * gelu_tanh_arg(x)),
        ActivationFn::Sigmoid => sigmoid(x),
        ActivationFn::Tanh => x.tanh(),
        ActivationFn::Swish => x * sigmoid(x),
        ActivationFn::Softplus => x.max(0.0) + (-x.abs()).exp().ln_1p(),
    }
}

/// `act'(x)`, TensorFlow's value at the kinks (see [`ActivationFn`]).
pub fn act_fn_grad(x: f64, act: ActivationFn) -> f64 {
    let step = |b: bool| if b { 1.0 } else { 0.0 };
    match act {
        ActivationFn::Linear => 1.0,
        ActivationFn::Relu {
            negative_slope,
            max_value,
            threshold,
        } => {
            let (ns, t) = (f64::from(negative_slope), f64::from(threshold));
            if ns != 0.0 && max_value.is_none() && t == 0.0 {
                // tf.nn.leaky_relu.
                return if x > 0.0 { 1.0 } else { ns };
            }
            let pos = match max_value {
                // tf.nn.relu6.
                Some(m) if t == 0.0 && m == 6.0 => step(x > 0.0 && x < 6.0),
                // tf.clip_by_value passes its bounds.
                Some(m) => step(x > t && x <= f64::from(m)),
                None => step(x > t),
            };
            pos + ns * step(x < t)
        }
        ActivationFn::Elu => {
            if x > 0.0 {
                1.0
            } else {
                x.exp()
            }
        }
        // SeluGrad's value at 0: the scale.
        ActivationFn::Selu => {
            if x >= 0.0 {
                SELU_SCALE
            } else {
                SELU_SCALE * SELU_ALPHA * x.exp()
            }
        }
        ActivationFn::Gelu { approximate: false } => {
            normal_cdf(x) + x * (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
        }
        ActivationFn::Gelu { approximate: true } => {
            let u2 = 2.0 * gelu_tanh_arg(x);
            let du = 0.797_884_560_802_865_4 * (1.0 + 3.0 * 0.044715 * x * x);
            sigmoid(u2) + x * 2.0 * sigmoid(u2) * sigmoid(-u2) * du
        }
        ActivationFn::Sigmoid => sigmoid(x) * sigmoid(-x),
        ActivationFn::Tanh => {
            let e = (-2.0 * x.abs()).exp();
            4.0 * e / ((1.0 + e) * (1.0 + e))
        }
        ActivationFn::Swish => sigmoid(x) * (1.0 + x * sigmoid(-x)),
        ActivationFn::Softplus => sigmoid(x),
    }
}

/// `act(x)` element-wise.
pub fn activation_fn(x: &[f64], act: ActivationFn) -> Vec<f64> {
    x.iter().map(|&v| act_fn(v, act)).collect()
}

/// `dy * act'(x)` from the activation's input `x`.
pub fn activation_fn_backward(dy: &[f64], x: &[f64], act: ActivationFn) -> Vec<f64> {
    dy.iter()
        .zip(x)
        .map(|(&d, &v)| d * act_fn_grad(v, act))
        .collect()
}
