//! The dense layer's product (`Dense`): forward with bias and activation fused, the product
//! with transposed operands, and the fused gradient.

use crate::error::Result;
use crate::ops::basic::matmul_ex;
use crate::ops::gpu::nn as gn;
use crate::ops::nn_kernels::DenseGrads;
use crate::ops::spec::Activation;
use crate::ops::{run, with_kernels};
use crate::placement::OpInfo;
use crate::tensor::Tensor;

use super::{float_dtype, mismatch, op, GradDType};

const DENSE_BACKWARD: OpInfo = op("FusedDenseGrad", gn::DENSE_BACKWARD);

/// A dense layer, `act(x · w + b)` (Keras `Dense(units, activation=...)`): `x` `[batch, in]`,
/// `w` `[in, units]`, `b` `[units]`. Logged as `MatMul` (bias and activation are fused).
///
/// # Errors
/// Tensors not all float32 or all float16; shapes that do not fit together.
pub fn dense(x: &Tensor, w: &Tensor, b: Option<&Tensor>, act: Activation) -> Result<Tensor> {
    matmul_ex(x, w, false, false, b, act)
}

/// `op(a) · op(b)` with optional transposes (`tf.linalg.matmul(a, b, transpose_a, transpose_b)`),
/// for gradients: a dense layer's `dx = dz · wᵀ` is `matmul_transposed(dz, w, false, true)` and
/// `dw = xᵀ · dz` is `matmul_transposed(x, dz, true, false)`.
///
/// # Errors
/// Tensors not all float32 or all float16, or not 2-D; inner dimensions that differ.
pub fn matmul_transposed(a: &Tensor, b: &Tensor, trans_a: bool, trans_b: bool) -> Result<Tensor> {
    matmul_ex(a, b, trans_a, trans_b, None, Activation::Linear)
}

/// The gradients of a dense layer `y = act(x · w + b)` from `dy`, the gradient w.r.t. its
/// activated output `y`: with `dz = dy * act'(y)`, returns `(dx, dw, db)` = `(dz · wᵀ, xᵀ · dz,
/// Σ_rows dz)`, `dx` only when `need_dx`. `x` is `[m, k]`, `w` `[k, n]`, `y` and `dy` `[m, n]`.
///
/// One op for what is otherwise an activation gradient, a bias gradient and two matrix
/// products: on the CPU it runs block by block over the rows, so `dz` never goes through
/// memory (TensorFlow fuses the forward direction the same way, `_FusedMatMul`).
///
/// ```
/// use anygpu::ops::{self, spec::Activation};
/// use anygpu::Tensor;
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2])?;
/// let w = Tensor::from_vec(vec![0.5f32, -1.0], &[2, 1])?;
/// let y = Tensor::from_vec(vec![3.0f32], &[1, 1])?; // relu output, positive
/// let dy = Tensor::from_vec(vec![2.0f32], &[1, 1])?;
/// let (dx, dw, db) = ops::dense_backward(&x, &w, &y, &dy, Activation::Relu, true)?;
/// assert_eq!(dx.unwrap().to_vec::<f32>()?, [1.0, -2.0]);
/// assert_eq!(dw.to_vec::<f32>()?, [2.0, 4.0]);
/// assert_eq!(db.to_vec::<f32>()?, [2.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// Tensors not all float32 or all float16; shapes that do not fit together.
pub fn dense_backward(
    x: &Tensor,
    w: &Tensor,
    y: &Tensor,
    dy: &Tensor,
    act: Activation,
    need_dx: bool,
) -> Result<(Option<Tensor>, Tensor, Tensor)> {
    dense_backward_as(x, w, y, dy, act, need_dx, GradDType::Inputs)
}

/// [`dense_backward`] with `dw` and `db` in `grads`' dtype: float32 for float16 inputs is what
/// a layer hands its optimizer under mixed precision. The bias gradient comes out of its
/// float32 column sums as it is; the kernel gradient, a float16 product, is cast within the op.
///
/// # Errors
/// As [`dense_backward`].
pub fn dense_backward_as(
    x: &Tensor,
    w: &Tensor,
    y: &Tensor,
    dy: &Tensor,
    act: Activation,
    need_dx: bool,
    grads: GradDType,
) -> Result<(Option<Tensor>, Tensor, Tensor)> {
    let name = DENSE_BACKWARD.name;
    let dtype = float_dtype(name, &[x, w, y, dy])?;
    let grad_dtype = grads.of(dtype);
    let (m, k, n) = match (x.shape(), w.shape()) {
        (&[m, k], &[k2, n]) if k == k2 => (m, k, n),
        _ => {
            return Err(mismatch(
                name,
                x.shape(),
                w.shape(),
                ": x must be [m, k] and the kernel [k, n]",
            ))
        }
    };
    for t in [y, dy] {
        if t.shape() != [m, n] {
            return Err(mismatch(
                name,
                t.shape(),
                &[m, n],
                ": the output and its gradient must be [m, n]",
            ));
        }
    }
    run(&DENSE_BACKWARD, &[x, w, y, dy], |device, moved| {
        let dx = if need_dx {
            Some(Tensor::uninit(&[m, k], dtype, device)?)
        } else {
            None
        };
        let dw = Tensor::uninit(&[k, n], dtype, device)?;
        let db = Tensor::uninit(&[n], grad_dtype, device)?;
        let grads = DenseGrads {
            x: &moved[0],
            w: &moved[1],
            y: &moved[2],
            dy: &moved[3],
            dx: dx.as_ref(),
            dw: &dw,
            db: &db,
            m,
            k,
            n,
            act,
        };
        with_kernels(device, |_, nk| nk.dense_backward(&grads))?;
        if grad_dtype == dtype {
            return Ok((dx, dw, db));
        }
        let cast = Tensor::uninit(&[k, n], grad_dtype, device)?;
        with_kernels(device, |kernels, _| kernels.cast(&dw, &cast))?;
        Ok((dx, cast, db))
    })
}
