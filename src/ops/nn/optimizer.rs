//! Optimizer updates in place on the parameter's device (SGD, momentum, Adam, RMSprop,
//! weight decay) and gradient clipping.

use crate::error::{Error, Result};
use crate::ops::gpu::nn as gn;
use crate::ops::nn_kernels::{FusedUpdate, NnKernels};
pub use crate::ops::nn_kernels::{UpdateRule, UpdateVar};
use crate::ops::spec::{AdamParams, SgdParams};
use crate::ops::spec::{ClipMode, RmspropParams};
use crate::ops::{run, with_kernels};
use crate::placement::OpInfo;
use crate::tensor::{DType, Tensor};

use super::{expect_f32, mismatch, op};

const SGD_UPDATE: OpInfo = op("ResourceApplyGradientDescent", gn::SGD_UPDATE);
const MOMENTUM_UPDATE: OpInfo = op("ResourceApplyKerasMomentum", gn::MOMENTUM_UPDATE);
const ADAM_UPDATE: OpInfo = op("ResourceApplyAdam", gn::ADAM_UPDATE);
// ---- optimizers: RMSprop, weight decay, gradient clipping ----
const RMSPROP_UPDATE: OpInfo = op("ResourceApplyRMSProp", gn::RMSPROP_UPDATE);
const CENTERED_RMSPROP_UPDATE: OpInfo = op("ResourceApplyCenteredRMSProp", gn::RMSPROP_UPDATE);
const WEIGHT_DECAY: OpInfo = op("AssignSubVariableOp", gn::WEIGHT_DECAY_UPDATE);
const CLIP_BY_NORM: OpInfo = op("ClipByNorm", gn::CLIP);
const CLIP_BY_VALUE: OpInfo = op("ClipByValue", gn::CLIP);
// ---- fused optimizer update ----
const FUSED_APPLY: OpInfo = op("FusedApplyGradients", gn::FUSED_APPLY);

/// Whether two tensors are views of the same memory. Empty ones count too: on the CPU a
/// variable's write guard and its own gradient's read guard would deadlock whatever the size.
fn same_memory(a: &Tensor, b: &Tensor) -> bool {
    a.shares_storage(b)
}

/// Runs an in-place update of `w` (and its `slots`) on `w`'s device, whatever the current
/// scope says: parameters never move (TensorFlow colocates `ResourceApply*` ops with their
/// variable). The gradient is brought to that device; the placement is logged as usual.
fn update_in_place(
    info: &'static OpInfo,
    w: &Tensor,
    g: &Tensor,
    slots: &[&Tensor],
    f: impl FnOnce(&dyn NnKernels, &Tensor) -> Result<()> + Send,
) -> Result<()> {
    let name = info.name;
    check_variable(name, w, g, slots)?;
    let home = w.device_handle();
    if let Err(missing) = crate::placement::can_run(home, info) {
        return Err(Error::Unsupported {
            op: name,
            device: home.full_name().to_string(),
            missing,
        });
    }
    let _scope = home.scope();
    run(info, &[w, g], |device, moved| {
        if !device.same_device(home) {
            return Err(Error::Unsupported {
                op: name,
                device: home.full_name().to_string(),
                missing: format!("the update was placed on {} instead", device.name()),
            });
        }
        with_kernels(device, |_, nk| f(nk, &moved[1]))
    })
}

/// What every in-place update checks of one variable: float32, the gradient and the slots of
/// its shape, no two of them sharing memory, the slots on the variable's device.
fn check_variable(name: &'static str, w: &Tensor, g: &Tensor, slots: &[&Tensor]) -> Result<()> {
    expect_f32(name, &[w, g])?;
    expect_f32(name, slots)?;
    for t in std::iter::once(&g).chain(slots) {
        if t.shape() != w.shape() {
            return Err(mismatch(
                name,
                w.shape(),
                t.shape(),
                ": the gradient and the optimizer slots must have the variable's shape",
            ));
        }
    }
    // Every written tensor must own its memory: a write lock and a read of the same storage
    // would deadlock on the CPU, and the kernels read each element once before writing it.
    let written: Vec<&Tensor> = std::iter::once(w).chain(slots.iter().copied()).collect();
    for (i, a) in written.iter().enumerate() {
        for b in written[i + 1..].iter().chain(std::iter::once(&g)) {
            if same_memory(a, b) {
                return Err(Error::InvalidArgument(format!(
                    "{name}: the variable, its gradient and its slots must be distinct tensors"
                )));
            }
        }
    }
    let home = w.device_handle();
    for s in slots {
        if !s.device_handle().same_device(home) {
            return Err(Error::InvalidArgument(format!(
                "{name}: an optimizer slot is on {} but its variable is on {}; slots live with \
                 their variable",
                s.device_handle().name(),
                home.name()
            )));
        }
    }
    Ok(())
}

/// One Keras SGD step on `w`, in place, on `w`'s device (`tf.raw_ops.ResourceApplyGradientDescent`,
/// or `ResourceApplyKerasMomentum` with a velocity): without momentum `w -= lr * g`; with a
/// `velocity` slot `v = momentum * v - lr * g; w += v` (Nesterov: `w += momentum * v - lr * g`).
/// `g` is copied to `w`'s device if it is elsewhere; the velocity must already be there.
///
/// # Errors
/// Wrong dtypes or shapes; a momentum without a velocity slot; a velocity on another device;
/// `w`, `g` and the velocity sharing memory.
pub fn sgd_update(w: &Tensor, g: &Tensor, velocity: Option<&Tensor>, p: &SgdParams) -> Result<()> {
    match velocity {
        None if p.momentum != 0.0 => Err(Error::InvalidArgument(format!(
            "{}: momentum {} needs a velocity slot",
            MOMENTUM_UPDATE.name, p.momentum
        ))),
        None => update_in_place(&SGD_UPDATE, w, g, &[], |nk, g| nk.sgd(w, g, p)),
        Some(v) => update_in_place(&MOMENTUM_UPDATE, w, g, &[v], |nk, g| {
            nk.sgd_momentum(w, g, v, p)
        }),
    }
}

/// One Keras 3 Adam step on `w`, in place, on `w`'s device (`tf.raw_ops.ResourceApplyAdam`):
/// `m += (g - m)(1 - β1); v += (g² - v)(1 - β2); w -= α m / (√v + ε)` with
/// `α = lr √(1 - β2^t) / (1 - β1^t)` (computed in f64), `t = p.step`, 1-based.
///
/// # Errors
/// Wrong dtypes or shapes; step 0; slots on another device; tensors sharing memory.
pub fn adam_update(w: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, p: &AdamParams) -> Result<()> {
    if p.step == 0 {
        return Err(Error::InvalidArgument(format!(
            "{}: the step count is 1-based; step 0 has no bias correction",
            ADAM_UPDATE.name
        )));
    }
    update_in_place(&ADAM_UPDATE, w, g, &[m, v], |nk, g| nk.adam(w, g, m, v, p))
}

// ---- optimizers: RMSprop, weight decay, gradient clipping ----

/// One Keras 3 RMSprop step on `w`, in place, on `w`'s device
/// (`tf.raw_ops.ResourceApplyRMSProp`, or `ResourceApplyCenteredRMSProp` with an `average`
/// slot): `v = ρ v + (1 - ρ) g²`; centered `a = ρ a + (1 - ρ) g` and `d = v - a² + ε`, else
/// `d = v + ε`; `Δ = lr g / √d`; with a `momentum` slot `m = μ m + Δ; w -= m`, else `w -= Δ`.
///
/// # Errors
/// Wrong dtypes or shapes; `centered` without an average slot (or the reverse), a momentum
/// without its slot; slots on another device; tensors sharing memory.
pub fn rmsprop_update(
    w: &Tensor,
    g: &Tensor,
    v: &Tensor,
    average: Option<&Tensor>,
    momentum: Option<&Tensor>,
    p: &RmspropParams,
) -> Result<()> {
    let info = if p.centered {
        &CENTERED_RMSPROP_UPDATE
    } else {
        &RMSPROP_UPDATE
    };
    if p.centered != average.is_some() || (p.momentum != 0.0) != momentum.is_some() {
        return Err(Error::InvalidArgument(format!(
            "{}: centered={} and momentum={} need {} average-gradient and {} momentum slot",
            info.name,
            p.centered,
            p.momentum,
            if p.centered { "an" } else { "no" },
            if p.momentum != 0.0 { "a" } else { "no" },
        )));
    }
    let slots: Vec<&Tensor> = std::iter::once(v).chain(average).chain(momentum).collect();
    update_in_place(info, w, g, &slots, |nk, g| {
        nk.rmsprop(w, g, v, average, momentum, p)
    })
}

/// Keras' decoupled weight decay on `w`, in place, on `w`'s device: `w -= w * wd * lr`
/// (`optimizer._apply_weight_decay`, run before the update with the step's learning rate).
///
/// # Errors
/// A `w` that is not float32; device errors.
pub fn weight_decay_update(w: &Tensor, wd: f32, lr: f32) -> Result<()> {
    let name = WEIGHT_DECAY.name;
    expect_f32(name, &[w])?;
    let home = w.device_handle();
    let _scope = home.scope();
    run(&WEIGHT_DECAY, &[w], |device, _| {
        if !device.same_device(home) {
            return Err(Error::Unsupported {
                op: name,
                device: home.full_name().to_string(),
                missing: format!("the update was placed on {} instead", device.name()),
            });
        }
        with_kernels(device, |_, nk| nk.weight_decay(w, wd, lr))
    })
}

/// `g` clipped as Keras 3's optimizers clip it, in a new tensor on `g`'s device:
/// [`ClipMode::Norm`] (`tf.clip_by_norm`, the norm of `g` itself) and
/// [`ClipMode::GlobalNorm`] (the scale of `clip_by_global_norm`) take their norm from
/// `sum_squares`, a one-element tensor holding the sum of squares (`g`'s own, or every
/// gradient's), read on the device: no host wait. [`ClipMode::Value`] ignores it.
///
/// # Errors
/// A norm mode without `sum_squares`, or one that is not one element; a clip value that is not
/// a finite number > 0; dtypes other than float32.
pub fn clip_gradient(g: &Tensor, sum_squares: Option<&Tensor>, mode: ClipMode) -> Result<Tensor> {
    let (info, c) = match mode {
        ClipMode::Norm(c) | ClipMode::GlobalNorm(c) => (&CLIP_BY_NORM, c),
        ClipMode::Value(c) => (&CLIP_BY_VALUE, c),
    };
    if !(c.is_finite() && c > 0.0) {
        return Err(Error::InvalidArgument(format!(
            "{}: the clip value must be a finite number > 0, got {c}",
            info.name
        )));
    }
    let ss = match (mode, sum_squares) {
        (ClipMode::Value(_), _) => None,
        (_, Some(t)) if t.len() == 1 => Some(t),
        (_, other) => {
            return Err(Error::InvalidArgument(format!(
                "{}: needs the sum of squares as one element, got {}",
                info.name,
                other.map_or("none".to_string(), |t| format!("shape {:?}", t.shape()))
            )))
        }
    };
    let mut inputs = vec![g];
    inputs.extend(ss);
    expect_f32(info.name, &inputs)?;
    let _scope = g.device_handle().scope();
    run(info, &inputs, |device, moved| {
        let out = Tensor::uninit(g.shape(), DType::F32, device)?;
        with_kernels(device, |_, nk| nk.clip(&moved[0], moved.get(1), &out, mode))?;
        Ok(out)
    })
}

// ---- fused optimizer update ----

/// What a GPU's fused update reads besides the tensors: a table of every variable's chunks
/// and where they lie. Keep one per device across steps: a step whose tensors lie where the
/// last one's did (the allocator repeats a step's ranges) reuses the table as it is; otherwise
/// it is overwritten in place. Only the first step, or one with other variables, allocates
/// one: a new allocation every step would move the next step's gradients, and the tables would
/// never repeat (nor the bind groups over them).
#[derive(Debug, Default)]
pub struct UpdateTable {
    words: Vec<u32>,
    tensor: Option<Tensor>,
}

impl UpdateTable {
    /// The table's tensor (none on the CPU, or before the first update).
    pub(crate) fn tensor(&self) -> Option<&Tensor> {
        self.tensor.as_ref()
    }
}

impl UpdateTable {
    /// Makes the table hold `words` on `device`: as it is, overwritten (an upload, after the
    /// commands recorded so far, which may still read the old table), or, at another length,
    /// in a new tensor.
    fn set(&mut self, words: Vec<u32>, device: &crate::device::LogicalDevice) -> Result<()> {
        match &self.tensor {
            Some(_) if self.words == words => return Ok(()),
            Some(t) if t.len() == words.len() && t.device_handle().same_device(device) => {
                t.write_words(&words)?;
            }
            _ => {
                let ints: &[i32] = bytemuck::cast_slice(&words);
                self.tensor = Some(Tensor::from_slice_on(ints, &[ints.len()], device)?);
            }
        }
        self.words = words;
        Ok(())
    }
}

/// Every variable of `vars` (all on one device) updated in place as `rule` says, after the
/// decoupled weight decay `w -= w * wd * lr` when `weight_decay` is set: on a GPU one dispatch
/// over all of them (one per three arena regions their tensors span), on the CPU one pass per
/// variable. The results are those of [`weight_decay_update`] followed by [`sgd_update`],
/// [`adam_update`] or [`rmsprop_update`] per variable, bit for bit (the same expressions, in
/// the same order, per element).
///
/// ```
/// use anygpu::ops::spec::SgdParams;
/// use anygpu::ops::{fused_update, UpdateRule, UpdateTable, UpdateVar};
/// use anygpu::Tensor;
/// let w = [Tensor::from_vec(vec![1.0f32, 2.0], &[2])?, Tensor::from_vec(vec![3.0f32], &[1])?];
/// let g = [Tensor::from_vec(vec![1.0f32, 1.0], &[2])?, Tensor::from_vec(vec![-2.0f32], &[1])?];
/// let vars: Vec<UpdateVar> = w
///     .iter()
///     .zip(&g)
///     .map(|(w, g)| UpdateVar { w, g, slots: [None; 3] })
///     .collect();
/// let sgd = UpdateRule::Sgd(SgdParams { lr: 0.5, momentum: 0.0, nesterov: false });
/// fused_update(&vars, sgd, None, &mut UpdateTable::default())?;
/// assert_eq!(w[0].to_vec::<f32>()?, [0.5, 1.5]);
/// assert_eq!(w[1].to_vec::<f32>()?, [4.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// What the per-variable updates refuse (dtypes, shapes, shared memory, slots elsewhere or
/// missing, Adam's step 0); variables on more than one device, or a gradient on another
/// device than its variable; out of memory for the table.
pub fn fused_update(
    vars: &[UpdateVar<'_>],
    rule: UpdateRule,
    weight_decay: Option<f32>,
    table: &mut UpdateTable,
) -> Result<()> {
    fused_update_clipped(vars, rule, (weight_decay, None), table)
}

/// [`fused_update`] with Keras' `clipvalue` (each gradient element clipped to `[-c, c]`, as
/// [`clip_gradient`] clips it) folded in: `(weight_decay, clip_value)`.
///
/// # Errors
/// As [`fused_update`]; a clip value that is not a finite number > 0.
pub(crate) fn fused_update_clipped(
    vars: &[UpdateVar<'_>],
    rule: UpdateRule,
    (weight_decay, clip_value): (Option<f32>, Option<f32>),
    table: &mut UpdateTable,
) -> Result<()> {
    if let Some(c) = clip_value.filter(|c| !(c.is_finite() && *c > 0.0)) {
        return Err(Error::InvalidArgument(format!(
            "{}: the clip value must be a finite number > 0, got {c}",
            CLIP_BY_VALUE.name
        )));
    }
    let Some(home) = prepare_fused_update(vars, &rule, table)? else {
        return Ok(());
    };
    let name = FUSED_APPLY.name;
    if let Err(missing) = crate::placement::can_run(&home, &FUSED_APPLY) {
        return Err(Error::Unsupported {
            op: name,
            device: home.full_name().to_string(),
            missing,
        });
    }
    let _scope = home.scope();
    let table = table.tensor.as_ref();
    run(&FUSED_APPLY, &[vars[0].w], |device, _| {
        if !device.same_device(&home) {
            return Err(Error::Unsupported {
                op: name,
                device: home.full_name().to_string(),
                missing: format!("the update was placed on {} instead", device.name()),
            });
        }
        let f = FusedUpdate {
            rule,
            weight_decay,
            vars,
            table,
            clip_value,
            scaled: None,
        };
        with_kernels(device, |_, nk| nk.fused_update(&f))
    })
}

/// Checks a fused update and brings its table up to date (the only allocation of the update,
/// and only when the tensors moved since the last step): call it for every device before the
/// first [`fused_update`] of a step, so that a failure changes no variable. Returns the
/// variables' device, `None` when there are none.
///
/// # Errors
/// As [`fused_update`].
pub fn prepare_fused_update(
    vars: &[UpdateVar<'_>],
    rule: &UpdateRule,
    table: &mut UpdateTable,
) -> Result<Option<crate::device::LogicalDevice>> {
    prepare_fused_update_for(vars, rule, table, false)
}

/// [`prepare_fused_update`] for the plain update or, with `scaled`, the loss-scaled one
/// (whose dispatches take two regions at most).
pub(crate) fn prepare_fused_update_for(
    vars: &[UpdateVar<'_>],
    rule: &UpdateRule,
    table: &mut UpdateTable,
    scaled: bool,
) -> Result<Option<crate::device::LogicalDevice>> {
    let name = FUSED_APPLY.name;
    let Some(first) = vars.first() else {
        return Ok(None);
    };
    let home = first.w.device_handle();
    // Every variable has the rule's slots (the GPU picks its kernel once for all of them).
    let (need, op) = match rule {
        UpdateRule::Sgd(p) => ([p.momentum != 0.0, false, false], rule.name()),
        UpdateRule::Adam(p) if p.step == 0 => {
            return Err(Error::InvalidArgument(format!(
                "{}: the step count is 1-based; step 0 has no bias correction",
                ADAM_UPDATE.name
            )))
        }
        UpdateRule::Adam(_) => ([true, true, false], rule.name()),
        UpdateRule::RmsProp(p) => ([true, p.centered, p.momentum != 0.0], rule.name()),
    };
    for v in vars {
        let slots: Vec<&Tensor> = v.slots.iter().flatten().copied().collect();
        check_variable(name, v.w, v.g, &slots)?;
        if v.slots.iter().map(Option::is_some).ne(need) {
            return Err(Error::InvalidArgument(format!(
                "{name}: {op} takes the slots {need:?} (velocity/moments, average, momentum), \
                 a variable of shape {:?} has {:?}",
                v.w.shape(),
                v.slots.map(|s| s.is_some())
            )));
        }
        for t in [v.w, v.g] {
            if !t.device_handle().same_device(home) {
                return Err(Error::InvalidArgument(format!(
                    "{name}: a variable or gradient is on {} but the first variable is on {}; \
                     one fused update per device, with each gradient on its variable's device",
                    t.device_handle().name(),
                    home.name()
                )));
            }
        }
    }
    if let Some(words) = gn::update_table(vars, scaled).filter(|w| !w.is_empty()) {
        table.set(words, home)?;
    }
    Ok(Some(home.clone()))
}
