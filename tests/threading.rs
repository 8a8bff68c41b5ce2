//! `tf.config.threading` and logical CPUs with thread pools of their own.

mod common;

use anygpu::ops::reference as r;
use anygpu::{DeviceKind, Error, LogicalDeviceConfiguration, Tensor};
use common::builder;

#[test]
fn intra_and_inter_op_parallelism_follow_tensorflow() {
    let rt = builder().configure().unwrap();
    assert_eq!(rt.get_intra_op_parallelism_threads(), 0);
    assert_eq!(rt.get_inter_op_parallelism_threads(), 0);
    rt.set_intra_op_parallelism_threads(2).unwrap();
    rt.set_inter_op_parallelism_threads(3).unwrap();
    assert_eq!(rt.get_intra_op_parallelism_threads(), 2);
    assert_eq!(rt.get_inter_op_parallelism_threads(), 3);

    let cpus = rt.list_logical_devices("CPU").unwrap(); // initializes
    assert_eq!(
        cpus[0].threads(),
        2,
        "the intra-op count sizes the CPU's pool"
    );
    // The same value again is no change; another is TF's RuntimeError.
    rt.set_intra_op_parallelism_threads(2).unwrap();
    let intra = rt.set_intra_op_parallelism_threads(1).unwrap_err();
    assert!(matches!(intra, Error::ThreadingInitialized(_)));
    assert_eq!(
        intra.to_string(),
        "Intra op parallelism cannot be modified after initialization."
    );
    assert_eq!(
        rt.set_inter_op_parallelism_threads(0)
            .unwrap_err()
            .to_string(),
        "Inter op parallelism cannot be modified after initialization."
    );
    assert_eq!(rt.get_intra_op_parallelism_threads(), 2);
}

#[test]
fn a_virtual_cpu_runs_its_kernels_on_its_own_threads() {
    let rt = builder().configure().unwrap();
    let cpu = rt.list_physical_devices(DeviceKind::Cpu)[0].clone();
    let with = |n| LogicalDeviceConfiguration::new().threads(n);
    let configs = [with(1), with(3), LogicalDeviceConfiguration::new()];
    rt.set_logical_device_configuration(&cpu, &configs).unwrap();
    let cpus = rt.list_logical_devices("CPU").unwrap();
    assert_eq!(cpus.len(), 3);
    // Counted by rayon inside the pool each device's kernels run on.
    assert_eq!(cpus[0].threads(), 1);
    assert_eq!(cpus[1].threads(), 3);
    assert_eq!(
        cpus[2].threads(),
        rayon::current_num_threads(),
        "the shared pool"
    );
    // The kernels give the same answers there (a product large enough to split into tasks).
    let (m, k, n) = (96, 200, 72);
    let a = r::random_vec(m * k, 31);
    let b = r::random_vec(k * n, 32);
    let expected = r::matmul(&r::to_f64(&a), &r::to_f64(&b), m, k, n, false, false);
    for dev in &cpus {
        let _on = dev.scope();
        let at = Tensor::from_slice_on(&a, &[m, k], dev).unwrap();
        let bt = Tensor::from_slice_on(&b, &[k, n], dev).unwrap();
        let c = at.matmul(&bt).unwrap();
        assert_eq!(c.device(), dev.full_name());
        let what = format!("matmul on {} ({} threads)", dev.name(), dev.threads());
        r::assert_close(&c.to_vec::<f32>().unwrap(), &expected, 1e-4, &what);
    }
}

#[test]
fn thread_counts_are_checked_when_set() {
    let rt = builder().configure().unwrap();
    let cpu = rt.list_physical_devices(DeviceKind::Cpu)[0].clone();
    let zero = LogicalDeviceConfiguration::new().threads(0);
    let err = rt
        .set_logical_device_configuration(&cpu, &[zero])
        .unwrap_err();
    assert!(err.to_string().contains("at least 1"), "{err}");
    if let Some(gpu) = rt.list_physical_devices(DeviceKind::Gpu).first() {
        let gpu_threads = LogicalDeviceConfiguration::new()
            .memory_limit(64)
            .threads(2);
        let err = rt
            .set_logical_device_configuration(gpu, &[gpu_threads])
            .unwrap_err();
        assert!(
            err.to_string().contains("CPU virtual devices only"),
            "{err}"
        );
    }
}
