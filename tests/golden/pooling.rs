//! Pooling layers against TensorFlow: AveragePooling2D and MaxPooling2D over several shapes,
//! windows, strides and paddings, GlobalAveragePooling2D and GlobalMaxPooling2D (forward and
//! input gradient).

use anygpu::nn::{AveragePooling2D, GlobalAveragePooling2D, GlobalMaxPooling2D, Layer, MaxPool2D};

use crate::common::golden::{Case, Golden};
use crate::{check_layer, devices, padding, runtime};

fn pair(case: &Case<'_>, key: &str) -> (usize, usize) {
    let v = case.config()[key].as_array().expect("a pair");
    let at = |i: usize| v[i].as_u64().expect("an integer") as usize;
    (at(0), at(1))
}

#[test]
fn golden_pooling_layers() {
    let rt = runtime();
    let golden = Golden::load("pooling");
    for dev in devices(&rt, "golden_pooling_layers") {
        for case in golden.cases() {
            let layer: Box<dyn Layer> = match case.name {
                n if n.starts_with("average_pooling2d") => Box::new(
                    AveragePooling2D::new(pair(&case, "pool_size"))
                        .strides(pair(&case, "strides"))
                        .padding(padding(&case)),
                ),
                n if n.starts_with("max_pooling2d") => Box::new(
                    MaxPool2D::new()
                        .pool_size(pair(&case, "pool_size"))
                        .strides(pair(&case, "strides"))
                        .padding(padding(&case)),
                ),
                n if n.starts_with("global_avg") => Box::new(GlobalAveragePooling2D::new()),
                n if n.starts_with("global_max") => Box::new(GlobalMaxPooling2D::new()),
                other => panic!("golden pooling: no layer for case {other}"),
            };
            check_layer(&case, layer, &[], &dev);
        }
    }
}
