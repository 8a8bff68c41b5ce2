//! A stride-1 convolution's kernel gradient `dk = patches(x)ᵀ · dz` (and the bias gradient
//! `db = Σ dz` where asked), with `dz` given, formed from an activation's output, or formed
//! from the batch normalization after the convolution, block by block where it is read.
//! Blocks of output rows in parallel, each task with its own partial sums added at the end:
//! small patches read in place, Winograd's transformed sums, or a patch matrix.

use crate::ops::cpu::batchnorm::{Dy, InputGrad};
use crate::ops::cpu::elementwise::act_backward_leaf;
use crate::ops::cpu::gemm::{gemm_strided, Strided};
use crate::ops::cpu::reduce::sum_rows_leaf;
use crate::ops::cpu::small_k::{small_k_kernel_grad, SmallKGrad, SMALL_K};
use crate::ops::cpu::{self, add_parts, conv_general, ordered_parts, winograd, with_scratch};
use crate::ops::spec::{Activation, Conv2dShape, ConvGeometry};

use super::{check, patch_offsets_in, Geometry};

/// Tasks a kernel-gradient reduction is cut into, at least, when the batch allows it.
const REDUCTION_TASKS: usize = 64;

/// Gradient w.r.t. the kernel, `dk` `[kh, kw, c_in, c_out]` = `patches(x)ᵀ · dz` summed over
/// the batch (`dz` is the gradient w.r.t. the pre-activation output).
pub(crate) fn conv2d_backward_kernel(x: &[f32], dz: &[f32], dk: &mut [f32], s: &Conv2dShape) {
    check(s, x.len(), dk.len(), dz.len(), "conv2d_backward_kernel");
    if !s.is_unit_stride() {
        return conv_general::backward_kernel((x, None), dz, dk, &ConvGeometry::conv(s));
    }
    weight_grads(x, OutputGrad::Dz(dz), dk, None, s);
}

/// The kernel and bias gradients of `y = act(conv2d(x, kernel) + bias)` from `dy`, the
/// gradient w.r.t. the activated `y`: with `dz = dy * act'(y)`, `dk = patches(x)ᵀ · dz` and
/// `db = Σ dz`.
///
/// One pass over blocks of output rows, each block's `dz` formed in scratch memory: separate
/// ops would write `dz` and read it twice (12.8 MB each way for the tutorial's first layer at
/// batch 128). What a model's first layer needs, which has no input gradient to compute.
pub(crate) fn conv2d_backward_weights(
    x: &[f32],
    (y, dy): (&[f32], &[f32]),
    act: Activation,
    (dk, db): (&mut [f32], &mut [f32]),
    s: &Conv2dShape,
) {
    let what = "conv2d_backward_weights";
    check(s, x.len(), dk.len(), dy.len(), what);
    assert_eq!(y.len(), dy.len(), "{what}: y and dy lengths differ");
    assert_eq!(db.len(), s.c_out, "{what}: db must have c_out elements");
    if !s.is_unit_stride() {
        // dz written out whole: the general path is not the tuned first layer.
        let mut dz = vec![0.0f32; dy.len()];
        cpu::activation_backward(dy, y, &mut dz, act);
        cpu::sum_rows(&dz, dz.len() / s.c_out.max(1), s.c_out, db);
        return conv_general::backward_kernel((x, None), &dz, dk, &ConvGeometry::conv(s));
    }
    let grad = match act {
        // `dy` is `dz` (a pre-activated gradient, or no activation): read it in place.
        Activation::Linear => OutputGrad::Dz(dy),
        act => OutputGrad::Activated { dy, y, act },
    };
    weight_grads(x, grad, dk, Some(db), s);
}

/// The kernel and bias gradients of a convolution whose output `z` a batch normalization
/// (with a fused ReLU when `bn.relu_beta` is given) takes, from `dy`, the gradient w.r.t. the
/// normalization's output, and that normalization's `dgamma` and `dbeta`: the normalization's
/// sums in one pass, then `dz`, its input gradient, formed block by block where the kernel
/// gradient reads it. As separate ops `dz` would be written whole and read back (12.8 MB each
/// way for the modern CNN's first layer at batch 128). What a model's first layer needs, which
/// has no input gradient to compute.
pub(crate) fn conv2d_backward_weights_normalized(
    x: &[f32],
    bn: BatchNormGradInputs<'_>,
    (dk, db): (&mut [f32], Option<&mut [f32]>),
    (dgamma, dbeta): (&mut [f32], &mut [f32]),
    s: &Conv2dShape,
) {
    let what = "conv2d_backward_weights_normalized";
    check(s, x.len(), dk.len(), bn.dy.len(), what);
    assert_eq!(bn.z.len(), bn.dy.len(), "{what}: z and dy lengths differ");
    let rows = bn.dy.len() / s.c_out.max(1);
    let grad = InputGrad::new(
        (bn.z, Dy::Rows(bn.dy)),
        (bn.gamma, bn.relu_beta),
        bn.stats,
        (dgamma, dbeta),
        (rows, s.c_out),
    );
    if !s.is_unit_stride() {
        // dz written out whole: the general path is not the tuned first layer.
        let mut dz = vec![0.0f32; bn.dy.len()];
        grad.all(&mut dz);
        if let Some(db) = db {
            cpu::sum_rows(&dz, rows, s.c_out, db);
        }
        return conv_general::backward_kernel((x, None), &dz, dk, &ConvGeometry::conv(s));
    }
    weight_grads(x, OutputGrad::Normalized(&grad), dk, db, s);
}

/// What [`conv2d_backward_weights_normalized`] reads of the batch normalization after the
/// convolution: its input `z` (the convolution's output), the gradient `dy` w.r.t. its
/// output, `gamma`, the forward pass's `stats` (`[mean; inv]`) and, with a fused ReLU, `beta`.
#[derive(Clone, Copy)]
pub(crate) struct BatchNormGradInputs<'a> {
    pub z: &'a [f32],
    pub dy: &'a [f32],
    pub gamma: &'a [f32],
    pub stats: &'a [f32],
    pub relu_beta: Option<&'a [f32]>,
}

/// Adds `patches(x)ᵀ · dz` to `dk` and the column sums of `dz` to `db`, for a stride-1 shape on
/// the calling thread (a block of images inside a fused op's parallel loop, as
/// [`conv2d_forward_serial`](super::conv2d_forward_serial)). `dz` is the gradient w.r.t. the
/// pre-activation output.
pub(crate) fn conv2d_weight_grads_serial(
    x: &[f32],
    dz: &[f32],
    (dk, db): (&mut [f32], &mut [f64]),
    s: &Conv2dShape,
) {
    check(s, x.len(), dk.len(), dz.len(), "conv2d_weight_grads_serial");
    assert!(
        s.is_unit_stride(),
        "conv2d_weight_grads_serial: stride-1 shapes only"
    );
    assert_eq!(
        db.len(),
        s.c_out,
        "conv2d_weight_grads_serial: db must have c_out elements"
    );
    let g = Geometry::forward(s);
    if dz.is_empty() || dk.is_empty() {
        return;
    }
    let (k, pixels) = (g.patch_len(), dz.len() / g.c_out);
    let rhs = Strided::row_major(dz, g.c_out);
    if k <= SMALL_K && !g.is_pointwise() {
        // The bias sums along with the first taps.
        let offs = patch_offsets_in(&g, g.ow + g.kw - 1);
        let pad_len = (g.oh + g.kh - 1) * (g.ow + g.kw - 1) * g.c_in;
        with_scratch(pad_len, |pad| {
            small_k_rows(x, dz, &g, (0, pixels / g.ow), &offs, (dk, db), pad);
        });
        return;
    }
    sum_rows_leaf(dz, g.c_out, db);
    if g.is_pointwise() {
        let lhs = Strided::transposed(&x[..pixels * k], k);
        gemm_strided(dk, k, g.c_out, pixels, lhs, rhs, true, false);
    } else {
        with_scratch(pixels * k, |col| {
            g.im2col(x, 0, pixels / g.ow, col);
            let lhs = Strided::transposed(col, k);
            gemm_strided(dk, k, g.c_out, pixels, lhs, rhs, true, false);
        });
    }
}

/// Where [`weight_grads`] takes the gradient w.r.t. the pre-activation output from.
#[derive(Clone, Copy)]
enum OutputGrad<'a> {
    /// `dz` itself.
    Dz(&'a [f32]),
    /// `dz = dy * act'(y)`, formed block by block from the activated output `y`.
    Activated {
        dy: &'a [f32],
        y: &'a [f32],
        act: Activation,
    },
    /// The input gradient of a batch normalization of the output, formed block by block.
    Normalized(&'a InputGrad<'a>),
}

/// `dk = patches(x)ᵀ · dz` and, when asked, `db = Σ dz` (in f64), over blocks of output rows in
/// parallel, each task with its own partial sums, added at the end.
fn weight_grads(
    x: &[f32],
    grad: OutputGrad<'_>,
    dk: &mut [f32],
    db: Option<&mut [f32]>,
    s: &Conv2dShape,
) {
    let g = Geometry::forward(s);
    let out_row = g.ow * g.c_out;
    let total = match grad {
        OutputGrad::Dz(dz) => dz.len(),
        OutputGrad::Activated { dy, .. } => dy.len(),
        OutputGrad::Normalized(grad) => grad.len(),
    };
    if total == 0 || out_row == 0 || dk.is_empty() {
        dk.fill(0.0);
        if let Some(db) = db {
            db.fill(0.0);
        }
        return;
    }
    let k = g.patch_len();
    // Under Winograd a task takes whole rows of tiles (`per_task` of them), and the
    // partial sums are the gradient w.r.t. the transformed kernel.
    let wino = g.winograd().map(|c| {
        let c = winograd::Correlation {
            tile: winograd::Tile::for_kernel_grad(c.oh, c.ow),
            ..c
        };
        (c, c.grad_rows_per_task(REDUCTION_TASKS))
    });
    // A large transformed kernel goes by groups of tiles, without per-task partial sums (from
    // `dz` itself; an activation's gradient formed block by block keeps the tasks).
    if let (Some((c, _)), OutputGrad::Dz(dz)) = (wino, grad) {
        if c.grad_by_groups() {
            let du = winograd::kernel_grad_by_groups(x, dz, &c, c.group_rows());
            winograd::kernel_from_grad(&du, dk, &c);
            if let Some(db) = db {
                cpu::sum_rows(dz, dz.len() / g.c_out, g.c_out, db);
            }
            return;
        }
    }
    // Tasks cut independently of the thread count: each sums its rows into its own partial,
    // so the cut decides the rounding, which must be the same on every run and machine.
    let rows_per_task = g.rows_per_task(REDUCTION_TASKS);
    let tasks = match wino {
        Some((c, per_task)) => c.tile_rows().div_ceil(per_task),
        None => (g.n * g.oh).div_ceil(rows_per_task),
    };
    // Task `t`'s tile rows (Winograd) and output rows (batch-flattened).
    let tiles_of = |t: usize| {
        wino.map(|(c, per_task)| (t * per_task, ((t + 1) * per_task).min(c.tile_rows())))
    };
    let rows_of = |t: usize| match (wino, tiles_of(t)) {
        (Some((c, _)), Some((t0, t1))) => (c.out_row(t0), c.out_row(t1)),
        _ => (t * rows_per_task, ((t + 1) * rows_per_task).min(g.n * g.oh)),
    };
    let partial_len = match wino {
        Some((c, _)) => c.transformed_kernel_len(),
        None => dk.len(),
    };
    // A small patch (the 3×3 first layer on one channel) is read in place from padded input
    // rows: its patch matrix would be copied tap run by tap run, 3 values at a time.
    let small_k = wino.is_none() && k <= SMALL_K && !g.is_pointwise();
    let offs = if small_k {
        patch_offsets_in(&g, g.ow + g.kw - 1)
    } else {
        Vec::new()
    };
    let with_bias = db.is_some();
    let parts = ordered_parts(
        tasks,
        // A Winograd partial starts empty: its first task writes it (`add_kernel_grad`).
        || {
            let partial = if wino.is_some() {
                Vec::new()
            } else {
                vec![0.0f32; partial_len]
            };
            (partial, vec![0.0f64; g.c_out])
        },
        |(mut acc, mut bias), t| {
            let (r0, r1) = rows_of(t);
            let range = r0 * out_row..r1 * out_row;
            let pixels = range.len() / g.c_out;
            let product_len = match (wino, tiles_of(t)) {
                (Some((c, _)), Some(tiles)) => c.scratch_len(tiles),
                _ if g.is_pointwise() => 0,
                _ if small_k => (r1 - r0 + g.kh - 1) * (g.ow + g.kw - 1) * g.c_in,
                _ => pixels * k,
            };
            let dz_len = match grad {
                OutputGrad::Dz(_) => 0,
                OutputGrad::Activated { .. } | OutputGrad::Normalized(..) => range.len(),
            };
            // One scratch buffer for both: a nested `with_scratch` would allocate.
            with_scratch(product_len + dz_len, |buf| {
                let (scratch, dz_buf) = buf.split_at_mut(product_len);
                let dz: &[f32] = match grad {
                    OutputGrad::Dz(dz) => &dz[range.clone()],
                    OutputGrad::Activated { dy, y, act } => {
                        act_backward_leaf(&dy[range.clone()], &y[range.clone()], dz_buf, act);
                        dz_buf
                    }
                    OutputGrad::Normalized(norm) => {
                        norm.rows(range.start / g.c_out, dz_buf);
                        dz_buf
                    }
                };
                if with_bias {
                    sum_rows_leaf(dz, g.c_out, &mut bias);
                }
                if let (Some((c, _)), Some(tiles)) = (wino, tiles_of(t)) {
                    winograd::add_kernel_grad(x, dz, &c, tiles, &mut acc, scratch);
                    return;
                }
                if small_k {
                    small_k_rows(x, dz, &g, (r0, r1), &offs, (&mut acc, &mut []), scratch);
                    return;
                }
                let patches: &[f32] = if g.is_pointwise() {
                    &x[r0 * g.ow * k..(r0 * g.ow + pixels) * k]
                } else {
                    g.im2col(x, r0, pixels / g.ow, scratch);
                    scratch
                };
                let (lhs, rhs) = (
                    Strided::transposed(patches, k),
                    Strided::row_major(dz, g.c_out),
                );
                gemm_strided(&mut acc, k, g.c_out, pixels, lhs, rhs, true, false);
            });
            (acc, bias)
        },
    );
    let (parts, bias_parts): (Vec<_>, Vec<_>) = parts.into_iter().unzip();
    let total = add_parts(parts).unwrap_or_else(|| vec![0.0; partial_len]);
    match wino {
        Some((c, _)) => winograd::kernel_from_grad(&total, dk, &c),
        None => dk.copy_from_slice(&total),
    }
    if let Some(db) = db {
        let bias = add_parts(bias_parts).unwrap_or_else(|| vec![0.0; g.c_out]);
        db.iter_mut().zip(&bias).for_each(|(d, &b)| *d = b as f32);
    }
}

/// `dk += patches(x)ᵀ · dz` over output rows `[r0, r1)` (batch-flattened; `dz` holds those
/// rows) for a small patch, and the column sums of `dz` added to `sums` unless it is empty:
/// image by image, from a zero-padded copy of the input rows they read
/// ([`small_k_kernel_grad`], the sums in registers). `pad` holds at least `(min(r1 - r0, oh)
/// + kh - 1) * (ow + kw - 1) * c_in` floats.
fn small_k_rows(
    x: &[f32],
    dz: &[f32],
    g: &Geometry,
    (r0, r1): (usize, usize),
    offs: &[usize],
    (dk, sums): (&mut [f32], &mut [f64]),
    pad: &mut [f32],
) {
    let (wp, out_row) = (g.ow + g.kw - 1, g.ow * g.c_out);
    let mut r = r0;
    while r < r1 {
        let end = ((r / g.oh + 1) * g.oh).min(r1);
        let padded = &mut pad[..(end - r + g.kh - 1) * wp * g.c_in];
        g.pad_rows(x, r, padded);
        let p = SmallKGrad {
            lhs: padded,
            rs: wp * g.c_in,
            ps: g.c_in,
            w: g.ow,
            offs,
            dz: &dz[(r - r0) * out_row..(end - r0) * out_row],
            n: g.c_out,
        };
        small_k_kernel_grad(&p, dk, sums);
        r = end;
    }
}
