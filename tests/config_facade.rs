//! The process-wide `tf.config` facade. One test in its own binary: the facade's runtime is
//! global, so the steps run in order in one function.

mod common;

use anygpu::{config, DeviceKind, Tensor};

#[test]
fn the_facade_configures_freezes_and_reports_like_tf_config() {
    // The global runtime reads the process environment; this binary owns it.
    std::env::set_var("WGPU_BACKEND", common::backends());
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
    if let Some(first) = gpus.first() {
        assert!(t.device().ends_with("GPU:0"), "default placement is GPU:0");
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
    } else {
        assert!(t.device().ends_with("CPU:0"));
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
    assert!(err
        .to_string()
        .starts_with("Could not satisfy device specification '/device:GPU:9'"));
}
