//! Every gradient of the oracle against central finite differences.

use super::*;
use crate::ops::spec::{AdamParams, Conv2dShape, DepthwiseShape, Padding, PoolShape, SgdParams};

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
    let fails =
        |a: f32, e: f64| std::panic::catch_unwind(|| assert_close(&[a], &[e], 1e-4, "x")).is_err();
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
            let loss =
                |x: &[f64], k: &[f64], b: &[f64]| dot(&dy, &conv2d_forward(x, k, Some(b), &s, act));
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
