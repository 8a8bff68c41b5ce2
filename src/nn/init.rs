//! Keras' default initializers: `glorot_uniform` kernels and `zeros` biases, seeded.
//!
//! Fans follow Keras' `compute_fans` (`keras/src/initializers/random_initializers.py`): for a
//! kernel of shape `(..., fan_in_axis, fan_out_axis)` the receptive field is the product of the
//! leading axes, `fan_in = receptive_field * shape[-2]` and `fan_out = receptive_field *
//! shape[-1]`. A `(kh, kw, in, out)` conv kernel has `fan_in = kh*kw*in`, `fan_out =
//! kh*kw*out`; a depthwise kernel `(kh, kw, in, 1)` has `fan_out = kh*kw`; a `(in, out)` dense
//! kernel has `fan_in = in`, `fan_out = out`.
//!
//! Differences from Keras: the random stream is SplitMix64, not Philox, so the same seed gives
//! other numbers than TensorFlow (the distribution is the same).

use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::rng::SplitMix64;
use crate::tensor::{DType, Tensor};

/// `(fan_in, fan_out)` of a kernel shape, as Keras computes them.
pub(crate) fn compute_fans(shape: &[usize]) -> (usize, usize) {
    match shape {
        [] => (1, 1),
        [n] => (*n, *n),
        [fan_in, fan_out] => (*fan_in, *fan_out),
        [lead @ .., fan_in, fan_out] => {
            let receptive: usize = lead.iter().product();
            (receptive * fan_in, receptive * fan_out)
        }
    }
}

/// The Glorot (Xavier) uniform limit `sqrt(6 / (fan_in + fan_out))`.
pub(crate) fn glorot_limit(shape: &[usize]) -> f64 {
    let (fan_in, fan_out) = compute_fans(shape);
    (6.0 / (fan_in + fan_out).max(1) as f64).sqrt()
}

/// Host values of `glorot_uniform(seed)` for `shape`: uniform in `[-limit, limit)`.
pub(crate) fn glorot_uniform_values(shape: &[usize], seed: u64) -> Vec<f32> {
    let limit = glorot_limit(shape);
    let mut rng = SplitMix64::new(seed);
    let len: usize = shape.iter().product();
    (0..len)
        .map(|_| ((rng.uniform() * 2.0 - 1.0) * limit) as f32)
        .collect()
}

/// A `glorot_uniform` kernel on `device`.
pub(crate) fn glorot_uniform(shape: &[usize], seed: u64, device: &LogicalDevice) -> Result<Tensor> {
    Tensor::from_slice_on(&glorot_uniform_values(shape, seed), shape, device)
}

/// A `zeros` bias on `device`.
pub(crate) fn zeros(shape: &[usize], device: &LogicalDevice) -> Result<Tensor> {
    Tensor::zeros_on(shape, DType::F32, device)
}

/// A seed derived from a parent seed and an index (a layer's from the model's, a weight's from
/// its layer's): one SplitMix64 step over the mixed pair, so neighbours are uncorrelated.
pub(crate) fn derive_seed(parent: u64, index: u64) -> u64 {
    let mut rng = SplitMix64::new(parent ^ index.wrapping_mul(0xD6E8_FEB8_6659_FD93));
    rng.next_u64()
}

/// Checks a layer hyper-parameter that must be positive.
pub(crate) fn positive(layer: &str, what: &str, value: usize) -> Result<()> {
    if value == 0 {
        return Err(Error::InvalidArgument(format!(
            "{layer}: {what} must be a positive integer, got 0"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fans_match_keras() {
        assert_eq!(compute_fans(&[3, 3, 1, 32]), (9, 288));
        assert_eq!(compute_fans(&[3, 3, 32, 1]), (288, 9));
        assert_eq!(compute_fans(&[1, 1, 32, 64]), (32, 64));
        assert_eq!(compute_fans(&[1152, 128]), (1152, 128));
    }

    #[test]
    fn glorot_values_stay_inside_the_limit() {
        let shape = [3, 3, 8, 16];
        let limit = glorot_limit(&shape) as f32;
        let v = glorot_uniform_values(&shape, 7);
        assert!(v.iter().all(|x| x.abs() <= limit));
        let mean: f32 = v.iter().sum::<f32>() / v.len() as f32;
        assert!(mean.abs() < 0.05 * limit, "mean {mean} too far from 0");
        assert_ne!(glorot_uniform_values(&shape, 8), v);
    }
}
