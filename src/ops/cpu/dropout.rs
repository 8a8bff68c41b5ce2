//! Dropout on CPU:0: the mask of [`DropoutMask`], the same function of `(key, index)` as the
//! WGSL kernel's, so a key drops the same elements on every device.

use rayon::prelude::*;

use crate::ops::cpu::PAR_CHUNK;
use crate::ops::spec::DropoutMask;

/// `mask[i] = keeps(i) ? scale : 0` and `y[i] = x[i] * mask[i]` (the forward pass).
pub(crate) fn dropout(x: &[f32], y: &mut [f32], mask: &mut [f32], m: &DropoutMask) {
    let n = x.len().min(y.len()).min(mask.len());
    y[..n]
        .par_chunks_mut(PAR_CHUNK)
        .zip(mask[..n].par_chunks_mut(PAR_CHUNK))
        .zip(x[..n].par_chunks(PAR_CHUNK))
        .enumerate()
        .for_each(|(chunk, ((y, mask), x))| {
            let first = chunk * PAR_CHUNK;
            for (k, ((y, mask), &x)) in y.iter_mut().zip(mask).zip(x).enumerate() {
                // Indices wrap at 2^32, as the GPU's u32 index does.
                let i = (first + k) as u32;
                *mask = if m.keeps(i) { m.scale } else { 0.0 };
                *y = x * *mask;
            }
        });
}

/// `dx = dy * mask` (the backward pass).
pub(crate) fn dropout_grad(dy: &[f32], mask: &[f32], dx: &mut [f32]) {
    let n = dy.len().min(dx.len()).min(mask.len());
    dx[..n]
        .par_chunks_mut(PAR_CHUNK)
        .zip(
            dy[..n]
                .par_chunks(PAR_CHUNK)
                .zip(mask[..n].par_chunks(PAR_CHUNK)),
        )
        .for_each(|(dx, (dy, mask))| {
            for ((dx, &g), &m) in dx.iter_mut().zip(dy).zip(mask) {
                *dx = g * m;
            }
        });
}
