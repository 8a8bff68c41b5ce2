//! Batch normalization's options and dropout's counter-based mask ([`DropoutMask`], the same
//! on every device).

/// Batch normalization over a tensor viewed as `[rows, channels]` (statistics per channel:
/// `rows` is `n` for a `[n, c]` input, `n * h * w` for an NHWC one), with Keras'
/// `momentum` and `epsilon`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNormParams {
    /// Rows the statistics run over.
    pub rows: usize,
    /// Channels (the last axis).
    pub channels: usize,
    /// Keras' `momentum` of the moving statistics (0.99).
    pub momentum: f32,
    /// Added to the variance (Keras' 1e-3).
    pub epsilon: f32,
}

impl BatchNormParams {
    /// `1 - momentum`, rounded once to f32, as TensorFlow rounds the Python float: every
    /// device updates the moving statistics with this same constant.
    pub fn one_minus_momentum(&self) -> f32 {
        (1.0 - f64::from(self.momentum)) as f32
    }
}

/// Dropout's counter-based mask: element `i` is kept when [`DropoutMask::keeps`]`(i)`, a pure
/// function of `(key, i)` in `u32` arithmetic that the CPU kernel, the WGSL kernel
/// (`shaders/dropout.wgsl`) and the oracle compute alike, so one key gives one mask on every
/// device. Kept values are multiplied by `scale = 1 / (1 - rate)`.
///
/// ```
/// use anygpu::ops::spec::DropoutMask;
/// let m = DropoutMask::new(0.25, 7, 0);
/// let kept = (0..100_000u32).filter(|&i| m.keeps(i)).count();
/// assert!((kept as f64 / 1e5 - 0.75).abs() < 0.01);
/// assert_ne!(DropoutMask::new(0.25, 7, 1).key, m.key); // a new mask every step
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutMask {
    /// The seed and step, mixed into one word.
    pub key: u32,
    /// `ceil(rate * 2^24)`: an element is dropped when its 24 hash bits fall below it.
    pub threshold: u32,
    /// `1 / (1 - rate)`, in f32.
    pub scale: f32,
}

impl DropoutMask {
    /// The mask of step `step` of a layer seeded `seed`, dropping a `rate` fraction
    /// (`0 <= rate < 1`, checked by the layer).
    pub fn new(rate: f32, seed: u64, step: u64) -> DropoutMask {
        let word = |v: u64, shift: u32| (v >> shift) as u32;
        let key = dropout_mix(
            word(seed, 0)
                ^ dropout_mix(
                    word(seed, 32) ^ dropout_mix(word(step, 0) ^ dropout_mix(word(step, 32))),
                ),
        );
        let threshold = (f64::from(rate) * f64::from(1u32 << 24)).ceil() as u32;
        DropoutMask {
            key,
            threshold,
            scale: 1.0 / (1.0 - rate),
        }
    }

    /// Whether element `i` is kept (indices past `u32::MAX` wrap).
    #[inline]
    pub fn keeps(&self, i: u32) -> bool {
        dropout_mix(dropout_mix(i ^ self.key).wrapping_add(self.key)) >> 8 >= self.threshold
    }
}

/// Wellons' `lowbias32` integer hash, the mixing step of [`DropoutMask`].
#[inline]
pub fn dropout_mix(h: u32) -> u32 {
    let mut v = h;
    v ^= v >> 16;
    v = v.wrapping_mul(0x7feb_352d);
    v ^= v >> 15;
    v = v.wrapping_mul(0x846c_a68b);
    v ^= v >> 16;
    v
}
