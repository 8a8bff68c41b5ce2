//! [`Kernels`] and [`NnKernels`] on `CPU:0`: the native kernels of [`crate::ops::cpu`] on host
//! storage. Tensors here are raw 32-bit words; these impls view them as f32 or i32.
//!
//! Inputs are locked through [`Inputs`], once per storage: `x.add(&x)` passes one tensor twice,
//! and a second read guard on a lock the thread already holds deadlocks as soon as another
//! thread queues for the write lock in between (std's `RwLock` lets a waiting writer go first).

use std::sync::{RwLockReadGuard, RwLockWriteGuard};

use crate::error::Result;
use crate::ops::cpu;
use crate::ops::spec::{
    Activation, AdamParams, BinaryOp, Conv2dShape, DepthwiseShape, PoolShape, SgdParams,
};
use crate::ops::spec::{ActivationFn, Pool2dShape};
use crate::ops::spec::{ClipMode, RmspropParams};
use crate::ops::{
    ConvNormGrads, ConvWeightGrads, DenseGrads, Kernels, MatmulDims, NnKernels, NormWrites,
    NormalizedInput, ScaleRules, SeparableBackward, SeparableForward,
};
use crate::tensor::{DType, Tensor};

/// The CPU device's kernels.
pub(crate) struct HostKernels;

/// Read access to a kernel's input tensors: one guard per distinct storage, shared by every
/// input that is a view of it.
struct Inputs<'a> {
    guards: Vec<RwLockReadGuard<'a, Vec<u32>>>,
    /// For each input, the index of its guard.
    guard_of: Vec<usize>,
}

impl<'a> Inputs<'a> {
    fn lock(tensors: &[&'a Tensor]) -> Self {
        let mut guards = Vec::with_capacity(tensors.len());
        // One tensor per guard, to compare storages against (few: `add_n` of a thousand
        // gradients of one tensor searches one entry each time).
        let mut locked: Vec<&Tensor> = Vec::with_capacity(tensors.len());
        let mut guard_of = Vec::with_capacity(tensors.len());
        for t in tensors {
            match locked.iter().position(|u| u.shares_storage(t)) {
                Some(j) => guard_of.push(j),
                None => {
                    guard_of.push(guards.len());
                    locked.push(t);
                    guards.push(
                        t.host_read()
                            .expect("host kernels get tensors placed on the CPU"),
                    );
                }
            }
        }
        Self { guards, guard_of }
    }

    fn f32(&self, input: usize) -> &[f32] {
        bytemuck::cast_slice(&self.guards[self.guard_of[input]])
    }

    fn i32(&self, input: usize) -> &[i32] {
        bytemuck::cast_slice(&self.guards[self.guard_of[input]])
    }

    /// A float16 input's elements (two a word; the last word may hold a padding half).
    fn f16(&self, input: usize) -> &[half::f16] {
        bytemuck::cast_slice(&self.guards[self.guard_of[input]])
    }
}

/// Write access to a host tensor's words.
struct Write<'a>(RwLockWriteGuard<'a, Vec<u32>>);

impl Write<'_> {
    fn f32(&mut self) -> &mut [f32] {
        bytemuck::cast_slice_mut(&mut self.0)
    }
    fn i32(&mut self) -> &mut [i32] {
        bytemuck::cast_slice_mut(&mut self.0)
    }
    fn f16(&mut self) -> &mut [half::f16] {
        bytemuck::cast_slice_mut(&mut self.0)
    }
}

/// An output (or, for the optimizer updates, a variable or slot the front-end proved distinct
/// from every other tensor of the call).
fn write(t: &Tensor) -> Write<'_> {
    Write(
        t.host_write()
            .expect("host kernels get tensors placed on the CPU"),
    )
}

/// The inputs, then `extra` (an optional bias) last.
fn with_optional<'a>(inputs: &[&'a Tensor], extra: Option<&'a Tensor>) -> Vec<&'a Tensor> {
    inputs.iter().copied().chain(extra).collect()
}

impl Kernels for HostKernels {
    fn cast(&self, x: &Tensor, out: &Tensor) -> Result<()> {
        use half::slice::HalfFloatSliceExt;
        let n = x.len();
        let r = Inputs::lock(&[x]);
        let mut w = write(out);
        match (x.dtype(), out.dtype()) {
            (DType::F32, DType::F16) => w.f16()[..n].convert_from_f32_slice(&r.f32(0)[..n]),
            (DType::F16, DType::F32) => r.f16(0)[..n].convert_to_f32_slice(&mut w.f32()[..n]),
            _ => w.0.copy_from_slice(&r.guards[r.guard_of[0]]),
        }
        Ok(())
    }

    fn unscale_flag(&self, x: &Tensor, alpha: f32, out: &Tensor, flag: &Tensor) -> Result<()> {
        let r = Inputs::lock(&[x]);
        cpu::scale(r.f32(0), alpha, write(out).f32());
        if r.f32(0).iter().any(|v| !v.is_finite()) {
            write(flag).f32()[0] = 1.0;
        }
        Ok(())
    }

    fn binary(&self, a: &Tensor, b: &Tensor, out: &Tensor, op: BinaryOp) -> Result<()> {
        let r = Inputs::lock(&[a, b]);
        cpu::binary(r.f32(0), r.f32(1), write(out).f32(), op);
        Ok(())
    }

    fn add_n(&self, inputs: &[&Tensor], out: &Tensor) -> Result<()> {
        let r = Inputs::lock(inputs);
        let slices: Vec<&[f32]> = (0..inputs.len()).map(|i| r.f32(i)).collect();
        cpu::add_n(&slices, write(out).f32());
        Ok(())
    }

    fn scale(&self, x: &Tensor, alpha: f32, out: &Tensor) -> Result<()> {
        cpu::scale(Inputs::lock(&[x]).f32(0), alpha, write(out).f32());
        Ok(())
    }

    fn matmul(
        &self,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        d: MatmulDims,
        act: Activation,
    ) -> Result<()> {
        let mut out = write(out);
        let r = Inputs::lock(&with_optional(&[a, b], bias));
        let bias = bias.map(|_| r.f32(2));
        if !d.trans_a && !d.trans_b {
            // Bias and activation applied block by block while the output is in cache.
            cpu::matmul_bias_act(r.f32(0), r.f32(1), bias, out.f32(), d.m, d.k, d.n, act);
            return Ok(());
        }
        cpu::matmul(
            r.f32(0),
            r.f32(1),
            out.f32(),
            d.m,
            d.k,
            d.n,
            d.trans_a,
            d.trans_b,
        );
        if bias.is_some() || act != Activation::Linear {
            cpu::elementwise::bias_act_rows(out.f32(), bias, d.n, act);
        }
        Ok(())
    }

    fn sum_all(&self, x: &Tensor, alpha: f32, out: &Tensor) -> Result<()> {
        let s = cpu::sum_all(Inputs::lock(&[x]).f32(0));
        write(out).f32()[0] = alpha * s;
        Ok(())
    }

    fn sum_rows(&self, x: &Tensor, rows: usize, cols: usize, out: &Tensor) -> Result<()> {
        cpu::sum_rows(Inputs::lock(&[x]).f32(0), rows, cols, write(out).f32());
        Ok(())
    }

    fn argmax_rows(&self, x: &Tensor, rows: usize, cols: usize, out: &Tensor) -> Result<()> {
        cpu::argmax_rows(Inputs::lock(&[x]).f32(0), rows, cols, write(out).i32());
        Ok(())
    }
}

impl NnKernels for HostKernels {
    fn conv2d(
        &self,
        x: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        y: &Tensor,
        s: &Conv2dShape,
        act: Activation,
    ) -> Result<()> {
        let r = Inputs::lock(&with_optional(&[x, kernel], bias));
        cpu::conv2d_forward(
            r.f32(0),
            r.f32(1),
            bias.map(|_| r.f32(2)),
            write(y).f32(),
            s,
            act,
        );
        Ok(())
    }

    fn conv2d_backward_input(
        &self,
        dz: &Tensor,
        kernel: &Tensor,
        dx: &Tensor,
        s: &Conv2dShape,
    ) -> Result<()> {
        let r = Inputs::lock(&[dz, kernel]);
        cpu::conv2d_backward_input(r.f32(0), r.f32(1), write(dx).f32(), s);
        Ok(())
    }

    fn conv2d_backward_kernel(
        &self,
        x: &Tensor,
        dz: &Tensor,
        dk: &Tensor,
        s: &Conv2dShape,
    ) -> Result<()> {
        let r = Inputs::lock(&[x, dz]);
        cpu::conv2d_backward_kernel(r.f32(0), r.f32(1), write(dk).f32(), s);
        Ok(())
    }

    fn conv2d_backward_weights(&self, g: &ConvWeightGrads<'_>) -> Result<()> {
        let r = Inputs::lock(&[g.x, g.y, g.dy]);
        let (mut dk, mut db) = (write(g.dk), write(g.db));
        cpu::conv2d_backward_weights(
            r.f32(0),
            (r.f32(1), r.f32(2)),
            g.act,
            (dk.f32(), db.f32()),
            &g.s,
        );
        Ok(())
    }

    fn conv2d_backward_weights_normalized(&self, g: &ConvNormGrads<'_>) -> Result<()> {
        let mut inputs = vec![g.x, g.z, g.dy, g.gamma, g.stats];
        inputs.extend(g.relu_beta);
        let r = Inputs::lock(&inputs);
        let mut dk = write(g.dk);
        let mut db = g.db.map(write);
        let (mut dgamma, mut dbeta) = (write(g.dgamma), write(g.dbeta));
        let bn = cpu::BatchNormGradInputs {
            z: r.f32(1),
            dy: r.f32(2),
            gamma: r.f32(3),
            stats: r.f32(4),
            relu_beta: g.relu_beta.is_some().then(|| r.f32(5)),
        };
        cpu::conv2d_backward_weights_normalized(
            r.f32(0),
            bn,
            (dk.f32(), db.as_mut().map(|db| db.f32())),
            (dgamma.f32(), dbeta.f32()),
            &g.s,
        );
        Ok(())
    }

    fn conv2d_normalized_input(
        &self,
        x: &NormalizedInput<'_>,
        (kernel, bias): (&Tensor, Option<&Tensor>),
        y: &Tensor,
        s: &Conv2dShape,
        act: Activation,
    ) -> Result<()> {
        let r = Inputs::lock(&with_optional(
            &[x.z, x.gamma, x.beta, x.stats, kernel],
            bias,
        ));
        let norm = cpu::batchnorm::Normalizer::new((r.f32(1), r.f32(2)), r.f32(3));
        cpu::normalized_input::conv2d_forward_normalized(
            (r.f32(0), &norm),
            r.f32(4),
            bias.map(|_| r.f32(5)),
            write(y).f32(),
            s,
            act,
        );
        Ok(())
    }

    fn conv2d_backward_kernel_normalized_input(
        &self,
        x: &NormalizedInput<'_>,
        dz: &Tensor,
        dk: &Tensor,
        s: &Conv2dShape,
    ) -> Result<()> {
        let r = Inputs::lock(&[x.z, x.gamma, x.beta, x.stats, dz]);
        let norm = cpu::batchnorm::Normalizer::new((r.f32(1), r.f32(2)), r.f32(3));
        cpu::normalized_input::conv2d_backward_kernel_normalized(
            (r.f32(0), &norm),
            r.f32(4),
            write(dk).f32(),
            s,
        );
        Ok(())
    }

    fn depthwise(&self, x: &Tensor, kernel: &Tensor, y: &Tensor, s: &DepthwiseShape) -> Result<()> {
        let r = Inputs::lock(&[x, kernel]);
        cpu::depthwise_forward(r.f32(0), r.f32(1), write(y).f32(), s);
        Ok(())
    }

    fn depthwise_backward_input(
        &self,
        dy: &Tensor,
        kernel: &Tensor,
        dx: &Tensor,
        s: &DepthwiseShape,
    ) -> Result<()> {
        let r = Inputs::lock(&[dy, kernel]);
        cpu::depthwise_backward_input(r.f32(0), r.f32(1), write(dx).f32(), s);
        Ok(())
    }

    fn depthwise_backward_kernel(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dk: &Tensor,
        s: &DepthwiseShape,
    ) -> Result<()> {
        let r = Inputs::lock(&[x, dy]);
        cpu::depthwise_backward_kernel(r.f32(0), r.f32(1), write(dk).f32(), s);
        Ok(())
    }

    fn maxpool(&self, x: &Tensor, y: &Tensor, s: &PoolShape) -> Result<()> {
        cpu::maxpool_forward(Inputs::lock(&[x]).f32(0), write(y).f32(), s);
        Ok(())
    }

    fn maxpool_backward(&self, x: &Tensor, dy: &Tensor, dx: &Tensor, s: &PoolShape) -> Result<()> {
        let r = Inputs::lock(&[x, dy]);
        cpu::maxpool_backward(r.f32(0), r.f32(1), write(dx).f32(), s);
        Ok(())
    }

    fn activation(&self, x: &Tensor, y: &Tensor, act: Activation) -> Result<()> {
        cpu::activation_forward(Inputs::lock(&[x]).f32(0), write(y).f32(), act);
        Ok(())
    }

    fn activation_bias_grad(
        &self,
        dy: &Tensor,
        y: &Tensor,
        dz: &Tensor,
        db: &Tensor,
        (rows, cols): (usize, usize),
        act: Activation,
    ) -> Result<()> {
        self.activation_backward(dy, y, dz, act)?;
        self.sum_rows(dz, rows, cols, db)
    }

    fn activation_backward(
        &self,
        dy: &Tensor,
        y: &Tensor,
        dz: &Tensor,
        act: Activation,
    ) -> Result<()> {
        let r = Inputs::lock(&[dy, y]);
        cpu::activation_backward(r.f32(0), r.f32(1), write(dz).f32(), act);
        Ok(())
    }

    fn separable(&self, f: &SeparableForward<'_>) -> Result<()> {
        let mut inputs = with_optional(&[f.x, f.depthwise, f.pointwise], f.bias);
        let stem_at = inputs.len();
        if let Some(stem) = &f.stem {
            inputs.push(stem.kernel);
            inputs.extend(stem.bias);
        }
        let r = Inputs::lock(&inputs);
        let stem = f.stem.as_ref().map(|t| cpu::Stem {
            kernel: r.f32(stem_at),
            bias: t.bias.map(|_| r.f32(stem_at + 1)),
            s: t.s,
            act: t.act,
        });
        let src = match &stem {
            Some(stem) => cpu::Source::Stem(r.f32(0), stem),
            None => cpu::Source::Input(r.f32(0)),
        };
        let (mut y, mut pooled, mut argmax) =
            (f.y.map(write), f.pooled.map(write), f.argmax.map(write));
        let out = cpu::separable::Outputs {
            y: y.as_mut().map(|y| y.f32()),
            pooled: pooled.as_mut().map(|p| p.f32()),
            argmax: argmax.as_mut().map(|a| a.i32()),
        };
        cpu::separable_forward(
            src,
            r.f32(1),
            r.f32(2),
            f.bias.map(|_| r.f32(3)),
            out,
            &f.s,
            f.filters,
            f.act,
        );
        Ok(())
    }

    fn separable_backward(&self, g: &SeparableBackward<'_>) -> Result<()> {
        let mut inputs = vec![g.x, g.depthwise, g.pointwise, g.y, g.dy];
        let stem_at = inputs.len();
        if let Some((stem, _)) = &g.stem {
            inputs.push(stem.kernel);
            inputs.extend(stem.bias);
        }
        let argmax_at = inputs.len();
        inputs.extend(g.argmax);
        let r = Inputs::lock(&inputs);
        let stem = g.stem.as_ref().map(|(t, _)| cpu::Stem {
            kernel: r.f32(stem_at),
            bias: t.bias.map(|_| r.f32(stem_at + 1)),
            s: t.s,
            act: t.act,
        });
        let (mut ddk, mut dpk, mut db) =
            (write(g.d_depthwise), write(g.d_pointwise), write(g.d_bias));
        let mut dx = g.dx.map(write);
        let mut d_stem = g.stem.as_ref().map(|(_, [dk, db])| (write(dk), write(db)));
        let grads = cpu::SeparableGrads {
            src: match &stem {
                Some(stem) => cpu::Source::Stem(r.f32(0), stem),
                None => cpu::Source::Input(r.f32(0)),
            },
            dk: r.f32(1),
            pk: r.f32(2),
            kept: match g.argmax {
                Some(_) => cpu::separable::Kept::Argmax(cpu::pool::Argmax {
                    pooled: r.f32(3),
                    argmax: r.i32(argmax_at),
                }),
                None => cpu::separable::Kept::Output(r.f32(3)),
            },
            dy: r.f32(4),
            act: g.act,
            pooled: g.pooled,
            input_act: g.input_act,
        };
        let out = cpu::SeparableGradsOut {
            dx: dx.as_mut().map(|d| d.f32()),
            ddk: ddk.f32(),
            dpk: dpk.f32(),
            db: db.f32(),
            stem: d_stem.as_mut().map(|(dk, db)| (dk.f32(), db.f32())),
        };
        cpu::separable_backward(&grads, out, &g.s, g.filters);
        Ok(())
    }

    // ---- general convolutions ----
    fn depthwise_bias_act(
        &self,
        x: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        y: &Tensor,
        s: &DepthwiseShape,
        act: Activation,
    ) -> Result<()> {
        let r = Inputs::lock(&with_optional(&[x, kernel], bias));
        let b = bias.map(|_| r.f32(2));
        let mut out = write(y);
        if s.is_same_unit() {
            // The tuned stride-1 kernel, then the bias and activation in place.
            cpu::depthwise_forward(r.f32(0), r.f32(1), out.f32(), s);
            cpu::elementwise::bias_act_rows(out.f32(), b, s.c, act);
        } else {
            let g = crate::ops::spec::ConvGeometry::depthwise(s);
            cpu::conv_general::forward((r.f32(0), None), r.f32(1), b, out.f32(), &g, act);
        }
        Ok(())
    }

    // ---- losses on float targets, metrics ----
    fn dense_loss(
        &self,
        z: &Tensor,
        targets: &Tensor,
        loss: &Tensor,
        dz: &Tensor,
        p: &crate::ops::loss::LossParams,
    ) -> Result<()> {
        let r = Inputs::lock(&[z, targets]);
        cpu::loss::dense_loss(r.f32(0), r.f32(1), write(loss).f32(), write(dz).f32(), p);
        Ok(())
    }

    fn metric_rows(
        &self,
        z: &Tensor,
        targets: &Tensor,
        out: &Tensor,
        rows_cols: (usize, usize),
        kind: crate::ops::loss::MetricKind,
        act: crate::ops::loss::OutputActivation,
    ) -> Result<()> {
        let r = Inputs::lock(&[z, targets]);
        let targets = match targets.dtype() {
            DType::I32 => (None, Some(r.i32(1))),
            _ => (Some(r.f32(1)), None),
        };
        cpu::loss::metric_rows(r.f32(0), targets, write(out).f32(), rows_cols, kind, act);
        Ok(())
    }

    fn sigmoid(&self, x: &Tensor, y: &Tensor) -> Result<()> {
        let n = x.len();
        cpu::loss::sigmoid(&Inputs::lock(&[x]).f32(0)[..n], &mut write(y).f32()[..n]);
        Ok(())
    }

    fn dense_backward(&self, g: &DenseGrads<'_>) -> Result<()> {
        let r = Inputs::lock(&[g.x, g.w, g.y, g.dy]);
        let (mut dw, mut db) = (write(g.dw), write(g.db));
        let mut dx = g.dx.map(write);
        cpu::dense_backward(
            r.f32(0),
            r.f32(1),
            r.f32(2),
            r.f32(3),
            dx.as_mut().map(|d| d.f32()),
            dw.f32(),
            db.f32(),
            (g.m, g.k, g.n),
            g.act,
        );
        Ok(())
    }

    fn softmax(&self, logits: &Tensor, probs: &Tensor, rows: usize, cols: usize) -> Result<()> {
        cpu::softmax(
            Inputs::lock(&[logits]).f32(0),
            write(probs).f32(),
            rows,
            cols,
        );
        Ok(())
    }

    fn softmax_cross_entropy(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        loss: &Tensor,
        dlogits: &Tensor,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let r = Inputs::lock(&[logits, labels]);
        cpu::softmax_cross_entropy(
            r.f32(0),
            r.i32(1),
            write(loss).f32(),
            write(dlogits).f32(),
            rows,
            cols,
        );
        Ok(())
    }

    fn accuracy_count(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        out: &Tensor,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let r = Inputs::lock(&[logits, labels]);
        let n = cpu::accuracy_count(r.f32(0), r.i32(1), rows, cols);
        write(out).f32()[0] = n as f32;
        Ok(())
    }

    fn sgd(&self, w: &Tensor, g: &Tensor, p: &SgdParams) -> Result<()> {
        cpu::sgd(write(w).f32(), Inputs::lock(&[g]).f32(0), p);
        Ok(())
    }

    fn sgd_momentum(&self, w: &Tensor, g: &Tensor, v: &Tensor, p: &SgdParams) -> Result<()> {
        cpu::sgd_momentum(write(w).f32(), Inputs::lock(&[g]).f32(0), write(v).f32(), p);
        Ok(())
    }

    fn adam(&self, w: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, p: &AdamParams) -> Result<()> {
        cpu::adam(
            write(w).f32(),
            Inputs::lock(&[g]).f32(0),
            write(m).f32(),
            write(v).f32(),
            p,
        );
        Ok(())
    }

    // ---- batch normalization and dropout ----
    fn batch_norm(&self, a: &crate::ops::norm::BatchNormArgs<'_>) -> Result<()> {
        let r = Inputs::lock(&[a.x, a.v.gamma, a.v.beta]);
        let mut y = write(a.y);
        let (x, gamma, beta) = (r.f32(0), r.f32(1), r.f32(2));
        let n = a.p.rows * a.p.channels;
        let out = match a.writes {
            NormWrites::ImageMeans(pixels) => cpu::batchnorm::Normalized::ImageMeans {
                pooled: y.f32(),
                pixels,
            },
            NormWrites::Values => cpu::batchnorm::Normalized::Values(&mut y.f32()[..n]),
            NormWrites::Nothing => cpu::batchnorm::Normalized::Deferred,
        };
        match a.stats {
            Some(stats) => {
                // The moving statistics are written in place; the front-end checked they are
                // distinct float32 variables.
                let (mut mm, mut mv) = (write(a.v.moving_mean), write(a.v.moving_variance));
                cpu::batchnorm::batch_norm_train(
                    &x[..n],
                    (gamma, beta),
                    (mm.f32(), mv.f32()),
                    out,
                    write(stats).f32(),
                    &a.p,
                    a.relu,
                );
            }
            None => {
                let m = Inputs::lock(&[a.v.moving_mean, a.v.moving_variance]);
                cpu::batchnorm::batch_norm_infer(
                    &x[..n],
                    (gamma, beta),
                    (m.f32(0), m.f32(1)),
                    out,
                    &a.p,
                    a.relu,
                );
            }
        }
        Ok(())
    }

    fn batch_norm_backward(&self, g: &crate::ops::norm::BatchNormGradArgs<'_>) -> Result<()> {
        let mut inputs = vec![g.x, g.dy, g.gamma, g.stats];
        inputs.extend(g.relu_beta);
        let r = Inputs::lock(&inputs);
        let (mut dx, mut dgamma, mut dbeta) = (write(g.dx), write(g.dgamma), write(g.dbeta));
        let n = g.p.rows * g.p.channels;
        let dy = match g.image_means {
            Some(pixels) => cpu::batchnorm::Dy::ImageMeans {
                pooled: r.f32(1),
                pixels,
            },
            None => cpu::batchnorm::Dy::Rows(&r.f32(1)[..n]),
        };
        cpu::batchnorm::batch_norm_backward(
            &r.f32(0)[..n],
            dy,
            r.f32(2),
            r.f32(3),
            g.relu_beta.is_some().then(|| r.f32(4)),
            &mut dx.f32()[..n],
            (dgamma.f32(), dbeta.f32()),
            &g.p,
        );
        Ok(())
    }

    fn dropout(
        &self,
        x: &Tensor,
        (y, mask): (&Tensor, &Tensor),
        m: &crate::ops::spec::DropoutMask,
    ) -> Result<()> {
        let n = x.len();
        let (mut y, mut mask) = (write(y), write(mask));
        cpu::dropout::dropout(
            &Inputs::lock(&[x]).f32(0)[..n],
            &mut y.f32()[..n],
            &mut mask.f32()[..n],
            m,
        );
        Ok(())
    }

    fn dropout_grad(&self, dy: &Tensor, mask: &Tensor, dx: &Tensor) -> Result<()> {
        let n = dy.len();
        let r = Inputs::lock(&[dy, mask]);
        cpu::dropout::dropout_grad(&r.f32(0)[..n], &r.f32(1)[..n], &mut write(dx).f32()[..n]);
        Ok(())
    }

    // ---- activations and pooling layers ----
    fn activation_fn(&self, x: &Tensor, y: &Tensor, act: ActivationFn) -> Result<()> {
        cpu::activation::activation_fn_forward(Inputs::lock(&[x]).f32(0), write(y).f32(), act);
        Ok(())
    }

    fn activation_fn_backward(
        &self,
        dy: &Tensor,
        t: &Tensor,
        dz: &Tensor,
        act: ActivationFn,
        from_output: bool,
    ) -> Result<()> {
        let r = Inputs::lock(&[dy, t]);
        cpu::activation::activation_fn_backward(
            r.f32(0),
            r.f32(1),
            write(dz).f32(),
            act,
            from_output,
        );
        Ok(())
    }

    fn avg_pool2d(&self, x: &Tensor, y: &Tensor, s: &Pool2dShape) -> Result<()> {
        cpu::pooling::avg_pool2d(Inputs::lock(&[x]).f32(0), write(y).f32(), s);
        Ok(())
    }

    fn avg_pool2d_backward(&self, dy: &Tensor, dx: &Tensor, s: &Pool2dShape) -> Result<()> {
        cpu::pooling::avg_pool2d_backward(Inputs::lock(&[dy]).f32(0), write(dx).f32(), s);
        Ok(())
    }

    fn max_pool2d_window(&self, x: &Tensor, y: &Tensor, s: &Pool2dShape) -> Result<()> {
        cpu::pooling::max_pool2d(Inputs::lock(&[x]).f32(0), write(y).f32(), s);
        Ok(())
    }

    fn max_pool2d_window_backward(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dx: &Tensor,
        s: &Pool2dShape,
    ) -> Result<()> {
        let r = Inputs::lock(&[x, dy]);
        cpu::pooling::max_pool2d_backward(r.f32(0), r.f32(1), write(dx).f32(), s);
        Ok(())
    }

    fn global_pool(&self, max: bool, x: &Tensor, y: &Tensor, s: &PoolShape) -> Result<()> {
        let r = Inputs::lock(&[x]);
        if max {
            cpu::pooling::global_max_pool(r.f32(0), write(y).f32(), s);
        } else {
            cpu::pooling::global_avg_pool(r.f32(0), write(y).f32(), s);
        }
        Ok(())
    }

    fn global_avg_pool_backward(&self, dy: &Tensor, dx: &Tensor, s: &PoolShape) -> Result<()> {
        cpu::pooling::global_avg_pool_backward(Inputs::lock(&[dy]).f32(0), write(dx).f32(), s);
        Ok(())
    }

    fn global_max_pool_backward(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dx: &Tensor,
        s: &PoolShape,
    ) -> Result<()> {
        let r = Inputs::lock(&[x, dy]);
        cpu::pooling::global_max_pool_backward(r.f32(0), r.f32(1), write(dx).f32(), s);
        Ok(())
    }

    // ---- RMSprop, weight decay, gradient clipping ----

    fn rmsprop(
        &self,
        w: &Tensor,
        g: &Tensor,
        v: &Tensor,
        average: Option<&Tensor>,
        momentum: Option<&Tensor>,
        p: &RmspropParams,
    ) -> Result<()> {
        let mut average = average.map(write);
        let mut momentum = momentum.map(write);
        cpu::rmsprop(
            write(w).f32(),
            Inputs::lock(&[g]).f32(0),
            write(v).f32(),
            average.as_mut().map(|a| a.f32()),
            momentum.as_mut().map(|m| m.f32()),
            p,
        );
        Ok(())
    }

    fn weight_decay(&self, w: &Tensor, wd: f32, lr: f32) -> Result<()> {
        cpu::weight_decay(write(w).f32(), wd, lr);
        Ok(())
    }

    fn clip(
        &self,
        g: &Tensor,
        sum_squares: Option<&Tensor>,
        out: &Tensor,
        mode: ClipMode,
    ) -> Result<()> {
        let ss = match sum_squares {
            Some(t) => Inputs::lock(&[t]).f32(0).first().copied().unwrap_or(0.0),
            None => 0.0,
        };
        cpu::clip(Inputs::lock(&[g]).f32(0), write(out).f32(), mode, ss);
        Ok(())
    }

    // ---- loss scaling on the device ----
    fn loss_scale_check(
        &self,
        f: &crate::ops::nn_kernels::FusedUpdate<'_>,
        state: &Tensor,
    ) -> Result<()> {
        let bad = f
            .vars
            .iter()
            .any(|v| cpu::loss_scale::any_not_finite(Inputs::lock(&[v.g]).f32(0)));
        if bad {
            if let Some(flag) = write(state).i32().first_mut() {
                *flag = 1;
            }
        }
        Ok(())
    }

    fn loss_scale_seed(&self, x: &Tensor, factor: f32, state: &Tensor) -> Result<()> {
        let e = Inputs::lock(&[state]).i32(0).get(1).copied().unwrap_or(0);
        cpu::loss_scale::seed(write(x).f32(), factor, e);
        // A new step: a flag that a failed step left set must not skip it.
        if let Some(flag) = write(state).i32().first_mut() {
            *flag = 0;
        }
        Ok(())
    }

    fn loss_scale_unscale(
        &self,
        g: &Tensor,
        out: &Tensor,
        inverse_base: f32,
        state: &Tensor,
    ) -> Result<()> {
        let e = Inputs::lock(&[state]).i32(0).get(1).copied().unwrap_or(0);
        let inverse = cpu::loss_scale::ldexp(inverse_base, -e);
        let bad = {
            let r = Inputs::lock(&[g]);
            cpu::scale(r.f32(0), inverse, write(out).f32());
            cpu::loss_scale::any_not_finite(r.f32(0))
        };
        if bad {
            if let Some(flag) = write(state).i32().first_mut() {
                *flag = 1;
            }
        }
        Ok(())
    }

    fn loss_scale_advance(&self, state: &Tensor, rules: ScaleRules) -> Result<()> {
        cpu::loss_scale::advance(write(state).i32(), rules);
        Ok(())
    }
}
