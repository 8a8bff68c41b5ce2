//! `model.summary()`: the Keras table of layers, output shapes and parameters, with a device
//! column.

use std::fmt::Write as _;

use crate::dtype::DType;
use crate::mixed_precision::Policy;
use crate::nn::layers::count_params;
use crate::nn::sequential::Sequential;

/// One row of [`Sequential::summary`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerInfo {
    /// The layer's name in the model: `conv2d`, `separable_conv2d_1`, ...
    pub name: String,
    /// Keras' class name: `Conv2D`, ...
    pub class_name: &'static str,
    /// Output shape without the batch axis; `None` before the layer is built.
    pub output_shape: Option<Vec<usize>>,
    /// Number of weights' elements.
    pub params: usize,
    /// The device holding the layer's weights and running it: `/device:GPU:0`.
    pub device: String,
    /// The layer's dtype policy.
    pub policy: Policy,
    /// The dtype it computes in on its device: the policy's, or float32 where the device has
    /// no float16 kernels.
    pub compute_dtype: DType,
}

fn shape_str(shape: Option<&[usize]>) -> String {
    match shape {
        None => "?".to_string(),
        Some(s) => {
            let mut out = String::from("(None");
            for d in s {
                let _ = write!(out, ", {d}");
            }
            out.push(')');
            out
        }
    }
}

/// `184234` → `184,234`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl Sequential {
    /// The rows of the summary: name, class, output shape, parameters, device per layer.
    pub fn layer_infos(&self) -> Vec<LayerInfo> {
        self.entries
            .iter()
            .map(|e| LayerInfo {
                name: e.name.clone(),
                class_name: e.layer.class_name(),
                output_shape: e.output_shape.clone(),
                params: count_params(e.layer.as_ref()),
                device: e.device.name().to_string(),
                policy: e.policy,
                compute_dtype: e.policy.compute_dtype_on(&e.device),
            })
            .collect()
    }

    /// The Keras-like summary table, with a device column:
    ///
    /// ```text
    /// Model: "sequential"
    /// ________________________________________________________________________________
    ///  Layer (type)                        Output Shape          Param #   Device
    /// ================================================================================
    ///  conv2d (Conv2D)                     (None, 28, 28, 32)    320       /device:GPU:0
    ///  ...
    /// ================================================================================
    /// Total params: 184,234
    /// Trainable params: 184,234
    /// Non-trainable params: 0
    /// ________________________________________________________________________________
    /// ```
    ///
    /// ```
    /// let model = anygpu::nn::tutorial_cnn(42, &[])?;
    /// let summary = model.summary();
    /// assert!(summary.contains("separable_conv2d_1 (SeparableConv2D)"));
    /// assert!(summary.contains("Total params: 184,234"));
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// Unbuilt layers show `?` as their output shape and 0 parameters. When a layer's dtype
    /// policy is not `float32`, a `Policy` column shows each layer's, and where a device makes
    /// a layer compute in float32 regardless (no float16 kernels), says so:
    /// `mixed_float16 (float32 on CPU:0)`.
    pub fn summary(&self) -> String {
        let infos = self.layer_infos();
        let mixed = infos.iter().any(|i| i.policy != Policy::FLOAT32);
        let mut headers = vec!["Layer (type)", "Output Shape", "Param #", "Device"];
        if mixed {
            headers.push("Policy");
        }
        let rows: Vec<Vec<String>> = infos
            .into_iter()
            .map(|info| {
                let policy = if info.compute_dtype == info.policy.compute_dtype() {
                    info.policy.name().to_string()
                } else {
                    let device = info.device.trim_start_matches("/device:");
                    format!("{} (float32 on {device})", info.policy.name())
                };
                let mut row = vec![
                    format!("{} ({})", info.name, info.class_name),
                    shape_str(info.output_shape.as_deref()),
                    info.params.to_string(),
                    info.device,
                ];
                if mixed {
                    row.push(policy);
                }
                row
            })
            .collect();
        let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let gap = 3;
        let total_width = 1 + widths.iter().map(|w| w + gap).sum::<usize>();
        let line = |row: &[&str]| {
            let mut s = String::from(" ");
            for (i, (cell, &w)) in row.iter().zip(&widths).enumerate() {
                if i + 1 == row.len() {
                    s.push_str(cell);
                } else {
                    let _ = write!(s, "{cell:<width$}", width = w + gap);
                }
            }
            s.push('\n');
            s
        };
        let total = self.count_params();
        let mut out = format!("Model: \"{}\"\n", self.name);
        out.push_str(&"_".repeat(total_width));
        out.push('\n');
        out.push_str(&line(&headers));
        out.push_str(&"=".repeat(total_width));
        out.push('\n');
        for row in &rows {
            out.push_str(&line(&row.iter().map(String::as_str).collect::<Vec<_>>()));
        }
        out.push_str(&"=".repeat(total_width));
        out.push('\n');
        let frozen = self.count_non_trainable_params();
        let _ = writeln!(out, "Total params: {}", thousands(total));
        let _ = writeln!(out, "Trainable params: {}", thousands(total - frozen));
        let _ = writeln!(out, "Non-trainable params: {}", thousands(frozen));
        if let Some(strategy) = self.strategy() {
            let names: Vec<&str> = strategy.devices().iter().map(|d| d.name()).collect();
            let _ = writeln!(
                out,
                "Mirrored on {} replica(s): {}",
                names.len(),
                names.join(", ")
            );
        }
        out.push_str(&"_".repeat(total_width));
        out.push('\n');
        out
    }

    /// Prints [`summary`](Sequential::summary) to stdout (`model.summary()`).
    pub fn print_summary(&self) {
        print!("{}", self.summary());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(184_234), "184,234");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn shapes_print_with_none_for_the_batch() {
        assert_eq!(shape_str(Some(&[28, 28, 32])), "(None, 28, 28, 32)");
        assert_eq!(shape_str(Some(&[1152])), "(None, 1152)");
        assert_eq!(shape_str(None), "?");
    }
}
