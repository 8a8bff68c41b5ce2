//! A whole model against Keras (`scripts/golden/models.py`): the modern CNN's blocks, scaled
//! down, through one training pass: the loss, every trainable weight's gradient, and the
//! BatchNormalization layers' moving statistics after it, on every device. Each layer has its
//! own cases; this one checks how they compose.

use anygpu::nn::{
    Activation, BatchNormalization, Conv2D, Dense, GlobalAveragePooling2D, Layer, Loss, ReLU,
    Sequential, Sgd,
};
use anygpu::ops::spec::Padding;
use anygpu::Tensor;

use crate::common::golden::Golden;
use crate::{devices, read, runtime, upload};

/// The case's model: three Conv2D (no bias; 16, 16 and 8 filters, the last at strides 2)
/// each followed by BatchNormalization and ReLU, then global average pooling and a softmax
/// Dense(3).
fn modern_blocks(dev: &anygpu::LogicalDevice) -> Sequential {
    let mut model = Sequential::with_seed(1);
    let conv = |filters: usize, strides: usize| {
        Conv2D::new(filters, 3)
            .strides(strides)
            .padding(Padding::Same)
            .use_bias(false)
    };
    let mut layers: Vec<Box<dyn Layer>> = Vec::new();
    for (i, (filters, strides)) in [(16, 1), (16, 1), (8, 2)].into_iter().enumerate() {
        let conv = conv(filters, strides);
        layers.push(match i {
            0 => Box::new(conv.input_shape(&[6, 6, 2])),
            _ => Box::new(conv),
        });
        layers.push(Box::new(BatchNormalization::new()));
        layers.push(Box::new(ReLU::new()));
    }
    layers.push(Box::new(GlobalAveragePooling2D::new()));
    layers.push(Box::new(Dense::new(3).activation(Activation::Softmax)));
    for layer in layers {
        model.add_boxed(dev, layer).expect("add");
    }
    model
        .compile(Loss::sparse_categorical_crossentropy(), Sgd::default(), &[])
        .expect("compile");
    model
}

#[test]
fn golden_modern_cnn_blocks_loss_and_gradients() {
    let rt = runtime();
    let golden = Golden::load("models");
    let case = golden.case("modern_blocks");
    for dev in devices(&rt, "golden_modern_cnn_blocks_loss_and_gradients") {
        let mut model = modern_blocks(&dev);
        let count = model.weights().len();
        let weights: Vec<Vec<f32>> = (0..count).map(|i| case.input(&format!("w{i}")).1).collect();
        model.set_weights(&weights).expect("set_weights");
        let x = upload(&case, "x", &dev);
        let (shape, y) = case.input_i32("y");
        let y = Tensor::from_slice_on(&y, &shape, &dev).expect("labels");
        let (loss, grads) = model
            .loss_and_gradients(&x, &y)
            .expect("loss_and_gradients");
        let name = dev.to_string();
        case.check(&name, "loss", &[1], &[loss]);
        assert_eq!(grads.len(), model.trainable_weights().len());
        for (i, g) in grads.iter().enumerate() {
            case.check(&name, &format!("d{i}"), g.shape(), &read(g));
        }
        // The moving statistics, updated by the training pass (weights 3, 4, 8, 9, 13, 14).
        let after = model.get_weights().expect("get_weights");
        for key in case
            .outputs()
            .into_iter()
            .filter(|k| k.starts_with("after"))
        {
            let i: usize = key["after".len()..].parse().expect("a weight index");
            case.check(&name, &key, &[after[i].len()], &after[i]);
        }
    }
}
