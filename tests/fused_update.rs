//! The fused optimizer update (every variable of a step in one dispatch on a GPU) against the
//! per-variable updates, bit for bit, on CPU:0 and every GPU: every rule, with and without
//! weight decay, many variables of odd sizes, two steps (the second reuses the table), and
//! tensors spread over several arena regions under memory growth.

mod common;

use anygpu::ops::spec::{AdamParams, RmspropParams, SgdParams};
use anygpu::ops::{self, UpdateRule, UpdateTable, UpdateVar};
use anygpu::{KindFilter, LogicalDevice, Tensor};

/// Sizes below, at and across the kernel's 1024-element chunks, and ones far from them.
const SIZES: [usize; 14] = [
    1, 3, 255, 256, 257, 1023, 1024, 1025, 2049, 4099, 77, 30_001, 5, 1000,
];

fn rules() -> Vec<(&'static str, UpdateRule)> {
    let sgd = |momentum, nesterov| {
        UpdateRule::Sgd(SgdParams {
            lr: 0.01,
            momentum,
            nesterov,
        })
    };
    let adam = |step| {
        UpdateRule::Adam(AdamParams {
            lr: 0.001,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-7,
            step,
        })
    };
    let rms = |momentum, centered| {
        UpdateRule::RmsProp(RmspropParams {
            lr: 0.001,
            rho: 0.9,
            momentum,
            epsilon: 1e-7,
            centered,
        })
    };
    vec![
        ("sgd", sgd(0.0, false)),
        ("momentum", sgd(0.9, false)),
        ("nesterov", sgd(0.9, true)),
        ("adam", adam(3)),
        ("rmsprop", rms(0.0, false)),
        ("rmsprop momentum", rms(0.9, false)),
        ("rmsprop centered", rms(0.0, true)),
        ("rmsprop centered momentum", rms(0.9, true)),
    ]
}

/// Which of a variable's three slots the rule has.
fn slots_of(rule: &UpdateRule) -> [bool; 3] {
    match rule {
        UpdateRule::Sgd(p) => [p.momentum != 0.0, false, false],
        UpdateRule::Adam(_) => [true, true, false],
        UpdateRule::RmsProp(p) => [true, p.centered, p.momentum != 0.0],
    }
}

/// One variable's tensors: weight, gradient, slots.
struct Var {
    w: Tensor,
    g: Tensor,
    slots: [Option<Tensor>; 3],
}

fn vars(dev: &LogicalDevice, sizes: &[usize], rule: &UpdateRule) -> Vec<Var> {
    let put = |data: Vec<f32>| Tensor::from_slice_on(&data, &[data.len()], dev).expect("upload");
    sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let seed = 10 * i as u64;
            let slots = slots_of(rule);
            let slot = |k: usize| {
                // Second moments and averages of squares are positive; an average gradient
                // small enough that `v - a²` stays positive.
                slots[k].then(|| {
                    put(common::values(len, seed + 3 + k as u64)
                        .iter()
                        .map(|v| 0.01 * v.abs())
                        .collect())
                })
            };
            Var {
                w: put(common::values(len, seed + 1)),
                g: put(common::values(len, seed + 2)),
                slots: [slot(0), slot(1), slot(2)],
            }
        })
        .collect()
}

fn per_variable(vars: &[Var], rule: &UpdateRule, decay: Option<f32>) {
    for v in vars {
        if let Some(wd) = decay {
            ops::weight_decay_update(&v.w, wd, rule.learning_rate()).expect("decay");
        }
        let [a, b, c] = [&v.slots[0], &v.slots[1], &v.slots[2]].map(Option::as_ref);
        match rule {
            UpdateRule::Sgd(p) => ops::sgd_update(&v.w, &v.g, a, p),
            UpdateRule::Adam(p) => ops::adam_update(&v.w, &v.g, a.unwrap(), b.unwrap(), p),
            UpdateRule::RmsProp(p) => ops::rmsprop_update(&v.w, &v.g, a.unwrap(), b, c, p),
        }
        .expect("per-variable update");
    }
}

fn fused(vars: &[Var], rule: &UpdateRule, decay: Option<f32>, table: &mut UpdateTable) {
    let update: Vec<UpdateVar> = vars
        .iter()
        .map(|v| UpdateVar {
            w: &v.w,
            g: &v.g,
            slots: [&v.slots[0], &v.slots[1], &v.slots[2]].map(Option::as_ref),
        })
        .collect();
    ops::fused_update(&update, *rule, decay, table).expect("fused update");
}

/// Every tensor of `vars` as bits.
fn bits(vars: &[Var]) -> Vec<Vec<u32>> {
    vars.iter()
        .flat_map(|v| std::iter::once(&v.w).chain(v.slots.iter().flatten()))
        .map(|t| {
            t.to_vec::<f32>()
                .expect("readback")
                .iter()
                .map(|x| x.to_bits())
                .collect()
        })
        .collect()
}

/// `one_dispatch`: every tensor in one arena region, so a GPU updates them all in one dispatch.
fn check_devices(rt: &anygpu::Runtime, sizes: &[usize], one_dispatch: bool) {
    for dev in common::available(rt.list_logical_devices(KindFilter::All).expect("devices")) {
        for (name, rule) in rules() {
            for decay in [None, Some(0.004)] {
                let what = format!("{name}, decay {decay:?}, on {dev}");
                let (a, b) = (vars(&dev, sizes, &rule), vars(&dev, sizes, &rule));
                let mut table = UpdateTable::default();
                for step in 0..2 {
                    per_variable(&a, &rule, decay);
                    let before = dev.stream_stats();
                    fused(&b, &rule, decay, &mut table);
                    if let (Some(before), Some(after), true) =
                        (before, dev.stream_stats(), one_dispatch)
                    {
                        let d = after - before;
                        assert_eq!(d.dispatches, 1, "{what}: one dispatch");
                        if step == 1 {
                            // The tensors lie where they did: the same table, the same
                            // bindings.
                            assert_eq!(d.bind_group_hits, 1, "{what}: the table reused");
                        }
                    }
                }
                let (want, got) = (bits(&a), bits(&b));
                for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                    if let Some(k) = w.iter().zip(g).position(|(x, y)| x != y) {
                        panic!(
                            "{what}: tensor {i} (of {}) element {k}: fused {} vs per-variable {}",
                            want.len(),
                            f32::from_bits(g[k]),
                            f32::from_bits(w[k])
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn fused_update_equals_the_per_variable_updates_bit_for_bit_on_every_device() {
    common::gpus_at_least(1, "fused_update");
    let rt = common::builder().build().expect("a runtime");
    check_devices(&rt, &SIZES, true);
}

#[test]
fn fused_update_over_tensors_in_several_arena_regions_is_bit_exact() {
    common::gpus_at_least(1, "fused_update regions");
    // Under growth the first region holds 2 MiB: these tensors fill three or more.
    let rt = common::builder()
        .memory_growth(true)
        .build()
        .expect("a runtime");
    let dir = std::env::temp_dir().join(format!("anygpu-fused-{}", std::process::id()));
    anygpu::profiler::start(&dir).expect("profiler");
    check_devices(&rt, &[300_001, 7, 200_000, 1025, 150_000], false);
    let report = anygpu::profiler::stop().expect("report");
    std::fs::remove_dir_all(&dir).ok();
    // The kernel that reads from several regions ran (the profiler times kernels on
    // adapters with timestamp queries, Mesa's among them).
    assert!(
        report.kernels().is_empty()
            || report
                .kernels()
                .iter()
                .any(|k| k.kernel == "fused_update_regions"),
        "{report}"
    );
}

#[test]
fn fused_update_refuses_what_the_per_variable_updates_refuse() {
    let rt = common::builder().build().expect("a runtime");
    let cpu = rt.cpu().expect("CPU:0");
    let w = Tensor::from_slice_on(&[1.0f32, 2.0], &[2], &cpu).expect("w");
    let g = Tensor::from_slice_on(&[1.0f32], &[1], &cpu).expect("g");
    let sgd = UpdateRule::Sgd(SgdParams {
        lr: 0.1,
        momentum: 0.9,
        nesterov: false,
    });
    let mut table = UpdateTable::default();
    let no_velocity = [UpdateVar {
        w: &w,
        g: &w.clone(),
        slots: [None; 3],
    }];
    assert!(ops::fused_update(&no_velocity, sgd, None, &mut table).is_err());
    let v = Tensor::from_slice_on(&[0.0f32, 0.0], &[2], &cpu).expect("v");
    let wrong_shape = [UpdateVar {
        w: &w,
        g: &g,
        slots: [Some(&v), None, None],
    }];
    assert!(ops::fused_update(&wrong_shape, sgd, None, &mut table).is_err());
    assert_eq!(w.to_vec::<f32>().expect("w"), [1.0, 2.0], "nothing changed");
}
