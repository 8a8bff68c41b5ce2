//! [`Kernels`] and [`NnKernels`] on `CPU:0`: the native kernels of [`crate::ops::cpu`] on host
//! storage. Tensors here are raw 32-bit words; these impls view them as f32 or i32.

use std::sync::{RwLockReadGuard, RwLockWriteGuard};

use crate::error::Result;
use crate::ops::cpu;
use crate::ops::spec::{
    Activation, AdamParams, BinaryOp, Conv2dShape, DepthwiseShape, PoolShape, SgdParams,
};
use crate::ops::{
    ConvWeightGrads, DenseGrads, Kernels, MatmulDims, NnKernels, SeparableBackward,
    SeparableForward,
};
use crate::tensor::Tensor;

/// The CPU device's kernels.
pub(crate) struct HostKernels;

/// Read access to a host tensor's words.
struct Read<'a>(RwLockReadGuard<'a, Vec<u32>>);
/// Write access to a host tensor's words.
struct Write<'a>(RwLockWriteGuard<'a, Vec<u32>>);

impl Read<'_> {
    fn f32(&self) -> &[f32] {
        bytemuck::cast_slice(&self.0)
    }
    fn i32(&self) -> &[i32] {
        bytemuck::cast_slice(&self.0)
    }
}

impl Write<'_> {
    fn f32(&mut self) -> &mut [f32] {
        bytemuck::cast_slice_mut(&mut self.0)
    }
    fn i32(&mut self) -> &mut [i32] {
        bytemuck::cast_slice_mut(&mut self.0)
    }
}

fn read(t: &Tensor) -> Read<'_> {
    Read(
        t.host_read()
            .expect("host kernels get tensors placed on the CPU"),
    )
}

fn write(t: &Tensor) -> Write<'_> {
    Write(
        t.host_write()
            .expect("host kernels get tensors placed on the CPU"),
    )
}

impl Kernels for HostKernels {
    fn binary(&self, a: &Tensor, b: &Tensor, out: &Tensor, op: BinaryOp) -> Result<()> {
        cpu::binary(read(a).f32(), read(b).f32(), write(out).f32(), op);
        Ok(())
    }

    fn add_n(&self, inputs: &[&Tensor], out: &Tensor) -> Result<()> {
        let guards: Vec<Read<'_>> = inputs.iter().map(|t| read(t)).collect();
        let slices: Vec<&[f32]> = guards.iter().map(Read::f32).collect();
        cpu::add_n(&slices, write(out).f32());
        Ok(())
    }

    fn scale(&self, x: &Tensor, alpha: f32, out: &Tensor) -> Result<()> {
        cpu::scale(read(x).f32(), alpha, write(out).f32());
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
        let (a, b) = (read(a), read(b));
        let bias_guard = bias.map(read);
        if !d.trans_a && !d.trans_b {
            // Bias and activation applied block by block while the output is in cache.
            let bias = bias_guard.as_ref().map(Read::f32);
            cpu::matmul_bias_act(a.f32(), b.f32(), bias, out.f32(), d.m, d.k, d.n, act);
            return Ok(());
        }
        cpu::matmul(
            a.f32(),
            b.f32(),
            out.f32(),
            d.m,
            d.k,
            d.n,
            d.trans_a,
            d.trans_b,
        );
        if bias.is_some() || act != Activation::Linear {
            let bias = bias_guard.as_ref().map(Read::f32);
            cpu::elementwise::bias_act_rows(out.f32(), bias, d.n, act);
        }
        Ok(())
    }

    fn sum_all(&self, x: &Tensor, alpha: f32, out: &Tensor) -> Result<()> {
        let s = cpu::sum_all(read(x).f32());
        write(out).f32()[0] = alpha * s;
        Ok(())
    }

    fn sum_rows(&self, x: &Tensor, rows: usize, cols: usize, out: &Tensor) -> Result<()> {
        cpu::sum_rows(read(x).f32(), rows, cols, write(out).f32());
        Ok(())
    }

    fn argmax_rows(&self, x: &Tensor, rows: usize, cols: usize, out: &Tensor) -> Result<()> {
        cpu::argmax_rows(read(x).f32(), rows, cols, write(out).i32());
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
        let bias = bias.map(read);
        cpu::conv2d_forward(
            read(x).f32(),
            read(kernel).f32(),
            bias.as_ref().map(Read::f32),
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
        cpu::conv2d_backward_input(read(dz).f32(), read(kernel).f32(), write(dx).f32(), s);
        Ok(())
    }

    fn conv2d_backward_kernel(
        &self,
        x: &Tensor,
        dz: &Tensor,
        dk: &Tensor,
        s: &Conv2dShape,
    ) -> Result<()> {
        cpu::conv2d_backward_kernel(read(x).f32(), read(dz).f32(), write(dk).f32(), s);
        Ok(())
    }

    fn conv2d_backward_weights(&self, g: &ConvWeightGrads<'_>) -> Result<()> {
        let (x, y, dy) = (read(g.x), read(g.y), read(g.dy));
        let (mut dk, mut db) = (write(g.dk), write(g.db));
        cpu::conv2d_backward_weights(
            x.f32(),
            (y.f32(), dy.f32()),
            g.act,
            (dk.f32(), db.f32()),
            &g.s,
        );
        Ok(())
    }

    fn depthwise(&self, x: &Tensor, kernel: &Tensor, y: &Tensor, s: &DepthwiseShape) -> Result<()> {
        cpu::depthwise_forward(read(x).f32(), read(kernel).f32(), write(y).f32(), s);
        Ok(())
    }

    fn depthwise_backward_input(
        &self,
        dy: &Tensor,
        kernel: &Tensor,
        dx: &Tensor,
        s: &DepthwiseShape,
    ) -> Result<()> {
        cpu::depthwise_backward_input(read(dy).f32(), read(kernel).f32(), write(dx).f32(), s);
        Ok(())
    }

    fn depthwise_backward_kernel(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dk: &Tensor,
        s: &DepthwiseShape,
    ) -> Result<()> {
        cpu::depthwise_backward_kernel(read(x).f32(), read(dy).f32(), write(dk).f32(), s);
        Ok(())
    }

    fn maxpool(&self, x: &Tensor, y: &Tensor, s: &PoolShape) -> Result<()> {
        cpu::maxpool_forward(read(x).f32(), write(y).f32(), s);
        Ok(())
    }

    fn maxpool_backward(&self, x: &Tensor, dy: &Tensor, dx: &Tensor, s: &PoolShape) -> Result<()> {
        cpu::maxpool_backward(read(x).f32(), read(dy).f32(), write(dx).f32(), s);
        Ok(())
    }

    fn activation(&self, x: &Tensor, y: &Tensor, act: Activation) -> Result<()> {
        cpu::activation_forward(read(x).f32(), write(y).f32(), act);
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
        cpu::activation_backward(read(dy).f32(), read(y).f32(), write(dz).f32(), act);
        Ok(())
    }

    fn separable(&self, f: &SeparableForward<'_>) -> Result<()> {
        let bias = f.bias.map(read);
        cpu::separable_forward(
            read(f.x).f32(),
            read(f.depthwise).f32(),
            read(f.pointwise).f32(),
            bias.as_ref().map(|b| b.f32()),
            write(f.y).f32(),
            &f.s,
            f.filters,
            f.act,
        );
        Ok(())
    }

    fn separable_backward(&self, g: &SeparableBackward<'_>) -> Result<()> {
        let (x, dk, pk, y, dy) = (
            read(g.x),
            read(g.depthwise),
            read(g.pointwise),
            read(g.y),
            read(g.dy),
        );
        let (mut ddk, mut dpk, mut db) =
            (write(g.d_depthwise), write(g.d_pointwise), write(g.d_bias));
        let mut dx = g.dx.map(write);
        let grads = cpu::SeparableGrads {
            x: x.f32(),
            dk: dk.f32(),
            pk: pk.f32(),
            y: y.f32(),
            dy: dy.f32(),
            act: g.act,
            pooled: g.pooled,
        };
        let out = cpu::SeparableGradsOut {
            dx: dx.as_mut().map(|d| d.f32()),
            ddk: ddk.f32(),
            dpk: dpk.f32(),
            db: db.f32(),
        };
        cpu::separable_backward(&grads, out, &g.s, g.filters);
        Ok(())
    }

    fn dense_backward(&self, g: &DenseGrads<'_>) -> Result<()> {
        let (x, w, y, dy) = (read(g.x), read(g.w), read(g.y), read(g.dy));
        let (mut dw, mut db) = (write(g.dw), write(g.db));
        let mut dx = g.dx.map(write);
        cpu::dense_backward(
            x.f32(),
            w.f32(),
            y.f32(),
            dy.f32(),
            dx.as_mut().map(|d| d.f32()),
            dw.f32(),
            db.f32(),
            (g.m, g.k, g.n),
            g.act,
        );
        Ok(())
    }

    fn softmax(&self, logits: &Tensor, probs: &Tensor, rows: usize, cols: usize) -> Result<()> {
        cpu::softmax(read(logits).f32(), write(probs).f32(), rows, cols);
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
        cpu::softmax_cross_entropy(
            read(logits).f32(),
            read(labels).i32(),
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
        let n = cpu::accuracy_count(read(logits).f32(), read(labels).i32(), rows, cols);
        write(out).f32()[0] = n as f32;
        Ok(())
    }

    fn sgd(&self, w: &Tensor, g: &Tensor, p: &SgdParams) -> Result<()> {
        cpu::sgd(write(w).f32(), read(g).f32(), p);
        Ok(())
    }

    fn sgd_momentum(&self, w: &Tensor, g: &Tensor, v: &Tensor, p: &SgdParams) -> Result<()> {
        cpu::sgd_momentum(write(w).f32(), read(g).f32(), write(v).f32(), p);
        Ok(())
    }

    fn adam(&self, w: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, p: &AdamParams) -> Result<()> {
        cpu::adam(
            write(w).f32(),
            read(g).f32(),
            write(m).f32(),
            write(v).f32(),
            p,
        );
        Ok(())
    }
}
