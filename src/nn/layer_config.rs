//! How a layer writes its Keras config (`layer.get_config()`): the JSON values of its
//! hyper-parameters with Keras' spelling. Below the layers, which call it from their
//! [`crate::nn::Layer::get_config`]; `model_config.rs`, above them, reads configs back.

use serde_json::{json, Map, Value};

use crate::mixed_precision::Policy;
use crate::nn::activation::Activation;
use crate::nn::conv_args::Window;
use crate::ops::spec::Padding;

/// A float32 hyper-parameter as its shortest decimal (`0.99`, not the `0.9900000095367432` of
/// its exact value), which reads back to the same float32.
pub(crate) fn num(x: f32) -> Value {
    match x.to_string().parse::<f64>() {
        Ok(v) if x.is_finite() => json!(v),
        _ => Value::Null,
    }
}

/// [`num`] for an optional hyper-parameter (`null` when unset).
pub(crate) fn opt_num(x: Option<f32>) -> Value {
    x.map_or(Value::Null, num)
}

/// A `(height, width)` pair as Keras writes it: `[3, 3]`.
pub(crate) fn size2(v: [usize; 2]) -> Value {
    json!([v[0], v[1]])
}

/// `"same"` or `"valid"`.
pub(crate) fn padding_name(p: Padding) -> &'static str {
    match p {
        Padding::Same => "same",
        Padding::Valid => "valid",
    }
}

/// An activation as Keras serializes it, by name (`"relu"`); the tanh form of gelu, which
/// Keras cannot serialize by name, as `{"name": "gelu", "approximate": true}`.
pub(crate) fn activation_value(a: Activation) -> Value {
    match a {
        Activation::Gelu { approximate: true } => json!({"name": "gelu", "approximate": true}),
        other => json!(other.name()),
    }
}

/// The keys every convolution writes for its window (`kernel_size`, `strides`, `padding`,
/// `dilation_rate`, `data_format`).
pub(crate) fn window_config(w: &Window) -> Map<String, Value> {
    let mut c = Map::new();
    c.insert("kernel_size".into(), size2(w.kernel));
    c.insert("strides".into(), size2(w.options.strides));
    c.insert("padding".into(), json!(padding_name(w.options.padding)));
    c.insert("dilation_rate".into(), size2(w.options.dilation));
    c.insert("data_format".into(), json!("channels_last"));
    c
}

/// `config` (a JSON object) with `dtype` set to `policy` when the layer has one of its own.
pub(crate) fn with_dtype(mut config: Map<String, Value>, policy: Option<Policy>) -> Value {
    if let Some(p) = policy {
        config.insert("dtype".into(), json!(p.name()));
    }
    Value::Object(config)
}
