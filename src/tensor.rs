//! Tensors: a shape, a dtype, a device, and storage in that device's arena (GPU) or in host
//! memory (CPU). Immutable to users; optimizer updates write parameters in place internally.

use std::fmt;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::device::logical::{Backend, GpuRange};
use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::memory::{host, Allocation};
use crate::placement::{self, OpInfo};
use crate::rng::SplitMix64;
use crate::shape;

pub use crate::dtype::{DType, Element};

/// Where a tensor's elements live.
pub(crate) enum Storage {
    /// Host memory, as raw 32-bit words (f32 or i32 bit patterns).
    Cpu(RwLock<Vec<u32>>),
    /// A range of the device's arena.
    Gpu(Allocation),
}

pub(crate) struct TensorInner {
    shape: Vec<usize>,
    dtype: DType,
    device: LogicalDevice,
    /// Shared by reshaped views of the same data.
    storage: Arc<Storage>,
}

/// An n-dimensional array on one device (TensorFlow's `EagerTensor`).
///
/// Cloning is cheap and shares the data. Created on the device of the current scope (see
/// [`crate::with_device`]) or the default device: `GPU:0` when a GPU is visible, else `CPU:0`.
///
/// ```
/// use anygpu::Tensor;
/// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
/// let b = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])?;
/// let c = a.matmul(&b)?;
/// assert_eq!(c.shape(), &[2, 2]);
/// assert_eq!(c.to_vec::<f32>()?, [22.0, 28.0, 49.0, 64.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<TensorInner>);

const CONST_OP: OpInfo = OpInfo {
    name: "_EagerConst",
    gpu: Some(&[]),
};

/// Which way [`Tensor::assign_flat`] copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// From the parts into the flat tensor (pack).
    FromParts,
    /// From the flat tensor into the parts (unpack).
    IntoParts,
}

/// `len` 32-bit elements of `range` from element `offset`.
fn sub_range(range: GpuRange<'_>, offset: usize, len: usize) -> GpuRange<'_> {
    GpuRange {
        buffer: range.buffer,
        offset: range.offset + offset as u64 * 4,
        size: len as u64 * 4,
    }
}

/// Fills `out` from little-endian bytes (a mapped readback: aligned in practice, but not
/// promised).
/// A read of a tensor's words started by [`Tensor::words_begin`].
pub(crate) struct PendingWords {
    tensor: Tensor,
    read: Option<crate::device::context::PendingRead>,
    words: Vec<u32>,
}

impl PendingWords {
    /// The words, waiting for the device if they are still on their way.
    pub(crate) fn finish(self) -> Result<Vec<u32>> {
        let (Some(read), Some(g)) = (self.read, self.tensor.0.device.gpu()) else {
            return Ok(self.words);
        };
        let len = self.tensor.dtype().words(self.tensor.len());
        let mut words = host::filled(len, 0u32, || format!("a host copy of {:?}", self.tensor))?;
        g.ctx
            .read_finish(read, |bytes| words_from_bytes(bytes, &mut words))?;
        Ok(words)
    }

    /// The words if the device is done with them, without waiting (not a host wait);
    /// `Ok(None)` while they are on their way. Once it answered `Some`, the words are taken.
    pub(crate) fn try_finish(&mut self) -> Result<Option<Vec<u32>>> {
        let (Some(read), Some(g)) = (self.read.as_mut(), self.tensor.0.device.gpu()) else {
            return Ok(Some(std::mem::take(&mut self.words)));
        };
        let len = self.tensor.dtype().words(self.tensor.len());
        let mut words = host::filled(len, 0u32, || format!("a host copy of {:?}", self.tensor))?;
        let done = g
            .ctx
            .read_try(read, |bytes| words_from_bytes(bytes, &mut words))?;
        Ok(done.map(|()| words))
    }
}

pub(crate) fn words_from_bytes(bytes: &[u8], out: &mut [u32]) {
    match bytemuck::try_cast_slice::<u8, u32>(bytes) {
        Ok(words) => out.copy_from_slice(words),
        Err(_) => {
            for (w, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
    }
}

/// `"tensor with shape[1000,1000] and type float"`, TF's wording in OOM messages.
pub(crate) fn describe(shape: &[usize], dtype: DType) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    format!("tensor with shape[{}] and type {dtype}", dims.join(","))
}

/// Checks that `len` values fill a tensor of `shape`, in arithmetic that cannot wrap.
fn check_len(len: usize, shape: &[usize], dtype: DType) -> Result<()> {
    let expected = shape::num_elements(shape, dtype)?;
    if expected != len {
        return Err(Error::ShapeMismatch {
            op: "from_vec",
            lhs: vec![len],
            rhs: shape.to_vec(),
            hint: format!(": {len} values cannot fill a tensor of {expected} elements"),
        });
    }
    Ok(())
}

/// The head of the CPU's out-of-memory message: `tensor with shape[..] and type float on
/// /job:localhost/replica:0/task:0/device:CPU:0` (TensorFlow's wording).
fn oom_what(shape: &[usize], dtype: DType, device: &LogicalDevice) -> String {
    format!("{} on {}", describe(shape, dtype), device.full_name())
}

/// Zeros for a host-side f32 tensor of `shape`, its size checked and its memory reserved
/// fallibly.
fn host_values(shape: &[usize]) -> Result<Vec<f32>> {
    let len = shape::num_elements(shape, DType::F32)?;
    host::filled(len, 0.0, || {
        format!("{} on the host", describe(shape, DType::F32))
    })
}

impl Tensor {
    /// A tensor of `shape` holding `data` (row-major), on the current scope's device.
    ///
    /// # Errors
    /// A shape mismatch when `data.len()` is not the product of `shape`; `InvalidArgument`
    /// when that product does not fit in memory at all; `ResourceExhausted` when the device is
    /// out of memory.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        Tensor::from_slice(&data, shape)
    }

    /// Like [`Tensor::from_vec`], copying from a slice.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<Tensor> {
        check_len(data.len(), shape, T::DTYPE)?;
        let device = placement::place(&CONST_OP, None)?;
        Tensor::from_slice_on(data, shape, &device)
    }

    /// A tensor on an explicit device, bypassing scopes.
    pub fn from_slice_on<T: Element>(
        data: &[T],
        shape: &[usize],
        device: &LogicalDevice,
    ) -> Result<Tensor> {
        check_len(data.len(), shape, T::DTYPE)?;
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let mut words = vec![0u32; T::DTYPE.words(data.len())];
        bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Tensor::from_words(&words, shape, T::DTYPE, device)
    }

    pub(crate) fn from_words(
        words: &[u32],
        shape: &[usize],
        dtype: DType,
        device: &LogicalDevice,
    ) -> Result<Tensor> {
        match &device.0.backend {
            Backend::Cpu(_) => Ok(Tensor::with_storage(
                shape,
                dtype,
                device,
                Storage::Cpu(RwLock::new({
                    let mut buffer = host::take(words.len(), || oom_what(shape, dtype, device))?;
                    buffer.copy_from_slice(words);
                    buffer
                })),
            )),
            Backend::Gpu(g) => {
                let t = Tensor::uninit(shape, dtype, device)?;
                if let Some(range) = t.gpu_range() {
                    g.ctx.upload(range, bytemuck::cast_slice(words));
                }
                Ok(t)
            }
            Backend::Unavailable(u) => Err(u.error(device.full_name())),
        }
    }

    fn with_storage(
        shape: &[usize],
        dtype: DType,
        device: &LogicalDevice,
        storage: Storage,
    ) -> Tensor {
        Tensor(Arc::new(TensorInner {
            shape: shape.to_vec(),
            dtype,
            device: device.clone(),
            storage: Arc::new(storage),
        }))
    }

    /// A tensor whose contents are unspecified (ops overwrite all of it; NaN on the CPU under
    /// the NaN trap of `memory::host`).
    ///
    /// # Errors
    /// `InvalidArgument` naming the shape when its size overflows; the device's out-of-memory
    /// error.
    pub(crate) fn uninit(shape: &[usize], dtype: DType, device: &LogicalDevice) -> Result<Tensor> {
        let len = shape::num_elements(shape, dtype)?;
        let bytes = (len * dtype.size()) as u64;
        crate::profiler::note_allocation(bytes);
        let storage = match &device.0.backend {
            Backend::Cpu(_) => Storage::Cpu(RwLock::new(host::take(dtype.words(len), || {
                oom_what(shape, dtype, device)
            })?)),
            Backend::Gpu(g) => {
                let what = describe(shape, dtype);
                Storage::Gpu(g.arena.allocate(bytes, Some(&what))?)
            }
            Backend::Unavailable(u) => return Err(u.error(device.full_name())),
        };
        Ok(Tensor::with_storage(shape, dtype, device, storage))
    }

    /// A tensor on `device` whose contents are unspecified (whatever its memory held before),
    /// like `torch.empty`: the cheapest way to get memory an op will overwrite.
    pub fn empty_on(shape: &[usize], dtype: DType, device: &LogicalDevice) -> Result<Tensor> {
        Tensor::uninit(shape, dtype, device)
    }

    /// A tensor of zeros on the current scope's device.
    pub fn zeros(shape: &[usize]) -> Result<Tensor> {
        let device = placement::place(&CONST_OP, None)?;
        Tensor::zeros_on(shape, DType::F32, &device)
    }

    /// A tensor of zeros of `dtype` on `device`.
    pub fn zeros_on(shape: &[usize], dtype: DType, device: &LogicalDevice) -> Result<Tensor> {
        let t = Tensor::uninit(shape, dtype, device)?;
        if let (Backend::Gpu(g), Some(range)) = (&device.0.backend, t.gpu_range()) {
            g.ctx.clear(range, range.size);
        }
        if let Some(mut words) = t.host_write() {
            words.fill(0);
        }
        Ok(t)
    }

    /// Seeded normal samples (`tf.random.normal`), on the current scope's device.
    pub fn random_normal(shape: &[usize], mean: f32, stddev: f32, seed: u64) -> Result<Tensor> {
        let mut rng = SplitMix64::new(seed);
        let mut data = host_values(shape)?;
        data.iter_mut()
            .for_each(|v| *v = mean + stddev * rng.normal());
        Tensor::from_vec(data, shape)
    }

    /// Seeded uniform samples in `[low, high)` (`tf.random.uniform`), on the current scope's
    /// device.
    pub fn random_uniform(shape: &[usize], low: f32, high: f32, seed: u64) -> Result<Tensor> {
        let mut rng = SplitMix64::new(seed);
        let mut data = host_values(shape)?;
        data.iter_mut()
            .for_each(|v| *v = low + (high - low) * rng.uniform() as f32);
        Tensor::from_vec(data, shape)
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.0.shape
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.0.shape.iter().product()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.shape.len()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    /// Full name of the device holding the tensor:
    /// `/job:localhost/replica:0/task:0/device:GPU:0`.
    pub fn device(&self) -> &str {
        self.0.device.full_name()
    }

    /// The device holding the tensor.
    pub fn device_handle(&self) -> &LogicalDevice {
        &self.0.device
    }

    /// The GPU range, for binding; `None` on the CPU or for an empty tensor.
    pub(crate) fn gpu_range(&self) -> Option<GpuRange<'_>> {
        match &*self.0.storage {
            Storage::Gpu(a) => GpuRange::of(a),
            Storage::Cpu(_) => None,
        }
    }

    pub(crate) fn host_read(&self) -> Option<RwLockReadGuard<'_, Vec<u32>>> {
        match &*self.0.storage {
            // Host data is plain words; a panic elsewhere cannot leave them inconsistent.
            Storage::Cpu(data) => Some(data.read().unwrap_or_else(|e| e.into_inner())),
            Storage::Gpu(_) => None,
        }
    }

    pub(crate) fn host_write(&self) -> Option<RwLockWriteGuard<'_, Vec<u32>>> {
        match &*self.0.storage {
            Storage::Cpu(data) => Some(data.write().unwrap_or_else(|e| e.into_inner())),
            Storage::Gpu(_) => None,
        }
    }

    /// Whether both tensors are views of one storage (a tensor and its reshapes): their host
    /// words sit behind one lock.
    pub(crate) fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }

    /// Checks the dtype, for ops.
    pub(crate) fn expect_dtype(&self, op: &'static str, dtype: DType) -> Result<()> {
        if self.dtype() != dtype {
            return Err(Error::DType {
                op,
                expected: dtype.name(),
                got: self.dtype().name(),
            });
        }
        Ok(())
    }

    /// Copies the elements to the host, waiting only for the commands that produce them.
    ///
    /// # Errors
    /// A dtype mismatch when `T` is not the tensor's type; a GPU error if the device failed.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.expect_dtype("to_vec", T::DTYPE)?;
        let words = self.words()?;
        let bytes: &[u8] = bytemuck::cast_slice(&words);
        Ok(bytemuck::pod_collect_to_vec(
            &bytes[..self.len() * self.dtype().size()],
        ))
    }

    // ---- reads finished later ----
    /// Starts reading the raw words: on a GPU the copy is recorded and submitted now, and
    /// [`PendingWords::finish`] waits for it (only for the commands recorded before it); on
    /// the CPU the words are taken now.
    pub(crate) fn words_begin(&self) -> Result<PendingWords> {
        let read = match &*self.0.storage {
            Storage::Gpu(alloc) => match (GpuRange::of(alloc), self.0.device.gpu()) {
                (Some(range), Some(g)) => {
                    let bytes = (self.dtype().words(self.len()) * 4) as u64;
                    Some(g.ctx.read_begin(range, bytes))
                }
                _ => None,
            },
            Storage::Cpu(_) => None,
        };
        let words = match read {
            Some(_) => Vec::new(),
            None => self.words()?,
        };
        Ok(PendingWords {
            tensor: self.clone(),
            read,
            words,
        })
    }

    /// The raw 32-bit words, from wherever they are (two float16 elements a word).
    pub(crate) fn words(&self) -> Result<Vec<u32>> {
        match &*self.0.storage {
            Storage::Cpu(_) => Ok(self.host_read().map(|d| d.clone()).unwrap_or_default()),
            Storage::Gpu(alloc) => {
                let Some(range) = GpuRange::of(alloc) else {
                    return Ok(Vec::new());
                };
                let ctx = &self
                    .0
                    .device
                    .gpu()
                    .expect("GPU storage implies a GPU device")
                    .ctx;
                let len = self.dtype().words(self.len());
                let mut words = host::filled(len, 0u32, || format!("a host copy of {self:?}"))?;
                ctx.read_with(range, (len * 4) as u64, |bytes| {
                    words_from_bytes(bytes, &mut words)
                })?;
                Ok(words)
            }
        }
    }

    /// A copy of this tensor on `device` (the same tensor if it is already there).
    ///
    /// Virtual siblings on one adapter copy buffer to buffer on the device; anything else goes
    /// through host memory.
    pub fn to_device(&self, device: &LogicalDevice) -> Result<Tensor> {
        if self.0.device.same_device(device) {
            return Ok(self.clone());
        }
        if self.0.device.shares_context_with(device) {
            let out = Tensor::uninit(self.shape(), self.dtype(), device)?;
            if let (Some(src), Some(dst), Some(g)) =
                (self.gpu_range(), out.gpu_range(), device.gpu())
            {
                // Whole words: buffer copies move multiples of 4 bytes, and allocations are
                // rounded far beyond that.
                let words = self.dtype().words(self.len());
                g.ctx.copy(src, dst, (words * 4) as u64);
            }
            return Ok(out);
        }
        let words = self.words()?;
        Tensor::from_words(&words, self.shape(), self.dtype(), device)
    }

    /// Overwrites every element with host words (an upload on a GPU), allocating nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the lengths differ.
    pub(crate) fn write_words(&self, words: &[u32]) -> Result<()> {
        if words.len() != self.dtype().words(self.len()) {
            return Err(Error::InvalidArgument(format!(
                "{} words cannot fill {self:?}",
                words.len()
            )));
        }
        match (self.gpu_range(), self.host_write()) {
            (Some(range), _) => {
                if let Some(g) = self.0.device.gpu() {
                    g.ctx.upload(range, bytemuck::cast_slice(words));
                }
            }
            (None, Some(mut host)) => host.copy_from_slice(words),
            (None, None) => {}
        }
        Ok(())
    }

    /// Overwrites this tensor's elements with `value`'s, in place, wherever both live
    /// (TensorFlow's `Variable.assign`). Every clone of this tensor sees the new values; nothing
    /// is allocated on this tensor's device.
    ///
    /// ```
    /// use anygpu::Tensor;
    /// let w = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// let alias = w.clone();
    /// w.assign(&Tensor::from_vec(vec![5.0f32, 6.0], &[2])?)?;
    /// assert_eq!(alias.to_vec::<f32>()?, [5.0, 6.0]);
    /// assert!(w.assign(&Tensor::from_vec(vec![1.0f32], &[1])?).is_err());
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// A shape mismatch for another shape or dtype; a device error.
    pub fn assign(&self, value: &Tensor) -> Result<()> {
        if value.shape() != self.shape() || value.dtype() != self.dtype() {
            return Err(Error::ShapeMismatch {
                op: "Assign",
                lhs: self.shape().to_vec(),
                rhs: value.shape().to_vec(),
                hint: format!(
                    ": cannot assign a {} to a {}",
                    describe(value.shape(), value.dtype()),
                    describe(self.shape(), self.dtype())
                ),
            });
        }
        value.copy_elements_to(0, self, 0, self.len())
    }

    /// Overwrites `len` elements of `dst` from `dst_offset` with those of `self` from
    /// `src_offset`, allocating nothing on `dst`'s device: a buffer copy between virtual
    /// siblings (or within one device), else one read of the source range to the host and one
    /// write into the destination. The packing and broadcasting of mirrored training are built
    /// on it, so that a failure cannot leave a replica half-updated for want of memory.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for ranges outside either tensor or different dtypes; a device
    /// error from the read.
    pub(crate) fn copy_elements_to(
        &self,
        src_offset: usize,
        dst: &Tensor,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        let ends_within =
            |offset: usize, t: &Tensor| offset.checked_add(len).is_some_and(|end| end <= t.len());
        if self.dtype() != dst.dtype()
            || !ends_within(src_offset, self)
            || !ends_within(dst_offset, dst)
        {
            return Err(Error::InvalidArgument(format!(
                "copy of {len} elements from {src_offset} of {self:?} to {dst_offset} of {dst:?}: \
                 out of range or different dtypes"
            )));
        }
        let same_storage = Arc::ptr_eq(&self.0.storage, &dst.0.storage);
        if len == 0 || (same_storage && src_offset == dst_offset) {
            return Ok(());
        }
        if self.dtype().size() != 4 {
            return self.copy_whole_to(dst, len);
        }
        debug_assert!(
            !same_storage || src_offset + len <= dst_offset || dst_offset + len <= src_offset,
            "overlapping ranges of one tensor"
        );
        let bytes = (len * self.dtype().size()) as u64;
        // Same storage on the CPU: one lock, or the read and write guards would deadlock.
        if same_storage {
            if let Some(mut words) = dst.host_write() {
                words.copy_within(src_offset..src_offset + len, dst_offset);
                return Ok(());
            }
        }
        match (self.gpu_range(), dst.gpu_range()) {
            (Some(src), Some(to))
                if self.0.device.shares_context_with(&dst.0.device)
                    || self.0.device.same_device(&dst.0.device) =>
            {
                let g = dst
                    .0
                    .device
                    .gpu()
                    .expect("GPU storage implies a GPU device");
                if src.buffer == to.buffer {
                    let name = dst.0.device.name();
                    g.ctx
                        .copy_within(name, (src, src_offset), (to, dst_offset), len)
                } else {
                    let (from, into) = (
                        sub_range(src, src_offset, len),
                        sub_range(to, dst_offset, len),
                    );
                    g.ctx.copy(from, into, bytes);
                    Ok(())
                }
            }
            (Some(src), to) => {
                let ctx = &self
                    .0
                    .device
                    .gpu()
                    .expect("GPU storage implies a GPU device")
                    .ctx;
                // Straight from the mapped readback into the destination: one host touch.
                ctx.read_with(sub_range(src, src_offset, len), bytes, |data| match to {
                    Some(to) => {
                        let g = dst
                            .0
                            .device
                            .gpu()
                            .expect("GPU storage implies a GPU device");
                        g.ctx.upload(sub_range(to, dst_offset, len), data);
                    }
                    None => {
                        if let Some(mut words) = dst.host_write() {
                            words_from_bytes(data, &mut words[dst_offset..dst_offset + len]);
                        }
                    }
                })
            }
            (None, Some(to)) => {
                let g = dst
                    .0
                    .device
                    .gpu()
                    .expect("GPU storage implies a GPU device");
                if let Some(words) = self.host_read() {
                    g.ctx.upload(
                        sub_range(to, dst_offset, len),
                        bytemuck::cast_slice(&words[src_offset..src_offset + len]),
                    );
                }
                Ok(())
            }
            (None, None) => {
                if let (Some(from), Some(mut to)) = (self.host_read(), dst.host_write()) {
                    to[dst_offset..dst_offset + len]
                        .copy_from_slice(&from[src_offset..src_offset + len]);
                }
                Ok(())
            }
        }
    }

    /// [`Tensor::copy_elements_to`] for elements narrower than a word: only whole tensors, as
    /// words (the pieces that mirrored training and pipelines cut are float32).
    fn copy_whole_to(&self, dst: &Tensor, len: usize) -> Result<()> {
        if len != self.len() || len != dst.len() || Arc::ptr_eq(&self.0.storage, &dst.0.storage) {
            return Err(Error::InvalidArgument(format!(
                "copy of {len} elements from {self:?} to {dst:?}: {} tensors are copied whole",
                self.dtype()
            )));
        }
        let words = self.words()?;
        dst.write_words(&words)
    }

    /// The tensors' elements one after the other in a new 1-D tensor on `device` (each part
    /// copied once; see [`Tensor::copy_elements_to`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for mixed dtypes or no parts; the device's out-of-memory
    /// error.
    pub(crate) fn concat_flat(parts: &[&Tensor], device: &LogicalDevice) -> Result<Tensor> {
        let dtype = parts
            .first()
            .map(|t| t.dtype())
            .ok_or_else(|| Error::InvalidArgument("concat_flat: nothing to concatenate".into()))?;
        let total = parts.iter().map(|t| t.len()).sum::<usize>();
        let out = Tensor::uninit(&[total], dtype, device)?;
        out.assign_flat(parts, Direction::FromParts)?;
        Ok(out)
    }

    /// Copies between this 1-D tensor and `parts` laid end to end in it: into `self`
    /// ([`Direction::FromParts`]) or out of it into the parts' existing memory
    /// ([`Direction::IntoParts`]). Allocates nothing on either side.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the parts do not add up to this tensor; device errors.
    pub(crate) fn assign_flat(&self, parts: &[&Tensor], direction: Direction) -> Result<()> {
        let total = parts.iter().map(|t| t.len()).sum::<usize>();
        if total != self.len() {
            return Err(Error::InvalidArgument(format!(
                "a flat tensor of {} elements cannot hold parts of {total} in all",
                self.len()
            )));
        }
        let mut offset = 0;
        for part in parts {
            match direction {
                Direction::FromParts => part.copy_elements_to(0, self, offset, part.len())?,
                Direction::IntoParts => self.copy_elements_to(offset, part, 0, part.len())?,
            }
            offset += part.len();
        }
        Ok(())
    }

    /// Consecutive slices of this tensor's elements, copied into new tensors of `shapes` on
    /// the same device.
    ///
    /// # Errors
    /// As [`Tensor::assign_flat`], and the device's out-of-memory error.
    pub(crate) fn split_flat(&self, shapes: &[Vec<usize>]) -> Result<Vec<Tensor>> {
        let parts = shapes
            .iter()
            .map(|s| Tensor::uninit(s, self.dtype(), self.device_handle()))
            .collect::<Result<Vec<_>>>()?;
        self.assign_flat(&parts.iter().collect::<Vec<_>>(), Direction::IntoParts)?;
        Ok(parts)
    }

    /// Rows `rows` of this tensor (along its first dimension) copied into a new tensor on the
    /// same device (`x[a:b]`): a buffer copy, or the `copy_range` kernel within one arena
    /// buffer, so a micro-batch cut from a batch on a GPU never waits for the device.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a scalar or rows past the end; the device's out-of-memory
    /// error.
    pub(crate) fn slice_rows(&self, rows: std::ops::Range<usize>) -> Result<Tensor> {
        let total = self.shape().first().copied().unwrap_or(0);
        if self.rank() == 0 || rows.start > rows.end || rows.end > total {
            return Err(Error::InvalidArgument(format!(
                "rows {rows:?} of {self:?}: out of range"
            )));
        }
        let per_row: usize = self.shape()[1..].iter().product();
        let mut shape = self.shape().to_vec();
        shape[0] = rows.len();
        let out = Tensor::uninit(&shape, self.dtype(), self.device_handle())?;
        self.copy_elements_to(rows.start * per_row, &out, 0, rows.len() * per_row)?;
        Ok(out)
    }

    /// The same data with another shape of as many elements (`tf.reshape`).
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let n = shape::num_elements(shape, self.dtype())?;
        if n != self.len() {
            return Err(Error::ShapeMismatch {
                op: "Reshape",
                lhs: self.shape().to_vec(),
                rhs: shape.to_vec(),
                hint: format!(": {} elements cannot take a shape of {n}", self.len()),
            });
        }
        Ok(Tensor(Arc::new(TensorInner {
            shape: shape.to_vec(),
            dtype: self.0.dtype,
            device: self.0.device.clone(),
            storage: Arc::clone(&self.0.storage),
        })))
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Storage::Cpu(words) = self {
            let words = std::mem::take(words.get_mut().unwrap_or_else(|e| e.into_inner()));
            host::give(words);
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor(shape={:?}, dtype={}, device={})",
            self.shape(),
            self.dtype(),
            self.device()
        )
    }
}
