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
            // Indices wrap at 2^32, as the GPU's u32 index does.
            masked(x, y, mask, m, (chunk * PAR_CHUNK) as u32);
        });
}

multiversion! {
    /// [`dropout`] of a chunk whose first element has index `first`: compiled for AVX2 and
    /// AVX-512 the hash's 32-bit products run 8 or 16 lanes at a time (the baseline target
    /// has no vector 32-bit multiply: 7 ns an element).
    fn masked(x: &[f32], y: &mut [f32], mask: &mut [f32], m: &DropoutMask, first: u32) {
        for (k, ((y, mask), &x)) in y.iter_mut().zip(mask).zip(x).enumerate() {
            let i = first.wrapping_add(k as u32);
            *mask = if m.keeps(i) { m.scale } else { 0.0 };
            *y = x * *mask;
        }
    }
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
