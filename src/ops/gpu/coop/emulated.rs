//! The kernels' text with the cooperative operations done by hand, run on adapters without
//! tensor cores (lavapipe): against the oracle directly, and in the device's pipeline cache in
//! place of the real kernels, so that the self-checks and the convolution ops' choices run
//! through the dispatch code on them.

use half::f16;

use super::check::{conv_check, first_off, flipped, halves, layer_sums, CONV_CHECKS};
use super::gather::{conv_applies, conv_dims, conv_fits, ConvMode, Gather};
use super::tests::{float16_gpu, unchecked_support};
use super::{applies, launch_shape, split_slices, CoopParams, Work, SPLIT_MIN_K};
use crate::device::LogicalDevice;
use crate::ops::gpu::kernels::GpuKernels;
use crate::ops::reference;
use crate::ops::spec::{Activation, ConvGeometry, Padding};
use crate::ops::MatmulDims;
use crate::shader::coop::{Candidate, CANDIDATES};
use crate::shader::{capabilities_of, ShaderFamily};
use crate::tensor::Tensor;

/// `matmul_coop.wgsl` with each cooperative-matrix operation done by hand, for adapters
/// without them: a fragment of C is the 8 elements `lane + 32 e` (row-major in 16×16) one of
/// a subgroup's 32 invocations holds, `subgroup_id` is `t / 32`, a fragment of A or B is
/// its offset in `at` or `bt` (loads always name those tiles with strides AS and BS, and
/// the multiply-add that uses a fragment reads the tile before the next barrier, as the
/// load would). Everything else (the tiles' loads, zero padding, transposes, offsets of
/// the fragments, the write of the output, params and grid) is the kernel's own text.
fn emulated_source() -> String {
    let mut out = String::new();
    for line in ShaderFamily::MatmulCoop.source().lines() {
        let code = line.trim_start();
        let between = |open: &str, close: &str| -> Option<String> {
            let start = code.find(open)? + open.len();
            let end = start + code[start..].find(close)?;
            Some(code[start..end].to_string())
        };
        let indent = &line[..line.len() - code.len()];
        let lhs = code.split(" = ").next().unwrap_or("");
        if code == "enable wgpu_cooperative_matrix;" || code.starts_with("@builtin(subgroup_id)") {
            continue;
        } else if code.starts_with("let row0 = ") {
            out.push_str(&format!("{indent}let sg = t / 32u;\n{line}\n"));
        } else if code.contains("coop_mat16x16<f32, C>()") {
            out.push_str(&format!(
                "{}\n",
                line.replace("coop_mat16x16<f32, C>()", "array<f32, 8>()")
            ));
        } else if code.contains("coopLoadT<coop_mat16x16<f16, A>>") {
            let offset = between("(&at[", "], AS);").expect("A fragments load `at` with stride AS");
            out.push_str(&format!("{indent}{lhs} = {offset};\n"));
        } else if code.contains("coopLoadT<coop_mat16x16<f16, B>>") {
            let offset = between("(&bt[", "], BS);").expect("B fragments load `bt` with stride BS");
            out.push_str(&format!("{indent}{lhs} = {offset};\n"));
        } else if code.contains("coopMultiplyAdd(") {
            let args = between("coopMultiplyAdd(", ");").expect("one multiply-add a line");
            out.push_str(&format!("{indent}{lhs} = emu_mad({args}, t % 32u);\n"));
        } else if code.starts_with("coopStoreT(") {
            let args =
                between("coopStoreT(", ", 16u);").expect("C fragments stored with stride 16");
            let (c, slot) = args
                .split_once(", &ct[")
                .expect("C fragments stored into `ct`");
            let slot = slot.trim_end_matches(']');
            out.push_str(&format!("{indent}emu_store({c}, {slot}, t % 32u);\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str(
        "
fn emu_mad(a_off: u32, b_off: u32, c: array<f32, 8>, lane: u32) -> array<f32, 8> {
var r = c;
for (var e = 0u; e < 8u; e++) {
    let idx = lane + 32u * e;
    var s = 0.0;
    for (var l = 0u; l < 16u; l++) {
        s += f32(at[a_off + (idx / 16u) * AS + l]) * f32(bt[b_off + l * BS + idx % 16u]);
    }
    r[e] += s;
}
return r;
}

fn emu_store(c: array<f32, 8>, slot: u32, lane: u32) {
for (var e = 0u; e < 8u; e++) {
    ct[slot + lane + 32u * e] = c[e];
}
}
",
    );
    out
}

#[test]
fn the_emulated_kernels_keep_no_cooperative_operation() {
    let source = emulated_source();
    for line in source.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for op in [
            "coop_mat",
            "coopLoad",
            "coopStore",
            "coopMultiplyAdd",
            "subgroup",
        ] {
            assert!(!line.contains(op), "{line}");
        }
    }
    let caps = capabilities_of(wgpu::Features::SHADER_F16);
    let v = crate::shader::validate_source("emulated", &source, caps).unwrap();
    assert_eq!(v.entries.len(), CANDIDATES.len());
}

/// Candidate `c`'s kernel compiled from `source` (the emulated text) on `ctx`'s device,
/// with the layout the pipeline cache would give it.
fn emulated_pipeline(
    ctx: &crate::device::context::GpuContext,
    source: &str,
    c: &Candidate,
) -> crate::shader::Pipeline {
    let module = ctx
        .device
        .create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("matmul_coop.wgsl (emulated)"),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
    let entries = crate::shader::validate_source(
        "emulated",
        source,
        capabilities_of(wgpu::Features::SHADER_F16),
    )
    .unwrap()
    .entries;
    let bindings = entries[c.kernel.entry].bindings.clone();
    let buffer = |binding: u32| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: if binding == 0 {
                wgpu::BufferBindingType::Uniform
            } else {
                wgpu::BufferBindingType::Storage { read_only: false }
            },
            has_dynamic_offset: binding == 0,
            min_binding_size: None,
        },
        count: None,
    };
    let layout_entries: Vec<_> = std::iter::once(0)
        .chain(bindings.iter().copied())
        .map(buffer)
        .collect();
    let layout = ctx
        .device
        .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: None,
            entries: &layout_entries,
        });
    let pipeline_layout = ctx
        .device
        .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: None,
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
    crate::shader::Pipeline {
        name: c.kernel.entry,
        pipeline: ctx
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(c.kernel.entry),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some(c.kernel.entry),
                compilation_options: Default::default(),
                cache: None,
            }),
        layout,
        bindings,
    }
}

/// The self-check itself, through this module's dispatch code (`matmul_coop`, the split
/// product, `conv_coop`, the gathered split), on the emulated kernels put in the device's
/// pipeline cache in place of the real ones: every candidate passes; with a gather that
/// reads the wrong padding, each fails its convolutions' check, says which convolution,
/// and is offered for products still, never for convolutions.
#[test]
fn the_self_check_passes_the_emulated_kernels_and_fails_a_wrong_gather() {
    let Some((_rt, dev)) = float16_gpu() else {
        return;
    };
    let dev = &dev;
    let g = dev.gpu().expect("a GPU");
    let kernels = GpuKernels::new(g, dev.full_name());
    let right = emulated_source();
    let wrong = right.replacen("* p.dw) - i32(p.pl);", "* p.dw) - i32(p.pt);", 1);
    assert_ne!(
        right, wrong,
        "the gather's column padding is where the test expects it"
    );
    for (source, passes) in [(&right, true), (&wrong, false)] {
        for c in CANDIDATES {
            g.ctx
                .pipelines
                .replace_for_test(c.kernel, emulated_pipeline(&g.ctx, source, &c));
        }
        let support = unchecked_support();
        let products = kernels.coop_verdicts(&support, dev, Work::Products);
        for (name, verdict) in products.expect("checked") {
            // The products read no image: they pass either way.
            assert_eq!(verdict, &Ok(()), "{name} failed its products' self-check");
        }
        let convolutions = kernels.coop_verdicts(&support, dev, Work::Convolutions);
        for (name, verdict) in convolutions.expect("checked") {
            match (passes, verdict) {
                (true, Err(e)) => panic!("{name} failed its self-check: {e}"),
                (false, Ok(())) => panic!("{name} passed with a wrong gather"),
                (false, Err(e)) => assert!(e.contains("strides"), "{name}: {e}"),
                (true, Ok(())) => {}
            }
        }
        // What the tuner is offered: the products still, the convolutions only if right.
        let d = MatmulDims {
            m: 64,
            k: 64,
            n: 64,
            trans_a: false,
            trans_b: false,
        };
        let offered = kernels.coop_offered(&support, d, dev).expect("offered");
        assert!(offered.contains(&"coop16_64x64_v4"), "{offered:?}");
        let g = ConvGeometry::conv(&CONV_CHECKS[0]);
        let offered = kernels
            .coop_passing(&support, dev, Work::Convolutions, &|c| conv_applies(c, &g))
            .expect("offered");
        assert_eq!(offered.is_empty(), !passes, "{offered:?}");
    }
}

/// The convolution ops through `nn/conv.rs`'s choices (the correlation at stride 1 and
/// above, the input gradients at stride 1 and 2, the kernel gradient), each
/// tensor-core candidate forced in turn on the emulated kernels (the device told it has
/// them): right against the f64 oracle with the right emulation, and wrong with a gather
/// one row off (so that it ran, not a fallback; each candidate's forward pass and input
/// gradient at both strides, or the split one's kernel gradients, fail then).
#[test]
fn the_convolution_ops_run_each_forced_candidate() {
    use crate::ops::spec::ConvOptions;
    use crate::ops::GradDType;
    let shapes = [
        // (n, h, w, c_in, c_out, strides): the vec4 candidates', the scalar ones', and the
        // split one's (pixels enough to split), strides uneven too.
        (2, 9, 8, 8, 24, [1, 1]),
        (2, 10, 9, 8, 12, [2, 2]),
        (2, 9, 8, 5, 20, [1, 1]),
        (2, 10, 9, 6, 10, [2, 2]),
        (8, 10, 9, 8, 12, [1, 1]),
        (24, 10, 9, 6, 10, [2, 2]),
        (3, 11, 13, 8, 12, [2, 3]),
        (20, 11, 13, 6, 10, [3, 2]),
    ];
    for c in CANDIDATES {
        let rt = crate::Runtime::builder()
            .env("WGPU_BACKEND", Some("vulkan"))
            .env("ANYGPU_AUTOTUNE_FORCE", Some(c.name))
            .build()
            .expect("runtime");
        let gpus = rt
            .list_logical_devices(crate::DeviceKind::Gpu)
            .expect("devices");
        let Some(dev) = gpus.iter().find(|d| d.has_f16()) else {
            assert!(std::env::var("ANYGPU_REQUIRE_ADAPTER").as_deref() != Ok("1"));
            return;
        };
        let g = dev.gpu().expect("a GPU");
        g.ctx
            .coop
            .emulated
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let _scope = dev.scope();
        let right = emulated_source();
        // Every tap one row off.
        let wrong = right.replacen("- i32(p.pt);", "- i32(p.pt) + 1;", 1);
        assert_ne!(right, wrong);
        for (source, passes) in [(&right, true), (&wrong, false)] {
            for k in CANDIDATES {
                g.ctx
                    .pipelines
                    .replace_for_test(k.kernel, emulated_pipeline(&g.ctx, source, &k));
            }
            // (shape, op) of each wrong output, and what the candidate takes.
            let mut failures = Vec::new();
            let mut takes = Vec::new();
            for (q, &(n, h, w, c_in, c_out, strides)) in shapes.iter().enumerate() {
                let s = conv_check(n, h, w, c_in, c_out, (3, 3), Padding::Same, strides, [1, 1]);
                let options = ConvOptions::new(Padding::Same).strides(strides);
                let g = ConvGeometry::conv(&s);
                let dx_g = Gather::input_grad(&g).g;
                let fits = |g: &ConvGeometry| conv_fits(g) && conv_applies(&c, g);
                let dk_takes = conv_dims(&g, ConvMode::KernelGrad).k >= SPLIT_MIN_K;
                takes.extend([
                    ((q, "y"), !c.split && fits(&g)),
                    ((q, "dx"), !c.split && fits(&dx_g)),
                    ((q, "dk"), c.split && dk_takes),
                ]);
                let (oh, ow) = s.out_hw();
                let seed = 8_000 + 10 * q as u64;
                let (xv, xh) = halves(s.input_len(), seed);
                let (kv, kh) = halves(s.kernel_len(), seed + 1);
                let (dzv, dzh) = halves(s.output_len(), seed + 2);
                let x = Tensor::from_slice_on(&xh, &[n, h, w, c_in], dev).unwrap();
                let kshape = [3, 3, c_in, c_out];
                let kernel = Tensor::from_slice_on(&kh, &kshape, dev).unwrap();
                let dz = Tensor::from_slice_on(&dzh, &[n, oh, ow, c_out], dev).unwrap();
                let y = crate::ops::conv2d(&x, &kernel, None, options, Activation::Linear).unwrap();
                let want = reference::conv2d_forward(&xv, &kv, None, &s, Activation::Linear);
                if let Some(off) = first_off(&y.to_vec::<f16>().unwrap(), &want) {
                    failures.push(((q, "y"), format!("{s:?}: y {off:?}")));
                }
                let dx = crate::ops::conv2d_backward_input(&dz, &kernel, &[n, h, w, c_in], options)
                    .unwrap();
                let want = reference::conv2d_backward_input(&dzv, &kv, &s);
                if let Some(off) = first_off(&dx.to_vec::<f16>().unwrap(), &want) {
                    failures.push(((q, "dx"), format!("{s:?}: dx {off:?}")));
                }
                let f32_grads = GradDType::Float32;
                let dk =
                    crate::ops::conv2d_backward_kernel_as(&x, &dz, &kshape, options, f32_grads)
                        .unwrap();
                let want = reference::conv2d_backward_kernel(&xv, &dzv, &s);
                if let Some(off) = first_off(&dk.to_vec::<f32>().unwrap(), &want) {
                    failures.push(((q, "dk"), format!("{s:?}: dk {off:?}")));
                }
            }
            if passes {
                let all: Vec<&str> = failures.iter().map(|(_, f)| f.as_str()).collect();
                assert!(all.is_empty(), "{}: {}", c.name, all.join("\n"));
                continue;
            }
            // Wrong wherever the candidate runs: no choice fell back to another kernel.
            for (op, taken) in takes {
                let failed = failures.iter().any(|(f, _)| *f == op);
                assert_eq!(failed, taken, "{}: shape {} {}", c.name, op.0, op.1);
            }
        }
    }
}

/// The kernels' text with the cooperative operations emulated, on every adapter with
/// float16 (lavapipe here), through this module's params and grid, against the f64 oracle:
/// ragged shapes, every transpose, bias and activations.
#[test]
fn the_emulated_kernels_match_the_oracle() {
    let Some((_rt, dev)) = float16_gpu() else {
        return;
    };
    let dev = &dev;
    let ctx = &dev.gpu().expect("a GPU").ctx;
    let source = emulated_source();
    let mut failures = Vec::new();
    for c in CANDIDATES {
        let pipeline = emulated_pipeline(ctx, &source, &c);
        let shapes = [
            (1, 1, 1),
            (37, 45, 51),
            (64, 32, 64),
            (100, 70, 131),
            (16, 200, 3),
            (37, 44, 52),
            (100, 72, 132),
            (1, 4, 4),
        ];
        for (s, &(m, k, n)) in shapes.iter().enumerate() {
            for (l, (trans_a, trans_b)) in
                [(false, false), (true, false), (false, true), (true, true)]
                    .into_iter()
                    .enumerate()
            {
                let d = MatmulDims {
                    m,
                    k,
                    n,
                    trans_a,
                    trans_b,
                };
                if !applies(&c, d) {
                    continue;
                }
                let act = [Activation::Relu, Activation::Linear, Activation::Selu][(s + l) % 3];
                let has_bias = (s + l) % 2 == 0;
                let seed = 5_000 + 100 * s as u64 + 10 * l as u64;
                let values = halves;
                let (av, ah) = values(m * k, seed);
                let (bv, bh) = values(k * n, seed + 1);
                let (cv, ch) = values(n, seed + 2);
                let ashape = if trans_a { [k, m] } else { [m, k] };
                let bshape = if trans_b { [n, k] } else { [k, n] };
                let at = Tensor::from_slice_on(&ah, &ashape, dev).unwrap();
                let bt = Tensor::from_slice_on(&bh, &bshape, dev).unwrap();
                let ct = Tensor::from_slice_on(&ch, &[n], dev).unwrap();
                let product = reference::matmul(&av, &bv, m, k, n, trans_a, trans_b);
                // Split k: the slices `split_slices` gives, and slices of two and three
                // steps of k (long products get those), the last one ragged.
                let (natural, _) = split_slices(d);
                let slices = [natural, 64, 96]
                    .into_iter()
                    .filter(|&s| c.split && (s == natural || s < k));
                for k_slice in slices {
                    // The layers' raw float32 sums, added up here: the bias, the activation
                    // and the rounding are matmul.wgsl's splitk_reduce's.
                    let splits = k.div_ceil(k_slice);
                    let len = splits * m * n;
                    let part = Tensor::from_slice_on(&vec![f32::NAN; len], &[len], dev).unwrap();
                    let (mut p, _) = launch_shape(d, false, Activation::Linear, (64, 64));
                    p.k_slice = k_slice as u32;
                    let grid = [n.div_ceil(64) as u32, m.div_ceil(64) as u32, splits as u32];
                    let ranges: Vec<_> = [&at, &bt, &part]
                        .iter()
                        .map(|t| t.gpu_range().unwrap())
                        .collect();
                    ctx.dispatch(&pipeline, bytemuck::bytes_of(&p), &ranges, grid);
                    drop(ranges);
                    let layers = part.to_vec::<f32>().unwrap();
                    let sum = |i: usize| -> f64 {
                        (0..splits).map(|z| f64::from(layers[z * m * n + i])).sum()
                    };
                    // float16 operands multiply exactly in float32; only the sums round.
                    let off = (0..m * n)
                        .find(|&i| (sum(i) - product[i]).abs() > 1e-5 * product[i].abs().max(1.0));
                    if let Some(i) = off {
                        failures.push(format!(
                            "{} {m}x{k}x{n} ta={trans_a} tb={trans_b} in {splits} slices: \
                             sum[{}, {}] = {}, oracle {:.5}",
                            c.name,
                            i / n,
                            i % n,
                            sum(i),
                            product[i]
                        ));
                    }
                }
                if c.split {
                    continue;
                }
                let out = Tensor::from_slice_on(&vec![f16::NAN; m * n], &[m, n], dev).unwrap();
                let (p, grid) = launch_shape(d, has_bias, act, (c.rows, c.cols));
                let tensors = if c.v4 {
                    [&ct, &out, &at, &bt]
                } else {
                    [&at, &bt, &ct, &out]
                };
                let ranges: Vec<_> = tensors.iter().map(|t| t.gpu_range().unwrap()).collect();
                ctx.dispatch(&pipeline, bytemuck::bytes_of(&p), &ranges, grid);
                drop(ranges);
                let got = out.to_vec::<f16>().unwrap();
                let want = reference::bias_act(&product, has_bias.then_some(&cv[..]), act);
                if let Some((i, g, w)) = first_off(&got, &want) {
                    failures.push(format!(
                        "{} {m}x{k}x{n} ta={trans_a} tb={trans_b} bias={has_bias} {act:?}: \
                         out[{}, {}] = {g}, oracle {w:.5}",
                        c.name,
                        i / n,
                        i % n
                    ));
                }
            }
        }
        failures.extend(emulated_convolutions(dev, &c, &pipeline));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The convolutions candidate `c` takes, run on its emulated `pipeline` through this
/// module's params and grid ([`CoopParams::gathering`]) against the f64 oracle: the
/// self-check's and larger ones (several tiles each way, several steps of k), the forward
/// pass with a bias and an activation on the product kernels, the kernel gradient in
/// ragged slices on the split one. The failures, each naming the convolution.
fn emulated_convolutions(
    dev: &LogicalDevice,
    c: &Candidate,
    pipeline: &crate::shader::Pipeline,
) -> Vec<String> {
    let ctx = &dev.gpu().expect("a GPU").ctx;
    let values = halves;
    let upload = |h: &[f16]| Tensor::from_slice_on(h, &[h.len()], dev).unwrap();
    let run = |p: CoopParams, tensors: &[&Tensor], grid: [u32; 3]| {
        let ranges: Vec<_> = tensors.iter().map(|t| t.gpu_range().unwrap()).collect();
        ctx.dispatch(pipeline, bytemuck::bytes_of(&p), &ranges, grid);
    };
    let mut shapes = CONV_CHECKS.to_vec();
    shapes.extend([
        conv_check(2, 14, 14, 16, 72, (3, 3), Padding::Same, [1, 1], [1, 1]),
        conv_check(2, 9, 9, 32, 40, (3, 3), Padding::Same, [1, 1], [1, 1]),
        conv_check(2, 12, 10, 8, 32, (3, 3), Padding::Valid, [1, 1], [2, 2]),
        conv_check(1, 9, 9, 32, 16, (1, 1), Padding::Valid, [2, 2], [1, 1]),
    ]);
    let mut failures = Vec::new();
    for (q, s) in shapes.iter().enumerate() {
        let g = ConvGeometry::conv(s);
        if !conv_fits(&g) {
            continue;
        }
        let what = format!("{} {s:?}", c.name);
        let seed = 6_000 + 100 * q as u64;
        let (xv, xh) = values(s.input_len(), seed);
        let x = upload(&xh);
        if c.split {
            let (dzv, dzh) = values(s.output_len(), seed + 1);
            let dz = upload(&dzh);
            let d = conv_dims(&g, ConvMode::KernelGrad);
            let want = reference::conv2d_backward_kernel(&xv, &dzv, s);
            let (natural, _) = split_slices(d);
            for k_slice in [natural, 64, 96] {
                let splits = d.k.div_ceil(k_slice);
                let len = splits * d.m * d.n;
                let part = Tensor::from_slice_on(&vec![f32::NAN; len], &[len], dev).unwrap();
                let (mut p, _) = launch_shape(d, false, Activation::Linear, (64, 64));
                p = p.gathering(ConvMode::KernelGrad, &Gather::conv(g));
                p.k_slice = k_slice as u32;
                let grid = [
                    d.n.div_ceil(64) as u32,
                    d.m.div_ceil(64) as u32,
                    splits as u32,
                ];
                run(p, &[&x, &dz, &part], grid);
                let sum = layer_sums(&part.to_vec::<f32>().unwrap(), splits);
                if let Some((i, got, w)) = first_off(&sum, &want) {
                    failures.push(format!(
                        "{what} kernel gradient in {splits} slices: dk[{i}] = {got}, \
                         oracle {w:.5}"
                    ));
                }
            }
            continue;
        }
        if !conv_applies(c, &g) {
            continue;
        }
        let (kv, kh) = values(s.kernel_len(), seed + 1);
        let (bv, bh) = values(s.c_out, seed + 2);
        let (kernel, bias) = (upload(&kh), upload(&bh));
        let y = upload(&vec![f16::NAN; s.output_len()]);
        let act = [Activation::Relu, Activation::Linear, Activation::Selu][q % 3];
        let has_bias = q % 2 == 0;
        let d = conv_dims(&g, ConvMode::Forward);
        let (p, grid) = launch_shape(d, has_bias, act, (c.rows, c.cols));
        let p = p.gathering(ConvMode::Forward, &Gather::conv(g));
        if c.v4 {
            run(p, &[&bias, &y, &x, &kernel], grid);
        } else {
            run(p, &[&x, &kernel, &bias, &y], grid);
        }
        let got = y.to_vec::<f16>().unwrap();
        let bias = has_bias.then_some(&bv[..]);
        let want = reference::conv2d_forward(&xv, &kv, bias, s, act);
        if let Some((i, got, w)) = first_off(&got, &want) {
            failures.push(format!(
                "{what} bias={has_bias} {act:?}: y[{i}] = {got}, oracle {w:.5}"
            ));
        }
    }
    // The input gradients: dz upsampled by the strides, correlated with the flipped kernel.
    for (q, s) in shapes.iter().enumerate() {
        let gather = Gather::input_grad(&ConvGeometry::conv(s));
        if c.split || !conv_fits(&gather.g) || !conv_applies(c, &gather.g) {
            continue;
        }
        let seed = 7_000 + 100 * q as u64;
        let (kv, kh) = values(s.kernel_len(), seed);
        let (dzv, dzh) = values(s.output_len(), seed + 1);
        let (kt, dz) = (upload(&flipped(&kh, s)), upload(&dzh));
        let dx = upload(&vec![f16::NAN; s.input_len()]);
        let d = conv_dims(&gather.g, ConvMode::Forward);
        let (p, grid) = launch_shape(d, false, Activation::Linear, (c.rows, c.cols));
        let p = p.gathering(ConvMode::Forward, &gather);
        if c.v4 {
            run(p, &[&dx, &dx, &dz, &kt], grid);
        } else {
            run(p, &[&dz, &kt, &dx, &dx], grid);
        }
        let got = dx.to_vec::<f16>().unwrap();
        let want = reference::conv2d_backward_input(&dzv, &kv, s);
        if let Some((i, got, w)) = first_off(&got, &want) {
            failures.push(format!(
                "{} input gradient of {s:?}: dx[{i}] = {got}, oracle {w:.5}",
                c.name
            ));
        }
    }
    failures
}
