//! Keras' `verbose=`: what `fit` prints.

/// How much [`Sequential::fit`](crate::nn::Sequential::fit) prints (Keras' `verbose=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Verbosity {
    /// `verbose=0`: nothing.
    Silent,
    /// `verbose=1`: a progress bar per epoch (running loss, accuracy, images/s), then the
    /// epoch's line.
    #[default]
    ProgressBar,
    /// `verbose=2`: one line per epoch.
    OneLinePerEpoch,
}

impl Verbosity {
    /// Keras' numbers: 0 silent, 1 progress bar, 2 (or more) one line per epoch.
    ///
    /// ```
    /// use anygpu::nn::Verbosity;
    /// assert_eq!(Verbosity::from_level(0), Verbosity::Silent);
    /// ```
    pub fn from_level(level: u8) -> Verbosity {
        match level {
            0 => Verbosity::Silent,
            1 => Verbosity::ProgressBar,
            _ => Verbosity::OneLinePerEpoch,
        }
    }
}
