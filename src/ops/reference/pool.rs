//! Max-pooling (2×2), average pooling and the global poolings, with their gradients.

use crate::ops::spec::Pool2dShape;
use crate::ops::spec::PoolShape;

/// The input positions of the 2×2 window of output `(n, i, j, c)`, in window order
/// (0,0), (0,1), (1,0), (1,1).
fn pool_window(s: &PoolShape, n: usize, i: usize, j: usize, c: usize) -> [usize; 4] {
    let at = |r: usize, q: usize| ((n * s.h + r) * s.w + q) * s.c + c;
    [
        at(2 * i, 2 * j),
        at(2 * i, 2 * j + 1),
        at(2 * i + 1, 2 * j),
        at(2 * i + 1, 2 * j + 1),
    ]
}

/// The position of the first maximum of the window (a later element must be strictly larger
/// to win).
fn pool_argmax(x: &[f64], window: [usize; 4]) -> usize {
    let mut best = window[0];
    for &p in &window[1..] {
        if x[p] > x[best] {
            best = p;
        }
    }
    best
}

/// `y[n, i, j, c] = max` of `x` over the 2×2 window at `(2i, 2j)` ('valid', stride 2).
pub fn maxpool_forward(x: &[f64], s: &PoolShape) -> Vec<f64> {
    let (oh, ow) = s.out_hw();
    let mut y = vec![0.0; s.output_len()];
    for n in 0..s.n {
        for i in 0..oh {
            for j in 0..ow {
                for c in 0..s.c {
                    y[((n * oh + i) * ow + j) * s.c + c] =
                        x[pool_argmax(x, pool_window(s, n, i, j, c))];
                }
            }
        }
    }
    y
}

/// `dx`: each `dy[n, i, j, c]` added at its window's first maximum; 0 everywhere else.
pub fn maxpool_backward(x: &[f64], dy: &[f64], s: &PoolShape) -> Vec<f64> {
    let (oh, ow) = s.out_hw();
    let mut dx = vec![0.0; s.input_len()];
    for n in 0..s.n {
        for i in 0..oh {
            for j in 0..ow {
                for c in 0..s.c {
                    dx[pool_argmax(x, pool_window(s, n, i, j, c))] +=
                        dy[((n * oh + i) * ow + j) * s.c + c];
                }
            }
        }
    }
    dx
}

/// The input rows and columns of output `(i, j)`'s window, clipped to the image: `(rows,
/// cols)` as half-open ranges.
pub fn pool2d_window(
    s: &Pool2dShape,
    i: usize,
    j: usize,
) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    let (pt, pl) = s.pad_top_left();
    let range = |o: usize, stride: usize, k: usize, pad: usize, size: usize| {
        let start = (o * stride) as isize - pad as isize;
        let end = (start + k as isize).min(size as isize);
        (start.max(0) as usize)..(end.max(0) as usize)
    };
    (
        range(i, s.strides.0, s.pool.0, pt, s.h),
        range(j, s.strides.1, s.pool.1, pl, s.w),
    )
}

/// `tf.nn.avg_pool2d`: each output the mean of its window's elements inside the image
/// ('same' windows that overhang divide by the count of real elements).
pub fn avg_pool2d(x: &[f64], s: &Pool2dShape) -> Vec<f64> {
    let (oh, ow) = s.out_hw();
    let mut y = vec![0.0; s.output_len()];
    for n in 0..s.n {
        for i in 0..oh {
            for j in 0..ow {
                let (rows, cols) = pool2d_window(s, i, j);
                let count = (rows.len() * cols.len()) as f64;
                for c in 0..s.c {
                    let mut sum = 0.0;
                    for r in rows.clone() {
                        for q in cols.clone() {
                            sum += x[((n * s.h + r) * s.w + q) * s.c + c];
                        }
                    }
                    y[((n * oh + i) * ow + j) * s.c + c] = sum / count;
                }
            }
        }
    }
    y
}

/// Gradient of [`avg_pool2d`]: each `dy` spread evenly over its window's real elements.
pub fn avg_pool2d_backward(dy: &[f64], s: &Pool2dShape) -> Vec<f64> {
    let (oh, ow) = s.out_hw();
    let mut dx = vec![0.0; s.input_len()];
    for n in 0..s.n {
        for i in 0..oh {
            for j in 0..ow {
                let (rows, cols) = pool2d_window(s, i, j);
                let count = (rows.len() * cols.len()) as f64;
                for c in 0..s.c {
                    let g = dy[((n * oh + i) * ow + j) * s.c + c] / count;
                    for r in rows.clone() {
                        for q in cols.clone() {
                            dx[((n * s.h + r) * s.w + q) * s.c + c] += g;
                        }
                    }
                }
            }
        }
    }
    dx
}

/// `tf.nn.max_pool2d`: each output the maximum of its window's elements inside the image.
pub fn max_pool2d_window(x: &[f64], s: &Pool2dShape) -> Vec<f64> {
    let (oh, ow) = s.out_hw();
    let mut y = vec![0.0; s.output_len()];
    for n in 0..s.n {
        for i in 0..oh {
            for j in 0..ow {
                let (rows, cols) = pool2d_window(s, i, j);
                for c in 0..s.c {
                    let mut m = f64::NEG_INFINITY;
                    for r in rows.clone() {
                        for q in cols.clone() {
                            m = m.max(x[((n * s.h + r) * s.w + q) * s.c + c]);
                        }
                    }
                    y[((n * oh + i) * ow + j) * s.c + c] = m;
                }
            }
        }
    }
    y
}

/// Gradient of [`max_pool2d_window`] (`tf.raw_ops.MaxPoolGrad`): each `dy` added at its
/// window's first maximum in row-major order.
pub fn max_pool2d_window_backward(x: &[f64], dy: &[f64], s: &Pool2dShape) -> Vec<f64> {
    let (oh, ow) = s.out_hw();
    let mut dx = vec![0.0; s.input_len()];
    for n in 0..s.n {
        for i in 0..oh {
            for j in 0..ow {
                let (rows, cols) = pool2d_window(s, i, j);
                if rows.is_empty() || cols.is_empty() {
                    continue;
                }
                for c in 0..s.c {
                    let first = ((n * s.h + rows.start) * s.w + cols.start) * s.c + c;
                    let mut best = (x[first], first);
                    for r in rows.clone() {
                        for q in cols.clone() {
                            let at = ((n * s.h + r) * s.w + q) * s.c + c;
                            if x[at] > best.0 {
                                best = (x[at], at);
                            }
                        }
                    }
                    dx[best.1] += dy[((n * oh + i) * ow + j) * s.c + c];
                }
            }
        }
    }
    dx
}

/// `[n, c]` means over the `hw` pixels of `x` `[n, hw, c]`.
pub fn global_avg_pool(x: &[f64], n: usize, hw: usize, c: usize) -> Vec<f64> {
    let mut y = vec![0.0; n * c];
    for b in 0..n {
        for p in 0..hw {
            for k in 0..c {
                y[b * c + k] += x[(b * hw + p) * c + k] / hw as f64;
            }
        }
    }
    y
}

/// Gradient of [`global_avg_pool`]: `dy[b, k] / hw` at every pixel.
pub fn global_avg_pool_backward(dy: &[f64], n: usize, hw: usize, c: usize) -> Vec<f64> {
    (0..n * hw * c)
        .map(|i| dy[(i / (hw * c)) * c + i % c] / hw as f64)
        .collect()
}

/// `[n, c]` maxima over the `hw` pixels of `x` `[n, hw, c]`.
pub fn global_max_pool(x: &[f64], n: usize, hw: usize, c: usize) -> Vec<f64> {
    let mut y = vec![f64::NEG_INFINITY; n * c];
    for b in 0..n {
        for p in 0..hw {
            for k in 0..c {
                y[b * c + k] = y[b * c + k].max(x[(b * hw + p) * c + k]);
            }
        }
    }
    y
}

/// Gradient of [`global_max_pool`] as TensorFlow's `reduce_max`: `dy` shared equally by the
/// pixels that equal the maximum.
pub fn global_max_pool_backward(x: &[f64], dy: &[f64], n: usize, hw: usize, c: usize) -> Vec<f64> {
    let y = global_max_pool(x, n, hw, c);
    let mut ties = vec![0usize; n * c];
    for (i, &v) in x.iter().enumerate() {
        let o = (i / (hw * c)) * c + i % c;
        ties[o] += usize::from(v == y[o]);
    }
    x.iter()
        .enumerate()
        .map(|(i, &v)| {
            let o = (i / (hw * c)) * c + i % c;
            if v == y[o] {
                dy[o] / ties[o] as f64
            } else {
                0.0
            }
        })
        .collect()
}
