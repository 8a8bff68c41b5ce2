//! `save_weights` / `load_weights` in the safetensors format: one f32 tensor per weight, named
//! `layer_name/weight_name` (`conv2d/kernel`, `separable_conv2d_1/pointwise_kernel`, ...), any
//! framework that reads safetensors can open the file.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::error::{Error, Result};
use crate::nn::sequential::Sequential;

fn model_err(path: &Path, message: String) -> Error {
    Error::Model(format!("load_weights('{}'): {message}", path.display()))
}

pub(crate) fn save(model: &Sequential, path: &Path) -> Result<()> {
    let named = model.named_weights();
    let mut blobs: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::with_capacity(named.len());
    for (name, t) in &named {
        let values = t.to_vec::<f32>()?;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        blobs.push((name.clone(), t.shape().to_vec(), bytes));
    }
    let views = blobs
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| Error::Model(format!("save_weights: '{name}': {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = HashMap::from([
        ("format".to_string(), "anygpu.nn.Sequential".to_string()),
        ("model".to_string(), model.name().to_string()),
    ]);
    let bytes = safetensors::serialize(views, Some(metadata))
        .map_err(|e| Error::Model(format!("save_weights: {e}")))?;
    std::fs::write(path, bytes).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

pub(crate) fn load(model: &mut Sequential, path: &Path) -> Result<()> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| model_err(path, format!("not a safetensors file: {e}")))?;
    let layout = model.weight_layout();
    let expected: usize = layout.iter().map(|(_, _, ws)| ws.len()).sum();
    if expected == 0 {
        return Err(model_err(
            path,
            "the model has no weights yet; build it (give the first layer an input_shape) \
             before loading"
                .into(),
        ));
    }
    // Check everything before changing anything.
    let mut staged: Vec<Vec<f32>> = Vec::new();
    for (_, _, weights) in &layout {
        for (name, shape) in weights {
            let view = file.tensor(name).map_err(|_| {
                model_err(path, format!("weight '{name}' is missing from the file"))
            })?;
            if view.dtype() != Dtype::F32 {
                return Err(model_err(
                    path,
                    format!("weight '{name}' has dtype {:?}; expected F32", view.dtype()),
                ));
            }
            if view.shape() != shape.as_slice() {
                return Err(model_err(
                    path,
                    format!(
                        "shape mismatch for weight '{name}': the file has {:?}, the model \
                         expects {shape:?}",
                        view.shape()
                    ),
                ));
            }
            let values: Vec<f32> = view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            staged.push(values);
        }
    }
    let mut extra: Vec<String> = file
        .names()
        .into_iter()
        .filter(|n| {
            !layout
                .iter()
                .any(|(_, _, ws)| ws.iter().any(|(name, _)| name == n))
        })
        .map(str::to_string)
        .collect();
    if !extra.is_empty() {
        extra.sort();
        return Err(model_err(
            path,
            format!(
                "the file has weights the model does not: {}",
                extra.join(", ")
            ),
        ));
    }
    // In place, on every replica of a mirrored model.
    model.write_weights(&staged)
}
