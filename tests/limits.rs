//! Hostile shapes and sizes on `CPU:0`: element counts that overflow, allocations the system
//! refuses, and one tensor read twice while a writer waits. Every public op front-end either
//! returns an error or the right result; none crashes, aborts or deadlocks.
//!
//! The property test draws dimensions that are mostly 0 to 3 and sometimes huge (2^50 + 3,
//! 2^60 + 1, `usize::MAX`): a tensor with a huge dimension can only exist with no elements, so
//! the ops see empty inputs whose shapes overflow when multiplied together. With the CPU NaN
//! trap on (`ANYGPU_NAN_TRAP=1` in CI, always in debug builds), "finite" in the checks means
//! "every output element was written".

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

use anygpu::ops::reference::{self as r, assert_close, random_vec, to_f64};
use anygpu::ops::spec::{Activation, AdamParams, Conv2dShape, Padding, SgdParams};
use anygpu::ops::{self};
use anygpu::{Error, LogicalDevice, Runtime, Tensor};
use proptest::prelude::*;

/// `CPU:0` of a runtime that opens no GPU.
fn cpu() -> &'static LogicalDevice {
    static CPU: OnceLock<(Runtime, LogicalDevice)> = OnceLock::new();
    &CPU.get_or_init(|| {
        let rt = Runtime::builder()
            .env("ANYGPU_VISIBLE_DEVICES", Some(""))
            .env("ANYGPU_REQUIRE_ADAPTER", None)
            .build()
            .expect("a CPU-only runtime initializes");
        let cpu = rt.cpu().expect("every runtime has CPU:0");
        (rt, cpu)
    })
    .1
}

#[test]
fn matmul_of_a_shape_whose_product_wraps_is_an_invalid_argument() {
    // (2^60 + 1) * 16 wraps to 16 in release builds: the 16 values used to pass the length
    // check, and the product then wrote far out of bounds.
    let cpu = cpu();
    let made = Tensor::from_slice_on(&[1f32; 16], &[(1 << 60) + 1, 16], cpu);
    let err = made.expect_err("a shape of 2^64 + 16 elements cannot hold 16 values");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(
        err.to_string().contains("[1152921504606846977,16]"),
        "the message names the shape: {err}"
    );
    // The same shape through every other door.
    let x = Tensor::from_slice_on(&[1f32; 16], &[16], cpu).unwrap();
    assert!(matches!(
        x.reshape(&[(1 << 60) + 1, 16]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        Tensor::empty_on(&[(1 << 60) + 1, 16], anygpu::DType::F32, cpu),
        Err(Error::InvalidArgument(_))
    ));
    // Empty operands whose result shape overflows.
    let a = Tensor::from_slice_on::<f32>(&[], &[1 << 40, 0], cpu).unwrap();
    let b = Tensor::from_slice_on::<f32>(&[], &[0, 1 << 40], cpu).unwrap();
    assert!(matches!(a.matmul(&b), Err(Error::InvalidArgument(_))));
}

#[test]
fn a_cpu_tensor_larger_than_memory_is_resource_exhausted_naming_cpu0() {
    // 2^40 floats (4 TiB): the kernel gradient of a 'same' convolution with a 2^20 x 2^20
    // kernel. The allocation used to abort the process.
    let cpu = cpu();
    let x = Tensor::from_slice_on(&[1f32; 4], &[1, 2, 2, 1], cpu).unwrap();
    let dz = Tensor::from_slice_on(&[1f32; 4], &[1, 2, 2, 1], cpu).unwrap();
    let err = ops::conv2d_backward_kernel(&x, &dz, &[1 << 20, 1 << 20, 1, 1], Padding::Same)
        .expect_err("4 TiB does not fit in this machine's memory");
    assert!(matches!(err, Error::ResourceExhausted(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with(
            "OOM when allocating tensor with shape[1048576,1048576,1,1] and type float on \
             /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu"
        ),
        "TensorFlow's wording, naming CPU:0: {text}"
    );
}

#[test]
fn one_tensor_read_twice_by_an_op_does_not_deadlock_with_a_writer_waiting() {
    // std's RwLock lets a waiting writer go before new readers: an op that took a second read
    // guard on the lock it already held would wait for the writer, which waits for it.
    let cpu = cpu();
    let n = 8;
    let x = Tensor::from_slice_on(&random_vec(n * n, 1), &[n, n], cpu).unwrap();
    let y = Tensor::from_slice_on(&random_vec(n * n, 2), &[n, n], cpu).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (x, y, stop, writes) = (x.clone(), y.clone(), stop.clone(), writes.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                x.assign(&y).expect("same shape and device");
                writes.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let (done, finished) = mpsc::channel();
    {
        let (x, writes) = (x.clone(), writes.clone());
        std::thread::spawn(move || {
            let flat = x.reshape(&[n * n]).expect("same element count");
            // Thousands of reads of one tensor in one call: the window in which a writer used
            // to queue between two of them was milliseconds, not nanoseconds.
            let many = vec![&x; 20_000];
            let result = (|| -> anygpu::Result<()> {
                // Until the writer has queued often enough to have met every op in the middle.
                let mut rounds = 0;
                while rounds < 20 || writes.load(Ordering::Relaxed) < 1_000 {
                    rounds += 1;
                    Tensor::add_n(&many)?;
                    x.add(&x)?;
                    x.matmul(&x)?;
                    x.mul(&flat.reshape(&[n, n])?)?;
                    ops::activation_backward(&x, &x, Activation::Relu)?;
                }
                Ok(())
            })();
            let _ = done.send(result);
        });
    }
    // A generous bound, not a timing assertion: the ops take milliseconds; a deadlock never ends.
    let outcome = finished.recv_timeout(Duration::from_secs(120));
    stop.store(true, Ordering::Relaxed);
    match outcome {
        Ok(result) => result.expect("the ops succeed"),
        Err(_) => panic!("an op reading one tensor twice deadlocked against a waiting writer"),
    }
    writer.join().expect("the writer ends");
}

#[test]
fn an_optimizer_update_of_an_empty_variable_by_itself_is_an_error_not_a_deadlock() {
    let cpu = cpu();
    let w = Tensor::from_slice_on::<f32>(&[], &[0, 3], cpu).unwrap();
    let p = SgdParams {
        lr: 0.1,
        momentum: 0.0,
        nesterov: false,
    };
    let err = ops::sgd_update(&w, &w, None, &p).expect_err("w is its own gradient");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
}

// ---------------------------------------------------------------------------------------------
// The property test.

const HUGE: [usize; 3] = [(1 << 50) + 3, (1 << 60) + 1, usize::MAX];

/// Mostly 0 to 3, sometimes huge.
fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![6 => 0usize..=3, 1 => proptest::sample::select(&HUGE[..])]
}

fn is_small(dims: &[usize]) -> bool {
    dims.iter().all(|&d| d <= 3)
}

/// A tensor of `shape` with random values, `None` when none can exist. A shape whose size
/// overflows must be refused with `InvalidArgument`.
fn tensor(shape: &[usize], seed: u64) -> Option<Tensor> {
    let len = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let fits = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(4usize, |a, &d| a.checked_mul(d))
        .is_some_and(|b| b <= isize::MAX as usize);
    let made = match len {
        Some(len) if len <= 4096 => Tensor::from_slice_on(&random_vec(len, seed), shape, cpu()),
        Some(_) if fits => return None, // real but too large to build here
        _ => Tensor::from_slice_on::<f32>(&[], shape, cpu()),
    };
    match made {
        Ok(t) => Some(t),
        Err(Error::InvalidArgument(_)) if !fits || len.is_none() => None,
        Err(e) => panic!("creating a tensor of shape {shape:?}: unexpected {e:?}"),
    }
}

/// The property for one output: an error only where some dimension is huge (and then only a
/// size error), else the expected shape, every element written, equal to the oracle where one is
/// given (small shapes) or to zero where a huge dimension left nothing to sum.
fn check(
    op: &str,
    got: anygpu::Result<Tensor>,
    shape: &[usize],
    small: bool,
    oracle: Option<Vec<f64>>,
) -> Result<(), TestCaseError> {
    let t = match got {
        Ok(t) => t,
        Err(e) => {
            prop_assert!(!small, "{op}: small shapes must succeed, got {e}");
            prop_assert!(
                matches!(e, Error::InvalidArgument(_) | Error::ResourceExhausted(_)),
                "{op}: only a size error is expected, got {e:?}"
            );
            return Ok(());
        }
    };
    prop_assert_eq!(t.shape(), shape, "{} output shape", op);
    let values = t.to_vec::<f32>().expect("an f32 output");
    prop_assert!(
        values.iter().all(|v| v.is_finite()),
        "{op}: an output element was not written: {values:?}"
    );
    match oracle {
        Some(expected) if small => assert_close(&values, &expected, 1e-4, op),
        _ if !small => prop_assert!(values.iter().all(|&v| v == 0.0), "{op}: {values:?}"),
        _ => {}
    }
    Ok(())
}

/// Like [`check`] for several outputs of one call.
fn check_all(
    op: &str,
    got: anygpu::Result<Vec<(Tensor, Vec<usize>)>>,
    small: bool,
) -> Result<(), TestCaseError> {
    match got {
        Ok(outs) => outs
            .into_iter()
            .try_for_each(|(t, shape)| check(op, Ok(t), &shape, small, None)),
        Err(e) => check(op, Err(e), &[], small, None),
    }
}

fn acts() -> impl Strategy<Value = Activation> {
    proptest::sample::select(vec![Activation::Linear, Activation::Relu, Activation::Selu])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn general_ops_error_or_answer_right_on_any_shape(
        m in dim(), k in dim(), n in dim(), ta: bool, tb: bool, alpha in -2.0f32..2.0, seed: u64,
    ) {
        let small = is_small(&[m, k, n]);
        let a_shape = if ta { [k, m] } else { [m, k] };
        let b_shape = if tb { [n, k] } else { [k, n] };
        let (Some(a), Some(b)) = (tensor(&a_shape, seed), tensor(&b_shape, seed + 1)) else {
            return Ok(());
        };
        let oracle = small.then(|| {
            let (av, bv) = (to_f64(&a.to_vec().unwrap()), to_f64(&b.to_vec().unwrap()));
            r::matmul(&av, &bv, m, k, n, ta, tb)
        });
        check("MatMul", ops::matmul_transposed(&a, &b, ta, tb), &[m, n], small, oracle)?;

        // Element-wise with a bias-shaped right operand: only m and n matter from here on.
        let small = is_small(&[m, n]);
        let (Some(x), Some(bias)) = (tensor(&[m, n], seed + 2), tensor(&[n], seed + 3)) else {
            return Ok(());
        };
        let oracle = small.then(|| {
            let (xv, bv) = (x.to_vec::<f32>().unwrap(), bias.to_vec::<f32>().unwrap());
            xv.iter().enumerate().map(|(i, &v)| f64::from(v) + f64::from(bv[i % n])).collect()
        });
        check("AddV2", x.add(&bias), &[m, n], small, oracle)?;
        check("Sub", x.sub(&x), &[m, n], small, small.then(|| vec![0.0; m * n]))?;
        check("Mul", x.mul(&bias), &[m, n], small, None)?;
        check("Scale", x.scale(alpha), &[m, n], small, None)?;
        check("AddN", Tensor::add_n(&[&x, &x]), &[m, n], small, None)?;
        let sum = small.then(|| vec![r::sum(&to_f64(&x.to_vec().unwrap()))]);
        check("Sum", x.reduce_sum(None), &[], small, sum)?;
        check("Mean", x.reduce_mean(None), &[], small, None)?;
        let rows = small.then(|| r::sum_rows(&to_f64(&x.to_vec().unwrap()), m, n));
        check("Sum0", x.reduce_sum(Some(0)), &[n], small, rows)?;
        check("Mean0", x.reduce_mean(Some(0)), &[n], small, None)?;
        check("Cumsum", x.cumsum(), &[m, n], small, None)?;
        match x.argmax() {
            Ok(i) => {
                prop_assert_eq!(i.shape(), &[m][..]);
                let idx = i.to_vec::<i32>().unwrap();
                prop_assert!(idx.iter().all(|&j| j >= 0 && (j as usize) < n));
            }
            Err(e) => prop_assert!(n == 0 || !small, "ArgMax: {e}"),
        }
        check("Reshape", x.reshape(&[n, m]), &[n, m], small, None)?;
        check("BiasAddGrad", ops::bias_grad(&x), &[n], small, None)?;
        check("Softmax", ops::softmax(&x), &[m, n], small, small.then(|| {
            r::softmax(&to_f64(&x.to_vec().unwrap()), m, n)
        }))?;
        for act in [Activation::Linear, Activation::Relu, Activation::Selu] {
            check("Activation", ops::activation(&x, act), &[m, n], small, None)?;
            check("ActivationGrad", ops::activation_backward(&x, &x, act), &[m, n], small, None)?;
        }
        let labels: Vec<i32> = (0..m.min(4096)).map(|i| (i % n.max(1)) as i32).collect();
        if let Ok(labels) = Tensor::from_slice_on(&labels, &[m], cpu()) {
            match ops::sparse_softmax_cross_entropy(&x, &labels) {
                Ok((loss, dlogits)) => {
                    check("Xent", Ok(loss), &[m], small, None)?;
                    check("Xent", Ok(dlogits), &[m, n], small, None)?;
                }
                Err(e) => prop_assert!(!small || (n == 0 && m > 0), "Xent: {e}"),
            }
            check("AccuracyCount", ops::accuracy_count(&x, &labels), &[1], small, None)?;
        }
    }

    #[test]
    fn dense_and_optimizer_ops_error_or_answer_right_on_any_shape(
        m in dim(), k in dim(), n in dim(), act in acts(), need_dx: bool, seed: u64,
    ) {
        let small = is_small(&[m, k, n]);
        let tensors = [[m, k], [k, n], [m, n], [m, n]].map(|s| (tensor(&s, seed), s));
        let [(Some(x), _), (Some(w), _), (Some(y), _), (Some(dy), _)] = tensors else {
            return Ok(());
        };
        let Some(b) = tensor(&[n], seed + 9) else { return Ok(()) };
        check("Dense", ops::dense(&x, &w, Some(&b), act), &[m, n], small, None)?;
        let grads = ops::dense_backward(&x, &w, &y, &dy, act, need_dx).map(|(dx, dw, db)| {
            let mut outs = vec![(dw, vec![k, n]), (db, vec![n])];
            outs.extend(dx.map(|dx| (dx, vec![m, k])));
            outs
        });
        check_all("FusedDenseGrad", grads, small)?;
        let p = SgdParams { lr: 0.1, momentum: 0.9, nesterov: true };
        let v = ops::activation(&w, Activation::Linear);
        if let Ok(v) = v {
            let g = ops::activation(&w, Activation::Relu).expect("as above");
            let updated = ops::sgd_update(&w, &g, Some(&v), &p).map(|()| vec![(w.clone(), vec![k, n])]);
            check_all("Momentum", updated, small)?;
            let m1 = ops::activation(&w, Activation::Linear).expect("as above");
            // A second moment is never negative.
            let v1 = ops::activation(&g, Activation::Relu).expect("as above");
            let adam = AdamParams { lr: 1e-3, beta1: 0.9, beta2: 0.999, epsilon: 1e-7, step: 1 };
            let updated = ops::adam_update(&w, &g, &m1, &v1, &adam).map(|()| vec![(w.clone(), vec![k, n])]);
            check_all("Adam", updated, small)?;
        }
    }

    #[test]
    fn conv_ops_error_or_answer_right_on_any_shape(
        n in dim(), h in dim(), w in dim(), c_in in dim(), c_out in dim(),
        kh in prop_oneof![4 => 1usize..=3, 1 => proptest::sample::select(&HUGE[..])],
        kw in prop_oneof![4 => 1usize..=3, 1 => proptest::sample::select(&HUGE[..])],
        same: bool, act in acts(), seed: u64,
    ) {
        let padding = if same { Padding::Same } else { Padding::Valid };
        let small = is_small(&[n, h, w, c_in, c_out, kh, kw]);
        let s = Conv2dShape { n, h, w, c_in, c_out, kh, kw, padding, strides: [1, 1], dilation: [1, 1] };
        let (oh, ow) = s.out_hw();
        let (x_shape, k_shape, y_shape) = ([n, h, w, c_in], [kh, kw, c_in, c_out], [n, oh, ow, c_out]);
        let Some(x) = tensor(&x_shape, seed) else { return Ok(()) };
        if let Some(y) = tensor(&y_shape, seed + 1) {
            // The kernel gradient takes the kernel's shape as a plain argument: any size.
            let oracle = (small && c_in > 0).then(|| {
                r::conv2d_backward_kernel(&to_f64(&x.to_vec().unwrap()), &to_f64(&y.to_vec().unwrap()), &s)
            });
            let got = ops::conv2d_backward_kernel(&x, &y, &k_shape, padding);
            if c_in == 0 {
                prop_assert!(got.is_err(), "a convolution without input channels is refused");
            } else {
                check("Conv2DBackpropFilter", got, &k_shape, small, oracle)?;
                let grads = ops::conv2d_backward_weights(&x, &y, &y, &k_shape, padding, act)
                    .map(|(dk, db)| vec![(dk, k_shape.to_vec()), (db, vec![c_out])]);
                check_all("FusedConv2DWeightGrad", grads, small)?;
            }
            if let Some(kernel) = tensor(&k_shape, seed + 2) {
                let got = ops::conv2d_backward_input(&y, &kernel, &x_shape, padding);
                if c_in > 0 {
                    check("Conv2DBackpropInput", got, &x_shape, small, None)?;
                }
            }
        }
        let Some(kernel) = tensor(&k_shape, seed + 2) else { return Ok(()) };
        let Some(bias) = tensor(&[c_out], seed + 3) else { return Ok(()) };
        if c_in == 0 {
            return Ok(());
        }
        let oracle = small.then(|| {
            r::conv2d_forward(
                &to_f64(&x.to_vec().unwrap()),
                &to_f64(&kernel.to_vec().unwrap()),
                Some(&to_f64(&bias.to_vec().unwrap())),
                &s,
                act,
            )
        });
        check("Conv2D", ops::conv2d(&x, &kernel, Some(&bias), padding, act), &y_shape, small, oracle)?;
        if kh == 1 && kw == 1 {
            check("Pointwise", ops::pointwise_conv2d(&x, &kernel, None, act), &[n, h, w, c_out], small, None)?;
        }
    }

    #[test]
    fn depthwise_pool_and_separable_ops_error_or_answer_right_on_any_shape(
        n in dim(), h in dim(), w in dim(), c in dim(), filters in dim(),
        kh in prop_oneof![4 => 1usize..=3, 1 => proptest::sample::select(&HUGE[..])],
        kw in prop_oneof![4 => 1usize..=3, 1 => proptest::sample::select(&HUGE[..])],
        act in acts(), need_dx: bool, seed: u64,
    ) {
        let (x_shape, k_shape) = ([n, h, w, c], [kh, kw, c, 1]);
        let Some(x) = tensor(&x_shape, seed) else { return Ok(()) };
        let small = is_small(&x_shape);
        let pooled = [n, h / 2, w / 2, c];
        check("MaxPool", ops::max_pool2d(&x), &pooled, small, None)?;
        if let Some(dp) = tensor(&pooled, seed + 1) {
            check("MaxPoolGrad", ops::max_pool2d_backward(&x, &dp), &x_shape, small, None)?;
        }
        let small = small && is_small(&[kh, kw]);
        check("DepthwiseFilterGrad", ops::depthwise_conv2d_backward_kernel(&x, &x, &k_shape), &k_shape, small, None)?;
        let Some(kernel) = tensor(&k_shape, seed + 2) else { return Ok(()) };
        check("Depthwise", ops::depthwise_conv2d(&x, &kernel), &x_shape, small, None)?;
        check("DepthwiseInputGrad", ops::depthwise_conv2d_backward_input(&x, &kernel), &x_shape, small, None)?;
        let Some(pointwise) = tensor(&[1, 1, c, filters], seed + 3) else { return Ok(()) };
        let y_shape = [n, h, w, filters];
        let small = small && filters <= 3;
        let got = ops::separable_conv2d(&x, &kernel, &pointwise, None, act);
        if c == 0 {
            prop_assert!(got.is_err(), "a separable convolution without channels is refused");
            return Ok(());
        }
        check("Separable", got, &y_shape, small, None)?;
        let Some(y) = tensor(&y_shape, seed + 4) else { return Ok(()) };
        let outs = |g: anygpu::Result<ops::SeparableConv2dGrads>| {
            g.map(|g| {
                let mut outs = vec![
                    (g.depthwise, k_shape.to_vec()),
                    (g.pointwise, vec![1, 1, c, filters]),
                    (g.bias, vec![filters]),
                ];
                outs.extend(g.dx.map(|dx| (dx, x_shape.to_vec())));
                outs
            })
        };
        let g = ops::separable_conv2d_backward(&x, &kernel, &pointwise, &y, &y, act, need_dx);
        check_all("SeparableGrad", outs(g), small)?;
        if let Some(dp) = tensor(&[n, h / 2, w / 2, filters], seed + 5) {
            let g = ops::separable_conv2d_max_pool_backward(&x, &kernel, &pointwise, &y, &dp, act, need_dx);
            check_all("SeparableMaxPoolGrad", outs(g), small)?;
        }
    }
}
