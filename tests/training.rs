//! The Keras-like training layer: the tutorial model's summary, gradients against finite
//! differences, training on a small problem, one device vs a split over three, weight files,
//! evaluate and predict.
//!
//! Small models and batches throughout: the whole file runs in seconds on two cores.

mod common;

use anygpu::data::Dataset;
use anygpu::nn::{
    self, Activation, Adam, Conv2D, Dense, Flatten, Layer, Loss, MaxPool2D, Metric,
    SeparableConv2D, Sequential, Sgd, Verbosity,
};
use anygpu::ops::spec::Padding;
use anygpu::{Error, LogicalDevice, PlacementRecord, Runtime, Tensor};
use std::sync::{Arc, Mutex};

fn cpu_runtime(cpus: usize) -> Runtime {
    common::builder()
        .virtual_cpus(cpus)
        .build()
        .expect("a runtime of virtual CPUs builds")
}

/// A small CNN with every layer type, its three blocks on `devices[0..3]` (as the tutorial
/// splits its model): input 8×8×1, 3 classes.
fn small_cnn(seed: u64, devices: [&LogicalDevice; 3]) -> anygpu::Result<Sequential> {
    let mut m = Sequential::with_seed(seed);
    let selu = Activation::Selu;
    m.add_on(
        devices[0],
        Conv2D::new(4, 3)
            .padding(Padding::Same)
            .activation(selu)
            .input_shape(&[8, 8, 1]),
    )?;
    m.add_on(
        devices[0],
        SeparableConv2D::new(6, 3)
            .padding(Padding::Same)
            .activation(selu),
    )?;
    m.add_on(devices[0], MaxPool2D::new())?;
    m.add_on(
        devices[1],
        SeparableConv2D::new(8, 3)
            .padding(Padding::Same)
            .activation(selu),
    )?;
    m.add_on(devices[1], MaxPool2D::new())?;
    m.add_on(devices[2], Flatten::new())?;
    m.add_on(devices[2], Dense::new(12).activation(selu))?;
    m.add_on(devices[2], Dense::new(3).activation(Activation::Softmax))?;
    Ok(m)
}

fn temp_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("anygpu-training-{}-{name}", std::process::id()))
}

#[test]
fn tutorial_summary_has_184234_params_and_a_row_per_layer() {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    let model = nn::tutorial_cnn(42, &[cpu]).unwrap();
    assert_eq!(
        model.count_params(),
        184_234,
        "Keras counts 184,234 parameters"
    );
    let expected: [(&str, &str, &[usize], usize); 12] = [
        ("conv2d", "Conv2D", &[28, 28, 32], 320),
        ("separable_conv2d", "SeparableConv2D", &[28, 28, 32], 1_344),
        ("max_pooling2d", "MaxPooling2D", &[14, 14, 32], 0),
        (
            "separable_conv2d_1",
            "SeparableConv2D",
            &[14, 14, 64],
            2_400,
        ),
        (
            "separable_conv2d_2",
            "SeparableConv2D",
            &[14, 14, 64],
            4_736,
        ),
        ("max_pooling2d_1", "MaxPooling2D", &[7, 7, 64], 0),
        ("separable_conv2d_3", "SeparableConv2D", &[7, 7, 128], 8_896),
        (
            "separable_conv2d_4",
            "SeparableConv2D",
            &[7, 7, 128],
            17_664,
        ),
        ("max_pooling2d_2", "MaxPooling2D", &[3, 3, 128], 0),
        ("flatten", "Flatten", &[1152], 0),
        ("dense", "Dense", &[128], 147_584),
        ("dense_1", "Dense", &[10], 1_290),
    ];
    let infos = model.layer_infos();
    assert_eq!(infos.len(), expected.len());
    for (info, (name, class, shape, params)) in infos.iter().zip(expected) {
        assert_eq!(
            (
                info.name.as_str(),
                info.class_name,
                info.output_shape.as_deref(),
                info.params
            ),
            (name, class, Some(shape), params)
        );
        assert_eq!(info.device, "/device:CPU:0");
    }
    let summary = model.summary();
    println!("{summary}");
    for needle in [
        "Model: \"sequential\"",
        "Layer (type)",
        "Output Shape",
        "Param #",
        "Device",
        "Total params: 184,234",
        "Trainable params: 184,234",
        "Non-trainable params: 0",
    ] {
        assert!(
            summary.contains(needle),
            "summary lacks {needle:?}:\n{summary}"
        );
    }
    let row = |name: &str| {
        summary
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{name} (")))
            .unwrap_or_else(|| panic!("no row for {name}:\n{summary}"))
            .to_string()
    };
    let conv = row("conv2d");
    assert!(
        conv.contains("conv2d (Conv2D)")
            && conv.contains("(None, 28, 28, 32)")
            && conv.contains("320")
    );
    let sep = row("separable_conv2d_1");
    assert!(
        sep.contains("(SeparableConv2D)")
            && sep.contains("(None, 14, 14, 64)")
            && sep.contains("2400")
    );
    assert!(row("max_pooling2d_2").contains("(None, 3, 3, 128)"));
    assert!(row("flatten").contains("(None, 1152)"));
    assert!(row("dense_1").contains("(None, 10)") && row("dense_1").contains("/device:CPU:0"));
}

#[test]
fn the_tutorial_split_wraps_its_three_blocks_over_the_devices() {
    let rt = cpu_runtime(3);
    let cpus = rt.list_logical_devices("CPU").unwrap();
    let split = nn::tutorial_cnn(1, &cpus).unwrap();
    let devices: Vec<String> = split.layer_infos().into_iter().map(|i| i.device).collect();
    assert_eq!(&devices[..6], vec!["/device:CPU:0"; 6].as_slice());
    assert_eq!(&devices[6..9], vec!["/device:CPU:1"; 3].as_slice());
    assert_eq!(&devices[9..], vec!["/device:CPU:2"; 3].as_slice());
    let two = nn::tutorial_cnn(1, &cpus[..2]).unwrap();
    assert_eq!(
        two.layer_infos()[11].device,
        "/device:CPU:0",
        "block 3 wraps to the first device"
    );
    // Each weight is created on its layer's device.
    for (i, info) in split.layer_infos().iter().enumerate() {
        for (_, w) in split.layer(i).unwrap().weights() {
            assert!(
                w.device().ends_with(&info.device[1..]),
                "{} on {}",
                info.name,
                w.device()
            );
        }
    }
}

#[test]
fn layers_added_in_a_device_scope_live_on_that_device() {
    let rt = cpu_runtime(3);
    let mut model = Sequential::new();
    {
        let _scope = rt.with_device("/device:CPU:2").unwrap();
        model.add(Dense::new(4).input_shape(&[3])).unwrap();
    }
    let cpu1 = rt.device("CPU:1").unwrap();
    model.add_on(&cpu1, Dense::new(2)).unwrap();
    let infos = model.layer_infos();
    assert_eq!(infos[0].device, "/device:CPU:2");
    assert_eq!(infos[1].device, "/device:CPU:1");
    assert!(model.weights()[0].device().ends_with("CPU:2"));
    assert!(model.weights()[3].device().ends_with("CPU:1"));
}

#[test]
fn glorot_uniform_kernels_stay_within_keras_limits_and_biases_start_at_zero() {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    let model = nn::tutorial_cnn(7, std::slice::from_ref(&cpu)).unwrap();
    for (name, w) in model.named_weights() {
        let v = w.to_vec::<f32>().unwrap();
        let s = w.shape();
        if name.ends_with("bias") {
            assert!(v.iter().all(|&x| x == 0.0), "{name} starts at zero");
            continue;
        }
        let (fan_in, fan_out) = match s {
            [a, b] => (*a, *b),
            [kh, kw, i, o] => (kh * kw * i, kh * kw * o),
            _ => unreachable!("{name} {s:?}"),
        };
        let limit = (6.0 / (fan_in + fan_out) as f64).sqrt() as f32;
        let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(max <= limit, "{name}: {max} > {limit}");
        assert!(
            max > 0.8 * limit,
            "{name}: values should fill the range, max {max} of {limit}"
        );
    }
    // Same seed, same weights; another seed, other weights.
    let again = nn::tutorial_cnn(7, std::slice::from_ref(&cpu)).unwrap();
    assert_eq!(model.get_weights().unwrap(), again.get_weights().unwrap());
    let other = nn::tutorial_cnn(8, &[cpu]).unwrap();
    assert_ne!(
        model.get_weights().unwrap()[0],
        other.get_weights().unwrap()[0]
    );
}

#[test]
fn backward_pass_matches_finite_differences_on_a_tiny_cnn() {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    let mut model = Sequential::with_seed(3);
    let selu = Activation::Selu;
    model
        .add_on(
            &cpu,
            Conv2D::new(3, 3)
                .padding(Padding::Same)
                .activation(selu)
                .input_shape(&[6, 6, 2]),
        )
        .unwrap();
    model
        .add_on(
            &cpu,
            SeparableConv2D::new(4, 3)
                .padding(Padding::Same)
                .activation(selu),
        )
        .unwrap();
    model.add_on(&cpu, MaxPool2D::new()).unwrap();
    model.add_on(&cpu, Flatten::new()).unwrap();
    model.add_on(&cpu, Dense::new(5).activation(selu)).unwrap();
    model
        .add_on(&cpu, Dense::new(3).activation(Activation::Softmax))
        .unwrap();
    model
        .compile(Loss::sparse_categorical_crossentropy(), Sgd::default(), &[])
        .unwrap();
    // Biases start at zero: give them values so their gradients are generic too.
    let mut weights = model.get_weights().unwrap();
    for (i, w) in weights.iter_mut().enumerate() {
        for (j, v) in w.iter_mut().enumerate() {
            *v += 0.1 * common::values(1, (i * 1000 + j) as u64 + 11)[0];
        }
    }
    model.set_weights(&weights).unwrap();

    let x = Tensor::from_slice_on(&common::values(4 * 6 * 6 * 2, 5), &[4, 6, 6, 2], &cpu).unwrap();
    let y = Tensor::from_slice_on(&[0i32, 2, 1, 2], &[4], &cpu).unwrap();
    let (loss, grads) = model.loss_and_gradients(&x, &y).unwrap();
    assert!(loss.is_finite() && loss > 0.0);
    let names: Vec<String> = model.named_weights().into_iter().map(|(n, _)| n).collect();
    assert_eq!(grads.len(), names.len());

    let eps = 2e-3f32;
    let mut checked = 0;
    let mut worst = (0.0f32, String::new());
    for (wi, grad) in grads.iter().enumerate() {
        let g = grad.to_vec::<f32>().unwrap();
        assert_eq!(g.len(), weights[wi].len(), "{}: gradient shape", names[wi]);
        // Up to 8 entries per weight, spread over it.
        let stride = (g.len() / 8).max(1);
        for j in (0..g.len()).step_by(stride).take(8) {
            let mut probe = weights.clone();
            probe[wi][j] = weights[wi][j] + eps;
            model.set_weights(&probe).unwrap();
            let plus = model.loss_and_gradients(&x, &y).unwrap().0;
            probe[wi][j] = weights[wi][j] - eps;
            model.set_weights(&probe).unwrap();
            let minus = model.loss_and_gradients(&x, &y).unwrap().0;
            let numeric = (plus - minus) / (2.0 * eps);
            let err = (numeric - g[j]).abs();
            let tol = 1e-3 + 0.03 * g[j].abs().max(numeric.abs());
            assert!(
                err <= tol,
                "{}[{j}]: analytic {} vs finite differences {numeric} (error {err}, tolerance {tol})",
                names[wi],
                g[j]
            );
            if err > worst.0 {
                worst = (err, format!("{}[{j}]", names[wi]));
            }
            checked += 1;
        }
    }
    model.set_weights(&weights).unwrap();
    assert!(checked >= 50, "checked {checked} entries");
    eprintln!(
        "{checked} gradient entries checked; largest error {} at {}",
        worst.0, worst.1
    );
}

#[test]
fn a_pool_fused_into_the_separable_layer_before_it_gives_the_unfused_gradients() {
    // On one CPU each SeparableConv2D + MaxPool2D pair runs one fused backward pass; with every
    // pool on another (virtual) CPU the two passes run separately.
    let rt = cpu_runtime(2);
    let cpus = rt.list_logical_devices("CPU").unwrap();
    let (a, b) = (&cpus[0], &cpus[1]);
    let build = |pool_device: &LogicalDevice| {
        let mut m = Sequential::with_seed(5);
        let selu = Activation::Selu;
        m.add_on(
            a,
            SeparableConv2D::new(6, 3)
                .padding(Padding::Same)
                .activation(selu)
                .input_shape(&[9, 10, 3]),
        )
        .unwrap();
        m.add_on(pool_device, MaxPool2D::new()).unwrap();
        m.add_on(
            a,
            SeparableConv2D::new(8, 3)
                .padding(Padding::Same)
                .activation(selu),
        )
        .unwrap();
        m.add_on(pool_device, MaxPool2D::new()).unwrap();
        m.add_on(a, Flatten::new()).unwrap();
        m.add_on(a, Dense::new(3).activation(Activation::Softmax))
            .unwrap();
        m.compile(Loss::sparse_categorical_crossentropy(), Sgd::default(), &[])
            .unwrap();
        m
    };
    let (mut fused, mut unfused) = (build(a), build(b));
    let x = Tensor::from_slice_on(&common::values(5 * 9 * 10 * 3, 9), &[5, 9, 10, 3], a).unwrap();
    let y = Tensor::from_slice_on(&[0i32, 2, 1, 2, 0], &[5], a).unwrap();
    // Which gradient ops ran, from the placement log.
    let ops = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&ops);
    rt.set_placement_callback(Some(move |r: &PlacementRecord| {
        sink.lock().unwrap().push(r.op)
    }));
    rt.set_log_device_placement(true);
    let ran = |model: &mut Sequential| {
        ops.lock().unwrap().clear();
        let out = model.loss_and_gradients(&x, &y).unwrap();
        let ops = ops.lock().unwrap();
        let count = |name: &str| ops.iter().filter(|&&op| op == name).count();
        (
            out,
            count("FusedSeparableConv2DMaxPoolGradWithArgmax"),
            count("MaxPoolGrad"),
        )
    };
    let ((loss_f, grads_f), fused_ops, pool_grads) = ran(&mut fused);
    assert_eq!(
        (fused_ops, pool_grads),
        (2, 0),
        "one device: both pairs fused"
    );
    let ((loss_u, grads_u), fused_ops, pool_grads) = ran(&mut unfused);
    assert_eq!(
        (fused_ops, pool_grads),
        (0, 2),
        "pools elsewhere: nothing fused"
    );
    rt.set_log_device_placement(false);
    assert!((loss_f - loss_u).abs() <= 1e-6, "{loss_f} vs {loss_u}");
    assert_eq!(grads_f.len(), grads_u.len());
    for (i, (f, u)) in grads_f.iter().zip(&grads_u).enumerate() {
        let (f, u) = (f.to_vec::<f32>().unwrap(), u.to_vec::<f32>().unwrap());
        assert!(f.iter().any(|&v| v != 0.0), "gradient {i} is all zeros");
        for (j, (f, u)) in f.iter().zip(&u).enumerate() {
            assert!(
                (f - u).abs() <= 1e-5 * u.abs().max(1.0),
                "gradient {i}[{j}]: fused {f} vs unfused {u}"
            );
        }
    }
}

/// A layer that runs `L` and records the plans its fused backward pass is given.
#[derive(Debug, Clone)]
struct Recorded<L> {
    layer: L,
    plans: Arc<Mutex<Vec<nn::BackwardPlan>>>,
}

impl<L: Layer + Clone + 'static> Layer for Recorded<L> {
    fn class_name(&self) -> &'static str {
        self.layer.class_name()
    }
    fn base_name(&self) -> &'static str {
        self.layer.base_name()
    }
    fn declared_input_shape(&self) -> Option<&[usize]> {
        self.layer.declared_input_shape()
    }
    fn compute_output_shape(&self, input_shape: &[usize]) -> anygpu::Result<Vec<usize>> {
        self.layer.compute_output_shape(input_shape)
    }
    fn build(&mut self, shape: &[usize], seed: u64, device: &LogicalDevice) -> anygpu::Result<()> {
        self.layer.build(shape, seed, device)
    }
    fn weights(&self) -> Vec<(&'static str, &Tensor)> {
        self.layer.weights()
    }
    fn set_weight(&mut self, index: usize, value: Tensor) -> anygpu::Result<()> {
        self.layer.set_weight(index, value)
    }
    fn forward(&self, x: &Tensor) -> anygpu::Result<(Tensor, Vec<Tensor>)> {
        self.layer.forward(x)
    }
    fn call_through_max_pool(
        &self,
        x: &Tensor,
        training: bool,
    ) -> anygpu::Result<Option<(Tensor, Vec<Tensor>, Option<Tensor>)>> {
        self.layer.call_through_max_pool(x, training)
    }
    fn backward(
        &self,
        saved: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> anygpu::Result<(Option<Tensor>, Vec<Tensor>)> {
        self.layer.backward(saved, dy, need_dx)
    }
    fn backward_through_max_pool(
        &self,
        saved: &[Tensor],
        dpooled: &Tensor,
        need_dx: bool,
    ) -> anygpu::Result<Option<(Option<Tensor>, Vec<Tensor>)>> {
        self.layer
            .backward_through_max_pool(saved, dpooled, need_dx)
    }
    fn preactivation_grad(&self) -> Option<anygpu::ops::spec::Activation> {
        self.layer.preactivation_grad()
    }
    fn backward_fused(
        &self,
        saved: &[Tensor],
        dy: &Tensor,
        plan: nn::BackwardPlan,
    ) -> anygpu::Result<Option<nn::FusedGrads>> {
        self.plans.lock().unwrap().push(plan);
        self.layer.backward_fused(saved, dy, plan)
    }
    fn boxed_clone(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }
}

#[test]
fn layers_fused_at_their_seams_give_the_unfused_gradients() {
    // On one CPU: each separable layer pools its output on the way forward, and each layer
    // applies the activation gradient of the layer below as it writes its input gradient, so
    // that layer starts from its pre-activation gradient. With every other layer on another
    // (virtual) CPU nothing is fused. Batch 12 of 14×14 images: enough images for the
    // kernels' block-by-block paths.
    let rt = cpu_runtime(2);
    let cpus = rt.list_logical_devices("CPU").unwrap();
    let (a, b) = (&cpus[0], &cpus[1]);
    let selu = Activation::Selu;
    let sep = |filters, act| {
        SeparableConv2D::new(filters, 3)
            .padding(Padding::Same)
            .activation(act)
    };
    let build = |other: &LogicalDevice, plans: &Arc<Mutex<Vec<nn::BackwardPlan>>>| {
        let record = |layer| Recorded {
            layer,
            plans: Arc::clone(plans),
        };
        let conv = Conv2D::new(8, 3)
            .padding(Padding::Same)
            .activation(selu)
            .input_shape(&[14, 14, 2]);
        let layers: Vec<Box<dyn Layer>> = vec![
            Box::new(conv),
            Box::new(record(sep(16, selu))),
            Box::new(MaxPool2D::new()),
            Box::new(record(sep(16, Activation::Relu))),
            Box::new(record(sep(32, selu))),
            Box::new(record(sep(32, selu))),
            Box::new(MaxPool2D::new()),
            Box::new(Flatten::new()),
            Box::new(Dense::new(5).activation(Activation::Softmax)),
        ];
        // Layer `k` on `a` when `k` is even, on `other` when odd.
        let mut m = Sequential::with_seed(8);
        for (k, layer) in layers.into_iter().enumerate() {
            m.add_boxed(if k % 2 == 0 { a } else { other }, layer)
                .unwrap();
        }
        m.compile(Loss::sparse_categorical_crossentropy(), Sgd::default(), &[])
            .unwrap();
        m
    };
    let (fused_plans, unfused_plans) = (Arc::default(), Arc::default());
    let (mut fused, mut unfused) = (build(a, &fused_plans), build(b, &unfused_plans));
    let x = common::values(12 * 14 * 14 * 2, 4);
    let x = Tensor::from_slice_on(&x, &[12, 14, 14, 2], a).unwrap();
    let labels: Vec<i32> = (0..12).map(|i| i % 5).collect();
    let y = Tensor::from_slice_on(&labels, &[12], a).unwrap();
    let ops = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&ops);
    rt.set_placement_callback(Some(move |r: &PlacementRecord| {
        sink.lock().unwrap().push(r.op)
    }));
    rt.set_log_device_placement(true);
    let ran = |model: &mut Sequential| {
        ops.lock().unwrap().clear();
        let out = model.loss_and_gradients(&x, &y).unwrap();
        let pools = ops
            .lock()
            .unwrap()
            .iter()
            .filter(|&&op| op == "FusedSeparableConv2DMaxPoolWithArgmax")
            .count();
        (out, pools)
    };
    let ((loss_f, grads_f), pooled_f) = ran(&mut fused);
    let ((loss_u, grads_u), pooled_u) = ran(&mut unfused);
    rt.set_log_device_placement(false);
    assert_eq!(
        (pooled_f, pooled_u),
        (2, 0),
        "pools fused forward on one device only"
    );

    let plan = |through_max_pool, dy_preactivated, input_activation| nn::BackwardPlan {
        need_dx: true,
        through_max_pool,
        dy_preactivated,
        input_activation,
    };
    use anygpu::ops::spec::Activation as Op;
    // From the top: the fourth separable layer, through its pool, differentiates the third's
    // SELU; the third starts from its pre-activated gradient and differentiates the second's
    // ReLU; the second starts from its pre-activated gradient (a pool below it); the first,
    // through its pool, differentiates the convolution's SELU, which then starts from its
    // pre-activated gradient.
    assert_eq!(
        *fused_plans.lock().unwrap(),
        [
            plan(true, false, Op::Selu),
            plan(false, true, Op::Relu),
            plan(false, true, Op::Linear),
            plan(true, false, Op::Selu),
        ]
    );
    assert!(
        unfused_plans.lock().unwrap().is_empty(),
        "no seam on one device"
    );

    assert_fused_matches_unfused((loss_f, &grads_f), (loss_u, &grads_u));
}

#[test]
fn training_the_tutorial_cnn_on_the_cpu_is_reproducible_bit_for_bit() {
    // Parallel reductions (kernel and bias gradients) must not round differently from run to
    // run: a resumed run must match an uninterrupted one, and two runs each other.
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    let _s = cpu.scope();
    let (x, y) = common::synthetic(128 * 2, 7);
    let (x, y): (Vec<f32>, Vec<i32>) = (
        x.iter().cycle().take(128 * 784).copied().collect(),
        y.iter().cycle().take(128).copied().collect(),
    );
    let xb = Tensor::from_slice_on(&x, &[128, 28, 28, 1], &cpu).unwrap();
    let yb = Tensor::from_slice_on(&y, &[128], &cpu).unwrap();
    let train = || {
        let mut model = anygpu::nn::tutorial_cnn(11, &[]).unwrap();
        model
            .compile(
                Loss::sparse_categorical_crossentropy(),
                Sgd::new(0.05).momentum(0.9),
                &[],
            )
            .unwrap();
        for _ in 0..3 {
            model.train_on_batch(&xb, &yb).unwrap();
        }
        model.get_weights().unwrap()
    };
    // More threads than cores: how rayon splits work then varies most from run to run.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(8)
        .build()
        .unwrap();
    let first = pool.install(train);
    for run in 1..4 {
        let again = pool.install(train);
        for (i, (a, b)) in first.iter().zip(&again).enumerate() {
            let same =
                a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "run {run}: weight {i} differs from the first run's");
        }
    }
}

#[test]
fn sgd_reduces_the_loss_on_a_small_synthetic_problem() {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    let mut model = small_cnn(11, [&cpu, &cpu, &cpu]).unwrap();
    model
        .compile(
            Loss::sparse_categorical_crossentropy(),
            Sgd::new(0.05),
            &[Metric::Accuracy],
        )
        .unwrap();
    model.set_verbose(Verbosity::Silent);
    let (x, y) = common::synthetic(64, 1);
    let train = Dataset::from_tensor_slices(x, &[8, 8, 1], y)
        .unwrap()
        .shuffle(64, 3)
        .repeat(None)
        .batch(16, true);
    let history = model.fit(&train, 4, Some(4), None).unwrap();
    assert_eq!(history.epochs(), 4);
    assert_eq!(history.accuracy.len(), 4);
    assert!(history.val_loss.is_empty());
    let (first, last) = (history.loss[0], history.loss[3]);
    assert!(
        last < 0.8 * first,
        "the loss should fall over 16 SGD steps: {:?}",
        history.loss
    );
    assert!(history.accuracy[3] > history.accuracy[0] || history.accuracy[3] > 0.9);
    assert_eq!(model.iterations(), 16);
}

/// Trains `model` on fixed batches and returns each step's loss.
fn losses(model: &mut Sequential, device: &LogicalDevice, steps: usize) -> Vec<f32> {
    let (x, y) = common::synthetic(8 * steps, 5);
    (0..steps)
        .map(|s| {
            let xb = Tensor::from_slice_on(&x[s * 8 * 64..(s + 1) * 8 * 64], &[8, 8, 8, 1], device)
                .unwrap();
            let yb = Tensor::from_slice_on(&y[s * 8..(s + 1) * 8], &[8], device).unwrap();
            model.train_on_batch(&xb, &yb).unwrap()
        })
        .collect()
}

fn one_device_vs_split(rt: &Runtime, kind: &str) {
    let devices = rt.list_logical_devices(kind).unwrap();
    assert!(devices.len() >= 3, "three logical {kind}s");
    let (d0, d1, d2) = (&devices[0], &devices[1], &devices[2]);
    let optimizer = Sgd::new(0.05).momentum(0.9);
    let mut single = small_cnn(21, [d0, d0, d0]).unwrap();
    let mut split = small_cnn(21, [d0, d1, d2]).unwrap();
    for m in [&mut single, &mut split] {
        m.compile(
            Loss::sparse_categorical_crossentropy(),
            optimizer.clone(),
            &[Metric::Accuracy],
        )
        .unwrap();
    }
    assert_eq!(
        single.get_weights().unwrap(),
        split.get_weights().unwrap(),
        "same seed, same weights"
    );
    let a = losses(&mut single, d0, 4);
    let b = losses(&mut split, d0, 4);
    eprintln!("{kind}: one device {a:?}\n{kind}: split {b:?}");
    for (s, (a, b)) in a.iter().zip(&b).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4,
            "step {s}: one device {a} vs split {b}"
        );
    }
    assert!(a[3] < a[0], "the loss falls: {a:?}");
    // Weights (updated in place) stayed on their layers' devices.
    let infos = split.layer_infos();
    for (i, info) in infos.iter().enumerate() {
        for (name, w) in split.layer(i).unwrap().weights() {
            assert!(
                w.device().ends_with(&info.device[1..]),
                "{}/{name} left {}",
                info.name,
                info.device
            );
        }
    }
    assert_eq!(infos[7].device, d2.name());
    let (wa, wb) = (single.get_weights().unwrap(), split.get_weights().unwrap());
    for (x, y) in wa.iter().flatten().zip(wb.iter().flatten()) {
        assert!((x - y).abs() <= 1e-4);
    }
}

#[test]
fn a_model_split_over_three_logical_devices_trains_like_one_device() {
    match common::gpus_at_least(
        1,
        "a_model_split_over_three_logical_devices_trains_like_one_device",
    ) {
        Some(_) => {
            let rt = common::builder()
                .virtual_gpus(0, &[256, 256, 256])
                .build()
                .expect("three virtual GPUs of 256 MiB");
            one_device_vs_split(&rt, "GPU");
        }
        None => one_device_vs_split(&cpu_runtime(3), "CPU"),
    }
}

#[test]
fn a_model_split_over_three_virtual_cpus_trains_like_one_cpu() {
    one_device_vs_split(&cpu_runtime(3), "CPU");
}

#[test]
fn weights_round_trip_through_a_safetensors_file() {
    let rt = cpu_runtime(2);
    let (c0, c1) = (rt.device("CPU:0").unwrap(), rt.device("CPU:1").unwrap());
    let mut trained = small_cnn(5, [&c0, &c0, &c1]).unwrap();
    trained
        .compile(
            Loss::sparse_categorical_crossentropy(),
            Adam::default(),
            &[],
        )
        .unwrap();
    losses(&mut trained, &c0, 1);
    let path = temp_path("round-trip.safetensors");
    trained.save_weights(&path).unwrap();

    let mut fresh = small_cnn(99, [&c1, &c1, &c0]).unwrap();
    assert_ne!(fresh.get_weights().unwrap(), trained.get_weights().unwrap());
    fresh.load_weights(&path).unwrap();
    assert_eq!(fresh.get_weights().unwrap(), trained.get_weights().unwrap());
    // Loaded weights land on each layer's own device.
    assert!(fresh.weights()[0].device().ends_with("CPU:1"));
    assert!(fresh.weights().last().unwrap().device().ends_with("CPU:0"));
    // The same predictions.
    let x = Tensor::from_slice_on(&common::values(2 * 64, 9), &[2, 8, 8, 1], &c0).unwrap();
    let (p, q) = (trained.predict(&x).unwrap(), fresh.predict(&x).unwrap());
    assert_eq!(p.to_vec::<f32>().unwrap(), q.to_vec::<f32>().unwrap());
    let _ = std::fs::remove_file(&path);
}

#[test]
fn loading_weights_of_another_shape_fails_and_names_the_weight() {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    let small = small_cnn(1, [&cpu, &cpu, &cpu]).unwrap();
    let path = temp_path("shape-mismatch.safetensors");
    small.save_weights(&path).unwrap();

    let mut wider = Sequential::with_seed(1);
    wider
        .add_on(
            &cpu,
            Conv2D::new(5, 3)
                .padding(Padding::Same)
                .input_shape(&[8, 8, 1]),
        )
        .unwrap();
    let before = wider.get_weights().unwrap();
    let err = wider.load_weights(&path).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Model(_)), "{err:?}");
    assert!(
        msg.contains("conv2d/kernel")
            && msg.contains("[3, 3, 1, 4]")
            && msg.contains("[3, 3, 1, 5]"),
        "the error names the weight and both shapes: {msg}"
    );
    assert_eq!(
        wider.get_weights().unwrap(),
        before,
        "a failed load changes nothing"
    );

    let missing = wider
        .load_weights(temp_path("does-not-exist.safetensors"))
        .unwrap_err();
    assert!(matches!(missing, Error::Io { .. }), "{missing:?}");
    std::fs::write(&path, b"not a safetensors file").unwrap();
    assert!(matches!(wider.load_weights(&path), Err(Error::Model(_))));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn evaluate_and_predict_return_keras_shapes() {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    let mut model = small_cnn(2, [&cpu, &cpu, &cpu]).unwrap();
    model
        .compile(
            Loss::sparse_categorical_crossentropy(),
            Sgd::default(),
            &[Metric::Accuracy],
        )
        .unwrap();
    let (x, y) = common::synthetic(10, 4);
    let data = Dataset::from_tensor_slices(x.clone(), &[8, 8, 1], y)
        .unwrap()
        .batch(4, false);
    let eval = model.evaluate(&data, None).unwrap();
    assert_eq!(eval.examples, 10);
    assert!(eval.loss.is_finite() && eval.loss > 0.0);
    let acc = eval.accuracy.expect("compiled with accuracy");
    assert!((0.0..=1.0).contains(&acc));

    let xb = Tensor::from_slice_on(&x, &[10, 8, 8, 1], &cpu).unwrap();
    let probs = model.predict(&xb).unwrap();
    assert_eq!(probs.shape(), &[10, 3]);
    for row in probs.to_vec::<f32>().unwrap().chunks(3) {
        assert!(
            (row.iter().sum::<f32>() - 1.0).abs() < 1e-5,
            "softmax rows sum to 1: {row:?}"
        );
        assert!(row.iter().all(|p| *p > 0.0));
    }
    let wrong = Tensor::from_slice_on(&vec![0.0f32; 2 * 7 * 7], &[2, 7, 7, 1], &cpu).unwrap();
    assert!(matches!(
        model.predict(&wrong),
        Err(Error::ShapeMismatch { .. })
    ));
}

#[test]
fn misuse_is_an_error_not_a_panic() {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    let mut model = small_cnn(2, [&cpu, &cpu, &cpu]).unwrap();
    let (x, y) = common::synthetic(4, 4);
    let data = Dataset::from_tensor_slices(x, &[8, 8, 1], y).unwrap();
    // fit before compile.
    assert!(matches!(
        model.fit(&data.clone().batch(2, false), 1, None, None),
        Err(Error::Model(_))
    ));
    model
        .compile(Loss::sparse_categorical_crossentropy(), Sgd::default(), &[])
        .unwrap();
    model.set_verbose(Verbosity::Silent);
    // An unbatched dataset, an infinite one without steps.
    assert!(matches!(
        model.fit(&data, 1, None, None),
        Err(Error::InvalidArgument(_))
    ));
    let forever = data.clone().repeat(None).batch(2, false);
    assert!(matches!(
        model.fit(&forever, 1, None, None),
        Err(Error::InvalidArgument(_))
    ));
    assert!(model.fit(&forever, 1, Some(2), None).is_ok());
    // A layer after the softmax; a Dense layer on images.
    assert!(matches!(
        model.add_on(&cpu, Dense::new(2)),
        Err(Error::InvalidArgument(_))
    ));
    let mut m = Sequential::new();
    m.add_on(&cpu, Conv2D::new(2, 3).input_shape(&[8, 8, 1]))
        .unwrap();
    assert!(matches!(
        m.add_on(&cpu, Dense::new(2)),
        Err(Error::ShapeMismatch { .. })
    ));
    assert_eq!(m.len(), 1, "a failed add leaves the model unchanged");
    // A loss that does not fit the last layer; bad hyper-parameters.
    assert!(m
        .compile(Loss::sparse_categorical_crossentropy(), Sgd::default(), &[])
        .is_err());
    assert!(m
        .compile(
            Loss::SparseCategoricalCrossentropy { from_logits: true },
            Sgd::new(-1.0),
            &[]
        )
        .is_err());
    assert!(m
        .compile(
            Loss::SparseCategoricalCrossentropy { from_logits: true },
            Sgd::default().momentum(1.5),
            &[]
        )
        .is_err());
    // Keras' SGD takes momentum in [0, 1], 1 included.
    assert!(m
        .compile(
            Loss::SparseCategoricalCrossentropy { from_logits: true },
            Sgd::default().momentum(1.0),
            &[]
        )
        .is_ok());
    assert!("mish".parse::<Activation>().is_err());
}

#[test]
fn a_first_convolution_run_inside_the_separable_layer_after_it_gives_the_unfused_gradients() {
    // On one CPU the first Conv2D, the SeparableConv2D after it and the pool run as one op
    // each way, the convolution's output never stored; with the separable layer on another
    // (virtual) CPU they run one by one. Batch 12 of 14×14 images: enough images for the
    // kernels' block-by-block paths.
    let rt = cpu_runtime(2);
    let cpus = rt.list_logical_devices("CPU").unwrap();
    let selu = Activation::Selu;
    let build = |second: &LogicalDevice| {
        let layers: Vec<Box<dyn Layer>> = vec![
            Box::new(
                Conv2D::new(8, 3)
                    .padding(Padding::Same)
                    .activation(selu)
                    .input_shape(&[14, 14, 2]),
            ),
            Box::new(
                SeparableConv2D::new(16, 3)
                    .padding(Padding::Same)
                    .activation(Activation::Relu),
            ),
            Box::new(MaxPool2D::new()),
            Box::new(Flatten::new()),
            Box::new(Dense::new(5).activation(Activation::Softmax)),
        ];
        let mut m = Sequential::with_seed(9);
        for (k, layer) in layers.into_iter().enumerate() {
            m.add_boxed(if k == 1 { second } else { &cpus[0] }, layer)
                .unwrap();
        }
        m.compile(Loss::sparse_categorical_crossentropy(), Sgd::default(), &[])
            .unwrap();
        m
    };
    let (mut fused, mut unfused) = (build(&cpus[0]), build(&cpus[1]));
    let x = common::values(12 * 14 * 14 * 2, 5);
    let x = Tensor::from_slice_on(&x, &[12, 14, 14, 2], &cpus[0]).unwrap();
    let labels: Vec<i32> = (0..12).map(|i| i % 5).collect();
    let y = Tensor::from_slice_on(&labels, &[12], &cpus[0]).unwrap();
    let ops = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&ops);
    rt.set_placement_callback(Some(move |r: &PlacementRecord| {
        sink.lock().unwrap().push(r.op)
    }));
    rt.set_log_device_placement(true);
    let ran = |model: &mut Sequential| {
        ops.lock().unwrap().clear();
        let out = model.loss_and_gradients(&x, &y).unwrap();
        let ops = ops.lock().unwrap();
        let count = |name| ops.iter().filter(|&&op| op == name).count();
        let stems = (
            count("FusedConv2DSeparableConv2DMaxPoolWithArgmax"),
            count("FusedConv2DSeparableConv2DMaxPoolGradWithArgmax"),
        );
        (out, stems)
    };
    let ((loss_f, grads_f), stems_f) = ran(&mut fused);
    let ((loss_u, grads_u), stems_u) = ran(&mut unfused);
    let predicted = fused.predict(&x).unwrap();
    rt.set_log_device_placement(false);
    assert_eq!(
        (stems_f, stems_u),
        ((1, 1), (0, 0)),
        "one op each way, on one device only"
    );
    assert_eq!(
        predicted.to_vec::<f32>().unwrap(),
        unfused.predict(&x).unwrap().to_vec::<f32>().unwrap(),
        "inference runs the same kernels"
    );

    assert_fused_matches_unfused((loss_f, &grads_f), (loss_u, &grads_u));
}

/// A fused model's loss and gradients against the unfused one's: within 1e-6, none all zeros.
fn assert_fused_matches_unfused(
    (loss_f, grads_f): (f32, &[Tensor]),
    (loss_u, grads_u): (f32, &[Tensor]),
) {
    assert!((loss_f - loss_u).abs() <= 1e-6, "{loss_f} vs {loss_u}");
    assert_eq!(grads_f.len(), grads_u.len());
    for (i, (f, u)) in grads_f.iter().zip(grads_u).enumerate() {
        let (f, u) = (f.to_vec::<f32>().unwrap(), u.to_vec::<f32>().unwrap());
        assert!(f.iter().any(|&v| v != 0.0), "gradient {i} is all zeros");
        for (j, (f, u)) in f.iter().zip(&u).enumerate() {
            assert!(
                (f - u).abs() <= 1e-6 * u.abs().max(1.0),
                "gradient {i}[{j}]: fused {f} vs unfused {u}"
            );
        }
    }
}
