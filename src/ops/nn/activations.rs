//! The activations with their own kernel ([`ActivationFn`]): Keras' `activation=` strings
//! beyond the three that the products fuse, and the `Activation` and `ReLU` layers.

use crate::error::{Error, Result};
use crate::ops::gpu::activation as ga;
use crate::ops::gpu::Kernel;
use crate::ops::spec::ActivationFn;
use crate::ops::{run, with_kernels};
use crate::placement::OpInfo;
use crate::tensor::Tensor;

use super::{float_dtype, mismatch, op};

const FWD: &[Kernel] = &[ga::ACT_FWD];
const BWD: &[Kernel] = &[ga::ACT_BWD];

/// TensorFlow's op names (forward, gradient), in the order of [`index`].
const FORWARD: [OpInfo; 12] = [
    op("Identity", FWD),
    op("Relu", FWD),
    op("Relu6", FWD),
    op("LeakyRelu", FWD),
    op("Elu", FWD),
    op("Selu", FWD),
    op("Gelu", FWD),
    op("Sigmoid", FWD),
    op("Tanh", FWD),
    op("Silu", FWD),
    op("Softplus", FWD),
    op("Relu", FWD),
];
const GRADIENT: [OpInfo; 12] = [
    op("Identity", BWD),
    op("ReluGrad", BWD),
    op("Relu6Grad", BWD),
    op("LeakyReluGrad", BWD),
    op("EluGrad", BWD),
    op("SeluGrad", BWD),
    op("GeluGrad", BWD),
    op("SigmoidGrad", BWD),
    op("TanhGrad", BWD),
    op("SiluGrad", BWD),
    op("SoftplusGrad", BWD),
    op("ReluGrad", BWD),
];

fn index(act: ActivationFn) -> usize {
    match act {
        ActivationFn::Linear => 0,
        a if a == ActivationFn::RELU => 1,
        a if a == ActivationFn::RELU6 => 2,
        ActivationFn::Relu {
            max_value: None,
            threshold: 0.0,
            ..
        } => 3,
        ActivationFn::Relu { .. } => 11,
        ActivationFn::Elu => 4,
        ActivationFn::Selu => 5,
        ActivationFn::Gelu { .. } => 6,
        ActivationFn::Sigmoid => 7,
        ActivationFn::Tanh => 8,
        ActivationFn::Swish => 9,
        ActivationFn::Softplus => 10,
    }
}

/// `act(x)` element-wise, for any [`ActivationFn`] (logged under TensorFlow's op name:
/// `Relu6`, `LeakyRelu`, `Elu`, `Gelu`, `Sigmoid`, `Tanh`, `Silu`, `Softplus`, ...).
///
/// ```
/// use anygpu::ops::{self, spec::ActivationFn};
/// use anygpu::Tensor;
/// let x = Tensor::from_vec(vec![-1.0f32, 0.0, 3.0, 8.0], &[4])?;
/// let y = ops::activation_fn(&x, ActivationFn::RELU6)?;
/// assert_eq!(y.to_vec::<f32>()?, [0.0, 0.0, 3.0, 6.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// A tensor that is neither float32 nor float16.
pub fn activation_fn(x: &Tensor, act: ActivationFn) -> Result<Tensor> {
    let info = &FORWARD[index(act)];
    let dtype = float_dtype(info.name, &[x])?;
    run(info, &[x], |device, moved| {
        let y = Tensor::uninit(x.shape(), dtype, device)?;
        with_kernels(device, |_, nk| nk.activation_fn(&moved[0], &y, act))?;
        Ok(y)
    })
}

/// `dz = dy · act'(.)`, with TensorFlow's derivative at the kinks, from `t`: the activation's
/// input, or its output when `from_output` (which the activations of
/// [`ActivationFn::grad_from_output`] allow: a layer then keeps only its output).
///
/// ```
/// use anygpu::ops::{self, spec::ActivationFn};
/// use anygpu::Tensor;
/// let y = Tensor::from_vec(vec![0.5f32, 0.0], &[2])?; // sigmoid outputs
/// let dy = Tensor::from_vec(vec![2.0f32, 1.0], &[2])?;
/// let dz = ops::activation_fn_backward(&dy, &y, ActivationFn::Sigmoid, true)?;
/// assert_eq!(dz.to_vec::<f32>()?, [0.5, 0.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// # Errors
/// Tensors of other shapes or dtypes; `from_output` for an activation whose derivative does
/// not follow from its output.
pub fn activation_fn_backward(
    dy: &Tensor,
    t: &Tensor,
    act: ActivationFn,
    from_output: bool,
) -> Result<Tensor> {
    let info = &GRADIENT[index(act)];
    let dtype = float_dtype(info.name, &[dy, t])?;
    if from_output && !act.grad_from_output() {
        return Err(Error::InvalidArgument(format!(
            "{}: the derivative of {act:?} does not follow from its output; pass its input",
            info.name
        )));
    }
    if dy.shape() != t.shape() {
        return Err(mismatch(
            info.name,
            dy.shape(),
            t.shape(),
            ": the gradient and the activation's input/output must have the same shape",
        ));
    }
    run(info, &[dy, t], |device, moved| {
        let dz = Tensor::uninit(dy.shape(), dtype, device)?;
        with_kernels(device, |_, nk| {
            nk.activation_fn_backward(&moved[0], &moved[1], &dz, act, from_output)
        })?;
        Ok(dz)
    })
}
