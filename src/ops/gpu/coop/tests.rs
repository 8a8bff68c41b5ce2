//! The kernels' gates, validation and SPIR-V, and a self-check that fails for real.

use super::*;
use crate::shader::coop::{missing, NEEDS, SUBGROUP_SIZE};
use crate::shader::{capabilities_of, validate, ShaderFamily};
use std::sync::OnceLock;

fn config(m: u32, ab: wgpu::CooperativeScalarType) -> wgpu::CooperativeMatrixProperties {
    wgpu::CooperativeMatrixProperties {
        m_size: m,
        n_size: 16,
        k_size: 16,
        ab_type: ab,
        cr_type: wgpu::CooperativeScalarType::F32,
        saturating_accumulation: false,
    }
}

fn nvidia() -> wgpu::AdapterInfo {
    wgpu::AdapterInfo {
        subgroup_min_size: 32,
        subgroup_max_size: 32,
        ..wgpu::AdapterInfo::new(wgpu::DeviceType::DiscreteGpu, wgpu::Backend::Vulkan)
    }
}

#[test]
fn the_kernels_run_only_with_the_configuration_and_subgroup_size_they_are_written_for() {
    use wgpu::CooperativeScalarType::{F16, F32};
    let all = NEEDS | wgpu::Features::TIMESTAMP_QUERY;
    assert_eq!(missing(all, &[config(16, F16)], &nvidia()), None);
    // Another shape or input type, or none at all.
    assert!(missing(all, &[config(8, F16), config(16, F32)], &nvidia()).is_some());
    assert!(missing(all, &[], &nvidia()).is_some());
    // Without the feature (not requested, or refused), subgroups or float16.
    for lacking in [
        wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
        wgpu::Features::SUBGROUP,
        wgpu::Features::SHADER_F16,
    ] {
        let why = missing(all - lacking, &[config(16, F16)], &nvidia());
        let name = lacking.iter_names().next().expect("one flag").0;
        assert!(why.is_some_and(|w| w.contains(name)), "{lacking:?}");
    }
    // Subgroups of 64 (AMD's wave64) or of varying size (Intel) would leave fragments
    // unwritten.
    for (lo, hi) in [(64, 64), (32, 64), (8, 32)] {
        let info = wgpu::AdapterInfo {
            subgroup_min_size: lo,
            subgroup_max_size: hi,
            ..nvidia()
        };
        assert!(
            missing(all, &[config(16, F16)], &info).is_some(),
            "{lo}..{hi}"
        );
    }
}

#[test]
fn the_kernels_validate_with_cooperative_matrices_and_compile_to_spirv() {
    assert!(validate(
        ShaderFamily::MatmulCoop,
        capabilities_of(NEEDS - wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
    )
    .is_err());
    let v = validate(ShaderFamily::MatmulCoop, capabilities_of(NEEDS)).unwrap();
    for c in CANDIDATES {
        let e = &v.entries[c.kernel.entry];
        assert_eq!(e.workgroup_size, [4 * SUBGROUP_SIZE, 1, 1], "{}", c.name);
        let bindings: &[u32] = match (c.v4, c.split) {
            (_, true) => &[1, 2, 7],
            (true, false) => &[3, 4, 5, 6],
            (false, false) => &[1, 2, 3, 4],
        };
        assert_eq!(e.bindings, bindings, "{}", c.name);
    }
    assert_eq!(v.workgroup_bytes, 13_824);
    // What wgpu's Vulkan backend does with it: naga's SPIR-V writer must take every entry
    // point (the cooperative types, zero accumulators, loads and stores of workgroup memory).
    let source = ShaderFamily::MatmulCoop.source();
    let module = naga::front::wgsl::parse_str(source).unwrap();
    let info =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), capabilities_of(NEEDS))
            .validate(&module)
            .unwrap();
    // wgpu-hal's options on a Vulkan 1.3 device without robustBufferAccess2.
    let restrict = naga::proc::BoundsCheckPolicy::Restrict;
    let options = naga::back::spv::Options {
        lang_version: (1, 6),
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: restrict,
            buffer: restrict,
            image_load: restrict,
            binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
        },
        force_loop_bounding: true,
        ..Default::default()
    };
    for Candidate { kernel, .. } in CANDIDATES {
        let pipeline = naga::back::spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: kernel.entry.to_string(),
        };
        let words = naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
            .unwrap_or_else(|e| panic!("{}: {e}", kernel.entry));
        assert_eq!(words.first(), Some(&0x0723_0203), "SPIR-V magic");
        spirv_val(kernel.entry, &words);
    }
}

/// Runs the SPIRV-Tools validator on `words` for Vulkan 1.3 where it is installed
/// (`spirv-val`, Debian's spirv-tools), and says so where it is not.
fn spirv_val(entry: &str, words: &[u32]) {
    let words = &without_workgroup_array_strides(words);
    let path = std::env::temp_dir().join(format!("anygpu-{entry}-{}.spv", std::process::id()));
    std::fs::write(&path, bytemuck::cast_slice::<u32, u8>(words)).unwrap();
    let run = std::process::Command::new("spirv-val")
        .args(["--target-env", "vulkan1.3"])
        .arg(&path)
        .output();
    let _ = std::fs::remove_file(&path);
    match run {
        Ok(out) => assert!(
            out.status.success(),
            "spirv-val refuses {entry}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => {
            eprintln!("spirv-val not run on {entry} ({e}): SPIR-V written, not validated")
        }
    }
}

/// `words` without the ArrayStride decorations naga 30 puts on arrays in workgroup memory,
/// which Vulkan has since forbidden (VUID-StandaloneSpirv-None-10684; every family with
/// workgroup arrays has them, and drivers ignore them): so that `spirv-val` goes on to the
/// rest.
fn without_workgroup_array_strides(words: &[u32]) -> Vec<u32> {
    const OP_DECORATE: u32 = 71;
    const OP_TYPE_POINTER: u32 = 32;
    const ARRAY_STRIDE: u32 = 6;
    const WORKGROUP: u32 = 4;
    let instructions = |words: &[u32]| -> Vec<(usize, usize)> {
        let mut at = 5;
        let mut spans = Vec::new();
        while at < words.len() {
            let count = (words[at] >> 16) as usize;
            spans.push((at, count.max(1)));
            at += count.max(1);
        }
        spans
    };
    let spans = instructions(words);
    let workgroup_types: Vec<u32> = spans
        .iter()
        .filter(|&&(at, n)| {
            words[at] & 0xffff == OP_TYPE_POINTER && n == 4 && words[at + 2] == WORKGROUP
        })
        .map(|&(at, _)| words[at + 3])
        .collect();
    let mut out = words[..5].to_vec();
    for (at, n) in spans {
        let w = &words[at..at + n];
        let strip = w[0] & 0xffff == OP_DECORATE
            && n == 4
            && w[2] == ARRAY_STRIDE
            && workgroup_types.contains(&w[1]);
        if !strip {
            out.extend_from_slice(w);
        }
    }
    out
}

/// A runtime on Vulkan (lavapipe here), tuning unforced, and its first GPU with float16;
/// `None` (the test skips; under `ANYGPU_REQUIRE_ADAPTER=1` it fails) without one.
pub(super) fn float16_gpu() -> Option<(crate::Runtime, LogicalDevice)> {
    let rt = crate::Runtime::builder()
        .env("WGPU_BACKEND", Some("vulkan"))
        .env("ANYGPU_AUTOTUNE_FORCE", None)
        .build()
        .expect("runtime");
    let gpus = rt
        .list_logical_devices(crate::DeviceKind::Gpu)
        .expect("devices");
    let Some(dev) = gpus.into_iter().find(|d| d.has_f16()) else {
        assert!(
            std::env::var("ANYGPU_REQUIRE_ADAPTER").as_deref() != Ok("1"),
            "ANYGPU_REQUIRE_ADAPTER=1 but no Vulkan adapter with float16"
        );
        eprintln!("SKIPPED: no adapter with float16");
        return None;
    };
    Some((rt, dev))
}

/// Support as if the adapter had reported the kernels' configuration, nothing checked yet.
pub(super) fn unchecked_support() -> CoopSupport {
    CoopSupport {
        configs: Vec::new(),
        missing: None,
        verdicts: OnceLock::new(),
        conv_verdicts: OnceLock::new(),
        emulated: Default::default(),
    }
}

/// The self-check run for real where the kernels cannot run (lavapipe has no cooperative
/// matrices, so each pipeline is refused): every candidate fails it, is named with why, and
/// none is offered.
#[test]
fn a_candidate_that_fails_its_self_check_is_never_offered() {
    let Some((_rt, dev)) = float16_gpu() else {
        return;
    };
    let dev = &dev;
    let g = dev.gpu().expect("a GPU");
    assert!(
        !g.ctx.coop.usable(),
        "lavapipe has cooperative matrices now"
    );
    let support = unchecked_support();
    let kernels = GpuKernels::new(g, dev.full_name());
    for (trans_a, k) in [(false, 64), (true, 63)] {
        let d = MatmulDims {
            m: 64,
            k,
            n: 64,
            trans_a,
            trans_b: false,
        };
        assert_eq!(
            kernels.coop_offered(&support, d, dev).expect("offered"),
            Vec::<&str>::new()
        );
    }
    let verdicts = support.verdicts.get().expect("checked once");
    assert_eq!(verdicts.len(), CANDIDATES.len());
    for (c, (name, verdict)) in CANDIDATES.iter().zip(verdicts) {
        assert_eq!(c.name, *name);
        let why = verdict.as_ref().expect_err(name);
        assert!(why.contains(c.kernel.entry), "{name}: {why}");
    }
}

#[test]
fn only_this_modules_names_are_candidates() {
    assert!(is_candidate("coop16_64x64") && is_candidate("coop16_32x64"));
    assert!(!is_candidate("tile64") && !is_candidate("coop"));
}
