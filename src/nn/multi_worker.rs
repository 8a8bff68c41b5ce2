//! What a multi-worker strategy asks of a model: here, above both, so that `distribute` never
//! imports `nn`.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use crate::distribute::MultiWorkerMirroredStrategy;
use crate::error::Result;
use crate::nn::Sequential;

impl MultiWorkerMirroredStrategy {
    /// Whether every worker's model has the same bits: a checksum of the weights of every
    /// local replica, compared through an MPI min and max reduction. A collective.
    ///
    /// ```no_run
    /// use anygpu::distribute::MultiWorkerMirroredStrategy;
    /// use anygpu::nn::{Dense, Sequential};
    /// let strategy = MultiWorkerMirroredStrategy::new()?;
    /// let model = strategy.scope(|| -> anygpu::Result<Sequential> {
    ///     let mut m = Sequential::with_seed(1);
    ///     m.add(Dense::new(2).input_shape(&[3]))?;
    ///     Ok(m)
    /// })??;
    /// assert!(strategy.weights_in_sync(&model)?);
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// A device error reading the weights; then on every worker alike.
    pub fn weights_in_sync(&self, model: &Sequential) -> Result<bool> {
        let local = (|| -> Result<u64> {
            let mut hasher = DefaultHasher::new();
            for r in 0..self.mirrored().num_replicas_in_sync() {
                for w in model.replica_weights(r)? {
                    for v in w {
                        v.to_bits().hash(&mut hasher);
                    }
                }
            }
            Ok(hasher.finish())
        })();
        self.checksums_agree("comparing weights", local)
    }
}
