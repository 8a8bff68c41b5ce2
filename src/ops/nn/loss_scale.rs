//! Dynamic loss scaling decided on the variables' device: the state (a four-word int32
//! tensor), the finiteness check over every gradient of a fused update, the update that
//! applies nothing after a non-finite step and unscales by the state's scale, the loss
//! gradient's seed, and Keras' rules moving the state. Nothing here reads back to the host.

use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::ops::gpu::nn as gn;
use crate::ops::nn_kernels::{FusedUpdate, ScaledUpdate, SCALED_RULES};
use crate::ops::spec::ScaleRules;
use crate::ops::{run, with_kernels};
use crate::placement::OpInfo;
use crate::tensor::{DType, Tensor};

use super::op;
use super::optimizer::{prepare_fused_update_for, UpdateRule, UpdateTable, UpdateVar};

const CHECK: OpInfo = op("IsFinite", gn::LOSS_SCALE_CHECK);
const FUSED_APPLY_SCALED: OpInfo = op("FusedApplyGradients", gn::FUSED_APPLY_SCALED);
const SEED: OpInfo = op("ScaleLoss", gn::LOSS_SCALE_SEED_KERNELS);
const ADVANCE: OpInfo = op("LossScaleUpdate", gn::LOSS_SCALE_UPDATE);
const UNSCALE: OpInfo = op("LossScaleUnscale", gn::LOSS_SCALE_UNSCALE_KERNELS);

/// A new loss-scale state on `device`: no flag, exponent 0 (the scale is the host's base),
/// `counter` finite steps in a row and `iterations` applied steps (kept modulo 2^32).
pub(crate) fn loss_scale_state(
    device: &LogicalDevice,
    counter: u64,
    iterations: u64,
) -> Result<Tensor> {
    let words = [
        0,
        0,
        u32::try_from(counter).unwrap_or(u32::MAX) as i32,
        iterations as u32 as i32,
    ];
    Tensor::from_slice_on(&words, &[4], device)
}

/// `op` on `home` (where the state and the variables are), whatever the scope says.
fn on_home<R>(
    op: &'static OpInfo,
    home: &LogicalDevice,
    input: &Tensor,
    f: impl FnOnce(&LogicalDevice) -> Result<R>,
) -> Result<R> {
    if let Err(missing) = crate::placement::can_run(home, op) {
        return Err(Error::Unsupported {
            op: op.name,
            device: home.full_name().to_string(),
            missing,
        });
    }
    let _scope = home.scope();
    run(op, &[input], |device, _| {
        if !device.same_device(home) {
            return Err(Error::Unsupported {
                op: op.name,
                device: home.full_name().to_string(),
                missing: format!("it was placed on {} instead", device.name()),
            });
        }
        f(device)
    })
}

/// The state checked: four int32 words on `home`.
fn check_state(op: &str, state: &Tensor, home: &LogicalDevice) -> Result<()> {
    if state.dtype() != DType::I32 || state.len() != 4 || !state.device_handle().same_device(home) {
        return Err(Error::InvalidArgument(format!(
            "{op}: the loss-scale state must be four int32 words on {}, got {state:?}",
            home.name()
        )));
    }
    Ok(())
}

/// One step of a loss-scaled fused update over `vars` (one device): the finiteness check of
/// every gradient into the state's flag, then the update (nothing when the flag is set; the
/// gradients times `inverse_base * 2^-e`; `rules[j]` when the state counts `t_base + j`
/// iterations), clipped first with `clip_value` as [`super::fused_update_clipped`] clips them.
/// With `unscaled`, the gradients were unscaled (and checked) by
/// [`loss_scale_unscale`] already: no check, and the update takes them as they are. Call
/// [`loss_scale_advance`] after it. The table is brought up to date first, the only
/// allocation.
///
/// # Errors
/// As [`super::fused_update`]; no rules or more than 16; a state that is not four int32 words
/// on the variables' device.
pub(crate) fn fused_update_scaled(
    vars: &[UpdateVar<'_>],
    (rules, t_base): (&[UpdateRule], u64),
    (weight_decay, clip_value): (Option<f32>, Option<f32>),
    table: &mut UpdateTable,
    (state, inverse_base): (&Tensor, f32),
    unscaled: bool,
) -> Result<()> {
    let Some(&rule) = rules.first() else {
        return Err(Error::InvalidArgument(
            "FusedApplyGradients: a loss-scaled update without rules".into(),
        ));
    };
    if rules.len() > SCALED_RULES {
        return Err(Error::InvalidArgument(format!(
            "FusedApplyGradients: a loss-scaled update takes at most {SCALED_RULES} rules, got {}",
            rules.len()
        )));
    }
    let Some(home) = prepare_fused_update_for(vars, &rule, table, true)? else {
        return Ok(());
    };
    check_state(FUSED_APPLY_SCALED.name, state, &home)?;
    let f = FusedUpdate {
        rule,
        weight_decay,
        vars,
        table: table.tensor(),
        clip_value,
        scaled: Some(ScaledUpdate {
            state,
            rules,
            t_base: t_base as u32,
            inverse_base,
            unscale: !unscaled,
        }),
    };
    if !unscaled {
        on_home(&CHECK, &home, vars[0].g, |device| {
            with_kernels(device, |_, nk| nk.loss_scale_check(&f, state))
        })?;
    }
    on_home(&FUSED_APPLY_SCALED, &home, vars[0].w, |device| {
        with_kernels(device, |_, nk| nk.fused_update(&f))
    })
}

/// `x = x * factor * 2^e` in place (`e` the state's exponent): the loss gradient times the
/// scale `factor * 2^e`, read on the device. `x` is float32 on the state's device.
///
/// # Errors
/// A tensor that is not float32 or not on the state's device; a state that is not four int32
/// words.
pub(crate) fn loss_scale_seed(x: &Tensor, factor: f32, state: &Tensor) -> Result<()> {
    let home = state.device_handle().clone();
    check_state(SEED.name, state, &home)?;
    if x.dtype() != DType::F32 || !x.device_handle().same_device(&home) {
        return Err(Error::InvalidArgument(format!(
            "{}: the loss gradient must be float32 on {}, got {x:?}",
            SEED.name,
            home.name()
        )));
    }
    on_home(&SEED, &home, x, |device| {
        with_kernels(device, |_, nk| nk.loss_scale_seed(x, factor, state))
    })
}

/// `g` unscaled by the state's scale into a new tensor (`g * inverse_base * 2^-e`, exactly
/// `g / scale`'s inverse product as the host path computes it), setting the state's flag when
/// some element of `g` is not finite: the check of a step whose gradients are clipped after
/// unscaling. `g` is float32 on the state's device.
///
/// # Errors
/// A gradient that is not float32 or not on the state's device; a state that is not four int32
/// words; out of memory.
pub(crate) fn loss_scale_unscale(g: &Tensor, inverse_base: f32, state: &Tensor) -> Result<Tensor> {
    let home = state.device_handle().clone();
    check_state(UNSCALE.name, state, &home)?;
    if g.dtype() != DType::F32 || !g.device_handle().same_device(&home) {
        return Err(Error::InvalidArgument(format!(
            "{}: the gradient must be float32 on {}, got {g:?}",
            UNSCALE.name,
            home.name()
        )));
    }
    on_home(&UNSCALE, &home, g, |device| {
        let out = Tensor::uninit(g.shape(), DType::F32, device)?;
        with_kernels(device, |_, nk| {
            nk.loss_scale_unscale(g, &out, inverse_base, state)
        })?;
        Ok(out)
    })
}

/// Moves the state after a step's update by Keras' rules (see
/// [`NnKernels::loss_scale_advance`](crate::ops::NnKernels::loss_scale_advance)).
///
/// # Errors
/// A state that is not four int32 words; device errors.
pub(crate) fn loss_scale_advance(state: &Tensor, rules: ScaleRules) -> Result<()> {
    let home = state.device_handle().clone();
    check_state(ADVANCE.name, state, &home)?;
    on_home(&ADVANCE, &home, state, |device| {
        with_kernels(device, |_, nk| nk.loss_scale_advance(state, rules))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step that failed after its check left the flag set: the next step's seed clears it,
    /// so that step is not skipped; the rules then count it.
    #[test]
    fn the_seed_clears_a_flag_a_failed_step_left() -> Result<()> {
        let rt = crate::runtime::Runtime::builder().build()?;
        let cpu = rt.cpu()?;
        let state = loss_scale_state(&cpu, 0, 5)?;
        state.write_words(&[1, 0, 0, 5])?;
        let g = Tensor::from_slice_on(&[1.0f32, -2.0], &[2], &cpu)?;
        loss_scale_seed(&g, 4.0, &state)?;
        assert_eq!(g.to_vec::<f32>()?, [4.0, -8.0]);
        assert_eq!(state.to_vec::<i32>()?, [0, 0, 0, 5]);
        loss_scale_advance(&state, ScaleRules::new(2000, 4.0))?;
        assert_eq!(state.to_vec::<i32>()?, [0, 0, 1, 6], "counted, not skipped");
        Ok(())
    }

    /// The update takes the rule of the device's own iteration count: with the host's last
    /// count `t_base` and the device three steps past it, the fourth rule's learning rate,
    /// the gradient unscaled by `1 / base * 2^-e`; on every device.
    #[test]
    fn the_update_picks_the_rule_of_the_devices_count() -> Result<()> {
        use crate::ops::spec::SgdParams;
        let rt = crate::runtime::Runtime::builder().build()?;
        let mut devices = vec![rt.cpu()?];
        devices.extend(rt.list_logical_devices(crate::DeviceKind::Gpu)?);
        let required = std::env::var("ANYGPU_REQUIRE_ADAPTER").as_deref() == Ok("1");
        assert!(
            !required || devices.len() > 1,
            "ANYGPU_REQUIRE_ADAPTER=1 but no GPU"
        );
        for dev in &devices {
            let t_base = 10u64;
            let state = loss_scale_state(dev, 0, t_base + 3)?;
            // e = 2: the scale is base * 4.
            state.write_words(&[0, 2, 0, (t_base + 3) as u32])?;
            let (w0, g0) = ([1.0f32, -3.0, 0.5], [8.0f32, 16.0, -4.0]);
            let w = Tensor::from_slice_on(&w0, &[3], dev)?;
            let g = Tensor::from_slice_on(&g0, &[3], dev)?;
            let lr = |j: usize| 0.125 * (j + 1) as f32;
            let rules: Vec<UpdateRule> = (0..5)
                .map(|j| {
                    UpdateRule::Sgd(SgdParams {
                        lr: lr(j),
                        momentum: 0.0,
                        nesterov: false,
                    })
                })
                .collect();
            let vars = [UpdateVar {
                w: &w,
                g: &g,
                slots: [None; 3],
            }];
            let mut table = UpdateTable::default();
            let base = 2.0f32;
            let args = ((&state, 1.0 / base), false);
            fused_update_scaled(
                &vars,
                (&rules, t_base),
                (None, None),
                &mut table,
                args.0,
                args.1,
            )?;
            // g / (base * 4) = g / 8, times the fourth rule's rate.
            let expected: Vec<f32> = w0
                .iter()
                .zip(&g0)
                .map(|(w, g)| w - lr(3) * (g / 8.0))
                .collect();
            assert_eq!(w.to_vec::<f32>()?, expected, "{}", dev.name());
            // A count past the rules is refused on the CPU, and skipped nowhere silently.
            if dev.device_type() == crate::DeviceKind::Cpu {
                state.write_words(&[0, 0, 0, (t_base + 5) as u32])?;
                let err = fused_update_scaled(
                    &vars,
                    (&rules, t_base),
                    (None, None),
                    &mut table,
                    args.0,
                    false,
                );
                assert!(err.is_err(), "a count past the rules");
            }
        }
        Ok(())
    }
}
