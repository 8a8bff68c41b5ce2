//! The arguments Keras' convolution layers share (`kernel_size`, `strides`, `padding`,
//! `dilation_rate`), checked as Keras checks them, and the output shape they give.

use crate::error::{Error, Result};
use crate::ops::spec::{Axis, ConvOptions, Padding};

/// A convolution layer's window: kernel size, strides, padding, dilation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) kernel: [usize; 2],
    pub(crate) options: ConvOptions,
}

impl Window {
    /// `kernel_size`, stride 1, dilation 1, `padding`.
    pub(crate) fn new(kernel: [usize; 2], padding: Padding) -> Window {
        Window {
            kernel,
            options: ConvOptions::new(padding),
        }
    }

    /// Keras' argument checks (`base_conv.py`): no 0 in `kernel_size` or `strides`, and not
    /// `strides > 1` with `dilation_rate > 1`.
    pub(crate) fn check(&self, layer: &str) -> Result<()> {
        let o = &self.options;
        if self.kernel.contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "{layer}: The argument `kernel_size` cannot contain 0. Received \
                 kernel_size={:?}.",
                self.kernel
            )));
        }
        if o.strides.contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "{layer}: The argument `strides` cannot contains 0. Received strides={:?}",
                o.strides
            )));
        }
        if o.dilation.contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "{layer}: The argument `dilation_rate` cannot contain 0. Received \
                 dilation_rate={:?}",
                o.dilation
            )));
        }
        if o.strides.iter().any(|&s| s > 1) && o.dilation.iter().any(|&d| d > 1) {
            return Err(Error::InvalidArgument(format!(
                "{layer}: `strides > 1` not supported in conjunction with `dilation_rate > 1`. \
                 Received: strides={:?} and dilation_rate={:?}",
                o.strides, o.dilation
            )));
        }
        Ok(())
    }

    /// The output `[oh, ow]` for an input `[h, w]`, or Keras' error when 'valid' leaves no
    /// output pixel.
    pub(crate) fn output_hw(&self, layer: &'static str, input: &[usize]) -> Result<[usize; 2]> {
        self.check(layer)?;
        let o = &self.options;
        let (h, w) = (input[0], input[1]);
        let hh = Axis::new(h, self.kernel[0], o.strides[0], o.dilation[0], o.padding);
        let ww = Axis::new(w, self.kernel[1], o.strides[1], o.dilation[1], o.padding);
        if hh.out == 0 || ww.out == 0 {
            return Err(Error::ShapeMismatch {
                op: layer,
                lhs: input.to_vec(),
                rhs: Vec::new(),
                hint: format!(
                    ": Computed output size would be zero or negative. Received \
                     `inputs.shape={input:?}`, `kernel_size={:?}`, `strides={:?}`, \
                     `padding=valid`, `dilation_rate={:?}`",
                    self.kernel, o.strides, o.dilation
                ),
            });
        }
        Ok([hh.out, ww.out])
    }

    /// Whether this is the stride-1, undilated 'same' window the fused, tuned kernels serve.
    pub(crate) fn is_same_unit(&self) -> bool {
        self.options == ConvOptions::new(Padding::Same)
    }
}
