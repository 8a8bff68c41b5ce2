//! The GPU kernels as the device layer knows them: one [`ShaderFamily`] per WGSL file of
//! `shaders/`, validated by naga against an adapter's capabilities, compiled once per adapter
//! into a [`PipelineCache`], with float16 twins generated from the float32 source (`half`), and
//! the autotuner that picks among a family's kernel variants (`tune`). The functions that bind
//! tensors and dispatch these kernels are the ops' (`ops::gpu`).
//!
//! Binding convention shared by every shader: `@group(0) @binding(0)` is a uniform `Params`
//! struct (at most 256 bytes), `@binding(1..)` are tensors as `var<storage, read_write>` arrays.
//! Everything is read-write because two tensors of one dispatch may be ranges of one arena
//! buffer, and wgpu rejects a buffer bound read-only and read-write in the same dispatch.

pub(crate) mod coop;
pub(crate) mod half;
pub(crate) mod pipelines;
pub(crate) mod tune;

use std::borrow::Cow;
use std::collections::HashMap;

pub(crate) use pipelines::{Pipeline, PipelineCache};

/// One WGSL file: a family of kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ShaderFamily {
    /// Element-wise maps, binary ops with broadcasting, fills, activations.
    Elementwise,
    /// Matrix products with fused bias and activation.
    Matmul,
    /// Sums, column sums, argmax.
    Reduce,
    /// Column sums with subgroup operations (adapters with subgroups only).
    ReduceSubgroup,
    /// Direct 2-D convolution and its gradients.
    Conv2d,
    /// Depthwise convolution and its gradients.
    Depthwise,
    /// 2×2 max-pool and its gradient.
    Pool,
    /// Softmax, fused softmax cross-entropy, accuracy.
    Softmax,
    /// Losses on float targets, metrics beyond accuracy, sigmoid (`loss.wgsl`).
    Loss,
    /// SGD, momentum, Adam updates in place.
    Optim,
    /// Casts between float32 and float16 (adapters with f16 only).
    Cast,
    /// Batch normalization: moments, normalization, gradients.
    Batchnorm,
    /// Dropout's counter-based mask.
    Dropout,
    // ---- activations and pooling layers ----
    /// The activations with their own kernel, forward and backward.
    Activation,
    /// Average pooling (any window, strides, padding) and the global poolings.
    Pooling,
    /// Strided, dilated and grouped 2-D convolutions and their gradients.
    Conv2dGeneral,
    /// Matrix products on cooperative matrices (tensor cores): float16 in, float32 accumulation
    /// (adapters with a 16×16×16 configuration only).
    MatmulCoop,
}

impl ShaderFamily {
    /// Every family (validation tests; the tuner hashes their sources).
    pub(crate) const ALL: [ShaderFamily; 17] = [
        ShaderFamily::Elementwise,
        ShaderFamily::Matmul,
        ShaderFamily::Reduce,
        ShaderFamily::ReduceSubgroup,
        ShaderFamily::Conv2d,
        ShaderFamily::Depthwise,
        ShaderFamily::Pool,
        ShaderFamily::Softmax,
        ShaderFamily::Optim,
        ShaderFamily::Cast,
        ShaderFamily::Batchnorm,
        ShaderFamily::Dropout,
        ShaderFamily::Activation,
        ShaderFamily::Pooling,
        ShaderFamily::Conv2dGeneral,
        ShaderFamily::Loss,
        ShaderFamily::MatmulCoop,
    ];

    /// The file under `shaders/`.
    pub(crate) fn file(self) -> &'static str {
        match self {
            ShaderFamily::Elementwise => "elementwise.wgsl",
            ShaderFamily::Matmul => "matmul.wgsl",
            ShaderFamily::Reduce => "reduce.wgsl",
            ShaderFamily::ReduceSubgroup => "reduce_subgroup.wgsl",
            ShaderFamily::Conv2d => "conv2d.wgsl",
            ShaderFamily::Depthwise => "depthwise.wgsl",
            ShaderFamily::Pool => "pool.wgsl",
            ShaderFamily::Softmax => "softmax.wgsl",
            ShaderFamily::Optim => "optim.wgsl",
            ShaderFamily::Cast => "cast.wgsl",
            ShaderFamily::Batchnorm => "batchnorm.wgsl",
            ShaderFamily::Dropout => "dropout.wgsl",
            ShaderFamily::Activation => "activation.wgsl",
            ShaderFamily::Pooling => "pooling.wgsl",
            ShaderFamily::Conv2dGeneral => "conv2d_general.wgsl",
            ShaderFamily::Loss => "loss.wgsl",
            ShaderFamily::MatmulCoop => "matmul_coop.wgsl",
        }
    }

    /// Whether the family has a float16 twin: every family but the optimizers (float32 master
    /// weights), the loss (computed in float32), the casts (both types already) and the
    /// cooperative-matrix products (written in float16).
    pub(crate) fn has_half_twin(self) -> bool {
        !matches!(
            self,
            ShaderFamily::Optim
                | ShaderFamily::Softmax
                | ShaderFamily::Cast
                | ShaderFamily::Loss
                | ShaderFamily::MatmulCoop
        )
    }

    /// The tensors that stay float32 in the family's float16 twin: the outputs of sums (column
    /// sums, kernel gradients), whose partials between passes would lose precision in float16.
    /// The kernels bind float32 tensors there and cast the final sum (see
    /// `GpuKernels::float32_sums`).
    pub(crate) fn kept_f32(self) -> &'static [&'static str] {
        match self {
            ShaderFamily::Reduce => &["out", "out4"],
            ShaderFamily::ReduceSubgroup => &["out4"],
            ShaderFamily::Conv2d | ShaderFamily::Depthwise => &["dk", "dk4"],
            ShaderFamily::Pool => &["sums4"],
            ShaderFamily::Matmul => &["part", "part4"],
            // Keras computes batch normalization in float32 for float16 inputs: only the
            // activations and their gradients are float16.
            ShaderFamily::Batchnorm => &[
                "partials",
                "sums",
                "sq",
                "gamma",
                "beta",
                "moving_mean",
                "moving_var",
                "stats",
                "coef",
                "dgamma",
                "dbeta",
                "affine",
            ],
            ShaderFamily::Conv2dGeneral => &["dk"],
            _ => &[],
        }
    }

    /// The WGSL source of the family, or of its float16 twin.
    pub(crate) fn source_in(self, half: bool) -> std::result::Result<Cow<'static, str>, String> {
        if half && self.has_half_twin() {
            half::f16_source(self.file(), self.source(), self.kept_f32()).map(Cow::Owned)
        } else {
            Ok(Cow::Borrowed(self.source()))
        }
    }

    /// The WGSL source, compiled into the crate.
    pub(crate) fn source(self) -> &'static str {
        match self {
            ShaderFamily::Elementwise => include_str!("../../shaders/elementwise.wgsl"),
            ShaderFamily::Matmul => include_str!("../../shaders/matmul.wgsl"),
            ShaderFamily::Reduce => include_str!("../../shaders/reduce.wgsl"),
            ShaderFamily::ReduceSubgroup => include_str!("../../shaders/reduce_subgroup.wgsl"),
            ShaderFamily::Conv2d => include_str!("../../shaders/conv2d.wgsl"),
            ShaderFamily::Depthwise => include_str!("../../shaders/depthwise.wgsl"),
            ShaderFamily::Pool => include_str!("../../shaders/pool.wgsl"),
            ShaderFamily::Softmax => include_str!("../../shaders/softmax.wgsl"),
            ShaderFamily::Optim => include_str!("../../shaders/optim.wgsl"),
            ShaderFamily::Cast => include_str!("../../shaders/cast.wgsl"),
            ShaderFamily::Batchnorm => include_str!("../../shaders/batchnorm.wgsl"),
            ShaderFamily::Dropout => include_str!("../../shaders/dropout.wgsl"),
            ShaderFamily::Activation => include_str!("../../shaders/activation.wgsl"),
            ShaderFamily::Pooling => include_str!("../../shaders/pooling.wgsl"),
            ShaderFamily::Conv2dGeneral => include_str!("../../shaders/conv2d_general.wgsl"),
            ShaderFamily::Loss => include_str!("../../shaders/loss.wgsl"),
            ShaderFamily::MatmulCoop => include_str!("../../shaders/matmul_coop.wgsl"),
        }
    }
}

/// A kernel: an entry point of a family, over float32 tensors or, `half`, float16 ones (the
/// family's float16 twin, see [`half`]). Which tensor bindings it takes is read from the shader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Kernel {
    pub(crate) family: ShaderFamily,
    pub(crate) entry: &'static str,
    pub(crate) half: bool,
}

impl Kernel {
    pub(crate) const fn new(family: ShaderFamily, entry: &'static str) -> Kernel {
        Kernel {
            family,
            entry,
            half: false,
        }
    }

    /// The same entry point over float16 tensors (the casts take both types as they are).
    pub(crate) fn with_half(self, half: bool) -> Kernel {
        Kernel {
            half: half && self.family.has_half_twin(),
            ..self
        }
    }
}

/// The naga capabilities an adapter's features give.
pub(crate) fn capabilities_of(features: wgpu::Features) -> naga::valid::Capabilities {
    use naga::valid::Capabilities as C;
    let mut caps = C::empty();
    if features.contains(wgpu::Features::SHADER_F16) {
        caps |= C::SHADER_FLOAT16;
    }
    if features.contains(wgpu::Features::SUBGROUP) {
        caps |= C::SUBGROUP;
    }
    if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        caps |= C::COOPERATIVE_MATRIX;
    }
    caps
}

/// What validation learns about an entry point.
#[derive(Clone, Debug)]
pub(crate) struct EntryInfo {
    pub(crate) workgroup_size: [u32; 3],
    /// Bindings (group 0) the entry point uses besides the params, ascending: storage
    /// buffers, and the uniform windows listed in `uniform`.
    pub(crate) bindings: Vec<u32>,
    /// The bindings that are uniform buffers (a window of a tensor read at constant offsets).
    pub(crate) uniform: Vec<u32>,
}

/// A family's shader after validation.
pub(crate) struct Validated {
    pub(crate) entries: HashMap<String, EntryInfo>,
    /// Bytes of workgroup memory the module declares.
    pub(crate) workgroup_bytes: u64,
}

/// Parses and validates a family's WGSL with `capabilities`, and reads each entry point's
/// workgroup size and bindings. `Err` says what the shader needs that is missing.
#[cfg(test)]
pub(crate) fn validate(
    family: ShaderFamily,
    capabilities: naga::valid::Capabilities,
) -> std::result::Result<Validated, String> {
    validate_source(family.file(), family.source(), capabilities)
}

/// [`validate`] for any WGSL source; `file` names it in messages.
pub(crate) fn validate_source(
    file: &str,
    source: &str,
    capabilities: naga::valid::Capabilities,
) -> std::result::Result<Validated, String> {
    let module = naga::front::wgsl::parse_str(source)
        .map_err(|e| format!("{file}: {}", e.emit_to_string(source)))?;
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), capabilities)
        .validate(&module)
        .map_err(|e| format!("{file} needs what the adapter lacks: {}", e.as_inner()))?;
    let entries = module
        .entry_points
        .iter()
        .enumerate()
        .map(|(i, ep)| {
            let uses = info.get_entry_point(i);
            let used = |uniform: bool| -> Vec<u32> {
                let mut bindings: Vec<u32> = module
                    .global_variables
                    .iter()
                    .filter(|(h, g)| {
                        let wanted = if uniform {
                            g.space == naga::AddressSpace::Uniform
                        } else {
                            matches!(g.space, naga::AddressSpace::Storage { .. })
                        };
                        wanted && !uses[*h].is_empty()
                    })
                    .filter_map(|(_, g)| g.binding.as_ref().map(|b| b.binding))
                    // Binding 0 is every kernel's params.
                    .filter(|&b| b != 0)
                    .collect();
                bindings.sort_unstable();
                bindings
            };
            let storage = used(false);
            let uniform = used(true);
            let mut bindings = [&storage[..], &uniform[..]].concat();
            bindings.sort_unstable();
            let entry = EntryInfo {
                workgroup_size: ep.workgroup_size,
                bindings,
                uniform,
            };
            (ep.name.clone(), entry)
        })
        .collect();
    let mut layouter = naga::proc::Layouter::default();
    layouter
        .update(module.to_ctx())
        .map_err(|e| format!("{file}: {e}"))?;
    let workgroup_bytes = module
        .global_variables
        .iter()
        .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
        .map(|(_, g)| u64::from(layouter[g.ty].size))
        .sum();
    Ok(Validated {
        entries,
        workgroup_bytes,
    })
}

/// The most workgroups a dispatch may have along one dimension (WebGPU's
/// `maxComputeWorkgroupsPerDimension` default, which every adapter offers).
pub(crate) const MAX_GROUPS_PER_DIM: usize = 65_535;

/// Rows per chunk of a kernel that takes a chunk of rows per workgroup row (grid `y`): at least
/// `chunk`, and enough that the chunks fit in one grid dimension.
pub(crate) fn row_chunk(rows: usize, chunk: usize) -> usize {
    chunk.max(rows.div_ceil(MAX_GROUPS_PER_DIM))
}

/// Workgroups for `n` invocations of a 1-D kernel with `workgroup` invocations each, folded into
/// two dimensions past the 65,535 per-dimension limit. Shaders recover the flat index as
/// `gid.x + gid.y * num_workgroups.x * workgroup`.
pub(crate) fn grid_1d(n: usize, workgroup: u32) -> [u32; 3] {
    let groups = n.div_ceil(workgroup as usize).max(1) as u64;
    const MAX: u64 = MAX_GROUPS_PER_DIM as u64;
    if groups <= MAX {
        [groups as u32, 1, 1]
    } else {
        [MAX as u32, groups.div_ceil(MAX) as u32, 1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use naga::valid::Capabilities;

    #[test]
    fn every_shader_parses_and_validates_without_optional_capabilities() {
        // Without f16 or subgroups: what llvmpipe's GL backend offers, so every kernel runs on
        // every adapter; the subgroup family (optional candidates only) with subgroups, the
        // casts (mixed precision only) with f16 and the tensor-core products with f16, subgroups
        // and cooperative matrices, each refused without.
        for family in ShaderFamily::ALL {
            let needs = match family {
                ShaderFamily::ReduceSubgroup => wgpu::Features::SUBGROUP,
                ShaderFamily::Cast => wgpu::Features::SHADER_F16,
                ShaderFamily::MatmulCoop => coop::NEEDS,
                _ => wgpu::Features::empty(),
            };
            if !needs.is_empty() {
                let refused = validate(family, Capabilities::empty()).err();
                assert!(
                    refused.is_some(),
                    "{} validates without {needs:?}",
                    family.file()
                );
            }
            let caps = capabilities_of(needs);
            let v = validate(family, caps).unwrap_or_else(|e| panic!("{}: {e}", family.file()));
            for (entry, info) in &v.entries {
                let invocations: u32 = info.workgroup_size.iter().product();
                assert!(
                    invocations <= 256,
                    "{}::{entry} uses {invocations} invocations",
                    family.file()
                );
            }
            assert!(
                v.workgroup_bytes <= 16 << 10,
                "{} needs {} B of workgroup memory",
                family.file(),
                v.workgroup_bytes
            );
        }
    }

    #[test]
    fn a_shader_that_needs_f16_is_refused_without_the_capability() {
        let src = "enable f16;\n@group(0) @binding(1) var<storage, read_write> x: array<f16>;\n\
                   @compute @workgroup_size(64) fn half(@builtin(global_invocation_id) g: vec3<u32>) { x[g.x] = x[g.x] * 2.0h; }";
        let err = validate_source("half.wgsl", src, Capabilities::empty())
            .err()
            .unwrap();
        assert!(
            err.starts_with("half.wgsl needs what the adapter lacks"),
            "{err}"
        );
        let ok = validate_source(
            "half.wgsl",
            src,
            capabilities_of(wgpu::Features::SHADER_F16),
        )
        .unwrap();
        assert_eq!(ok.entries["half"].bindings, vec![1]);
    }

    #[test]
    fn entry_points_report_the_bindings_they_use() {
        let v = validate(ShaderFamily::Reduce, Capabilities::empty()).unwrap();
        assert_eq!(v.entries["sum_all"].bindings, vec![1, 2]);
        assert_eq!(v.entries["argmax_rows"].bindings, vec![1, 3]);
        assert_eq!(v.entries["sum_all"].workgroup_size, [256, 1, 1]);
    }

    #[test]
    fn large_one_dimensional_grids_fold_into_two_dimensions() {
        assert_eq!(grid_1d(1, 256), [1, 1, 1]);
        assert_eq!(grid_1d(256 * 65_535, 256), [65_535, 1, 1]);
        assert_eq!(grid_1d(256 * 65_536, 256), [65_535, 2, 1]);
    }
}
