//! Data input: the Fashion-MNIST files, feature scaling and a `tf.data`-like pipeline.
//!
//! Everything here runs on the host and mirrors the names of the Python tools the Keras
//! tutorial uses, so the Rust reads like the notebook:
//!
//! | here | Python |
//! |---|---|
//! | [`fashion_mnist::load`] | `keras.datasets.fashion_mnist.load_data()` |
//! | [`FashionMnist::split_validation`] | `X_train_full[:5000]`, `X_train_full[5000:]` |
//! | [`StandardScaler`] | `sklearn.preprocessing.StandardScaler` |
//! | [`Dataset`] | `tf.data.Dataset` (`from_tensor_slices`, `shuffle`, `repeat`, `batch`, `prefetch`) |
//! | [`idx::read_idx`] | the IDX parsing inside `load_data()` |
//!
//! ```no_run
//! use anygpu::data::{fashion_mnist, Dataset, StandardScaler};
//!
//! let data = fashion_mnist::load()?;
//! let (train, valid) = data.split_validation(5_000);
//! let (mut x_train, mut x_valid) = (train.images_f32(1.0), valid.images_f32(1.0));
//! let mut scaler = StandardScaler::new();
//! scaler.fit_transform(&mut x_train, data.image_len())?;
//! scaler.transform(&mut x_valid)?;
//! let train_ds = Dataset::from_tensor_slices(x_train, &[28, 28, 1], train.labels_i32())?
//!     .shuffle(55_000, 42)
//!     .repeat(None)
//!     .batch(32, false)
//!     .prefetch(1);
//! for batch in train_ds.iter().take(10) {
//!     assert_eq!(batch.x_shape, [32, 28, 28, 1]);
//! }
//! # Ok::<(), anygpu::Error>(())
//! ```

pub mod dataset;
pub mod fashion_mnist;
pub mod idx;
pub mod scaler;

pub use dataset::{Batch, BatchIter, Dataset};
pub use fashion_mnist::{FashionMnist, Split, CLASS_NAMES};
pub use idx::{parse_idx, read_idx, IdxArray};
pub use scaler::StandardScaler;
