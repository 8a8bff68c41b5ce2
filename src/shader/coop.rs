//! What the tensor-core products (`matmul_coop.wgsl`, dispatched by `ops::gpu::coop`) need of
//! an adapter, below the device layer that opens it: the features and the one
//! cooperative-matrix configuration the kernels are written for (16×16×16, float16 A and B,
//! float32 C), subgroups of exactly 32, the candidate kernels, and each device's support —
//! what the adapter reports, why the kernels cannot run there, and the candidates' self-check
//! verdicts once `ops::gpu::coop` has run it.

use std::sync::OnceLock;

use crate::shader::{Kernel, ShaderFamily};

/// What `matmul_coop.wgsl` needs of a device besides the configuration.
pub(crate) const NEEDS: wgpu::Features = wgpu::Features::SHADER_F16
    .union(wgpu::Features::SUBGROUP)
    .union(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);

/// The subgroup size the kernels are written for: four subgroups of 32 per workgroup of 128,
/// each owning the fragments its `subgroup_id` names.
pub(crate) const SUBGROUP_SIZE: u32 = 32;

/// One kernel the tuner may pick.
#[derive(Clone, Copy)]
pub(crate) struct Candidate {
    pub(crate) name: &'static str,
    pub(crate) kernel: Kernel,
    /// Output rows and columns per workgroup.
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// Reads A and B as vec4: no transposes, k and n multiples of 4.
    pub(crate) v4: bool,
    /// Splits k over workgroup layers into float32 partial sums (`matmul_coop_64x64_splitk`),
    /// which a second kernel adds up: any shape and transpose.
    pub(crate) split: bool,
}

const fn candidate(
    name: &'static str,
    entry: &'static str,
    (rows, cols): (usize, usize),
    v4: bool,
) -> Candidate {
    Candidate {
        name,
        kernel: Kernel::new(ShaderFamily::MatmulCoop, entry),
        rows,
        cols,
        v4,
        split: false,
    }
}

/// The split-k candidate's name: also the 1×1 convolutions' kernel gradient on tensor cores.
pub(crate) const SPLIT_CANDIDATE: &str = "coop16_64x64_splitk";

/// Its kernel (float32 partial sums per slice of k).
pub(crate) const SPLIT_KERNEL: Kernel =
    Kernel::new(ShaderFamily::MatmulCoop, "matmul_coop_64x64_splitk");

pub(crate) const CANDIDATES: [Candidate; 6] = [
    candidate("coop16_64x64", "matmul_coop_64x64", (64, 64), false),
    candidate("coop16_32x64", "matmul_coop_32x64", (32, 64), false),
    candidate("coop16_64x64_v4", "matmul_coop_64x64_v4", (64, 64), true),
    candidate("coop16_32x64_v4", "matmul_coop_32x64_v4", (32, 64), true),
    candidate("coop16_64x32_v4", "matmul_coop_64x32_v4", (64, 32), true),
    Candidate {
        name: SPLIT_CANDIDATE,
        kernel: SPLIT_KERNEL,
        rows: 64,
        cols: 64,
        v4: false,
        split: true,
    },
];

/// Whether `name` is one of this module's candidates.
pub(crate) fn is_candidate(name: &str) -> bool {
    CANDIDATES.iter().any(|c| c.name == name)
}

/// The configuration the kernels use: 16×16×16, float16 A and B, float32 C and result.
fn is_ours(p: &wgpu::CooperativeMatrixProperties) -> bool {
    (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
        && p.ab_type == wgpu::CooperativeScalarType::F16
        && p.cr_type == wgpu::CooperativeScalarType::F32
}

/// Why `matmul_coop.wgsl` cannot run on an adapter with `features`, `configs` and `info`, or
/// `None` when it can.
pub(crate) fn missing(
    features: wgpu::Features,
    configs: &[wgpu::CooperativeMatrixProperties],
    info: &wgpu::AdapterInfo,
) -> Option<String> {
    if !features.contains(NEEDS) {
        let names: Vec<&str> = (NEEDS - features)
            .iter_names()
            .map(|(name, _)| name)
            .collect();
        return Some(format!("the adapter lacks {}", names.join(", ")));
    }
    if !configs.iter().any(is_ours) {
        return Some(format!("no 16x16x16 f16->f32 configuration in {configs:?}"));
    }
    let sizes = (info.subgroup_min_size, info.subgroup_max_size);
    if sizes != (SUBGROUP_SIZE, SUBGROUP_SIZE) {
        return Some(format!(
            "subgroup sizes {}..={} (the kernels need exactly {SUBGROUP_SIZE})",
            sizes.0, sizes.1
        ));
    }
    None
}

/// One adapter's cooperative matrices: what it reports, whether the kernels run on the device
/// as opened, and each candidate's self-check, once run.
pub(crate) struct CoopSupport {
    /// The adapter's configurations as wgpu reports them (empty without the feature).
    pub(crate) configs: Vec<wgpu::CooperativeMatrixProperties>,
    /// Why the kernels do not run here; `None` when they do.
    pub(crate) missing: Option<String>,
    /// (candidate, verdict) of the products' self-check.
    pub(crate) verdicts: OnceLock<Vec<(&'static str, std::result::Result<(), String>)>>,
    /// (candidate, verdict) of the convolutions' self-check.
    pub(crate) conv_verdicts: OnceLock<Vec<(&'static str, std::result::Result<(), String>)>>,
    /// Set by a test that put the kernels' emulation in the pipeline cache: they are offered
    /// as if the adapter ran them.
    #[cfg(test)]
    pub(crate) emulated: std::sync::atomic::AtomicBool,
}

impl CoopSupport {
    /// The features to request for `adapter` (offering `features`): the cooperative matrices
    /// where the kernels can use them, else none.
    pub(crate) fn wanted(adapter: &wgpu::Adapter, features: wgpu::Features) -> wgpu::Features {
        let configs = adapter.cooperative_matrix_properties();
        match missing(features, &configs, &adapter.get_info()) {
            None => wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
            Some(_) => wgpu::Features::empty(),
        }
    }

    /// The opt-in wgpu asks for with experimental `features`.
    pub(crate) fn experimental(features: wgpu::Features) -> wgpu::ExperimentalFeatures {
        if features.intersects(wgpu::Features::all_experimental_mask()) {
            // SAFETY: wgpu's contract for experimental features is that their implementation
            // may have bugs; we use only cooperative-matrix loads, stores and multiply-adds in
            // uniform control flow, check every kernel against the f64 oracle on the device
            // before the tuner may pick it, and request the feature only where the adapter
            // reports the configuration the kernels use.
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        }
    }

    /// The support of a device opened on `adapter` with `device_features`.
    pub(crate) fn new(adapter: &wgpu::Adapter, device_features: wgpu::Features) -> CoopSupport {
        let configs = if device_features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            adapter.cooperative_matrix_properties()
        } else {
            Vec::new()
        };
        let info = adapter.get_info();
        let missing = if device_features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            missing(device_features, &configs, &info)
        } else {
            // Why it was not asked for (the adapter's own features and configurations), or
            // that the device refused it.
            let offered = adapter.cooperative_matrix_properties();
            Some(
                missing(adapter.features(), &offered, &info).unwrap_or_else(|| {
                    "the device was opened without cooperative matrices (wgpu refused them)".into()
                }),
            )
        };
        if let Some(why) = &missing {
            log::debug!("{}: no tensor-core products: {why}", info.name);
        }
        CoopSupport {
            configs,
            missing,
            verdicts: OnceLock::new(),
            conv_verdicts: OnceLock::new(),
            #[cfg(test)]
            emulated: Default::default(),
        }
    }

    /// Whether the kernels run on this device.
    pub(crate) fn usable(&self) -> bool {
        #[cfg(test)]
        if self.emulated.load(std::sync::atomic::Ordering::Relaxed) {
            return true;
        }
        self.missing.is_none()
    }
}
