//! Data-parallel training over several devices: TensorFlow's `tf.distribute`.
//!
//! The GPU guide names two ways to use several GPUs. Placing layers by hand
//! ([`crate::nn::Sequential::add_on`]) runs them in series: one device works while the others
//! wait. A [`MirroredStrategy`] instead keeps a copy of the whole model on every device
//! (*replica*) and gives each a slice of every batch; the replicas' gradients are summed
//! ([`CrossDeviceOps`]) and every replica applies the same update, so they stay identical.
//!
//! ```
//! use anygpu::distribute::MirroredStrategy;
//! use anygpu::nn::{self, Loss, Sgd};
//!
//! // Every visible logical GPU (virtual ones count), or CPU:0 when there is none.
//! let strategy = MirroredStrategy::new()?;
//! println!("Number of devices: {}", strategy.num_replicas_in_sync());
//! let model = strategy.scope(|| -> anygpu::Result<_> {
//!     let mut model = nn::tutorial_cnn(0, &[])?;
//!     model.compile(Loss::sparse_categorical_crossentropy(), Sgd::default(), &[])?;
//!     Ok(model)
//! })??;
//! assert_eq!(model.strategy().map(|s| s.num_replicas_in_sync()), Some(strategy.num_replicas_in_sync()));
//! # Ok::<(), anygpu::Error>(())
//! ```

mod cross_device;
#[cfg(feature = "mpi")]
mod mpi;
mod strategy;
#[doc(hidden)]
pub mod tf_config;
mod workers;

#[cfg(feature = "mpi")]
pub use self::mpi::{AllReduceTimes, MpiAllReduce, MultiWorkerMirroredStrategy};
pub use cross_device::{CrossDeviceOps, HierarchicalAllReduce};
pub use strategy::{get_strategy, has_strategy, MirroredStrategy, StrategyScope};
pub(crate) use workers::{as_replica_job, shared, worker_rows, Workers};
#[cfg(feature = "mpi")]
pub(crate) use workers::{fnv1a, in_replica_job};
