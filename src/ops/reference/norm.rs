//! Batch normalization (training, inference, gradient, moving statistics) and dropout.

/// Batch normalization over `x` as `[rows, c]` in training mode: `(y, mean, var)` with the
/// biased variance, `y = (x - mean) / sqrt(var + epsilon) * gamma + beta` per channel.
pub fn batch_norm_train(
    x: &[f64],
    gamma: &[f64],
    beta: &[f64],
    (rows, c): (usize, usize),
    epsilon: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut mean = vec![0.0; c];
    let mut var = vec![0.0; c];
    for j in 0..c {
        mean[j] = (0..rows).map(|r| x[r * c + j]).sum::<f64>() / rows as f64;
        var[j] = (0..rows)
            .map(|r| (x[r * c + j] - mean[j]).powi(2))
            .sum::<f64>()
            / rows as f64;
    }
    let y = batch_norm_with(x, gamma, beta, (&mean, &var), c, epsilon);
    (y, mean, var)
}

/// `y = (x - mean) / sqrt(var + epsilon) * gamma + beta` per channel (inference: the moving
/// statistics).
pub fn batch_norm_with(
    x: &[f64],
    gamma: &[f64],
    beta: &[f64],
    (mean, var): (&[f64], &[f64]),
    c: usize,
    epsilon: f64,
) -> Vec<f64> {
    x.iter()
        .enumerate()
        .map(|(i, &v)| {
            let j = i % c;
            (v - mean[j]) / (var[j] + epsilon).sqrt() * gamma[j] + beta[j]
        })
        .collect()
}

/// The moving statistic after one training step: `moving * momentum + batch * (1 - momentum)`.
pub fn moving_update(moving: &[f64], batch: &[f64], momentum: f64) -> Vec<f64> {
    moving
        .iter()
        .zip(batch)
        .map(|(m, b)| m * momentum + b * (1.0 - momentum))
        .collect()
}

/// The gradients of [`batch_norm_train`] from `dy`: `(dx, dgamma, dbeta)`, from the chain rule
/// through the batch statistics (`x̂ = (x - mean) / sqrt(var + epsilon)`):
/// `dx = gamma / sqrt(var + epsilon) · (dy - mean(dy) - x̂ · mean(dy · x̂))`.
pub fn batch_norm_backward(
    x: &[f64],
    dy: &[f64],
    gamma: &[f64],
    (rows, c): (usize, usize),
    epsilon: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (_, mean, var) = batch_norm_train(x, gamma, &vec![0.0; c], (rows, c), epsilon);
    let xhat = |i: usize| (x[i] - mean[i % c]) / (var[i % c] + epsilon).sqrt();
    let mut dgamma = vec![0.0; c];
    let mut dbeta = vec![0.0; c];
    for i in 0..rows * c {
        dbeta[i % c] += dy[i];
        dgamma[i % c] += dy[i] * xhat(i);
    }
    let n = rows as f64;
    let dx = (0..rows * c)
        .map(|i| {
            let j = i % c;
            gamma[j] / (var[j] + epsilon).sqrt() * (dy[i] - dbeta[j] / n - xhat(i) * dgamma[j] / n)
        })
        .collect();
    (dx, dgamma, dbeta)
}

/// Inverted dropout with the mask of `m`: `x · scale` where kept, 0 elsewhere (on `dy`: the
/// gradient).
pub fn dropout(x: &[f64], m: &crate::ops::spec::DropoutMask) -> Vec<f64> {
    x.iter()
        .enumerate()
        .map(|(i, &v)| {
            if m.keeps(i as u32) {
                v * f64::from(m.scale)
            } else {
                0.0
            }
        })
        .collect()
}
