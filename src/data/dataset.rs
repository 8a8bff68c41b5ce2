//! A `tf.data`-like input pipeline on the host: slices, shuffle, repeat, batch, prefetch.
//!
//! ```
//! use anygpu::data::Dataset;
//!
//! // 10 examples of shape [2] (features) with one label each.
//! let x: Vec<f32> = (0..20).map(|v| v as f32).collect();
//! let y: Vec<i32> = (0..10).collect();
//! let ds = Dataset::from_tensor_slices(x, &[2], y)?
//!     .shuffle(10, 42)
//!     .repeat(Some(2))
//!     .batch(4, false)
//!     .prefetch(1);
//! assert_eq!(ds.len(), Some(5)); // 20 examples in batches of 4
//! for batch in ds.iter() {
//!     assert_eq!(batch.x_shape, [4, 2]);
//!     assert_eq!(batch.x.len(), 8);
//! }
//! # Ok::<(), anygpu::Error>(())
//! ```
//!
//! # Semantics
//!
//! The methods and their arguments mirror `tf.data.Dataset`:
//! [`from_tensor_slices`](Dataset::from_tensor_slices), [`shuffle`](Dataset::shuffle)
//! (`reshuffle_each_iteration=True`), [`repeat`](Dataset::repeat), [`batch`](Dataset::batch),
//! [`prefetch`](Dataset::prefetch). Each element of a pipeline without `batch` is one example,
//! returned as a [`Batch`] whose `x_shape` is the example shape (no batch dimension) and whose
//! `y` has one label, as TF yields unbatched elements.
//!
//! Combinators may come in any order and `shuffle`/`repeat` any number of times; they act on
//! whatever the stage before produces, as in TF. `shuffle` or `repeat` after `batch` shuffle or
//! repeat whole batches; `shuffle` after `repeat` mixes examples across epoch boundaries. The
//! one thing not supported is a second `batch` (TF would nest batches); it panics. `prefetch`
//! never changes the elements, so wherever it is placed it prefetches the pipeline's final
//! output on one background thread; a later `prefetch` replaces the buffer size. The usual
//! order, the one of the tutorial, is `from_tensor_slices → shuffle → repeat → batch →
//! prefetch`.
//!
//! The examples live in one [`Arc`]: iterators and the prefetch thread share them, and only the
//! batches they yield are copies.
//!
//! # Determinism
//!
//! Shuffling uses SplitMix64 seeded from the `seed` given to `shuffle`, mixed with the number
//! of the pass (each [`Dataset::iter`] call is pass 0, 1, 2, ... of that `Dataset` value) and
//! the repetition index of every enclosing `repeat`. Two pipelines built the same way with the
//! same seed therefore produce the same sequence of orders, and every epoch is in a new order,
//! like TF's `shuffle(seed=...)` with `reshuffle_each_iteration=True`. Prefetching does not
//! change the sequence.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::rng::SplitMix64;
use crate::{Error, Result};

/// One element of a [`Dataset`]: a batch of examples (or a single example when the pipeline
/// has no `batch` stage).
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// The features of the examples, row-major, `x_shape.iter().product()` values.
    pub x: Vec<f32>,
    /// `[batch_size, ...example_shape]`; just `example_shape` for an unbatched element.
    pub x_shape: Vec<usize>,
    /// One integer label per example; empty when the dataset has float targets.
    pub y: Vec<i32>,
    /// The examples' float targets, row-major (`target_shape` values per example), from
    /// [`Dataset::from_tensor_slices_with_targets`]; empty when the dataset has integer labels.
    pub y_values: Vec<f32>,
    /// The shape of one example's float target (`[]` with integer labels).
    pub target_shape: Vec<usize>,
}

impl Batch {
    /// The number of examples in the batch.
    pub fn batch_size(&self) -> usize {
        match self.y_values.is_empty() {
            true => self.y.len(),
            false => self.y_values.len() / self.target_shape.iter().product::<usize>().max(1),
        }
    }

    /// Whether the targets are float values (else integer labels).
    pub fn has_float_targets(&self) -> bool {
        !self.y_values.is_empty()
    }
}

/// The tensors the pipeline slices: shared by every iterator and prefetch thread.
#[derive(Debug)]
struct Source {
    x: Vec<f32>,
    /// Integer labels (empty with float targets).
    y: Vec<i32>,
    /// Float targets, `target_len` per example (empty with labels).
    y_values: Vec<f32>,
    target_shape: Vec<usize>,
    target_len: usize,
    /// Number of examples.
    n: usize,
    /// Whether the targets are float values.
    float: bool,
    example_shape: Vec<usize>,
    example_len: usize,
}

/// One transformation of the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Shuffle { buffer_size: usize, seed: u64 },
    Repeat(Option<usize>),
    Batch { size: usize, drop_remainder: bool },
}

/// A host-side input pipeline over `(features: f32, label: i32)` examples, after
/// `tf.data.Dataset`. See the [module documentation](self) for the semantics.
pub struct Dataset {
    source: Arc<Source>,
    stages: Vec<Stage>,
    prefetch: Option<usize>,
    /// How many passes ([`Dataset::iter`] calls) were started: seeds the next pass's shuffles.
    passes: AtomicU64,
}

impl Clone for Dataset {
    /// Shares the examples; the copy continues from the same pass number, then counts on its own.
    fn clone(&self) -> Self {
        Dataset {
            source: Arc::clone(&self.source),
            stages: self.stages.clone(),
            prefetch: self.prefetch,
            passes: AtomicU64::new(self.passes.load(Ordering::Relaxed)),
        }
    }
}

impl fmt::Debug for Dataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dataset")
            .field("num_examples", &self.num_examples())
            .field("example_shape", &self.source.example_shape)
            .field("stages", &self.stages)
            .field("prefetch", &self.prefetch)
            .finish()
    }
}

impl Dataset {
    /// Slices `x` and `y` along their first dimension into examples, like
    /// `tf.data.Dataset.from_tensor_slices((x, y))`.
    ///
    /// `x` holds `y.len()` examples of shape `example_shape`, row-major (so `x.len()` must be
    /// `y.len() * example_shape.iter().product()`; an empty `example_shape` means scalar
    /// features). Fails with [`Error::InvalidArgument`] otherwise.
    ///
    /// ```
    /// use anygpu::data::Dataset;
    /// let ds = Dataset::from_tensor_slices(vec![0.0; 3 * 28 * 28], &[28, 28, 1], vec![1, 2, 3])?;
    /// assert_eq!(ds.num_examples(), 3);
    /// assert!(Dataset::from_tensor_slices(vec![0.0; 5], &[2], vec![0, 1]).is_err());
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn from_tensor_slices(
        x: Vec<f32>,
        example_shape: &[usize],
        y: Vec<i32>,
    ) -> Result<Dataset> {
        let example_len = example_shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| {
                Error::InvalidArgument(format!("example shape {example_shape:?} overflows usize"))
            })?;
        let expected = y.len().checked_mul(example_len);
        if expected != Some(x.len()) {
            return Err(Error::InvalidArgument(format!(
                "from_tensor_slices: features have {} values but {} labels of example shape \
                 {example_shape:?} need {}: all tensors must have the same first dimension",
                x.len(),
                y.len(),
                expected.map_or_else(|| "more than usize::MAX".to_string(), |e| e.to_string())
            )));
        }
        let n = y.len();
        Ok(Dataset::from_source(Source {
            x,
            y,
            y_values: Vec::new(),
            target_shape: Vec::new(),
            target_len: 1,
            n,
            float: false,
            example_shape: example_shape.to_vec(),
            example_len,
        }))
    }

    /// Slices features `x` and float32 targets `y` into examples, like
    /// `tf.data.Dataset.from_tensor_slices((x, y))` with float targets: what the losses other
    /// than the sparse cross-entropy take (one-hot `[classes]`, `[units]`, or `[]` for one
    /// value per example).
    ///
    /// `y` holds one target of shape `target_shape` per example, row-major.
    ///
    /// ```
    /// use anygpu::data::Dataset;
    /// // 3 examples of 2 features, one-hot targets over 4 classes.
    /// let y = vec![1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0];
    /// let ds = Dataset::from_tensor_slices_with_targets(vec![0.5; 6], &[2], y, &[4])?.batch(2, false);
    /// let first = ds.iter().next().expect("a batch");
    /// assert_eq!(first.batch_size(), 2);
    /// assert_eq!(first.y_values.len(), 8);
    /// assert!(Dataset::from_tensor_slices_with_targets(vec![0.5; 6], &[2], vec![1.0; 5], &[4]).is_err());
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `x` and `y` do not hold the same number of examples, or
    /// a target shape with no elements.
    pub fn from_tensor_slices_with_targets(
        x: Vec<f32>,
        example_shape: &[usize],
        y: Vec<f32>,
        target_shape: &[usize],
    ) -> Result<Dataset> {
        let count = |shape: &[usize]| {
            shape
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| Error::InvalidArgument(format!("shape {shape:?} overflows usize")))
        };
        let example_len = count(example_shape)?;
        let target_len = count(target_shape)?;
        if target_len == 0 {
            return Err(Error::InvalidArgument(format!(
                "from_tensor_slices_with_targets: targets of shape {target_shape:?} have no \
                 elements"
            )));
        }
        let n = y.len() / target_len;
        if n * target_len != y.len() || n.checked_mul(example_len) != Some(x.len()) {
            return Err(Error::InvalidArgument(format!(
                "from_tensor_slices_with_targets: {} feature values of example shape \
                 {example_shape:?} and {} target values of shape {target_shape:?} are not the \
                 same number of examples: all tensors must have the same first dimension",
                x.len(),
                y.len()
            )));
        }
        Ok(Dataset::from_source(Source {
            x,
            y: Vec::new(),
            y_values: y,
            target_shape: target_shape.to_vec(),
            target_len,
            n,
            float: true,
            example_shape: example_shape.to_vec(),
            example_len,
        }))
    }

    fn from_source(source: Source) -> Dataset {
        Dataset {
            source: Arc::new(source),
            stages: Vec::new(),
            prefetch: None,
            passes: AtomicU64::new(0),
        }
    }

    /// Randomly shuffles the elements with a buffer of `buffer_size`, like TF's
    /// `shuffle(buffer_size, seed=seed, reshuffle_each_iteration=True)`.
    ///
    /// The buffer is filled with the first `buffer_size` elements; each output is a uniformly
    /// chosen buffer entry, replaced by the next input. `buffer_size >= ` the number of
    /// elements gives a full uniform shuffle; 1 leaves the order unchanged. Every pass gets a
    /// new order, deterministic in `seed` (see the module docs).
    ///
    /// # Panics
    ///
    /// If `buffer_size` is 0 (TF raises `InvalidArgumentError` there).
    pub fn shuffle(mut self, buffer_size: usize, seed: u64) -> Dataset {
        assert!(
            buffer_size > 0,
            "Dataset::shuffle: buffer_size must be greater than zero"
        );
        self.stages.push(Stage::Shuffle { buffer_size, seed });
        self
    }

    /// Repeats the elements `count` times, or forever with `None`, like TF's `repeat(count)`.
    ///
    /// A `shuffle` before `repeat` reshuffles on every repetition. Repeating an empty pipeline
    /// forever yields nothing (not an endless loop), as in TF.
    pub fn repeat(mut self, count: Option<usize>) -> Dataset {
        self.stages.push(Stage::Repeat(count));
        self
    }

    /// Combines consecutive examples into batches of `batch_size`, like TF's
    /// `batch(batch_size, drop_remainder)`; the last batch is smaller unless `drop_remainder`.
    ///
    /// # Panics
    ///
    /// If `batch_size` is 0 or the pipeline is already batched (nested batches are not
    /// supported).
    pub fn batch(mut self, batch_size: usize, drop_remainder: bool) -> Dataset {
        assert!(
            batch_size > 0,
            "Dataset::batch: batch_size must be greater than zero"
        );
        assert!(
            !self.is_batched(),
            "Dataset::batch: the dataset is already batched; nested batches are not supported"
        );
        self.stages.push(Stage::Batch {
            size: batch_size,
            drop_remainder,
        });
        self
    }

    /// Produces elements on a background thread, up to `buffer_size` ahead of the consumer,
    /// like TF's `prefetch(buffer_size)`. `0` turns prefetching off.
    ///
    /// The thread starts with each [`iter`](Dataset::iter) and ends when its iterator is
    /// exhausted or dropped.
    pub fn prefetch(mut self, buffer_size: usize) -> Dataset {
        self.prefetch = (buffer_size > 0).then_some(buffer_size);
        self
    }

    /// Starts a new pass over the pipeline (with a new shuffle order).
    ///
    /// ```
    /// use anygpu::data::Dataset;
    /// let ds = Dataset::from_tensor_slices(vec![0.0; 10], &[], (0..10).collect())?.batch(4, false);
    /// let sizes: Vec<usize> = ds.iter().map(|b| b.batch_size()).collect();
    /// assert_eq!(sizes, [4, 4, 2]);
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn iter(&self) -> BatchIter {
        let pass = self.passes.fetch_add(1, Ordering::Relaxed);
        let stages: Arc<[Stage]> = self.stages.as_slice().into();
        let ctx = mix(0x243F_6A88_85A3_08D3, pass);
        let producer = Producer {
            elems: build(&self.source, &stages, stages.len(), ctx),
            source: Arc::clone(&self.source),
        };
        match self.prefetch {
            None => BatchIter {
                inner: Inner::Direct(producer),
            },
            Some(buffer) => BatchIter::spawn(producer, buffer),
        }
    }

    /// How many passes were started so far: the number of the next [`iter`](Dataset::iter)'s
    /// pass, which seeds its shuffles. A training checkpoint records it.
    pub(crate) fn passes_started(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// Makes the next [`iter`](Dataset::iter) pass number `pass` (restoring a checkpoint).
    pub(crate) fn set_passes_started(&self, pass: u64) {
        self.passes.store(pass, Ordering::Relaxed);
    }

    /// The number of elements (batches, or examples when unbatched) in one pass, or `None`
    /// when the pipeline repeats forever; TF's `cardinality()`.
    pub fn len(&self) -> Option<usize> {
        let mut n = Some(self.source.n);
        for stage in &self.stages {
            n = match (*stage, n) {
                (_, None) => None,
                (Stage::Shuffle { .. }, n) => n,
                (Stage::Repeat(_), Some(0)) => Some(0),
                (Stage::Repeat(None), Some(_)) => None,
                (Stage::Repeat(Some(c)), Some(n)) => n.checked_mul(c),
                (
                    Stage::Batch {
                        size,
                        drop_remainder,
                    },
                    Some(n),
                ) => Some(if drop_remainder {
                    n / size
                } else {
                    n.div_ceil(size)
                }),
            };
        }
        n
    }

    /// Whether one pass yields no element at all.
    pub fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }

    /// The shape of one example's features (without the batch dimension).
    pub fn example_shape(&self) -> &[usize] {
        &self.source.example_shape
    }

    /// The number of examples sliced by [`from_tensor_slices`](Dataset::from_tensor_slices).
    pub fn num_examples(&self) -> usize {
        self.source.n
    }

    /// The shape of one example's float target; `None` when the targets are integer labels.
    pub fn target_shape(&self) -> Option<&[usize]> {
        self.source.float.then_some(&self.source.target_shape[..])
    }

    /// What decides the batches of a pass: the examples' count and shape and the pipeline's
    /// transformations (not prefetching, which changes no batch). A checkpoint's position in
    /// the data is only valid for a dataset with the same description.
    pub(crate) fn describe(&self) -> String {
        let stages: Vec<String> = self
            .stages
            .iter()
            .map(|s| match s {
                Stage::Shuffle { buffer_size, seed } => format!("shuffle({buffer_size}, {seed})"),
                Stage::Repeat(None) => "repeat()".to_string(),
                Stage::Repeat(Some(n)) => format!("repeat({n})"),
                Stage::Batch {
                    size,
                    drop_remainder,
                } => format!("batch({size}, {drop_remainder})"),
            })
            .collect();
        let targets = match self.target_shape() {
            Some(shape) => format!(" with float targets of shape {shape:?}"),
            None => String::new(),
        };
        format!(
            "{} examples of shape {:?}{targets}, {}",
            self.num_examples(),
            self.example_shape(),
            stages.join("."),
        )
    }

    fn is_batched(&self) -> bool {
        self.stages.iter().any(|s| matches!(s, Stage::Batch { .. }))
    }
}

impl IntoIterator for &Dataset {
    type Item = Batch;
    type IntoIter = BatchIter;
    fn into_iter(self) -> BatchIter {
        self.iter()
    }
}

/// An element moving through the stages: an example index, or the indices of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Elem {
    One(usize),
    Many(Vec<usize>),
}

type ElemIter = Box<dyn Iterator<Item = Elem> + Send>;

/// Builds the iterator of the first `upto` stages; `ctx` identifies the pass and repetition.
fn build(source: &Arc<Source>, stages: &Arc<[Stage]>, upto: usize, ctx: u64) -> ElemIter {
    let Some(last) = upto.checked_sub(1) else {
        return Box::new((0..source.n).map(Elem::One));
    };
    let inner = || build(source, stages, last, ctx);
    match stages[last] {
        Stage::Shuffle { buffer_size, seed } => Box::new(ShuffleIter {
            inner: inner(),
            buffer: Vec::new(),
            buffer_size,
            rng: SplitMix64::new(mix(mix(seed, ctx), last as u64)),
            filled: false,
        }),
        Stage::Repeat(count) => Box::new(RepeatIter {
            source: Arc::clone(source),
            stages: Arc::clone(stages),
            upto: last,
            ctx,
            count,
            rep: 0,
            yielded: false,
            inner: (count != Some(0)).then(|| build(source, stages, last, mix(ctx, 1))),
        }),
        Stage::Batch {
            size,
            drop_remainder,
        } => Box::new(BatchStage {
            inner: inner(),
            size,
            drop_remainder,
        }),
    }
}

/// TF's shuffle buffer.
struct ShuffleIter {
    inner: ElemIter,
    buffer: Vec<Elem>,
    buffer_size: usize,
    rng: SplitMix64,
    filled: bool,
}

impl Iterator for ShuffleIter {
    type Item = Elem;
    fn next(&mut self) -> Option<Elem> {
        if !self.filled {
            self.filled = true;
            self.buffer
                .extend(self.inner.by_ref().take(self.buffer_size));
        }
        if self.buffer.is_empty() {
            return None;
        }
        let i = self.rng.below(self.buffer.len());
        Some(match self.inner.next() {
            Some(e) => std::mem::replace(&mut self.buffer[i], e),
            None => self.buffer.swap_remove(i),
        })
    }
}

/// Re-runs the stages below it `count` times (forever for `None`), each with a new context.
struct RepeatIter {
    source: Arc<Source>,
    stages: Arc<[Stage]>,
    upto: usize,
    ctx: u64,
    count: Option<usize>,
    rep: usize,
    /// Whether the current repetition yielded anything: an empty one ends the repeat.
    yielded: bool,
    inner: Option<ElemIter>,
}

impl Iterator for RepeatIter {
    type Item = Elem;
    fn next(&mut self) -> Option<Elem> {
        loop {
            let inner = self.inner.as_mut()?;
            if let Some(e) = inner.next() {
                self.yielded = true;
                return Some(e);
            }
            self.rep += 1;
            let more = self.count.is_none_or(|c| self.rep < c);
            self.inner = (more && self.yielded).then(|| {
                build(
                    &self.source,
                    &self.stages,
                    self.upto,
                    mix(self.ctx, self.rep as u64 + 1),
                )
            });
            self.yielded = false;
        }
    }
}

/// Groups example indices into batches.
struct BatchStage {
    inner: ElemIter,
    size: usize,
    drop_remainder: bool,
}

impl Iterator for BatchStage {
    type Item = Elem;
    fn next(&mut self) -> Option<Elem> {
        let mut idx = Vec::with_capacity(self.size);
        for e in self.inner.by_ref() {
            match e {
                Elem::One(i) => idx.push(i),
                // `batch` refuses to run twice, so nothing upstream yields batches.
                Elem::Many(v) => idx.extend(v),
            }
            if idx.len() >= self.size {
                return Some(Elem::Many(idx));
            }
        }
        (!idx.is_empty() && !self.drop_remainder).then_some(Elem::Many(idx))
    }
}

/// The stage chain plus the examples: turns elements into [`Batch`]es.
struct Producer {
    elems: ElemIter,
    source: Arc<Source>,
}

impl Producer {
    fn next_batch(&mut self) -> Option<Batch> {
        let src = &*self.source;
        let len = src.example_len;
        let rows = |idx: &[usize]| {
            let mut x = Vec::with_capacity(idx.len() * len);
            for &i in idx {
                x.extend_from_slice(&src.x[i * len..(i + 1) * len]);
            }
            x
        };
        let tl = src.target_len;
        let labels = |idx: &[usize]| match src.y.is_empty() {
            true => Vec::new(),
            false => idx.iter().map(|&i| src.y[i]).collect(),
        };
        let values = |idx: &[usize]| {
            let mut y = Vec::with_capacity(if src.y_values.is_empty() {
                0
            } else {
                idx.len() * tl
            });
            if !src.y_values.is_empty() {
                for &i in idx {
                    y.extend_from_slice(&src.y_values[i * tl..(i + 1) * tl]);
                }
            }
            y
        };
        Some(match self.elems.next()? {
            Elem::One(i) => Batch {
                x: rows(&[i]),
                x_shape: src.example_shape.clone(),
                y: labels(&[i]),
                y_values: values(&[i]),
                target_shape: src.target_shape.clone(),
            },
            Elem::Many(idx) => {
                let mut x_shape = Vec::with_capacity(1 + src.example_shape.len());
                x_shape.push(idx.len());
                x_shape.extend_from_slice(&src.example_shape);
                Batch {
                    x: rows(&idx),
                    x_shape,
                    y: labels(&idx),
                    y_values: values(&idx),
                    target_shape: src.target_shape.clone(),
                }
            }
        })
    }
}

/// One pass over a [`Dataset`]: an iterator of [`Batch`]es, from [`Dataset::iter`].
///
/// With `prefetch`, a background thread fills a bounded channel; dropping the iterator
/// disconnects the channel and joins the thread (which stops after at most the batch it is
/// assembling).
pub struct BatchIter {
    inner: Inner,
}

enum Inner {
    Direct(Producer),
    Prefetch {
        rx: Option<Receiver<Batch>>,
        thread: Option<JoinHandle<()>>,
    },
}

impl BatchIter {
    fn spawn(mut producer: Producer, buffer: usize) -> BatchIter {
        let (tx, rx): (SyncSender<Batch>, Receiver<Batch>) = mpsc::sync_channel(buffer);
        let spawned = std::thread::Builder::new()
            .name("anygpu-prefetch".into())
            .spawn(move || {
                while let Some(b) = producer.next_batch() {
                    if tx.send(b).is_err() {
                        break; // the iterator was dropped
                    }
                }
            });
        match spawned {
            Ok(thread) => BatchIter {
                inner: Inner::Prefetch {
                    rx: Some(rx),
                    thread: Some(thread),
                },
            },
            Err(e) => {
                // The closure (and with it the producer) is gone; nothing to recover. Fail loudly
                // in the log and yield nothing rather than panic in an iterator constructor.
                log::error!("could not start the prefetch thread: {e}; the pass yields nothing");
                BatchIter {
                    inner: Inner::Prefetch {
                        rx: None,
                        thread: None,
                    },
                }
            }
        }
    }

    /// Drops the channel and waits for the prefetch thread; re-raises its panic, if any.
    fn stop(&mut self) -> std::thread::Result<()> {
        if let Inner::Prefetch { rx, thread } = &mut self.inner {
            drop(rx.take());
            if let Some(t) = thread.take() {
                return t.join();
            }
        }
        Ok(())
    }
}

impl Iterator for BatchIter {
    type Item = Batch;
    fn next(&mut self) -> Option<Batch> {
        match &mut self.inner {
            Inner::Direct(p) => p.next_batch(),
            Inner::Prefetch { rx, .. } => {
                let got = rx.as_ref()?.recv().ok();
                if got.is_none() {
                    if let Err(panic) = self.stop() {
                        std::panic::resume_unwind(panic);
                    }
                }
                got
            }
        }
    }
}

impl Drop for BatchIter {
    fn drop(&mut self) {
        if self.stop().is_err() {
            log::error!("the prefetch thread panicked");
        }
    }
}

impl fmt::Debug for BatchIter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.inner {
            Inner::Direct(_) => "direct",
            Inner::Prefetch { .. } => "prefetch",
        };
        f.debug_struct("BatchIter").field("kind", &kind).finish()
    }
}

/// Mixes two words into one well-distributed seed (SplitMix64's finalizer over both).
fn mix(a: u64, b: u64) -> u64 {
    SplitMix64::new(a ^ SplitMix64::new(b).next_u64()).next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` examples of shape [3]: x = [i, i + 0.5, -i], y = i.
    fn ds(n: usize) -> Dataset {
        let x = (0..n)
            .flat_map(|i| [i as f32, i as f32 + 0.5, -(i as f32)])
            .collect();
        Dataset::from_tensor_slices(x, &[3], (0..n as i32).collect()).unwrap()
    }

    fn labels(it: impl Iterator<Item = Batch>) -> Vec<i32> {
        it.flat_map(|b| b.y).collect()
    }

    fn is_permutation(v: &[i32], n: usize) -> bool {
        let mut s = v.to_vec();
        s.sort_unstable();
        s == (0..n as i32).collect::<Vec<_>>()
    }

    #[test]
    fn from_tensor_slices_checks_lengths() {
        let e = Dataset::from_tensor_slices(vec![0.0; 7], &[2, 2], vec![1, 2]).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("7 values") && m.contains("2 labels") && m.contains("need 8"),
            "{m}"
        );
        let e = Dataset::from_tensor_slices(vec![], &[usize::MAX, 2], vec![]).unwrap_err();
        assert!(e.to_string().contains("overflows"));
        let d = Dataset::from_tensor_slices(vec![], &[0], vec![1, 2]).unwrap();
        assert_eq!(d.iter().count(), 2);
    }

    #[test]
    fn unbatched_elements_are_examples() {
        let d = ds(4);
        let all: Vec<Batch> = d.iter().collect();
        assert_eq!(all.len(), 4);
        assert_eq!(all[2].x, [2.0, 2.5, -2.0]);
        assert_eq!(all[2].x_shape, [3]);
        assert_eq!(all[2].y, [2]);
        assert_eq!(d.len(), Some(4));
        assert_eq!(d.example_shape(), [3]);
    }

    #[test]
    fn shuffle_is_a_permutation_for_any_buffer() {
        let n = 257;
        for buffer in [1, 2, 7, 64, 256, 257, 1000] {
            let d = ds(n).shuffle(buffer, 9);
            for _ in 0..3 {
                let v = labels(d.iter());
                assert!(is_permutation(&v, n), "buffer {buffer}");
                if buffer == 1 {
                    assert_eq!(v, (0..n as i32).collect::<Vec<_>>());
                }
            }
        }
    }

    #[test]
    fn features_follow_their_labels() {
        let d = ds(100).shuffle(100, 3).batch(7, false);
        for b in d.iter() {
            for (k, &label) in b.y.iter().enumerate() {
                let f = label as f32;
                assert_eq!(&b.x[k * 3..k * 3 + 3], &[f, f + 0.5, -f]);
            }
        }
    }

    #[test]
    fn new_order_each_pass_same_for_same_seed() {
        let a = ds(500).shuffle(500, 7);
        let b = ds(500).shuffle(500, 7);
        let c = ds(500).shuffle(500, 8);
        let (a0, a1) = (labels(a.iter()), labels(a.iter()));
        let (b0, b1) = (labels(b.iter()), labels(b.iter()));
        assert_ne!(a0, a1);
        assert_eq!((&a0, &a1), (&b0, &b1));
        assert_ne!(a0, labels(c.iter()));
        // A small buffer still reshuffles each pass.
        let s = ds(500).shuffle(10, 7);
        assert_ne!(labels(s.iter()), labels(s.iter()));
    }

    #[test]
    fn repeat_counts_and_reshuffles_each_epoch() {
        let n = 50;
        assert_eq!(labels(ds(n).repeat(Some(0)).iter()).len(), 0);
        assert_eq!(ds(n).repeat(Some(0)).len(), Some(0));
        let d = ds(n).shuffle(n, 1).repeat(Some(3));
        assert_eq!(d.len(), Some(3 * n));
        let v = labels(d.iter());
        assert_eq!(v.len(), 3 * n);
        let epochs: Vec<&[i32]> = v.chunks(n).collect();
        for e in &epochs {
            assert!(is_permutation(e, n));
        }
        assert_ne!(epochs[0], epochs[1]);
        assert_ne!(epochs[1], epochs[2]);

        let forever = ds(n).repeat(None);
        assert_eq!(forever.len(), None);
        assert_eq!(labels(forever.iter().take(3 * n)).len(), 3 * n);
        // Repeating nothing forever ends at once.
        let empty = Dataset::from_tensor_slices(vec![], &[3], vec![]).unwrap();
        let empty = empty.repeat(None);
        assert_eq!(empty.len(), Some(0));
        assert_eq!(empty.iter().count(), 0);
    }

    #[test]
    fn batch_sizes() {
        let sizes = |d: &Dataset| d.iter().map(|b| b.batch_size()).collect::<Vec<_>>();
        let d = ds(10).batch(4, false);
        assert_eq!(sizes(&d), [4, 4, 2]);
        assert_eq!(d.len(), Some(3));
        let d = ds(10).batch(4, true);
        assert_eq!(sizes(&d), [4, 4]);
        assert_eq!(d.len(), Some(2));
        let d = ds(8).batch(4, true);
        assert_eq!(sizes(&d), [4, 4]);
        let d = ds(3).batch(4, true);
        assert_eq!((sizes(&d), d.len()), (vec![], Some(0)));
        assert!(d.is_empty());
        // Repeat before batch: batches span epochs, as in TF.
        let d = ds(10).repeat(Some(2)).batch(4, false);
        assert_eq!((sizes(&d), d.len()), (vec![4, 4, 4, 4, 4], Some(5)));
        let b = ds(10).batch(4, false).iter().next().unwrap();
        assert_eq!(b.x_shape, [4, 3]);
        assert_eq!(b.x.len(), 12);
        assert_eq!(b.y, [0, 1, 2, 3]);
    }

    #[test]
    fn combinators_after_batch_act_on_batches() {
        let d = ds(10).batch(5, false).repeat(Some(2)).shuffle(4, 2);
        assert_eq!(d.len(), Some(4));
        let batches: Vec<Vec<i32>> = d.iter().map(|b| b.y).collect();
        assert_eq!(batches.len(), 4);
        for b in &batches {
            assert!(b == &[0, 1, 2, 3, 4] || b == &[5, 6, 7, 8, 9], "{b:?}");
        }
    }

    #[test]
    #[should_panic(expected = "already batched")]
    fn double_batch_panics() {
        let _ = ds(4).batch(2, false).batch(2, false);
    }

    #[test]
    fn prefetch_yields_the_same_sequence() {
        let plain = ds(1000).shuffle(100, 5).repeat(Some(2)).batch(32, false);
        let pre = ds(1000)
            .shuffle(100, 5)
            .repeat(Some(2))
            .batch(32, false)
            .prefetch(3);
        for _ in 0..2 {
            let a: Vec<Batch> = plain.iter().collect();
            let b: Vec<Batch> = pre.iter().collect();
            assert_eq!(a.len(), 63);
            assert_eq!(a, b);
        }
        let p0 = ds(20).prefetch(0);
        assert_eq!(p0.iter().count(), 20);
    }

    #[test]
    fn dropping_a_prefetching_iterator_stops_its_thread() {
        let d = ds(1000)
            .shuffle(1000, 1)
            .repeat(None)
            .batch(8, false)
            .prefetch(2);
        let base = Arc::strong_count(&d.source);
        let mut it = d.iter();
        assert_eq!(it.next().unwrap().batch_size(), 8);
        // The thread holds a reference while it runs (producer) ...
        assert!(Arc::strong_count(&d.source) > base);
        drop(it);
        // ... and `drop` joined it: the producer, and so its reference, is gone.
        assert_eq!(Arc::strong_count(&d.source), base);

        // An exhausted iterator has stopped its thread too.
        let d = ds(10).batch(3, false).prefetch(1);
        let mut it = d.iter();
        assert_eq!(it.by_ref().count(), 4);
        assert!(it.next().is_none());
        assert_eq!(Arc::strong_count(&d.source), base);
    }

    #[test]
    fn rng_is_uniform_enough() {
        let mut r = SplitMix64::new(1);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[r.below(10)] += 1;
        }
        for c in counts {
            assert!((9_500..10_500).contains(&c), "{counts:?}");
        }
        let f = r.uniform();
        assert!((0.0..1.0).contains(&f));
    }
}
