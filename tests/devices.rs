//! Device discovery, visibility, memory growth and virtual-device configuration, and the freeze
//! at initialization (the tf.config issue), on explicit runtimes; and the bound on the host's
//! waits for a GPU (`ANYGPU_WAIT_TIMEOUT_S`).

mod common;

use anygpu::{DeviceKind, Error, KindFilter, LogicalDeviceConfiguration, PhysicalDevice};
use common::{builder, gpus_at_least};

fn gpu(rt: &anygpu::Runtime, i: usize) -> PhysicalDevice {
    rt.list_physical_devices("GPU")[i].clone()
}

#[test]
fn listing_physical_devices_does_not_initialize() {
    let rt = builder().configure().unwrap();
    let all = rt.list_physical_devices(KindFilter::All);
    assert_eq!(all[0].name(), "/physical_device:CPU:0");
    for (i, d) in all[1..].iter().enumerate() {
        assert_eq!(d.name(), format!("/physical_device:GPU:{i}"));
        assert_eq!(d.device_type(), DeviceKind::Gpu);
    }
    assert_eq!(rt.list_physical_devices("CPU").len(), 1);
    assert!(
        rt.list_physical_devices("TPU").is_empty(),
        "unknown kinds list nothing"
    );
    // TF's device types are case-sensitive: "gpu" is no kind at all.
    assert!(rt.list_physical_devices("gpu").is_empty());
    assert!(rt.list_physical_devices("cpu").is_empty());
    assert!(rt.get_visible_devices("gpu").is_empty());
    let _ = rt.get_device_details(&all[0]).unwrap();
    assert!(!rt.is_initialized());
}

#[test]
fn logical_devices_are_the_cpu_and_one_per_gpu() {
    let rt = builder().configure().unwrap();
    let physical = rt.list_physical_devices("GPU").len();
    let logical = rt.list_logical_devices(KindFilter::All).unwrap();
    assert!(rt.is_initialized());
    assert_eq!(logical[0].name(), "/device:CPU:0");
    let gpus: Vec<_> = logical
        .iter()
        .filter(|d| d.device_type() == DeviceKind::Gpu)
        .collect();
    assert_eq!(gpus.len(), physical);
    for (i, d) in gpus.iter().enumerate() {
        assert_eq!(d.name(), format!("/device:GPU:{i}"));
        assert_eq!(
            d.full_name(),
            format!("/job:localhost/replica:0/task:0/device:GPU:{i}")
        );
    }
}

#[test]
fn both_software_adapters_appear_with_vulkan_and_gl() {
    if !(common::backends().contains("vulkan") && common::backends().contains("gl")) {
        eprintln!("SKIPPED: WGPU_BACKEND does not name vulkan and gl");
        return;
    }
    let Some(_) = gpus_at_least(2, "both_software_adapters_appear") else {
        return;
    };
    let rt = builder().configure().unwrap();
    let backends: Vec<String> = rt
        .list_physical_devices("GPU")
        .iter()
        .map(|pd| rt.get_device_details(pd).unwrap().backend)
        .collect();
    assert!(backends.contains(&"Vulkan".to_string()), "{backends:?}");
    assert!(backends.contains(&"Gl".to_string()), "{backends:?}");
    // Native APIs are listed before GL.
    assert_eq!(backends[0], "Vulkan");
}

#[test]
fn device_details_report_the_limits_that_matter() {
    let Some(_) = gpus_at_least(1, "device_details") else {
        return;
    };
    let rt = builder().configure().unwrap();
    let details = rt.get_device_details(&gpu(&rt, 0)).unwrap();
    let g = details.gpu.expect("a GPU has adapter details");
    assert!(g.max_storage_buffer_binding_size >= 128 << 20);
    assert!(g.max_compute_invocations_per_workgroup >= 256);
    assert!(g.min_storage_buffer_offset_alignment.is_power_of_two());
    if details.backend == "Vulkan" {
        assert!(
            g.memory_bytes.is_some_and(|m| m > 0),
            "Vulkan reports its device-local heap"
        );
    }
    let cpu = rt
        .get_device_details(&rt.list_physical_devices("CPU")[0])
        .unwrap();
    assert!(cpu.gpu.is_none());
}

#[test]
fn hiding_every_gpu_leaves_only_the_cpu() {
    let rt = builder().configure().unwrap();
    rt.set_visible_devices(&[], DeviceKind::Gpu).unwrap();
    assert!(rt.get_visible_devices("GPU").is_empty());
    let logical = rt.list_logical_devices(KindFilter::All).unwrap();
    assert_eq!(logical.len(), 1);
    assert_eq!(rt.default_device().unwrap().name(), "/device:CPU:0");
}

#[test]
fn hiding_gpu0_renumbers_the_rest_from_zero() {
    let Some(_) = gpus_at_least(2, "hiding_gpu0_renumbers") else {
        return;
    };
    let rt = builder().configure().unwrap();
    let second = gpu(&rt, 1);
    let second_name = rt.get_device_details(&second).unwrap().device_name;
    let second_backend = rt.get_device_details(&second).unwrap().backend;
    rt.set_visible_devices(std::slice::from_ref(&second), DeviceKind::Gpu)
        .unwrap();
    assert_eq!(rt.get_visible_devices("GPU"), vec![second]);
    let gpus = rt.list_logical_devices("GPU").unwrap();
    assert_eq!(gpus.len(), 1);
    assert_eq!(gpus[0].name(), "/device:GPU:0");
    assert_eq!(gpus[0].adapter_name(), second_name);
    assert_eq!(format!("{:?}", gpus[0].backend().unwrap()), second_backend);
}

#[test]
fn devices_not_listed_or_of_another_kind_are_unrecognized() {
    let rt = builder().configure().unwrap();
    let cpu = rt.list_physical_devices("CPU")[0].clone();
    let err = rt
        .set_visible_devices(std::slice::from_ref(&cpu), DeviceKind::Gpu)
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("Unrecognized device: PhysicalDevice(name='/physical_device:CPU:0'"),
        "{err}"
    );
    let err = rt.set_visible_devices(&[], DeviceKind::Cpu).unwrap_err();
    assert!(err.to_string().contains("CPU cannot be hidden"), "{err}");
    // A GPU listed by a runtime that sees more GPUs than this one is not this one's.
    let hidden = builder()
        .env("ANYGPU_VISIBLE_DEVICES", Some(""))
        .configure()
        .unwrap();
    if let Some(pd) = rt.list_physical_devices("GPU").first() {
        let err = hidden.get_memory_growth(pd).unwrap_err();
        assert!(err.to_string().starts_with("Unrecognized device:"), "{err}");
    }
    let err = rt.set_memory_growth(&cpu, true).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Cannot set memory growth on non-GPU and non-Pluggable devices"
    );
}

#[test]
fn on_a_device_with_virtual_devices_the_virtual_devices_error_comes_first() {
    let rt = builder().virtual_cpus(2).configure().unwrap();
    let cpu = rt.list_physical_devices("CPU")[0].clone();
    let err = rt.set_memory_growth(&cpu, true).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Cannot set memory growth on device when virtual devices configured"
    );
}

#[test]
fn set_logical_device_configuration_checks_its_arguments_before_the_initialization_state() {
    let rt = builder().build().unwrap();
    let cpu = rt.list_physical_devices("CPU")[0].clone();
    let err = rt
        .set_logical_device_configuration(
            &cpu,
            &[LogicalDeviceConfiguration::new().memory_limit(1)],
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument(_)),
        "the argument error, not 'already initialized': {err}"
    );
    let Some(_) = gpus_at_least(1, "virtual_args_first") else {
        return;
    };
    let err = rt
        .set_logical_device_configuration(&gpu(&rt, 0), &[LogicalDeviceConfiguration::new()])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Setting memory limit is required for GPU virtual devices"
    );
}

#[test]
fn memory_limits_of_2_pow_64_bytes_or_more_are_refused_not_wrapped() {
    let Some(_) = gpus_at_least(1, "memory_limit_overflow") else {
        return;
    };
    let rt = builder().configure().unwrap();
    let pd = gpu(&rt, 0);
    // 2^44 MiB = 2^64 bytes: `<< 20` made this a 0-byte GPU.
    let err = rt
        .set_logical_device_configuration(
            &pd,
            &[LogicalDeviceConfiguration::new().memory_limit(17_592_186_044_416)],
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "memory_limit of 17592186044416 MiB for a virtual device of /physical_device:GPU:0 is \
         2^64 bytes or more (at most 17592186044415 MiB)"
    );
    assert_eq!(rt.get_logical_device_configuration(&pd).unwrap(), None);
    let rt = builder()
        .env("ANYGPU_GPU_MEMORY_LIMIT_MB", Some("17592186044416"))
        .configure()
        .unwrap();
    let err = rt.initialize().unwrap_err();
    assert_eq!(
        err.to_string(),
        "ANYGPU_GPU_MEMORY_LIMIT_MB=17592186044416 is 2^64 bytes or more (at most \
         17592186044415 MiB)"
    );
    assert!(!rt.is_initialized());
}

#[test]
fn changing_visible_devices_after_initialization_fails_and_the_same_value_is_a_no_op() {
    let rt = builder().configure().unwrap();
    rt.initialize().unwrap();
    let current = rt.get_visible_devices("GPU");
    rt.set_visible_devices(&current, DeviceKind::Gpu).unwrap();
    if current.is_empty() {
        return;
    }
    let err = rt.set_visible_devices(&[], DeviceKind::Gpu).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Visible devices cannot be modified after being initialized"
    );
    assert!(matches!(err, Error::AlreadyInitialized(_)));
}

#[test]
fn changing_memory_growth_after_initialization_fails_and_the_same_value_is_a_no_op() {
    let Some(_) = gpus_at_least(1, "growth_after_init") else {
        return;
    };
    let rt = builder().memory_growth(true).build().unwrap();
    let pd = gpu(&rt, 0);
    rt.set_memory_growth(&pd, true).unwrap();
    let err = rt.set_memory_growth(&pd, false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Physical devices cannot be modified after being initialized"
    );
}

#[test]
fn changing_virtual_devices_after_initialization_fails_and_the_same_value_is_a_no_op() {
    let Some(_) = gpus_at_least(1, "virtual_after_init") else {
        return;
    };
    let rt = builder().virtual_gpus(0, &[64, 64]).build().unwrap();
    let pd = gpu(&rt, 0);
    let same = vec![LogicalDeviceConfiguration::new().memory_limit(64); 2];
    rt.set_logical_device_configuration(&pd, &same).unwrap();
    let err = rt
        .set_logical_device_configuration(
            &pd,
            &[LogicalDeviceConfiguration::new().memory_limit(32)],
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Virtual devices cannot be modified after being initialized"
    );
}

#[test]
fn memory_growth_is_unset_until_set() {
    let Some(_) = gpus_at_least(1, "growth_default") else {
        return;
    };
    let rt = builder().configure().unwrap();
    let pd = gpu(&rt, 0);
    assert_eq!(rt.get_memory_growth(&pd).unwrap(), None);
    rt.set_memory_growth(&pd, true).unwrap();
    assert_eq!(rt.get_memory_growth(&pd).unwrap(), Some(true));
}

#[test]
fn differing_memory_growth_fails_at_initialization_and_hiding_the_odd_gpu_fixes_it() {
    let Some(_) = gpus_at_least(2, "differing_growth") else {
        return;
    };
    let rt = builder().configure().unwrap();
    rt.set_memory_growth(&gpu(&rt, 0), true).unwrap();
    rt.set_memory_growth(&gpu(&rt, 1), false).unwrap();
    let err = rt.initialize().unwrap_err();
    assert_eq!(
        err.to_string(),
        "Memory growth cannot differ between GPU devices"
    );
    assert!(
        !rt.is_initialized(),
        "a failed initialization leaves the runtime configurable"
    );
    rt.set_visible_devices(&[gpu(&rt, 0)], DeviceKind::Gpu)
        .unwrap();
    rt.initialize().unwrap();
    assert_eq!(rt.list_logical_devices("GPU").unwrap().len(), 1);
}

#[test]
fn two_virtual_devices_on_gpu0_give_one_more_logical_gpu() {
    let Some(n) = gpus_at_least(1, "two_virtual_devices") else {
        return;
    };
    let rt = builder().virtual_gpus(0, &[64, 64]).build().unwrap();
    let gpus = rt.list_logical_devices("GPU").unwrap();
    assert_eq!(gpus.len(), n + 1);
    assert_eq!(gpus[0].physical_index(), Some(0));
    assert_eq!(gpus[1].physical_index(), Some(0));
    for name in ["GPU:0", "GPU:1"] {
        assert_eq!(rt.get_memory_stats(name).unwrap().bytes_limit, 64 << 20);
    }
}

#[test]
fn memory_growth_after_virtual_devices_is_an_error_and_get_memory_growth_keeps_the_setting() {
    let Some(_) = gpus_at_least(1, "growth_virtual_interplay") else {
        return;
    };
    let rt = builder().configure().unwrap();
    let pd = gpu(&rt, 0);
    rt.set_memory_growth(&pd, true).unwrap();
    rt.set_logical_device_configuration(&pd, &[LogicalDeviceConfiguration::new().memory_limit(64)])
        .unwrap();
    assert_eq!(
        rt.get_memory_growth(&pd).unwrap(),
        Some(true),
        "TF reports the value set, though virtual devices turn growth off"
    );
    let err = rt.set_memory_growth(&pd, true).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Cannot set memory growth on device when virtual devices configured"
    );
    assert_eq!(
        rt.get_logical_device_configuration(&pd).unwrap().unwrap(),
        vec![LogicalDeviceConfiguration::new().memory_limit(64)]
    );
}

#[test]
fn virtual_devices_on_one_gpu_turn_memory_growth_off_for_every_gpu() {
    let Some(_) = gpus_at_least(2, "virtual_disables_growth_everywhere") else {
        return;
    };
    let rt = builder()
        .memory_growth(true)
        .virtual_gpus(0, &[16])
        .env("ANYGPU_GPU_MEMORY_LIMIT_MB", Some("32"))
        .build()
        .unwrap();
    let gpus = rt.list_logical_devices("GPU").unwrap();
    assert_eq!(gpus[1].physical_index(), Some(1));
    assert_eq!(rt.get_memory_growth(&gpu(&rt, 1)).unwrap(), Some(true));
    assert_eq!(
        rt.get_memory_stats("GPU:1").unwrap().bytes_reserved,
        32 << 20,
        "the other GPU reserves its whole budget: allow_growth is process-wide"
    );
}

#[test]
fn a_virtual_gpu_needs_a_memory_limit_and_a_virtual_cpu_must_not_have_one() {
    let rt = builder().configure().unwrap();
    let cpu = rt.list_physical_devices("CPU")[0].clone();
    let err = rt
        .set_logical_device_configuration(
            &cpu,
            &[LogicalDeviceConfiguration::new().memory_limit(1)],
        )
        .unwrap_err();
    assert!(err.to_string().contains("memory limit on CPU"), "{err}");
    rt.set_logical_device_configuration(&cpu, &[LogicalDeviceConfiguration::new(); 2])
        .unwrap();
    assert_eq!(rt.list_logical_devices("CPU").unwrap().len(), 2);
    let Some(_) = gpus_at_least(1, "virtual_gpu_needs_limit") else {
        return;
    };
    let rt = builder().configure().unwrap();
    let err = rt
        .set_logical_device_configuration(&gpu(&rt, 0), &[LogicalDeviceConfiguration::new()])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Setting memory limit is required for GPU virtual devices"
    );
}

#[test]
fn device_names_resolve_or_fail_with_tensorflows_messages() {
    let rt = builder().virtual_cpus(2).configure().unwrap();
    for name in [
        "CPU:0",
        "/cpu:0",
        "/device:CPU:0",
        "/job:localhost/replica:0/task:0/device:CPU:0",
        "cpu:1",
    ] {
        rt.device(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    for bad in ["GPU", "GPU:", "GPU:CPU"] {
        assert_eq!(
            rt.device(bad).unwrap_err().to_string(),
            format!("Failed parsing device name: '{bad}'. Note a valid device string should at least contain a device type and a device index, like \"GPU:0\".")
        );
    }
    let err = rt.device("unknown_device:0").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("No matching devices found for 'unknown_device:0'"),
        "{err}"
    );
    let err = rt.device("GPU:9").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("No matching devices found for 'GPU:9'"),
        "{err}"
    );
    let err = rt.device("/device:CPU:*").unwrap_err();
    assert_eq!(
        err.to_string(),
        "Multiple devices match the provided string '/device:CPU:*': \
         '/job:localhost/replica:0/task:0/device:CPU:0' and \
         '/job:localhost/replica:0/task:0/device:CPU:1'."
    );
}

#[test]
fn anygpu_visible_devices_picks_and_orders_gpus() {
    let Some(n) = gpus_at_least(2, "visible_env") else {
        return;
    };
    let plain = builder().configure().unwrap();
    let names: Vec<String> = plain
        .list_physical_devices("GPU")
        .iter()
        .map(|pd| plain.get_device_details(pd).unwrap().backend)
        .collect();
    let rt = builder()
        .env("ANYGPU_VISIBLE_DEVICES", Some("1,0"))
        .configure()
        .unwrap();
    let swapped: Vec<String> = rt
        .list_physical_devices("GPU")
        .iter()
        .map(|pd| rt.get_device_details(pd).unwrap().backend)
        .collect();
    assert_eq!(swapped, vec![names[1].clone(), names[0].clone()]);
    let none = builder()
        .env("ANYGPU_VISIBLE_DEVICES", Some(""))
        .configure()
        .unwrap();
    assert!(none.list_physical_devices("GPU").is_empty());
    // As CUDA_VISIBLE_DEVICES: the list ends at its first invalid entry.
    let some = builder()
        .env("ANYGPU_VISIBLE_DEVICES", Some("1,-1,0"))
        .configure()
        .unwrap();
    assert_eq!(some.list_physical_devices("GPU").len(), 1);
    assert_eq!(
        some.get_device_details(&some.list_physical_devices("GPU")[0])
            .unwrap()
            .backend,
        names[1]
    );
    // The API then picks among what the variable left.
    some.set_visible_devices(&[], DeviceKind::Gpu).unwrap();
    assert!(some.list_logical_devices("GPU").unwrap().is_empty());
    assert!(n >= 2);
}

#[test]
fn force_gpu_allow_growth_overrides_the_setting() {
    let Some(_) = gpus_at_least(1, "force_growth") else {
        return;
    };
    let rt = builder()
        .env("ANYGPU_FORCE_GPU_ALLOW_GROWTH", Some("true"))
        .env("ANYGPU_GPU_MEMORY_LIMIT_MB", Some("64"))
        .visible_gpus(&[0])
        .build()
        .unwrap();
    assert_eq!(
        rt.get_memory_stats("GPU:0").unwrap().bytes_reserved,
        0,
        "growth: nothing reserved"
    );
    let rt = builder()
        .env("ANYGPU_FORCE_GPU_ALLOW_GROWTH", Some("false"))
        .env("ANYGPU_GPU_MEMORY_LIMIT_MB", Some("64"))
        .visible_gpus(&[0])
        .memory_growth(true)
        .build()
        .unwrap();
    assert_eq!(
        rt.get_memory_stats("GPU:0").unwrap().bytes_reserved,
        64 << 20
    );
    // Any other value is logged and ignored.
    let rt = builder()
        .env("ANYGPU_FORCE_GPU_ALLOW_GROWTH", Some("maybe"))
        .env("ANYGPU_GPU_MEMORY_LIMIT_MB", Some("64"))
        .visible_gpus(&[0])
        .memory_growth(true)
        .build()
        .unwrap();
    assert_eq!(rt.get_memory_stats("GPU:0").unwrap().bytes_reserved, 0);
}

#[test]
fn two_runtimes_in_one_process_do_not_see_each_others_settings() {
    let a = builder().virtual_cpus(3).configure().unwrap();
    let b = builder().configure().unwrap();
    a.set_log_device_placement(true);
    assert!(!b.get_log_device_placement());
    a.initialize().unwrap();
    assert_eq!(a.list_logical_devices("CPU").unwrap().len(), 3);
    assert_eq!(b.list_logical_devices("CPU").unwrap().len(), 1);
    assert!(b.is_initialized());
}

#[test]
fn placement_settings_can_change_after_initialization() {
    let rt = builder().build().unwrap();
    assert!(
        rt.get_soft_device_placement(),
        "soft placement is on by default"
    );
    rt.set_soft_device_placement(false);
    rt.set_log_device_placement(true);
    assert!(!rt.get_soft_device_placement());
    assert!(rt.get_log_device_placement());
}

#[test]
fn setters_racing_first_use_either_apply_or_fail_and_devices_are_created_once() {
    use std::sync::Barrier;
    // No adapters: each round initializes in microseconds, so the threads really race.
    let bare = || {
        anygpu::Runtime::builder()
            .env("WGPU_BACKEND", Some(""))
            .env("ANYGPU_REQUIRE_ADAPTER", None)
            .configure()
            .unwrap()
    };
    for _round in 0..200 {
        let rt = bare();
        let cpu = rt.list_physical_devices("CPU")[0].clone();
        let barrier = Barrier::new(5);
        let (applied, seen) = std::thread::scope(|s| {
            let setter = s.spawn(|| {
                barrier.wait();
                let mut applied = None;
                for k in 0..100_000 {
                    let count = 1 + k % 7;
                    let configs = vec![LogicalDeviceConfiguration::new(); count];
                    match rt.set_logical_device_configuration(&cpu, &configs) {
                        Ok(()) => applied = Some(count),
                        Err(Error::AlreadyInitialized(what)) => {
                            assert_eq!(what, "Virtual devices");
                            break;
                        }
                        Err(other) => panic!("{other}"),
                    }
                }
                applied
            });
            let listers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        rt.list_logical_devices("CPU").unwrap().len()
                    })
                })
                .collect();
            let seen: Vec<usize> = listers.into_iter().map(|h| h.join().unwrap()).collect();
            (setter.join().unwrap(), seen)
        });
        let created = rt.list_logical_devices("CPU").unwrap().len();
        assert_eq!(
            created,
            applied.unwrap_or(1),
            "the last setter that returned Ok is the configuration in force"
        );
        assert!(seen.iter().all(|&n| n == created), "{seen:?} vs {created}");
        assert_eq!(rt.initialization_count(), 1, "devices are created once");
    }
}

/// A host wait on a GPU past `ANYGPU_WAIT_TIMEOUT_S` fails, with an error naming the device,
/// the wait and the limit, instead of blocking for as long as the device takes (a hung kernel
/// would block forever); under the default limit the same work reads back. (GL runs a
/// submission as it is made, so its work is done before any wait: only Vulkan adapters are
/// held to the error.)
#[test]
fn a_wait_past_the_timeout_fails_naming_the_device_and_the_limit() {
    let work = |rt: &anygpu::Runtime| -> Vec<(bool, anygpu::Result<Vec<f32>>)> {
        let gpus = rt.list_logical_devices("GPU").expect("GPUs");
        gpus.iter()
            .map(|dev| {
                let _scope = dev.scope();
                let read = || {
                    let values: Vec<f32> = (0..512 * 512).map(|i| (i % 7) as f32 * 1e-3).collect();
                    let a = anygpu::Tensor::from_slice_on(&values, &[512, 512], dev)?;
                    let mut c = a.matmul(&a)?;
                    for _ in 0..8 {
                        c = c.matmul(&a)?;
                    }
                    c.to_vec::<f32>()
                };
                (dev.backend() == Some(wgpu::Backend::Vulkan), read())
            })
            .collect()
    };
    common::gpus_at_least(
        1,
        "a_wait_past_the_timeout_fails_naming_the_device_and_the_limit",
    );
    let short = common::builder()
        .env("ANYGPU_WAIT_TIMEOUT_S", Some("0.000001"))
        .build()
        .expect("a runtime");
    for (vulkan, result) in work(&short) {
        match result {
            Err(err) => {
                let message = err.to_string();
                assert!(
                    message.contains("device:GPU:")
                        && message.contains("did not finish within 1µs")
                        && message.contains("ANYGPU_WAIT_TIMEOUT_S"),
                    "{message}"
                );
            }
            Ok(_) => assert!(!vulkan, "8 products of 512×512 matrices took under 1 µs"),
        }
    }
    drop(short);
    let default = common::builder().build().expect("a runtime");
    for (_, result) in work(&default) {
        let values = result.expect("the default limit");
        assert!(values.iter().all(|v| v.is_finite()));
    }
}
