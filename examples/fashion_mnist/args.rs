//! The command line: every flag with its default, the checks on how they combine, and what
//! they name (the optimizer, a device).

use std::path::PathBuf;

use anygpu::nn::{Adam, Optimizer, Pipeline, Sgd};
use clap::Parser;

use crate::BoxError;

/// Train the TensorFlow GPU guide's Fashion-MNIST CNN.
#[derive(Parser, Debug)]
#[command(version, about)]
pub struct Args {
    /// Enable memory growth on every visible GPU.
    #[arg(long)]
    pub memory_growth: bool,
    /// Physical GPU indices to make visible, in order (e.g. `1,0`).
    #[arg(long, value_delimiter = ',')]
    pub visible: Option<Vec<usize>>,
    /// Cut the first visible GPU into logical GPUs of these MiB (e.g. `3072,3072`).
    #[arg(long, value_delimiter = ',')]
    pub r#virtual: Option<Vec<u64>>,
    /// Spread the model's three blocks over GPU:0, GPU:1 and GPU:2, as the tutorial does.
    #[arg(long)]
    pub split: bool,
    /// Cut CPU:0 into logical CPUs with these thread counts (e.g. `1,1`); --split then
    /// spreads the blocks over them.
    #[arg(long, value_delimiter = ',')]
    pub virtual_cpus: Option<Vec<usize>>,
    /// Pipeline each batch through the model's stages in M micro-batches.
    #[arg(long, value_name = "M")]
    pub pipeline: Option<usize>,
    /// The pipeline's schedule: `gpipe` (fill-drain) or `1f1b` (PipeDream-Flush: the same
    /// speed, fewer activations alive).
    #[arg(long, value_enum, default_value = "gpipe")]
    pub schedule: PipelineSchedule,
    /// `mirrored`: data parallelism over every logical GPU (tf.distribute.MirroredStrategy);
    /// `multi-worker`: over the processes `mpirun` starts (MultiWorkerMirroredStrategy).
    #[arg(long, value_enum)]
    pub strategy: Option<Strategy>,
    /// Threads of the CPU's kernels (tf.config.threading.set_intra_op_parallelism_threads).
    #[arg(long)]
    pub intra_op_threads: Option<usize>,
    /// Log where ops run while the model is created and for one forward/backward pass.
    #[arg(long)]
    pub log_placement: bool,
    /// `cpu` or `gpu:N`; default GPU:0 when a GPU is visible, else CPU:0.
    #[arg(long)]
    pub device: Option<String>,
    /// Training epochs.
    #[arg(long, default_value_t = 10)]
    pub epochs: usize,
    /// Batch size.
    #[arg(long, default_value_t = 128)]
    pub batch_size: usize,
    /// Steps per epoch; default: the training images (55,000) divided by the batch size.
    #[arg(long)]
    pub steps_per_epoch: Option<usize>,
    /// `sgd` (the tutorial's), `momentum` (SGD, momentum 0.9) or `adam`.
    #[arg(long, default_value = "sgd")]
    pub optimizer: String,
    /// Learning rate; default 0.01 for SGD, 0.001 for Adam (Keras' defaults).
    #[arg(long)]
    pub lr: Option<f32>,
    /// Seed of the weights and of the shuffling.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// `keras.mixed_precision.set_global_policy("mixed_float16")`: layers compute in float16
    /// on devices that have it, with float32 weights and dynamic loss scaling.
    #[arg(long)]
    pub mixed_precision: bool,
    /// Time this many training steps after a warm-up, print the median, and exit.
    #[arg(long)]
    pub time_steps: Option<usize>,
    /// Profile a few training steps after warm-up (after the timed ones, with --time-steps):
    /// writes DIR/trace.json (open it in ui.perfetto.dev) and DIR/top_ops.txt, prints the table.
    #[arg(long, value_name = "DIR")]
    pub profile: Option<PathBuf>,
    /// Output directory; default a new ./runs/<timestamp>. An existing, non-empty directory
    /// needs --overwrite (or --resume).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace the files of an existing --out; start afresh over a checkpoint found in
    /// --checkpoint-dir.
    #[arg(long)]
    pub overwrite: bool,
    /// Checkpoint the whole run into DIR after every epoch (keras.callbacks.BackupAndRestore);
    /// the checkpoint is deleted once the trained model is saved.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Continue the run checkpointed in --checkpoint-dir.
    #[arg(long)]
    pub resume: bool,
    /// TensorBoard logs (keras.callbacks.TensorBoard) in DIR; default <out>/tensorboard.
    #[arg(long, value_name = "DIR")]
    pub tensorboard: Option<PathBuf>,
}

/// The `--strategy` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// `tf.distribute.MirroredStrategy`.
    Mirrored,
    /// `tf.distribute.MultiWorkerMirroredStrategy` (feature `mpi`).
    MultiWorker,
}

/// The `--schedule` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PipelineSchedule {
    /// GPipe's fill-drain.
    Gpipe,
    /// 1F1B (PipeDream-Flush).
    #[value(name = "1f1b")]
    OneFOneB,
}

impl Args {
    /// The flag combinations that cannot work, refused before anything starts.
    pub fn check(&self) -> Result<(), BoxError> {
        let fail = |msg: &str| Err(msg.into());
        if self.batch_size == 0 || self.epochs == 0 {
            return fail("--batch-size and --epochs must be positive");
        }
        let multi = self.strategy == Some(Strategy::MultiWorker);
        if multi && (self.split || self.r#virtual.is_some()) {
            return fail(
                "--strategy multi-worker runs each worker on one --device; it does not \
                 combine with --split or --virtual yet",
            );
        }
        let mirrored = self.strategy == Some(Strategy::Mirrored);
        if mirrored && (self.split || self.device.is_some()) {
            return fail(
                "--strategy mirrored puts the whole model on every logical GPU; it does not \
                 combine with --split or --device",
            );
        }
        if mirrored && self.pipeline.is_some() {
            return fail(
                "--pipeline pipelines a --split model; a mirrored one runs whole on every \
                 replica",
            );
        }
        if self.resume && self.checkpoint_dir.is_none() {
            return fail("--resume continues the run checkpointed in --checkpoint-dir; name it");
        }
        Ok(())
    }

    /// Whether this run trains (`fit`), rather than timing or profiling a few steps.
    pub fn trains(&self) -> bool {
        self.time_steps.is_none() && self.profile.is_none()
    }

    /// `--optimizer` with `--lr` (Keras' default learning rates without it).
    pub fn optimizer(&self) -> Result<Optimizer, BoxError> {
        let lr = self.lr;
        Ok(match self.optimizer.as_str() {
            "sgd" => Sgd::new(lr.unwrap_or(0.01)).into(),
            "momentum" => Sgd::new(lr.unwrap_or(0.01)).momentum(0.9).into(),
            "nesterov" => Sgd::new(lr.unwrap_or(0.01))
                .momentum(0.9)
                .nesterov(true)
                .into(),
            "adam" => Adam::new(lr.unwrap_or(1e-3)).into(),
            other => {
                return Err(format!(
                    "--optimizer {other}: expected sgd, momentum, nesterov or adam"
                )
                .into())
            }
        })
    }

    /// `--schedule` over `m` micro-batches, as the library's [`Pipeline`].
    pub fn pipeline_schedule(&self, m: usize) -> Pipeline {
        match self.schedule {
            PipelineSchedule::Gpipe => Pipeline::gpipe(m),
            PipelineSchedule::OneFOneB => Pipeline::one_f_one_b(m),
        }
    }
}

/// `cpu` → `/device:CPU:0`, `gpu:1` → `/device:GPU:1`; full names pass through.
pub fn device_name(spec: &str) -> Result<String, BoxError> {
    let s = spec.trim().to_ascii_lowercase();
    if s == "cpu" {
        return Ok("/device:CPU:0".into());
    }
    if s == "gpu" {
        return Ok("/device:GPU:0".into());
    }
    if let Some(rest) = s.strip_prefix("gpu:").or_else(|| s.strip_prefix("cpu:")) {
        let index: usize = rest
            .parse()
            .map_err(|_| format!("--device {spec}: expected cpu or gpu:N"))?;
        let kind = if s.starts_with("gpu") { "GPU" } else { "CPU" };
        return Ok(format!("/device:{kind}:{index}"));
    }
    Ok(spec.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_expand_to_tf_form() {
        assert_eq!(device_name("cpu").unwrap(), "/device:CPU:0");
        assert_eq!(device_name("GPU:1").unwrap(), "/device:GPU:1");
        assert_eq!(device_name("/device:GPU:0").unwrap(), "/device:GPU:0");
        assert!(device_name("gpu:x").is_err());
    }

    #[test]
    fn conflicting_flags_are_refused_before_anything_starts() {
        let args = |flags: &[&str]| Args::parse_from([&["fashion_mnist"], flags].concat());
        assert!(args(&[]).check().is_ok());
        assert!(args(&["--strategy", "mirrored", "--split"])
            .check()
            .is_err());
        assert!(args(&["--strategy", "multi-worker", "--virtual", "1,1"])
            .check()
            .is_err());
        assert!(args(&["--resume"]).check().is_err());
        assert!(args(&["--epochs", "0"]).check().is_err());
    }
}
