//! Dynamic loss scaling decided where the update runs, on `CPU:0`: the same state and steps as
//! the GPU's `optim.wgsl` entry points (`finite_check`, `fused_update_ls`, `loss_scale_seed`,
//! `loss_scale_advance`). The state is four int32 words: the step's flag, the exponent `e` of
//! the scale `base * 2^e`, the finite steps in a row, and the applied steps (low 32 bits).

use crate::ops::spec::ScaleRules;

/// `x * 2^e`, exact while the result is a normal float (WGSL's `ldexp`).
pub(crate) fn ldexp(x: f32, e: i32) -> f32 {
    let (mut x, mut e) = (x, e);
    // 2^±126 are normal floats: larger steps in several exact multiplications.
    while e > 126 {
        x *= 2f32.powi(126);
        e -= 126;
    }
    while e < -126 {
        x *= 2f32.powi(-126);
        e += 126;
    }
    x * 2f32.powi(e)
}

/// Whether some element is infinite or NaN.
pub(crate) fn any_not_finite(x: &[f32]) -> bool {
    x.iter().any(|v| !v.is_finite())
}

/// `x = x * factor * 2^e` in place: the loss gradient's seed, `x * scale` bit for bit.
pub(crate) fn seed(x: &mut [f32], factor: f32, e: i32) {
    // x * factor rounds once; times a power of two it stays exact.
    if (-126..=126).contains(&e) {
        let p = 2f32.powi(e);
        for v in x {
            *v = (*v * factor) * p;
        }
    } else {
        for v in x {
            *v = ldexp(*v * factor, e);
        }
    }
}

/// Keras' rules after a step (`loss_scale_advance` in optim.wgsl): a flagged step halves the
/// scale and restarts the count; an applied one counts, in the iterations too, and doubles the
/// scale after `growth_steps` in a row; the exponent stays in the rules' bounds. Clears the
/// flag.
pub(crate) fn advance(state: &mut [i32], rules: ScaleRules) {
    let growth = u32::try_from(rules.growth_steps).unwrap_or(u32::MAX);
    let [flag, e, counter, iterations] = state else {
        return;
    };
    if *flag != 0 {
        if *e > rules.e_min {
            *e -= 1;
        }
        *counter = 0;
    } else {
        *iterations = (*iterations as u32).wrapping_add(1) as i32;
        let next = (*counter as u32).saturating_add(1);
        if next >= growth {
            if *e < rules.e_max {
                *e += 1;
            }
            *counter = 0;
        } else {
            *counter = next as i32;
        }
    }
    *flag = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldexp_is_exact_scaling() {
        assert_eq!(ldexp(3.0, 4), 48.0);
        assert_eq!(ldexp(1.0, -3), 0.125);
        assert_eq!(ldexp(1.5, 127), 1.5 * 2f32.powi(127));
        assert_eq!(ldexp(1.0, 130), f32::INFINITY);
        // Same bits as multiplying by the scale the host keeps.
        let scale = 1000.0f32 * 8.0;
        assert_eq!(ldexp(0.3f32 * 1000.0, 3), 0.3f32 * scale);
        assert_eq!(ldexp(1.0 / 1000.0, -3), 1.0 / scale);
    }

    #[test]
    fn advance_follows_keras_rules() {
        let rules = |growth_steps| ScaleRules::new(growth_steps, 1.0);
        let mut s = [0, 0, 0, 7];
        advance(&mut s, rules(2));
        assert_eq!(s, [0, 0, 1, 8]);
        advance(&mut s, rules(2));
        assert_eq!(s, [0, 1, 0, 9], "doubled after two finite steps");
        s[0] = 1;
        advance(&mut s, rules(2));
        assert_eq!(s, [0, 0, 0, 9], "halved, not counted, flag cleared");
        let mut s = [0, 0, 0, -1];
        advance(&mut s, rules(1));
        assert_eq!(s, [0, 1, 0, 0], "the count wraps at 32 bits");
        // The scale stays a normal float: 2^15 * 2^112 is the largest power of two.
        let big = ScaleRules::new(1, 32768.0);
        assert_eq!((big.e_min, big.e_max), (-141, 112));
        let mut s = [0, 112, 0, 0];
        advance(&mut s, big);
        assert_eq!(s[1], 112, "no growth past the largest normal scale");
        assert!(ldexp(32768.0, s[1]).is_finite());
        let mut s = [1, -141, 0, 0];
        advance(&mut s, big);
        assert_eq!(s[1], -141, "no halving below the smallest normal scale");
        assert!(ldexp(32768.0, s[1]) >= f32::MIN_POSITIVE);
    }
}
