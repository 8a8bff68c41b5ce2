//! The tutorial's layers: Conv2D, SeparableConv2D, MaxPool2D and Dense with their activations.

use anygpu::nn::{Conv2D, Dense, Layer, MaxPool2D, SeparableConv2D};

use crate::common::golden::Golden;
use crate::{activation, check_layer, devices, padding, runtime};

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
