//! Keras' `get_config` / `from_config` in JSON: the layers' configs (written by each layer's
//! [`Layer::get_config`], read back here by [`layer_from_config`]), and the compile config
//! (loss, optimizer with its schedule, metrics) that [`crate::nn::Sequential::save`] stores
//! next to the weights.
//!
//! The key names are Keras' (`filters`, `kernel_size`, `strides`, `padding`, `activation`,
//! `use_bias`, `momentum`, `epsilon`, `rate`, `seed`, `dtype`, ...), so a config reads like
//! `keras.layers.Conv2D(...).get_config()`. Reading follows Keras' `cls(**config)`: a missing
//! required argument (`filters`, `units`, `rate`, ...) is an error, a missing optional one takes
//! Keras' default, and a key of the wrong type is an error naming the class, the key, what was
//! expected and what was found. Keys Keras writes that anygpu has no use for (initializers,
//! regularizers, `trainable`, `name`) are ignored; keys that would change the arithmetic to
//! something anygpu does not do (`data_format='channels_first'`, `groups=2`, `use_bias=False`
//! on a layer that always has a bias) are errors.

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::mixed_precision::Policy;
use crate::nn::activation::Activation;
use crate::nn::activation_layers::{ActivationLayer, ReLU};
use crate::nn::depthwise::DepthwiseConv2D;
use crate::nn::layer_config::{num, opt_num};
use crate::nn::layers::{Conv2D, Dense, Flatten, Layer, MaxPool2D, SeparableConv2D};
use crate::nn::loss::Loss;
use crate::nn::metrics::Metric;
use crate::nn::normalization::{BatchNormalization, Dropout};
use crate::nn::optimizer::{Adam, AdamW, BaseOptions, LossScaleOptimizer, Optimizer, RmsProp, Sgd};
use crate::nn::pooling::{AveragePooling2D, GlobalAveragePooling2D, GlobalMaxPooling2D};
use crate::nn::schedules::{
    CosineDecay, ExponentialDecay, LearningRateSchedule, PiecewiseConstantDecay,
};
use crate::ops::spec::Padding;

/// The layer classes [`layer_from_config`] rebuilds, for its error message.
const KNOWN_LAYERS: &str = "Conv2D, SeparableConv2D, DepthwiseConv2D, Dense, Flatten, \
                            MaxPooling2D (MaxPool2D), AveragePooling2D, GlobalAveragePooling2D, \
                            GlobalMaxPooling2D, BatchNormalization, Dropout, Activation, ReLU";

// ---- writing ----

/// A layer as Keras' `serialize_keras_object` writes it: `{"class_name": ..., "config": ...}`;
/// `None` for a layer without a config (a custom layer).
pub(crate) fn serialize_layer(layer: &dyn Layer) -> Option<Value> {
    Some(json!({"class_name": layer.class_name(), "config": layer.get_config()?}))
}

// ---- reading ----

/// The keys of one JSON object, read with errors that name the object (`Conv2D config`), the
/// key, what was expected and what was found.
pub(crate) struct Fields<'a> {
    what: String,
    map: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    pub(crate) fn new(what: impl Into<String>, value: &'a Value) -> Result<Fields<'a>> {
        let what = what.into();
        match value {
            Value::Object(map) => Ok(Fields { what, map }),
            other => Err(Error::InvalidArgument(format!(
                "{what}: expected a JSON object, found {}",
                shown(other)
            ))),
        }
    }

    fn bad(&self, key: &str, expected: &str, found: &Value) -> Error {
        Error::InvalidArgument(format!(
            "{}: '{key}' must be {expected}, found {}",
            self.what,
            shown(found)
        ))
    }

    /// The value of `key`; absent and `null` are the same (Keras writes `null` for "unset").
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn required(&self, key: &str) -> Result<&'a Value> {
        self.get(key).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{}: the required key '{key}' is missing",
                self.what
            ))
        })
    }

    fn as_usize(&self, key: &str, v: &Value) -> Result<usize> {
        v.as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.bad(key, "a non-negative integer", v))
    }

    pub(crate) fn usize(&self, key: &str) -> Result<usize> {
        self.as_usize(key, self.required(key)?)
    }

    pub(crate) fn u64_opt(&self, key: &str) -> Result<Option<u64>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| self.bad(key, "a non-negative integer", v))
            })
            .transpose()
    }

    fn isize_or(&self, key: &str, default: isize) -> Result<isize> {
        self.get(key).map_or(Ok(default), |v| {
            v.as_i64()
                .and_then(|n| isize::try_from(n).ok())
                .ok_or_else(|| self.bad(key, "an integer", v))
        })
    }

    /// An integer or a pair of integers (`3` or `[3, 5]`), as Keras' `kernel_size` takes.
    pub(crate) fn size2_or(&self, key: &str, default: [usize; 2]) -> Result<[usize; 2]> {
        let Some(v) = self.get(key) else {
            return Ok(default);
        };
        let expected = "an integer or a list of 2 integers";
        match v {
            Value::Array(items) if items.len() == 2 => Ok([
                self.as_usize(key, &items[0])
                    .map_err(|_| self.bad(key, expected, v))?,
                self.as_usize(key, &items[1])
                    .map_err(|_| self.bad(key, expected, v))?,
            ]),
            _ => self
                .as_usize(key, v)
                .map(|n| [n, n])
                .map_err(|_| self.bad(key, expected, v)),
        }
    }

    pub(crate) fn size2(&self, key: &str) -> Result<[usize; 2]> {
        self.required(key)?;
        self.size2_or(key, [0, 0])
    }

    pub(crate) fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        self.get(key)
            .map(|v| v.as_f64().ok_or_else(|| self.bad(key, "a number", v)))
            .transpose()
    }

    pub(crate) fn f64(&self, key: &str) -> Result<f64> {
        self.required(key)?;
        Ok(self.f64_opt(key)?.unwrap_or_default())
    }

    /// A float32 hyper-parameter; JSON numbers beyond float32's range are errors, not infinities.
    pub(crate) fn f32_opt(&self, key: &str) -> Result<Option<f32>> {
        match self.f64_opt(key)? {
            Some(x) if x.is_finite() && x.abs() > f64::from(f32::MAX) => {
                Err(self.bad(key, "a number in float32's range", self.required(key)?))
            }
            other => Ok(other.map(|x| x as f32)),
        }
    }

    pub(crate) fn f32_or(&self, key: &str, default: f32) -> Result<f32> {
        Ok(self.f32_opt(key)?.unwrap_or(default))
    }

    pub(crate) fn f32(&self, key: &str) -> Result<f32> {
        self.required(key)?;
        self.f32_or(key, 0.0)
    }

    pub(crate) fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        self.get(key).map_or(Ok(default), |v| {
            v.as_bool().ok_or_else(|| self.bad(key, "true or false", v))
        })
    }

    pub(crate) fn str(&self, key: &str) -> Result<&'a str> {
        let v = self.required(key)?;
        v.as_str().ok_or_else(|| self.bad(key, "a string", v))
    }

    fn str_opt(&self, key: &str) -> Result<Option<&'a str>> {
        self.get(key)
            .map(|v| v.as_str().ok_or_else(|| self.bad(key, "a string", v)))
            .transpose()
    }

    fn padding_or(&self, key: &str, default: Padding) -> Result<Padding> {
        match self.str_opt(key)? {
            None => Ok(default),
            Some(s) => match s.to_ascii_lowercase().as_str() {
                "same" => Ok(Padding::Same),
                "valid" => Ok(Padding::Valid),
                _ => Err(self.bad(key, "'valid' or 'same'", self.required(key)?)),
            },
        }
    }

    fn activation_or(&self, key: &str) -> Result<Activation> {
        let Some(v) = self.get(key) else {
            return Ok(Activation::Linear);
        };
        let named = |s: &str| {
            s.parse::<Activation>()
                .map_err(|e| Error::InvalidArgument(format!("{}: '{key}': {e}", self.what)))
        };
        match v {
            Value::String(s) => named(s),
            Value::Object(_) => {
                let f = Fields::new(format!("{} '{key}'", self.what), v)?;
                match named(f.str("name")?)? {
                    Activation::Gelu { .. } => Ok(Activation::Gelu {
                        approximate: f.bool_or("approximate", false)?,
                    }),
                    other => Ok(other),
                }
            }
            _ => Err(self.bad(key, "an activation name", v)),
        }
    }

    /// Errors unless `key` is absent or `allowed`: a Keras option anygpu does not implement.
    fn only(&self, key: &str, allowed: Value) -> Result<()> {
        match self.get(key) {
            Some(v) if *v != allowed => Err(Error::InvalidArgument(format!(
                "{}: {key}={} is not supported by anygpu (only {allowed})",
                self.what,
                shown(v)
            ))),
            _ => Ok(()),
        }
    }

    /// Keras' `dtype`: a policy name, or the `DTypePolicy` object Keras 3 writes.
    fn dtype(&self) -> Result<Option<Policy>> {
        let Some(v) = self.get("dtype") else {
            return Ok(None);
        };
        let name = match v {
            Value::String(s) => s.as_str(),
            Value::Object(_) => Fields::new(format!("{} 'dtype'", self.what), v)?
                .get("config")
                .and_then(|c| c.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| self.bad("dtype", "a dtype policy name", v))?,
            _ => return Err(self.bad("dtype", "a dtype policy name", v)),
        };
        Policy::new(name)
            .map(Some)
            .map_err(|e| Error::InvalidArgument(format!("{}: {e}", self.what)))
    }
}

/// A JSON value for an error message, cut short when long (a hostile file's values can be).
fn shown(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

fn unsupported_bias(c: &Fields<'_>) -> Result<()> {
    c.only("use_bias", json!(true))
}

/// Rebuilds a layer from its Keras serialization, `{"class_name": "Conv2D", "config":
/// {"filters": 32, "kernel_size": [3, 3], ...}}` (Keras' `keras.layers.deserialize`): what
/// [`Layer::get_config`] wrote, or what Keras' `serialize_keras_object(layer)` prints for the
/// options anygpu has. The layer is not built: add it to a model.
///
/// ```
/// use anygpu::nn::{layer_from_config, Conv2D, Layer};
/// use anygpu::ops::spec::Padding;
/// let conv = Conv2D::new(8, 3).strides(2).padding(Padding::Same);
/// let config = conv.get_config().expect("Conv2D has a config");
/// assert_eq!(config["filters"], 8);
/// assert_eq!(config["kernel_size"], serde_json::json!([3, 3]));
/// let copy = layer_from_config(&serde_json::json!({"class_name": "Conv2D", "config": config}))?;
/// assert_eq!(copy.get_config(), conv.get_config());
/// // Keras' own config of keras.layers.Dense(4) reads too.
/// let dense = layer_from_config(&serde_json::json!({
///     "class_name": "Dense",
///     "config": {"name": "dense", "units": 4, "activation": "relu", "use_bias": true,
///                "kernel_initializer": {"class_name": "GlorotUniform"}}
/// }))?;
/// assert_eq!(dense.compute_output_shape(&[3])?, [4]);
/// let err = layer_from_config(&serde_json::json!({"class_name": "LSTM", "config": {}}));
/// assert!(err.unwrap_err().to_string().contains("Unknown layer class 'LSTM'"));
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidArgument`] for an unknown class name, a missing required key (`filters`,
/// `units`, `rate`, ...), a key of the wrong type, or a Keras option anygpu does not have
/// (`data_format='channels_first'`, `groups > 1`, ...), naming the class and the key.
pub fn layer_from_config(value: &Value) -> Result<Box<dyn Layer>> {
    let outer = Fields::new("layer config", value)?;
    let class = outer.str("class_name")?;
    let empty = json!({});
    let config = outer.get("config").unwrap_or(&empty);
    let c = Fields::new(format!("{class} config"), config)?;
    c.only("data_format", json!("channels_last"))?;
    let policy = c.dtype()?;
    fn with<L: Layer + 'static>(
        layer: L,
        policy: Option<Policy>,
        set: fn(L, Policy) -> L,
    ) -> Box<dyn Layer> {
        Box::new(match policy {
            Some(p) => set(layer, p),
            None => layer,
        })
    }
    Ok(match class {
        "Conv2D" => {
            c.only("groups", json!(1))?;
            let l = Conv2D::new(c.usize("filters")?, c.size2("kernel_size")?)
                .strides(c.size2_or("strides", [1, 1])?)
                .padding(c.padding_or("padding", Padding::Valid)?)
                .dilation_rate(c.size2_or("dilation_rate", [1, 1])?)
                .activation(c.activation_or("activation")?)
                .use_bias(c.bool_or("use_bias", true)?);
            with(l, policy, Conv2D::dtype_policy)
        }
        "SeparableConv2D" => {
            unsupported_bias(&c)?;
            let l = SeparableConv2D::new(c.usize("filters")?, c.size2("kernel_size")?)
                .strides(c.size2_or("strides", [1, 1])?)
                .padding(c.padding_or("padding", Padding::Valid)?)
                .dilation_rate(c.size2_or("dilation_rate", [1, 1])?)
                .depth_multiplier(
                    c.get("depth_multiplier")
                        .map_or(Ok(1), |_| c.usize("depth_multiplier"))?,
                )
                .activation(c.activation_or("activation")?);
            with(l, policy, SeparableConv2D::dtype_policy)
        }
        "DepthwiseConv2D" => {
            let l = DepthwiseConv2D::new(c.size2("kernel_size")?)
                .strides(c.size2_or("strides", [1, 1])?)
                .padding(c.padding_or("padding", Padding::Valid)?)
                .dilation_rate(c.size2_or("dilation_rate", [1, 1])?)
                .depth_multiplier(
                    c.get("depth_multiplier")
                        .map_or(Ok(1), |_| c.usize("depth_multiplier"))?,
                )
                .activation(c.activation_or("activation")?)
                .use_bias(c.bool_or("use_bias", true)?);
            with(l, policy, DepthwiseConv2D::dtype_policy)
        }
        "Dense" => {
            unsupported_bias(&c)?;
            let l = Dense::new(c.usize("units")?).activation(c.activation_or("activation")?);
            with(l, policy, Dense::dtype_policy)
        }
        "Flatten" => with(Flatten::new(), policy, Flatten::dtype_policy),
        "MaxPooling2D" | "MaxPool2D" => {
            let pool = c.size2_or("pool_size", [2, 2])?;
            let mut l = MaxPool2D::new()
                .pool_size(pool)
                .padding(c.padding_or("padding", Padding::Valid)?);
            if c.get("strides").is_some_and(|s| !s.is_null()) {
                l = l.strides(c.size2("strides")?);
            }
            with(l, policy, MaxPool2D::dtype_policy)
        }
        "AveragePooling2D" => {
            let [ph, pw] = c.size2("pool_size")?;
            let mut l =
                AveragePooling2D::new((ph, pw)).padding(c.padding_or("padding", Padding::Valid)?);
            if c.get("strides").is_some() {
                let [sh, sw] = c.size2("strides")?;
                l = l.strides((sh, sw));
            }
            with(l, policy, AveragePooling2D::dtype_policy)
        }
        "GlobalAveragePooling2D" => {
            c.only("keepdims", json!(false))?;
            with(
                GlobalAveragePooling2D::new(),
                policy,
                GlobalAveragePooling2D::dtype_policy,
            )
        }
        "GlobalMaxPooling2D" => {
            c.only("keepdims", json!(false))?;
            with(
                GlobalMaxPooling2D::new(),
                policy,
                GlobalMaxPooling2D::dtype_policy,
            )
        }
        "BatchNormalization" => {
            c.only("renorm", json!(false))?;
            let l = BatchNormalization::new()
                .axis(c.isize_or("axis", -1)?)
                .momentum(c.f32_or("momentum", 0.99)?)
                .epsilon(c.f32_or("epsilon", 1e-3)?)
                .center(c.bool_or("center", true)?)
                .scale(c.bool_or("scale", true)?)
                .synchronized(c.bool_or("synchronized", false)?);
            with(l, policy, BatchNormalization::dtype_policy)
        }
        "Dropout" => {
            c.only("noise_shape", Value::Null)?;
            let mut l = Dropout::new(c.f32("rate")?);
            if let Some(seed) = c.u64_opt("seed")? {
                l = l.seed(seed);
            }
            with(l, policy, Dropout::dtype_policy)
        }
        "Activation" => {
            c.required("activation")?;
            let l = ActivationLayer::new(c.activation_or("activation")?);
            with(l, policy, ActivationLayer::dtype_policy)
        }
        "ReLU" => {
            let mut l = ReLU::new()
                .negative_slope(c.f32_or("negative_slope", 0.0)?)
                .threshold(c.f32_or("threshold", 0.0)?);
            if let Some(m) = c.f32_opt("max_value")? {
                l = l.max_value(m);
            }
            with(l, policy, ReLU::dtype_policy)
        }
        other => {
            return Err(Error::InvalidArgument(format!(
                "Unknown layer class '{}': anygpu rebuilds {KNOWN_LAYERS}. A custom layer \
                 cannot be loaded from its config: build the model in code and use \
                 load_weights",
                shown(&json!(other)).trim_matches('"')
            )))
        }
    })
}

// ---- compile config: loss, metrics, optimizer, schedule ----

pub(crate) fn loss_to_json(loss: &Loss) -> Value {
    match *loss {
        Loss::SparseCategoricalCrossentropy { from_logits } => json!({
            "class_name": "SparseCategoricalCrossentropy",
            "config": {"from_logits": from_logits}
        }),
        Loss::CategoricalCrossentropy {
            from_logits,
            label_smoothing,
        } => json!({
            "class_name": "CategoricalCrossentropy",
            "config": {"from_logits": from_logits, "label_smoothing": num(label_smoothing)}
        }),
        Loss::BinaryCrossentropy {
            from_logits,
            label_smoothing,
        } => json!({
            "class_name": "BinaryCrossentropy",
            "config": {"from_logits": from_logits, "label_smoothing": num(label_smoothing)}
        }),
        Loss::MeanSquaredError => json!({"class_name": "MeanSquaredError", "config": {}}),
        Loss::MeanAbsoluteError => json!({"class_name": "MeanAbsoluteError", "config": {}}),
    }
}

/// `{"class_name": ..., "config": ...}`, or a bare name (Keras' `loss="mse"` style).
fn class_and_config<'a>(
    what: &str,
    v: &'a Value,
    empty: &'a Value,
) -> Result<(String, Fields<'a>)> {
    match v {
        Value::String(name) => Ok((
            name.clone(),
            Fields::new(format!("{what} '{name}'"), empty)?,
        )),
        _ => {
            let outer = Fields::new(what, v)?;
            let name = outer.str("class_name")?.to_string();
            let config = outer.get("config").unwrap_or(empty);
            Ok((
                name.clone(),
                Fields::new(format!("{what} '{name}'"), config)?,
            ))
        }
    }
}

pub(crate) fn loss_from_json(v: &Value) -> Result<Loss> {
    let empty = json!({});
    let (name, c) = class_and_config("loss", v, &empty)?;
    let from_logits = c.bool_or("from_logits", false)?;
    let label_smoothing = c.f32_or("label_smoothing", 0.0)?;
    Ok(match name.as_str() {
        "SparseCategoricalCrossentropy" | "sparse_categorical_crossentropy" => {
            Loss::SparseCategoricalCrossentropy { from_logits }
        }
        "CategoricalCrossentropy" | "categorical_crossentropy" => Loss::CategoricalCrossentropy {
            from_logits,
            label_smoothing,
        },
        "BinaryCrossentropy" | "binary_crossentropy" => Loss::BinaryCrossentropy {
            from_logits,
            label_smoothing,
        },
        "MeanSquaredError" | "mean_squared_error" | "mse" => Loss::MeanSquaredError,
        "MeanAbsoluteError" | "mean_absolute_error" | "mae" => Loss::MeanAbsoluteError,
        other => {
            return Err(Error::InvalidArgument(format!(
                "Unknown loss '{other}': anygpu has SparseCategoricalCrossentropy, \
                 CategoricalCrossentropy, BinaryCrossentropy, MeanSquaredError, \
                 MeanAbsoluteError"
            )))
        }
    })
}

pub(crate) fn metric_to_json(m: &Metric) -> Value {
    match *m {
        Metric::SparseTopKCategoricalAccuracy { k } => json!({
            "class_name": "SparseTopKCategoricalAccuracy", "config": {"k": k}
        }),
        Metric::BinaryAccuracy { threshold } => json!({
            "class_name": "BinaryAccuracy", "config": {"threshold": num(threshold)}
        }),
        other => json!(other.name()),
    }
}

pub(crate) fn metric_from_json(v: &Value) -> Result<Metric> {
    let empty = json!({});
    let (name, c) = class_and_config("metric", v, &empty)?;
    Ok(match name.as_str() {
        "accuracy" | "acc" => Metric::Accuracy,
        "SparseTopKCategoricalAccuracy" | "sparse_top_k_categorical_accuracy" => {
            Metric::SparseTopKCategoricalAccuracy {
                k: c.get("k").map_or(Ok(5), |_| c.usize("k"))?,
            }
        }
        "CategoricalAccuracy" | "categorical_accuracy" => Metric::CategoricalAccuracy,
        "BinaryAccuracy" | "binary_accuracy" => Metric::BinaryAccuracy {
            threshold: c.f32_or("threshold", 0.5)?,
        },
        "MeanSquaredError" | "mean_squared_error" | "mse" => Metric::MeanSquaredError,
        other => {
            return Err(Error::InvalidArgument(format!(
                "Unknown metric '{other}': anygpu has accuracy, \
                 sparse_top_k_categorical_accuracy, categorical_accuracy, binary_accuracy, \
                 mean_squared_error"
            )))
        }
    })
}

pub(crate) fn schedule_to_json(s: &LearningRateSchedule) -> Value {
    let config = match s {
        LearningRateSchedule::ExponentialDecay(e) => json!({
            "initial_learning_rate": e.initial_learning_rate,
            "decay_steps": e.decay_steps,
            "decay_rate": e.decay_rate,
            "staircase": e.staircase,
        }),
        LearningRateSchedule::PiecewiseConstantDecay(p) => json!({
            "boundaries": p.boundaries,
            "values": p.values,
        }),
        LearningRateSchedule::CosineDecay(c) => json!({
            "initial_learning_rate": c.initial_learning_rate,
            "decay_steps": c.decay_steps,
            "alpha": c.alpha,
            "warmup_target": c.warmup_target,
            "warmup_steps": c.warmup_steps,
        }),
    };
    json!({"class_name": s.name(), "config": config})
}

pub(crate) fn schedule_from_json(v: &Value) -> Result<LearningRateSchedule> {
    let empty = json!({});
    let (name, c) = class_and_config("learning_rate schedule", v, &empty)?;
    let u64_req = |key: &str| -> Result<u64> {
        c.required(key)?;
        Ok(c.u64_opt(key)?.unwrap_or_default())
    };
    let schedule: LearningRateSchedule = match name.as_str() {
        "ExponentialDecay" => ExponentialDecay::new(
            c.f64("initial_learning_rate")?,
            u64_req("decay_steps")?,
            c.f64("decay_rate")?,
        )
        .staircase(c.bool_or("staircase", false)?)
        .into(),
        "PiecewiseConstantDecay" => {
            let list = |key: &str| -> Result<&Vec<Value>> {
                let v = c.required(key)?;
                v.as_array()
                    .ok_or_else(|| c.bad(key, "a list of numbers", v))
            };
            let boundaries = list("boundaries")?
                .iter()
                .map(|b| {
                    b.as_u64()
                        .ok_or_else(|| c.bad("boundaries", "a list of non-negative integers", b))
                })
                .collect::<Result<Vec<_>>>()?;
            let values = list("values")?
                .iter()
                .map(|x| {
                    x.as_f64()
                        .ok_or_else(|| c.bad("values", "a list of numbers", x))
                })
                .collect::<Result<Vec<_>>>()?;
            PiecewiseConstantDecay::new(boundaries, values).into()
        }
        "CosineDecay" => {
            let mut s = CosineDecay::new(c.f64("initial_learning_rate")?, u64_req("decay_steps")?)
                .alpha(c.f64_opt("alpha")?.unwrap_or(0.0));
            if let Some(target) = c.f64_opt("warmup_target")? {
                s = s.warmup(target, c.u64_opt("warmup_steps")?.unwrap_or(0));
            }
            s.into()
        }
        other => {
            return Err(Error::InvalidArgument(format!(
                "Unknown learning rate schedule '{other}': anygpu has ExponentialDecay, \
                 PiecewiseConstantDecay, CosineDecay"
            )))
        }
    };
    schedule.validate()?;
    Ok(schedule)
}

fn base_to_json(config: &mut Map<String, Value>, learning_rate: f32, o: &BaseOptions) {
    let lr = match &o.schedule {
        Some(s) => schedule_to_json(s),
        None => num(learning_rate),
    };
    config.insert("learning_rate".into(), lr);
    config.insert("weight_decay".into(), opt_num(o.weight_decay));
    config.insert("clipnorm".into(), opt_num(o.clipnorm));
    config.insert("global_clipnorm".into(), opt_num(o.global_clipnorm));
    config.insert("clipvalue".into(), opt_num(o.clipvalue));
}

/// The learning rate (a number, or a schedule whose initial value stands for it) and the
/// other [`BaseOptions`].
fn base_from_json(c: &Fields<'_>, default_lr: f32) -> Result<(f32, BaseOptions)> {
    let mut o = BaseOptions {
        weight_decay: c.f32_opt("weight_decay")?,
        clipnorm: c.f32_opt("clipnorm")?,
        global_clipnorm: c.f32_opt("global_clipnorm")?,
        clipvalue: c.f32_opt("clipvalue")?,
        ..BaseOptions::default()
    };
    let lr = match c.get("learning_rate") {
        Some(v @ Value::Object(_)) => {
            let s = schedule_from_json(v)?;
            let lr = s.value(0);
            o.schedule = Some(s);
            lr
        }
        _ => c.f32_or("learning_rate", default_lr)?,
    };
    Ok((lr, o))
}

pub(crate) fn optimizer_to_json(opt: &Optimizer) -> Value {
    let mut c = Map::new();
    match opt {
        Optimizer::Sgd(s) => {
            base_to_json(&mut c, s.learning_rate, &s.options);
            c.insert("momentum".into(), num(s.momentum));
            c.insert("nesterov".into(), json!(s.nesterov));
        }
        Optimizer::Adam(a) => {
            base_to_json(&mut c, a.learning_rate, &a.options);
            c.insert("beta_1".into(), num(a.beta_1));
            c.insert("beta_2".into(), num(a.beta_2));
            c.insert("epsilon".into(), num(a.epsilon));
        }
        Optimizer::AdamW(a) => {
            base_to_json(&mut c, a.learning_rate, &a.options);
            c.insert("beta_1".into(), num(a.beta_1));
            c.insert("beta_2".into(), num(a.beta_2));
            c.insert("epsilon".into(), num(a.epsilon));
        }
        Optimizer::RmsProp(r) => {
            base_to_json(&mut c, r.learning_rate, &r.options);
            c.insert("rho".into(), num(r.rho));
            c.insert("momentum".into(), num(r.momentum));
            c.insert("epsilon".into(), num(r.epsilon));
            c.insert("centered".into(), json!(r.centered));
        }
        Optimizer::LossScale(l) => {
            c.insert("inner_optimizer".into(), optimizer_to_json(l.inner()));
            c.insert("initial_scale".into(), num(l.initial_scale));
            c.insert("dynamic_growth_steps".into(), json!(l.dynamic_growth_steps));
        }
    }
    json!({"class_name": opt.name(), "config": c})
}

pub(crate) fn optimizer_from_json(v: &Value) -> Result<Optimizer> {
    let empty = json!({});
    let (name, c) = class_and_config("optimizer", v, &empty)?;
    Ok(match name.as_str() {
        "SGD" | "sgd" => {
            let d = Sgd::default();
            let (learning_rate, options) = base_from_json(&c, d.learning_rate)?;
            Sgd {
                learning_rate,
                momentum: c.f32_or("momentum", d.momentum)?,
                nesterov: c.bool_or("nesterov", d.nesterov)?,
                options,
            }
            .into()
        }
        "Adam" | "adam" => {
            let d = Adam::default();
            let (learning_rate, options) = base_from_json(&c, d.learning_rate)?;
            Adam {
                learning_rate,
                beta_1: c.f32_or("beta_1", d.beta_1)?,
                beta_2: c.f32_or("beta_2", d.beta_2)?,
                epsilon: c.f32_or("epsilon", d.epsilon)?,
                options,
            }
            .into()
        }
        "AdamW" | "adamw" => {
            let d = AdamW::default();
            let (learning_rate, mut options) = base_from_json(&c, d.learning_rate)?;
            if c.get("weight_decay").is_none() {
                options.weight_decay = d.options.weight_decay;
            }
            AdamW {
                learning_rate,
                beta_1: c.f32_or("beta_1", d.beta_1)?,
                beta_2: c.f32_or("beta_2", d.beta_2)?,
                epsilon: c.f32_or("epsilon", d.epsilon)?,
                options,
            }
            .into()
        }
        "RMSprop" | "rmsprop" => {
            let d = RmsProp::default();
            let (learning_rate, options) = base_from_json(&c, d.learning_rate)?;
            RmsProp {
                learning_rate,
                rho: c.f32_or("rho", d.rho)?,
                momentum: c.f32_or("momentum", d.momentum)?,
                epsilon: c.f32_or("epsilon", d.epsilon)?,
                centered: c.bool_or("centered", d.centered)?,
                options,
            }
            .into()
        }
        "LossScaleOptimizer" => {
            let inner = optimizer_from_json(c.required("inner_optimizer")?)?;
            let d = LossScaleOptimizer::new(inner);
            let steps = c.u64_opt("dynamic_growth_steps")?;
            let initial = c.f32_or("initial_scale", d.initial_scale)?;
            let steps = steps.unwrap_or(d.dynamic_growth_steps);
            d.initial_scale(initial).dynamic_growth_steps(steps).into()
        }
        other => {
            return Err(Error::InvalidArgument(format!(
                "Unknown optimizer '{other}': anygpu has SGD, Adam, AdamW, RMSprop, \
                 LossScaleOptimizer"
            )))
        }
    })
}
