//! The process-wide `tf.config` facade. One test in its own binary: the facade's runtime is
//! global, so the steps run in order in one function. Like every test, it leaves the process
//! environment alone: the global runtime reads `WGPU_BACKEND` as the test run sets it.

mod common;

use anygpu::{config, DeviceKind, Error, Tensor};

#[test]
fn the_facade_configures_freezes_and_reports_like_tf_config() {
    // Ops on a tensor whose runtime was dropped fail; they do not wake the global runtime.
    let rt = common::builder().build().unwrap();
    let t = Tensor::from_slice_on(&[1.0f32], &[1], &rt.cpu().unwrap()).unwrap();
    drop(rt);
    assert!(matches!(t.add(&t).unwrap_err(), Error::Unavailable(_)));
    assert!(!config::runtime().is_initialized());

    let gpus = config::list_physical_devices(DeviceKind::Gpu);
    if gpus.is_empty() && common::adapter_required() {
        panic!("ANYGPU_REQUIRE_ADAPTER=1 but no GPU adapter was found");
    }
    assert!(
        !config::runtime().is_initialized(),
        "listing does not initialize"
    );
    for gpu in &gpus {
        config::set_memory_growth(gpu, true).unwrap();
        assert_eq!(config::get_memory_growth(gpu).unwrap(), Some(true));
    }
    config::set_log_device_placement(true);
    let logical = config::list_logical_devices("GPU").unwrap();
    assert_eq!(logical.len(), gpus.len());
    assert!(config::runtime().is_initialized());

    let t = Tensor::from_vec(vec![1.0f32; 1000], &[1000]).unwrap();
    let default = config::runtime().default_device().unwrap();
    assert_eq!(t.device(), default.full_name(), "default placement");
    drop(t);
    if let Some(first) = gpus.first() {
        let on_gpu = anygpu::device("GPU:0", || Tensor::from_vec(vec![1.0f32; 1000], &[1000]))
            .unwrap()
            .unwrap();
        assert!(on_gpu.device().ends_with("GPU:0"));
        let info = config::get_memory_info("GPU:0").unwrap();
        assert_eq!(info.current, 4096);
        config::reset_memory_stats("GPU:0").unwrap();
        let err = config::set_memory_growth(first, false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Physical devices cannot be modified after being initialized"
        );
        config::set_memory_growth(first, true).unwrap();
        let err = config::set_visible_devices(&[], DeviceKind::Gpu).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Visible devices cannot be modified after being initialized"
        );
        drop(on_gpu);
    } else {
        assert_eq!(default.name(), "/device:CPU:0");
    }
    let err = config::get_memory_info("CPU:0").unwrap_err();
    assert_eq!(
        err.to_string(),
        "Allocator stats not available for device 'CPU:0'"
    );
    config::set_soft_device_placement(false);
    assert!(!config::get_soft_device_placement());
    let err = anygpu::device("GPU:9", || Tensor::zeros(&[1]))
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().starts_with(
        "Could not satisfy device specification '/job:localhost/replica:0/task:0/device:GPU:9'"
    ));
}
