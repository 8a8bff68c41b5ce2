//! Moving and summing one tensor per replica: the [`CrossDeviceOps`] trait, and the default
//! transport, [`HierarchicalAllReduce`].

use std::fmt;

use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::tensor::{words_from_bytes, DType, Tensor};

/// How replicas exchange tensors (TensorFlow's `tf.distribute.CrossDeviceOps`).
///
/// [`MirroredStrategy`](crate::distribute::MirroredStrategy) calls it once per training step
/// with every replica's gradients packed into one 1-D tensor, so an implementation sees few,
/// large transfers. A faster transport — peer-to-peer copies, a collective library — replaces
/// the default [`HierarchicalAllReduce`] through
/// [`MirroredStrategy::with_cross_device_ops`](crate::distribute::MirroredStrategy::with_cross_device_ops).
///
/// Both operations must give every destination the same bits: the strategy relies on it to
/// keep the replicas' weights identical.
pub trait CrossDeviceOps: Send + Sync + fmt::Debug {
    /// The element-wise sum of `values` — one tensor per replica, equal shapes, `f32`, each on
    /// its replica's device — on each device of `destinations`, in order. A result may be one
    /// of `values` itself when there is nothing to add to it (a single replica): treat the
    /// results as read-only.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no values, [`Error::ShapeMismatch`] for unequal shapes,
    /// [`Error::DType`] for a tensor that is not `f32`; device errors, and the destinations'
    /// out-of-memory errors.
    fn reduce_sum(&self, values: &[Tensor], destinations: &[LogicalDevice]) -> Result<Vec<Tensor>>;

    /// Overwrites each of `destinations` (tensors of `value`'s shape) with `value`'s elements,
    /// allocating nothing on their devices.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when a destination has another shape, before anything is
    /// written; device errors.
    fn broadcast_into(&self, value: &Tensor, destinations: &[Tensor]) -> Result<()>;
}

/// The default [`CrossDeviceOps`]: two levels, as the hardware is.
///
/// Replicas on one adapter (virtual siblings) are summed on the device, by buffer copies into
/// the first of them and an add kernel. Between adapters, and with the CPU, each adapter's
/// partial sum is read to the host once and added there straight from the mapped readback, in
/// replica order, then uploaded once per adapter and copied on the device to its other
/// replicas. Every value crosses each hop at most once.
///
/// ```
/// use anygpu::distribute::{CrossDeviceOps, HierarchicalAllReduce};
/// use anygpu::Tensor;
/// let rt = anygpu::Runtime::builder().virtual_cpus(2).build()?;
/// let cpus = rt.list_logical_devices("CPU")?;
/// let a = Tensor::from_slice_on(&[1.0f32, 2.0], &[2], &cpus[0])?;
/// let b = Tensor::from_slice_on(&[10.0f32, 20.0], &[2], &cpus[1])?;
/// let sums = HierarchicalAllReduce.reduce_sum(&[a, b], &cpus)?;
/// assert_eq!(sums[1].to_vec::<f32>()?, [11.0, 22.0]);
/// assert_eq!(sums[1].device_handle().name(), "/device:CPU:1");
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct HierarchicalAllReduce;

/// Replicas that share memory: the virtual siblings of one adapter, or the CPU's devices.
struct Group {
    /// Indices into the values, in order.
    members: Vec<usize>,
}

fn same_memory(a: &LogicalDevice, b: &LogicalDevice) -> bool {
    a.same_device(b) || a.shares_context_with(b) || (a.gpu().is_none() && b.gpu().is_none())
}

fn groups(devices: &[&LogicalDevice]) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        match out
            .iter_mut()
            .find(|g| same_memory(devices[g.members[0]], d))
        {
            Some(g) => g.members.push(i),
            None => out.push(Group { members: vec![i] }),
        }
    }
    out
}

fn check_values(values: &[Tensor]) -> Result<()> {
    let first = values.first().ok_or_else(|| {
        Error::InvalidArgument("reduce_sum: no values to reduce (one per replica)".into())
    })?;
    for v in values {
        v.expect_dtype("reduce_sum", DType::F32)?;
        if v.shape() != first.shape() {
            return Err(Error::ShapeMismatch {
                op: "reduce_sum",
                lhs: first.shape().to_vec(),
                rhs: v.shape().to_vec(),
                hint: ": every replica must contribute a tensor of the same shape".into(),
            });
        }
    }
    Ok(())
}

/// The sum of CPU tensors into a new one on `device`, read in place: no copies first.
fn sum_on_host(members: &[&Tensor], device: &LogicalDevice) -> Result<Tensor> {
    if members.len() == 1 {
        return Ok(members[0].clone());
    }
    let mut acc: Option<Vec<f32>> = None;
    for m in members {
        accumulate_on_host(m, &mut acc)?;
    }
    Tensor::from_slice_on(&acc.unwrap_or_default(), members[0].shape(), device)
}

/// Adds a partial sum into `acc` (or starts it), straight from where the partial lives.
fn accumulate_on_host(partial: &Tensor, acc: &mut Option<Vec<f32>>) -> Result<()> {
    let add = |acc: &mut Option<Vec<f32>>, words: &[u32]| match acc {
        None => *acc = Some(words.iter().map(|w| f32::from_bits(*w)).collect()),
        Some(acc) => {
            for (a, w) in acc.iter_mut().zip(words) {
                *a += f32::from_bits(*w);
            }
        }
    };
    if let Some(words) = partial.host_read() {
        add(acc, &words);
        return Ok(());
    }
    let (Some(range), Some(g)) = (partial.gpu_range(), partial.device_handle().gpu()) else {
        // An empty tensor: nothing to add.
        add(acc, &[]);
        return Ok(());
    };
    g.ctx.read_with(
        range,
        (partial.len() * 4) as u64,
        |bytes| match bytemuck::try_cast_slice::<u8, u32>(bytes) {
            Ok(words) => add(acc, words),
            Err(_) => {
                let mut words = vec![0u32; bytes.len() / 4];
                words_from_bytes(bytes, &mut words);
                add(acc, &words);
            }
        },
    )
}

impl CrossDeviceOps for HierarchicalAllReduce {
    fn reduce_sum(&self, values: &[Tensor], destinations: &[LogicalDevice]) -> Result<Vec<Tensor>> {
        check_values(values)?;
        let devices: Vec<&LogicalDevice> = values.iter().map(Tensor::device_handle).collect();
        let groups = groups(&devices);
        // Level 1: each group's sum on its first device, by device copies and adds.
        let mut partials = Vec::with_capacity(groups.len());
        for g in &groups {
            let leader = devices[g.members[0]];
            let members: Vec<&Tensor> = g.members.iter().map(|&m| &values[m]).collect();
            partials.push(match leader.gpu() {
                Some(_) => {
                    let _scope = leader.scope();
                    let mut sum = members[0].clone();
                    for m in &members[1..] {
                        sum = sum.add(&m.to_device(leader)?)?;
                    }
                    sum
                }
                None => sum_on_host(&members, leader)?,
            });
        }
        // Level 2: with one group the sum is already complete where it is; otherwise the
        // partials meet on the host. Start every device first, so they run side by side
        // while the host waits for the first.
        let complete = if partials.len() == 1 {
            Some(partials[0].clone())
        } else {
            for p in &partials {
                if let Some(g) = p.device_handle().gpu() {
                    g.ctx.flush();
                }
            }
            None
        };
        let host_sum = match complete {
            Some(_) => None,
            None => {
                let mut acc = None;
                for p in &partials {
                    accumulate_on_host(p, &mut acc)?;
                }
                acc
            }
        };
        // Delivery: one upload (or none) per memory group of the destinations, then copies
        // within the group.
        let mut delivered: Vec<Tensor> = Vec::with_capacity(destinations.len());
        for dest in destinations {
            let near = delivered
                .iter()
                .find(|t| same_memory(t.device_handle(), dest));
            let tensor = match (near, &complete, &host_sum) {
                (Some(src), _, _) => src.to_device(dest)?,
                (None, Some(sum), _) => sum.to_device(dest)?,
                (None, None, Some(sum)) => Tensor::from_slice_on(sum, values[0].shape(), dest)?,
                (None, None, None) => {
                    return Err(Error::InvalidArgument(
                        "reduce_sum: nothing was reduced".into(),
                    ))
                }
            };
            delivered.push(tensor);
        }
        Ok(delivered)
    }

    fn broadcast_into(&self, value: &Tensor, destinations: &[Tensor]) -> Result<()> {
        // Destinations sharing memory with the value (or with one already written) take a
        // device copy; the first of every other memory group takes the one host read.
        if let Some(dest) = destinations.iter().find(|d| d.shape() != value.shape()) {
            return Err(Error::ShapeMismatch {
                op: "broadcast",
                lhs: value.shape().to_vec(),
                rhs: dest.shape().to_vec(),
                hint: ": every destination must have the value's shape".into(),
            });
        }
        let mut host: Option<Vec<u32>> = None;
        let mut written: Vec<&Tensor> = Vec::new();
        for dest in destinations {
            let near = std::iter::once(value)
                .chain(written.iter().copied())
                .find(|t| same_memory(t.device_handle(), dest.device_handle()));
            match near {
                Some(src) => dest.assign(src)?,
                None => {
                    if host.is_none() {
                        host = Some(value.words()?);
                    }
                    if let Some(words) = &host {
                        dest.write_words(words)?;
                    }
                }
            }
            written.push(dest);
        }
        Ok(())
    }
}
