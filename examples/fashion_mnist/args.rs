//! The command line: every flag with its default, the checks on how they combine, and what
//! they name (the optimizer, a device).

use std::path::PathBuf;

use anygpu::nn::{Adam, AdamW, Optimizer, Pipeline, Sgd};
use clap::Parser;

use crate::models;
use crate::BoxError;

/// Train the TensorFlow GPU guide's Fashion-MNIST CNN (or a modern one: --model modern).
#[derive(Parser, Debug)]
#[command(version, about)]
pub struct Args {
    /// `tutorial`: the guide's CNN; `modern`: Conv-BN-ReLU blocks, strided convolutions,
    /// global average pooling, Dropout, AdamW with warm-up and cosine decay, EarlyStopping.
    #[arg(long, value_enum, default_value = "tutorial")]
    pub model: Model,
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
    /// `cpu` or `gpu:N`; default GPU:0 when a hardware GPU is visible, else CPU:0 (also when
    /// every GPU is a software adapter, whose kernels run slower than CPU:0's).
    #[arg(long)]
    pub device: Option<String>,
    /// Training epochs; default 10 (the tutorial's), 12 for --model modern (fewer when
    /// EarlyStopping stops it).
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Batch size.
    #[arg(long, default_value_t = 128)]
    pub batch_size: usize,
    /// Steps per epoch; default: the training images (55,000) divided by the batch size.
    #[arg(long)]
    pub steps_per_epoch: Option<usize>,
    /// `sgd` (the tutorial's default), `momentum` (SGD, momentum 0.9), `nesterov`, `adam`, or
    /// `adamw` (the modern model's default). The modern model's rate follows its schedule:
    /// a warm-up to --lr over the first tenth of the steps, then a cosine decay to 0.
    #[arg(long, value_enum)]
    pub optimizer: Option<OptimizerName>,
    /// Learning rate; default 0.01 for SGD, 0.001 for Adam (Keras' defaults), and the peak
    /// of the modern model's schedule: 0.003 for AdamW, 0.05 for SGD.
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
    /// Parse and check the flags, print them and exit, touching no device (how CI checks the
    /// commands shown in the docs: scripts/doc_commands.py).
    #[arg(long)]
    pub dry_run: bool,
}

/// The `--model` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Model {
    /// The TensorFlow guide's CNN (`nn::tutorial_cnn`).
    Tutorial,
    /// A small modern CNN (models.rs).
    Modern,
}

/// The `--optimizer` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimizerName {
    /// `SGD(lr)`.
    Sgd,
    /// `SGD(lr, momentum=0.9)`.
    Momentum,
    /// `SGD(lr, momentum=0.9, nesterov=True)`.
    Nesterov,
    /// `Adam(lr)`.
    Adam,
    /// `AdamW(lr)` (weight decay 0.004, Keras' default).
    Adamw,
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
        if self.batch_size == 0 || self.epochs() == 0 {
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

    /// `--epochs`, or the model's default.
    pub fn epochs(&self) -> usize {
        let default = match self.model {
            Model::Tutorial => 10,
            Model::Modern => 12,
        };
        self.epochs.unwrap_or(default)
    }

    /// `--optimizer` with `--lr` (Keras' default learning rates without it); for the modern
    /// model with its schedule over the run's `steps_per_epoch` × epochs.
    pub fn optimizer(&self, steps_per_epoch: usize) -> Optimizer {
        let modern = self.model == Model::Modern;
        let name = self.optimizer.unwrap_or(match modern {
            true => OptimizerName::Adamw,
            false => OptimizerName::Sgd,
        });
        let sgd_lr = if modern { 0.05 } else { 0.01 };
        let adam_lr = if modern { 3e-3 } else { 1e-3 };
        let lr = self.lr;
        let schedule = modern.then(|| {
            let steps = (steps_per_epoch * self.epochs()) as u64;
            models::cosine_decay(
                lr.unwrap_or(match name {
                    OptimizerName::Adam | OptimizerName::Adamw => adam_lr,
                    _ => sgd_lr,
                }),
                steps,
            )
        });
        // Each optimizer's own builder takes the schedule.
        macro_rules! scheduled {
            ($opt:expr) => {
                match schedule {
                    Some(s) => $opt.learning_rate_schedule(s).into(),
                    None => $opt.into(),
                }
            };
        }
        match name {
            OptimizerName::Sgd => scheduled!(Sgd::new(lr.unwrap_or(sgd_lr))),
            OptimizerName::Momentum => scheduled!(Sgd::new(lr.unwrap_or(sgd_lr)).momentum(0.9)),
            OptimizerName::Nesterov => {
                scheduled!(Sgd::new(lr.unwrap_or(sgd_lr)).momentum(0.9).nesterov(true))
            }
            OptimizerName::Adam => scheduled!(Adam::new(lr.unwrap_or(adam_lr))),
            OptimizerName::Adamw => scheduled!(AdamW::new(lr.unwrap_or(adam_lr))),
        }
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
