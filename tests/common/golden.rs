//! TensorFlow's own numbers (`tests/golden/data/*.safetensors`, written by `scripts/tf_golden.py`):
//! inputs in float32, TF's float64 outputs, and how far TF's float32 outputs are from those
//! (`noise`), which sets each comparison's tolerance.

use std::collections::BTreeMap;
use std::path::PathBuf;

use safetensors::tensor::{Dtype, SafeTensors};
use serde_json::Value;

/// One family's file: every case of `scripts/golden/<family>.py`.
pub struct Golden {
    family: String,
    bytes: Vec<u8>,
    cases: BTreeMap<String, Value>,
}

/// One case of a family: its config, its inputs and TF's outputs.
pub struct Case<'a> {
    pub name: &'a str,
    golden: &'a Golden,
    entry: &'a Value,
}

impl Golden {
    /// Reads `tests/golden/<family>.safetensors`.
    pub fn load(family: &str) -> Golden {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden/data")
            .join(format!("{family}.safetensors"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (python3 scripts/tf_golden.py {family} writes it)",
                path.display()
            )
        });
        let (_, meta) = SafeTensors::read_metadata(&bytes).expect("a safetensors header");
        let text = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get("cases"))
            .expect("metadata 'cases'")
            .clone();
        let cases = serde_json::from_str(&text).expect("'cases' is JSON");
        Golden {
            family: family.to_string(),
            bytes,
            cases,
        }
    }

    /// Every case, in name order.
    pub fn cases(&self) -> Vec<Case<'_>> {
        self.cases
            .iter()
            .map(|(name, entry)| Case {
                name,
                golden: self,
                entry,
            })
            .collect()
    }

    /// The case `name`; panics naming the family when there is none.
    pub fn case(&self, name: &str) -> Case<'_> {
        let (name, entry) = self
            .cases
            .get_key_value(name)
            .unwrap_or_else(|| panic!("golden {}: no case {name}", self.family));
        Case {
            name,
            golden: self,
            entry,
        }
    }
}

impl Case<'_> {
    /// The case's config (the Keras arguments, as the generator wrote them).
    pub fn config(&self) -> &Value {
        &self.entry["config"]
    }

    /// A config string, e.g. `padding`.
    pub fn str(&self, key: &str) -> &str {
        self.config()[key]
            .as_str()
            .unwrap_or_else(|| panic!("{}: config {key} is not a string", self.name))
    }

    /// A config integer, e.g. `filters`.
    pub fn usize(&self, key: &str) -> usize {
        self.config()[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{}: config {key} is not an integer", self.name))
            as usize
    }

    /// A config number.
    pub fn f64(&self, key: &str) -> f64 {
        self.config()[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{}: config {key} is not a number", self.name))
    }

    /// Whether the case has tensor `key` (an input or an output).
    pub fn has(&self, key: &str) -> bool {
        let tensors = SafeTensors::deserialize(&self.golden.bytes).expect("safetensors");
        tensors.tensor(&format!("{}/{key}", self.name)).is_ok()
    }

    /// The names of TF's outputs, in the generator's order.
    pub fn outputs(&self) -> Vec<String> {
        self.entry["outputs"]
            .as_array()
            .expect("outputs")
            .iter()
            .map(|v| v.as_str().expect("a name").to_string())
            .collect()
    }

    fn raw(&self, key: &str) -> (Vec<usize>, Dtype, Vec<u8>) {
        let tensors = SafeTensors::deserialize(&self.golden.bytes).expect("safetensors");
        let view = tensors
            .tensor(&format!("{}/{key}", self.name))
            .unwrap_or_else(|e| panic!("golden {}/{}: {key}: {e}", self.golden.family, self.name));
        (view.shape().to_vec(), view.dtype(), view.data().to_vec())
    }

    /// An input tensor (float32), with its shape.
    pub fn input(&self, key: &str) -> (Vec<usize>, Vec<f32>) {
        let (shape, dtype, data) = self.raw(key);
        assert_eq!(dtype, Dtype::F32, "{}/{key}: inputs are float32", self.name);
        let values = data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        (shape, values)
    }

    /// An integer input (labels), with its shape.
    pub fn input_i32(&self, key: &str) -> (Vec<usize>, Vec<i32>) {
        let (shape, dtype, data) = self.raw(key);
        assert_eq!(dtype, Dtype::I32, "{}/{key}: not int32", self.name);
        let values = data
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        (shape, values)
    }

    /// TF's float64 output `key`, with its shape.
    pub fn output(&self, key: &str) -> (Vec<usize>, Vec<f64>) {
        let (shape, dtype, data) = self.raw(key);
        assert_eq!(
            dtype,
            Dtype::F64,
            "{}/{key}: outputs are float64",
            self.name
        );
        let values = data
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        (shape, values)
    }

    /// How far TF's float32 result for `key` is from its float64 one (max absolute).
    pub fn noise(&self, key: &str) -> f64 {
        self.entry["noise"][key].as_f64().unwrap_or(0.0)
    }

    /// Checks `got` (on `device`) against TF's output `key`, shape included.
    ///
    /// Tolerance: `1e-4 |want|` relative, plus an absolute floor of eight times TF's own
    /// float32 noise on this tensor; for gradients (`d...`), at least `1e-4` of the tensor's
    /// largest entry (sums over a batch cancel), for outputs `1e-6` of it.
    pub fn check(&self, device: &str, key: &str, shape: &[usize], got: &[f32]) {
        let (want_shape, want) = self.output(key);
        let what = format!(
            "golden {}/{}: {key} on {device}",
            self.golden.family, self.name
        );
        assert_eq!(shape, &want_shape[..], "{what}: shape");
        assert_eq!(got.len(), want.len(), "{what}: length");
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let relative_floor = if key.starts_with('d') { 1e-4 } else { 1e-6 };
        let floor = (8.0 * self.noise(key))
            .max(relative_floor * scale)
            .max(1e-7);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let err = (f64::from(g) - w).abs();
            assert!(
                err <= 1e-4 * w.abs() + floor,
                "{what}[{i}]: {g} vs TensorFlow's {w} (error {err:e}, allowed {:e})",
                1e-4 * w.abs() + floor
            );
        }
    }
}
