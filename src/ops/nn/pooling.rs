//! Average and max pooling with any window, strides and padding, and the global poolings: the
//! ops of Keras' `AveragePooling2D`, `MaxPooling2D`, `GlobalAveragePooling2D` and
//! `GlobalMaxPooling2D`.

use crate::error::{Error, Result};
use crate::ops::gpu::pooling as gp;
use crate::ops::spec::{Padding, Pool2dShape, PoolShape};
use crate::ops::{run, with_kernels};
use crate::placement::OpInfo;
use crate::tensor::Tensor;

use super::{float_dtype, mismatch, op, rank4};

const AVG_POOL: OpInfo = op("AvgPool", &[gp::AVGPOOL]);
const AVG_POOL_GRAD: OpInfo = op("AvgPoolGrad", &[gp::AVGPOOL_BWD]);
const MAX_POOL: OpInfo = op("MaxPool", &[gp::MAXPOOL]);
const MAX_POOL_GRAD: OpInfo = op("MaxPoolGrad", &[gp::MAXPOOL_BWD]);
const GLOBAL_AVG: OpInfo = op("Mean", &[gp::GLOBAL_AVG]);
const GLOBAL_AVG_GRAD: OpInfo = op("MeanGrad", &[gp::GLOBAL_AVG_BWD]);
const GLOBAL_MAX: OpInfo = op("Max", &[gp::GLOBAL_MAX]);
const GLOBAL_MAX_GRAD: OpInfo = op("MaxGrad", &[gp::GLOBAL_MAX_BWD]);

/// The window geometry of a pool over `x_shape` `[n, h, w, c]`, checked.
fn pool2d_shape(
    name: &'static str,
    x_shape: &[usize],
    pool: (usize, usize),
    strides: (usize, usize),
    padding: Padding,
) -> Result<Pool2dShape> {
    let [n, h, w, c] = rank4(name, x_shape, &[pool.0, pool.1], "the input (NHWC)")?;
    if pool.0 == 0 || pool.1 == 0 || strides.0 == 0 || strides.1 == 0 {
        return Err(Error::InvalidArgument(format!(
            "{name}: pool_size {pool:?} and strides {strides:?} must be positive"
        )));
    }
    Ok(Pool2dShape {
        n,
        h,
        w,
        c,
        pool,
        strides,
        padding,
    })
}

/// Average pooling (`tf.nn.avg_pool2d(x, pool, strides, padding)`, Keras'
/// `AveragePooling2D`): `[n, h, w, c]` → `[n, oh, ow, c]`, each output the mean of its
/// window's elements inside the image ('same' windows that overhang divide by the count of
/// real elements, as TensorFlow does).
///
/// ```
/// use anygpu::ops::{self, spec::Padding};
/// use anygpu::Tensor;
/// let x = Tensor::from_vec((1..=9).map(|v| v as f32).collect(), &[1, 3, 3, 1])?;
/// let y = ops::avg_pool2d(&x, (2, 2), (2, 2), Padding::Same)?;
/// // Windows {1,2,4,5}, {3,6}, {7,8}, {9}.
/// assert_eq!(y.to_vec::<f32>()?, [3.0, 4.5, 7.5, 9.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// A tensor that is not float or not rank 4; a zero window or stride.
pub fn avg_pool2d(
    x: &Tensor,
    pool: (usize, usize),
    strides: (usize, usize),
    padding: Padding,
) -> Result<Tensor> {
    let name = AVG_POOL.name;
    let dtype = float_dtype(name, &[x])?;
    let s = pool2d_shape(name, x.shape(), pool, strides, padding)?;
    let (oh, ow) = s.out_hw();
    run(&AVG_POOL, &[x], |device, moved| {
        let y = Tensor::uninit(&[s.n, oh, ow, s.c], dtype, device)?;
        with_kernels(device, |_, nk| nk.avg_pool2d(&moved[0], &y, &s))?;
        Ok(y)
    })
}

/// Gradient of [`avg_pool2d`] (`tf.raw_ops.AvgPoolGrad`): each `dy` spread evenly over its
/// window's elements, into a tensor of `x_shape`.
///
/// # Errors
/// As [`avg_pool2d`]; a `dy` that is not the pooled shape.
pub fn avg_pool2d_backward(
    dy: &Tensor,
    x_shape: &[usize],
    pool: (usize, usize),
    strides: (usize, usize),
    padding: Padding,
) -> Result<Tensor> {
    let name = AVG_POOL_GRAD.name;
    let dtype = float_dtype(name, &[dy])?;
    let s = pool2d_shape(name, x_shape, pool, strides, padding)?;
    let (oh, ow) = s.out_hw();
    if dy.shape() != [s.n, oh, ow, s.c] {
        return Err(mismatch(
            name,
            x_shape,
            dy.shape(),
            format!(": dy must have the pooled shape {:?}", [s.n, oh, ow, s.c]),
        ));
    }
    run(&AVG_POOL_GRAD, &[dy], |device, moved| {
        let dx = Tensor::uninit(x_shape, dtype, device)?;
        with_kernels(device, |_, nk| nk.avg_pool2d_backward(&moved[0], &dx, &s))?;
        Ok(dx)
    })
}

/// Whether `s` is the tutorial's pool (2×2, stride 2, 'valid'), which has its own tuned
/// kernels ([`super::max_pool2d`]).
fn is_two_by_two(s: &Pool2dShape) -> bool {
    s.pool == (2, 2) && s.strides == (2, 2) && s.padding == Padding::Valid
}

/// Max pooling (`tf.nn.max_pool2d(x, pool, strides, padding)`, Keras' `MaxPooling2D`):
/// `[n, h, w, c]` → `[n, oh, ow, c]`, each output the maximum of its window's elements inside
/// the image (`'same'` padding never wins). The 2×2, stride-2 `'valid'` pool runs the tuned
/// kernels of [`super::max_pool2d`].
///
/// ```
/// use anygpu::ops::{self, spec::Padding};
/// use anygpu::Tensor;
/// let x = Tensor::from_vec((1..=9).map(|v| v as f32).collect(), &[1, 3, 3, 1])?;
/// // 3×3 windows, stride 2, 'same': {1,2,4,5}, {2,3,5,6}, {4,5,7,8}, {5,6,8,9}.
/// let y = ops::max_pool2d_window(&x, (3, 3), (2, 2), Padding::Same)?;
/// assert_eq!(y.to_vec::<f32>()?, [5.0, 6.0, 8.0, 9.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// A tensor that is not float or not rank 4; a zero window or stride.
pub fn max_pool2d_window(
    x: &Tensor,
    pool: (usize, usize),
    strides: (usize, usize),
    padding: Padding,
) -> Result<Tensor> {
    let name = MAX_POOL.name;
    let dtype = float_dtype(name, &[x])?;
    let s = pool2d_shape(name, x.shape(), pool, strides, padding)?;
    if is_two_by_two(&s) {
        return super::max_pool2d(x);
    }
    let (oh, ow) = s.out_hw();
    run(&MAX_POOL, &[x], |device, moved| {
        let y = Tensor::uninit(&[s.n, oh, ow, s.c], dtype, device)?;
        with_kernels(device, |_, nk| nk.max_pool2d_window(&moved[0], &y, &s))?;
        Ok(y)
    })
}

/// Gradient of [`max_pool2d_window`] (`tf.raw_ops.MaxPoolGrad`): each `dy` added at its
/// window's first maximum in row-major order (recomputed from `x`), 0 elsewhere.
///
/// # Errors
/// As [`max_pool2d_window`]; a `dy` that is not the pooled shape.
pub fn max_pool2d_window_backward(
    x: &Tensor,
    dy: &Tensor,
    pool: (usize, usize),
    strides: (usize, usize),
    padding: Padding,
) -> Result<Tensor> {
    let name = MAX_POOL_GRAD.name;
    let dtype = float_dtype(name, &[x, dy])?;
    let s = pool2d_shape(name, x.shape(), pool, strides, padding)?;
    let (oh, ow) = s.out_hw();
    if dy.shape() != [s.n, oh, ow, s.c] {
        return Err(mismatch(
            name,
            x.shape(),
            dy.shape(),
            format!(": dy must have the pooled shape {:?}", [s.n, oh, ow, s.c]),
        ));
    }
    if is_two_by_two(&s) {
        return super::max_pool2d_backward(x, dy);
    }
    run(&MAX_POOL_GRAD, &[x, dy], |device, moved| {
        let dx = Tensor::uninit(x.shape(), dtype, device)?;
        with_kernels(device, |_, nk| {
            nk.max_pool2d_window_backward(&moved[0], &moved[1], &dx, &s)
        })?;
        Ok(dx)
    })
}

fn global_shape(name: &'static str, x_shape: &[usize]) -> Result<PoolShape> {
    let [n, h, w, c] = rank4(name, x_shape, &[], "the input (NHWC)")?;
    Ok(PoolShape { n, h, w, c })
}

/// The mean (`max == false`, Keras' `GlobalAveragePooling2D`) or maximum
/// (`GlobalMaxPooling2D`) over each image's pixels: `[n, h, w, c]` → `[n, c]`.
///
/// ```
/// use anygpu::ops;
/// use anygpu::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32, -1.0, 3.0, 5.0], &[1, 2, 1, 2])?;
/// assert_eq!(ops::global_pool2d(&x, false)?.to_vec::<f32>()?, [2.0, 2.0]);
/// assert_eq!(ops::global_pool2d(&x, true)?.to_vec::<f32>()?, [3.0, 5.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// A tensor that is not float or not rank 4.
pub fn global_pool2d(x: &Tensor, max: bool) -> Result<Tensor> {
    let info = if max { &GLOBAL_MAX } else { &GLOBAL_AVG };
    let dtype = float_dtype(info.name, &[x])?;
    let s = global_shape(info.name, x.shape())?;
    run(info, &[x], |device, moved| {
        let y = Tensor::uninit(&[s.n, s.c], dtype, device)?;
        with_kernels(device, |_, nk| nk.global_pool(max, &moved[0], &y, &s))?;
        Ok(y)
    })
}

/// Gradient of [`global_pool2d`]: for the mean, `dy[n, c] / (h w)` at every pixel; for the
/// maximum, `dy[n, c]` shared equally by the pixels equal to the maximum (TensorFlow's
/// `reduce_max` gradient), 0 elsewhere. `x` is the pool's input, `dy` `[n, c]`.
///
/// # Errors
/// As [`global_pool2d`]; a `dy` that is not `[n, c]`.
pub fn global_pool2d_backward(x: &Tensor, dy: &Tensor, max: bool) -> Result<Tensor> {
    let info = if max {
        &GLOBAL_MAX_GRAD
    } else {
        &GLOBAL_AVG_GRAD
    };
    let dtype = float_dtype(info.name, &[x, dy])?;
    let s = global_shape(info.name, x.shape())?;
    if dy.shape() != [s.n, s.c] {
        return Err(mismatch(
            info.name,
            x.shape(),
            dy.shape(),
            format!(": dy must be [{}, {}]", s.n, s.c),
        ));
    }
    // The mean's gradient does not read x: only dy travels to the op's device.
    let inputs: &[&Tensor] = if max { &[dy, x] } else { &[dy] };
    run(info, inputs, |device, moved| {
        let dx = Tensor::uninit(x.shape(), dtype, device)?;
        with_kernels(device, |_, nk| {
            if max {
                nk.global_max_pool_backward(&moved[1], &moved[0], &dx, &s)
            } else {
                nk.global_avg_pool_backward(&moved[0], &dx, &s)
            }
        })?;
        Ok(dx)
    })
}
