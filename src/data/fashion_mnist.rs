//! The Fashion-MNIST data set, after `keras.datasets.fashion_mnist.load_data()`.
//!
//! 70,000 grayscale 28×28 images of clothing in 10 classes ([`CLASS_NAMES`]), split into
//! 60,000 training and 10,000 test images, from Zalando Research
//! (<https://github.com/zalandoresearch/fashion-mnist>, MIT license). The four IDX files
//! ([`FILE_NAMES`], gzip'd or not) are searched for by [`load`]; see there for where.
//!
//! ```no_run
//! use anygpu::data::fashion_mnist::{self, CLASS_NAMES};
//!
//! let data = fashion_mnist::load()?;
//! assert_eq!((data.num_train(), data.num_test()), (60_000, 10_000));
//! // The tutorial's split: the first 5,000 training images are the validation set.
//! let (train, valid) = data.split_validation(5_000);
//! let x_train = train.images_f32(1.0 / 255.0);
//! println!("{} training images, first is a {}", train.len(), CLASS_NAMES[train.labels[0] as usize]);
//! # Ok::<(), anygpu::Error>(())
//! ```

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::idx::{read_idx, IdxArray};
use crate::{Error, Result};

/// The names of the 10 classes, indexed by label (Keras' tutorial `class_names`).
pub const CLASS_NAMES: [&str; 10] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

/// The four files, as Keras and Zalando name them: training images, training labels, test
/// images, test labels. Each may also be present without the `.gz` suffix, uncompressed.
pub const FILE_NAMES: [&str; 4] = [
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
];

/// The environment variable naming a directory that holds the four files.
pub const DIR_ENV: &str = "FASHION_MNIST_DIR";

/// The Fashion-MNIST images and labels, as `u8` (pixels 0..=255, labels 0..10).
///
/// The images are row-major `[n, rows, cols]`: image `i` is
/// `train_images[i * rows * cols..(i + 1) * rows * cols]`. Keras returns the same arrays as
/// `((x_train, y_train), (x_test, y_test))`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FashionMnist {
    /// Training images, `[num_train, rows, cols]`.
    pub train_images: Vec<u8>,
    /// Training labels, one per training image, each below 10.
    pub train_labels: Vec<u8>,
    /// Test images, `[num_test, rows, cols]`.
    pub test_images: Vec<u8>,
    /// Test labels, one per test image, each below 10.
    pub test_labels: Vec<u8>,
    /// Image height: 28.
    pub rows: usize,
    /// Image width: 28.
    pub cols: usize,
    /// The directory the files were read from.
    pub dir: PathBuf,
}

/// A borrowed part of the data set: some images and their labels (see
/// [`FashionMnist::split_validation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split<'a> {
    /// The images, row-major `[len, rows, cols]`.
    pub images: &'a [u8],
    /// One label per image.
    pub labels: &'a [u8],
    /// Image height.
    pub rows: usize,
    /// Image width.
    pub cols: usize,
}

impl<'a> Split<'a> {
    /// The number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there is no image.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The pixels of image `i`, row-major. Panics when `i >= len()`, like slice indexing.
    pub fn image(&self, i: usize) -> &'a [u8] {
        let n = self.rows * self.cols;
        &self.images[i * n..(i + 1) * n]
    }

    /// The images as `f32`, each pixel multiplied by `scale`: `1.0 / 255.0` gives the
    /// tutorial's `X / 255.` (values in `[0, 1]`), `1.0` the raw values `astype(np.float32)`.
    pub fn images_f32(&self, scale: f32) -> Vec<f32> {
        self.images.iter().map(|&p| f32::from(p) * scale).collect()
    }

    /// The labels as `i32`, the type [`Dataset::from_tensor_slices`](super::Dataset::from_tensor_slices) takes.
    pub fn labels_i32(&self) -> Vec<i32> {
        self.labels.iter().map(|&l| i32::from(l)).collect()
    }
}

impl FashionMnist {
    /// The number of training images (60,000).
    pub fn num_train(&self) -> usize {
        self.train_labels.len()
    }

    /// The number of test images (10,000).
    pub fn num_test(&self) -> usize {
        self.test_labels.len()
    }

    /// Pixels per image, `rows * cols` (784).
    pub fn image_len(&self) -> usize {
        self.rows * self.cols
    }

    /// The whole training set.
    pub fn train(&self) -> Split<'_> {
        self.split(&self.train_images, &self.train_labels)
    }

    /// The test set.
    pub fn test(&self) -> Split<'_> {
        self.split(&self.test_images, &self.test_labels)
    }

    /// Splits the training set into `(train, validation)`, the validation part being the
    /// **first** `n` training images, as the tutorial does (`X_valid, X_train =
    /// X_train_full[:5000], X_train_full[5000:]`). Both parts borrow from `self`; nothing is
    /// copied. The test set is untouched.
    ///
    /// # Panics
    ///
    /// If `n > num_train()`, like [`slice::split_at`].
    pub fn split_validation(&self, n: usize) -> (Split<'_>, Split<'_>) {
        assert!(
            n <= self.num_train(),
            "split_validation: {n} validation images requested but the training set has only {}",
            self.num_train()
        );
        let (valid_x, train_x) = self.train_images.split_at(n * self.image_len());
        let (valid_y, train_y) = self.train_labels.split_at(n);
        (self.split(train_x, train_y), self.split(valid_x, valid_y))
    }

    fn split<'a>(&self, images: &'a [u8], labels: &'a [u8]) -> Split<'a> {
        Split {
            images,
            labels,
            rows: self.rows,
            cols: self.cols,
        }
    }
}

/// Loads Fashion-MNIST from the first directory that holds all four [`FILE_NAMES`], like
/// `keras.datasets.fashion_mnist.load_data()`.
///
/// Searched in this order (see [`search_dirs`]):
/// 1. `$FASHION_MNIST_DIR`,
/// 2. `./data/fashion-mnist` (relative to the working directory),
/// 3. `$CARGO_MANIFEST_DIR/data/fashion-mnist`, when that variable is set at run time (under
///    `cargo run` / `cargo test` / `cargo bench`),
/// 4. the user cache, `$XDG_CACHE_HOME/anygpu/fashion-mnist` or `~/.cache/anygpu/fashion-mnist`.
///
/// When no directory has them: with the `download` feature, the four files are downloaded
/// from Keras' mirror (<https://storage.googleapis.com/tensorflow/tf-keras-datasets/>) into
/// the cache, checked against the official SHA-256 checksums; without it, an [`Error::Io`]
/// (kind `NotFound`) lists every place searched and the ways to provide the files.
///
/// A directory that has all four files but a malformed one is an error, not skipped.
///
/// ```no_run
/// let data = anygpu::data::fashion_mnist::load()?;
/// println!("loaded from {}", data.dir.display());
/// # Ok::<(), anygpu::Error>(())
/// ```
pub fn load() -> Result<FashionMnist> {
    let dirs = search_dirs();
    let mut tried = Vec::with_capacity(dirs.len());
    for dir in &dirs {
        match missing_files(dir) {
            None => return load_from(dir),
            Some(missing) => {
                if dir.is_dir() {
                    log::debug!("{} lacks {}", dir.display(), missing.join(", "));
                    tried.push(format!(
                        "  {} (missing {})",
                        dir.display(),
                        missing.join(", ")
                    ));
                } else {
                    tried.push(format!("  {} (no such directory)", dir.display()));
                }
            }
        }
    }
    not_found(&dirs, &tried)
}

#[cfg(not(feature = "download"))]
fn not_found(dirs: &[PathBuf], tried: &[String]) -> Result<FashionMnist> {
    let cache = cache_dir();
    let target = cache
        .as_deref()
        .unwrap_or_else(|| Path::new("data/fashion-mnist"));
    let message = format!(
        "Fashion-MNIST not found. Searched, in order:\n{}\n\
         To fix it, do one of:\n  \
         - set {DIR_ENV} to a directory holding {}\n  \
         - copy those four files into {} (or ./data/fashion-mnist)\n  \
         - rebuild with `--features download` to download them from \
         https://storage.googleapis.com/tensorflow/tf-keras-datasets/ into the cache",
        tried.join("\n"),
        FILE_NAMES.join(", "),
        target.display(),
    );
    Err(Error::Io {
        path: dirs.first().cloned().unwrap_or_default(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, message),
    })
}

#[cfg(feature = "download")]
fn not_found(_dirs: &[PathBuf], tried: &[String]) -> Result<FashionMnist> {
    let Some(dir) = cache_dir() else {
        return Err(Error::Io {
            path: PathBuf::from("~/.cache/anygpu/fashion-mnist"),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "Fashion-MNIST not found (searched:\n{}\n) and there is no cache directory to \
                     download it into: set HOME or XDG_CACHE_HOME, or set {DIR_ENV}",
                    tried.join("\n")
                ),
            ),
        });
    };
    log::info!(
        "Fashion-MNIST not found locally (searched:\n{}); downloading into {}",
        tried.join("\n"),
        dir.display()
    );
    download::download_all(&dir)?;
    load_from(&dir)
}

/// Loads the four files from `dir` (each as `NAME.gz` or, failing that, uncompressed `NAME`)
/// and checks them: images `[n, rows, cols]`, labels `[n]` with the same `n`, labels below 10,
/// training and test images of the same size.
///
/// Errors: [`Error::Io`] for a missing or unreadable file, [`Error::Data`] for a malformed one
/// (an image/label count mismatch names both counts).
///
/// ```no_run
/// use std::path::Path;
/// let data = anygpu::data::fashion_mnist::load_from(Path::new("data/fashion-mnist"))?;
/// assert_eq!((data.rows, data.cols), (28, 28));
/// # Ok::<(), anygpu::Error>(())
/// ```
pub fn load_from(dir: &Path) -> Result<FashionMnist> {
    let paths = FILE_NAMES.map(|name| file_in(dir, name));
    // Decompressing is the slow part: one thread per file.
    let [train_x, train_y, test_x, test_y] = std::thread::scope(|s| {
        let handles = paths.each_ref().map(|p| s.spawn(move || read_idx(p)));
        handles.map(|h| {
            h.join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    });
    let (train_images, train_labels, rows, cols) =
        check_pair(train_x?, train_y?, &paths[0], &paths[1])?;
    let (test_images, test_labels, test_rows, test_cols) =
        check_pair(test_x?, test_y?, &paths[2], &paths[3])?;
    if (test_rows, test_cols) != (rows, cols) {
        return Err(Error::Data {
            path: paths[2].clone(),
            message: format!(
                "test images are {test_rows}x{test_cols} but training images are {rows}x{cols}"
            ),
        });
    }
    Ok(FashionMnist {
        train_images,
        train_labels,
        test_images,
        test_labels,
        rows,
        cols,
        dir: dir.to_path_buf(),
    })
}

/// `dir/name`, or `dir/name` without `.gz` when only the uncompressed file exists.
fn file_in(dir: &Path, name: &str) -> PathBuf {
    let gz = dir.join(name);
    if !gz.is_file() {
        if let Some(raw) = name.strip_suffix(".gz").map(|n| dir.join(n)) {
            if raw.is_file() {
                return raw;
            }
        }
    }
    gz
}

/// The files of [`FILE_NAMES`] that `dir` lacks, or `None` when it has all four.
fn missing_files(dir: &Path) -> Option<Vec<&'static str>> {
    let missing: Vec<&str> = FILE_NAMES
        .into_iter()
        .filter(|name| !file_in(dir, name).is_file())
        .collect();
    (!missing.is_empty()).then_some(missing)
}

/// Checks an images/labels pair and returns `(images, labels, rows, cols)`.
fn check_pair(
    images: IdxArray,
    labels: IdxArray,
    images_path: &Path,
    labels_path: &Path,
) -> Result<(Vec<u8>, Vec<u8>, usize, usize)> {
    let &[n, rows, cols] = images.dims.as_slice() else {
        return Err(Error::Data {
            path: images_path.to_path_buf(),
            message: format!(
                "expected images of dimensions [count, rows, cols], found dimensions {:?}",
                images.dims
            ),
        });
    };
    let &[n_labels] = labels.dims.as_slice() else {
        return Err(Error::Data {
            path: labels_path.to_path_buf(),
            message: format!(
                "expected labels of dimensions [count], found dimensions {:?}",
                labels.dims
            ),
        });
    };
    if n != n_labels {
        return Err(Error::Data {
            path: labels_path.to_path_buf(),
            message: format!(
                "{n_labels} labels but {} has {n} images: the counts must match",
                images_path.display()
            ),
        });
    }
    if let Some((i, &l)) = labels
        .data
        .iter()
        .enumerate()
        .find(|(_, &l)| usize::from(l) >= CLASS_NAMES.len())
    {
        return Err(Error::Data {
            path: labels_path.to_path_buf(),
            message: format!(
                "label {l} at index {i} is out of range: Fashion-MNIST has {} classes (0..{})",
                CLASS_NAMES.len(),
                CLASS_NAMES.len()
            ),
        });
    }
    Ok((images.data, labels.data, rows, cols))
}

/// The directories [`load`] searches, in order, from the current environment.
pub fn search_dirs() -> Vec<PathBuf> {
    search_dirs_with(|key| std::env::var_os(key))
}

/// [`search_dirs`] with the environment given as a function (for tests).
fn search_dirs_with(env: impl Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    let non_empty = |key: &str| env(key).filter(|v| !v.is_empty()).map(PathBuf::from);
    let mut dirs = Vec::new();
    if let Some(d) = non_empty(DIR_ENV) {
        dirs.push(d);
    }
    dirs.push(PathBuf::from("data/fashion-mnist"));
    if let Some(d) = non_empty("CARGO_MANIFEST_DIR") {
        dirs.push(d.join("data").join("fashion-mnist"));
    }
    if let Some(d) = cache_dir_with(&non_empty) {
        dirs.push(d);
    }
    dirs
}

/// The user cache directory for the data set: `$XDG_CACHE_HOME/anygpu/fashion-mnist`, else
/// `~/.cache/anygpu/fashion-mnist` (`%USERPROFILE%\.cache\...` on Windows); `None` when
/// neither variable is set.
pub fn cache_dir() -> Option<PathBuf> {
    cache_dir_with(&|key: &str| {
        std::env::var_os(key)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
}

fn cache_dir_with(env: &dyn Fn(&str) -> Option<PathBuf>) -> Option<PathBuf> {
    let base = env("XDG_CACHE_HOME")
        .filter(|p| p.is_absolute())
        .or_else(|| {
            env("HOME")
                .or_else(|| env("USERPROFILE"))
                .map(|h| h.join(".cache"))
        })?;
    Some(base.join("anygpu").join("fashion-mnist"))
}

#[cfg(feature = "download")]
mod download {
    //! Downloads the four files from Keras' mirror into the cache.

    use std::fs::File;
    use std::io::{Read, Write};
    use std::path::{Path, PathBuf};

    use sha2::{Digest, Sha256};

    use crate::{Error, Result};

    /// Keras' mirror, the one `keras.datasets.fashion_mnist.load_data()` downloads from.
    pub(super) const BASE_URL: &str =
        "https://storage.googleapis.com/tensorflow/tf-keras-datasets/";

    /// SHA-256 of the official files of the Zalando release (whose README lists their MD5s:
    /// 8d4fb7e6..., 25c81989..., bef4ecab..., bb300cfd...), as pinned by TensorFlow Datasets
    /// and torchvision users. Keras' own `load_data()` passes no hash; its mirror serves the
    /// same bytes. A mismatch is reported, never ignored; the IDX structure is checked too.
    const FILES: [(&str, &str); 4] = [
        (
            "train-images-idx3-ubyte.gz",
            "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
        ),
        (
            "train-labels-idx1-ubyte.gz",
            "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
        ),
        (
            "t10k-images-idx3-ubyte.gz",
            "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
        ),
        (
            "t10k-labels-idx1-ubyte.gz",
            "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
        ),
    ];

    /// Downloads every file `dir` lacks; each lands under its final name only once verified.
    pub(super) fn download_all(dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        for (name, sha256) in FILES {
            let dest = dir.join(name);
            if dest.is_file() {
                continue;
            }
            download_one(name, sha256, &dest)?;
        }
        Ok(())
    }

    fn download_one(name: &str, sha256: &str, dest: &Path) -> Result<()> {
        let url = format!("{BASE_URL}{name}");
        let tmp = dest.with_file_name(format!(".{name}.{}.part", std::process::id()));
        let result = fetch_verified(&url, sha256, &tmp).and_then(|()| {
            // Structure check before the file becomes visible under its real name.
            super::read_idx(&tmp)?;
            std::fs::rename(&tmp, dest).map_err(|source| Error::Io {
                path: dest.to_path_buf(),
                source,
            })
        });
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    fn fetch_verified(url: &str, sha256: &str, tmp: &Path) -> Result<()> {
        let offline = |e: String| Error::Io {
            path: tmp.with_file_name(url.rsplit('/').next().unwrap_or(url)),
            source: std::io::Error::other(format!(
                "could not download {url}: {e}. If this machine is offline, download the four \
                 files {} elsewhere (from {BASE_URL} or \
                 https://github.com/zalandoresearch/fashion-mnist) and copy them into {}, or \
                 into a directory named by {}",
                super::FILE_NAMES.join(", "),
                tmp.parent()
                    .map_or_else(PathBuf::new, Path::to_path_buf)
                    .display(),
                super::DIR_ENV,
            )),
        };
        let mut response = ureq::get(url).call().map_err(|e| offline(e.to_string()))?;
        let total = response.body().content_length();
        let bar = progress_bar(total, url.rsplit('/').next().unwrap_or(url));
        let io_err = |source| Error::Io {
            path: tmp.to_path_buf(),
            source,
        };
        let mut file = File::create(tmp).map_err(io_err)?;
        let mut reader = response.body_mut().as_reader();
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(offline(e.to_string())),
            };
            hasher.update(&buf[..n]);
            file.write_all(&buf[..n]).map_err(io_err)?;
            bar.inc(n as u64);
        }
        file.sync_all().map_err(io_err)?;
        bar.finish_and_clear();
        let got: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if got != sha256 {
            return Err(Error::Data {
                path: tmp.to_path_buf(),
                message: format!(
                    "SHA-256 mismatch for {url}: expected {sha256}, got {got}; the download \
                     is corrupt or the mirror changed. Retry, or provide the files yourself."
                ),
            });
        }
        log::info!("downloaded {url} (sha256 {got})");
        Ok(())
    }

    fn progress_bar(total: Option<u64>, name: &str) -> indicatif::ProgressBar {
        let bar = match total {
            Some(t) => indicatif::ProgressBar::new(t),
            None => indicatif::ProgressBar::new_spinner(),
        };
        let template = if total.is_some() {
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}"
        } else {
            "{msg} {spinner} {bytes} {bytes_per_sec}"
        };
        if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(format!("Downloading {name}"));
        bar
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed copy of the data set; `None` (and the test is skipped) when absent.
    fn data_dir() -> Option<PathBuf> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("data")
            .join("fashion-mnist");
        if missing_files(&dir).is_none() {
            return Some(dir);
        }
        let env = std::env::var_os(DIR_ENV).map(PathBuf::from)?;
        missing_files(&env).is_none().then_some(env)
    }

    fn write_idx(path: &Path, dims: Vec<usize>, data: Vec<u8>) {
        std::fs::write(path, IdxArray { dims, data }.to_bytes().unwrap()).unwrap();
    }

    fn tmp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("anygpu-fm-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A tiny fake data set, uncompressed, with `n_train` training images of 2x3 pixels.
    fn fake(dir: &Path, n_train: usize, n_train_labels: usize) {
        let stem = |i: usize| FILE_NAMES[i].strip_suffix(".gz").unwrap();
        write_idx(
            &dir.join(stem(0)),
            vec![n_train, 2, 3],
            (0..n_train * 6).map(|v| v as u8).collect(),
        );
        write_idx(
            &dir.join(stem(1)),
            vec![n_train_labels],
            (0..n_train_labels).map(|v| (v % 10) as u8).collect(),
        );
        write_idx(&dir.join(stem(2)), vec![2, 2, 3], vec![7; 12]);
        write_idx(&dir.join(stem(3)), vec![2], vec![3, 9]);
    }

    #[test]
    fn real_files() {
        let Some(dir) = data_dir() else {
            eprintln!("Fashion-MNIST files not found: skipping");
            return;
        };
        let d = load_from(&dir).unwrap();
        assert_eq!((d.num_train(), d.num_test()), (60_000, 10_000));
        assert_eq!((d.rows, d.cols, d.image_len()), (28, 28, 784));
        assert_eq!(d.train_images.len(), 60_000 * 784);
        assert_eq!(d.test_images.len(), 10_000 * 784);
        for (labels, per_class) in [(&d.train_labels, 6_000), (&d.test_labels, 1_000)] {
            let mut counts = [0usize; 10];
            for &l in labels.iter() {
                counts[usize::from(l)] += 1;
            }
            assert_eq!(counts, [per_class; 10]);
        }
        assert!(d.train_images.contains(&255));
        let (train, valid) = d.split_validation(5_000);
        assert_eq!((train.len(), valid.len()), (55_000, 5_000));
        assert_eq!(valid.image(0), &d.train_images[..784]);
        assert_eq!(train.image(0), &d.train_images[5_000 * 784..5_001 * 784]);
        assert_eq!(train.labels[0], d.train_labels[5_000]);
        let x = valid.images_f32(1.0 / 255.0);
        assert!(x.iter().all(|v| (0.0..=1.0).contains(v)));
        assert_eq!(d.test().len(), 10_000);
    }

    #[test]
    fn fake_set_loads_and_splits() {
        let dir = tmp_dir("ok");
        fake(&dir, 5, 5);
        assert!(missing_files(&dir).is_none());
        let d = load_from(&dir).unwrap();
        assert_eq!((d.num_train(), d.num_test(), d.rows, d.cols), (5, 2, 2, 3));
        let (train, valid) = d.split_validation(2);
        assert_eq!((train.len(), valid.len()), (3, 2));
        assert_eq!(valid.image(1), [6, 7, 8, 9, 10, 11]);
        assert_eq!(train.image(0), [12, 13, 14, 15, 16, 17]);
        assert_eq!(train.labels_i32(), [2, 3, 4]);
        assert_eq!(train.images_f32(0.5)[..2], [6.0, 6.5]);
        let (all, none) = d.split_validation(0);
        assert_eq!((all.len(), none.len()), (5, 0));
        assert!(none.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[should_panic(expected = "only 5")]
    fn split_too_large_panics() {
        let dir = tmp_dir("split");
        fake(&dir, 5, 5);
        let d = load_from(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let _ = d.split_validation(6);
    }

    #[test]
    fn count_mismatch_names_both_counts() {
        let dir = tmp_dir("mismatch");
        fake(&dir, 5, 4);
        let m = load_from(&dir).unwrap_err().to_string();
        assert!(m.contains("4 labels") && m.contains("has 5 images"), "{m}");
        assert!(m.contains("train-labels-idx1-ubyte"), "{m}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_labels_and_shapes() {
        let dir = tmp_dir("badlabel");
        fake(&dir, 3, 3);
        write_idx(&dir.join("t10k-labels-idx1-ubyte"), vec![2], vec![3, 10]);
        let m = load_from(&dir).unwrap_err().to_string();
        assert!(m.contains("label 10 at index 1 is out of range"), "{m}");
        write_idx(&dir.join("t10k-labels-idx1-ubyte"), vec![2, 1], vec![3, 1]);
        let m = load_from(&dir).unwrap_err().to_string();
        assert!(m.contains("expected labels of dimensions [count]"), "{m}");
        write_idx(&dir.join("t10k-labels-idx1-ubyte"), vec![2], vec![3, 1]);
        write_idx(
            &dir.join("t10k-images-idx3-ubyte"),
            vec![2, 3, 2],
            vec![0; 12],
        );
        let m = load_from(&dir).unwrap_err().to_string();
        assert!(
            m.contains("test images are 3x2 but training images are 2x3"),
            "{m}"
        );
        std::fs::remove_file(dir.join("t10k-images-idx3-ubyte")).unwrap();
        let e = load_from(&dir).unwrap_err();
        assert!(
            matches!(&e, Error::Io { path, .. } if path.ends_with("t10k-images-idx3-ubyte.gz")),
            "{e}"
        );
        assert_eq!(missing_files(&dir), Some(vec!["t10k-images-idx3-ubyte.gz"]));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn search_order() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        let dirs = search_dirs_with(env(&[
            ("FASHION_MNIST_DIR", "/fm"),
            ("CARGO_MANIFEST_DIR", "/crate"),
            ("XDG_CACHE_HOME", "/xdg"),
            ("HOME", "/home/u"),
        ]));
        let want: Vec<PathBuf> = [
            "/fm",
            "data/fashion-mnist",
            "/crate/data/fashion-mnist",
            "/xdg/anygpu/fashion-mnist",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(dirs, want);
        let dirs = search_dirs_with(env(&[("HOME", "/home/u"), ("FASHION_MNIST_DIR", "")]));
        assert_eq!(
            dirs,
            [
                PathBuf::from("data/fashion-mnist"),
                PathBuf::from("/home/u/.cache/anygpu/fashion-mnist")
            ]
        );
        // A relative XDG_CACHE_HOME is invalid per the spec and ignored.
        let dirs = search_dirs_with(env(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")]));
        assert_eq!(dirs[1], PathBuf::from("/h/.cache/anygpu/fashion-mnist"));
        assert_eq!(search_dirs_with(env(&[])).len(), 1);
    }

    #[cfg(not(feature = "download"))]
    #[test]
    fn not_found_message_lists_places_and_fixes() {
        let dirs = vec![PathBuf::from("/a"), PathBuf::from("/b")];
        let tried = vec![
            "  /a (no such directory)".to_string(),
            "  /b (missing x)".to_string(),
        ];
        let e = not_found(&dirs, &tried).unwrap_err();
        let m = e.to_string();
        assert!(
            matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
        );
        for want in [
            "/a (no such directory)",
            "/b (missing x)",
            "FASHION_MNIST_DIR",
            "--features download",
            "copy those four files",
        ] {
            assert!(m.contains(want), "{want} not in {m}");
        }
    }

    #[test]
    fn class_names() {
        assert_eq!(CLASS_NAMES[0], "T-shirt/top");
        assert_eq!(CLASS_NAMES[9], "Ankle boot");
    }
}
