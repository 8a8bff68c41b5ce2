//! Pipelined model parallelism: a batch cut into micro-batches that flow through the stages of
//! a model split over devices, so that the devices work at the same time instead of in turn.
//!
//! A *stage* is a maximal run of consecutive layers on one device. Each stage runs on a thread
//! of its own and follows a program of forwards and backwards ([`Schedule`]); activations go
//! forward and gradients back through channels, and the receiving stage moves each one to its
//! device ([`Tensor::to_device`]: a buffer copy between virtual siblings, a trip through host
//! memory otherwise). The channels never block a sender, so a stage waits only for what it
//! needs next.
//!
//! Micro-batch `i` of `m` rows out of `n` has its loss gradient scaled by `m / n`: the sum of
//! the micro-batches' gradients is then the gradient of the batch's mean loss, the serial
//! step's up to summation order. Each layer's gradients are summed on its device in
//! micro-batch order under both schedules, so 1F1B gives GPipe's bits. Nothing here touches a
//! weight: the caller updates only once every stage has finished, so a failure on any stage
//! (out of memory, say) leaves the model as it was.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;
use std::time::{Duration, Instant};

use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::nn::autocast::StepCasts;
use crate::nn::mirrored::HostBatch;
use crate::nn::objective::Objective;
use crate::nn::pass::{self, Stage};
use crate::nn::step_output::StepPart;
use crate::placement::PipelineTag;
use crate::profiler;
use crate::tensor::Tensor;

/// The order in which each stage runs its micro-batches' forwards and backwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Schedule {
    /// GPipe's fill–drain: every micro-batch forward, then every one backward. Each stage keeps
    /// the activations of all M micro-batches until its backwards start.
    GPipe,
    /// 1F1B (PipeDream-Flush): stage `k` of `K` runs `K − 1 − k` forwards ahead, then
    /// alternates one forward and one backward, then drains. The same idle time as GPipe, with
    /// at most `K − k` micro-batches' activations alive on stage `k`.
    OneFOneB,
}

/// Pipelined training for a [`Sequential`](crate::nn::Sequential) whose layers sit on several
/// devices: each batch is cut into micro-batches that flow through the model's stages (maximal
/// runs of consecutive layers on one device), each stage on a thread of its own, with the
/// gradients summed over the micro-batches and one update per batch.
///
/// With `K` stages and `M` micro-batches a step takes about `M + K − 1` stage-times instead of
/// `K · M`: the idle "bubble" is `(K − 1) / (M + K − 1)`. The result equals the serial step's up
/// to summation order. TensorFlow has no counterpart; GPipe (Huang et al., 2019) and
/// PipeDream-Flush (Narayanan et al., 2021) name the schedules.
///
/// ```
/// use anygpu::nn::{Activation, Dense, Loss, Pipeline, Schedule, Sequential, Sgd};
/// use anygpu::{DeviceKind, LogicalDeviceConfiguration, Runtime, Tensor};
///
/// // Two logical CPUs with one thread each: two devices that really run side by side.
/// let rt = Runtime::builder().configure()?;
/// let cpu = rt.list_physical_devices(DeviceKind::Cpu)[0].clone();
/// let one = LogicalDeviceConfiguration::new().threads(1);
/// rt.set_logical_device_configuration(&cpu, &[one, one])?;
/// let cpus = rt.list_logical_devices("CPU")?;
///
/// let mut model = Sequential::with_seed(7);
/// model.add_on(&cpus[0], Dense::new(16).activation(Activation::Relu).input_shape(&[4]))?;
/// model.add_on(&cpus[1], Dense::new(3).activation(Activation::Softmax))?;
/// model.compile(Loss::sparse_categorical_crossentropy(), Sgd::new(0.1), &[])?;
/// model.set_pipeline(Pipeline::one_f_one_b(4))?;
/// assert_eq!(model.pipeline().map(|p| p.schedule()), Some(Schedule::OneFOneB));
///
/// let x = Tensor::from_slice_on(&[0.5f32; 10 * 4], &[10, 4], &cpus[0])?;
/// let y = Tensor::from_slice_on(&[0i32, 1, 2, 0, 1, 2, 0, 1, 2, 0], &[10], &cpus[1])?;
/// let loss = model.train_on_batch(&x, &y)?; // 4 micro-batches of 3, 3, 2 and 2 rows
/// assert!(loss.is_finite());
/// let stats = model.pipeline_stats();
/// assert_eq!(stats.len(), 2);
/// assert_eq!(stats[1].layers, 1..2);
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pipeline {
    schedule: Schedule,
    micro_batches: usize,
}

impl Pipeline {
    /// GPipe's fill–drain schedule over `micro_batches` micro-batches per batch.
    pub fn gpipe(micro_batches: usize) -> Pipeline {
        Pipeline {
            schedule: Schedule::GPipe,
            micro_batches,
        }
    }

    /// The 1F1B schedule (PipeDream-Flush) over `micro_batches` micro-batches per batch.
    pub fn one_f_one_b(micro_batches: usize) -> Pipeline {
        Pipeline {
            schedule: Schedule::OneFOneB,
            micro_batches,
        }
    }

    /// The schedule.
    pub fn schedule(&self) -> Schedule {
        self.schedule
    }

    /// Micro-batches per batch: a batch of fewer rows is cut into single rows.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// Checks the pipeline before it is set on a model.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 micro-batches.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.micro_batches == 0 {
            return Err(Error::InvalidArgument(
                "a pipeline needs at least 1 micro-batch per batch, got 0".into(),
            ));
        }
        Ok(())
    }
}

/// What one stage did in the last pipelined step, timed on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StageStats {
    /// The stage's layers, as indices into the model.
    pub layers: Range<usize>,
    /// The stage's device (`/device:CPU:1`).
    pub device: String,
    /// Time in the stage's forwards and backwards: on a CPU the work itself; on a GPU the time
    /// to record it (the device runs it later).
    pub busy: Duration,
    /// Time waiting for an activation from the stage before or a gradient from the stage
    /// after: the stage's share of the bubble, plus any imbalance between stages.
    pub waiting: Duration,
}

/// One unit of a stage's program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    Forward(usize),
    Backward(usize),
}

/// The program of stage `stage` of `stages` under `schedule`, for `micro` micro-batches. Every
/// stage runs the backwards in micro-batch order, so the channels stay first-in first-out and
/// gradients are summed in the same order under both schedules.
fn program(schedule: Schedule, stage: usize, stages: usize, micro: usize) -> Vec<Work> {
    match schedule {
        Schedule::GPipe => (0..micro)
            .map(Work::Forward)
            .chain((0..micro).map(Work::Backward))
            .collect(),
        Schedule::OneFOneB => {
            // Enough forwards in flight to keep the stages after this one busy.
            let warmup = (stages - 1 - stage).min(micro);
            let mut p: Vec<Work> = (0..warmup).map(Work::Forward).collect();
            for i in 0..micro - warmup {
                p.push(Work::Forward(warmup + i));
                p.push(Work::Backward(i));
            }
            p.extend((micro - warmup..micro).map(Work::Backward));
            p
        }
    }
}

/// `rows` examples cut into at most `micro` consecutive ranges, the first `rows % parts` one
/// row longer; never an empty one.
fn micro_batch_rows(rows: usize, micro: usize) -> Vec<Range<usize>> {
    let parts = micro.min(rows);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let len = rows / parts + usize::from(i < rows % parts);
            start += len;
            start - len..start
        })
        .collect()
}

/// The stages of `layers`: maximal runs of consecutive layers on one device.
fn stage_ranges(layers: &[Stage<'_>]) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        match out.last_mut() {
            Some(r) if layers[r.start].device.same_device(l.device) => r.end = i + 1,
            _ => out.push(i..i + 1),
        }
    }
    out
}

/// Where a pipelined step takes its examples from.
#[derive(Clone, Copy)]
pub(crate) enum Examples<'a> {
    /// A batch on the host (from `fit`): each micro-batch is uploaded straight to the first
    /// stage's device, its labels to the last's.
    Host(HostBatch<'a>),
    /// A batch already on devices (`train_step`): micro-batches are cut there
    /// ([`Tensor::slice_rows`]), so nothing waits for the device that produced them.
    Device { x: &'a Tensor, y: &'a Tensor },
}

impl Examples<'_> {
    fn rows(&self) -> usize {
        match self {
            Examples::Host(b) => b.rows(),
            Examples::Device { y, .. } => y.shape().first().copied().unwrap_or(0),
        }
    }

    /// Examples `rows`, on `device` or on their own device (`forward` moves them on).
    fn x(&self, rows: Range<usize>, device: &LogicalDevice) -> Result<Tensor> {
        match self {
            Examples::Host(b) => b.examples(rows, device),
            Examples::Device { x, .. } if rows.len() == self.rows() => Ok((*x).clone()),
            Examples::Device { x, .. } => x.slice_rows(rows),
        }
    }

    /// Labels `rows`, on `device` or on their own device (the loss moves them on).
    fn y(&self, rows: Range<usize>, device: &LogicalDevice) -> Result<Tensor> {
        match self {
            Examples::Host(b) => b.labels(rows, device),
            Examples::Device { y, .. } if rows.len() == self.rows() => Ok((*y).clone()),
            Examples::Device { y, .. } => y.slice_rows(rows),
        }
    }
}

/// What a pipelined step leaves for the update.
pub(crate) struct PipelineGradients {
    /// Every layer's gradients summed over the micro-batches, on the layer's device.
    pub(crate) grads: Vec<Vec<Tensor>>,
    /// The batch's loss sum and metric sums, on the last stage's device.
    pub(crate) part: StepPart,
    /// What each stage did.
    pub(crate) stats: Vec<StageStats>,
}

/// A tensor crossing a stage boundary, with its micro-batch.
type Message = (usize, Tensor);

/// A stage's channels to its neighbours (`None` at the ends of the pipeline).
#[derive(Default)]
struct Links {
    from_previous: Option<Receiver<Message>>,
    to_next: Option<Sender<Message>>,
    from_next: Option<Receiver<Message>>,
    to_previous: Option<Sender<Message>>,
}

/// Why a stage stopped early.
enum Stop {
    /// Its own error: the step's error.
    Failed(Error),
    /// A neighbour hung up, having stopped for a reason of its own.
    NeighbourGone,
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Failed(e)
    }
}

/// What every stage reads.
struct Shared<'a> {
    examples: Examples<'a>,
    rows: Vec<Range<usize>>,
    objective: &'a Objective,
    /// The factor of the batch's loss gradient (the loss scale).
    factor: f32,
}

/// One stage's part of the step.
struct StageJob<'a, 'l> {
    index: usize,
    layers: &'a [Stage<'l>],
    device: &'a LogicalDevice,
    program: Vec<Work>,
    links: Links,
}

/// What a stage leaves: its layers' summed gradients, and the loss terms on the last stage.
struct StageDone {
    grads: Vec<Vec<Tensor>>,
    part: Option<StepPart>,
    busy: Duration,
    waiting: Duration,
}

/// Receives micro-batch `i`'s tensor from a neighbour, counting the wait.
fn receive(rx: &Receiver<Message>, i: usize, waiting: &mut Duration) -> Result<Tensor, Stop> {
    let start = Instant::now();
    let (j, t) = rx.recv().map_err(|_| Stop::NeighbourGone)?;
    *waiting += start.elapsed();
    if j != i {
        // The programs keep every channel in micro-batch order; this is a bug, not bad input.
        return Err(Stop::Failed(Error::Model(format!(
            "pipeline: micro-batch {j} arrived where {i} was expected"
        ))));
    }
    Ok(t)
}

/// Adds one micro-batch's gradients of a layer to the running sum (its first ones start it).
fn accumulate(sum: &mut Vec<Tensor>, grads: Vec<Tensor>) -> Result<()> {
    if sum.is_empty() {
        *sum = grads;
        return Ok(());
    }
    for (s, g) in sum.iter_mut().zip(&grads) {
        let _on = g.device_handle().scope();
        *s = s.add(g)?;
    }
    Ok(())
}

/// The loss terms of two micro-batches added, on `device`.
fn add_parts(a: StepPart, b: StepPart, device: &LogicalDevice) -> Result<StepPart> {
    let _on = device.scope();
    Ok(StepPart {
        loss_sum: a.loss_sum.add(&b.loss_sum)?,
        metrics: a
            .metrics
            .iter()
            .zip(&b.metrics)
            .map(|(a, b)| a.add(b))
            .collect::<Result<_>>()?,
    })
}

/// Runs one stage's program.
fn run_stage(job: StageJob<'_, '_>, shared: &Shared<'_>) -> Result<StageDone, Stop> {
    let StageJob {
        index,
        layers,
        device,
        program,
        links,
    } = job;
    let total = shared.examples.rows();
    let first = links.from_previous.is_none();
    let mut saved: HashMap<usize, Vec<Vec<Tensor>>> = HashMap::new();
    let mut dlogits: HashMap<usize, Tensor> = HashMap::new();
    let mut grads: Vec<Vec<Tensor>> = vec![Vec::new(); layers.len()];
    let mut part: Option<StepPart> = None;
    let (mut busy, mut waiting) = (Duration::ZERO, Duration::ZERO);
    // The stage's weights are cast once for all its micro-batches.
    let _casts = StepCasts::enter();
    for work in program {
        let (Work::Forward(i) | Work::Backward(i)) = work;
        let rows = shared.rows[i].clone();
        match work {
            Work::Forward(_) => {
                let input = match &links.from_previous {
                    Some(rx) => Some(receive(rx, i, &mut waiting)?),
                    None => None,
                };
                let start = Instant::now();
                let _tag = PipelineTag::new(index, i);
                let _span = profiler::is_running()
                    .then(|| profiler::Trace::new(format!("stage {index} forward {i}")));
                let input = match input {
                    Some(t) => t,
                    None => shared.examples.x(rows.clone(), device)?,
                };
                let (out, kept) = pass::forward(layers, &input, true)?;
                drop(input);
                saved.insert(i, kept);
                match &links.to_next {
                    Some(tx) => tx.send((i, out)).map_err(|_| Stop::NeighbourGone)?,
                    None => {
                        let y = shared.examples.y(rows.clone(), device)?;
                        // Scaled so that the micro-batches' gradients add up to the batch's.
                        let share = rows.len() as f32 / total as f32;
                        let terms = pass::loss_terms(
                            device,
                            &out,
                            &y,
                            shared.objective,
                            shared.factor * share,
                        )?;
                        drop(out);
                        let d = terms.dlogits;
                        dlogits.insert(i, d);
                        let this = StepPart {
                            loss_sum: terms.loss_sum,
                            metrics: terms.metrics,
                        };
                        part = Some(match part.take() {
                            None => this,
                            Some(sum) => add_parts(sum, this, device)?,
                        });
                    }
                }
                busy += start.elapsed();
            }
            Work::Backward(_) => {
                let dy = match &links.from_next {
                    Some(rx) => receive(rx, i, &mut waiting)?,
                    None => dlogits
                        .remove(&i)
                        .ok_or_else(|| missing("loss gradient", i))?,
                };
                let start = Instant::now();
                let _tag = PipelineTag::new(index, i);
                let _span = profiler::is_running()
                    .then(|| profiler::Trace::new(format!("stage {index} backward {i}")));
                let kept = saved.remove(&i).ok_or_else(|| missing("activations", i))?;
                let dx = pass::backward_from(layers, kept, dy, !first, |j, g| {
                    accumulate(&mut grads[j], g)
                })?;
                if let Some(tx) = &links.to_previous {
                    let dx = dx.ok_or_else(|| missing("input gradient", i))?;
                    tx.send((i, dx)).map_err(|_| Stop::NeighbourGone)?;
                }
                busy += start.elapsed();
            }
        }
    }
    Ok(StageDone {
        grads,
        part,
        busy,
        waiting,
    })
}

/// A schedule that asked for something it had not made: a bug, said as such.
fn missing(what: &str, micro_batch: usize) -> Error {
    Error::Model(format!(
        "pipeline: no {what} for micro-batch {micro_batch} (a schedule bug)"
    ))
}

/// Forward, loss and backward of a batch through `layers`, pipelined: every layer's gradients
/// summed over the micro-batches, and the batch's loss terms. Changes no weight.
///
/// # Errors
/// The first stage's own error (a stage that stops because its neighbour did is not the
/// cause): the device's out-of-memory error names the device; a panicking stage is
/// [`Error::Model`] naming its stage and device.
pub(crate) fn gradients(
    pipeline: Pipeline,
    layers: &[Stage<'_>],
    examples: Examples<'_>,
    (objective, factor): (&Objective, f32),
) -> Result<PipelineGradients> {
    pipeline.validate()?;
    let ranges = stage_ranges(layers);
    let k = ranges.len();
    let shared = Shared {
        examples,
        rows: micro_batch_rows(examples.rows(), pipeline.micro_batches),
        objective,
        factor,
    };
    let micro = shared.rows.len();
    let mut links: Vec<Links> = (0..k).map(|_| Links::default()).collect();
    for b in 1..k {
        let (tx, rx) = mpsc::channel();
        links[b - 1].to_next = Some(tx);
        links[b].from_previous = Some(rx);
        let (tx, rx) = mpsc::channel();
        links[b].to_previous = Some(tx);
        links[b - 1].from_next = Some(rx);
    }
    let jobs: Vec<StageJob<'_, '_>> = ranges
        .iter()
        .zip(links)
        .enumerate()
        .map(|(index, (r, links))| StageJob {
            index,
            layers: &layers[r.clone()],
            device: layers[r.start].device,
            program: program(pipeline.schedule, index, k, micro),
            links,
        })
        .collect();
    let results: Vec<Result<StageDone, Stop>> = thread::scope(|s| {
        let shared = &shared;
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|job| {
                let name = format!("stage {} on {}", job.index, job.device.name());
                let device = job.device;
                // A stage alone on its device runs inside the device's own threads (a CPU's
                // pool), which saves a hand-off per op. Two stages of one device cannot: the
                // one waiting for its neighbour would hold the thread the other needs.
                let alone = ranges
                    .iter()
                    .filter(|r| layers[r.start].device.same_device(device))
                    .count()
                    == 1;
                let handle = thread::Builder::new()
                    .name(format!("anygpu pipeline {name}"))
                    .spawn_scoped(s, move || match alone {
                        true => device.run_on_own_threads(|| run_stage(job, shared)),
                        false => run_stage(job, shared),
                    });
                (name, handle)
            })
            .collect();
        handles
            .into_iter()
            .map(|(name, h)| match h {
                Ok(h) => h.join().unwrap_or_else(|panic| {
                    let why = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    Err(Stop::Failed(Error::Model(format!(
                        "pipeline {name} panicked: {why}"
                    ))))
                }),
                Err(e) => Err(Stop::Failed(Error::Model(format!(
                    "could not start a thread for pipeline {name}: {e}"
                )))),
            })
            .collect()
    });
    let mut done = Vec::with_capacity(k);
    let mut first_error = None;
    for r in results {
        match r {
            Ok(d) => done.push(d),
            Err(Stop::Failed(e)) => {
                first_error.get_or_insert(e);
            }
            Err(Stop::NeighbourGone) => {}
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    if done.len() != k {
        return Err(Error::Model(
            "pipeline: a stage stopped without an error".into(),
        ));
    }
    let mut grads = Vec::with_capacity(layers.len());
    let mut part = None;
    let mut stats = Vec::with_capacity(k);
    for (r, d) in ranges.into_iter().zip(done) {
        stats.push(StageStats {
            device: layers[r.start].device.name().to_string(),
            layers: r,
            busy: d.busy,
            waiting: d.waiting,
        });
        grads.extend(d.grads);
        part = part.or(d.part);
    }
    let part = part.ok_or_else(|| Error::Model("pipeline: no loss from the last stage".into()))?;
    Ok(PipelineGradients { grads, part, stats })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs every stage's program against the others as the threads would (a forward needs the
    /// stage before to have sent that micro-batch, a backward the stage after), one unit at a
    /// time; returns the most activations any stage held, or `None` when the programs deadlock.
    fn simulate(schedule: Schedule, stages: usize, micro: usize) -> Option<Vec<usize>> {
        let programs: Vec<Vec<Work>> = (0..stages)
            .map(|s| program(schedule, s, stages, micro))
            .collect();
        let mut next = vec![0; stages];
        let mut forwarded = vec![0usize; stages]; // forwards done, in order
        let mut backwarded = vec![0usize; stages];
        let mut alive = vec![0usize; stages];
        let mut peak = vec![0usize; stages];
        loop {
            let mut progressed = false;
            for s in 0..stages {
                let Some(&work) = programs[s].get(next[s]) else {
                    continue;
                };
                let ready = match work {
                    Work::Forward(i) => s == 0 || forwarded[s - 1] > i,
                    Work::Backward(i) => s + 1 == stages || backwarded[s + 1] > i,
                };
                if !ready {
                    continue;
                }
                match work {
                    Work::Forward(i) => {
                        assert_eq!(forwarded[s], i, "forwards in order");
                        forwarded[s] += 1;
                        alive[s] += 1;
                        peak[s] = peak[s].max(alive[s]);
                    }
                    Work::Backward(i) => {
                        assert_eq!(backwarded[s], i, "backwards in order");
                        assert!(forwarded[s] > i, "a backward after its forward");
                        backwarded[s] += 1;
                        alive[s] -= 1;
                    }
                }
                next[s] += 1;
                progressed = true;
            }
            if next.iter().zip(&programs).all(|(n, p)| *n == p.len()) {
                return Some(peak);
            }
            if !progressed {
                return None;
            }
        }
    }

    #[test]
    fn every_program_runs_each_micro_batch_once_each_way_without_deadlock() {
        for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
            for stages in 1..=4 {
                for micro in 1..=9 {
                    for s in 0..stages {
                        let p = program(schedule, s, stages, micro);
                        assert_eq!(p.len(), 2 * micro, "{schedule:?} K={stages} M={micro}");
                    }
                    let peak = simulate(schedule, stages, micro)
                        .unwrap_or_else(|| panic!("{schedule:?} K={stages} M={micro} deadlocks"));
                    for (s, p) in peak.into_iter().enumerate() {
                        let bound = match schedule {
                            Schedule::GPipe => micro,
                            Schedule::OneFOneB => (stages - s).min(micro),
                        };
                        assert_eq!(p, bound, "{schedule:?} K={stages} M={micro} stage {s}");
                    }
                }
            }
        }
    }

    #[test]
    fn one_f_one_b_alternates_after_its_warmup() {
        use Work::{Backward as B, Forward as F};
        assert_eq!(
            program(Schedule::OneFOneB, 0, 2, 3),
            [F(0), F(1), B(0), F(2), B(1), B(2)]
        );
        assert_eq!(
            program(Schedule::OneFOneB, 1, 2, 3),
            [F(0), B(0), F(1), B(1), F(2), B(2)]
        );
        assert_eq!(program(Schedule::GPipe, 1, 2, 2), [F(0), F(1), B(0), B(1)]);
    }

    #[test]
    fn micro_batches_cover_the_batch_evenly_and_are_never_empty() {
        assert_eq!(micro_batch_rows(10, 4), [0..3, 3..6, 6..8, 8..10]);
        assert_eq!(micro_batch_rows(8, 8).len(), 8);
        assert_eq!(micro_batch_rows(3, 8), [0..1, 1..2, 2..3]);
        let whole = micro_batch_rows(5, 1);
        assert_eq!((whole.len(), whole[0].clone()), (1, 0..5));
        assert!(micro_batch_rows(0, 4).is_empty());
    }
}
