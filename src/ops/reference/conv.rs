//! The convolutions, strided, dilated and grouped (`Conv2D` and depthwise alike), and the bias
//! gradient.

use crate::ops::spec::{Activation, Conv2dShape, ConvGeometry, DepthwiseShape};

use super::*;

/// `y[n, i, j, o] = act(bias[o] + Σ_{a, b, c} x[n, i*sh + a*dh - pt, j*sw + b*dw - pl, g*cig + c]
/// * k[a, b, c, o])` with `g = o / cog`, out-of-range `x` reading as zero.
fn grouped_forward(x: &[f64], kernel: &[f64], bias: Option<&[f64]>, g: &ConvGeometry) -> Vec<f64> {
    let mut y = vec![0.0; g.n * g.oh * g.ow * g.co];
    for n in 0..g.n {
        for i in 0..g.oh {
            for j in 0..g.ow {
                for o in 0..g.co {
                    let mut acc = bias.map_or(0.0, |b| b[o]);
                    let c0 = o / g.cog * g.cig;
                    for a in 0..g.kh {
                        for b in 0..g.kw {
                            let (Some(ii), Some(jj)) = (g.in_row(i, a), g.in_col(j, b)) else {
                                continue;
                            };
                            for c in 0..g.cig {
                                acc += x[((n * g.h + ii) * g.w + jj) * g.ci + c0 + c]
                                    * kernel[((a * g.kw + b) * g.cig + c) * g.co + o];
                            }
                        }
                    }
                    y[((n * g.oh + i) * g.ow + j) * g.co + o] = acc;
                }
            }
        }
    }
    y
}

/// Visits every (input index, kernel index, output index) triple of a grouped convolution.
fn grouped_taps(g: &ConvGeometry, mut f: impl FnMut(usize, usize, usize)) {
    for n in 0..g.n {
        for i in 0..g.oh {
            for j in 0..g.ow {
                for o in 0..g.co {
                    let c0 = o / g.cog * g.cig;
                    for a in 0..g.kh {
                        for b in 0..g.kw {
                            let (Some(ii), Some(jj)) = (g.in_row(i, a), g.in_col(j, b)) else {
                                continue;
                            };
                            for c in 0..g.cig {
                                f(
                                    ((n * g.h + ii) * g.w + jj) * g.ci + c0 + c,
                                    ((a * g.kw + b) * g.cig + c) * g.co + o,
                                    ((n * g.oh + i) * g.ow + j) * g.co + o,
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

fn grouped_backward_input(dz: &[f64], kernel: &[f64], g: &ConvGeometry) -> Vec<f64> {
    let mut dx = vec![0.0; g.n * g.h * g.w * g.ci];
    grouped_taps(g, |xi, ki, yi| dx[xi] += dz[yi] * kernel[ki]);
    dx
}

fn grouped_backward_kernel(x: &[f64], dz: &[f64], g: &ConvGeometry) -> Vec<f64> {
    let mut dk = vec![0.0; g.kh * g.kw * g.cig * g.co];
    grouped_taps(g, |xi, ki, yi| dk[ki] += x[xi] * dz[yi]);
    dk
}

/// `y[n, i, j, o] = act(bias[o] + Σ_{a, b, c} x[n, i*sh + a*dh - pt, j*sw + b*dw - pl, c] *
/// k[a, b, c, o])`, out-of-range `x` reading as zero (`s.strides`, `s.dilation`, `s.padding`).
pub fn conv2d_forward(
    x: &[f64],
    kernel: &[f64],
    bias: Option<&[f64]>,
    s: &Conv2dShape,
    act: Activation,
) -> Vec<f64> {
    let z = grouped_forward(x, kernel, bias, &ConvGeometry::conv(s));
    activation(&z, act)
}

/// `dx[n, i*sh + a*dh - pt, j*sw + b*dw - pl, c] += dz[n, i, j, o] * k[a, b, c, o]`: the
/// gradient of `Σ dz * z` w.r.t. `x`, where `z` is the convolution's pre-activation output.
pub fn conv2d_backward_input(dz: &[f64], kernel: &[f64], s: &Conv2dShape) -> Vec<f64> {
    grouped_backward_input(dz, kernel, &ConvGeometry::conv(s))
}

/// `dk[a, b, c, o] = Σ_{n, i, j} x[n, i*sh + a*dh - pt, j*sw + b*dw - pl, c] * dz[n, i, j, o]`.
pub fn conv2d_backward_kernel(x: &[f64], dz: &[f64], s: &Conv2dShape) -> Vec<f64> {
    grouped_backward_kernel(x, dz, &ConvGeometry::conv(s))
}

/// Bias gradient of a layer whose pre-activation gradient is `dz` (`[rows, cols]`, channels
/// last): `db[c] = Σ_r dz[r, c]`.
pub fn bias_grad(dz: &[f64], cols: usize) -> Vec<f64> {
    sum_rows(dz, dz.len() / cols.max(1), cols)
}

/// `y[n, i, j, c*m + q] = Σ_{a, b} x[n, i*sh + a*dh - pt, j*sw + b*dw - pl, c] * k[a, b, c, q]`.
pub fn depthwise_forward(x: &[f64], kernel: &[f64], s: &DepthwiseShape) -> Vec<f64> {
    grouped_forward(x, kernel, None, &ConvGeometry::depthwise(s))
}

/// `dx[n, i*sh + a*dh - pt, j*sw + b*dw - pl, c] += dy[n, i, j, c*m + q] * k[a, b, c, q]`.
pub fn depthwise_backward_input(dy: &[f64], kernel: &[f64], s: &DepthwiseShape) -> Vec<f64> {
    grouped_backward_input(dy, kernel, &ConvGeometry::depthwise(s))
}

/// `dk[a, b, c, q] = Σ_{n, i, j} x[n, i*sh + a*dh - pt, j*sw + b*dw - pl, c] * dy[n, i, j, c*m + q]`.
pub fn depthwise_backward_kernel(x: &[f64], dy: &[f64], s: &DepthwiseShape) -> Vec<f64> {
    grouped_backward_kernel(x, dy, &ConvGeometry::depthwise(s))
}
