//! Convolutions beyond stride 1 against TensorFlow: Conv2D with strides, dilation, rectangular
//! kernels and `use_bias=False`; DepthwiseConv2D with multipliers and strides; SeparableConv2D
//! with strides and a multiplier — forward, input gradient, kernel and bias gradients.

use anygpu::nn::{Conv2D, DepthwiseConv2D, Layer, SeparableConv2D};

use crate::common::golden::{Case, Golden};
use crate::{activation, check_layer, devices, padding, runtime};

fn kernel(case: &Case<'_>) -> (usize, usize) {
    (case.usize("kh"), case.usize("kw"))
}

fn strides(case: &Case<'_>) -> (usize, usize) {
    (case.usize("sh"), case.usize("sw"))
}

fn dilation(case: &Case<'_>) -> (usize, usize) {
    (case.usize("dh"), case.usize("dw"))
}

/// The layer a case describes, with its weight keys in the layer's order.
fn layer_of(case: &Case<'_>) -> (Box<dyn Layer>, &'static [&'static str]) {
    let with_bias = case.config().get("use_bias").and_then(|v| v.as_u64()) != Some(0);
    match case.name {
        n if n.starts_with("conv2d") => (
            Box::new(
                Conv2D::new(case.usize("filters"), kernel(case))
                    .strides(strides(case))
                    .dilation_rate(dilation(case))
                    .padding(padding(case))
                    .use_bias(with_bias)
                    .activation(activation(case)),
            ),
            if with_bias {
                &["kernel", "bias"]
            } else {
                &["kernel"]
            },
        ),
        n if n.starts_with("depthwise_conv2d") => (
            Box::new(
                DepthwiseConv2D::new(kernel(case))
                    .strides(strides(case))
                    .dilation_rate(dilation(case))
                    .padding(padding(case))
                    .depth_multiplier(case.usize("depth_multiplier"))
                    .use_bias(with_bias)
                    .activation(activation(case)),
            ),
            if with_bias {
                &["kernel", "bias"]
            } else {
                &["kernel"]
            },
        ),
        n if n.starts_with("separable_conv2d") => (
            Box::new(
                SeparableConv2D::new(case.usize("filters"), kernel(case))
                    .strides(strides(case))
                    .dilation_rate(dilation(case))
                    .padding(padding(case))
                    .depth_multiplier(case.usize("depth_multiplier"))
                    .activation(activation(case)),
            ),
            &["depthwise_kernel", "pointwise_kernel", "bias"],
        ),
        other => panic!("golden convolutions: no layer for case {other}"),
    }
}

#[test]
fn golden_strided_dilated_and_depthwise_convolutions() {
    let rt = runtime();
    let golden = Golden::load("convolutions");
    for dev in devices(&rt, "golden_strided_dilated_and_depthwise_convolutions") {
        for case in golden.cases() {
            let (layer, weights) = layer_of(&case);
            check_layer(&case, layer, weights, &dev);
        }
    }
}
