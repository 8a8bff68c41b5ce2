//! The two models `--model` picks: the guide's CNN (`tutorial`, the library's
//! [`nn::tutorial_cnn`]) and a small modern one (`modern`): Conv-BN-ReLU blocks that halve the
//! image with strided convolutions, global average pooling, Dropout, trained by AdamW with a
//! warm-up and cosine decay, and stopped early on `val_loss` with the best weights restored —
//! the model docs/models.md shows, at Fashion-MNIST's size.

use anygpu::nn::{
    self, Activation, BatchNormalization, Conv2D, CosineDecay, Dense, Dropout, EarlyStopping,
    GlobalAveragePooling2D, Layer, Loss, Metric, Optimizer, ReLU, Sequential,
};
use anygpu::ops::spec::Padding;
use anygpu::LogicalDevice;

use crate::args::{Args, Model};

/// The model `--model` names, on `devices` (the three blocks on three devices with `--split`;
/// none: the current scope, a strategy's under one), compiled with the tutorial's loss and
/// metric.
pub fn build(
    args: &Args,
    devices: &[LogicalDevice],
    optimizer: Optimizer,
) -> anygpu::Result<Sequential> {
    let mut model = match args.model {
        Model::Tutorial => nn::tutorial_cnn(args.seed, devices)?,
        Model::Modern => modern_cnn(args.seed, devices)?,
    };
    let loss = Loss::sparse_categorical_crossentropy();
    model.compile(loss, optimizer, &[Metric::Accuracy])?;
    Ok(model)
}

/// The modern CNN: 28×28 → 14×14 → 7×7 in three blocks (block `i` on `devices[i]`, wrapping).
///
/// ```text
/// block 0: Conv2D(32) BN ReLU, Conv2D(32, strides 2) BN ReLU      28×28 → 14×14
/// block 1: Conv2D(64) BN ReLU, Conv2D(64, strides 2) BN ReLU      14×14 → 7×7
/// block 2: Conv2D(128) BN ReLU, GlobalAveragePooling2D, Dropout(0.3), Dense(10, softmax)
/// ```
///
/// Strided convolutions rather than pooling: on CPU:0 they cost less than a full-size
/// convolution followed by `MaxPool2D`, and trained to a better accuracy in the same steps.
pub fn modern_cnn(seed: u64, devices: &[LogicalDevice]) -> anygpu::Result<Sequential> {
    let mut model = Sequential::with_seed(seed);
    let stages = [(0, 32, 1), (0, 32, 2), (1, 64, 1), (1, 64, 2), (2, 128, 1)];
    for (i, (block, filters, strides)) in stages.into_iter().enumerate() {
        // No bias: the BatchNormalization after it has one (its beta).
        let conv = Conv2D::new(filters, 3)
            .strides(strides)
            .padding(Padding::Same)
            .use_bias(false);
        let conv = match i {
            0 => conv.input_shape(&[28, 28, 1]),
            _ => conv,
        };
        add(&mut model, devices, block, conv)?;
        add(&mut model, devices, block, BatchNormalization::new())?;
        add(&mut model, devices, block, ReLU::new())?;
    }
    add(&mut model, devices, 2, GlobalAveragePooling2D::new())?;
    add(&mut model, devices, 2, Dropout::new(0.3).seed(seed))?;
    let head = Dense::new(10).activation(Activation::Softmax);
    add(&mut model, devices, 2, head)?;
    Ok(model)
}

/// Adds `layer` on block `block`'s device, or in the current scope without devices.
fn add(
    model: &mut Sequential,
    devices: &[LogicalDevice],
    block: usize,
    layer: impl Layer + 'static,
) -> anygpu::Result<()> {
    match devices.len() {
        0 => model.add(layer),
        n => model.add_on(&devices[block % n], layer),
    }
}

/// The modern model's learning rate: a linear warm-up from 0 to `peak` over the first tenth
/// of the run's `total_steps`, then a cosine decay to 0 over the rest.
pub fn cosine_decay(peak: f32, total_steps: u64) -> CosineDecay {
    let warmup = total_steps / 10;
    CosineDecay::new(0.0, (total_steps - warmup).max(1)).warmup(peak.into(), warmup)
}

/// The modern model's `EarlyStopping(monitor="val_loss", patience=3,
/// restore_best_weights=True)`; none for the tutorial's, which trains its epochs as the guide
/// does.
pub fn early_stopping(args: &Args) -> Option<EarlyStopping> {
    let early = EarlyStopping::new("val_loss")
        .patience(3)
        .restore_best_weights(true);
    (args.model == Model::Modern).then_some(early)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anygpu::data::Dataset;
    use anygpu::nn::{Callback, Verbosity};
    use clap::Parser;

    fn args(flags: &[&str]) -> Args {
        Args::parse_from([&["fashion_mnist"], flags].concat())
    }

    /// `--model modern` end to end on CPU:0 in a second: built, compiled with AdamW and its
    /// schedule, two epochs of `fit` with validation and EarlyStopping, then evaluated.
    #[test]
    fn the_modern_model_trains_with_its_schedule_and_early_stopping() {
        let _cpu = anygpu::with_device("/cpu:0").unwrap();
        let args = args(&["--model", "modern", "--epochs", "2"]);
        let optimizer = args.optimizer(2);
        assert_eq!(optimizer.name(), "AdamW");
        assert!(optimizer.options().schedule.is_some());
        let mut model = build(&args, &[], optimizer).unwrap();
        assert_eq!(model.count_params(), 141_098);
        model.set_verbose(Verbosity::Silent);
        let n: usize = 16;
        let x: Vec<f32> = (0..n * 784)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let y: Vec<i32> = (0..n as i32).map(|i| i % 10).collect();
        let data = Dataset::from_tensor_slices(x, &[28, 28, 1], y)
            .unwrap()
            .batch(8, false);
        let mut early = early_stopping(&args).expect("the modern model stops early");
        let callbacks: &mut [&mut dyn Callback] = &mut [&mut early];
        let history = model
            .fit_with_callbacks(&data, args.epochs(), Some(2), Some(&data), callbacks)
            .unwrap();
        assert_eq!(history.epochs(), 2);
        assert!(history.loss.iter().all(|l| l.is_finite()));
        let test = model.evaluate(&data, None).unwrap();
        assert!(test.loss.is_finite());
    }

    #[test]
    fn the_tutorial_keeps_its_optimizer_and_epochs_and_stops_nowhere() {
        let tutorial = args(&[]);
        assert_eq!(tutorial.epochs(), 10);
        let sgd = tutorial.optimizer(429);
        assert_eq!((sgd.name(), sgd.learning_rate()), ("SGD", 0.01));
        assert!(sgd.options().schedule.is_none());
        assert!(early_stopping(&tutorial).is_none());
        let modern = args(&[
            "--model",
            "modern",
            "--optimizer",
            "momentum",
            "--lr",
            "0.1",
        ]);
        assert_eq!(modern.epochs(), 12);
        let schedule = modern.optimizer(100).options().schedule.clone();
        // The warm-up starts at 0 and peaks at --lr after a tenth of the 1,200 steps.
        let schedule = schedule.expect("the modern model's schedule");
        assert_eq!((schedule.value(0), schedule.value(120)), (0.0, 0.1));
    }
}
