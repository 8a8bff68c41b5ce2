//! A whole model in one file: `model.save(path)` / [`load_model`]. The file is the
//! safetensors file of [`crate::nn::Sequential::save_weights`] (every variable, f32, named
//! `layer/weight`) with the model's config in its metadata under `model_config`, as JSON in
//! Keras' shape:
//!
//! ```text
//! {"class_name": "Sequential",
//!  "config": {"name": "sequential", "seed": 42,
//!             "layers": [{"class_name": "InputLayer", "config": {"batch_shape": [null, 28, 28, 1]}},
//!                        {"class_name": "Conv2D", "config": {"name": "conv2d", "dtype": "float32",
//!                                                            "filters": 32, "kernel_size": [3, 3], ...}},
//!                        ...]},
//!  "compile_config": {"loss": {...}, "optimizer": {...}, "metrics": [...]}}
//! ```
//!
//! Loading reads and checks everything (the file's framing, the JSON, every layer's config,
//! every weight's presence, dtype and shape) before it returns a model, so a failed load
//! builds nothing the caller can see.

use std::path::Path;

use safetensors::SafeTensors;
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::nn::layer_config;
use crate::nn::model_config::{
    self, layer_from_config, loss_from_json, metric_from_json, optimizer_from_json, Fields,
};
use crate::nn::sequential::Sequential;
use crate::nn::weights;
use crate::tensor::Tensor;

/// The metadata key holding the model's config.
pub(crate) const CONFIG_KEY: &str = "model_config";

/// Keras' `model.get_config()` for `model`: its name, seed and layers, an `InputLayer` first.
pub(crate) fn architecture(model: &Sequential) -> Result<Value> {
    let input = model.input_shape().ok_or_else(|| {
        Error::Model(
            "get_config: this model has not yet been built. Build the model first by giving \
             the first layer an input_shape or by calling build(input_shape)"
                .into(),
        )
    })?;
    let mut batch_shape = vec![Value::Null];
    batch_shape.extend(input.iter().map(|&d| json!(d)));
    let mut layers = vec![json!({
        "class_name": "InputLayer",
        "config": {"batch_shape": batch_shape, "dtype": "float32", "name": "input_layer"},
    })];
    for e in &model.entries {
        let mut layer = model_config::serialize_layer(e.layer.as_ref()).ok_or_else(|| {
            Error::Model(format!(
                "get_config: layer '{}' ({}) has no config (Layer::get_config returned None), \
                 so the model cannot be saved whole; save its weights with save_weights",
                e.name,
                e.layer.class_name()
            ))
        })?;
        if let Some(config) = layer.get_mut("config").and_then(Value::as_object_mut) {
            config.insert("name".into(), json!(e.name));
            // The policy the layer computes in, its own or the global one when it was added.
            config.insert("dtype".into(), json!(e.policy.name()));
        }
        layers.push(layer);
    }
    Ok(json!({"name": model.name(), "seed": model.seed(), "layers": layers}))
}

/// The compile config (`model.get_compile_config()`), `None` before `compile`. The optimizer's
/// constant learning rate is the one the next step would use (as `set_learning_rate` or
/// `ReduceLROnPlateau` left it), as Keras saves the variable.
pub(crate) fn compile_config(model: &Sequential) -> Option<Value> {
    let (loss, optimizer) = (model.loss()?, model.optimizer()?);
    let mut optimizer_json = model_config::optimizer_to_json(optimizer);
    if let Some(lr) = model.learning_rate() {
        let mut config = &mut optimizer_json["config"];
        if config.get("inner_optimizer").is_some() {
            config = &mut config["inner_optimizer"]["config"];
        }
        if config.get("learning_rate").is_some_and(Value::is_number) {
            config["learning_rate"] = layer_config::num(lr);
        }
    }
    let metrics: Vec<Value> = model
        .compiled_metrics()
        .iter()
        .map(model_config::metric_to_json)
        .collect();
    Some(json!({
        "loss": model_config::loss_to_json(&loss),
        "optimizer": optimizer_json,
        "metrics": metrics,
    }))
}

impl Sequential {
    /// Saves the whole model to one safetensors file (Keras' `model.save(path)`): every
    /// weight as [`save_weights`](Sequential::save_weights) writes it, and in the file's
    /// metadata the architecture ([`get_config`](Sequential::get_config): each layer's
    /// [`crate::nn::Layer::get_config`] and the input shape) and, once compiled, the loss,
    /// the optimizer with its hyper-parameters and schedule, and the metrics.
    /// [`crate::nn::load_model`]
    /// rebuilds it in another process without the code that built it; see there for what is
    /// not saved (optimizer slots, devices). Written atomically: an existing file stays whole
    /// until the new one is complete.
    ///
    /// ```
    /// use anygpu::nn::{self, Conv2D, Flatten, Dense, Sequential};
    /// let path = std::env::temp_dir().join(format!("anygpu-doc-save-{}.safetensors", std::process::id()));
    /// let mut model = Sequential::with_seed(3);
    /// model.add(Conv2D::new(2, 3).input_shape(&[5, 5, 1]))?;
    /// model.add(Flatten::new())?;
    /// model.add(Dense::new(2))?;
    /// model.save(&path)?;
    /// let loaded = nn::load_model(&path)?;
    /// assert_eq!(loaded.get_weights()?, model.get_weights()?);
    /// assert_eq!(loaded.layer(0).map(|l| l.class_name()), Some("Conv2D"));
    /// # std::fs::remove_file(&path).ok();
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Model`] for a model not built yet, or with a layer that has no config (a
    /// custom layer whose `get_config` returns `None`); [`Error::Io`] when the file cannot be
    /// written; device errors.
    pub fn save(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        save(self, path.as_ref())
    }

    /// The architecture as JSON (Keras' `model.get_config()`): the model's `name` and `seed`,
    /// and its `layers`, an `InputLayer` with the input's `batch_shape` first, then each
    /// layer's `{"class_name", "config"}` with its `name` and the `dtype` policy it computes
    /// in. Weights and the compile config are not part of it.
    ///
    /// ```
    /// use anygpu::nn::{Dense, Sequential};
    /// let mut model = Sequential::new();
    /// model.add(Dense::new(2).input_shape(&[3]))?;
    /// let config = model.get_config()?;
    /// assert_eq!(config["layers"][0]["config"]["batch_shape"], serde_json::json!([null, 3]));
    /// assert_eq!(config["layers"][1]["class_name"], "Dense");
    /// assert_eq!(config["layers"][1]["config"]["name"], "dense");
    /// assert_eq!(config["layers"][1]["config"]["units"], 2);
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Model`] for a model not built yet, or a layer without a config.
    pub fn get_config(&self) -> Result<serde_json::Value> {
        architecture(self)
    }
}

/// Writes `model` to `path`: weights and config, atomically.
pub(crate) fn save(model: &Sequential, path: &Path) -> Result<()> {
    model.require_built("save")?;
    let mut config = json!({"class_name": "Sequential", "config": architecture(model)?});
    if let Some(compile) = compile_config(model) {
        config["compile_config"] = compile;
    }
    weights::save_with(
        &model.named_weights(),
        model.name(),
        Some((CONFIG_KEY, config.to_string())),
        path,
        "save",
    )
}

/// Loads a model saved by [`Sequential::save`] (Keras' `keras.saving.load_model(path)`): its
/// layers rebuilt from their configs, its weights (and `BatchNormalization`'s moving
/// statistics) read back, compiled again as it was when saved.
///
/// The layers are created where `add` would create them: on the device of the current scope
/// (`anygpu::with_device`), or mirrored on every replica inside a
/// [`crate::distribute::MirroredStrategy`]'s scope; the devices the model was saved from are
/// not recorded. What is saved is Keras' architecture, weights and compile config: the
/// optimizer's slot variables and iteration count are not (the loaded model's optimizer starts
/// fresh, as after `compile`; resume training exactly with
/// [`crate::nn::BackupAndRestore`] checkpoints instead), nor are callbacks, the history or a
/// pipeline.
///
/// ```
/// use anygpu::nn::{self, Activation, Dense, Loss, Metric, Sequential, Adam};
/// use anygpu::Tensor;
/// let path = std::env::temp_dir().join(format!("anygpu-doc-model-{}.safetensors", std::process::id()));
/// let mut model = Sequential::with_seed(7);
/// model.add(Dense::new(4).activation(Activation::Relu).input_shape(&[3]))?;
/// model.add(Dense::new(2).activation(Activation::Softmax))?;
/// model.compile(Loss::sparse_categorical_crossentropy(), Adam::new(0.01), &[Metric::Accuracy])?;
/// model.save(&path)?;
///
/// // Elsewhere, without the code that built it:
/// let loaded = nn::load_model(&path)?;
/// let x = Tensor::from_vec(vec![0.1f32, -0.2, 0.3], &[1, 3])?;
/// assert_eq!(loaded.predict(&x)?.to_vec::<f32>()?, model.predict(&x)?.to_vec::<f32>()?);
/// assert_eq!(loaded.get_config()?, model.get_config()?);
/// assert_eq!(loaded.optimizer().map(|o| o.name()), Some("Adam"));
/// // A weights-only file is not a model.
/// model.save_weights(&path)?;
/// assert!(nn::load_model(&path).unwrap_err().to_string().contains("weights only"));
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// [`Error::Io`] when the file cannot be read; [`Error::Model`], naming the file, what was
/// expected and what was found, when it is not a safetensors file (truncated, a hostile header
/// length), holds weights only (written by `save_weights`), has a config that is not JSON or
/// names an unknown layer class or a bad hyper-parameter, or weights that do not fit the
/// architecture (missing, extra, of another dtype or shape); the device's out-of-memory error.
pub fn load_model(path: impl AsRef<Path>) -> Result<Sequential> {
    let path = path.as_ref();
    let err = |m: String| Error::Model(format!("load_model('{}'): {m}", path.display()));
    let bytes = weights::read(path)?;
    let file = SafeTensors::deserialize(&bytes).map_err(|e| {
        err(format!(
            "expected a safetensors file (an 8-byte header length, a JSON header, the tensor \
             data); found {} bytes that are not one: {e}",
            bytes.len()
        ))
    })?;
    let (_, metadata) = SafeTensors::read_metadata(&bytes)
        .map_err(|e| err(format!("unreadable safetensors header: {e}")))?;
    let text = metadata
        .metadata()
        .as_ref()
        .and_then(|m| m.get(CONFIG_KEY))
        .ok_or_else(|| {
            err(format!(
                "expected a model saved by Sequential::save (a '{CONFIG_KEY}' entry in the \
                 metadata); found weights only, as save_weights writes them. Build the model \
                 in code and call load_weights"
            ))
        })?;
    let config: Value = serde_json::from_str(text)
        .map_err(|e| err(format!("the model config is not valid JSON: {e}")))?;
    // What the file holds bounds what the architecture may allocate (see `weights_fit`).
    let budget: u128 = file
        .tensors()
        .iter()
        .map(|(_, t)| t.shape().iter().map(|&d| d as u128).product::<u128>())
        .sum();
    let model = from_config(&config, budget).map_err(|e| err(e.to_string()))?;
    let staged = weights::stage(&file, &model.weight_layout(), |m| {
        err(format!(
            "the weights do not fit the saved architecture: {m}"
        ))
    })?;
    model.write_weights(&staged)?;
    Ok(model)
}

/// A lower bound of the weights (elements) a layer of `class` creates for `input` (one
/// example's shape), from its config: the kernels, which every weighted layer has (a
/// `BatchNormalization`'s moving mean). Only what guards allocation needs: 0 for the layers
/// without weights.
fn kernel_elements(class: &str, config: &Value, input: &[usize]) -> u128 {
    // Saturating: a hostile size must not overflow (and wrap to something small).
    let product = |v: &mut dyn Iterator<Item = u128>| v.fold(1u128, u128::saturating_mul);
    let get = |key: &str| -> u128 {
        match config.get(key) {
            Some(Value::Array(v)) => product(&mut v.iter().map(|d| d.as_u64().unwrap_or(1).into())),
            // An integer kernel_size is a square window.
            Some(v) if key == "kernel_size" => v
                .as_u64()
                .map_or(1, |n| product(&mut [n.into(), n.into()].into_iter())),
            Some(v) => v.as_u64().map_or(1, u128::from),
            None => 1,
        }
    };
    let channels = input.last().map_or(1, |&c| c as u128);
    let features = product(&mut input.iter().map(|&d| d as u128));
    let (k, dm) = (get("kernel_size"), get("depth_multiplier"));
    let terms: &[&[u128]] = match class {
        "Conv2D" => &[&[k, channels, get("filters")]],
        "SeparableConv2D" => &[&[k, channels, dm], &[channels, dm, get("filters")]],
        "DepthwiseConv2D" => &[&[k, channels, dm]],
        "Dense" => &[&[features, get("units")]],
        // Its moving mean at least.
        "BatchNormalization" => &[&[channels]],
        _ => &[],
    };
    terms
        .iter()
        .map(|t| product(&mut t.iter().copied()))
        .fold(0, u128::saturating_add)
}

/// A model (built, compiled when the config says so, weights as initialized) from the
/// metadata's config. `budget` is the number of weight elements the file holds: a layer that
/// would create more cannot be filled from it, and is refused before anything is allocated,
/// so that a hostile config cannot ask for terabytes.
fn from_config(config: &Value, budget: u128) -> Result<Sequential> {
    let top = Fields::new("model config", config)?;
    let class = top.str("class_name")?;
    if class != "Sequential" {
        return Err(Error::InvalidArgument(format!(
            "expected a Sequential model, found class_name '{class}'"
        )));
    }
    let c = Fields::new("Sequential config", top.required("config")?)?;
    let seed = c.u64_opt("seed")?.unwrap_or(0);
    let layers = c.required("layers")?;
    let layers = layers.as_array().ok_or_else(|| {
        Error::InvalidArgument("Sequential config: 'layers' must be a list".into())
    })?;
    let (input, layers) = match layers.split_first() {
        Some((first, rest)) if first.get("class_name") == Some(&json!("InputLayer")) => {
            let f = Fields::new("InputLayer", first)?;
            let ic = Fields::new("InputLayer config", f.required("config")?)?;
            let shape = ic.required("batch_shape")?;
            let dims = shape.as_array().filter(|d| !d.is_empty()).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "InputLayer config: 'batch_shape' must be a list [null, dims...], \
                         found {shape}"
                ))
            })?;
            let input = dims[1..]
                .iter()
                .map(|d| {
                    d.as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .filter(|&n| n > 0)
                        .ok_or_else(|| {
                            Error::InvalidArgument(format!(
                                "InputLayer config: 'batch_shape' must hold positive sizes \
                                 after the batch axis, found {shape}"
                            ))
                        })
                })
                .collect::<Result<Vec<usize>>>()?;
            // Shapes are products of these sizes: keep them far from overflowing.
            if input.iter().map(|&d| d as u128).product::<u128>() > 1 << 40 {
                return Err(Error::InvalidArgument(format!(
                    "InputLayer config: batch_shape {shape} has more than 2^40 elements per \
                     example"
                )));
            }
            (input, rest)
        }
        _ => {
            return Err(Error::InvalidArgument(
                "Sequential config: the first layer must be an InputLayer with the input's \
                 batch_shape (the model was saved unbuilt?)"
                    .into(),
            ))
        }
    };
    if layers.is_empty() {
        return Err(Error::InvalidArgument(
            "Sequential config: the model has no layers".into(),
        ));
    }
    let mut model = Sequential::with_seed(seed);
    if let Some(name) = c.get("name").and_then(Value::as_str) {
        model.set_name(name);
    }
    // The scope, resolved once, as `add` would (under a strategy, its primary replica).
    let device = match model.strategy() {
        Some(strategy) => strategy.devices()[0].clone(),
        None => Tensor::zeros(&[1])?.device_handle().clone(),
    };
    let at = |i: usize, v: &Value, e: Error| {
        let name = v
            .get("config")
            .and_then(|c| c.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("?");
        Error::InvalidArgument(format!("layer {i} ('{name}'): {e}"))
    };
    let mut shape = input.clone();
    for (i, v) in layers.iter().enumerate() {
        let layer = layer_from_config(v).map_err(|e| at(i, v, e))?;
        let wanted = kernel_elements(layer.class_name(), &v["config"], &shape);
        if wanted > budget {
            return Err(at(
                i,
                v,
                Error::InvalidArgument(format!(
                    "{} on input {shape:?} would have at least {wanted} weights, but the file \
                     holds {budget} in all",
                    layer.class_name()
                )),
            ));
        }
        shape = layer
            .compute_output_shape(&shape)
            .map_err(|e| at(i, v, e))?;
        model.add_boxed(&device, layer).map_err(|e| at(i, v, e))?;
    }
    model.build(&input)?;
    if let Some(compile) = top.get("compile_config") {
        let cc = Fields::new("compile_config", compile)?;
        let loss = loss_from_json(cc.required("loss")?)?;
        let optimizer = optimizer_from_json(cc.required("optimizer")?)?;
        let metrics = match cc.get("metrics") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(metric_from_json)
                .collect::<Result<Vec<_>>>()?,
            Some(other) => {
                return Err(Error::InvalidArgument(format!(
                    "compile_config: 'metrics' must be a list, found {other}"
                )))
            }
        };
        model.compile(loss, optimizer, &metrics)?;
    }
    Ok(model)
}
