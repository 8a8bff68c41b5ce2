//! GPU memory: the arena under tensors, memory growth, capped virtual devices, statistics and
//! out-of-memory behaviour, on every software adapter found.

mod common;

use anygpu::{DType, Error, Runtime, Tensor};
use common::{builder, gpus_at_least};

const MIB: u64 = 1 << 20;

/// One runtime per physical GPU, showing only that GPU, configured by `configure`.
fn per_gpu(
    test: &str,
    configure: impl Fn(anygpu::RuntimeBuilder) -> anygpu::RuntimeBuilder,
) -> Vec<Runtime> {
    let Some(n) = gpus_at_least(1, test) else {
        return Vec::new();
    };
    (0..n)
        .map(|i| configure(builder().visible_gpus(&[i])).build().unwrap())
        .collect()
}

fn f32s(rt: &Runtime, device: &str, elements: usize) -> anygpu::Result<Tensor> {
    let dev = rt.device(device)?;
    Tensor::zeros_on(&[elements], DType::F32, &dev)
}

#[test]
fn a_four_byte_tensor_takes_256_bytes() {
    for rt in per_gpu("four_bytes", |b| b.memory_growth(true)) {
        let t = f32s(&rt, "GPU:0", 1).unwrap();
        let info = rt.get_memory_info("GPU:0").unwrap();
        assert_eq!((info.current, info.peak), (256, 256));
        drop(t);
        assert_eq!(rt.get_memory_info("GPU:0").unwrap().current, 0);
    }
}

#[test]
fn many_small_tensors_do_not_overlap_and_statistics_add_up() {
    for rt in per_gpu("many_small", |b| b.memory_growth(true)) {
        let dev = rt.device("GPU:0").unwrap();
        // 256 tensors of 1..=256 floats (4..=1024 bytes): TF's 1..1023-byte test, in floats.
        let tensors: Vec<Tensor> = (1..=256)
            .map(|n| {
                Tensor::from_vec((0..n).map(|i| (n * 1000 + i) as f32).collect(), &[n])
                    .map(|t| t.to_device(&dev))
            })
            .map(|t| t.unwrap().unwrap())
            .collect();
        let expected: u64 = (1..=256u64).map(|n| (n * 4).div_ceil(256) * 256).sum();
        let stats = rt.get_memory_stats("GPU:0").unwrap();
        assert_eq!(stats.bytes_in_use, expected);
        assert_eq!(stats.peak_bytes_in_use, expected);
        assert_eq!(stats.largest_alloc_size, 1024);
        assert!(stats.num_allocs >= 256);
        // No overlap: every tensor still holds its own values.
        for (n, t) in (1..=256).zip(&tensors) {
            let v = t.to_vec::<f32>().unwrap();
            assert!(
                v.iter()
                    .enumerate()
                    .all(|(i, &x)| x == (n * 1000 + i) as f32),
                "tensor {n}"
            );
        }
        drop(tensors);
        let stats = rt.get_memory_stats("GPU:0").unwrap();
        assert_eq!(stats.bytes_in_use, 0);
        assert_eq!(stats.peak_bytes_in_use, expected, "peak survives frees");
    }
}

#[test]
fn alloc_free_cycles_do_not_grow_the_pool() {
    for rt in per_gpu("cycles", |b| b.memory_growth(true)) {
        drop(f32s(&rt, "GPU:0", 1000).unwrap());
        let before = rt.get_memory_stats("GPU:0").unwrap();
        for _ in 0..100 {
            drop(f32s(&rt, "GPU:0", 1000).unwrap());
        }
        let after = rt.get_memory_stats("GPU:0").unwrap();
        assert_eq!(after.bytes_reserved, before.bytes_reserved);
        assert_eq!(after.num_regions, before.num_regions);
    }
}

#[test]
fn with_a_2_mib_limit_256_bytes_fit_8_mib_fail_and_256_bytes_still_fit() {
    for rt in per_gpu("two_mib", |b| {
        b.memory_growth(true)
            .env("ANYGPU_GPU_MEMORY_LIMIT_MB", Some("2"))
    }) {
        let small = f32s(&rt, "GPU:0", 64).unwrap();
        let before = rt.get_memory_stats("GPU:0").unwrap();
        let err = f32s(&rt, "GPU:0", 2 << 20).unwrap_err();
        assert!(matches!(err, Error::ResourceExhausted(_)), "{err}");
        let msg = err.to_string();
        assert!(
            msg.starts_with("OOM when allocating tensor with shape[2097152] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc"),
            "{msg}"
        );
        assert!(
            msg.contains("requested 8.0 MiB, limit 2.0 MiB, 256 B in use"),
            "{msg}"
        );
        assert_eq!(
            rt.get_memory_stats("GPU:0").unwrap(),
            before,
            "a failed allocation changes nothing"
        );
        let again = f32s(&rt, "GPU:0", 64).unwrap();
        drop((small, again));
    }
}

#[test]
fn growth_regions_double_from_2_mib_and_stop_at_the_limit() {
    for rt in per_gpu("growth_regions", |b| {
        b.memory_growth(true)
            .env("ANYGPU_GPU_MEMORY_LIMIT_MB", Some("12"))
    }) {
        assert!(
            rt.memory_regions("GPU:0").unwrap().is_empty(),
            "growth reserves nothing up front"
        );
        let a = f32s(&rt, "GPU:0", (MIB / 4) as usize).unwrap(); // 1 MiB
        assert_eq!(rt.memory_regions("GPU:0").unwrap(), vec![2 * MIB]);
        let b = f32s(&rt, "GPU:0", (3 * MIB / 4) as usize).unwrap(); // 3 MiB
        assert_eq!(rt.memory_regions("GPU:0").unwrap(), vec![2 * MIB, 4 * MIB]);
        let c = f32s(&rt, "GPU:0", (5 * MIB / 4) as usize).unwrap(); // 5 MiB: 8 would pass 12
        assert_eq!(
            rt.memory_regions("GPU:0").unwrap(),
            vec![2 * MIB, 4 * MIB, 6 * MIB]
        );
        let stats = rt.get_memory_stats("GPU:0").unwrap();
        assert_eq!(stats.bytes_reserved, 12 * MIB);
        assert_eq!(stats.bytes_limit, 12 * MIB);
        drop((a, b, c));
    }
}

#[test]
fn growth_releases_empty_regions_before_failing() {
    for rt in per_gpu("release_before_fail", |b| {
        b.memory_growth(true)
            .env("ANYGPU_GPU_MEMORY_LIMIT_MB", Some("8"))
    }) {
        // Fill 2 + 4 MiB regions, free everything, then ask for 7 MiB: only possible if the
        // empty regions go back first.
        let a = f32s(&rt, "GPU:0", (MIB / 2) as usize).unwrap();
        let b = f32s(&rt, "GPU:0", (3 * MIB / 4) as usize).unwrap();
        drop((a, b));
        let big = f32s(&rt, "GPU:0", (7 * MIB / 4) as usize).unwrap();
        assert_eq!(rt.memory_regions("GPU:0").unwrap(), vec![8 * MIB]);
        drop(big);
    }
}

#[test]
fn without_growth_one_region_equal_to_the_limit_is_reserved_at_initialization() {
    for rt in per_gpu("no_growth", |b| {
        b.env("ANYGPU_GPU_MEMORY_LIMIT_MB", Some("64"))
    }) {
        assert_eq!(rt.memory_regions("GPU:0").unwrap(), vec![64 * MIB]);
        let stats = rt.get_memory_stats("GPU:0").unwrap();
        assert_eq!((stats.bytes_reserved, stats.bytes_in_use), (64 * MIB, 0));
    }
}

#[test]
fn without_growth_tensors_fill_every_region_of_the_reservation() {
    // 512 MiB in regions of at most one storage binding (llvmpipe's GL: 128 MiB, created when
    // their first tensor arrives; lavapipe: one of 512 MiB, created now). The figures are the
    // whole reservation at once either way, and a tensor of just over half a region lands in
    // each region in turn and keeps its values.
    for rt in per_gpu("no_growth_regions", |b| {
        b.env("ANYGPU_GPU_MEMORY_LIMIT_MB", Some("512"))
    }) {
        let regions = rt.memory_regions("GPU:0").unwrap();
        assert_eq!(regions.iter().sum::<u64>(), 512 * MIB, "{regions:?}");
        let stats = rt.get_memory_stats("GPU:0").unwrap();
        assert_eq!((stats.bytes_reserved, stats.bytes_in_use), (512 * MIB, 0));
        let region = regions[0];
        let elements = (region / 2 / 4 + 1024) as usize;
        let dev = rt.device("GPU:0").unwrap();
        let tensors: Vec<Tensor> = (0..regions.len())
            .map(|k| Tensor::from_slice_on(&vec![k as f32 + 1.0; elements], &[elements], &dev))
            .collect::<anygpu::Result<_>>()
            .unwrap();
        for (k, t) in tensors.iter().enumerate() {
            let v = t.to_vec::<f32>().unwrap();
            assert!(
                v.iter().all(|&x| x == k as f32 + 1.0),
                "tensor {k} of {regions:?}"
            );
        }
        let used = rt.get_memory_info("GPU:0").unwrap().current;
        assert_eq!(
            used,
            regions.len() as u64 * (elements as u64 * 4),
            "{regions:?}"
        );
        assert_eq!(rt.memory_regions("GPU:0").unwrap(), regions);
    }
}

#[test]
fn peak_survives_a_free_and_reset_lowers_it_to_current() {
    for rt in per_gpu("peak_reset", |b| b.memory_growth(true)) {
        let keep = f32s(&rt, "GPU:0", 1000).unwrap();
        drop(f32s(&rt, "GPU:0", 100_000).unwrap());
        let info = rt.get_memory_info("GPU:0").unwrap();
        assert_eq!(info.current, 4096);
        assert_eq!(info.peak, 4096 + 400_128);
        rt.reset_memory_stats("GPU:0").unwrap();
        let stats = rt.get_memory_stats("GPU:0").unwrap();
        assert_eq!(
            (
                stats.peak_bytes_in_use,
                stats.num_allocs,
                stats.largest_alloc_size
            ),
            (4096, 0, 0)
        );
        drop(keep);
    }
}

#[test]
fn a_virtual_devices_cap_holds_while_its_sibling_still_allocates() {
    let Some(_) = gpus_at_least(1, "virtual_cap") else {
        return;
    };
    let rt = builder().virtual_gpus(0, &[16, 16]).build().unwrap();
    let first = f32s(&rt, "GPU:0", (12 * MIB / 4) as usize).unwrap();
    let err = f32s(&rt, "GPU:0", (8 * MIB / 4) as usize).unwrap_err();
    assert!(err.to_string().contains("by allocator GPU_0_bfc"), "{err}");
    let sibling = f32s(&rt, "GPU:1", (12 * MIB / 4) as usize).unwrap();
    assert_eq!(rt.get_memory_info("GPU:1").unwrap().current, 12 * MIB);
    assert_eq!(rt.get_memory_info("GPU:0").unwrap().current, 12 * MIB);
    drop((first, sibling));
}

#[test]
fn several_threads_allocate_and_free_on_one_device() {
    for rt in per_gpu("threads", |b| b.memory_growth(true)) {
        let dev = rt.device("GPU:0").unwrap();
        std::thread::scope(|s| {
            for t in 0..4 {
                let dev = dev.clone();
                s.spawn(move || {
                    let mut live = Vec::new();
                    for i in 0..200usize {
                        let n = 1 + (i * 37 + t * 101) % 5000;
                        live.push(Tensor::zeros_on(&[n], DType::F32, &dev).unwrap());
                        if i % 3 == 0 {
                            live.swap_remove((i * 7) % live.len());
                        }
                    }
                });
            }
        });
        let stats = rt.get_memory_stats("GPU:0").unwrap();
        assert_eq!(stats.bytes_in_use, 0, "every tensor went back");
    }
}

#[test]
fn memory_statistics_need_a_gpu_device_name() {
    let rt = builder().build().unwrap();
    let err = rt.get_memory_info("CPU:0").unwrap_err();
    assert_eq!(
        err.to_string(),
        "Allocator stats not available for device 'CPU:0'"
    );
    let err = rt.get_memory_info("GPU:42").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("No matching devices found for 'GPU:42'"),
        "{err}"
    );
    let err = rt.reset_memory_stats("CPU:0").unwrap_err();
    assert_eq!(
        err.to_string(),
        "Cannot reset memory stats for device 'CPU:0'"
    );
    let err = rt.get_memory_info("GPU").unwrap_err();
    assert_eq!(
        err.to_string(),
        "Failed parsing device name: 'GPU'. Note a valid device string should at least contain \
         a device type and a device index, like \"GPU:0\"."
    );
}

#[test]
fn a_tensor_larger_than_one_storage_binding_is_refused_clearly() {
    for rt in per_gpu("too_large", |b| {
        b.memory_growth(true)
            .env("ANYGPU_GPU_MEMORY_LIMIT_MB", Some("4096"))
    }) {
        let dev = rt.device("GPU:0").unwrap();
        let max = rt
            .get_device_details(&rt.list_physical_devices("GPU")[0])
            .unwrap()
            .gpu
            .unwrap()
            .max_storage_buffer_binding_size;
        let elements = (max / 4 + 1024) as usize;
        let err = Tensor::zeros_on(&[elements], DType::F32, &dev).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::TooLarge { .. }), "{msg}");
        assert!(msg.contains("exceeds /job:localhost/replica:0/task:0/device:GPU:0 max_storage_buffer_binding_size"), "{msg}");
    }
}

#[test]
fn after_a_region_enlarged_to_fit_a_request_the_next_region_is_the_same_size() {
    for rt in per_gpu("enlarged_region", |b| {
        b.memory_growth(true)
            .env("ANYGPU_GPU_MEMORY_LIMIT_MB", Some("64"))
    }) {
        // 5 MiB does not fit the next 2 MiB region: it is enlarged 2 -> 4 -> 8 MiB. TF's
        // Extend then keeps 8 MiB for the region after, rather than doubling to 16.
        let a = f32s(&rt, "GPU:0", (5 * MIB / 4) as usize).unwrap();
        assert_eq!(rt.memory_regions("GPU:0").unwrap(), vec![8 * MIB]);
        let b = f32s(&rt, "GPU:0", (5 * MIB / 4) as usize).unwrap();
        assert_eq!(rt.memory_regions("GPU:0").unwrap(), vec![8 * MIB, 8 * MIB]);
        // A region that was not enlarged doubles the next one again.
        let c = f32s(&rt, "GPU:0", (5 * MIB / 4) as usize).unwrap();
        assert_eq!(
            rt.memory_regions("GPU:0").unwrap(),
            vec![8 * MIB, 8 * MIB, 16 * MIB]
        );
        drop((a, b, c));
    }
}

#[test]
fn a_failed_allocation_under_growth_keeps_live_tensors_and_hands_empty_regions_back() {
    for rt in per_gpu("oom_releases_empty", |b| {
        b.memory_growth(true)
            .env("ANYGPU_GPU_MEMORY_LIMIT_MB", Some("8"))
    }) {
        let keep =
            Tensor::from_slice_on(&[7.0f32; 1024], &[1024], &rt.device("GPU:0").unwrap()).unwrap(); // in the first 2 MiB region
        drop(f32s(&rt, "GPU:0", (3 * MIB / 4) as usize).unwrap()); // a 4 MiB region, now empty
        assert_eq!(rt.memory_regions("GPU:0").unwrap(), vec![2 * MIB, 4 * MIB]);
        let before = rt.get_memory_stats("GPU:0").unwrap();
        let err = f32s(&rt, "GPU:0", (7 * MIB / 4) as usize).unwrap_err();
        assert!(matches!(err, Error::ResourceExhausted(_)), "{err}");
        // As TF's DeallocateFreeRegions: the empty region went back while making room.
        assert_eq!(rt.memory_regions("GPU:0").unwrap(), vec![2 * MIB]);
        let after = rt.get_memory_stats("GPU:0").unwrap();
        assert_eq!(after.bytes_in_use, before.bytes_in_use);
        assert_eq!(after.num_allocs, before.num_allocs);
        assert_eq!(keep.to_vec::<f32>().unwrap(), vec![7.0f32; 1024]);
    }
}
