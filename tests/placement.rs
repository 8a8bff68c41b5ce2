//! Tensors and placement: explicit scopes, defaults, soft placement, the placement log, and
//! exact values after copies between devices.

mod common;

use std::sync::{Arc, Mutex};

use anygpu::{DType, Error, LogicalDevice, PlacementRecord, Runtime, Tensor};
use common::{builder, gpus_at_least};

/// Records the placement log of `rt`.
fn capture(rt: &Runtime) -> Arc<Mutex<Vec<PlacementRecord>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&lines);
    rt.set_log_device_placement(true);
    rt.set_placement_callback(Some(move |r: &PlacementRecord| {
        sink.lock().unwrap().push(r.clone())
    }));
    lines
}

fn matmul_on(rt: &Runtime, device: &LogicalDevice) -> Tensor {
    rt.device_scope(device, || {
        let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
        let b = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).unwrap();
        a.matmul(&b).unwrap()
    })
    .unwrap()
}

#[test]
fn ops_run_on_each_logical_device_including_both_adapters() {
    let rt = builder().build().unwrap();
    let log = capture(&rt);
    for device in common::available(rt.list_logical_devices(anygpu::KindFilter::All).unwrap()) {
        log.lock().unwrap().clear();
        let c = matmul_on(&rt, &device);
        assert_eq!(c.device(), device.full_name());
        assert_eq!(c.to_vec::<f32>().unwrap(), [22.0, 28.0, 49.0, 64.0]);
        let records = log.lock().unwrap().clone();
        let matmul: Vec<_> = records.iter().filter(|r| r.op == "MatMul").collect();
        assert_eq!(matmul.len(), 1, "{records:?}");
        assert_eq!(matmul[0].device, device.full_name());
    }
}

#[test]
fn default_placement_is_the_first_hardware_gpu_else_cpu0_and_software_adapters_must_be_named() {
    let rt = builder().build().unwrap();
    let gpus = rt.list_logical_devices("GPU").unwrap();
    let expected = gpus
        .iter()
        .find(|d| !d.is_software())
        .map_or("/device:CPU:0".to_string(), |d| d.name().to_string());
    assert_eq!(rt.default_device().unwrap().name(), expected);
    let cpu_only = builder().visible_gpus(&[]).build().unwrap();
    assert_eq!(cpu_only.default_device().unwrap().name(), "/device:CPU:0");
    // Without a scope an op whose inputs are on the CPU runs on the default device (TF:
    // GPU:0 when a GPU is visible), its inputs copied there.
    let a = Tensor::from_slice_on(&[1.0f32, 2.0], &[2], &rt.cpu().unwrap()).unwrap();
    let sum = a.add(&a).unwrap();
    assert_eq!(sum.device(), rt.default_device().unwrap().full_name());
    assert_eq!(sum.to_vec::<f32>().unwrap(), [2.0, 4.0]);
    // An op whose first input is on a GPU stays on it; naming a software adapter uses it.
    for gpu in &gpus {
        let g = Tensor::from_slice_on(&[1.0f32, 2.0], &[2], gpu).unwrap();
        assert_eq!(g.add(&a).unwrap().device(), gpu.full_name());
        let named = rt
            .device_scope(gpu, || Tensor::from_vec(vec![1.0f32], &[1]))
            .unwrap()
            .unwrap();
        assert_eq!(named.device(), gpu.full_name());
    }
}

#[test]
fn nested_scopes_merge_partial_specs_and_restore_the_outer_one() {
    let rt = builder().virtual_cpus(2).build().unwrap();
    let _outer = rt.with_device("/job:localhost/device:CPU:1").unwrap();
    let t = Tensor::zeros(&[2]).unwrap();
    assert!(t.device().ends_with("CPU:1"));
    {
        let _inner = rt.with_device("/device:CPU:*").unwrap();
        assert_eq!(
            anygpu::current_device_spec().as_deref(),
            Some("/job:localhost/device:CPU:1")
        );
        assert!(Tensor::zeros(&[2]).unwrap().device().ends_with("CPU:1"));
        let _innermost = rt.with_device("cpu:0").unwrap();
        assert!(Tensor::zeros(&[2]).unwrap().device().ends_with("CPU:0"));
    }
    assert!(Tensor::zeros(&[2]).unwrap().device().ends_with("CPU:1"));
    let err = rt.with_device("GPU:").err().unwrap();
    assert_eq!(
        err.to_string(),
        "Failed parsing device name: 'GPU:'. Note a valid device string should at least \
         contain a device type and a device index, like \"GPU:0\"."
    );
}

#[test]
fn soft_placement_runs_ops_for_missing_devices_elsewhere_and_the_log_says_where() {
    let rt = builder().build().unwrap();
    let log = capture(&rt);
    let c = rt
        .device_scope("/device:GPU:7", || {
            let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
            a.matmul(&a)
        })
        .unwrap()
        .unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), [7.0, 10.0, 15.0, 22.0]);
    let best = rt.default_device().unwrap();
    assert_eq!(
        c.device(),
        best.full_name(),
        "the best device that can run it"
    );
    assert!(log
        .lock()
        .unwrap()
        .iter()
        .any(|r| r.op == "MatMul" && r.device == best.full_name()));
}

#[test]
fn with_soft_placement_off_a_missing_device_is_tensorflows_error() {
    let rt = builder().soft_device_placement(false).build().unwrap();
    let err = rt
        .device_scope("GPU:7", || Tensor::from_vec(vec![1.0f32], &[1]))
        .unwrap()
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Placement { .. }));
    let types = if rt.list_logical_devices("GPU").unwrap().is_empty() {
        "CPU"
    } else {
        "GPU, CPU"
    };
    assert!(
        msg.starts_with(&format!("Could not satisfy device specification '/job:localhost/replica:0/task:0/device:GPU:7'. enable_soft_placement=0. Supported device types [{types}]. All available devices [/job:localhost/replica:0/task:0/device:CPU:0")),
        "{msg}"
    );
}

#[test]
fn a_hidden_gpu_is_a_missing_device() {
    let Some(_) = gpus_at_least(1, "hidden_gpu") else {
        return;
    };
    let rt = builder().visible_gpus(&[]).build().unwrap();
    let t = rt
        .device_scope("GPU:0", || Tensor::zeros(&[3]))
        .unwrap()
        .unwrap();
    assert!(t.device().ends_with("CPU:0"));
    rt.set_soft_device_placement(false);
    let err = rt
        .device_scope("GPU:0", || Tensor::zeros(&[3]))
        .unwrap()
        .unwrap_err();
    // TF's message: the merged full name, the device types of what is visible (no GPU
    // is), every device.
    assert_eq!(
        err.to_string(),
        "Could not satisfy device specification '/job:localhost/replica:0/task:0/device:GPU:0'. \
         enable_soft_placement=0. Supported device types [CPU]. All available devices \
         [/job:localhost/replica:0/task:0/device:CPU:0]."
    );
}

#[test]
fn an_op_without_a_gpu_kernel_falls_back_to_the_cpu_or_fails_with_soft_placement_off() {
    let Some(_) = gpus_at_least(1, "no_gpu_kernel") else {
        return;
    };
    let rt = builder().build().unwrap();
    let log = capture(&rt);
    let gpu = rt.device("GPU:0").unwrap();
    let x = Tensor::from_slice_on(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &gpu).unwrap();
    let _scope = gpu.scope();
    let y = x.cumsum().unwrap();
    assert!(y.device().ends_with("CPU:0"));
    assert_eq!(y.to_vec::<f32>().unwrap(), [1.0, 3.0, 6.0, 4.0, 9.0, 15.0]);
    assert!(log
        .lock()
        .unwrap()
        .iter()
        .any(|r| r.op == "Cumsum" && r.device.ends_with("CPU:0")));
    rt.set_soft_device_placement(false);
    let err = x.cumsum().unwrap_err();
    assert!(
        err.to_string().starts_with("Could not satisfy device specification '/job:localhost/replica:0/task:0/device:GPU:0'. enable_soft_placement=0. Supported device types [CPU]."),
        "{err}"
    );
}

#[test]
fn placement_log_lines_can_be_captured_and_switched_off() {
    let rt = builder().virtual_cpus(1).build().unwrap();
    let log = capture(&rt);
    let cpu = rt.cpu().unwrap();
    let a = Tensor::from_slice_on(&[1.0f32, 2.0], &[2], &cpu).unwrap();
    let _ = Tensor::add_n(&[&a, &a, &a]).unwrap();
    assert_eq!(
        log.lock().unwrap().last().unwrap(),
        &PlacementRecord {
            op: "AddN",
            device: "/job:localhost/replica:0/task:0/device:CPU:0".into(),
            pipeline: None,
        }
    );
    rt.set_log_device_placement(false);
    let n = log.lock().unwrap().len();
    let _ = a.add(&a).unwrap();
    assert_eq!(log.lock().unwrap().len(), n, "nothing is logged when off");
}

#[test]
fn copies_between_virtual_siblings_adapters_and_the_cpu_keep_exact_values() {
    let Some(n) = gpus_at_least(1, "copies") else {
        return;
    };
    let rt = builder()
        .virtual_gpus(0, &[32, 32])
        .memory_growth(true)
        .build()
        .unwrap();
    let data: Vec<f32> = (0..1001).map(|i| (i as f32).sin() * 1e3 + 0.125).collect();
    let cpu = rt.cpu().unwrap();
    let mut route = vec![cpu.clone()];
    route.extend(rt.list_logical_devices("GPU").unwrap());
    route.push(cpu.clone());
    let mut t = Tensor::from_slice_on(&data, &[7, 11, 13], &cpu).unwrap();
    for device in &route[1..] {
        t = t.to_device(device).unwrap();
        assert_eq!(t.device(), device.full_name());
        assert_eq!(t.shape(), &[7, 11, 13]);
        assert_eq!(
            t.to_vec::<f32>().unwrap(),
            data,
            "after the copy to {}",
            device.name()
        );
    }
    assert!(route.len() == n + 3);
    // Labels (i32) survive too.
    let labels: Vec<i32> = (0..50).map(|i| i * 7 - 100).collect();
    let gpu = rt.device("GPU:1").unwrap();
    let l = Tensor::from_slice_on(&labels, &[50], &gpu).unwrap();
    assert_eq!(l.dtype(), DType::I32);
    assert_eq!(
        l.to_device(&rt.device("GPU:0").unwrap())
            .unwrap()
            .to_vec::<i32>()
            .unwrap(),
        labels
    );
}

#[test]
fn ops_with_inputs_on_other_devices_copy_them_first() {
    let Some(_) = gpus_at_least(1, "implicit_copies") else {
        return;
    };
    let rt = builder().virtual_gpus(0, &[32, 32]).build().unwrap();
    let a = Tensor::from_slice_on(&[1.0f32, 2.0, 3.0], &[3], &rt.device("GPU:0").unwrap()).unwrap();
    let b =
        Tensor::from_slice_on(&[10.0f32, 20.0, 30.0], &[3], &rt.device("GPU:1").unwrap()).unwrap();
    let c = Tensor::from_slice_on(&[100.0f32, 200.0, 300.0], &[3], &rt.cpu().unwrap()).unwrap();
    let sum = rt
        .device_scope("GPU:1", || Tensor::add_n(&[&a, &b, &c]))
        .unwrap()
        .unwrap();
    assert!(sum.device().ends_with("GPU:1"));
    assert_eq!(sum.to_vec::<f32>().unwrap(), [111.0, 222.0, 333.0]);
}

#[test]
fn an_op_that_does_not_fit_its_devices_cap_fails_and_the_device_keeps_working() {
    let Some(_) = gpus_at_least(1, "op_oom") else {
        return;
    };
    let rt = builder().virtual_gpus(0, &[8]).build().unwrap();
    let gpu = rt.device("GPU:0").unwrap();
    let _scope = gpu.scope();
    let big = Tensor::zeros(&[1000, 1000]).unwrap(); // 4 MB
    let err = big.add(&big).and_then(|x| x.add(&big)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::ResourceExhausted(_)), "{msg}");
    assert!(msg.starts_with("OOM when allocating tensor with shape[1000,1000] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc"), "{msg}");
    let small = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    assert_eq!(
        small.add(&small).unwrap().to_vec::<f32>().unwrap(),
        [2.0, 4.0]
    );
}

#[test]
fn shape_mismatches_are_errors_naming_both_shapes() {
    let rt = builder().build().unwrap();
    let _s = rt.with_device("CPU:0").unwrap();
    let a = Tensor::zeros(&[2, 3]).unwrap();
    let err = a.matmul(&a).unwrap_err();
    assert_eq!(
        err.to_string(),
        "MatMul: incompatible shapes [2, 3] and [2, 3]: inner dimensions differ (3 vs 2)"
    );
    let err = a.add(&Tensor::zeros(&[2]).unwrap()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("AddV2: incompatible shapes [2, 3] and [2]"),
        "{err}"
    );
    let err = Tensor::from_vec(vec![1.0f32; 5], &[2, 3]).unwrap_err();
    assert!(
        err.to_string()
            .contains("5 values cannot fill a tensor of 6 elements"),
        "{err}"
    );
    assert!(a.to_vec::<i32>().is_err());
}

#[test]
fn basic_ops_match_the_f64_reference_on_every_device() {
    use anygpu::ops::reference as r;
    let rt = builder().build().unwrap();
    for device in common::available(rt.list_logical_devices(anygpu::KindFilter::All).unwrap()) {
        let _s = device.scope();
        for (m, k, n) in [
            (1, 1, 1),
            (3, 7, 13),
            (28, 13, 7),
            (65, 3, 129),
            (1, 5, 4),
            (67, 33, 132),
        ] {
            let a = r::random_vec(m * k, 1);
            let b = r::random_vec(k * n, 2);
            let c = Tensor::from_slice(&a, &[m, k])
                .unwrap()
                .matmul(&Tensor::from_slice(&b, &[k, n]).unwrap())
                .unwrap();
            let expected = r::matmul(&r::to_f64(&a), &r::to_f64(&b), m, k, n, false, false);
            r::assert_close(
                &c.to_vec::<f32>().unwrap(),
                &expected,
                1e-4,
                &format!("matmul {m}x{k}x{n} on {device}"),
            );
        }
        let x = r::random_vec(7 * 13, 3);
        let bias = r::random_vec(13, 4);
        let xt = Tensor::from_slice(&x, &[7, 13]).unwrap();
        let bt = Tensor::from_slice(&bias, &[13]).unwrap();
        let sum = xt.add(&bt).unwrap().to_vec::<f32>().unwrap();
        let expected: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| v as f64 + bias[i % 13] as f64)
            .collect();
        r::assert_close(&sum, &expected, 1e-6, "bias add");
        let total = xt.reduce_sum(None).unwrap().to_vec::<f32>().unwrap();
        r::assert_close(&total, &[x.iter().map(|&v| v as f64).sum()], 1e-5, "sum");
        let cols = xt.reduce_mean(Some(0)).unwrap().to_vec::<f32>().unwrap();
        let expected: Vec<f64> = (0..13)
            .map(|c| (0..7).map(|r| x[r * 13 + c] as f64).sum::<f64>() / 7.0)
            .collect();
        r::assert_close(&cols, &expected, 1e-5, "column mean");
        let arg = xt.argmax().unwrap().to_vec::<i32>().unwrap();
        let expected: Vec<i32> = x
            .chunks(13)
            .map(|row| {
                row.iter()
                    .enumerate()
                    .fold(0, |best, (i, &v)| if v > row[best] { i } else { best })
                    as i32
            })
            .collect();
        assert_eq!(arg, expected, "argmax on {device}");
        let big = r::random_vec(100_000, 5);
        let bt = Tensor::from_slice(&big, &[1000, 100]).unwrap();
        let cols = bt.reduce_sum(Some(0)).unwrap().to_vec::<f32>().unwrap();
        let expected: Vec<f64> = (0..100)
            .map(|c| (0..1000).map(|r| big[r * 100 + c] as f64).sum())
            .collect();
        r::assert_close(&cols, &expected, 1e-4, "column sums over chunks");
    }
}

#[test]
fn the_outermost_device_scope_initializes_the_runtime() {
    let rt = builder().configure().unwrap();
    assert!(!rt.is_initialized());
    let _scope = rt.with_device("/device:CPU:0").unwrap();
    assert!(rt.is_initialized(), "tf.device initializes the context");
}

#[test]
fn ops_on_devices_or_tensors_of_a_dropped_runtime_fail_clearly() {
    let rt = builder().build().unwrap();
    let cpu = rt.cpu().unwrap();
    let t = Tensor::from_slice_on(&[1.0f32, 2.0], &[2], &cpu).unwrap();
    drop(rt);
    // The tensor's data outlives the runtime and can still be read.
    assert_eq!(t.to_vec::<f32>().unwrap(), [1.0, 2.0]);
    let err = t.add(&t).unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    assert!(
        err.to_string().starts_with(
            "the Runtime that owns a tensor on /job:localhost/replica:0/task:0/device:CPU:0 \
             was dropped"
        ),
        "{err}"
    );
    // A device handle of a dropped runtime does not send its scoped ops to the process-wide
    // runtime's device of the same name.
    let _scope = cpu.scope();
    let err = Tensor::zeros(&[2]).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("the Runtime that owns /device:CPU:0 was dropped"),
        "{err}"
    );
}

#[test]
fn one_adapter_that_fails_to_open_leaves_every_other_device_working() {
    let Some(n) = gpus_at_least(1, "one_bad_adapter") else {
        return;
    };
    let rt = builder()
        .fail_adapter_for_tests(0, "injected: the driver lost the device")
        .build()
        .expect("a bad adapter does not fail initialization");
    let gpus = rt.list_logical_devices("GPU").unwrap();
    assert_eq!(gpus.len(), n, "the bad GPU is still listed");
    assert!(!gpus[0].is_available());
    assert!(
        gpus[0]
            .unavailable_reason()
            .is_some_and(|r| r.contains("injected: the driver lost the device")),
        "{:?}",
        gpus[0].unavailable_reason()
    );
    // Ops placed on it fail and say why, soft placement or not.
    let err = rt
        .device_scope("GPU:0", || Tensor::from_vec(vec![1.0f32, 2.0], &[2]))
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    let msg = err.to_string();
    assert!(
        msg.starts_with("/job:localhost/replica:0/task:0/device:GPU:0 (")
            && msg.contains("is unavailable: ")
            && msg.contains("injected: the driver lost the device"),
        "{msg}"
    );
    assert!(Tensor::zeros_on(&[2], DType::F32, &gpus[0]).is_err());
    assert!(matches!(
        rt.get_memory_info("GPU:0").unwrap_err(),
        Error::Unavailable(_)
    ));
    // Every other device works.
    let cpu = rt.cpu().unwrap();
    assert_eq!(
        matmul_on(&rt, &cpu).to_vec::<f32>().unwrap(),
        [22.0, 28.0, 49.0, 64.0]
    );
    for gpu in &gpus[1..] {
        assert!(gpu.is_available());
        assert_eq!(
            matmul_on(&rt, gpu).to_vec::<f32>().unwrap(),
            [22.0, 28.0, 49.0, 64.0]
        );
    }
    assert!(rt.default_device().unwrap().is_available());
    let strategy = anygpu::distribute::MirroredStrategy::for_runtime(&rt).unwrap();
    assert!(strategy.devices().iter().all(LogicalDevice::is_available));
}

/// A runtime whose software adapters count as GPUs (`software_adapters_as_gpus`), with the
/// placement log captured; `None` (skipped, or failed under `ANYGPU_REQUIRE_ADAPTER=1`)
/// without a GPU.
fn tf_rules(test: &str) -> Option<(Runtime, Arc<Mutex<Vec<PlacementRecord>>>)> {
    gpus_at_least(1, test)?;
    let rt = builder().software_adapters_as_gpus(true).build().unwrap();
    let log = capture(&rt);
    Some((rt, log))
}

#[test]
fn with_software_adapters_as_gpus_an_op_without_a_scope_runs_on_gpu0_as_in_tensorflow() {
    let Some((rt, log)) = tf_rules("tf_default_device") else {
        return;
    };
    assert!(rt.software_adapters_as_gpus());
    let gpu0 = rt.device("GPU:0").unwrap();
    assert_eq!(rt.default_device().unwrap(), gpu0);
    // TF: an op with a GPU kernel and inputs on the CPU runs on GPU:0, its inputs copied there.
    let a = Tensor::from_slice_on(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &rt.cpu().unwrap()).unwrap();
    let c = a.matmul(&a).unwrap();
    assert_eq!(c.device(), gpu0.full_name());
    assert_eq!(c.to_vec::<f32>().unwrap(), [7.0, 10.0, 15.0, 22.0]);
    let records = log.lock().unwrap().clone();
    assert!(
        records
            .iter()
            .any(|r| r.op == "MatMul" && r.device == gpu0.full_name()),
        "{records:?}"
    );
    // The same runtime without the switch keeps CPU:0 (software adapters are not hardware).
    let plain = builder().build().unwrap();
    assert!(!plain.software_adapters_as_gpus());
    let hardware = plain
        .list_logical_devices("GPU")
        .unwrap()
        .into_iter()
        .find(|d| !d.is_software());
    if hardware.is_none() {
        assert_eq!(plain.default_device().unwrap().name(), "/device:CPU:0");
    }
}

#[test]
fn with_software_adapters_as_gpus_soft_placement_falls_back_to_gpu0_then_the_cpu() {
    let Some((rt, log)) = tf_rules("tf_soft_placement") else {
        return;
    };
    let gpu0 = rt.device("GPU:0").unwrap();
    // A missing device: TF's soft placement picks GPU:0 for an op with a GPU kernel ...
    let c = rt
        .device_scope("/device:GPU:7", || {
            let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
            a.matmul(&a)
        })
        .unwrap()
        .unwrap();
    assert_eq!(c.device(), gpu0.full_name());
    // ... and the CPU for one without (Cumsum is CPU-only).
    let y = rt
        .device_scope("/device:GPU:7", || {
            Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?.cumsum()
        })
        .unwrap()
        .unwrap();
    assert!(y.device().ends_with("CPU:0"), "{}", y.device());
    assert_eq!(y.to_vec::<f32>().unwrap(), [1.0, 3.0, 6.0]);
    let records = log.lock().unwrap().clone();
    assert!(records
        .iter()
        .any(|r| r.op == "MatMul" && r.device == gpu0.full_name()));
    assert!(records
        .iter()
        .any(|r| r.op == "Cumsum" && r.device.ends_with("CPU:0")));
}

#[test]
fn the_environment_variable_turns_software_adapters_into_gpus_and_the_builder_overrides_it() {
    let Some(_) = gpus_at_least(1, "tf_rules_env") else {
        return;
    };
    let on = builder()
        .env("ANYGPU_SOFTWARE_ADAPTERS_AS_GPUS", Some("1"))
        .build()
        .unwrap();
    assert!(on.software_adapters_as_gpus());
    assert_eq!(on.default_device().unwrap(), on.device("GPU:0").unwrap());
    let overridden = builder()
        .env("ANYGPU_SOFTWARE_ADAPTERS_AS_GPUS", Some("1"))
        .software_adapters_as_gpus(false)
        .build()
        .unwrap();
    assert!(!overridden.software_adapters_as_gpus());
    for bad in ["yes", "2"] {
        let rt = builder()
            .env("ANYGPU_SOFTWARE_ADAPTERS_AS_GPUS", Some(bad))
            .configure()
            .unwrap();
        assert!(!rt.software_adapters_as_gpus(), "{bad} is not a switch");
    }
}
