//! Keras' activations against TensorFlow: each activation as a `keras.layers.Activation`, the
//! `ReLU` layer's configurations, and Dense, Conv2D and SeparableConv2D with the activations
//! that run as their own op (forward, input and weight gradients).

use anygpu::nn::{Activation, ActivationLayer, Conv2D, Dense, Layer, ReLU, SeparableConv2D};

use crate::common::golden::Golden;
use crate::{activation, check_layer, devices, padding, runtime};

#[test]
fn golden_activation_layers() {
    let rt = runtime();
    let golden = Golden::load("activations");
    for dev in devices(&rt, "golden_activation_layers") {
        for case in golden.cases() {
            if !case.name.starts_with("activation_") {
                continue;
            }
            let act = match activation(&case) {
                Activation::Gelu { .. } => Activation::Gelu {
                    approximate: case.config()["approximate"].as_bool().expect("a bool"),
                },
                other => other,
            };
            check_layer(&case, Box::new(ActivationLayer::new(act)), &[], &dev);
        }
    }
}

#[test]
fn golden_relu_layer_configurations() {
    let rt = runtime();
    let golden = Golden::load("activations");
    for dev in devices(&rt, "golden_relu_layer_configurations") {
        for case in golden.cases() {
            if !case.name.starts_with("relu_layer_") {
                continue;
            }
            let mut relu = ReLU::new()
                .negative_slope(case.f64("negative_slope") as f32)
                .threshold(case.f64("threshold") as f32);
            if let Some(m) = case.config()["max_value"].as_f64() {
                relu = relu.max_value(m as f32);
            }
            check_layer(&case, Box::new(relu), &[], &dev);
        }
    }
}

#[test]
fn golden_layers_with_separate_activations() {
    let rt = runtime();
    let golden = Golden::load("activations");
    for dev in devices(&rt, "golden_layers_with_separate_activations") {
        for case in golden.cases() {
            let (layer, weights): (Box<dyn Layer>, &[&str]) = match case.name {
                n if n.starts_with("dense_") => (
                    Box::new(Dense::new(case.usize("units")).activation(activation(&case))),
                    &["kernel", "bias"],
                ),
                n if n.starts_with("conv2d_") => (
                    Box::new(
                        Conv2D::new(case.usize("filters"), case.usize("kernel_size"))
                            .padding(padding(&case))
                            .activation(activation(&case)),
                    ),
                    &["kernel", "bias"],
                ),
                n if n.starts_with("separable_conv2d_") => (
                    Box::new(
                        SeparableConv2D::new(case.usize("filters"), case.usize("kernel_size"))
                            .padding(padding(&case))
                            .activation(activation(&case)),
                    ),
                    &["depthwise_kernel", "pointwise_kernel", "bias"],
                ),
                _ => continue,
            };
            check_layer(&case, layer, weights, &dev);
        }
    }
}
