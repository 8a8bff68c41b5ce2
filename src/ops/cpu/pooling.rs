//! Average and max pooling with any window, strides and padding, and the global poolings, on
//! the CPU (the formulas of `shaders/pooling.wgsl`), parallel over images.

use rayon::prelude::*;

use crate::ops::spec::{Pool2dShape, PoolShape};

/// The window of output `(i, j)` clipped to the image: rows `r0..r1`, columns `q0..q1`.
fn window(s: &Pool2dShape, (pt, pl): (usize, usize), i: usize, j: usize) -> [usize; 4] {
    let clip = |o: usize, stride: usize, k: usize, pad: usize, size: usize| {
        let start = (o * stride).saturating_sub(pad);
        let end = (o * stride + k).saturating_sub(pad).min(size);
        (start, end.max(start))
    };
    let (r0, r1) = clip(i, s.strides.0, s.pool.0, pt, s.h);
    let (q0, q1) = clip(j, s.strides.1, s.pool.1, pl, s.w);
    [r0, r1, q0, q1]
}

/// `y` `[n, oh, ow, c]`: each window's elements inside the image folded per channel from
/// `init` by `fold`, then `finish(outputs, elements in the window)`.
fn reduce_windows(
    x: &[f32],
    y: &mut [f32],
    s: &Pool2dShape,
    (init, fold): (f32, impl Fn(f32, f32) -> f32 + Sync),
    finish: impl Fn(&mut [f32], usize) + Sync,
) {
    let (oh, ow) = s.out_hw();
    let (image, out) = (s.h * s.w * s.c, oh * ow * s.c);
    if out == 0 || s.c == 0 {
        return;
    }
    let pad = s.pad_top_left();
    y.par_chunks_mut(out)
        .zip(x.par_chunks(image))
        .for_each(|(y, x)| {
            for i in 0..oh {
                for j in 0..ow {
                    let [r0, r1, q0, q1] = window(s, pad, i, j);
                    let yo = &mut y[(i * ow + j) * s.c..][..s.c];
                    yo.fill(init);
                    for r in r0..r1 {
                        for q in q0..q1 {
                            let xi = &x[(r * s.w + q) * s.c..][..s.c];
                            for (y, &x) in yo.iter_mut().zip(xi) {
                                *y = fold(*y, x);
                            }
                        }
                    }
                    finish(yo, (r1 - r0) * (q1 - q0));
                }
            }
        });
}

/// `y` `[n, oh, ow, c]`: the mean of each window's real elements ('same' windows that overhang
/// divide by their count inside the image, as TensorFlow does).
pub(crate) fn avg_pool2d(x: &[f32], y: &mut [f32], s: &Pool2dShape) {
    let mean = |yo: &mut [f32], count: usize| {
        let inv = 1.0 / count as f32;
        yo.iter_mut().for_each(|y| *y *= inv);
    };
    reduce_windows(x, y, s, (0.0, |a, b| a + b), mean);
}

/// `dx` `[n, h, w, c]`: each `dy` spread evenly over its window's real elements.
pub(crate) fn avg_pool2d_backward(dy: &[f32], dx: &mut [f32], s: &Pool2dShape) {
    let (oh, ow) = s.out_hw();
    let (image, out) = (s.h * s.w * s.c, oh * ow * s.c);
    if image == 0 {
        return;
    }
    let pad = s.pad_top_left();
    dx.par_chunks_mut(image).enumerate().for_each(|(b, dx)| {
        dx.fill(0.0);
        if out == 0 {
            return;
        }
        let dy = &dy[b * out..][..out];
        for i in 0..oh {
            for j in 0..ow {
                let [r0, r1, q0, q1] = window(s, pad, i, j);
                let inv = 1.0 / ((r1 - r0) * (q1 - q0)) as f32;
                let g = &dy[(i * ow + j) * s.c..][..s.c];
                for r in r0..r1 {
                    for q in q0..q1 {
                        let d = &mut dx[(r * s.w + q) * s.c..][..s.c];
                        for (d, &g) in d.iter_mut().zip(g) {
                            *d += g * inv;
                        }
                    }
                }
            }
        }
    });
}

/// `y` `[n, oh, ow, c]`: the maximum of each window's elements inside the image (`'same'`
/// padding never wins, as in TensorFlow).
pub(crate) fn max_pool2d(x: &[f32], y: &mut [f32], s: &Pool2dShape) {
    reduce_windows(x, y, s, (f32::NEG_INFINITY, f32::max), |_, _| {});
}

/// `dx` `[n, h, w, c]`: each `dy` added at its window's first maximum in row-major order
/// (TensorFlow's `MaxPoolGrad`), 0 where no window's maximum lies.
pub(crate) fn max_pool2d_backward(x: &[f32], dy: &[f32], dx: &mut [f32], s: &Pool2dShape) {
    let (oh, ow) = s.out_hw();
    let (image, out) = (s.h * s.w * s.c, oh * ow * s.c);
    if image == 0 {
        return;
    }
    let pad = s.pad_top_left();
    dx.par_chunks_mut(image).enumerate().for_each(|(b, dx)| {
        dx.fill(0.0);
        if out == 0 {
            return;
        }
        let (x, dy) = (&x[b * image..][..image], &dy[b * out..][..out]);
        // Per channel: the window's maximum so far and where it is.
        let (mut best, mut at) = (vec![0.0f32; s.c], vec![0usize; s.c]);
        for i in 0..oh {
            for j in 0..ow {
                let [r0, r1, q0, q1] = window(s, pad, i, j);
                if r0 == r1 || q0 == q1 {
                    continue;
                }
                // The first element, then only a strictly greater one: ties keep the first.
                let first = (r0 * s.w + q0) * s.c;
                best.copy_from_slice(&x[first..][..s.c]);
                at.fill(first);
                for r in r0..r1 {
                    for q in q0..q1 {
                        let base = (r * s.w + q) * s.c;
                        for (k, &v) in x[base..][..s.c].iter().enumerate() {
                            if v > best[k] {
                                best[k] = v;
                                at[k] = base;
                            }
                        }
                    }
                }
                let g = &dy[(i * ow + j) * s.c..][..s.c];
                for (k, (&g, &base)) in g.iter().zip(&at).enumerate() {
                    dx[base + k] += g;
                }
            }
        }
    });
}

/// `y` `[n, c]`: the mean over each image's pixels.
pub(crate) fn global_avg_pool(x: &[f32], y: &mut [f32], s: &PoolShape) {
    let (hw, c) = (s.h * s.w, s.c);
    if c == 0 {
        return;
    }
    let inv = 1.0 / hw as f32;
    y.par_chunks_mut(c).enumerate().for_each(|(b, y)| {
        y.fill(0.0);
        for p in x[b * hw * c..][..hw * c].chunks_exact(c) {
            for (y, &x) in y.iter_mut().zip(p) {
                *y += x;
            }
        }
        for y in y.iter_mut() {
            *y *= inv;
        }
    });
}

/// `dx[b, p, c] = dy[b, c] / (h w)`.
pub(crate) fn global_avg_pool_backward(dy: &[f32], dx: &mut [f32], s: &PoolShape) {
    let (hw, c) = (s.h * s.w, s.c);
    if c == 0 || hw == 0 {
        return;
    }
    let inv = 1.0 / hw as f32;
    dx.par_chunks_mut(hw * c).enumerate().for_each(|(b, dx)| {
        let g = &dy[b * c..][..c];
        for p in dx.chunks_exact_mut(c) {
            for (d, &g) in p.iter_mut().zip(g) {
                *d = g * inv;
            }
        }
    });
}

/// `y` `[n, c]`: the maximum over each image's pixels.
pub(crate) fn global_max_pool(x: &[f32], y: &mut [f32], s: &PoolShape) {
    let (hw, c) = (s.h * s.w, s.c);
    if c == 0 {
        return;
    }
    y.par_chunks_mut(c).enumerate().for_each(|(b, y)| {
        y.fill(f32::NEG_INFINITY);
        for p in x[b * hw * c..][..hw * c].chunks_exact(c) {
            for (y, &x) in y.iter_mut().zip(p) {
                *y = y.max(x);
            }
        }
    });
}

/// `dx`: `dy[b, c]` shared equally by the pixels equal to the maximum (TensorFlow's
/// `reduce_max` gradient), 0 elsewhere.
pub(crate) fn global_max_pool_backward(x: &[f32], dy: &[f32], dx: &mut [f32], s: &PoolShape) {
    let (hw, c) = (s.h * s.w, s.c);
    if c == 0 || hw == 0 {
        return;
    }
    dx.par_chunks_mut(hw * c).enumerate().for_each(|(b, dx)| {
        let x = &x[b * hw * c..][..hw * c];
        let mut max = vec![f32::NEG_INFINITY; c];
        for p in x.chunks_exact(c) {
            for (m, &x) in max.iter_mut().zip(p) {
                *m = m.max(x);
            }
        }
        let mut ties = vec![0u32; c];
        for p in x.chunks_exact(c) {
            for ((t, &m), &x) in ties.iter_mut().zip(&max).zip(p) {
                *t += u32::from(x == m);
            }
        }
        let g = &dy[b * c..][..c];
        for (d, x) in dx.chunks_exact_mut(c).zip(x.chunks_exact(c)) {
            for k in 0..c {
                d[k] = if x[k] == max[k] {
                    g[k] / ties[k] as f32
                } else {
                    0.0
                };
            }
        }
    });
}
