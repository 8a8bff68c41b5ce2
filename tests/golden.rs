//! Layers against TensorFlow's own output: forward, input gradient and weight gradients on fixed
//! inputs and weights, on CPU:0 and every GPU adapter (`tests/golden/`, written by
//! `scripts/tf_golden.py`; see `common::golden` for the tolerances).
//!
//! Every test name has `golden` in it: `cargo test --release -- golden` runs them all.

mod common;

use anygpu::nn::{Activation, Conv2D, Dense, Layer, MaxPool2D, SeparableConv2D};
use anygpu::ops::spec::Padding;
use anygpu::{KindFilter, LogicalDevice, Runtime, Tensor};
use common::golden::{Case, Golden};

fn runtime() -> Runtime {
    common::builder()
        .memory_growth(true)
        .build()
        .expect("the runtime initializes")
}

/// CPU:0 and every GPU; a missing GPU fails under `ANYGPU_REQUIRE_ADAPTER=1`.
fn devices(rt: &Runtime, test: &str) -> Vec<LogicalDevice> {
    common::gpus_at_least(1, test);
    rt.list_logical_devices(KindFilter::All).expect("devices")
}

fn upload(case: &Case<'_>, key: &str, dev: &LogicalDevice) -> Tensor {
    let (shape, values) = case.input(key);
    Tensor::from_slice_on(&values, &shape, dev).expect("upload")
}

fn read(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().expect("readback")
}

fn padding(case: &Case<'_>) -> Padding {
    match case.str("padding") {
        "same" => Padding::Same,
        "valid" => Padding::Valid,
        other => panic!("{}: padding {other}", case.name),
    }
}

fn activation(case: &Case<'_>) -> Activation {
    case.str("activation").parse().expect("a known activation")
}

/// Builds `layer` for the case's input on `dev`, sets the case's weights (`weight_keys`, in
/// the layer's order), runs forward and backward with the case's `dy`, and checks `y`, `dx`
/// and every weight gradient against TensorFlow's.
fn check_layer(
    case: &Case<'_>,
    mut layer: Box<dyn Layer>,
    weight_keys: &[&str],
    dev: &LogicalDevice,
) {
    let x = upload(case, "x", dev);
    layer
        .build(&x.shape()[1..], 7, dev)
        .unwrap_or_else(|e| panic!("{}: build on {dev}: {e}", case.name));
    for (i, key) in weight_keys.iter().enumerate() {
        layer
            .set_weight(i, upload(case, key, dev))
            .unwrap_or_else(|e| panic!("{}: set {key}: {e}", case.name));
    }
    let name = dev.to_string();
    let (y, saved) = layer.forward(&x).expect("forward");
    case.check(&name, "y", y.shape(), &read(&y));
    let dy = upload(case, "dy", dev);
    let (dx, grads) = layer.backward(&saved, &dy, true).expect("backward");
    let dx = dx.expect("dx was asked for");
    case.check(&name, "dx", dx.shape(), &read(&dx));
    for (key, g) in weight_keys.iter().zip(&grads) {
        case.check(&name, &format!("d{key}"), g.shape(), &read(g));
    }
}

#[test]
fn golden_tutorial_layers() {
    let rt = runtime();
    let golden = Golden::load("layers");
    for dev in devices(&rt, "golden_tutorial_layers") {
        for case in golden.cases() {
            let (layer, weights): (Box<dyn Layer>, &[&str]) = match case.name {
                n if n.starts_with("conv2d") => (
                    Box::new(
                        Conv2D::new(case.usize("filters"), case.usize("kernel_size"))
                            .padding(padding(&case))
                            .activation(activation(&case)),
                    ),
                    &["kernel", "bias"],
                ),
                n if n.starts_with("separable_conv2d") => (
                    Box::new(
                        SeparableConv2D::new(case.usize("filters"), case.usize("kernel_size"))
                            .padding(padding(&case))
                            .activation(activation(&case)),
                    ),
                    &["depthwise_kernel", "pointwise_kernel", "bias"],
                ),
                n if n.starts_with("max_pool2d") => (Box::new(MaxPool2D::new()), &[]),
                n if n.starts_with("dense") => (
                    Box::new(Dense::new(case.usize("units")).activation(activation(&case))),
                    &["kernel", "bias"],
                ),
                other => panic!("golden layers: no layer for case {other}"),
            };
            check_layer(&case, layer, weights, &dev);
        }
    }
}
