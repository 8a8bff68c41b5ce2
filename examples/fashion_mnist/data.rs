//! The data, as the tutorial prepares it: Fashion-MNIST's 60,000 training images less 5,000
//! for validation, scaled to [0, 1] then standardized with the training set's statistics,
//! shuffled, repeated and batched.

use anygpu::data::{fashion_mnist, Dataset, StandardScaler};

use crate::args::Args;
use crate::distributed::Workers;
use crate::BoxError;

/// The three datasets and the steps an epoch takes.
pub struct Data {
    pub train: Dataset,
    pub valid: Dataset,
    pub test: Dataset,
    /// `--steps-per-epoch`, else the training images divided by the batch size.
    pub steps_per_epoch: usize,
}

/// Loads and prepares the data; across workers, every worker must have found it, or all stop
/// with the same error.
pub fn load(args: &Args, workers: Option<&Workers>) -> Result<Data, BoxError> {
    let data = match workers {
        Some(w) => w.agree("loading Fashion-MNIST", fashion_mnist::load())?,
        None => fashion_mnist::load()?,
    };
    let (train, valid) = data.split_validation(5_000);
    let (mut x_train, mut x_valid, mut x_test) = (
        train.images_f32(1.0 / 255.0),
        valid.images_f32(1.0 / 255.0),
        data.test().images_f32(1.0 / 255.0),
    );
    let mut scaler = StandardScaler::new();
    scaler.fit_transform(&mut x_train, data.image_len())?;
    scaler.transform(&mut x_valid)?;
    scaler.transform(&mut x_test)?;
    let image = [data.rows, data.cols, 1];
    let batch = args.batch_size;
    Ok(Data {
        train: Dataset::from_tensor_slices(x_train, &image, train.labels_i32())?
            .shuffle(train.len(), args.seed)
            .repeat(None)
            .batch(batch, false)
            .prefetch(1),
        valid: Dataset::from_tensor_slices(x_valid, &image, valid.labels_i32())?
            .batch(batch, false),
        test: Dataset::from_tensor_slices(x_test, &image, data.test().labels_i32())?
            .batch(batch, false),
        steps_per_epoch: args.steps_per_epoch.unwrap_or((train.len() / batch).max(1)),
    })
}
