//! `save_weights` / `load_weights` in the safetensors format: one f32 tensor per weight, named
//! `layer_name/weight_name` (`conv2d/kernel`, `separable_conv2d_1/pointwise_kernel`, ...), any
//! framework that reads safetensors can open the file.
//!
//! This module sees names, shapes and values only, not the model: `Sequential` hands it its
//! weights and writes back what it reads.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::atomic_file::write_atomically;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

fn model_err(path: &Path, message: String) -> Error {
    Error::Model(format!("load_weights('{}'): {message}", path.display()))
}

/// One tensor of a safetensors file, little-endian bytes.
pub(crate) struct Blob {
    pub(crate) name: String,
    pub(crate) dtype: Dtype,
    pub(crate) shape: Vec<usize>,
    pub(crate) bytes: Vec<u8>,
}

impl Blob {
    /// An f32 tensor: reads `t` back from its device.
    pub(crate) fn from_tensor(name: String, t: &Tensor) -> Result<Blob> {
        let values = t.to_vec::<f32>()?;
        Ok(Blob {
            name,
            dtype: Dtype::F32,
            shape: t.shape().to_vec(),
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        })
    }

    /// A 1-D f64 series.
    pub(crate) fn f64s(name: &str, values: &[f64]) -> Blob {
        Blob {
            name: name.to_string(),
            dtype: Dtype::F64,
            shape: vec![values.len()],
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

/// The bytes of a safetensors file holding `blobs` and `metadata`; `what` names the caller in
/// errors (`save_weights`, `checkpoint`).
pub(crate) fn serialize(
    blobs: &[Blob],
    metadata: HashMap<String, String>,
    what: &str,
) -> Result<Vec<u8>> {
    let views = blobs
        .iter()
        .map(|b| {
            TensorView::new(b.dtype, b.shape.clone(), &b.bytes)
                .map(|v| (b.name.clone(), v))
                .map_err(|e| Error::Model(format!("{what}: '{}': {e}", b.name)))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize(views, Some(metadata)).map_err(|e| Error::Model(format!("{what}: {e}")))
}

/// Saves `named` weights of the model `model_name` to `path`, atomically: the old file stays
/// whole until the new one is complete on disk.
pub(crate) fn save(named: &[(String, &Tensor)], model_name: &str, path: &Path) -> Result<()> {
    save_with(named, model_name, None, path, "save_weights")
}

/// [`save`] with `extra` metadata entries (a saved model's config); `what` names the caller in
/// errors.
pub(crate) fn save_with(
    named: &[(String, &Tensor)],
    model_name: &str,
    extra: Option<(&str, String)>,
    path: &Path,
    what: &str,
) -> Result<()> {
    let blobs = named
        .iter()
        .map(|(name, t)| Blob::from_tensor(name.clone(), t))
        .collect::<Result<Vec<_>>>()?;
    let mut metadata = HashMap::from([
        ("format".to_string(), "anygpu.nn.Sequential".to_string()),
        ("model".to_string(), model_name.to_string()),
    ]);
    if let Some((key, value)) = extra {
        metadata.insert(key.to_string(), value);
    }
    write_atomically(path, &serialize(&blobs, metadata, what)?)
}

/// The f32 values of `name`, checked against `shape`; `err` words the complaint.
pub(crate) fn f32_tensor(
    file: &SafeTensors<'_>,
    name: &str,
    shape: &[usize],
    err: impl Fn(String) -> Error,
) -> Result<Vec<f32>> {
    let view = file
        .tensor(name)
        .map_err(|_| err(format!("weight '{name}' is missing from the file")))?;
    if view.dtype() != Dtype::F32 {
        return Err(err(format!(
            "weight '{name}' has dtype {:?}; expected F32",
            view.dtype()
        )));
    }
    if view.shape() != shape {
        return Err(err(format!(
            "shape mismatch for weight '{name}': the file has {:?}, the model expects {shape:?}",
            view.shape()
        )));
    }
    Ok(view
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// The bytes of the file at `path`.
pub(crate) fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The values for `layout` (every weight's name and shape, in model order) from the file at
/// `path`, all checked before any is returned: missing, extra, mistyped or misshapen weights
/// are errors.
pub(crate) fn load(path: &Path, layout: &[(String, Vec<usize>)]) -> Result<Vec<Vec<f32>>> {
    let bytes = read(path)?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| model_err(path, format!("not a safetensors file: {e}")))?;
    if layout.is_empty() {
        return Err(model_err(
            path,
            "the model has no weights yet; build it (give the first layer an input_shape) \
             before loading"
                .into(),
        ));
    }
    stage(&file, layout, |m| model_err(path, m))
}

/// The values for `layout` from an opened file, all checked before any is returned; `err`
/// words the complaint.
pub(crate) fn stage(
    file: &SafeTensors<'_>,
    layout: &[(String, Vec<usize>)],
    err: impl Fn(String) -> Error,
) -> Result<Vec<Vec<f32>>> {
    // Check everything before changing anything.
    let staged = layout
        .iter()
        .map(|(name, shape)| f32_tensor(file, name, shape, &err))
        .collect::<Result<Vec<_>>>()?;
    let mut extra: Vec<String> = file
        .names()
        .into_iter()
        .filter(|n| !layout.iter().any(|(name, _)| name == n))
        .map(str::to_string)
        .collect();
    if !extra.is_empty() {
        extra.sort();
        return Err(err(format!(
            "the file has weights the model does not: {}",
            extra.join(", ")
        )));
    }
    Ok(staged)
}
