//! What a multi-worker strategy asks of a model: here, above both, so that `distribute` never
//! imports `nn`.

use crate::distribute::{fnv1a, MultiWorkerMirroredStrategy};
use crate::error::Result;
use crate::nn::Sequential;

impl MultiWorkerMirroredStrategy {
    /// Whether every replica of every worker has the same bits: each worker compares its
    /// local replicas with its first, then the first replicas' checksums (FNV-1a, the same in
    /// every build) are compared across the workers through an MPI min and max reduction, so
    /// that workers with different numbers of local replicas compare too. A collective.
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
        let local = (|| -> Result<Option<u64>> {
            let bits = |weights: Vec<Vec<f32>>| -> Vec<u32> {
                weights.iter().flatten().map(|v| v.to_bits()).collect()
            };
            let first = bits(model.replica_weights(0)?);
            for r in 1..self.mirrored().num_replicas_in_sync() {
                if bits(model.replica_weights(r)?) != first {
                    return Ok(None);
                }
            }
            Ok(Some(fnv1a(first.iter().flat_map(|w| w.to_le_bytes()))))
        })();
        self.checksums_agree("comparing weights", local)
    }
}
