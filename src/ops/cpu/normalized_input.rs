//! A convolution of a batch normalization's output `max(z · a + b, 0)` (a `BatchNormalization`
//! and a `ReLU` before it), computed from `z`: the strided convolutions normalize each image
//! where a task copies it anyway (the implicit-GEMM kernels' zero-padded images, or the
//! patch matrix's source in scratch memory), in the forward pass and again in the kernel
//! gradient, so the normalized activation is never written whole nor read back (12.8 MB each
//! way for the modern CNN's first block at batch 128). Stride-1 shapes, whose kernels read
//! their input in place, normalize into memory first, as the normalization itself would have.

use super::batchnorm::Normalizer;
use super::conv::{check, conv2d_backward_kernel, conv2d_forward};
use super::conv_general;
use crate::ops::spec::{Activation, Conv2dShape, ConvGeometry};

/// Whether a convolution of shape `s` normalizes its input where it copies it anyway: a
/// strided (or dilated) one, on the general convolutions' paths.
pub(crate) fn reads_in_place(s: &Conv2dShape) -> bool {
    !s.is_unit_stride()
}

/// The normalized values of `z`, written whole (for the shapes that do not read them in
/// place).
fn written(z: &[f32], norm: &Normalizer) -> Vec<f32> {
    let mut x = vec![0.0; z.len()];
    norm.apply_all(z, &mut x);
    x
}

/// `y = act(conv2d(norm(z), kernel) + bias)`, as [`conv2d_forward`] of the normalized `z`.
pub(crate) fn conv2d_forward_normalized(
    (z, norm): (&[f32], &Normalizer),
    kernel: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
    s: &Conv2dShape,
    act: Activation,
) {
    if !reads_in_place(s) {
        return conv2d_forward(&written(z, norm), kernel, bias, y, s, act);
    }
    check(
        s,
        z.len(),
        kernel.len(),
        y.len(),
        "conv2d_forward_normalized",
    );
    if let Some(bias) = bias {
        assert_eq!(
            bias.len(),
            s.c_out,
            "conv2d_forward_normalized: bias length"
        );
    }
    let g = ConvGeometry::conv(s);
    conv_general::forward((z, Some(norm)), kernel, bias, y, &g, act);
}

/// The kernel gradient of [`conv2d_forward_normalized`], as [`conv2d_backward_kernel`] of the
/// normalized `z`.
pub(crate) fn conv2d_backward_kernel_normalized(
    (z, norm): (&[f32], &Normalizer),
    dz: &[f32],
    dk: &mut [f32],
    s: &Conv2dShape,
) {
    if !reads_in_place(s) {
        return conv2d_backward_kernel(&written(z, norm), dz, dk, s);
    }
    check(
        s,
        z.len(),
        dk.len(),
        dz.len(),
        "conv2d_backward_kernel_normalized",
    );
    conv_general::backward_kernel((z, Some(norm)), dz, dk, &ConvGeometry::conv(s));
}

#[cfg(test)]
pub(in crate::ops::cpu) mod tests {
    use super::*;
    use crate::ops::reference::random_vec;
    use crate::ops::spec::Padding;

    /// Random `z`, statistics, gamma and beta (the ReLU zeroing some of the normalized values),
    /// against the same convolutions of the normalized values written whole: the same bits, in
    /// place (strided shapes, in the implicit-GEMM kernels' padded images under AVX-512, else
    /// before the patch matrix) or not.
    #[test]
    pub(in crate::ops::cpu) fn normalized_inputs_give_the_bits_of_normalized_values() {
        let shapes = [
            (5, 9, 8, 32, 32, [2, 2], Padding::Same),
            (3, 7, 7, 16, 64, [2, 2], Padding::Same),
            (2, 6, 6, 8, 16, [1, 1], Padding::Same),
            (3, 8, 7, 5, 8, [2, 1], Padding::Valid),
            (2, 7, 7, 8, 12, [2, 2], Padding::Same),
        ];
        for (t, (n, h, w, c_in, c_out, strides, padding)) in shapes.into_iter().enumerate() {
            let s = Conv2dShape {
                n,
                h,
                w,
                c_in,
                c_out,
                kh: 3,
                kw: 3,
                padding,
                strides,
                dilation: [1, 1],
            };
            assert_eq!(reads_in_place(&s), strides != [1, 1], "{s:?}");
            let seed = 40 + 10 * t as u64;
            let z = random_vec(n * h * w * c_in, seed);
            let (gamma, beta) = (random_vec(c_in, seed + 1), random_vec(c_in, seed + 2));
            let mut stats = random_vec(c_in, seed + 3);
            stats.extend(random_vec(c_in, seed + 4).iter().map(|v| v.abs() + 0.5));
            let norm = Normalizer::new((&gamma, &beta), &stats);
            let mut x = vec![0.0; z.len()];
            norm.apply_all(&z, &mut x);
            assert!(x.contains(&0.0) && x.iter().any(|&v| v > 0.0));
            let kernel = random_vec(9 * c_in * c_out, seed + 5);
            let bias = random_vec(c_out, seed + 6);
            let (oh, ow) = s.out_hw();
            let out = n * oh * ow * c_out;
            let (mut want, mut got) = (vec![0.0; out], vec![1.0; out]);
            conv2d_forward(&x, &kernel, Some(&bias), &mut want, &s, Activation::Relu);
            let b = Some(&bias[..]);
            conv2d_forward_normalized((&z, &norm), &kernel, b, &mut got, &s, Activation::Relu);
            assert_eq!(got, want, "forward {s:?}");
            let dz = random_vec(out, seed + 7);
            let (mut want, mut got) = (vec![0.0; kernel.len()], vec![1.0; kernel.len()]);
            conv2d_backward_kernel(&x, &dz, &mut want, &s);
            conv2d_backward_kernel_normalized((&z, &norm), &dz, &mut got, &s);
            assert_eq!(got, want, "kernel gradient {s:?}");
        }
    }
}
