//! Dynamic loss scaling decided on a GPU (`optim.wgsl`'s `finite_check`, `fused_update_ls`,
//! `loss_scale_seed`, `loss_scale_advance`): the finiteness check over every gradient of a
//! fused update, the update that applies nothing after a non-finite step and unscales by the
//! state's scale, the loss gradient's seed and Keras' rules, all reading the state on the
//! device. Nothing waits.

use crate::device::logical::GpuRange;
use crate::error::{Error, Result};
use crate::ops::gpu::grid_1d;
use crate::ops::gpu::kernels::GpuKernels;
use crate::ops::gpu::regions::Group;
use crate::ops::nn_kernels::{FusedUpdate, ScaledUpdate, UpdateRule, SCALED_RULES};
use crate::ops::spec::ScaleRules;
use crate::tensor::Tensor;

use super::kernel_lists::*;
use super::optim::{adam_alpha, plan, OptimParams, SCALED_REGIONS};
use super::u;

/// The state's range, checked: four words on this GPU.
fn state_range(state: &Tensor) -> Result<GpuRange<'_>> {
    state.gpu_range().filter(|r| r.size >= 16).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "LossScaleOptimizer: the loss-scale state must be four words on the GPU, got \
                 {state:?}"
        ))
    })
}

impl GpuKernels<'_> {
    /// `finite_check` over the gradients of `f`, one dispatch per group of two regions.
    pub(super) fn loss_scale_check_impl(&self, f: &FusedUpdate<'_>, state: &Tensor) -> Result<()> {
        let ls = state_range(state)?;
        let Some((words, groups)) = plan(f.vars, SCALED_REGIONS) else {
            return Err(Error::InvalidArgument(
                "IsFinite: a gradient is not on this GPU".into(),
            ));
        };
        let table = f.table.and_then(Tensor::gpu_range);
        let Some(table) = table.filter(|t| t.size >= (words.len() * 4) as u64) else {
            return Err(Error::InvalidArgument(format!(
                "IsFinite: the update table holds fewer than the {} words of its gradients",
                words.len()
            )));
        };
        let mut params = OptimParams::default();
        let mut base = 0;
        for g in &groups {
            params.n = u(g.entries);
            params.base = u(base);
            base += g.entries;
            let (Some(r0), Some(r1)) = (g.region(0), g.region(1)) else {
                continue;
            };
            let grid = grid_1d(g.entries, 1);
            self.launch_ranges(FINITE_CHECK, &params, &[table, r0, r1, ls], grid)?;
        }
        Ok(())
    }

    /// The loss-scaled fused update over `groups` (planned with two regions at most): `params`
    /// carry the rule's constants; the table of rules goes in with them.
    pub(super) fn fused_update_scaled(
        &self,
        s: &ScaledUpdate<'_>,
        mut params: OptimParams,
        table: GpuRange<'_>,
        groups: &[Group<'_>],
    ) -> Result<()> {
        let ls = state_range(s.state)?;
        if s.rules.is_empty() || s.rules.len() > SCALED_RULES {
            return Err(Error::InvalidArgument(format!(
                "FusedApplyGradients: a loss-scaled update takes 1 to {SCALED_RULES} rules, got {}",
                s.rules.len()
            )));
        }
        for (j, rule) in s.rules.iter().enumerate() {
            params.lrs[j] = rule.learning_rate();
            params.alphas[j] = match rule {
                UpdateRule::Adam(p) => adam_alpha(p),
                _ => 0.0,
            };
        }
        params.unscale = u32::from(s.unscale);
        params.t_base = s.t_base;
        params.count = u(s.rules.len());
        params.inverse_base = s.inverse_base;
        let mut base = 0;
        for g in groups {
            params.n = u(g.entries);
            params.base = u(base);
            base += g.entries;
            let (Some(r0), Some(r1)) = (g.region(0), g.region(1)) else {
                continue;
            };
            let grid = grid_1d(g.entries, 1);
            if g.regions.len() == 1 {
                self.launch_ranges(FUSED_UPDATE_LS, &params, &[table, r0, ls], grid)?;
            } else {
                let ranges = [table, r0, r1, ls];
                self.launch_ranges(FUSED_UPDATE_LS_REGIONS, &params, &ranges, grid)?;
            }
        }
        Ok(())
    }

    /// `x = ldexp(x * factor, e)` in place.
    pub(super) fn loss_scale_seed_impl(
        &self,
        x: &Tensor,
        factor: f32,
        state: &Tensor,
    ) -> Result<()> {
        let n = x.len();
        let ls = state_range(state)?;
        let Some(xr) = x.gpu_range() else {
            return Ok(());
        };
        if n == 0 {
            return Ok(());
        }
        let params = OptimParams {
            n: u(n),
            factor,
            ..Default::default()
        };
        self.launch_ranges(LOSS_SCALE_SEED, &params, &[xr, ls], grid_1d(n, 256))
    }

    /// `out = g * ldexp(inverse_base, -e)`, flagging a `g` that is not finite.
    pub(super) fn loss_scale_unscale_impl(
        &self,
        g: &Tensor,
        out: &Tensor,
        inverse_base: f32,
        state: &Tensor,
    ) -> Result<()> {
        let n = g.len();
        let ls = state_range(state)?;
        let (Some(o), Some(gr)) = (out.gpu_range(), g.gpu_range()) else {
            return Ok(());
        };
        if n == 0 {
            return Ok(());
        }
        let params = OptimParams {
            n: u(n),
            inverse_base,
            ..Default::default()
        };
        // Bindings 1 (w: out), 2 (g), 10 (ls).
        self.launch_ranges(LOSS_SCALE_UNSCALE, &params, &[o, gr, ls], grid_1d(n, 256))
    }

    /// Keras' rules on the state, one invocation.
    pub(super) fn loss_scale_advance_impl(&self, state: &Tensor, rules: ScaleRules) -> Result<()> {
        let ls = state_range(state)?;
        let params = OptimParams {
            growth: u32::try_from(rules.growth_steps).unwrap_or(u32::MAX),
            e_min: rules.e_min,
            e_max: rules.e_max,
            ..Default::default()
        };
        self.launch_ranges(LOSS_SCALE_ADVANCE, &params, &[ls], [1, 1, 1])
    }
}
