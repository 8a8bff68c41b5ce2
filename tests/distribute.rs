//! MirroredStrategy: the same losses and weights as one device with the global batch, for 2
//! and 3 replicas on virtual CPUs, virtual GPUs, two adapters and a GPU next to the CPU;
//! bit-identical replicas after every step; uneven and tiny batches; TensorFlow's errors; and
//! a replica running out of memory without leaving the others changed.

mod common;

use common::{assert_close, compiled, small_cnn};

use anygpu::data::Dataset;
use anygpu::distribute::{self, CrossDeviceOps, HierarchicalAllReduce, MirroredStrategy};
use anygpu::nn::{Activation, Adam, Dense, Flatten, Loss, Optimizer, Sequential, Sgd};
use anygpu::{Error, LogicalDevice, Runtime, Tensor};

/// Trains `steps` batches of `batch` on one device, then under a strategy over `replicas`,
/// from the same seed, and checks that losses and weights agree and that every replica holds
/// exactly the primary's weights after every step.
fn mirrored_trains_like_one_device(
    single: &LogicalDevice,
    replicas: &[LogicalDevice],
    batch: usize,
    optimizer: Optimizer,
) {
    let steps = 4;
    let (x, y) = common::synthetic(batch * steps, 7);
    let batches: Vec<(Tensor, Tensor)> = (0..steps)
        .map(|s| {
            let rows = s * batch..(s + 1) * batch;
            (
                Tensor::from_slice_on(
                    &x[rows.start * 64..rows.end * 64],
                    &[batch, 8, 8, 1],
                    single,
                )
                .expect("a batch uploads"),
                Tensor::from_slice_on(&y[rows], &[batch], single).expect("labels upload"),
            )
        })
        .collect();

    let mut reference = single
        .scope_run(|| compiled(small_cnn(3)?, optimizer.clone()))
        .expect("the single-device model builds");
    let reference_losses: Vec<f32> = batches
        .iter()
        .map(|(x, y)| {
            reference
                .train_on_batch(x, y)
                .expect("a single-device step")
        })
        .collect();

    let strategy = MirroredStrategy::with_devices(replicas).expect("a strategy");
    let mut model = strategy
        .scope(|| compiled(small_cnn(3)?, optimizer))
        .expect("one strategy scope")
        .expect("the mirrored model builds");
    assert_eq!(model.devices(), replicas);
    for (step, (x, y)) in batches.iter().enumerate() {
        let loss = model.train_on_batch(x, y).expect("a mirrored step");
        assert_close(
            &format!("loss of step {step}"),
            &[loss],
            &[reference_losses[step]],
            1e-4,
        );
        let primary = model.replica_weights(0).expect("primary weights");
        for r in 1..replicas.len() {
            let mirror = model.replica_weights(r).expect("replica weights");
            // `zip` stops at the shorter side: a replica missing weights must not pass.
            let lengths = |w: &[Vec<f32>]| w.iter().map(Vec::len).collect::<Vec<_>>();
            assert_eq!(
                lengths(&mirror),
                lengths(&primary),
                "step {step}: replica {r} holds other weights than the primary"
            );
            let same_bits = primary
                .iter()
                .flatten()
                .zip(mirror.iter().flatten())
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same_bits,
                "step {step}: replica {r} differs from the primary"
            );
        }
    }
    let want = reference.get_weights().expect("reference weights");
    let got = model.get_weights().expect("mirrored weights");
    assert_eq!(got.len(), want.len(), "number of weight tensors");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_close(&format!("weight {i}"), g, w, 1e-4);
    }
}

/// A runtime's GPU devices with `virtual_mib` cut from GPU:0, or `None` (skipped) without one.
fn gpu_runtime(virtual_mib: &[u64], test: &str) -> Option<Runtime> {
    common::gpus_at_least(1, test)?;
    let builder = common::builder().visible_gpus(&[0]);
    let builder = if virtual_mib.is_empty() {
        builder.memory_growth(true)
    } else {
        builder.virtual_gpus(0, virtual_mib)
    };
    Some(builder.build().expect("a GPU runtime builds"))
}

trait ScopeRun {
    fn scope_run<R>(&self, f: impl FnOnce() -> R) -> R;
}

impl ScopeRun for LogicalDevice {
    fn scope_run<R>(&self, f: impl FnOnce() -> R) -> R {
        let _scope = self.scope();
        f()
    }
}

#[test]
fn two_and_three_virtual_cpus_train_like_one_cpu() {
    let rt = common::builder().virtual_cpus(3).build().expect("3 CPUs");
    let cpus = rt.list_logical_devices("CPU").expect("CPUs");
    mirrored_trains_like_one_device(&cpus[0], &cpus[..2], 12, Sgd::new(0.1).into());
    // 10 over 3 replicas: 4, 3, 3.
    mirrored_trains_like_one_device(&cpus[0], &cpus, 10, Adam::default().into());
}

#[test]
fn two_and_three_virtual_gpus_train_like_one_gpu() {
    let Some(rt) = gpu_runtime(
        &[64, 64, 64],
        "two_and_three_virtual_gpus_train_like_one_gpu",
    ) else {
        return;
    };
    let gpus = rt.list_logical_devices("GPU").expect("GPUs");
    mirrored_trains_like_one_device(&gpus[0], &gpus[..2], 12, Adam::default().into());
    mirrored_trains_like_one_device(&gpus[0], &gpus, 10, Sgd::new(0.1).momentum(0.9).into());
}

#[test]
fn two_adapters_train_like_one() {
    if common::gpus_at_least(2, "two_adapters_train_like_one").is_none() {
        return;
    }
    let rt = common::builder()
        .memory_growth(true)
        .build()
        .expect("a runtime");
    let gpus = rt.list_logical_devices("GPU").expect("GPUs");
    mirrored_trains_like_one_device(&gpus[0], &gpus[..2], 9, Adam::default().into());
    let mut three = gpus[..2].to_vec();
    three.push(rt.cpu().expect("CPU:0"));
    mirrored_trains_like_one_device(&gpus[0], &three, 10, Sgd::new(0.1).momentum(0.9).into());
}

#[test]
fn a_cpu_replica_next_to_a_gpu_trains_like_one_device() {
    let Some(rt) = gpu_runtime(&[], "a_cpu_replica_next_to_a_gpu_trains_like_one_device") else {
        return;
    };
    let devices = vec![rt.cpu().expect("CPU:0"), rt.device("GPU:0").expect("GPU:0")];
    // SGD's step is proportional to the gradient, so a mis-scaled sum shows; Adam's slots take
    // the primary-to-replica copy of mixed kernels.
    mirrored_trains_like_one_device(&devices[0], &devices, 11, Sgd::new(0.1).into());
    mirrored_trains_like_one_device(&devices[0], &devices, 11, Adam::default().into());
}

#[test]
fn a_batch_smaller_than_the_replicas_still_trains() {
    let rt = common::builder().virtual_cpus(3).build().expect("3 CPUs");
    let cpus = rt.list_logical_devices("CPU").expect("CPUs");
    mirrored_trains_like_one_device(&cpus[0], &cpus, 2, Sgd::new(0.1).into());
    let strategy = MirroredStrategy::with_devices(&cpus).expect("a strategy");
    assert_eq!(strategy.replica_batch_sizes(2), [1, 1, 0]);
}

#[test]
fn fit_evaluate_and_predict_under_the_strategy_match_one_device() {
    let rt = common::builder().virtual_cpus(2).build().expect("2 CPUs");
    let cpus = rt.list_logical_devices("CPU").expect("CPUs");
    let (x, y) = common::synthetic(50, 11);
    let train = Dataset::from_tensor_slices(x.clone(), &[8, 8, 1], y.clone())
        .expect("a dataset")
        .batch(16, false);

    let mut single = cpus[0]
        .scope_run(|| compiled(small_cnn(5)?, Sgd::new(0.05).momentum(0.9).into()))
        .expect("single");
    let strategy = MirroredStrategy::with_devices(&cpus).expect("strategy");
    let mut mirrored = strategy
        .scope(|| compiled(small_cnn(5)?, Sgd::new(0.05).momentum(0.9).into()))
        .expect("scope")
        .expect("mirrored");

    let a = single.fit(&train, 2, None, Some(&train)).expect("fit");
    let b = mirrored
        .fit(&train, 2, None, Some(&train))
        .expect("mirrored fit");
    let as32 = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<_>>();
    assert_close("loss", &as32(&b.loss), &as32(&a.loss), 1e-4);
    assert_close("val_loss", &as32(&b.val_loss), &as32(&a.val_loss), 1e-4);
    assert_eq!(b.accuracy, a.accuracy);

    let e1 = single.evaluate(&train, None).expect("evaluate");
    let e2 = mirrored.evaluate(&train, None).expect("mirrored evaluate");
    assert_eq!(e2.examples, 50);
    assert_close("evaluate", &[e2.loss as f32], &[e1.loss as f32], 1e-4);

    let batch = Tensor::from_slice_on(&x[..7 * 64], &[7, 8, 8, 1], &cpus[1]).expect("x");
    let p1 = single.predict(&batch).expect("predict");
    let p2 = mirrored.predict(&batch).expect("mirrored predict");
    assert_eq!(p2.shape(), &[7, 3]);
    assert_eq!(p2.device_handle().name(), "/device:CPU:0");
    assert_close(
        "predict",
        &p2.to_vec::<f32>().expect("read"),
        &p1.to_vec::<f32>().expect("read"),
        1e-4,
    );
    assert!(mirrored
        .summary()
        .contains("Mirrored on 2 replica(s): /device:CPU:0, /device:CPU:1"));
}

#[test]
fn weights_set_or_loaded_reach_every_replica() {
    let rt = common::builder().virtual_cpus(2).build().expect("2 CPUs");
    let cpus = rt.list_logical_devices("CPU").expect("CPUs");
    let strategy = MirroredStrategy::with_devices(&cpus).expect("strategy");
    let mut model = strategy
        .scope(|| small_cnn(1))
        .expect("scope")
        .expect("model");
    assert_eq!(
        model.replica_weights(1).expect("r1"),
        model.get_weights().expect("r0")
    );
    let new: Vec<Vec<f32>> = model
        .get_weights()
        .expect("weights")
        .iter()
        .enumerate()
        .map(|(i, w)| common::values(w.len(), i as u64 + 100))
        .collect();
    model.set_weights(&new).expect("set_weights");
    assert_eq!(model.replica_weights(1).expect("r1"), new);
    assert!(model.replica_weights(2).is_err());

    // A weight file reaches every replica too.
    let path = std::env::temp_dir().join(format!(
        "anygpu-distribute-{}.safetensors",
        std::process::id()
    ));
    let saved = cpus[0].scope_run(|| small_cnn(9)).expect("another model");
    saved.save_weights(&path).expect("save");
    model.load_weights(&path).expect("load");
    std::fs::remove_file(&path).ok();
    let want = saved.get_weights().expect("saved weights");
    assert_eq!(model.get_weights().expect("r0"), want);
    assert_eq!(model.replica_weights(1).expect("r1"), want);
}

#[test]
fn a_model_built_on_first_fit_is_mirrored_then() {
    let rt = common::builder().virtual_cpus(2).build().expect("2 CPUs");
    let cpus = rt.list_logical_devices("CPU").expect("CPUs");
    let strategy = MirroredStrategy::with_devices(&cpus).expect("strategy");
    let mut model = strategy
        .scope(|| -> anygpu::Result<Sequential> {
            let mut m = Sequential::with_seed(4);
            m.add(Flatten::new())?; // no input_shape: built by fit
            m.add(Dense::new(3).activation(Activation::Softmax))?;
            compiled(m, Sgd::new(0.1).into())
        })
        .expect("scope")
        .expect("model");
    assert!(model.get_weights().expect("none yet").is_empty());
    let (x, y) = common::synthetic(12, 5);
    let data = Dataset::from_tensor_slices(x, &[8, 8, 1], y)
        .expect("data")
        .batch(6, false);
    model
        .fit(&data, 1, None, None)
        .expect("fit builds and trains");
    assert_eq!(model.get_weights().expect("r0").len(), 2);
    assert_eq!(
        model.replica_weights(1).expect("r1"),
        model.get_weights().expect("r0")
    );
}

#[test]
fn compiling_in_a_scope_a_model_made_outside_it_is_an_error() {
    let rt = common::builder().virtual_cpus(2).build().expect("2 CPUs");
    let cpus = rt.list_logical_devices("CPU").expect("CPUs");
    let strategy = MirroredStrategy::with_devices(&cpus).expect("strategy");
    let mut model = cpus[0].scope_run(|| small_cnn(0)).expect("a plain model");
    let err = strategy
        .scope(|| compiled(small_cnn(0).expect("unused"), Sgd::default().into()).map(|_| ()))
        .expect("scope");
    assert!(err.is_ok(), "a model made inside the scope compiles there");
    let err = strategy
        .scope(|| model.compile(Loss::sparse_categorical_crossentropy(), Sgd::default(), &[]))
        .expect("scope")
        .expect_err("made outside, compiled inside");
    assert!(
        err.to_string().contains("not created in the scope"),
        "{err}"
    );
}

#[test]
fn strategy_errors_read_like_tensorflow() {
    let rt = common::builder().virtual_cpus(2).build().expect("2 CPUs");
    let cpus = rt.list_logical_devices("CPU").expect("CPUs");
    let err = MirroredStrategy::with_devices(&[]).expect_err("empty");
    assert!(matches!(err, Error::InvalidArgument(_)));
    assert_eq!(
        err.to_string(),
        "Got an empty `devices` list. Please make sure the `devices` you pass in is not empty."
    );
    let err = MirroredStrategy::with_devices(&[cpus[0].clone(), cpus[1].clone(), cpus[0].clone()])
        .expect_err("duplicate");
    assert_eq!(
        err.to_string(),
        "No duplicates allowed in `devices` argument: \
         ('/job:localhost/replica:0/task:0/device:CPU:0', \
         '/job:localhost/replica:0/task:0/device:CPU:1', \
         '/job:localhost/replica:0/task:0/device:CPU:0')"
    );
    let other = common::builder().build().expect("another runtime");
    let orphan = other.cpu().expect("cpu");
    let err =
        MirroredStrategy::with_devices(&[cpus[0].clone(), orphan.clone()]).expect_err("mixed");
    assert!(
        err.to_string().contains("must come from one runtime"),
        "{err}"
    );
    drop(other);
    let err = MirroredStrategy::with_devices(&[orphan]).expect_err("dropped runtime");
    assert!(err.to_string().contains("was dropped"), "{err}");

    // Nested scopes: the same strategy is fine, another one is not.
    let a = MirroredStrategy::with_devices(&cpus).expect("a");
    let b = MirroredStrategy::with_devices(&cpus[..1]).expect("b");
    let nested = a.scope(|| {
        assert!(distribute::has_strategy());
        assert!(a.scope(|| ()).is_ok());
        b.scope(|| ()).map_err(|e| e.to_string())
    });
    let message = nested.expect("outer scope").expect_err("mixing strategies");
    assert!(
        message.contains("Mixing different tf.distribute.Strategy objects"),
        "{message}"
    );
    assert!(distribute::get_strategy().is_none());

    // A mirrored model places every layer on every replica: add_on elsewhere is refused.
    let mut model = a.scope(|| small_cnn(0)).expect("scope").expect("model");
    let err = model
        .add_on(&cpus[1], Dense::new(2))
        .expect_err("add_on a replica");
    assert!(err.to_string().contains("MirroredStrategy"), "{err}");
    assert_eq!(model.len(), 6);
}

#[test]
fn new_takes_every_logical_gpu_or_the_cpu() {
    let rt = common::builder()
        .visible_gpus(&[])
        .build()
        .expect("no GPUs");
    let strategy = MirroredStrategy::for_runtime(&rt).expect("strategy");
    assert_eq!(strategy.num_replicas_in_sync(), 1);
    assert_eq!(strategy.devices()[0].name(), "/device:CPU:0");
    let Some(rt) = gpu_runtime(&[64, 64, 64], "new_takes_every_logical_gpu_or_the_cpu") else {
        return;
    };
    let strategy = MirroredStrategy::for_runtime(&rt).expect("strategy");
    let names: Vec<&str> = strategy.devices().iter().map(|d| d.name()).collect();
    assert_eq!(names, ["/device:GPU:0", "/device:GPU:1", "/device:GPU:2"]);
}

#[test]
fn a_replica_out_of_memory_fails_the_step_and_changes_no_replica() {
    let Some(rt) = gpu_runtime(&[64, 1], "a_replica_out_of_memory_fails_the_step") else {
        return;
    };
    let gpus = rt.list_logical_devices("GPU").expect("GPUs");
    let strategy = MirroredStrategy::with_devices(&gpus).expect("strategy");
    let mut model = strategy
        .scope(|| compiled(small_cnn(2)?, Adam::default().into()))
        .expect("scope")
        .expect("the weights fit in 1 MiB");
    let before = model.get_weights().expect("weights");
    // 1024 examples: 512 × 8×8×4 floats of the first activation alone are 1 MiB.
    let (x, y) = common::synthetic(1024, 3);
    let x = Tensor::from_slice_on(&x, &[1024, 8, 8, 1], &gpus[0]).expect("x");
    let y = Tensor::from_slice_on(&y, &[1024], &gpus[0]).expect("y");
    let err = model
        .train_on_batch(&x, &y)
        .expect_err("GPU:1 runs out of memory");
    assert!(matches!(err, Error::ResourceExhausted(_)), "{err}");
    assert!(err.to_string().contains("GPU:1"), "{err}");
    assert_eq!(model.replica_weights(0).expect("r0"), before);
    assert_eq!(model.replica_weights(1).expect("r1"), before);
    // Setting weights writes in place: it works on a replica with no memory to spare.
    let mut filler = Vec::new();
    while let Ok(t) = Tensor::zeros_on(&[16 * 1024], anygpu::DType::F32, &gpus[1]) {
        filler.push(t);
    }
    let new: Vec<Vec<f32>> = before
        .iter()
        .map(|w| w.iter().map(|v| v * 0.5).collect())
        .collect();
    model
        .set_weights(&new)
        .expect("set_weights allocates nothing");
    assert_eq!(model.replica_weights(1).expect("r1"), new);
    drop(filler);
    // A batch that fits trains, and the replicas stay equal.
    let small =
        Tensor::from_slice_on(&common::synthetic(8, 4).0, &[8, 8, 8, 1], &gpus[0]).expect("x");
    let labels = Tensor::from_slice_on(&common::synthetic(8, 4).1, &[8], &gpus[0]).expect("y");
    model
        .train_on_batch(&small, &labels)
        .expect("a step that fits");
    assert_ne!(model.get_weights().expect("r0"), before);
    assert_eq!(
        model.replica_weights(1).expect("r1"),
        model.get_weights().expect("r0")
    );
}

fn all_reduce_agrees_everywhere(devices: &[LogicalDevice]) {
    let n = 1000;
    let parts: Vec<Vec<f32>> = (0..devices.len())
        .map(|i| common::values(n, i as u64 + 1))
        .collect();
    let tensors: Vec<Tensor> = parts
        .iter()
        .zip(devices)
        .map(|(p, d)| Tensor::from_slice_on(p, &[n], d).expect("upload"))
        .collect();
    let sums = HierarchicalAllReduce
        .reduce_sum(&tensors, devices)
        .expect("reduce");
    let want: Vec<f64> = (0..n)
        .map(|i| parts.iter().map(|p| p[i] as f64).sum())
        .collect();
    assert_eq!(sums.len(), devices.len(), "one sum per device");
    let first = sums[0].to_vec::<f32>().expect("read");
    assert_eq!(first.len(), n, "the sum has every element");
    for (s, d) in sums.iter().zip(devices) {
        assert_eq!(s.device_handle(), d);
        let got = s.to_vec::<f32>().expect("read");
        assert_eq!(got.len(), n, "the sum on {d:?} has every element");
        assert!(got
            .iter()
            .zip(&first)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        for (g, w) in got.iter().zip(&want) {
            assert!((*g as f64 - w).abs() < 1e-5, "{g} vs {w}");
        }
    }
    // Broadcast into existing tensors on every device.
    let targets: Vec<Tensor> = devices
        .iter()
        .map(|d| Tensor::zeros_on(&[n], anygpu::DType::F32, d).expect("zeros"))
        .collect();
    HierarchicalAllReduce
        .broadcast_into(&tensors[0], &targets[1..])
        .expect("broadcast");
    for t in &targets[1..] {
        assert_eq!(t.to_vec::<f32>().expect("read"), parts[0]);
    }
}

#[test]
fn the_default_all_reduce_gives_every_device_the_same_sum() {
    let rt = common::builder().virtual_cpus(2).build().expect("2 CPUs");
    all_reduce_agrees_everywhere(&rt.list_logical_devices("CPU").expect("CPUs"));
    if common::gpus_at_least(1, "the_default_all_reduce_gives_every_device_the_same_sum").is_none()
    {
        return;
    }
    // Siblings on GPU:0, any other adapter, and two CPUs.
    let rt = common::builder()
        .virtual_gpus(0, &[32, 32])
        .virtual_cpus(2)
        .build()
        .expect("a runtime");
    let mut devices = rt.list_logical_devices("GPU").expect("GPUs");
    devices.extend(rt.list_logical_devices("CPU").expect("CPUs"));
    all_reduce_agrees_everywhere(&devices);
}
