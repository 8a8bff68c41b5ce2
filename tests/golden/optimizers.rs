//! Keras 3's optimizers against TensorFlow: SGD, Adam, AdamW and RMSprop (every slot
//! combination), with weight decay, `clipnorm`, `global_clipnorm`, `clipvalue` and schedules,
//! applied through [`Sequential::apply_gradients`] to a Dense(4) on 3 features (kernel `w0`,
//! bias `w1`) for three steps of fixed gradients: the weights after every step and the slots
//! after the last, on CPU:0 and every GPU adapter.

use anygpu::nn::{
    Adam, AdamW, BaseOptions, Dense, ExponentialDecay, LearningRateSchedule, Loss, Optimizer,
    PiecewiseConstantDecay, RmsProp, Sequential, Sgd,
};
use anygpu::LogicalDevice;

use crate::common::golden::{Case, Golden};
use crate::{devices, read, runtime, upload};

fn opt_f32(case: &Case<'_>, key: &str) -> Option<f32> {
    case.config()[key].as_f64().map(|v| v as f32)
}

fn options(case: &Case<'_>) -> BaseOptions {
    let schedule: Option<LearningRateSchedule> = match case.config()["schedule"].as_str() {
        None => None,
        Some("exponential") => Some(
            ExponentialDecay::new(
                case.f64("initial_learning_rate"),
                case.usize("decay_steps") as u64,
                case.f64("decay_rate"),
            )
            .into(),
        ),
        Some("piecewise") => {
            let list = |key: &str| case.config()[key].as_array().expect("a list").clone();
            Some(
                PiecewiseConstantDecay::new(
                    list("boundaries")
                        .iter()
                        .map(|v| v.as_u64().expect("a step"))
                        .collect(),
                    list("values")
                        .iter()
                        .map(|v| v.as_f64().expect("a rate"))
                        .collect(),
                )
                .into(),
            )
        }
        Some(other) => panic!("{}: schedule {other}", case.name),
    };
    BaseOptions {
        schedule,
        weight_decay: opt_f32(case, "weight_decay"),
        clipnorm: opt_f32(case, "clipnorm"),
        global_clipnorm: opt_f32(case, "global_clipnorm"),
        clipvalue: opt_f32(case, "clipvalue"),
    }
}

/// The case's optimizer, built through the public constructors.
fn optimizer(case: &Case<'_>) -> Optimizer {
    let lr = opt_f32(case, "learning_rate");
    let options = options(case);
    match case.str("optimizer") {
        "sgd" => {
            let mut o =
                Sgd::new(lr.unwrap_or(0.01)).momentum(opt_f32(case, "momentum").unwrap_or(0.0));
            o.options = options;
            o.into()
        }
        "adam" => {
            let mut o = Adam::new(lr.unwrap_or(1e-3));
            o.options = options;
            o.into()
        }
        "adamw" => {
            let mut o = AdamW::new(lr.unwrap_or(1e-3));
            let decay = options.weight_decay.or(o.options.weight_decay);
            o.options = BaseOptions {
                weight_decay: decay,
                ..options
            };
            o.into()
        }
        "rmsprop" => {
            let mut o = RmsProp::new(lr.unwrap_or(1e-3))
                .momentum(opt_f32(case, "momentum").unwrap_or(0.0))
                .rho(opt_f32(case, "rho").unwrap_or(0.9))
                .centered(case.config()["centered"].as_bool().unwrap_or(false));
            o.options = options;
            o.into()
        }
        other => panic!("{}: optimizer {other}", case.name),
    }
}

fn check_case(case: &Case<'_>, dev: &LogicalDevice) {
    let name = dev.to_string();
    let mut model = Sequential::new();
    model
        .add_on(dev, Dense::new(4).input_shape(&[3]))
        .expect("a Dense layer");
    model
        .compile(
            Loss::SparseCategoricalCrossentropy { from_logits: true },
            optimizer(case),
            &[],
        )
        .unwrap_or_else(|e| panic!("{}: compile: {e}", case.name));
    let w: Vec<Vec<f32>> = ["w0", "w1"].iter().map(|k| case.input(k).1).collect();
    model.set_weights(&w).expect("set_weights");
    for step in 0..3 {
        let grads: Vec<_> = (0..2)
            .map(|i| upload(case, &format!("g{step}_{i}"), dev))
            .collect();
        model
            .apply_gradients(&grads)
            .unwrap_or_else(|e| panic!("{}: step {step} on {name}: {e}", case.name));
        for (i, t) in model.weights().iter().enumerate() {
            case.check(&name, &format!("w{i}_step{step}"), t.shape(), &read(t));
        }
    }
    assert_eq!(model.iterations(), 3, "{}: iterations", case.name);
    let slots = model.optimizer_variables();
    for key in case.outputs().iter().filter(|k| !k.starts_with('w')) {
        let (slot, index) = key.rsplit_once('_').expect("<slot>_<index>");
        let weight = ["kernel", "bias"][index.parse::<usize>().expect("an index")];
        let (_, t) = slots
            .iter()
            .find(|(n, _)| n.ends_with(&format!("/{weight}/{slot}")))
            .unwrap_or_else(|| {
                panic!(
                    "{}: no slot {weight}/{slot} in {:?}",
                    case.name,
                    slots.iter().map(|(n, _)| n).collect::<Vec<_>>()
                )
            });
        case.check(&name, key, t.shape(), &read(t));
    }
}

#[test]
fn golden_optimizers() {
    let rt = runtime();
    let golden = Golden::load("optimizers");
    for dev in devices(&rt, "golden_optimizers") {
        for case in golden.cases() {
            check_case(&case, &dev);
        }
    }
}

#[test]
fn golden_schedules() {
    let golden = Golden::load("schedules");
    for case in golden.cases() {
        let schedule: LearningRateSchedule = match case.str("schedule") {
            "exponential" => ExponentialDecay::new(
                case.f64("initial_learning_rate"),
                case.usize("decay_steps") as u64,
                case.f64("decay_rate"),
            )
            .staircase(case.config()["staircase"].as_bool().unwrap_or(false))
            .into(),
            "piecewise" => {
                let list = |key: &str| case.config()[key].as_array().expect("a list").clone();
                PiecewiseConstantDecay::new(
                    list("boundaries")
                        .iter()
                        .map(|v| v.as_u64().expect("a step"))
                        .collect(),
                    list("values")
                        .iter()
                        .map(|v| v.as_f64().expect("a rate"))
                        .collect(),
                )
                .into()
            }
            "cosine" => {
                let mut s = anygpu::nn::CosineDecay::new(
                    case.f64("initial_learning_rate"),
                    case.usize("decay_steps") as u64,
                )
                .alpha(case.f64("alpha"));
                if let Some(target) = case.config()["warmup_target"].as_f64() {
                    s = s.warmup(target, case.usize("warmup_steps") as u64);
                }
                s.into()
            }
            other => panic!("{}: schedule {other}", case.name),
        };
        let (_, steps) = case.input_i32("steps");
        let got: Vec<f32> = steps.iter().map(|&s| schedule.value(s as u64)).collect();
        case.check("host", "values", &[steps.len()], &got);
    }
}
