//! The f64 oracle: every kernel of the crate written as the plainest loops over its definition,
//! in double precision, for tests to compare the CPU and GPU kernels against.
//!
//! Nothing here is fast or clever on purpose: each function is a direct transcription of the
//! formula in its doc comment, so that it can be checked by reading (and its gradients are
//! checked by central finite differences in this module's tests). Layouts are the crate's: NHWC
//! activations, HWIO kernels, row-major matrices. Slices must have the lengths the shapes imply
//! (indexing panics otherwise).

use crate::ops::spec::{
    Activation, AdamParams, Conv2dShape, ConvGeometry, DepthwiseShape, PoolShape, SgdParams,
    SELU_ALPHA, SELU_SCALE,
};
use crate::ops::spec::{ActivationFn, Pool2dShape};

/// Widens an f32 slice to f64.
pub fn to_f64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}

/// `len` deterministic pseudo-random values, uniform in `[-1, 1)` and never exactly 0
/// (SplitMix64 seeded with `seed`; 24-bit mantissas, so every value is exact in f32).
pub fn random_vec(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let k = (next() >> 40) as u32; // 24 random bits
        let v = (k as f32) / 8_388_608.0 - 1.0; // k / 2^23 - 1, in [-1, 1)
        if v != 0.0 {
            out.push(v);
        }
    }
    out
}

/// Panics unless `actual` matches `expected` element-wise within `rel_tol`.
///
/// The criterion is `|a - e| <= rel_tol * max(1, |e|)`: relative for values of magnitude above
/// 1, absolute (with the same tolerance) below, so results that should be near zero are not
/// held to an impossible relative precision. NaN or infinite actual values always fail, as do
/// differing lengths. The panic message names `what`, the worst index (largest error relative to
/// its allowance), both values and the error.
pub fn assert_close(actual: &[f32], expected: &[f64], rel_tol: f64, what: &str) {
    assert_eq!(
        actual.len(),
        expected.len(),
        "{what}: length {} but expected {}",
        actual.len(),
        expected.len()
    );
    // The worst element is the one exceeding its allowance by the most.
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let a = f64::from(a);
        let allowance = rel_tol * e.abs().max(1.0);
        let err = (a - e).abs();
        let ok = a.is_finite() && err <= allowance;
        let excess = if a.is_finite() {
            err - allowance
        } else {
            f64::INFINITY
        };
        if !ok && worst.is_none_or(|(_, w)| excess > w) {
            worst = Some((i, excess));
        }
    }
    if let Some((i, _)) = worst {
        let (a, e) = (f64::from(actual[i]), expected[i]);
        panic!(
            "{what}: element {i} of {} is {a:e}, expected {e:e} (error {:e}, tolerance {rel_tol:e} * max(1, |expected|))",
            actual.len(),
            (a - e).abs()
        );
    }
}

/// `op(a) · op(b)`, `[m, n]`: `a` is `[m, k]` (`[k, m]` when `trans_a`), `b` is `[k, n]`
/// (`[n, k]` when `trans_b`), all row-major.
pub fn matmul(
    a: &[f64],
    b: &[f64],
    m: usize,
    k: usize,
    n: usize,
    trans_a: bool,
    trans_b: bool,
) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0;
            for p in 0..k {
                let av = if trans_a { a[p * m + i] } else { a[i * k + p] };
                let bv = if trans_b { b[j * k + p] } else { b[p * n + j] };
                s += av * bv;
            }
            out[i * n + j] = s;
        }
    }
    out
}

/// `act(x)` for one value: linear `x`, relu `max(x, 0)`, selu
/// `SCALE * (x > 0 ? x : ALPHA * (e^x - 1))`.
pub fn activate(x: f64, act: Activation) -> f64 {
    match act {
        Activation::Linear => x,
        Activation::Relu => x.max(0.0),
        Activation::Selu => {
            if x > 0.0 {
                SELU_SCALE * x
            } else {
                SELU_SCALE * SELU_ALPHA * x.exp_m1()
            }
        }
    }
}

/// `act(x)` element-wise.
pub fn activation(x: &[f64], act: Activation) -> Vec<f64> {
    x.iter().map(|&v| activate(v, act)).collect()
}

/// `dy * act'(x)` from the activation's INPUT `x` (relu: `x > 0 ? dy : 0`; selu:
/// `x > 0 ? dy * SCALE : dy * SCALE * ALPHA * e^x`).
pub fn activation_backward_from_input(dy: &[f64], x: &[f64], act: Activation) -> Vec<f64> {
    dy.iter()
        .zip(x)
        .map(|(&dy, &x)| match act {
            Activation::Linear => dy,
            Activation::Relu => {
                if x > 0.0 {
                    dy
                } else {
                    0.0
                }
            }
            Activation::Selu => {
                if x > 0.0 {
                    dy * SELU_SCALE
                } else {
                    dy * SELU_SCALE * SELU_ALPHA * x.exp()
                }
            }
        })
        .collect()
}

/// `dy * act'(.)` from the activation's OUTPUT `y`, the form the kernels use: relu
/// `y > 0 ? dy : 0`; selu `y > 0 ? dy * SCALE : dy * (y + SCALE * ALPHA)` (since for `x <= 0`,
/// `y + SCALE * ALPHA = SCALE * ALPHA * e^x`); linear `dy`.
pub fn activation_backward(dy: &[f64], y: &[f64], act: Activation) -> Vec<f64> {
    dy.iter()
        .zip(y)
        .map(|(&dy, &y)| match act {
            Activation::Linear => dy,
            Activation::Relu => {
                if y > 0.0 {
                    dy
                } else {
                    0.0
                }
            }
            Activation::Selu => {
                if y > 0.0 {
                    dy * SELU_SCALE
                } else {
                    dy * (y + SELU_SCALE * SELU_ALPHA)
                }
            }
        })
        .collect()
}

/// `act(z[r, c] + bias[c])` over a row-major `[rows, cols]` matrix (`cols = bias.len()`;
/// no bias: `act(z)`).
pub fn bias_act(z: &[f64], bias: Option<&[f64]>, act: Activation) -> Vec<f64> {
    z.iter()
        .enumerate()
        .map(|(i, &v)| {
            let b = bias.map_or(0.0, |b| b[i % b.len()]);
            activate(v + b, act)
        })
        .collect()
}

/// `act(a · b + bias)`, `a` `[m, k]`, `b` `[k, n]`, `bias` `[n]` (a `Dense` layer).
pub fn matmul_bias_act(
    a: &[f64],
    b: &[f64],
    bias: Option<&[f64]>,
    m: usize,
    k: usize,
    n: usize,
    act: Activation,
) -> Vec<f64> {
    bias_act(&matmul(a, b, m, k, n, false, false), bias, act)
}

// ---- convolutions (strided, dilated, grouped: Conv2D and depthwise alike) ----

/// `y[n, i, j, o] = act(bias[o] + Σ_{a, b, c} x[n, i*sh + a*dh - pt, j*sw + b*dw - pl, g*cig + c]
/// * k[a, b, c, o])` with `g = o / cog`, out-of-range `x` reading as zero.
fn grouped_forward(x: &[f64], kernel: &[f64], bias: Option<&[f64]>, g: &ConvGeometry) -> Vec<f64> {
    let mut y = vec![0.0; g.n * g.oh * g.ow * g.co];
    for n in 0..g.n {
        for i in 0..g.oh {
            for j in 0..g.ow {
                for o in 0..g.co {
                    let mut acc = bias.map_or(0.0, |b| b[o]);
                    let c0 = o / g.cog * g.cig;
                    for a in 0..g.kh {
                        for b in 0..g.kw {
                            let (Some(ii), Some(jj)) = (g.in_row(i, a), g.in_col(j, b)) else {
                                continue;
                            };
                            for c in 0..g.cig {
                                acc += x[((n * g.h + ii) * g.w + jj) * g.ci + c0 + c]
                                    * kernel[((a * g.kw + b) * g.cig + c) * g.co + o];
                            }
                        }
                    }
                    y[((n * g.oh + i) * g.ow + j) * g.co + o] = acc;
                }
            }
        }
    }
    y
}

/// Visits every (input index, kernel index, output index) triple of a grouped convolution.
fn grouped_taps(g: &ConvGeometry, mut f: impl FnMut(usize, usize, usize)) {
    for n in 0..g.n {
        for i in 0..g.oh {
            for j in 0..g.ow {
                for o in 0..g.co {
                    let c0 = o / g.cog * g.cig;
                    for a in 0..g.kh {
                        for b in 0..g.kw {
                            let (Some(ii), Some(jj)) = (g.in_row(i, a), g.in_col(j, b)) else {
                                continue;
                            };
                            for c in 0..g.cig {
                                f(
                                    ((n * g.h + ii) * g.w + jj) * g.ci + c0 + c,
                                    ((a * g.kw + b) * g.cig + c) * g.co + o,
                                    ((n * g.oh + i) * g.ow + j) * g.co + o,
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

fn grouped_backward_input(dz: &[f64], kernel: &[f64], g: &ConvGeometry) -> Vec<f64> {
    let mut dx = vec![0.0; g.n * g.h * g.w * g.ci];
    grouped_taps(g, |xi, ki, yi| dx[xi] += dz[yi] * kernel[ki]);
    dx
}

fn grouped_backward_kernel(x: &[f64], dz: &[f64], g: &ConvGeometry) -> Vec<f64> {
    let mut dk = vec![0.0; g.kh * g.kw * g.cig * g.co];
    grouped_taps(g, |xi, ki, yi| dk[ki] += x[xi] * dz[yi]);
    dk
}

/// `y[n, i, j, o] = act(bias[o] + Σ_{a, b, c} x[n, i*sh + a*dh - pt, j*sw + b*dw - pl, c] *
/// k[a, b, c, o])`, out-of-range `x` reading as zero (`s.strides`, `s.dilation`, `s.padding`).
pub fn conv2d_forward(
    x: &[f64],
    kernel: &[f64],
    bias: Option<&[f64]>,
    s: &Conv2dShape,
    act: Activation,
) -> Vec<f64> {
    let z = grouped_forward(x, kernel, bias, &ConvGeometry::conv(s));
    activation(&z, act)
}

/// `dx[n, i*sh + a*dh - pt, j*sw + b*dw - pl, c] += dz[n, i, j, o] * k[a, b, c, o]`: the
/// gradient of `Σ dz * z` w.r.t. `x`, where `z` is the convolution's pre-activation output.
pub fn conv2d_backward_input(dz: &[f64], kernel: &[f64], s: &Conv2dShape) -> Vec<f64> {
    grouped_backward_input(dz, kernel, &ConvGeometry::conv(s))
}

/// `dk[a, b, c, o] = Σ_{n, i, j} x[n, i*sh + a*dh - pt, j*sw + b*dw - pl, c] * dz[n, i, j, o]`.
pub fn conv2d_backward_kernel(x: &[f64], dz: &[f64], s: &Conv2dShape) -> Vec<f64> {
    grouped_backward_kernel(x, dz, &ConvGeometry::conv(s))
}

/// Bias gradient of a layer whose pre-activation gradient is `dz` (`[rows, cols]`, channels
/// last): `db[c] = Σ_r dz[r, c]`.
pub fn bias_grad(dz: &[f64], cols: usize) -> Vec<f64> {
    sum_rows(dz, dz.len() / cols.max(1), cols)
}

/// `y[n, i, j, c*m + q] = Σ_{a, b} x[n, i*sh + a*dh - pt, j*sw + b*dw - pl, c] * k[a, b, c, q]`.
pub fn depthwise_forward(x: &[f64], kernel: &[f64], s: &DepthwiseShape) -> Vec<f64> {
    grouped_forward(x, kernel, None, &ConvGeometry::depthwise(s))
}

/// `dx[n, i*sh + a*dh - pt, j*sw + b*dw - pl, c] += dy[n, i, j, c*m + q] * k[a, b, c, q]`.
pub fn depthwise_backward_input(dy: &[f64], kernel: &[f64], s: &DepthwiseShape) -> Vec<f64> {
    grouped_backward_input(dy, kernel, &ConvGeometry::depthwise(s))
}

/// `dk[a, b, c, q] = Σ_{n, i, j} x[n, i*sh + a*dh - pt, j*sw + b*dw - pl, c] * dy[n, i, j, c*m + q]`.
pub fn depthwise_backward_kernel(x: &[f64], dy: &[f64], s: &DepthwiseShape) -> Vec<f64> {
    grouped_backward_kernel(x, dy, &ConvGeometry::depthwise(s))
}

/// The input positions of the 2×2 window of output `(n, i, j, c)`, in window order
/// (0,0), (0,1), (1,0), (1,1).
fn pool_window(s: &PoolShape, n: usize, i: usize, j: usize, c: usize) -> [usize; 4] {
    let at = |r: usize, q: usize| ((n * s.h + r) * s.w + q) * s.c + c;
    [
        at(2 * i, 2 * j),
        at(2 * i, 2 * j + 1),
        at(2 * i + 1, 2 * j),
        at(2 * i + 1, 2 * j + 1),
    ]
}

/// The position of the first maximum of the window (a later element must be strictly larger
/// to win).
fn pool_argmax(x: &[f64], window: [usize; 4]) -> usize {
    let mut best = window[0];
    for &p in &window[1..] {
        if x[p] > x[best] {
            best = p;
        }
    }
    best
}

/// `y[n, i, j, c] = max` of `x` over the 2×2 window at `(2i, 2j)` ('valid', stride 2).
pub fn maxpool_forward(x: &[f64], s: &PoolShape) -> Vec<f64> {
    let (oh, ow) = s.out_hw();
    let mut y = vec![0.0; s.output_len()];
    for n in 0..s.n {
        for i in 0..oh {
            for j in 0..ow {
                for c in 0..s.c {
                    y[((n * oh + i) * ow + j) * s.c + c] =
                        x[pool_argmax(x, pool_window(s, n, i, j, c))];
                }
            }
        }
    }
    y
}

/// `dx`: each `dy[n, i, j, c]` added at its window's first maximum; 0 everywhere else.
pub fn maxpool_backward(x: &[f64], dy: &[f64], s: &PoolShape) -> Vec<f64> {
    let (oh, ow) = s.out_hw();
    let mut dx = vec![0.0; s.input_len()];
    for n in 0..s.n {
        for i in 0..oh {
            for j in 0..ow {
                for c in 0..s.c {
                    dx[pool_argmax(x, pool_window(s, n, i, j, c))] +=
                        dy[((n * oh + i) * ow + j) * s.c + c];
                }
            }
        }
    }
    dx
}

/// `probs[r, c] = e^{x[r, c]} / Σ_q e^{x[r, q]}`, computed as `e^{x - max}` for range.
pub fn softmax(logits: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        let row = &logits[r * cols..(r + 1) * cols];
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|&v| (v - max).exp()).sum();
        for c in 0..cols {
            out[r * cols + c] = (row[c] - max).exp() / sum;
        }
    }
    out
}

/// Sparse categorical cross-entropy on logits: returns `(loss, dlogits)` with
/// `loss[r] = ln Σ_c e^{x[r, c]} - x[r, label[r]]` (per row) and
/// `dlogits[r, c] = (softmax(x)[r, c] - [c == label[r]]) / rows`, the gradient of the mean loss.
pub fn softmax_cross_entropy(
    logits: &[f64],
    labels: &[i32],
    rows: usize,
    cols: usize,
) -> (Vec<f64>, Vec<f64>) {
    let probs = softmax(logits, rows, cols);
    let mut loss = vec![0.0; rows];
    let mut grad = vec![0.0; rows * cols];
    for r in 0..rows {
        let row = &logits[r * cols..(r + 1) * cols];
        let label = labels[r] as usize;
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|&v| (v - max).exp()).sum::<f64>().ln();
        loss[r] = lse - row[label];
        for c in 0..cols {
            let onehot = if c == label { 1.0 } else { 0.0 };
            grad[r * cols + c] = (probs[r * cols + c] - onehot) / rows as f64;
        }
    }
    (loss, grad)
}

/// Row-wise argmax of a row-major `[rows, cols]` matrix, the first maximum on ties.
pub fn argmax_rows(x: &[f64], rows: usize, cols: usize) -> Vec<i32> {
    (0..rows)
        .map(|r| {
            let row = &x[r * cols..(r + 1) * cols];
            let mut best = 0;
            for c in 1..cols {
                if row[c] > row[best] {
                    best = c;
                }
            }
            best as i32
        })
        .collect()
}

/// How many rows' argmax (first maximum) equals the label.
pub fn accuracy_count(logits: &[f64], labels: &[i32], rows: usize, cols: usize) -> u32 {
    argmax_rows(logits, rows, cols)
        .iter()
        .zip(labels)
        .filter(|(a, l)| a == l)
        .count() as u32
}

/// `Σ x`.
pub fn sum(x: &[f64]) -> f64 {
    x.iter().sum()
}

/// Column sums of a row-major `[rows, cols]` matrix: `out[c] = Σ_r x[r, c]`.
pub fn sum_rows(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; cols];
    for r in 0..rows {
        for c in 0..cols {
            out[c] += x[r * cols + c];
        }
    }
    out
}

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

// ---- batch normalization and dropout ----

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

// ---- activations and pooling layers ----

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

/// The input rows and columns of output `(i, j)`'s window, clipped to the image: `(rows,
/// cols)` as half-open ranges.
pub fn pool2d_window(
    s: &Pool2dShape,
    i: usize,
    j: usize,
) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    let (pt, pl) = s.pad_top_left();
    let range = |o: usize, stride: usize, k: usize, pad: usize, size: usize| {
        let start = (o * stride) as isize - pad as isize;
        let end = (start + k as isize).min(size as isize);
        (start.max(0) as usize)..(end.max(0) as usize)
    };
    (
        range(i, s.strides.0, s.pool.0, pt, s.h),
        range(j, s.strides.1, s.pool.1, pl, s.w),
    )
}

/// `tf.nn.avg_pool2d`: each output the mean of its window's elements inside the image
/// ('same' windows that overhang divide by the count of real elements).
pub fn avg_pool2d(x: &[f64], s: &Pool2dShape) -> Vec<f64> {
    let (oh, ow) = s.out_hw();
    let mut y = vec![0.0; s.output_len()];
    for n in 0..s.n {
        for i in 0..oh {
            for j in 0..ow {
                let (rows, cols) = pool2d_window(s, i, j);
                let count = (rows.len() * cols.len()) as f64;
                for c in 0..s.c {
                    let mut sum = 0.0;
                    for r in rows.clone() {
                        for q in cols.clone() {
                            sum += x[((n * s.h + r) * s.w + q) * s.c + c];
                        }
                    }
                    y[((n * oh + i) * ow + j) * s.c + c] = sum / count;
                }
            }
        }
    }
    y
}

/// Gradient of [`avg_pool2d`]: each `dy` spread evenly over its window's real elements.
pub fn avg_pool2d_backward(dy: &[f64], s: &Pool2dShape) -> Vec<f64> {
    let (oh, ow) = s.out_hw();
    let mut dx = vec![0.0; s.input_len()];
    for n in 0..s.n {
        for i in 0..oh {
            for j in 0..ow {
                let (rows, cols) = pool2d_window(s, i, j);
                let count = (rows.len() * cols.len()) as f64;
                for c in 0..s.c {
                    let g = dy[((n * oh + i) * ow + j) * s.c + c] / count;
                    for r in rows.clone() {
                        for q in cols.clone() {
                            dx[((n * s.h + r) * s.w + q) * s.c + c] += g;
                        }
                    }
                }
            }
        }
    }
    dx
}

/// `tf.nn.max_pool2d`: each output the maximum of its window's elements inside the image.
pub fn max_pool2d_window(x: &[f64], s: &Pool2dShape) -> Vec<f64> {
    let (oh, ow) = s.out_hw();
    let mut y = vec![0.0; s.output_len()];
    for n in 0..s.n {
        for i in 0..oh {
            for j in 0..ow {
                let (rows, cols) = pool2d_window(s, i, j);
                for c in 0..s.c {
                    let mut m = f64::NEG_INFINITY;
                    for r in rows.clone() {
                        for q in cols.clone() {
                            m = m.max(x[((n * s.h + r) * s.w + q) * s.c + c]);
                        }
                    }
                    y[((n * oh + i) * ow + j) * s.c + c] = m;
                }
            }
        }
    }
    y
}

/// Gradient of [`max_pool2d_window`] (`tf.raw_ops.MaxPoolGrad`): each `dy` added at its
/// window's first maximum in row-major order.
pub fn max_pool2d_window_backward(x: &[f64], dy: &[f64], s: &Pool2dShape) -> Vec<f64> {
    let (oh, ow) = s.out_hw();
    let mut dx = vec![0.0; s.input_len()];
    for n in 0..s.n {
        for i in 0..oh {
            for j in 0..ow {
                let (rows, cols) = pool2d_window(s, i, j);
                if rows.is_empty() || cols.is_empty() {
                    continue;
                }
                for c in 0..s.c {
                    let first = ((n * s.h + rows.start) * s.w + cols.start) * s.c + c;
                    let mut best = (x[first], first);
                    for r in rows.clone() {
                        for q in cols.clone() {
                            let at = ((n * s.h + r) * s.w + q) * s.c + c;
                            if x[at] > best.0 {
                                best = (x[at], at);
                            }
                        }
                    }
                    dx[best.1] += dy[((n * oh + i) * ow + j) * s.c + c];
                }
            }
        }
    }
    dx
}

/// `[n, c]` means over the `hw` pixels of `x` `[n, hw, c]`.
pub fn global_avg_pool(x: &[f64], n: usize, hw: usize, c: usize) -> Vec<f64> {
    let mut y = vec![0.0; n * c];
    for b in 0..n {
        for p in 0..hw {
            for k in 0..c {
                y[b * c + k] += x[(b * hw + p) * c + k] / hw as f64;
            }
        }
    }
    y
}

/// Gradient of [`global_avg_pool`]: `dy[b, k] / hw` at every pixel.
pub fn global_avg_pool_backward(dy: &[f64], n: usize, hw: usize, c: usize) -> Vec<f64> {
    (0..n * hw * c)
        .map(|i| dy[(i / (hw * c)) * c + i % c] / hw as f64)
        .collect()
}

/// `[n, c]` maxima over the `hw` pixels of `x` `[n, hw, c]`.
pub fn global_max_pool(x: &[f64], n: usize, hw: usize, c: usize) -> Vec<f64> {
    let mut y = vec![f64::NEG_INFINITY; n * c];
    for b in 0..n {
        for p in 0..hw {
            for k in 0..c {
                y[b * c + k] = y[b * c + k].max(x[(b * hw + p) * c + k]);
            }
        }
    }
    y
}

/// Gradient of [`global_max_pool`] as TensorFlow's `reduce_max`: `dy` shared equally by the
/// pixels that equal the maximum.
pub fn global_max_pool_backward(x: &[f64], dy: &[f64], n: usize, hw: usize, c: usize) -> Vec<f64> {
    let y = global_max_pool(x, n, hw, c);
    let mut ties = vec![0usize; n * c];
    for (i, &v) in x.iter().enumerate() {
        let o = (i / (hw * c)) * c + i % c;
        ties[o] += usize::from(v == y[o]);
    }
    x.iter()
        .enumerate()
        .map(|(i, &v)| {
            let o = (i / (hw * c)) * c + i % c;
            if v == y[o] {
                dy[o] / ties[o] as f64
            } else {
                0.0
            }
        })
        .collect()
}

// ---- optimizers: RMSprop, weight decay, gradient clipping ----

use crate::ops::spec::{ClipMode, RmspropParams};

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

// ---- losses on float targets, metrics (ops/loss.rs) ----

/// Keras' losses on float targets, naively in f64: `(per-row loss × row_scale, dz × grad_scale)`
/// for `[rows, cols]` `z` and targets `y`, as [`crate::ops::loss::dense_loss`] defines them.
pub fn dense_loss(z: &[f64], y: &[f64], p: &crate::ops::loss::LossParams) -> (Vec<f64>, Vec<f64>) {
    use crate::ops::loss::LossKind as K;
    let (rows, cols) = (p.rows, p.cols);
    let eps = f64::from(1e-7f32);
    let hi = f64::from(1.0f32 - 1e-7f32);
    let ls = f64::from(p.label_smoothing);
    let n = cols as f64;
    let mut loss = vec![0.0; rows];
    let mut dz = vec![0.0; rows * cols];
    for r in 0..rows {
        let zr = &z[r * cols..(r + 1) * cols];
        let yr = &y[r * cols..(r + 1) * cols];
        let d = &mut dz[r * cols..(r + 1) * cols];
        let smooth = |v: f64, k: f64| v * (1.0 - ls) + ls / k;
        let l = match p.kind {
            K::CategoricalLogits => {
                let probs = softmax(zr, 1, cols);
                let max = zr.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lse = max + zr.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
                let mut l = 0.0;
                for c in 0..cols {
                    let yc = smooth(yr[c], n);
                    l += yc * (lse - zr[c]);
                    d[c] = probs[c] - yc;
                }
                l
            }
            K::CategoricalProbs => {
                let total: f64 = zr.iter().sum();
                let q: Vec<f64> = zr.iter().map(|v| v / total).collect();
                let g: Vec<f64> = (0..cols)
                    .map(|c| {
                        let yc = smooth(yr[c], n);
                        if q[c] >= eps && q[c] <= hi {
                            -yc / q[c]
                        } else {
                            0.0
                        }
                    })
                    .collect();
                for (j, dj) in d.iter_mut().enumerate() {
                    // dq_c/dz_j = ([c == j] - q_c) / total.
                    *dj = (0..cols)
                        .map(|c| g[c] * (f64::from(u8::from(c == j)) - q[c]) / total)
                        .sum();
                }
                (0..cols)
                    .map(|c| -smooth(yr[c], n) * q[c].clamp(eps, hi).ln())
                    .sum()
            }
            K::BinaryLogits => {
                let mut l = 0.0;
                for c in 0..cols {
                    let yc = smooth(yr[c], 2.0);
                    let v = zr[c];
                    l += v.max(0.0) - v * yc + (-v.abs()).exp().ln_1p();
                    d[c] = (1.0 / (1.0 + (-v).exp()) - yc) / n;
                }
                l / n
            }
            K::BinaryProbs => {
                let mut l = 0.0;
                for c in 0..cols {
                    let yc = smooth(yr[c], 2.0);
                    let q = zr[c].clamp(eps, hi);
                    l -= yc * q.ln() + (1.0 - yc) * (1.0 - q).ln();
                    d[c] = if zr[c] >= eps && zr[c] <= hi {
                        -(yc / q - (1.0 - yc) / (1.0 - q)) / n
                    } else {
                        0.0
                    };
                }
                l / n
            }
            K::MeanSquared | K::MeanAbsolute => {
                let o = output_activation(zr, p.act);
                let mut l = 0.0;
                let mut g = vec![0.0; cols];
                for c in 0..cols {
                    let diff = o[c] - yr[c];
                    if p.kind == K::MeanSquared {
                        l += diff * diff;
                        g[c] = 2.0 * diff / n;
                    } else {
                        l += diff.abs();
                        g[c] = if diff == 0.0 { 0.0 } else { diff.signum() / n };
                    }
                }
                // Through o = act(z), with the full Jacobian for the softmax.
                for j in 0..cols {
                    d[j] = match p.act {
                        crate::ops::loss::OutputActivation::Identity => g[j],
                        crate::ops::loss::OutputActivation::Sigmoid => g[j] * o[j] * (1.0 - o[j]),
                        crate::ops::loss::OutputActivation::Softmax => (0..cols)
                            .map(|c| g[c] * o[c] * (f64::from(u8::from(c == j)) - o[j]))
                            .sum(),
                    };
                }
                l / n
            }
        };
        loss[r] = l * f64::from(p.row_scale);
        for v in d.iter_mut() {
            *v *= f64::from(p.grad_scale);
        }
    }
    (loss, dz)
}

/// `act(z)` for one row.
pub fn output_activation(z: &[f64], act: crate::ops::loss::OutputActivation) -> Vec<f64> {
    match act {
        crate::ops::loss::OutputActivation::Identity => z.to_vec(),
        crate::ops::loss::OutputActivation::Sigmoid => {
            z.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect()
        }
        crate::ops::loss::OutputActivation::Softmax => softmax(z, 1, z.len()),
    }
}

/// Each row's metric value (see [`crate::ops::loss::MetricKind`]); `labels` for the top-k
/// metric, `y` (like `z`) for the others.
pub fn metric_rows(
    z: &[f64],
    y: &[f64],
    labels: &[i32],
    (rows, cols): (usize, usize),
    kind: crate::ops::loss::MetricKind,
    act: crate::ops::loss::OutputActivation,
) -> Vec<f64> {
    use crate::ops::loss::MetricKind as M;
    (0..rows)
        .map(|r| {
            let o = output_activation(&z[r * cols..(r + 1) * cols], act);
            let yr = || &y[r * cols..(r + 1) * cols];
            let hit = |b: bool| f64::from(u8::from(b));
            match kind {
                M::SparseTopK(k) => {
                    let l = labels[r];
                    if l < 0 || l as usize >= cols || o.iter().any(|v| !v.is_finite()) {
                        return 0.0;
                    }
                    let t = o[l as usize];
                    hit(o.iter().filter(|&&v| v > t).count() < k)
                }
                M::Categorical => hit(argmax_rows(&o, 1, cols) == argmax_rows(yr(), 1, cols)),
                M::Binary(th) => {
                    let th = f64::from(th);
                    let hits = o
                        .iter()
                        .zip(yr())
                        .filter(|(o, y)| hit(**o > th) == **y)
                        .count();
                    hits as f64 / cols as f64
                }
                M::MeanSquared => {
                    o.iter()
                        .zip(yr())
                        .map(|(o, y)| (o - y) * (o - y))
                        .sum::<f64>()
                        / cols as f64
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    //! Every gradient of the oracle against central finite differences.

    use super::*;
    use crate::ops::spec::Padding;

    /// Finite-difference step.
    const H: f64 = 1e-6;
    /// Allowed relative error (`|fd - analytic| <= TOL * max(1, |analytic|)`).
    const TOL: f64 = 1e-6;

    /// Random f64 values in [-1, 1).
    fn rand(len: usize, seed: u64) -> Vec<f64> {
        to_f64(&random_vec(len, seed))
    }

    /// Dot product.
    fn dot(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(a, b)| a * b).sum()
    }

    /// Checks `analytic` against the central differences of `f` around `x`.
    fn check_grad(x: &[f64], analytic: &[f64], what: &str, f: impl Fn(&[f64]) -> f64) {
        assert_eq!(x.len(), analytic.len(), "{what}: gradient length");
        let mut xp = x.to_vec();
        for i in 0..x.len() {
            xp[i] = x[i] + H;
            let up = f(&xp);
            xp[i] = x[i] - H;
            let down = f(&xp);
            xp[i] = x[i];
            let fd = (up - down) / (2.0 * H);
            let err = (fd - analytic[i]).abs();
            assert!(
                err <= TOL * analytic[i].abs().max(1.0),
                "{what}[{i}]: analytic {:e}, finite difference {fd:e}, error {err:e}",
                analytic[i]
            );
        }
    }

    #[test]
    fn random_vec_is_deterministic_nonzero_and_in_range() {
        let a = random_vec(10_000, 7);
        assert_eq!(a, random_vec(10_000, 7));
        assert_ne!(a, random_vec(10_000, 8));
        assert!(a.iter().all(|&v| (-1.0..1.0).contains(&v) && v != 0.0));
        let mean = a.iter().map(|&v| f64::from(v)).sum::<f64>() / a.len() as f64;
        assert!(mean.abs() < 0.05, "mean {mean}");
    }

    #[test]
    fn assert_close_accepts_and_rejects() {
        assert_close(&[1.0, 1000.0, 1e-9], &[1.0, 1000.05, 0.0], 1e-4, "ok");
        let fails = |a: f32, e: f64| {
            std::panic::catch_unwind(|| assert_close(&[a], &[e], 1e-4, "x")).is_err()
        };
        assert!(fails(1.0, 1.001));
        assert!(fails(f32::NAN, 1.0));
        assert!(fails(f32::INFINITY, 1.0));
        assert!(std::panic::catch_unwind(|| assert_close(&[1.0], &[], 1e-4, "len")).is_err());
    }

    #[test]
    fn dense_gradients() {
        for (m, k, n, act) in [
            (1, 1, 1, Activation::Linear),
            (3, 7, 1, Activation::Selu),
            (7, 3, 3, Activation::Relu),
            (3, 5, 7, Activation::Selu),
        ] {
            let (x, w, b, dy) = (rand(m * k, 1), rand(k * n, 2), rand(n, 3), rand(m * n, 4));
            let y = matmul_bias_act(&x, &w, Some(&b), m, k, n, act);
            let dz = activation_backward(&dy, &y, act);
            let dw = matmul(&x, &dz, k, m, n, true, false);
            let dx = matmul(&dz, &w, m, n, k, false, true);
            let db = bias_grad(&dz, n);
            let loss = |x: &[f64], w: &[f64], b: &[f64]| {
                dot(&dy, &matmul_bias_act(x, w, Some(b), m, k, n, act))
            };
            check_grad(&x, &dx, "dense dx", |v| loss(v, &w, &b));
            check_grad(&w, &dw, "dense dw", |v| loss(&x, v, &b));
            check_grad(&b, &db, "dense db", |v| loss(&x, &w, v));
        }
    }

    #[test]
    fn matmul_transposes_and_gradients() {
        let (m, k, n) = (3, 7, 5);
        let (a, b, g) = (rand(m * k, 11), rand(k * n, 12), rand(m * n, 13));
        // Transposed storage gives the same product.
        let at: Vec<f64> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
        let bt: Vec<f64> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let c = matmul(&a, &b, m, k, n, false, false);
        assert_eq!(c, matmul(&at, &b, m, k, n, true, false));
        assert_eq!(c, matmul(&a, &bt, m, k, n, false, true));
        assert_eq!(c, matmul(&at, &bt, m, k, n, true, true));
        // d(g·(ab))/da = g bᵀ, /db = aᵀ g.
        check_grad(
            &a,
            &matmul(&g, &b, m, n, k, false, true),
            "matmul da",
            |v| dot(&g, &matmul(v, &b, m, k, n, false, false)),
        );
        check_grad(
            &b,
            &matmul(&a, &g, k, m, n, true, false),
            "matmul db",
            |v| dot(&g, &matmul(&a, v, m, k, n, false, false)),
        );
    }

    #[test]
    fn activation_gradients_from_input_and_output() {
        let x = rand(64, 21);
        let dy = rand(64, 22);
        for act in [Activation::Linear, Activation::Relu, Activation::Selu] {
            let y = activation(&x, act);
            let from_out = activation_backward(&dy, &y, act);
            let from_in = activation_backward_from_input(&dy, &x, act);
            check_grad(&x, &from_in, "activation (input form)", |v| {
                dot(&dy, &activation(v, act))
            });
            check_grad(&x, &from_out, "activation (output form)", |v| {
                dot(&dy, &activation(v, act))
            });
        }
        // Values around the selu kink and large magnitudes.
        let x = vec![-30.0, -3.0, -1e-3, 1e-3, 2.5, 40.0];
        let dy = vec![1.0; x.len()];
        let y = activation(&x, Activation::Selu);
        check_grad(
            &x,
            &activation_backward(&dy, &y, Activation::Selu),
            "selu wide",
            |v| dot(&dy, &activation(v, Activation::Selu)),
        );
    }

    /// Conv shapes covering odd sizes, both paddings, 1/3/5 kernels.
    fn conv_shapes() -> Vec<Conv2dShape> {
        let mut v = Vec::new();
        for (n, h, w, c_in, c_out, kh, kw, padding) in [
            (1, 1, 1, 1, 1, 1, 1, Padding::Same),
            (1, 3, 3, 1, 2, 3, 3, Padding::Same),
            (2, 7, 3, 3, 2, 3, 1, Padding::Same),
            (1, 7, 7, 2, 3, 5, 5, Padding::Same),
            (1, 4, 6, 2, 2, 2, 3, Padding::Same),
            (2, 7, 5, 2, 3, 3, 3, Padding::Valid),
            (1, 3, 7, 3, 1, 1, 5, Padding::Valid),
            (1, 1, 3, 1, 1, 3, 3, Padding::Same),
        ] {
            v.push(Conv2dShape {
                n,
                h,
                w,
                c_in,
                c_out,
                kh,
                kw,
                padding,
                strides: [1, 1],
                dilation: [1, 1],
            });
        }
        // Strides, dilation, rectangular kernels, TF's asymmetric 'same' padding.
        for (h, w, kh, kw, strides, dilation, padding) in [
            (7, 6, 3, 3, [2, 2], [1, 1], Padding::Same),
            (7, 6, 4, 4, [2, 2], [1, 1], Padding::Same),
            (7, 6, 3, 5, [2, 1], [1, 1], Padding::Valid),
            (7, 7, 3, 3, [1, 1], [2, 2], Padding::Same),
            (6, 7, 3, 2, [1, 1], [2, 3], Padding::Valid),
            (8, 5, 2, 3, [3, 2], [1, 1], Padding::Same),
        ] {
            v.push(Conv2dShape {
                n: 2,
                h,
                w,
                c_in: 2,
                c_out: 3,
                kh,
                kw,
                padding,
                strides,
                dilation,
            });
        }
        v
    }

    #[test]
    fn conv2d_gradients() {
        for (t, s) in conv_shapes().into_iter().enumerate() {
            let seed = 100 + 10 * t as u64;
            let x = rand(s.input_len(), seed);
            let k = rand(s.kernel_len(), seed + 1);
            let b = rand(s.c_out, seed + 2);
            let dy = rand(s.output_len(), seed + 3);
            for act in [Activation::Linear, Activation::Selu] {
                let y = conv2d_forward(&x, &k, Some(&b), &s, act);
                let dz = activation_backward(&dy, &y, act);
                let loss = |x: &[f64], k: &[f64], b: &[f64]| {
                    dot(&dy, &conv2d_forward(x, k, Some(b), &s, act))
                };
                let what = format!("{s:?} {act:?}");
                check_grad(
                    &x,
                    &conv2d_backward_input(&dz, &k, &s),
                    &format!("conv dx {what}"),
                    |v| loss(v, &k, &b),
                );
                check_grad(
                    &k,
                    &conv2d_backward_kernel(&x, &dz, &s),
                    &format!("conv dk {what}"),
                    |v| loss(&x, v, &b),
                );
                check_grad(
                    &b,
                    &bias_grad(&dz, s.c_out),
                    &format!("conv db {what}"),
                    |v| loss(&x, &k, v),
                );
            }
        }
    }

    #[test]
    fn depthwise_gradients() {
        for (t, (n, h, w, c, kh, kw)) in [
            (1, 1, 1, 1, 1, 1),
            (1, 3, 3, 2, 3, 3),
            (2, 7, 3, 3, 3, 3),
            (1, 7, 7, 1, 5, 5),
            (1, 4, 5, 2, 2, 3),
        ]
        .into_iter()
        .enumerate()
        {
            let same = DepthwiseShape::same(n, h, w, c, kh, kw);
            // Each shape also strided with a multiplier, and dilated with 'valid' padding.
            for s in [
                same,
                DepthwiseShape {
                    multiplier: 2,
                    strides: [2, 2],
                    ..same
                },
                DepthwiseShape {
                    multiplier: 3,
                    padding: Padding::Valid,
                    dilation: [2, 1],
                    ..same
                },
            ] {
                let seed = 200 + 10 * t as u64;
                let x = rand(s.input_len(), seed);
                let k = rand(s.kernel_len(), seed + 1);
                let dy = rand(s.output_len(), seed + 2);
                let loss = |x: &[f64], k: &[f64]| dot(&dy, &depthwise_forward(x, k, &s));
                check_grad(
                    &x,
                    &depthwise_backward_input(&dy, &k, &s),
                    &format!("depthwise dx {s:?}"),
                    |v| loss(v, &k),
                );
                check_grad(
                    &k,
                    &depthwise_backward_kernel(&x, &dy, &s),
                    &format!("depthwise dk {s:?}"),
                    |v| loss(&x, v),
                );
            }
        }
    }

    #[test]
    fn maxpool_gradients() {
        for (t, (n, h, w, c)) in [
            (1, 2, 2, 1),
            (1, 3, 3, 2),
            (2, 7, 5, 3),
            (1, 1, 4, 1),
            (1, 6, 7, 2),
        ]
        .into_iter()
        .enumerate()
        {
            let s = PoolShape { n, h, w, c };
            let x = rand(s.input_len(), 300 + t as u64);
            let dy = rand(s.output_len(), 310 + t as u64);
            let dx = maxpool_backward(&x, &dy, &s);
            check_grad(&x, &dx, &format!("maxpool {s:?}"), |v| {
                dot(&dy, &maxpool_forward(v, &s))
            });
        }
        // Ties go to the first maximum in window order.
        let s = PoolShape {
            n: 1,
            h: 2,
            w: 2,
            c: 1,
        };
        assert_eq!(
            maxpool_backward(&[0.0, 1.0, 1.0, 1.0], &[5.0], &s),
            vec![0.0, 5.0, 0.0, 0.0]
        );
        assert_eq!(maxpool_forward(&[0.0, 1.0, 1.0, 1.0], &s), vec![1.0]);
    }

    #[test]
    fn softmax_cross_entropy_gradient() {
        for (rows, cols) in [(1, 1), (1, 3), (3, 7), (7, 10)] {
            let logits: Vec<f64> = rand(rows * cols, 400 + cols as u64)
                .iter()
                .map(|v| 4.0 * v)
                .collect();
            let labels: Vec<i32> = (0..rows).map(|r| ((r * 5 + 1) % cols) as i32).collect();
            let (loss, grad) = softmax_cross_entropy(&logits, &labels, rows, cols);
            // Against the textbook definition -ln softmax[label].
            let probs = softmax(&logits, rows, cols);
            for r in 0..rows {
                let expected = -probs[r * cols + labels[r] as usize].ln();
                assert!((loss[r] - expected).abs() < 1e-12, "loss[{r}]");
                let row_sum: f64 = probs[r * cols..(r + 1) * cols].iter().sum();
                assert!((row_sum - 1.0).abs() < 1e-12);
            }
            check_grad(&logits, &grad, "softmax xent", |v| {
                sum(&softmax_cross_entropy(v, &labels, rows, cols).0) / rows as f64
            });
        }
        // Huge logits stay finite.
        let (loss, grad) = softmax_cross_entropy(&[1e4, -1e4, 0.0], &[1], 1, 3);
        assert_eq!(loss, vec![2e4]);
        assert!(grad.iter().all(|g| g.is_finite()));
    }

    #[test]
    fn small_ops() {
        assert_eq!(
            argmax_rows(&[1.0, 3.0, 3.0, -1.0, -2.0, -1.0], 2, 3),
            vec![1, 0]
        );
        assert_eq!(
            accuracy_count(&[1.0, 3.0, 3.0, -1.0, -2.0, -1.0], &[1, 2], 2, 3),
            1
        );
        assert_eq!(
            sum_rows(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3, 2),
            vec![9.0, 12.0]
        );
        assert_eq!(sum(&[1.0, 2.0, 3.5]), 6.5);
        let p = SgdParams {
            lr: 0.5,
            momentum: 0.5,
            nesterov: false,
        };
        assert_eq!(sgd(&[1.0], &[2.0], &p), vec![0.0]);
        assert_eq!(
            sgd_momentum(&[1.0], &[2.0], &[1.0], &p),
            (vec![0.5], vec![-0.5])
        );
        let p = SgdParams {
            nesterov: true,
            ..p
        };
        assert_eq!(
            sgd_momentum(&[1.0], &[2.0], &[1.0], &p),
            (vec![-0.25], vec![-0.5])
        );
        // Adam's first step moves each weight by about lr, against the gradient's sign.
        let p = AdamParams {
            lr: 0.001,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-7,
            step: 1,
        };
        let (w, m, v) = adam(&[1.0, 1.0], &[0.5, -2.0], &[0.0, 0.0], &[0.0, 0.0], &p);
        assert!(
            (w[0] - (1.0 - 0.001)).abs() < 1e-6 && (w[1] - 1.001).abs() < 1e-6,
            "{w:?}"
        );
        assert!((m[0] - 0.05).abs() < 1e-7 && (v[1] - 0.004).abs() < 1e-7);
    }
}
