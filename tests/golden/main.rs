//! Layers against TensorFlow's own output: forward, input gradient and weight gradients on fixed
//! inputs and weights, on CPU:0 and every GPU adapter (`tests/golden/`, written by
//! `scripts/tf_golden.py`; see `common::golden` for the tolerances); and one whole model's
//! training pass (`models`).
//!
//! Every test name has `golden` in it: `cargo test --release -- golden` runs them all. One module
//! per family of `scripts/golden/`; the helpers here build a layer from a case and check it.

#[path = "../common/mod.rs"]
mod common;

mod activations;
mod convolutions;
mod layers;
mod losses;
mod models;
mod normalization;
mod optimizers;
mod pooling;

use anygpu::nn::{Activation, Layer};
use anygpu::ops::spec::Padding;
use anygpu::{LogicalDevice, Runtime, Tensor};
use common::golden::Case;

pub fn runtime() -> Runtime {
    common::builder()
        .memory_growth(true)
        .build()
        .expect("the runtime initializes")
}

pub use common::all_devices as devices;

pub fn upload(case: &Case<'_>, key: &str, dev: &LogicalDevice) -> Tensor {
    let (shape, values) = case.input(key);
    Tensor::from_slice_on(&values, &shape, dev).expect("upload")
}

pub fn read(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().expect("readback")
}

pub fn padding(case: &Case<'_>) -> Padding {
    match case.str("padding") {
        "same" => Padding::Same,
        "valid" => Padding::Valid,
        other => panic!("{}: padding {other}", case.name),
    }
}

pub fn activation(case: &Case<'_>) -> Activation {
    case.str("activation").parse().expect("a known activation")
}

/// Builds `layer` for the case's input on `dev`, sets the case's weights (`weight_keys`, in
/// the layer's order), runs forward and backward with the case's `dy`, and checks `y`, `dx`
/// and every weight gradient against TensorFlow's.
pub fn check_layer(
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
