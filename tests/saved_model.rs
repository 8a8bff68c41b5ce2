//! `model.save(path)` / `anygpu::nn::load_model(path)`: every layer's config round-trips
//! (and reads Keras' own serialization), a model trained and saved predicts bit-identically
//! once loaded, on every device and in a fresh process, and broken or foreign files are clear
//! errors that leave nothing half-loaded.

mod common;

use std::path::{Path, PathBuf};

use anygpu::nn::{
    self, Activation, ActivationLayer, Adam, AdamW, AveragePooling2D, BatchNormalization, Conv2D,
    CosineDecay, Dense, DepthwiseConv2D, Dropout, Flatten, GlobalAveragePooling2D,
    GlobalMaxPooling2D, Layer, Loss, MaxPool2D, Metric, ReLU, SeparableConv2D, Sequential, Sgd,
    Verbosity,
};
use anygpu::ops::spec::Padding;
use anygpu::{Error, LogicalDevice, Runtime, Tensor};
use serde_json::{json, Value};

fn runtime() -> Runtime {
    common::builder()
        .memory_growth(true)
        .build()
        .expect("the runtime initializes")
}

/// A file in the temp dir, unique per test and process.
fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "anygpu-saved-model-{}-{name}.safetensors",
        std::process::id()
    ))
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>()
        .expect("readback")
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// A function that builds a model from a seed.
type Builder = fn(u64) -> anygpu::Result<Sequential>;

/// Every built-in layer, in two models that chain: an image model and a flat one.
fn image_model(seed: u64) -> anygpu::Result<Sequential> {
    let mut m = Sequential::with_seed(seed);
    m.add(
        Conv2D::new(4, (3, 2))
            .strides(2)
            .padding(Padding::Same)
            .activation(Activation::Relu)
            .use_bias(false)
            .input_shape(&[9, 9, 2]),
    )?;
    m.add(BatchNormalization::new().momentum(0.9).epsilon(1e-2))?;
    m.add(ReLU::new().max_value(6.0).negative_slope(0.1))?;
    m.add(
        SeparableConv2D::new(4, 3)
            .padding(Padding::Same)
            .depth_multiplier(2)
            .activation(Activation::Gelu { approximate: true }),
    )?;
    m.add(
        DepthwiseConv2D::new(3)
            .padding(Padding::Same)
            .depth_multiplier(2)
            .activation(Activation::Elu),
    )?;
    m.add(
        MaxPool2D::new()
            .pool_size(3)
            .strides(1)
            .padding(Padding::Same),
    )?;
    m.add(MaxPool2D::new())?;
    m.add(
        AveragePooling2D::new((2, 1))
            .strides((1, 1))
            .padding(Padding::Same),
    )?;
    m.add(ActivationLayer::new(Activation::Tanh))?;
    m.add(Dropout::new(0.25).seed(5))?;
    m.add(GlobalAveragePooling2D::new())?;
    m.add(Dense::new(3).activation(Activation::Softmax))?;
    Ok(m)
}

fn flat_model(seed: u64) -> anygpu::Result<Sequential> {
    let mut m = Sequential::with_seed(seed);
    m.add(Conv2D::new(3, 2).dilation_rate(2).input_shape(&[6, 6, 2]))?;
    m.add(GlobalMaxPooling2D::new())?;
    m.add(Dropout::new(0.5))?; // no seed: derived from the model's
    m.add(Dense::new(6).activation(Activation::Swish))?;
    m.add(BatchNormalization::new().center(false))?;
    m.add(ActivationLayer::new(Activation::Softplus))?;
    m.add(Dense::new(2).activation(Activation::Softmax))?;
    Ok(m)
}

fn flatten_model(seed: u64) -> anygpu::Result<Sequential> {
    let mut m = Sequential::with_seed(seed);
    m.add(Flatten::new().input_shape(&[3, 3, 2]))?;
    m.add(Dense::new(4).activation(Activation::Sigmoid))?;
    m.add(Dense::new(2))?;
    Ok(m)
}

/// Two training steps (so the weights, the moving statistics and the Dropout masks have
/// moved), then a prediction in inference mode.
fn train_a_little(m: &mut Sequential, input: &[usize], classes: i32) -> Tensor {
    let n = 4;
    let len: usize = input.iter().product();
    let mut shape = vec![n];
    shape.extend_from_slice(input);
    let x = Tensor::from_vec(common::values(n * len, 11), &shape).expect("x");
    let y = Tensor::from_vec((0..n as i32).map(|i| i % classes).collect(), &[n]).expect("y");
    for _ in 0..2 {
        m.train_step(&x, &y).expect("train step");
    }
    x
}

#[test]
fn every_layer_round_trips_on_every_device() {
    let rt = runtime();
    let path = temp("every-layer");
    for dev in common::all_devices(&rt, "every_layer_round_trips_on_every_device") {
        let _scope = dev.scope();
        let builders: [(Builder, Loss, i32); 3] = [
            (image_model, Loss::sparse_categorical_crossentropy(), 3),
            (flat_model, Loss::sparse_categorical_crossentropy(), 2),
            (
                flatten_model,
                Loss::SparseCategoricalCrossentropy { from_logits: true },
                2,
            ),
        ];
        for (build, loss, classes) in builders {
            let mut model = build(7).expect("model");
            model
                .compile(loss, Adam::new(0.01), &[Metric::Accuracy])
                .expect("compile");
            let input = model.input_shape().expect("built").to_vec();
            let x = train_a_little(&mut model, &input, classes);
            model.save(&path).expect("save");
            let loaded = nn::load_model(&path).expect("load_model");
            let what = format!(
                "{} on {}",
                model.layer(0).map_or("?", |l| l.class_name()),
                dev
            );
            assert_eq!(
                loaded.get_config().expect("config"),
                model.get_config().expect("config"),
                "{what}"
            );
            for i in 0..model.len() {
                let (a, b) = (
                    model.layer(i).expect("layer"),
                    loaded.layer(i).expect("layer"),
                );
                assert_eq!(a.class_name(), b.class_name(), "{what}");
                // The loaded layer has its policy explicitly (`dtype` in its config): the one
                // the original computed in.
                let (mut ca, cb) = (
                    a.get_config().expect("config"),
                    b.get_config().expect("config"),
                );
                ca["dtype"] = cb["dtype"].clone();
                assert_eq!(ca, cb, "{what}: layer {i}");
                assert_eq!(cb["dtype"], "float32", "{what}: layer {i}");
                assert!(
                    loaded.layer_device(i).expect("device").same_device(&dev),
                    "{what}: layer {i} loaded outside the scope"
                );
            }
            assert_eq!(
                loaded.get_weights().expect("w"),
                model.get_weights().expect("w"),
                "{what}"
            );
            assert_eq!(
                bits(&loaded.predict(&x).expect("predict")),
                bits(&model.predict(&x).expect("predict")),
                "{what}: predictions differ"
            );
            assert_eq!(loaded.loss(), model.loss(), "{what}");
            assert_eq!(loaded.metrics_names(), model.metrics_names(), "{what}");
            assert_eq!(loaded.optimizer(), model.optimizer(), "{what}");
        }
    }
    std::fs::remove_file(&path).ok();
}

/// Keras' own `serialize_keras_object(layer)` (tests/data/keras_layer_configs.json, written by
/// scripts/keras_layer_configs.py) reads, and what anygpu writes back uses Keras' key names
/// and values.
#[test]
fn keras_configs_read_and_write_back_with_the_same_keys_and_values() {
    let text = include_str!("data/keras_layer_configs.json");
    let configs: Vec<Value> = serde_json::from_str(text).expect("the data file is JSON");
    assert!(configs.len() >= 13);
    for keras in &configs {
        let class = keras["class_name"].as_str().expect("class_name");
        let layer = nn::layer_from_config(keras)
            .unwrap_or_else(|e| panic!("Keras' {class} config does not read: {e}"));
        let ours = layer.get_config().expect("a built-in layer has a config");
        let theirs = &keras["config"];
        for (key, value) in ours.as_object().expect("an object") {
            let expected = match key.as_str() {
                // Keras writes the DTypePolicy object; we the policy's name.
                "dtype" => &theirs["dtype"]["config"]["name"],
                _ => &theirs[key],
            };
            assert_eq!(value, expected, "{class}: key '{key}' (Keras: {theirs})");
        }
        // Every Keras hyper-parameter anygpu models is written.
        for key in [
            "filters",
            "kernel_size",
            "strides",
            "padding",
            "dilation_rate",
            "activation",
            "use_bias",
            "depth_multiplier",
            "units",
            "pool_size",
            "axis",
            "momentum",
            "epsilon",
            "center",
            "scale",
            "rate",
            "seed",
            "max_value",
            "negative_slope",
            "threshold",
            "data_format",
            "keepdims",
        ] {
            if theirs.get(key).is_some() {
                assert!(
                    ours.get(key).is_some(),
                    "{class}: key '{key}' is not written"
                );
            }
        }
    }
}

#[test]
fn layer_configs_round_trip_without_a_device() {
    let layers: Vec<Box<dyn Layer>> = vec![
        Box::new(
            Conv2D::new(8, (3, 5))
                .strides((2, 1))
                .padding(Padding::Same),
        ),
        Box::new(Dense::new(4).dtype_policy(anygpu::mixed_precision::Policy::MIXED_FLOAT16)),
        Box::new(ReLU::new()),
        Box::new(Dropout::new(0.1)),
        Box::new(MaxPool2D::new()),
        Box::new(
            MaxPool2D::new()
                .pool_size((3, 2))
                .strides(2)
                .padding(Padding::Same),
        ),
        Box::new(BatchNormalization::new().synchronized(true)),
    ];
    for layer in layers {
        let config = layer.get_config().expect("config");
        let copy =
            nn::layer_from_config(&json!({"class_name": layer.class_name(), "config": config}))
                .expect("reads back");
        assert_eq!(copy.get_config(), Some(config), "{}", layer.class_name());
        assert_eq!(copy.dtype_policy(), layer.dtype_policy());
    }
    // A float32 hyper-parameter is written as its shortest decimal, as Keras prints it.
    let bn = BatchNormalization::new().get_config().expect("config");
    assert_eq!(bn["momentum"].to_string(), "0.99");
    assert_eq!(bn["epsilon"].to_string(), "0.001");
}

#[test]
fn bad_layer_configs_are_clear_errors() {
    let cases = [
        (
            json!({"class_name": "LSTM", "config": {"units": 4}}),
            "Unknown layer class 'LSTM'",
        ),
        (
            json!({"class_name": "Conv2D", "config": {"kernel_size": 3}}),
            "Conv2D config: the required key 'filters' is missing",
        ),
        (
            json!({"class_name": "Dense", "config": {"units": "ten"}}),
            "Dense config: 'units' must be a non-negative integer, found \"ten\"",
        ),
        (
            json!({"class_name": "Dense", "config": {"units": 2, "activation": "mish"}}),
            "Unknown activation function: 'mish'",
        ),
        (
            json!({"class_name": "Conv2D", "config": {"filters": 2, "kernel_size": [3, 3, 3]}}),
            "'kernel_size' must be an integer or a list of 2 integers",
        ),
        (
            json!({"class_name": "Conv2D", "config": {"filters": 2, "kernel_size": 3, "data_format": "channels_first"}}),
            "data_format=\"channels_first\" is not supported",
        ),
        (
            json!({"class_name": "Dense", "config": {"units": 2, "use_bias": false}}),
            "use_bias=false is not supported",
        ),
        (
            json!({"class_name": "Dropout", "config": {"rate": 0.5, "dtype": "bfloat16"}}),
            "dtype policy 'bfloat16' is not supported",
        ),
        (
            json!({"class_name": "BatchNormalization", "config": {"momentum": 1e300}}),
            "'momentum' must be a number in float32's range",
        ),
        (json!(["Dense"]), "layer config: expected a JSON object"),
    ];
    for (config, expected) in cases {
        let err = nn::layer_from_config(&config).expect_err("a bad config");
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        assert!(
            err.to_string().contains(expected),
            "{config}: got '{err}', expected '{expected}'"
        );
    }
}

/// The header JSON of a safetensors file, and the rest.
fn split(bytes: &[u8]) -> (Value, &[u8]) {
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).expect("header JSON");
    (header, &bytes[8 + n..])
}

fn join(header: &Value, data: &[u8]) -> Vec<u8> {
    let h = header.to_string().into_bytes();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out
}

/// Rewrites the model config stored in the file at `path` with `edit` (the raw string).
fn edit_config(path: &Path, edit: impl FnOnce(String) -> String) {
    let bytes = std::fs::read(path).expect("read");
    let (mut header, data) = split(&bytes);
    let config = header["__metadata__"]["model_config"]
        .as_str()
        .expect("a saved model has a config")
        .to_string();
    header["__metadata__"]["model_config"] = json!(edit(config));
    std::fs::write(path, join(&header, data)).expect("write");
}

fn edit_config_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    edit_config(path, |s| {
        let mut v: Value = serde_json::from_str(&s).expect("JSON");
        edit(&mut v);
        v.to_string()
    });
}

fn small_model() -> Sequential {
    let mut m = Sequential::with_seed(3);
    m.add(Conv2D::new(2, 3).input_shape(&[5, 5, 1]))
        .expect("add");
    m.add(Flatten::new()).expect("add");
    m.add(Dense::new(3).activation(Activation::Softmax))
        .expect("add");
    m.compile(
        Loss::sparse_categorical_crossentropy(),
        Sgd::new(0.1).momentum(0.9),
        &[
            Metric::Accuracy,
            Metric::SparseTopKCategoricalAccuracy { k: 2 },
        ],
    )
    .expect("compile");
    m
}

fn load_err(path: &Path) -> String {
    let err = nn::load_model(path).expect_err("a bad file");
    let message = err.to_string();
    assert!(matches!(err, Error::Model(_)), "{err:?}");
    assert!(
        message.contains(&format!("load_model('{}')", path.display())),
        "the message names the file: {message}"
    );
    message
}

#[test]
fn broken_and_foreign_files_are_clear_errors() {
    let _cpu = anygpu::with_device("/cpu:0").expect("cpu");
    let model = small_model();
    let path = temp("broken");
    let check = |setup: &dyn Fn(&Path), expected: &str| {
        model.save(&path).expect("save");
        setup(&path);
        let message = load_err(&path);
        assert!(
            message.contains(expected),
            "got '{message}', expected '{expected}'"
        );
    };
    // A truncated file.
    check(
        &|p| {
            let bytes = std::fs::read(p).expect("read");
            std::fs::write(p, &bytes[..bytes.len() / 2]).expect("write");
        },
        "expected a safetensors file",
    );
    // A header length far beyond the file (a hostile header).
    check(
        &|p| {
            let mut bytes = std::fs::read(p).expect("read");
            bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
            std::fs::write(p, &bytes).expect("write");
        },
        "expected a safetensors file",
    );
    check(
        &|p| std::fs::write(p, b"\x04\0\0\0\0\0\0\0{}").expect("write"),
        "expected a safetensors file",
    );
    check(&|p| std::fs::write(p, b"").expect("write"), "found 0 bytes");
    // Garbage JSON in the config.
    check(
        &|p| edit_config(p, |_| "{\"class_name\": \"Seq".into()),
        "the model config is not valid JSON",
    );
    // A config naming an unknown layer.
    check(
        &|p| {
            edit_config_json(p, |v| {
                v["config"]["layers"][2]["class_name"] = json!("LSTM")
            })
        },
        "layer 1 ('flatten'): Unknown layer class 'LSTM'",
    );
    // An ill-typed key.
    check(
        &|p| {
            edit_config_json(p, |v| {
                v["config"]["layers"][1]["config"]["filters"] = json!(-2)
            })
        },
        "layer 0 ('conv2d'): Conv2D config: 'filters' must be a non-negative integer, found -2",
    );
    // An architecture the weights do not fit.
    check(
        &|p| {
            edit_config_json(p, |v| {
                v["config"]["layers"][3]["config"]["units"] = json!(4)
            })
        },
        "shape mismatch for weight 'dense/kernel': the file has [18, 3], the model expects [18, 4]",
    );
    check(
        &|p| {
            edit_config_json(p, |v| {
                v["config"]["layers"].as_array_mut().expect("layers").pop();
                v.as_object_mut().expect("object").remove("compile_config");
            })
        },
        "the file has weights the model does not: dense/bias, dense/kernel",
    );
    check(
        &|p| edit_config_json(p, |v| v["class_name"] = json!("Functional")),
        "expected a Sequential model, found class_name 'Functional'",
    );
    check(
        &|p| {
            edit_config_json(p, |v| {
                v["compile_config"]["optimizer"]["class_name"] = json!("Lion")
            })
        },
        "Unknown optimizer 'Lion'",
    );
    // Sizes that would allocate far more than the file holds are refused before any
    // allocation.
    check(
        &|p| edit_config_json(p, |v| v["config"]["layers"][1]["config"]["filters"] = json!(1u64 << 60)),
        "layer 0 ('conv2d'): Conv2D on input [5, 5, 1] would have at least 10376293541461622784 weights, but the file holds 77 in all",
    );
    check(
        &|p| {
            edit_config_json(p, |v| {
                v["config"]["layers"][3]["config"]["units"] = json!(u64::MAX)
            })
        },
        "Dense on input [18] would have at least",
    );
    check(
        &|p| {
            edit_config_json(p, |v| {
                v["config"]["layers"][0]["config"]["batch_shape"] =
                    json!([null, 1u64 << 30, 1u64 << 30, 1])
            })
        },
        "more than 2^40 elements per example",
    );
    // A weights-only file.
    model.save_weights(&path).expect("save_weights");
    let message = load_err(&path);
    assert!(message.contains("found weights only"), "{message}");
    // A missing file is an I/O error naming it.
    std::fs::remove_file(&path).ok();
    let err = nn::load_model(&path).expect_err("no file");
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
}

#[test]
fn loading_a_saved_model_into_another_architecture_is_refused_and_changes_nothing() {
    let _cpu = anygpu::with_device("/cpu:0").expect("cpu");
    let path = temp("mismatch");
    small_model().save(&path).expect("save");
    let mut other = Sequential::with_seed(9);
    other
        .add(Conv2D::new(2, 3).input_shape(&[5, 5, 1]))
        .expect("add");
    other.add(Flatten::new()).expect("add");
    other.add(Dense::new(4)).expect("add");
    let before = other.get_weights().expect("weights");
    let err = other.load_weights(&path).expect_err("another architecture");
    assert!(err.to_string().contains("dense/kernel"), "{err}");
    assert_eq!(
        other.get_weights().expect("weights"),
        before,
        "nothing half-loaded"
    );
    // The same architecture takes a saved model's weights.
    let mut same = small_model();
    same.load_weights(&path)
        .expect("load_weights of a saved model");
    std::fs::remove_file(&path).ok();
}

#[test]
fn what_cannot_be_saved_is_a_clear_error() {
    let _cpu = anygpu::with_device("/cpu:0").expect("cpu");
    let path = temp("unsaveable");
    let mut unbuilt = Sequential::new();
    unbuilt.add(Dense::new(2)).expect("add");
    let err = unbuilt.save(&path).expect_err("not built");
    assert!(err.to_string().contains("not yet been built"), "{err}");

    /// A custom layer without a config.
    #[derive(Debug, Clone)]
    struct Custom(Flatten);
    impl Layer for Custom {
        fn class_name(&self) -> &'static str {
            "Custom"
        }
        fn base_name(&self) -> &'static str {
            "custom"
        }
        fn declared_input_shape(&self) -> Option<&[usize]> {
            self.0.declared_input_shape()
        }
        fn compute_output_shape(&self, s: &[usize]) -> anygpu::Result<Vec<usize>> {
            self.0.compute_output_shape(s)
        }
        fn build(&mut self, s: &[usize], seed: u64, d: &LogicalDevice) -> anygpu::Result<()> {
            self.0.build(s, seed, d)
        }
        fn weights(&self) -> Vec<(&'static str, &Tensor)> {
            Vec::new()
        }
        fn set_weight(&mut self, i: usize, v: Tensor) -> anygpu::Result<()> {
            self.0.set_weight(i, v)
        }
        fn forward(&self, x: &Tensor) -> anygpu::Result<(Tensor, Vec<Tensor>)> {
            self.0.forward(x)
        }
        fn backward(
            &self,
            saved: &[Tensor],
            dy: &Tensor,
            need_dx: bool,
        ) -> anygpu::Result<(Option<Tensor>, Vec<Tensor>)> {
            self.0.backward(saved, dy, need_dx)
        }
        fn boxed_clone(&self) -> Box<dyn Layer> {
            Box::new(self.clone())
        }
    }
    let mut custom = Sequential::new();
    custom
        .add(Custom(Flatten::new().input_shape(&[2, 2, 1])))
        .expect("add");
    let err = custom.save(&path).expect_err("no config");
    assert!(
        err.to_string()
            .contains("layer 'custom' (Custom) has no config"),
        "{err}"
    );
    assert!(!path.exists(), "nothing written");
}

#[test]
fn the_compile_config_round_trips_with_schedules_and_the_current_learning_rate() {
    let _cpu = anygpu::with_device("/cpu:0").expect("cpu");
    let path = temp("compile");
    let mut model = small_model();
    let schedule = CosineDecay::new(0.01, 100).alpha(0.1).warmup(0.02, 10);
    let adamw = AdamW::new(3e-4)
        .learning_rate_schedule(schedule)
        .global_clipnorm(1.0);
    model
        .compile(
            Loss::CategoricalCrossentropy {
                from_logits: false,
                label_smoothing: 0.1,
            },
            adamw,
            &[
                Metric::CategoricalAccuracy,
                Metric::BinaryAccuracy { threshold: 0.25 },
            ],
        )
        .expect("compile");
    model.save(&path).expect("save");
    let loaded = nn::load_model(&path).expect("load");
    assert_eq!(loaded.loss(), model.loss());
    assert_eq!(loaded.metrics_names(), model.metrics_names());
    let (a, b) = (
        loaded.optimizer().expect("compiled"),
        model.optimizer().expect("compiled"),
    );
    assert_eq!(a.options(), b.options(), "schedule, weight decay, clipping");
    assert_eq!(a.name(), "AdamW");
    assert_eq!(loaded.learning_rate(), model.learning_rate());

    // A constant rate changed after compile (ReduceLROnPlateau) is saved as it is now.
    let mut model = small_model();
    model.set_learning_rate(0.025).expect("set");
    model.save(&path).expect("save");
    let loaded = nn::load_model(&path).expect("load");
    assert_eq!(loaded.learning_rate(), Some(0.025));
    assert_eq!(loaded.optimizer().map(|o| o.name()), Some("SGD"));

    // An uncompiled model loads uncompiled.
    let mut plain = Sequential::new();
    plain.add(Dense::new(2).input_shape(&[3])).expect("add");
    plain.save(&path).expect("save");
    assert!(nn::load_model(&path).expect("load").optimizer().is_none());
    std::fs::remove_file(&path).ok();
}

/// The child half of `a_model_saved_here_predicts_bit_identically_in_a_fresh_process`: a
/// no-op unless the parent set the variable, then it loads the model on CPU:0 and writes its
/// predictions and evaluation.
const CHILD_VAR: &str = "ANYGPU_SAVED_MODEL_CHILD";

#[test]
fn saved_model_child_process() {
    let Ok(dir) = std::env::var(CHILD_VAR) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let _cpu = anygpu::with_device("/cpu:0").expect("cpu");
    let model = nn::load_model(dir.join("model.safetensors")).expect("load in the child");
    let (x, y) = common::synthetic(12, 99);
    let xt = Tensor::from_vec(x, &[12, 8, 8, 1]).expect("x");
    let yt = Tensor::from_vec(y, &[12]).expect("y");
    let predictions = model
        .predict(&xt)
        .expect("predict")
        .to_vec::<f32>()
        .expect("read");
    let bytes: Vec<u8> = predictions.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(dir.join("child_predictions"), bytes).expect("write");
    let data = anygpu::data::Dataset::from_tensor_slices(
        xt.to_vec::<f32>().expect("x"),
        &[8, 8, 1],
        yt.to_vec::<i32>().expect("y"),
    )
    .expect("dataset")
    .batch(6, false);
    let eval = model
        .evaluate(&data, None)
        .expect("the loaded model is compiled");
    std::fs::write(dir.join("child_loss"), eval.loss.to_bits().to_le_bytes()).expect("write");
}

#[test]
fn a_model_saved_here_predicts_bit_identically_in_a_fresh_process() {
    let _cpu = anygpu::with_device("/cpu:0").expect("cpu");
    let dir = std::env::temp_dir().join(format!("anygpu-saved-model-child-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    // Trained by fit: Conv2D, BatchNormalization, Dropout, pooling, Dense.
    let mut model = Sequential::with_seed(21);
    model
        .add(
            Conv2D::new(4, 3)
                .padding(Padding::Same)
                .input_shape(&[8, 8, 1]),
        )
        .expect("add");
    model.add(BatchNormalization::new()).expect("add");
    model.add(ReLU::new()).expect("add");
    model.add(MaxPool2D::new()).expect("add");
    model.add(Dropout::new(0.2).seed(1)).expect("add");
    model.add(Flatten::new()).expect("add");
    model
        .add(Dense::new(3).activation(Activation::Softmax))
        .expect("add");
    model
        .compile(
            Loss::sparse_categorical_crossentropy(),
            Adam::new(0.01),
            &[Metric::Accuracy],
        )
        .expect("compile");
    model.set_verbose(Verbosity::Silent);
    let (x, y) = common::synthetic(48, 5);
    let train = anygpu::data::Dataset::from_tensor_slices(x, &[8, 8, 1], y)
        .expect("dataset")
        .batch(8, false);
    model.fit(&train, 2, None, None).expect("fit");
    model.save(dir.join("model.safetensors")).expect("save");

    let child = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "saved_model_child_process",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(CHILD_VAR, &dir)
        .output()
        .expect("the child runs");
    assert!(
        child.status.success(),
        "the child failed: {}\n{}{}",
        child.status,
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );

    let (x, y) = common::synthetic(12, 99);
    let xt = Tensor::from_vec(x.clone(), &[12, 8, 8, 1]).expect("x");
    let here: Vec<u32> = bits(&model.predict(&xt).expect("predict"));
    let there: Vec<u32> = std::fs::read(dir.join("child_predictions"))
        .expect("the child's predictions")
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]).to_bits())
        .collect();
    assert_eq!(
        there, here,
        "the loaded model predicts differently in the child"
    );
    let data = anygpu::data::Dataset::from_tensor_slices(x, &[8, 8, 1], y)
        .expect("dataset")
        .batch(6, false);
    let loss = model.evaluate(&data, None).expect("evaluate").loss;
    let child_loss = std::fs::read(dir.join("child_loss")).expect("the child's loss");
    assert_eq!(
        child_loss,
        loss.to_bits().to_le_bytes(),
        "the loaded model evaluates differently in the child"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_model_loaded_in_a_strategy_scope_is_mirrored_on_every_replica() {
    let rt = common::builder().virtual_cpus(2).build().expect("2 CPUs");
    let cpus = rt.list_logical_devices("CPU").expect("CPUs");
    let path = temp("mirrored");
    let saved = {
        let _cpu0 = cpus[0].scope();
        let m = small_model();
        m.save(&path).expect("save");
        m
    };
    let strategy = anygpu::distribute::MirroredStrategy::with_devices(&cpus).expect("strategy");
    let loaded = strategy
        .scope(|| nn::load_model(&path))
        .expect("scope")
        .expect("load_model");
    assert_eq!(loaded.strategy(), Some(&strategy));
    let want = saved.get_weights().expect("weights");
    assert_eq!(loaded.get_weights().expect("r0"), want);
    assert_eq!(loaded.replica_weights(1).expect("r1"), want);
    assert_eq!(loaded.optimizer(), saved.optimizer());
    std::fs::remove_file(&path).ok();
}

/// The fuzz target's property (fuzz/fuzz_targets/saved_model.rs) on a few hundred corruptions
/// of a real file: flipped bytes anywhere (header, config, data) and truncations load whole or
/// are an error naming the file, and never panic.
#[test]
fn corrupted_files_load_whole_or_fail_cleanly() {
    let _cpu = anygpu::with_device("/cpu:0").expect("cpu");
    let path = temp("corrupted");
    small_model().save(&path).expect("save");
    let original = std::fs::read(&path).expect("read");
    let noise = common::values(600, 17);
    let (mut loaded, mut refused) = (0, 0);
    for (i, v) in noise.chunks_exact(2).enumerate() {
        let mut bytes = original.clone();
        let at = ((v[0] + 1.0) / 2.0 * bytes.len() as f32) as usize % bytes.len();
        if i % 10 == 0 {
            bytes.truncate(at);
        } else {
            bytes[at] ^= 1 << (((v[1] + 1.0) * 4.0) as u32 % 8);
        }
        std::fs::write(&path, &bytes).expect("write");
        match nn::load_model(&path) {
            Ok(model) => {
                let x = Tensor::from_vec(vec![0.5f32; 25], &[1, 5, 5, 1]).expect("x");
                model.predict(&x).expect("a model that loads predicts");
                loaded += 1;
            }
            Err(e) => {
                assert!(
                    e.to_string().contains(&path.display().to_string()),
                    "the error names the file: {e}"
                );
                refused += 1;
            }
        }
    }
    // Flips in the weights' data load (a different value is still a float).
    assert!(
        loaded > 0 && refused > 0,
        "loaded {loaded}, refused {refused}"
    );
    std::fs::remove_file(&path).ok();
}
