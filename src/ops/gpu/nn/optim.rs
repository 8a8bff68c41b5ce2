//! The optimizer updates and gradient clipping on a GPU (`optim.wgsl`), in place.

use bytemuck::{Pod, Zeroable};

use crate::error::Result;
use crate::ops::gpu::grid_1d;
use crate::ops::gpu::kernels::GpuKernels;
use crate::ops::spec::{AdamParams, SgdParams};
use crate::ops::spec::{ClipMode, RmspropParams};
use crate::tensor::Tensor;

use super::kernel_lists::*;
use super::u;

/// Mirror of `Params` in optim.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Default, Pod, Zeroable)]
struct OptimParams {
    n: u32,
    lr: f32,
    momentum: f32,
    nesterov: u32,
    alpha: f32,
    one_minus_b1: f32,
    one_minus_b2: f32,
    eps: f32,
    rho: f32,
    one_minus_rho: f32,
    wd: f32,
    clip: f32,
    inverse_clip: f32,
    mode: u32,
    pad0: u32,
    pad1: u32,
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
        // The bias correction in f64, as the CPU kernel and Keras compute it.
        let t = i32::try_from(p.step).unwrap_or(i32::MAX);
        let (b1, b2) = (f64::from(p.beta1), f64::from(p.beta2));
        let alpha = f64::from(p.lr) * (1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t));
        let params = OptimParams {
            n: u(n),
            lr: p.lr,
            alpha: alpha as f32,
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
            (_, None) => Err(crate::error::Error::InvalidArgument(
                "ClipByNorm: no sum of squares to take the norm of".into(),
            )),
        }
    }
}
