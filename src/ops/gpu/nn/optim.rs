//! The optimizer updates and gradient clipping on a GPU (`optim.wgsl`), in place.

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::ops::gpu::grid_1d;
use crate::ops::gpu::kernels::GpuKernels;
use crate::ops::gpu::regions::{join, regions_of, Group};
use crate::ops::nn_kernels::{FusedUpdate, UpdateRule, UpdateVar, SCALED_RULES};
use crate::ops::spec::{AdamParams, SgdParams};
use crate::ops::spec::{ClipMode, RmspropParams};
use crate::tensor::Tensor;

use super::kernel_lists::*;
use super::u;

/// Adam's step size with the bias correction, computed in f64 as the CPU kernel and Keras
/// compute it.
pub(super) fn adam_alpha(p: &AdamParams) -> f32 {
    let t = i32::try_from(p.step).unwrap_or(i32::MAX);
    let (b1, b2) = (f64::from(p.beta1), f64::from(p.beta2));
    (f64::from(p.lr) * (1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t))) as f32
}

/// Mirror of `Params` in optim.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Default, Pod, Zeroable)]
pub(super) struct OptimParams {
    pub(super) n: u32,
    pub(super) lr: f32,
    pub(super) momentum: f32,
    pub(super) nesterov: u32,
    pub(super) alpha: f32,
    pub(super) one_minus_b1: f32,
    pub(super) one_minus_b2: f32,
    pub(super) eps: f32,
    pub(super) rho: f32,
    pub(super) one_minus_rho: f32,
    pub(super) wd: f32,
    pub(super) clip: f32,
    pub(super) inverse_clip: f32,
    pub(super) mode: u32,
    pub(super) kind: u32,
    pub(super) base: u32,
    // ---- loss scaling on the device ----
    pub(super) unscale: u32,
    pub(super) t_base: u32,
    pub(super) count: u32,
    pub(super) inverse_base: f32,
    pub(super) factor: f32,
    pub(super) growth: u32,
    pub(super) clip_value: u32,
    pub(super) e_min: i32,
    pub(super) e_max: i32,
    pub(super) _pad: [u32; 3],
    pub(super) lrs: [f32; SCALED_RULES],
    pub(super) alphas: [f32; SCALED_RULES],
}

impl GpuKernels<'_> {
    pub(super) fn sgd_impl(&self, w: &Tensor, g: &Tensor, p: &SgdParams) -> Result<()> {
        let n = w.len();
        if n == 0 {
            return Ok(());
        }
        let params = OptimParams {
            n: u(n),
            lr: p.lr,
            ..Default::default()
        };
        self.launch(SGD, &params, &[w, g], grid_1d(n, 256))
    }

    pub(super) fn sgd_momentum_impl(
        &self,
        w: &Tensor,
        g: &Tensor,
        v: &Tensor,
        p: &SgdParams,
    ) -> Result<()> {
        let n = w.len();
        if n == 0 {
            return Ok(());
        }
        let params = OptimParams {
            n: u(n),
            lr: p.lr,
            momentum: p.momentum,
            nesterov: u32::from(p.nesterov),
            ..Default::default()
        };
        self.launch(SGD_MOMENTUM, &params, &[w, g, v], grid_1d(n, 256))
    }

    pub(super) fn adam_impl(
        &self,
        w: &Tensor,
        g: &Tensor,
        m: &Tensor,
        v: &Tensor,
        p: &AdamParams,
    ) -> Result<()> {
        let n = w.len();
        if n == 0 {
            return Ok(());
        }
        let params = OptimParams {
            n: u(n),
            lr: p.lr,
            alpha: adam_alpha(p),
            one_minus_b1: 1.0 - p.beta1,
            one_minus_b2: 1.0 - p.beta2,
            eps: p.epsilon,
            ..Default::default()
        };
        self.launch(ADAM, &params, &[w, g, m, v], grid_1d(n, 256))
    }

    pub(super) fn rmsprop_impl(
        &self,
        w: &Tensor,
        g: &Tensor,
        v: &Tensor,
        average: Option<&Tensor>,
        momentum: Option<&Tensor>,
        p: &RmspropParams,
    ) -> Result<()> {
        let n = w.len();
        if n == 0 {
            return Ok(());
        }
        let params = OptimParams {
            n: u(n),
            lr: p.lr,
            momentum: p.momentum,
            eps: p.epsilon,
            rho: p.rho,
            one_minus_rho: (1.0 - f64::from(p.rho)) as f32,
            ..Default::default()
        };
        let grid = grid_1d(n, 256);
        match (average, momentum) {
            (None, None) => self.launch(RMSPROP, &params, &[w, g, v], grid),
            (None, Some(s)) => self.launch(RMSPROP_MOMENTUM, &params, &[w, g, v, s], grid),
            (Some(a), None) => self.launch(RMSPROP_CENTERED, &params, &[w, g, a, v], grid),
            (Some(a), Some(s)) => {
                self.launch(RMSPROP_CENTERED_MOMENTUM, &params, &[g, a, v, s], grid)?;
                self.launch(MOMENTUM_APPLY, &params, &[w, s], grid)
            }
        }
    }

    pub(super) fn weight_decay_impl(&self, w: &Tensor, wd: f32, lr: f32) -> Result<()> {
        let n = w.len();
        if n == 0 {
            return Ok(());
        }
        let params = OptimParams {
            n: u(n),
            lr,
            wd,
            ..Default::default()
        };
        self.launch(WEIGHT_DECAY, &params, &[w], grid_1d(n, 256))
    }

    pub(super) fn clip_impl(
        &self,
        g: &Tensor,
        sum_squares: Option<&Tensor>,
        out: &Tensor,
        mode: ClipMode,
    ) -> Result<()> {
        let n = g.len();
        if n == 0 {
            return Ok(());
        }
        let (clip, global) = match mode {
            ClipMode::Norm(c) => (c, false),
            ClipMode::GlobalNorm(c) => (c, true),
            ClipMode::Value(c) => (c, false),
        };
        let params = OptimParams {
            n: u(n),
            clip,
            inverse_clip: (1.0 / f64::from(clip)) as f32,
            mode: u32::from(global),
            ..Default::default()
        };
        let grid = grid_1d(n, 256);
        match (mode, sum_squares) {
            (ClipMode::Value(_), _) => self.launch(CLIP_VALUE, &params, &[out, g], grid),
            (_, Some(ss)) => self.launch(CLIP_NORM, &params, &[out, g, ss], grid),
            (_, None) => Err(Error::InvalidArgument(
                "ClipByNorm: no sum of squares to take the norm of".into(),
            )),
        }
    }
}

// ---- fused update: every variable of a step in one dispatch ----

/// Elements of one variable one workgroup of `fused_update` covers (4 per invocation, as a
/// vec4).
const CHUNK: usize = 1024;
/// Region bindings of `fused_update` (r0, r1, r2).
const REGIONS: usize = 3;

/// Region bindings of the loss-scaled entry points (r0, r1: the state takes the fourth storage
/// binding).
pub(super) const SCALED_REGIONS: usize = 2;

/// The table of a fused update over `vars` (see `fused_update` in optim.wgsl) and its groups:
/// consecutive entries share a dispatch while their tensors lie in at most `max_regions`
/// regions (three; two for the loss-scaled entry points). The variables go in the order of the
/// regions they use, not in `vars`' order: under memory growth a step's gradients are spread
/// over the arena's regions, and in model order neighbours rarely share theirs (the tutorial
/// CNN's loss-scaled update took 11 dispatches that way, 3 sorted). Each variable's update is
/// its own, so the order changes no result. `None` when a tensor is not on a GPU.
pub(super) fn plan<'a>(
    vars: &'a [UpdateVar<'a>],
    max_regions: usize,
) -> Option<(Vec<u32>, Vec<Group<'a>>)> {
    let mut placed = Vec::with_capacity(vars.len());
    for v in vars {
        let n = v.w.len();
        if n == 0 {
            continue;
        }
        let tensors = [Some(v.w), Some(v.g), v.slots[0], v.slots[1], v.slots[2]];
        let mut ranges = [None; 5];
        for (r, t) in ranges.iter_mut().zip(tensors) {
            if let Some(t) = t {
                *r = Some(t.gpu_range()?);
            }
        }
        let (mine, key) = regions_of(ranges.iter().flatten().map(|r| r.buffer));
        placed.push((key, n, ranges, mine));
    }
    // Stable: variables in the same regions keep the model's order.
    placed.sort_by(|a, b| a.0.cmp(&b.0));
    let mut words = Vec::new();
    let mut groups: Vec<Group<'a>> = Vec::new();
    for (_, n, ranges, mine) in placed {
        let group = join(&mut groups, &mine, max_regions);
        let mut offsets = [0u32; 5];
        let mut bits = 0u32;
        for (i, r) in ranges.iter().enumerate() {
            if let Some(r) = r {
                let region = group.index_of(r.buffer)?;
                // In vec4s: allocations are aligned to 256 bytes at least.
                offsets[i] = u((r.offset / 16) as usize);
                bits |= region << (2 * i);
            }
        }
        for start in (0..n).step_by(CHUNK) {
            let s = u(start / 4);
            words.extend_from_slice(&[
                u(CHUNK.min(n - start)),
                offsets[0] + s,
                offsets[1] + s,
                offsets[2] + s,
                offsets[3] + s,
                offsets[4] + s,
                bits,
                0,
            ]);
            group.entries += 1;
        }
    }
    Some((words, groups))
}

/// The table words of a fused update over `vars` on a GPU (`None` elsewhere): what
/// [`GpuKernels::fused_update_impl`] expects in `FusedUpdate::table`; `scaled` for the
/// loss-scaled entry points (at most two regions a dispatch).
pub(crate) fn update_table(vars: &[UpdateVar<'_>], scaled: bool) -> Option<Vec<u32>> {
    let regions = if scaled { SCALED_REGIONS } else { REGIONS };
    plan(vars, regions).map(|(words, _)| words)
}

impl GpuKernels<'_> {
    /// Every variable of `f` updated by one `fused_update` dispatch per group of regions.
    pub(super) fn fused_update_impl(&self, f: &FusedUpdate<'_>) -> Result<()> {
        let regions = if f.scaled.is_some() {
            SCALED_REGIONS
        } else {
            REGIONS
        };
        let Some((words, groups)) = plan(f.vars, regions) else {
            return Err(Error::InvalidArgument(
                "FusedApplyGradients: a variable, gradient or slot is not on this GPU".into(),
            ));
        };
        if groups.is_empty() {
            return Ok(());
        }
        let table = f.table.and_then(|t| t.gpu_range());
        let Some(table) = table.filter(|t| t.size >= (words.len() * 4) as u64) else {
            return Err(Error::InvalidArgument(format!(
                "FusedApplyGradients: the update table holds fewer than the {} words of its \
                 variables",
                words.len()
            )));
        };
        let first = &f.vars[0];
        let (kind, mut params) = match &f.rule {
            UpdateRule::Sgd(p) => (
                u32::from(first.slots[0].is_some()),
                OptimParams {
                    lr: p.lr,
                    momentum: p.momentum,
                    nesterov: u32::from(p.nesterov),
                    ..Default::default()
                },
            ),
            UpdateRule::Adam(p) => (
                2,
                OptimParams {
                    lr: p.lr,
                    alpha: adam_alpha(p),
                    one_minus_b1: 1.0 - p.beta1,
                    one_minus_b2: 1.0 - p.beta2,
                    eps: p.epsilon,
                    ..Default::default()
                },
            ),
            UpdateRule::RmsProp(p) => (
                3 + u32::from(p.centered) + 2 * u32::from(p.momentum != 0.0),
                OptimParams {
                    lr: p.lr,
                    momentum: p.momentum,
                    eps: p.epsilon,
                    rho: p.rho,
                    one_minus_rho: (1.0 - f64::from(p.rho)) as f32,
                    ..Default::default()
                },
            ),
        };
        params.kind = kind;
        if let Some(wd) = f.weight_decay {
            params.wd = wd;
            params.mode = 1;
        }
        if let Some(c) = f.clip_value {
            params.clip = c;
            params.clip_value = 1;
        }
        if let Some(s) = &f.scaled {
            return self.fused_update_scaled(s, params, table, &groups);
        }
        let mut base = 0;
        for g in &groups {
            params.n = u(g.entries);
            params.base = u(base);
            base += g.entries;
            let (Some(r0), Some(r1), Some(r2)) = (g.region(0), g.region(1), g.region(2)) else {
                continue;
            };
            let grid = grid_1d(g.entries, 1);
            if g.regions.len() == 1 {
                self.launch_ranges(FUSED_UPDATE, &params, &[table, r0], grid)?;
            } else {
                let ranges = [table, r0, r1, r2];
                self.launch_ranges(FUSED_UPDATE_REGIONS, &params, &ranges, grid)?;
            }
        }
        Ok(())
    }
}
