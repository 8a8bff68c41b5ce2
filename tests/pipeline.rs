//! Pipelined model parallelism (GPipe, 1F1B): the same losses and weights as the serial step
//! for 1, 2, 4 and 8 micro-batches and for batches they do not divide, on two 1-thread virtual
//! CPUs, on two virtual GPUs cut from one adapter and across two adapters; 1F1B's bits equal
//! GPipe's; a stage out of memory fails the step naming its device and changes nothing; 1F1B
//! keeps less activation memory alive than GPipe.

mod common;

use std::sync::{Arc, Mutex};

use anygpu::data::Dataset;
use anygpu::nn::{
    Activation, Adam, Conv2D, Dense, Flatten, Layer, Loss, MaxPool2D, Metric, Pipeline, Schedule,
    SeparableConv2D, Sequential, Verbosity,
};
use anygpu::ops::spec::Padding;
use anygpu::{
    DeviceKind, Error, LogicalDevice, LogicalDeviceConfiguration, PlacementRecord, Runtime, Tensor,
};

/// The layers of a small CNN with every layer type (input 8×8×1, 3 classes).
fn layers() -> Vec<Box<dyn Layer>> {
    let selu = Activation::Selu;
    vec![
        Box::new(
            Conv2D::new(4, 3)
                .padding(Padding::Same)
                .activation(selu)
                .input_shape(&[8, 8, 1]),
        ),
        Box::new(
            SeparableConv2D::new(6, 3)
                .padding(Padding::Same)
                .activation(selu),
        ),
        Box::new(MaxPool2D::new()),
        Box::new(Flatten::new()),
        Box::new(Dense::new(12).activation(selu)),
        Box::new(Dense::new(3).activation(Activation::Softmax)),
    ]
}

/// Two stages: the convolutions (and their pool, fused with the separable layer's backward)
/// on the first device, the dense layers on the second.
const TWO_STAGES: [usize; 6] = [0, 0, 0, 1, 1, 1];
/// Three stages on two devices, as the tutorial's split wraps: the pool starts stage 1 (so it
/// cannot fuse with the layer before it) and the last layer goes back to the first device.
const THREE_STAGES: [usize; 6] = [0, 0, 1, 1, 1, 0];

/// The small CNN with layer `i` on `devices[placement[i]]`, compiled with Adam.
fn model(devices: &[LogicalDevice], placement: &[usize]) -> Sequential {
    let mut m = Sequential::with_seed(5);
    for (layer, &d) in layers().into_iter().zip(placement) {
        m.add_boxed(&devices[d], layer).expect("a layer builds");
    }
    m.compile(
        Loss::sparse_categorical_crossentropy(),
        Adam::new(0.01),
        &[Metric::Accuracy],
    )
    .expect("compiles");
    m.set_verbose(Verbosity::Silent);
    m
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / w.abs().max(1.0);
        assert!(err <= tol, "{what}[{i}]: {g} vs {w} (error {err:e})");
    }
}

/// `steps` batches of `batch` examples: x on `first`, labels on `last`.
fn batches(
    batch: usize,
    steps: usize,
    first: &LogicalDevice,
    last: &LogicalDevice,
) -> Vec<(Tensor, Tensor)> {
    let (x, y) = common::synthetic(batch * steps, 11);
    (0..steps)
        .map(|s| {
            let rows = s * batch..(s + 1) * batch;
            (
                Tensor::from_slice_on(&x[rows.start * 64..rows.end * 64], &[batch, 8, 8, 1], first)
                    .expect("x uploads"),
                Tensor::from_slice_on(&y[rows], &[batch], last).expect("y uploads"),
            )
        })
        .collect()
}

/// Losses and final weights of a few training steps, with `pipeline` or serially.
fn train(
    devices: &[LogicalDevice],
    placement: &[usize],
    pipeline: Option<Pipeline>,
    data: &[(Tensor, Tensor)],
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let mut m = model(devices, placement);
    m.set_pipeline(pipeline).expect("a valid pipeline");
    let losses = data
        .iter()
        .map(|(x, y)| m.train_on_batch(x, y).expect("a training step"))
        .collect();
    assert_eq!(m.iterations(), data.len() as u64);
    (losses, m.get_weights().expect("weights"))
}

/// Pipelined training equals serial training (and 1F1B equals GPipe) on `devices`, for both
/// placements, M = 1, 2, 4, 8 and batches of 16 (divided by every M) and 10 (divided by none
/// but 1 and 2). `tol` is the relative tolerance against serial; with `exact_schedules`, 1F1B
/// must give GPipe's bits (every kernel deterministic, sums in the same order).
fn pipeline_trains_like_serial(devices: &[LogicalDevice], tol: f32, exact_schedules: bool) {
    for placement in [&TWO_STAGES[..], &THREE_STAGES[..]] {
        let last = &devices[placement[placement.len() - 1]];
        for batch in [16, 10] {
            let data = batches(batch, 3, &devices[0], last);
            let (serial_losses, serial_weights) = train(devices, placement, None, &data);
            for m in [1, 2, 4, 8] {
                let what = format!("{placement:?} batch {batch} M={m}");
                let (losses, weights) = train(devices, placement, Some(Pipeline::gpipe(m)), &data);
                if m == 1 {
                    // One micro-batch is the serial step, op for op.
                    assert_eq!(losses, serial_losses, "{what}: losses");
                    assert_eq!(weights, serial_weights, "{what}: weights");
                }
                assert_close(&format!("{what}: losses"), &losses, &serial_losses, tol);
                for (i, (g, w)) in weights.iter().zip(&serial_weights).enumerate() {
                    assert_close(&format!("{what}: weight {i}"), g, w, tol);
                }
                let (losses_1f1b, weights_1f1b) =
                    train(devices, placement, Some(Pipeline::one_f_one_b(m)), &data);
                if exact_schedules {
                    assert_eq!(losses_1f1b, losses, "{what}: 1F1B losses vs GPipe");
                    assert_eq!(weights_1f1b, weights, "{what}: 1F1B weights vs GPipe");
                } else {
                    assert_close(&format!("{what}: 1F1B losses"), &losses_1f1b, &losses, tol);
                    for (i, (g, w)) in weights_1f1b.iter().zip(&weights).enumerate() {
                        assert_close(&format!("{what}: 1F1B weight {i}"), g, w, tol);
                    }
                }
            }
        }
    }
}

/// A runtime with two logical CPUs of one thread each.
fn two_cpus() -> (Runtime, Vec<LogicalDevice>) {
    let rt = common::builder().configure().expect("a runtime");
    let cpu = rt.list_physical_devices(DeviceKind::Cpu)[0].clone();
    let one = LogicalDeviceConfiguration::new().threads(1);
    rt.set_logical_device_configuration(&cpu, &[one, one])
        .expect("two CPUs");
    let cpus = rt.list_logical_devices("CPU").expect("CPUs");
    (rt, cpus)
}

/// A runtime whose GPU:0 is cut into virtual GPUs of `mib`, or `None` (skipped) without a GPU.
fn virtual_gpus(mib: &[u64], test: &str) -> Option<(Runtime, Vec<LogicalDevice>)> {
    common::gpus_at_least(1, test)?;
    let rt = common::builder()
        .visible_gpus(&[0])
        .virtual_gpus(0, mib)
        .build()
        .expect("a GPU runtime builds");
    let gpus = rt.list_logical_devices("GPU").expect("GPUs");
    Some((rt, gpus))
}

#[test]
fn pipelines_train_like_serial_on_two_virtual_cpus() {
    let (_rt, cpus) = two_cpus();
    pipeline_trains_like_serial(&cpus, 1e-4, true);
}

#[test]
fn pipelines_train_like_serial_on_two_virtual_gpus() {
    let Some((_rt, gpus)) = virtual_gpus(&[64, 64], "pipelines_train_like_serial_on_virtual_gpus")
    else {
        return;
    };
    pipeline_trains_like_serial(&gpus, 1e-4, false);
}

#[test]
fn pipelines_train_like_serial_across_two_adapters() {
    if common::gpus_at_least(2, "pipelines_train_like_serial_across_two_adapters").is_none() {
        return;
    }
    let rt = common::builder()
        .memory_growth(true)
        .build()
        .expect("a runtime");
    let gpus = rt.list_logical_devices("GPU").expect("GPUs");
    pipeline_trains_like_serial(&gpus[..2], 1e-4, false);
}

#[test]
fn fit_pipelines_host_batches_like_the_serial_fit() {
    let (_rt, cpus) = two_cpus();
    let (x, y) = common::synthetic(50, 3);
    // 50 examples in batches of 16: the last batch (2 rows) is smaller than M.
    let data = Dataset::from_tensor_slices(x, &[8, 8, 1], y)
        .expect("a dataset")
        .batch(16, false);
    let fit = |pipeline: Option<Pipeline>| {
        let mut m = model(&cpus, &TWO_STAGES);
        m.set_pipeline(pipeline).expect("a valid pipeline");
        let history = m.fit(&data, 2, None, None).expect("fit");
        (history, m.get_weights().expect("weights"))
    };
    let (serial, serial_weights) = fit(None);
    let (piped, weights) = fit(Some(Pipeline::one_f_one_b(4)));
    let to_f32 = |v: &[f64]| v.iter().map(|&l| l as f32).collect::<Vec<_>>();
    assert_close("loss", &to_f32(&piped.loss), &to_f32(&serial.loss), 1e-4);
    assert_eq!(piped.accuracy, serial.accuracy, "same predictions");
    for (i, (g, w)) in weights.iter().zip(&serial_weights).enumerate() {
        assert_close(&format!("weight {i}"), g, w, 1e-4);
    }
}

#[test]
fn stage_stats_and_the_placement_log_name_stage_and_micro_batch() {
    let (rt, cpus) = two_cpus();
    let mut m = model(&cpus, &THREE_STAGES);
    m.set_pipeline(Pipeline::one_f_one_b(4)).expect("pipeline");
    let data = batches(8, 1, &cpus[0], &cpus[0]);
    let log = Arc::new(Mutex::new(Vec::<PlacementRecord>::new()));
    let sink = Arc::clone(&log);
    rt.set_log_device_placement(true);
    rt.set_placement_callback(Some(move |r: &PlacementRecord| {
        sink.lock().expect("log lock").push(r.clone())
    }));
    m.train_on_batch(&data[0].0, &data[0].1).expect("a step");
    rt.set_log_device_placement(false);

    let stats = m.pipeline_stats();
    let layout: Vec<_> = stats
        .iter()
        .map(|s| (s.layers.clone(), s.device.as_str()))
        .collect();
    assert_eq!(
        layout,
        [
            (0..2, "/device:CPU:0"),
            (2..5, "/device:CPU:1"),
            (5..6, "/device:CPU:0")
        ]
    );
    assert!(stats.iter().all(|s| !s.busy.is_zero()), "{stats:?}");

    let log = log.lock().expect("log lock");
    for stage in 0..3 {
        for micro in 0..4 {
            assert!(
                log.iter().any(|r| r.pipeline == Some((stage, micro))),
                "no op logged for stage {stage}, micro-batch {micro}"
            );
        }
    }
    let on_stage_1 = log
        .iter()
        .filter(|r| r.pipeline.is_some_and(|(s, _)| s == 1))
        .all(|r| r.device.ends_with("CPU:1"));
    assert!(on_stage_1, "stage 1 runs on CPU:1");
    assert!(log.iter().all(|r| r.pipeline.is_none_or(|(_, mb)| mb < 4)));
}

#[test]
fn pipeline_settings_are_checked() {
    let (_rt, cpus) = two_cpus();
    let mut m = model(&cpus, &TWO_STAGES);
    let err = m
        .set_pipeline(Pipeline::gpipe(0))
        .expect_err("0 micro-batches");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("at least 1 micro-batch"), "{err}");
    assert_eq!(m.pipeline(), None, "unchanged on error");
    m.set_pipeline(Pipeline::one_f_one_b(3)).expect("pipeline");
    assert_eq!(m.pipeline().map(|p| p.micro_batches()), Some(3));
    assert_eq!(m.pipeline().map(|p| p.schedule()), Some(Schedule::OneFOneB));

    // An empty batch: no micro-batches, the serial answer (a NaN loss, zero gradients).
    let cpu = &cpus[0];
    let x = Tensor::from_slice_on(&[0.0f32; 0], &[0, 8, 8, 1], cpu).expect("x");
    let y = Tensor::from_slice_on(&[0i32; 0], &[0], cpu).expect("y");
    let (loss, grads) = m.loss_and_gradients(&x, &y).expect("an empty batch");
    let (serial_loss, serial) = model(&cpus, &TWO_STAGES)
        .loss_and_gradients(&x, &y)
        .expect("serially");
    assert_eq!(
        loss.is_nan(),
        serial_loss.is_nan(),
        "{loss} vs {serial_loss}"
    );
    assert_eq!(grads.len(), serial.len());
    for (g, s) in grads.iter().zip(&serial) {
        let (g, s) = (g.to_vec::<f32>().unwrap(), s.to_vec::<f32>().unwrap());
        assert_eq!(g, s, "an empty batch's gradients");
    }

    let strategy = anygpu::distribute::MirroredStrategy::with_devices(&cpus).expect("strategy");
    let mut mirrored = strategy
        .scope(|| {
            let mut m = Sequential::new();
            m.add(Dense::new(2).input_shape(&[3]))?;
            Ok::<_, Error>(m)
        })
        .expect("scope")
        .expect("model");
    let err = mirrored
        .set_pipeline(Pipeline::gpipe(2))
        .expect_err("a mirrored model has nothing to pipeline");
    assert!(err.to_string().contains("MirroredStrategy"), "{err}");
}

#[test]
fn a_stage_out_of_memory_fails_the_step_naming_its_device_and_changes_nothing() {
    let Some((_rt, gpus)) = virtual_gpus(&[64, 1], "a_stage_out_of_memory_fails_the_step") else {
        return;
    };
    // The convolutions (large activations) on the 1 MiB GPU:1, the first layer on GPU:0.
    let mut m = model(&gpus, &[0, 1, 1, 1, 1, 1]);
    let before = m.get_weights().expect("weights");
    for pipeline in [Pipeline::gpipe(2), Pipeline::one_f_one_b(2)] {
        m.set_pipeline(pipeline).expect("pipeline");
        // 1024 examples: a micro-batch's 512 × 8×8×6 separable outputs alone are 768 KiB.
        let data = batches(1024, 1, &gpus[0], &gpus[1]);
        let err = m
            .train_on_batch(&data[0].0, &data[0].1)
            .expect_err("GPU:1 runs out of memory");
        assert!(matches!(err, Error::ResourceExhausted(_)), "{err}");
        assert!(err.to_string().contains("GPU:1"), "{pipeline:?}: {err}");
        assert_eq!(m.get_weights().expect("weights"), before, "{pipeline:?}");
        assert_eq!(m.iterations(), 0, "{pipeline:?}: no step counted");
        assert!(
            m.optimizer_variables().is_empty(),
            "{pipeline:?}: no Adam slot created"
        );
    }
    // A batch that fits trains.
    let data = batches(16, 1, &gpus[0], &gpus[1]);
    m.train_on_batch(&data[0].0, &data[0].1)
        .expect("a step that fits");
    assert_ne!(m.get_weights().expect("weights"), before);
}

#[test]
fn one_f_one_b_keeps_less_activation_memory_alive_than_gpipe() {
    let Some((rt, gpus)) = virtual_gpus(&[64, 64], "one_f_one_b_keeps_less_activation_memory")
    else {
        return;
    };
    let data = batches(256, 1, &gpus[0], &gpus[1]);
    // Peak bytes in use above what was in use before the step, per stage device.
    let peaks = |pipeline: Pipeline| -> Vec<u64> {
        let mut m = model(&gpus, &TWO_STAGES);
        m.set_pipeline(pipeline).expect("pipeline");
        // A first step creates the optimizer slots; the second is measured.
        m.train_on_batch(&data[0].0, &data[0].1).expect("a step");
        m.synchronize().expect("sync");
        let base: Vec<u64> = gpus
            .iter()
            .map(|d| {
                rt.reset_memory_stats(d.name()).expect("reset");
                rt.get_memory_info(d.name()).expect("info").current
            })
            .collect();
        m.train_on_batch(&data[0].0, &data[0].1).expect("a step");
        m.synchronize().expect("sync");
        gpus.iter()
            .zip(base)
            .map(|(d, b)| rt.get_memory_info(d.name()).expect("info").peak - b)
            .collect()
    };
    let gpipe = peaks(Pipeline::gpipe(8));
    let one_f_one_b = peaks(Pipeline::one_f_one_b(8));
    eprintln!(
        "peak activation memory at M = 8, batch 256: GPipe {gpipe:?} B, 1F1B {one_f_one_b:?} B"
    );
    for (stage, (g, o)) in gpipe.iter().zip(&one_f_one_b).enumerate() {
        assert!(
            o < g,
            "stage {stage} ({}): 1F1B peaks at {o} B, GPipe at {g} B",
            gpus[stage].name()
        );
    }
}

#[test]
fn a_stage_starting_with_a_stem_recomputes_it_for_its_input_gradient() {
    // Stage 1 starts with a convolution, a separable layer and a pool: its forward pass runs
    // them as one op (the convolution's output is not kept), and its backward pass, which
    // must hand stage 0 its input gradient, runs the convolution again. Serially nothing is
    // fused there (the model's first layer is on the other device).
    let (rt, cpus) = two_cpus();
    let selu = Activation::Selu;
    let build = || {
        let layers: Vec<Box<dyn Layer>> = vec![
            Box::new(
                Conv2D::new(3, 3)
                    .padding(Padding::Same)
                    .activation(selu)
                    .input_shape(&[8, 8, 1]),
            ),
            Box::new(Conv2D::new(4, 3).padding(Padding::Same).activation(selu)),
            Box::new(
                SeparableConv2D::new(6, 3)
                    .padding(Padding::Same)
                    .activation(selu),
            ),
            Box::new(MaxPool2D::new()),
            Box::new(Flatten::new()),
            Box::new(Dense::new(3).activation(Activation::Softmax)),
        ];
        let mut m = Sequential::with_seed(6);
        for (i, layer) in layers.into_iter().enumerate() {
            m.add_boxed(&cpus[usize::from(i > 0)], layer)
                .expect("builds");
        }
        m.compile(
            Loss::sparse_categorical_crossentropy(),
            Adam::new(0.01),
            &[],
        )
        .expect("compiles");
        m.set_verbose(Verbosity::Silent);
        m
    };
    let data = batches(16, 3, &cpus[0], &cpus[1]);
    let run = |pipeline: Option<Pipeline>| {
        let mut m = build();
        m.set_pipeline(pipeline).expect("a valid pipeline");
        let losses: Vec<f32> = data
            .iter()
            .map(|(x, y)| m.train_on_batch(x, y).expect("a step"))
            .collect();
        (losses, m.get_weights().expect("weights"))
    };
    let ops = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&ops);
    rt.set_placement_callback(Some(move |r: &PlacementRecord| {
        sink.lock().expect("log lock").push(r.op)
    }));
    rt.set_log_device_placement(true);
    let (serial_losses, serial_weights) = run(None);
    let fused_serially = ops.lock().expect("log lock").len();
    let (losses, weights) = run(Some(Pipeline::gpipe(2)));
    rt.set_log_device_placement(false);
    let ops = ops.lock().expect("log lock");
    let stem = |name| ops.iter().filter(|&&op| op == name).count();
    assert_eq!(
        stem("FusedConv2DSeparableConv2DMaxPoolWithArgmax"),
        2 * 3,
        "a forward per micro-batch"
    );
    assert_eq!(
        stem("FusedConv2DSeparableConv2DMaxPoolGradWithArgmax"),
        0,
        "the stem runs again"
    );
    assert!(ops[..fused_serially]
        .iter()
        .all(|&op| op != "FusedConv2DSeparableConv2DMaxPoolWithArgmax"));
    assert_close("losses", &losses, &serial_losses, 1e-4);
    for (i, (g, w)) in weights.iter().zip(&serial_weights).enumerate() {
        assert_close(&format!("weight {i}"), g, w, 1e-4);
    }
}
