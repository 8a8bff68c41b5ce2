//! BatchNormalization against TensorFlow: one training call (output, input and weight
//! gradients, the moving statistics after it) and inference from given moving statistics.

use anygpu::nn::{BatchNormalization, Layer};

use crate::common::golden::{Case, Golden};
use crate::{devices, read, runtime, upload};

fn flag(case: &Case<'_>, key: &str) -> bool {
    case.usize(key) != 0
}

#[test]
fn golden_batch_normalization() {
    let rt = runtime();
    let golden = Golden::load("normalization");
    for dev in devices(&rt, "golden_batch_normalization") {
        let name = dev.to_string();
        for case in golden.cases() {
            let (center, scale) = (flag(&case, "center"), flag(&case, "scale"));
            let mut layer = BatchNormalization::new()
                .momentum(case.f64("momentum") as f32)
                .epsilon(case.f64("epsilon") as f32)
                .center(center)
                .scale(scale);
            let x = upload(&case, "x", &dev);
            layer.build(&x.shape()[1..], 7, &dev).expect("build");
            let trainable: Vec<&str> = [("gamma", scale), ("beta", center)]
                .into_iter()
                .filter_map(|(k, on)| on.then_some(k))
                .collect();
            for (i, key) in trainable.iter().enumerate() {
                layer.set_weight(i, upload(&case, key, &dev)).expect("set");
            }
            for (i, key) in ["moving_mean", "moving_variance"].iter().enumerate() {
                layer
                    .set_non_trainable_weight(i, upload(&case, key, &dev))
                    .expect("set moving statistics");
            }
            let training = flag(&case, "training");
            let (y, saved) = layer.call(&x, training).expect("call");
            case.check(&name, "y", y.shape(), &read(&y));
            if training {
                let dy = upload(&case, "dy", &dev);
                let (dx, grads) = layer.backward(&saved, &dy, true).expect("backward");
                let dx = dx.expect("dx was asked for");
                case.check(&name, "dx", dx.shape(), &read(&dx));
                assert_eq!(grads.len(), trainable.len(), "{}: gradients", case.name);
                for (key, g) in trainable.iter().zip(&grads) {
                    case.check(&name, &format!("d{key}"), g.shape(), &read(g));
                }
            } else {
                assert!(saved.is_empty(), "{}: inference keeps nothing", case.name);
            }
            for (key, t) in layer.non_trainable_weights() {
                case.check(&name, &format!("{key}_after"), t.shape(), &read(t));
            }
        }
    }
}
