//! The TensorFlow GPU guide's Fashion-MNIST CNN, end to end, with `tf.config`'s device control:
//! list the GPUs, pick and configure them (visibility, memory growth, virtual GPUs), build the
//! tutorial's `Sequential` model — on one device or split over three — train it, evaluate it on
//! the test set, and write the learning curves.
//!
//! ```text
//! cargo run --release --example fashion_mnist -- [flags]
//!
//!   --device cpu|gpu:N        run every layer there (default: GPU:0; CPU:0 when there is
//!                             no GPU or only software adapters)
//!   --split                   conv blocks on GPU:0, the 128-filter block on GPU:1, the dense
//!                             layers on GPU:2 (wrapping when fewer GPUs exist)
//!   --virtual-cpus 1,1        cut CPU:0 into logical CPUs with these thread counts; --split
//!                             spreads the blocks over them
//!   --pipeline M              pipeline each batch through the --split stages in M
//!                             micro-batches (--schedule gpipe|1f1b, default gpipe)
//!   --strategy mirrored       tf.distribute.MirroredStrategy: the whole model on every logical
//!                             GPU, each batch split among them (CPU:0 when there is no GPU)
//!   --strategy multi-worker   tf.distribute.MultiWorkerMirroredStrategy over MPI (build with
//!                             --features mpi; start with mpirun -n N): one worker per process,
//!                             each on --device (default: GPU number local-rank, or CPU:0),
//!                             each global batch cut among the workers
//!   --intra-op-threads N      tf.config.threading.set_intra_op_parallelism_threads(N)
//!   --memory-growth           tf.config.experimental.set_memory_growth(gpu, True) on every GPU
//!   --visible 1,0             tf.config.set_visible_devices(gpus[1], gpus[0])
//!   --virtual 3072,3072       cut GPU:0 into logical GPUs of these MiB
//!   --log-placement           tf.debugging.set_log_device_placement(True) (model creation and
//!                             one forward/backward pass)
//!   --epochs 10 --batch-size 128 --steps-per-epoch 429
//!   --optimizer sgd|momentum|adam --lr 0.01 --seed 42
//!   --mixed-precision         keras.mixed_precision.set_global_policy("mixed_float16"): layers
//!                             compute in float16 where the device has it (float32 weights,
//!                             loss scaling); CPU:0 and llvmpipe compute in float32
//!   --time-steps N            time N training steps after a warm-up, print the median, exit
//!   --out DIR                 model.safetensors, history.json, history.csv (after every epoch)
//!                             and learning_curves.png; default a new ./runs/<timestamp>. An
//!                             existing, non-empty DIR needs --overwrite (or --resume)
//!   --overwrite               replace the files of an existing --out, and start afresh over a
//!                             checkpoint found in --checkpoint-dir
//!   --checkpoint-dir DIR      checkpoint the whole run after every epoch (weights, optimizer
//!                             state, data position, history: keras.callbacks.BackupAndRestore);
//!                             deleted once the trained model is saved. Under multi-worker
//!                             only worker 0 reads and writes it; the others resume from what
//!                             it sends
//!   --resume                  continue the run checkpointed in --checkpoint-dir
//!   --tensorboard DIR         TensorBoard logs (keras.callbacks.TensorBoard: per-epoch
//!                             curves, the running loss every 50 steps, weight histograms);
//!                             default <out>/tensorboard. View: tensorboard --logdir DIR
//! ```
//!
//! `--out` is checked for writing before anything trains, and a run never silently replaces an
//! earlier one. When training fails, `history.json` still gets the epochs that finished, and a
//! killed run with `--checkpoint-dir` continues where its last epoch ended with `--resume`:
//!
//! ```text
//! cargo run --release --example fashion_mnist -- --epochs 10 --checkpoint-dir ckpt --out runs/a
//! # ... killed in epoch 7
//! cargo run --release --example fashion_mnist -- --epochs 10 --checkpoint-dir ckpt --out runs/a --resume
//! ```
//!
//! Short CI run: `cargo run --release --example fashion_mnist -- --epochs 1 --steps-per-epoch 5`.
//!
//! Output captured on a 2-core VM whose GPUs are Mesa's software adapters (lavapipe, llvmpipe),
//! training on CPU:0 (`--device cpu --optimizer adam --lr 0.001 --epochs 1`):
//!
//! ```text
//! Num GPUs Available: 2
//! 2 Physical GPUs, 2 Logical GPUs
//!   /device:GPU:0 on llvmpipe (LLVM 15.0.6, 256 bits), Vulkan
//!   /device:GPU:1 on llvmpipe (LLVM 15.0.6, 256 bits), Gl
//! Model: "sequential"
//! _______________________________________________________________________________________
//!  Layer (type)                           Output Shape         Param #   Device
//! =======================================================================================
//!  conv2d (Conv2D)                        (None, 28, 28, 32)   320       /device:CPU:0
//!  separable_conv2d (SeparableConv2D)     (None, 28, 28, 32)   1344      /device:CPU:0
//!  max_pooling2d (MaxPooling2D)           (None, 14, 14, 32)   0         /device:CPU:0
//!  separable_conv2d_1 (SeparableConv2D)   (None, 14, 14, 64)   2400      /device:CPU:0
//!  separable_conv2d_2 (SeparableConv2D)   (None, 14, 14, 64)   4736      /device:CPU:0
//!  max_pooling2d_1 (MaxPooling2D)         (None, 7, 7, 64)     0         /device:CPU:0
//!  separable_conv2d_3 (SeparableConv2D)   (None, 7, 7, 128)    8896      /device:CPU:0
//!  separable_conv2d_4 (SeparableConv2D)   (None, 7, 7, 128)    17664     /device:CPU:0
//!  max_pooling2d_2 (MaxPooling2D)         (None, 3, 3, 128)    0         /device:CPU:0
//!  flatten (Flatten)                      (None, 1152)         0         /device:CPU:0
//!  dense (Dense)                          (None, 128)          147584    /device:CPU:0
//!  dense_1 (Dense)                        (None, 10)           1290      /device:CPU:0
//! =======================================================================================
//! Total params: 184,234
//! Trainable params: 184,234
//! Non-trainable params: 0
//! _______________________________________________________________________________________
//! optimizer: Adam(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=0.0000001)
//! Epoch 1/1
//! 429/429 - 34s - 78ms/step - accuracy: 0.7465 - loss: 0.6995 - val_accuracy: 0.8448 - val_loss: 0.4182
//! test_loss: 0.4134 - test_accuracy: 0.8498
//! wrote runs/20261202-145512/model.safetensors, history.json and learning_curves.png
//! memory: /device:GPU:0 reserved 1.5 GiB, in use 0 B, peak 0 B
//! memory: /device:GPU:1 reserved 1.0 GiB, in use 0 B, peak 0 B
//! memory: host peak RSS 1522784 kB
//! ```
//!
//! Two workers on this machine (feature `mpi`, Open MPI; the README shows several machines):
//!
//! ```text
//! cargo build --release --features mpi --example fashion_mnist
//! mpirun -n 2 target/release/examples/fashion_mnist --strategy multi-worker --epochs 1
//! ```
//!
//! Every worker prints its devices and its share of the global batch (`[worker k]` before
//! the lines of workers other than 0); worker 0 alone prints the progress and writes the files.
//!
//! With `--strategy mirrored --virtual 512,512` the model is mirrored on two logical GPUs cut
//! from GPU:0 and each takes half of every batch; with `WGPU_BACKEND=vulkan,gl` and no
//! `--virtual`, on lavapipe and llvmpipe side by side.
//!
//! The GPUs reserve their whole budget at start (TensorFlow's default); `--memory-growth`
//! reserves as needed instead. With `--virtual 512,512,512 --split`, the three blocks train on
//! three logical GPUs cut from GPU:0, and the memory lines show each one's share.
//!
//! With `--virtual-cpus 1,1 --split --pipeline 8` the blocks go to two logical CPUs with one
//! thread each (the dense layers back on the first: three stages), and each batch flows
//! through them in 8 micro-batches; `--time-steps` then prints each stage's busy and waiting
//! time, and `--log-placement` tags every op with its stage and micro-batch.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anygpu::config;
use anygpu::data::{fashion_mnist, Dataset, StandardScaler};
use anygpu::distribute::MirroredStrategy;
use anygpu::mixed_precision;
use anygpu::nn::{
    self, Adam, BackupAndRestore, CsvLogger, Evaluation, History, Loss, Metric, Optimizer,
    Pipeline, Sequential, Sgd, TensorBoard,
};
use anygpu::{DeviceKind, LogicalDevice, LogicalDeviceConfiguration, StreamStats, Tensor};
use clap::Parser;
use serde::Serialize;

/// Train the TensorFlow GPU guide's Fashion-MNIST CNN.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Enable memory growth on every visible GPU.
    #[arg(long)]
    memory_growth: bool,
    /// Physical GPU indices to make visible, in order (e.g. `1,0`).
    #[arg(long, value_delimiter = ',')]
    visible: Option<Vec<usize>>,
    /// Cut the first visible GPU into logical GPUs of these MiB (e.g. `3072,3072`).
    #[arg(long, value_delimiter = ',')]
    r#virtual: Option<Vec<u64>>,
    /// Spread the model's three blocks over GPU:0, GPU:1 and GPU:2, as the tutorial does.
    #[arg(long)]
    split: bool,
    /// Cut CPU:0 into logical CPUs with these thread counts (e.g. `1,1`); --split then
    /// spreads the blocks over them.
    #[arg(long, value_delimiter = ',')]
    virtual_cpus: Option<Vec<usize>>,
    /// Pipeline each batch through the model's stages in M micro-batches.
    #[arg(long, value_name = "M")]
    pipeline: Option<usize>,
    /// The pipeline's schedule: `gpipe` (fill-drain) or `1f1b` (PipeDream-Flush: the same
    /// speed, fewer activations alive).
    #[arg(long, value_enum, default_value = "gpipe")]
    schedule: PipelineSchedule,
    /// `mirrored`: data parallelism over every logical GPU (tf.distribute.MirroredStrategy);
    /// `multi-worker`: over the processes `mpirun` starts (MultiWorkerMirroredStrategy).
    #[arg(long, value_enum)]
    strategy: Option<Strategy>,
    /// Threads of the CPU's kernels (tf.config.threading.set_intra_op_parallelism_threads).
    #[arg(long)]
    intra_op_threads: Option<usize>,
    /// Log where ops run while the model is created and for one forward/backward pass.
    #[arg(long)]
    log_placement: bool,
    /// `cpu` or `gpu:N`; default GPU:0 when a GPU is visible, else CPU:0.
    #[arg(long)]
    device: Option<String>,
    /// Training epochs.
    #[arg(long, default_value_t = 10)]
    epochs: usize,
    /// Batch size.
    #[arg(long, default_value_t = 128)]
    batch_size: usize,
    /// Steps per epoch; default: the training images (55,000) divided by the batch size.
    #[arg(long)]
    steps_per_epoch: Option<usize>,
    /// `sgd` (the tutorial's), `momentum` (SGD, momentum 0.9) or `adam`.
    #[arg(long, default_value = "sgd")]
    optimizer: String,
    /// Learning rate; default 0.01 for SGD, 0.001 for Adam (Keras' defaults).
    #[arg(long)]
    lr: Option<f32>,
    /// Seed of the weights and of the shuffling.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// `keras.mixed_precision.set_global_policy("mixed_float16")`: layers compute in float16
    /// on devices that have it, with float32 weights and dynamic loss scaling.
    #[arg(long)]
    mixed_precision: bool,
    /// Time this many training steps after a warm-up, print the median, and exit.
    #[arg(long)]
    time_steps: Option<usize>,
    /// Profile a few training steps after warm-up (after the timed ones, with --time-steps):
    /// writes DIR/trace.json (open it in ui.perfetto.dev) and DIR/top_ops.txt, prints the table.
    #[arg(long, value_name = "DIR")]
    profile: Option<PathBuf>,
    /// Output directory; default a new ./runs/<timestamp>. An existing, non-empty directory
    /// needs --overwrite (or --resume).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Replace the files of an existing --out; start afresh over a checkpoint found in
    /// --checkpoint-dir.
    #[arg(long)]
    overwrite: bool,
    /// Checkpoint the whole run into DIR after every epoch (keras.callbacks.BackupAndRestore);
    /// the checkpoint is deleted once the trained model is saved.
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Continue the run checkpointed in --checkpoint-dir.
    #[arg(long)]
    resume: bool,
    /// TensorBoard logs (keras.callbacks.TensorBoard) in DIR; default <out>/tensorboard.
    #[arg(long, value_name = "DIR")]
    tensorboard: Option<PathBuf>,
}

/// Training steps between the running losses logged for TensorBoard: a few points per epoch
/// of the default 429 steps, each read costing one wait for the device.
const TENSORBOARD_UPDATE_FREQ: u64 = 50;

/// The `--strategy` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Strategy {
    /// `tf.distribute.MirroredStrategy`.
    Mirrored,
    /// `tf.distribute.MultiWorkerMirroredStrategy` (feature `mpi`).
    MultiWorker,
}

/// The `--schedule` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum PipelineSchedule {
    /// GPipe's fill-drain.
    Gpipe,
    /// 1F1B (PipeDream-Flush).
    #[value(name = "1f1b")]
    OneFOneB,
}

#[derive(Serialize)]
struct EpochLog {
    epoch: usize,
    loss: f64,
    accuracy: Option<f64>,
    val_loss: Option<f64>,
    val_accuracy: Option<f64>,
    seconds: f64,
    images_per_second: f64,
}

#[derive(Serialize)]
struct HistoryJson {
    epochs: Vec<EpochLog>,
    loss: Vec<f64>,
    accuracy: Vec<f64>,
    val_loss: Vec<f64>,
    val_accuracy: Vec<f64>,
    /// `None` when training failed before the test.
    test_loss: Option<f64>,
    test_accuracy: Option<f64>,
    images_per_second: f64,
    devices: Vec<String>,
    adapters: Vec<String>,
    layer_devices: Vec<(String, String)>,
    /// The replicas under `--strategy mirrored` (empty otherwise).
    replicas: Vec<String>,
    optimizer: String,
    batch_size: usize,
    steps_per_epoch: usize,
    params: usize,
    seed: u64,
    /// The global dtype policy: `float32` or `mixed_float16`.
    policy: String,
    /// Optimizer steps applied (steps that loss scaling skipped are not counted).
    iterations: u64,
    /// The loss scale at the end, under mixed precision.
    loss_scale: Option<f32>,
}

fn main() {
    let mut logger =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"));
    let rank = workers::rank_from_env();
    if rank > 0 {
        use std::io::Write;
        logger.format(move |buf, record| {
            let (level, target) = (record.level(), record.target());
            writeln!(buf, "[worker {rank}] [{level} {target}] {}", record.args())
        });
    }
    logger.init();
    // An error only this worker has would leave the others waiting: the library ends them all.
    workers::exit_on_error(rank, run(Args::parse()));
}

type BoxError = Box<dyn std::error::Error>;

fn run(args: Args) -> Result<(), BoxError> {
    if args.batch_size == 0 || args.epochs == 0 {
        return Err("--batch-size and --epochs must be positive".into());
    }
    let optimizer = optimizer(&args)?;
    if args.mixed_precision {
        mixed_precision::set_global_policy("mixed_float16")?;
    }
    let mirrored = args.strategy == Some(Strategy::Mirrored);
    let multi = args.strategy == Some(Strategy::MultiWorker);
    if multi {
        workers::require()?;
    }
    if multi && (args.split || args.r#virtual.is_some()) {
        return Err(
            "--strategy multi-worker runs each worker on one --device; it does not \
                    combine with --split or --virtual yet"
                .into(),
        );
    }
    if let Some(threads) = args.intra_op_threads {
        config::threading::set_intra_op_parallelism_threads(threads)?;
    }
    if mirrored && (args.split || args.device.is_some()) {
        return Err(
            "--strategy mirrored puts the whole model on every logical GPU; it does not combine \
             with --split or --device"
                .into(),
        );
    }
    if mirrored && args.pipeline.is_some() {
        return Err(
            "--pipeline pipelines a --split model; a mirrored one runs whole on every \
                    replica"
                .into(),
        );
    }
    let trains = args.time_steps.is_none() && args.profile.is_none();
    if args.resume && args.checkpoint_dir.is_none() {
        return Err("--resume continues the run checkpointed in --checkpoint-dir; name it".into());
    }
    // Only worker 0 writes; the others get a directory name they never create.
    let chief = workers::rank_from_env() == 0;
    // Where the checkpoints and results go, checked before anything trains. Under
    // multi-worker only the chief reads and writes the checkpoint directory (the others resume
    // from the checkpoint the chief sends them, so it need not be on a shared filesystem).
    let mut backup = match &args.checkpoint_dir {
        // Deleted by hand once the trained model is saved, not when fit ends.
        Some(dir) if trains && chief => {
            Some(prepare_checkpoint(dir, &args)?.delete_checkpoint(false))
        }
        Some(dir) if trains => Some(BackupAndRestore::new(dir)),
        _ => None,
    };
    let out = match (trains, chief) {
        (true, true) => Some(prepare_out_dir(&args)?),
        (true, false) => Some(PathBuf::from("runs/(worker 0 writes)")),
        (false, _) => None,
    };

    // tf.config, before anything touches a device.
    let physical = config::list_physical_devices(DeviceKind::Gpu);
    // Workers other than 0 print only their own part (`workers::start`).
    if chief {
        println!("Num GPUs Available: {}", physical.len());
    }
    if let Some(indices) = &args.visible {
        let picked = indices
            .iter()
            .map(|&i| {
                physical.get(i).cloned().ok_or_else(|| {
                    format!("--visible {i}: there are {} physical GPUs", physical.len())
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        config::set_visible_devices(&picked, DeviceKind::Gpu)?;
    }
    // Horovod's recipe: each worker on a machine sees only the GPU of its local rank, set
    // before anything starts a device, so that no worker reserves the others' GPUs.
    let pinned = multi && args.device.is_none() && args.visible.is_none() && !physical.is_empty();
    if pinned {
        let mine = physical[workers::local_rank() % physical.len()].clone();
        config::set_visible_devices(&[mine], DeviceKind::Gpu)?;
    }
    // Training on the CPU needs no GPU: hide them, so their memory is not reserved (TF's advice
    // too). With no --device and only software adapters (Mesa's llvmpipe, lavapipe: the CPU
    // rasterizing), CPU:0's native kernels are far faster, so the default goes there.
    let software_only = !physical.is_empty()
        && config::get_visible_devices(DeviceKind::Gpu)
            .iter()
            .all(|pd| {
                config::get_device_details(pd)
                    .ok()
                    .and_then(|d| d.gpu)
                    .is_some_and(|g| g.adapter_type == "Cpu")
            });
    let cpu_split = args.split && args.virtual_cpus.is_some();
    let layers_on_cpu = match args.device.as_deref() {
        _ if cpu_split => true,
        Some(spec) => device_name(spec)? == "/device:CPU:0",
        None => {
            let cpu_default = software_only && !args.split && !mirrored && args.r#virtual.is_none();
            if cpu_default && chief {
                println!(
                    "Every GPU is a software adapter: training on /device:CPU:0 \
                     (--device gpu:0 trains on the adapter anyway)"
                );
            }
            cpu_default
        }
    };
    if layers_on_cpu && (!args.split || cpu_split) && args.r#virtual.is_none() {
        config::set_visible_devices(&[], DeviceKind::Gpu)?;
    }
    if let Some(threads) = &args.virtual_cpus {
        let cpu = config::list_physical_devices(DeviceKind::Cpu)
            .first()
            .cloned()
            .ok_or("--virtual-cpus: no CPU listed")?;
        let configs: Vec<_> = threads
            .iter()
            .map(|&n| LogicalDeviceConfiguration::new().threads(n))
            .collect();
        config::set_logical_device_configuration(&cpu, &configs)?;
    }
    let visible = config::get_visible_devices(DeviceKind::Gpu);
    if let Some(mibs) = &args.r#virtual {
        let first = visible
            .first()
            .ok_or("--virtual: there is no visible GPU to cut into logical GPUs")?;
        let configs: Vec<_> = mibs
            .iter()
            .map(|&m| LogicalDeviceConfiguration::new().memory_limit(m))
            .collect();
        config::set_logical_device_configuration(first, &configs)?;
    }
    if args.memory_growth {
        for (i, gpu) in visible.iter().enumerate() {
            // A GPU cut into virtual devices cannot grow (TensorFlow's rule).
            if !(i == 0 && args.r#virtual.is_some()) {
                config::set_memory_growth(gpu, true)?;
            }
        }
    }
    config::set_log_device_placement(args.log_placement);
    let logical = config::list_logical_devices("GPU")?;
    // As the guide prints it: every physical GPU, and the logical ones the visible GPUs became
    // (hidden GPUs count as physical only: "2 Physical GPUs, 1 Logical GPU" after --visible 0).
    if chief {
        println!(
            "{} Physical GPUs, {} Logical GPUs",
            physical.len(),
            logical.len()
        );
        for d in &logical {
            println!("  {} on {}", d.name(), adapter(d));
        }
    }

    // Where the layers go.
    let devices: Vec<LogicalDevice> = if cpu_split {
        let cpus = config::list_logical_devices("CPU")?;
        (0..3).map(|i| cpus[i % cpus.len()].clone()).collect()
    } else if args.split {
        if logical.is_empty() {
            println!("--split: no GPU visible; every block on /device:CPU:0");
            vec![config::runtime().cpu()?]
        } else {
            (0..3).map(|i| logical[i % logical.len()].clone()).collect()
        }
    } else {
        match args.device.as_deref() {
            None if layers_on_cpu => vec![config::runtime().cpu()?],
            // Horovod's rule: the workers on one machine take one GPU each, by local rank
            // (the only one visible, `pinned` above).
            None if multi && !logical.is_empty() => vec![logical[0].clone()],
            None => vec![config::runtime().default_device()?],
            Some(spec) => vec![config::runtime().device(&device_name(spec)?)?],
        }
    };
    let multi_worker = match multi {
        true => Some(workers::start(&devices, args.batch_size)?),
        false => None,
    };

    // The data, as the tutorial prepares it.
    let data = match &multi_worker {
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
    let train_len = train.len();
    let train_ds = Dataset::from_tensor_slices(x_train, &image, train.labels_i32())?
        .shuffle(train_len, args.seed)
        .repeat(None)
        .batch(args.batch_size, false)
        .prefetch(1);
    let valid_ds = Dataset::from_tensor_slices(x_valid, &image, valid.labels_i32())?
        .batch(args.batch_size, false);
    let test_ds = Dataset::from_tensor_slices(x_test, &image, data.test().labels_i32())?
        .batch(args.batch_size, false);
    let steps_per_epoch = args
        .steps_per_epoch
        .unwrap_or((train_len / args.batch_size).max(1));

    // The model: built and compiled inside the strategy's scope when there is one.
    let strategy = match mirrored {
        true => Some(MirroredStrategy::new()?),
        false => None,
    };
    let build = || -> anygpu::Result<Sequential> {
        let mut model = nn::tutorial_cnn(args.seed, if mirrored { &[] } else { &devices })?;
        model.compile(
            Loss::sparse_categorical_crossentropy(),
            optimizer.clone(),
            &[Metric::Accuracy],
        )?;
        Ok(model)
    };
    let mut model = match &strategy {
        Some(strategy) => {
            println!("Number of devices: {}", strategy.num_replicas_in_sync());
            let sizes = strategy.replica_batch_sizes(args.batch_size);
            for (d, n) in strategy.devices().iter().zip(&sizes) {
                println!(
                    "  replica {} on {}: {n} examples per batch",
                    d.name(),
                    adapter(d)
                );
            }
            strategy.scope(build)??
        }
        None => match &multi_worker {
            Some(w) => w.scope(build)??,
            None => build()?,
        },
    };
    // What compile made of it (wrapped in loss scaling under mixed_float16).
    let optimizer = model.optimizer().cloned().unwrap_or(optimizer);
    let devices = model.devices();
    if chief {
        model.print_summary();
        println!("optimizer: {optimizer}");
    }
    if let Some(m) = args.pipeline {
        model.set_pipeline(match args.schedule {
            PipelineSchedule::Gpipe => Pipeline::gpipe(m),
            PipelineSchedule::OneFOneB => Pipeline::one_f_one_b(m),
        })?;
        println!("pipeline: {:?}, {m} micro-batches per batch", args.schedule);
    }

    if args.log_placement {
        // One forward/backward pass with the log on (no update), then quiet for training.
        let batch = train_ds.iter().next().ok_or("the training set is empty")?;
        let x = Tensor::from_slice_on(&batch.x, &batch.x_shape, &devices[0])?;
        let y = Tensor::from_slice_on(&batch.y, &[batch.y.len()], &devices[devices.len() - 1])?;
        model.loss_and_gradients(&x, &y)?;
        config::set_log_device_placement(false);
        println!("(placement logging off for the rest of the run)");
    }

    if args.time_steps.is_some() || args.profile.is_some() {
        let n = args.time_steps.unwrap_or(0);
        return time_steps(
            &mut model,
            &train_ds,
            n,
            args.batch_size,
            args.profile.as_deref(),
            multi_worker.as_ref(),
        );
    }

    let out = out.ok_or("no output directory")?;
    let run = RunInfo {
        args: &args,
        optimizer,
        steps_per_epoch,
    };
    if let (true, true, Some(dir)) = (chief, args.resume, &args.checkpoint_dir) {
        println!("resuming the run checkpointed in {}", dir.display());
    }
    let mut csv = CsvLogger::new(out.join("history.csv"));
    let log_dir = args
        .tensorboard
        .clone()
        .unwrap_or_else(|| out.join("tensorboard"));
    let mut tensorboard = TensorBoard::new(&log_dir)
        .update_freq(TENSORBOARD_UPDATE_FREQ)
        .histogram_freq(1);
    if chief {
        println!(
            "TensorBoard logs in {0} (view: tensorboard --logdir {0})",
            log_dir.display()
        );
    }
    let fitted = match backup.as_mut() {
        Some(backup) => model.fit_with_callbacks(
            &train_ds,
            args.epochs,
            Some(steps_per_epoch),
            Some(&valid_ds),
            &mut [backup, &mut csv, &mut tensorboard],
        ),
        None => model.fit_with_callbacks(
            &train_ds,
            args.epochs,
            Some(steps_per_epoch),
            Some(&valid_ds),
            &mut [&mut csv, &mut tensorboard],
        ),
    };
    let history = match fitted {
        Ok(history) => history,
        Err(e) => {
            // Keep what finished: the epochs before the failure.
            let partial = model.history().clone();
            let json = run.history_json(&model, &partial, None);
            let json_path = out.join("history.json");
            write_json(&json_path, &json)?;
            return Err(format!(
                "{e}\n(the {} finished epoch(s) are in {}{})",
                partial.epochs(),
                json_path.display(),
                match &args.checkpoint_dir {
                    Some(dir) => format!(
                        "; continue with --resume --checkpoint-dir {}",
                        dir.display()
                    ),
                    None => String::new(),
                }
            )
            .into());
        }
    };
    let test = model.evaluate(&test_ds, None)?;
    if !chief {
        let mean_ips =
            history.images_per_second.iter().sum::<f64>() / history.epochs().max(1) as f64;
        println!(
            "{}done: test_accuracy {:.4}, {mean_ips:.0} global images/s in fit",
            workers::tag(workers::rank_from_env()),
            test.accuracy.unwrap_or(f64::NAN)
        );
        return Ok(());
    }
    match test.accuracy {
        Some(a) => println!("test_loss: {:.4} - test_accuracy: {a:.4}", test.loss),
        None => println!("test_loss: {:.4}", test.loss),
    }

    // The trained model, history.json and the learning curves.
    let weights_path = out.join("model.safetensors");
    model.save_weights(&weights_path)?;
    let mean_ips = history.images_per_second.iter().sum::<f64>() / history.epochs().max(1) as f64;
    println!("throughput: {mean_ips:.0} images/s in fit");
    let json_path = out.join("history.json");
    write_json(&json_path, &run.history_json(&model, &history, Some(&test)))?;
    // The run's only copy until now: the checkpoint goes once the model and its history are
    // safely on disk (a failed evaluation or save can still be resumed).
    if let Some(backup) = &backup {
        if backup.has_checkpoint() {
            std::fs::remove_file(backup.checkpoint_path())?;
        }
    }
    let png_path = out.join("learning_curves.png");
    match plot::learning_curves(&png_path, &history) {
        Ok(()) => println!(
            "wrote {}, history.json and learning_curves.png",
            weights_path.display()
        ),
        Err(e) => {
            println!("wrote {} and history.json", weights_path.display());
            eprintln!("warning: no learning-curve chart: {e}");
        }
    }
    print_stages(&model);
    print_memory(&logical);
    Ok(())
}

/// `llvmpipe (LLVM 15.0.6, 256 bits), Vulkan`: the adapter and its backend (Mesa names its
/// Vulkan and GL software drivers alike).
fn adapter(d: &LogicalDevice) -> String {
    match d.backend() {
        Some(b) => format!("{}, {b:?}", d.adapter_name()),
        None => d.adapter_name().to_string(),
    }
}

/// `cpu` → `/device:CPU:0`, `gpu:1` → `/device:GPU:1`; full names pass through.
fn device_name(spec: &str) -> Result<String, BoxError> {
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

fn optimizer(args: &Args) -> Result<Optimizer, BoxError> {
    Ok(match args.optimizer.as_str() {
        "sgd" => Sgd::new(args.lr.unwrap_or(0.01)).into(),
        "momentum" => Sgd::new(args.lr.unwrap_or(0.01)).momentum(0.9).into(),
        "nesterov" => Sgd::new(args.lr.unwrap_or(0.01))
            .momentum(0.9)
            .nesterov(true)
            .into(),
        "adam" => Adam::new(args.lr.unwrap_or(1e-3)).into(),
        other => {
            return Err(
                format!("--optimizer {other}: expected sgd, momentum, nesterov or adam").into(),
            )
        }
    })
}

/// Times `n` full training steps (forward, backward, update, synchronized) after 3 warm-up
/// steps, and prints the median.
fn time_steps(
    model: &mut Sequential,
    train: &Dataset,
    n: usize,
    batch: usize,
    profile: Option<&std::path::Path>,
    multi_worker: Option<&workers::Workers>,
) -> Result<(), BoxError> {
    let devices = model.devices();
    // A mirrored model takes each batch from the host and splits it; elsewhere the batch goes
    // to the first layer's device and the labels to the last's.
    let host = config::runtime().cpu()?;
    let (first, last) = match model.strategy() {
        Some(_) => (&host, &host),
        None => (&devices[0], &devices[devices.len() - 1]),
    };
    let mut batches = train.iter();
    let stats = |devices: &[LogicalDevice]| -> StreamStats {
        devices
            .iter()
            .filter_map(LogicalDevice::stream_stats)
            .fold(StreamStats::default(), |a, b| a + b)
    };
    // One step's wall time, the host time until `train_step` returned (recording; a device that
    // runs ops on the host counts them here too), and the stream counters it moved.
    let mut step = |model: &mut Sequential| -> Result<(f64, f64, StreamStats), BoxError> {
        let b = batches.next().ok_or("the training set is empty")?;
        let x = Tensor::from_slice_on(&b.x, &b.x_shape, first)?;
        let y = Tensor::from_slice_on(&b.y, &[b.y.len()], last)?;
        let before = stats(&devices);
        let start = Instant::now();
        model.train_step(&x, &y)?;
        let host = start.elapsed().as_secs_f64() * 1e3;
        model.synchronize()?;
        let wall = start.elapsed().as_secs_f64() * 1e3;
        Ok((wall, host, stats(&devices) - before))
    };
    let warmup = (0..3)
        .map(|_| step(model).map(|s| format!("{:.1}", s.0)))
        .collect::<Result<Vec<_>, _>>()?;
    println!(
        "{}warm-up steps: {} ms (the first compiles the kernels and, with ANYGPU_AUTOTUNE on and no cache, tunes them)",
        workers::tag(multi_worker.map_or(0, workers::rank)),
        warmup.join(", ")
    );
    if n > 0 {
        let reduce_before = multi_worker.map(workers::all_reduce_ms);
        for d in &devices {
            config::reset_memory_stats(d.name())?;
        }
        let steps = (0..n).map(|_| step(model)).collect::<Result<Vec<_>, _>>()?;
        for d in devices
            .iter()
            .filter(|d| d.device_type() == DeviceKind::Gpu)
        {
            let peak = config::get_memory_info(d.name())?.peak;
            println!(
                "peak memory of a train step on {}: {} ({} bytes)",
                d.name(),
                anygpu::format_bytes(peak),
                peak
            );
        }
        if let (Some(w), Some(before)) = (multi_worker, reduce_before) {
            let after = workers::all_reduce_ms(w);
            println!(
                "{}all-reduce between workers: {:.2} ms per step, of which MPI_Allreduce {:.2} ms \
                 (737 KB of gradients; includes waiting for the slowest worker)",
                workers::tag(workers::rank(w)),
                (after.0 - before.0) / n as f64,
                (after.1 - before.1) / n as f64,
            );
        }
        let mut times: Vec<f64> = steps.iter().map(|s| s.0).collect();
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        let names: Vec<String> = devices
            .iter()
            .map(|d| format!("{} ({})", d.name(), adapter(d)))
            .collect();
        // Across workers `batch` is the global batch: the images/s are the job's.
        println!(
            "{}median train step: {median:.1} ms (batch {batch}, device {}; mean {mean:.1}, min {:.1}, max {:.1} over {} steps; {:.0} images/s)",
            workers::tag(multi_worker.map_or(0, workers::rank)),
            names.join(" + "),
            times[0],
            times[times.len() - 1],
            times.len(),
            batch as f64 * 1e3 / median
        );
        let count = steps.len() as f64;
        let host = steps.iter().map(|s| s.1).sum::<f64>() / count;
        let dispatches = steps.iter().map(|s| s.2.dispatches).sum::<u64>() as f64 / count;
        if dispatches > 0.0 {
            let submits = steps.iter().map(|s| s.2.submits).sum::<u64>() as f64 / count;
            let record = steps.iter().map(|s| s.2.record_nanos).sum::<u64>() as f64 / count / 1e6;
            let hits = steps.iter().map(|s| s.2.bind_group_hits).sum::<u64>() as f64 / count;
            println!(
                "host per step: {host:.2} ms until train_step returned, of which {record:.2} ms recording {dispatches:.0} dispatches in {submits:.1} submissions ({:.1} us per dispatch, {:.0}% of bind groups cached)",
                record * 1e3 / dispatches,
                100.0 * hits / dispatches
            );
        }
    }
    print_tuning(&devices);
    print_stages(model);
    if let Some(dir) = profile {
        const PROFILED_STEPS: usize = 5;
        anygpu::profiler::start(dir)?;
        for i in 0..PROFILED_STEPS {
            let _span = anygpu::profiler::Trace::new(format!("train step {i}"));
            step(model)?;
        }
        let report = anygpu::profiler::stop()?;
        println!(
            "\nprofile of {PROFILED_STEPS} train steps (batch {batch}), written to {}:\n{report}",
            dir.display()
        );
    }
    Ok(())
}

/// Each pipeline stage's share of the last step (nothing without `--pipeline`).
fn print_stages(model: &Sequential) {
    for (i, s) in model.pipeline_stats().iter().enumerate() {
        println!(
            "pipeline stage {i}: layers {}-{} on {}, busy {:.1} ms, waiting {:.1} ms",
            s.layers.start,
            s.layers.end - 1,
            s.device,
            s.busy.as_secs_f64() * 1e3,
            s.waiting.as_secs_f64() * 1e3
        );
    }
}

/// The autotuner's kernel choices on each GPU (`ANYGPU_AUTOTUNE`).
fn print_tuning(devices: &[LogicalDevice]) {
    for d in devices {
        for t in d.tuning_decisions() {
            let times: Vec<String> = t
                .timings_ms
                .iter()
                .map(|(c, ms)| format!("{c} {ms:.3} ms"))
                .collect();
            println!(
                "autotune: {} {} [{}] -> {} ({:?}{}{})",
                d.name(),
                t.op,
                t.class,
                t.candidate,
                t.source,
                if times.is_empty() { "" } else { ": " },
                times.join(", ")
            );
        }
    }
}

fn print_memory(gpus: &[LogicalDevice]) {
    for d in gpus {
        match config::get_memory_stats(d.name()) {
            Ok(s) => println!(
                "memory: {} reserved {}, in use {}, peak {}",
                d.name(),
                anygpu::format_bytes(s.bytes_reserved),
                anygpu::format_bytes(s.bytes_in_use),
                anygpu::format_bytes(s.peak_bytes_in_use)
            ),
            Err(e) => println!("memory: {}: {e}", d.name()),
        }
    }
    // The host side (CPU:0 tensors, data, and software adapters' buffers): peak RSS on Linux.
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        if let Some(line) = status.lines().find(|l| l.starts_with("VmHWM:")) {
            let kb = line.trim_start_matches("VmHWM:").trim();
            println!("memory: host peak RSS {kb}");
        }
    }
}

/// `./runs/YYYYMMDD-HHMMSS` (UTC).
/// What history.json records besides the history.
struct RunInfo<'a> {
    args: &'a Args,
    optimizer: Optimizer,
    steps_per_epoch: usize,
}

impl RunInfo<'_> {
    fn history_json(
        &self,
        model: &Sequential,
        history: &History,
        test: Option<&Evaluation>,
    ) -> HistoryJson {
        let model_devices = model.devices();
        let epochs = (0..history.epochs())
            .map(|i| EpochLog {
                epoch: i + 1,
                loss: history.loss[i],
                accuracy: history.accuracy.get(i).copied(),
                val_loss: history.val_loss.get(i).copied(),
                val_accuracy: history.val_accuracy.get(i).copied(),
                seconds: history.epoch_seconds.get(i).copied().unwrap_or(0.0),
                images_per_second: history.images_per_second.get(i).copied().unwrap_or(0.0),
            })
            .collect();
        HistoryJson {
            epochs,
            loss: history.loss.clone(),
            accuracy: history.accuracy.clone(),
            val_loss: history.val_loss.clone(),
            val_accuracy: history.val_accuracy.clone(),
            test_loss: test.map(|t| t.loss),
            test_accuracy: test.and_then(|t| t.accuracy),
            images_per_second: history.images_per_second.iter().sum::<f64>()
                / history.epochs().max(1) as f64,
            devices: model_devices.iter().map(|d| d.name().to_string()).collect(),
            adapters: model_devices
                .iter()
                .map(|d| d.adapter_name().to_string())
                .collect(),
            layer_devices: model
                .layer_infos()
                .into_iter()
                .map(|l| (l.name, l.device))
                .collect(),
            replicas: model
                .strategy()
                .map(|s| s.devices().iter().map(|d| d.name().to_string()).collect())
                .unwrap_or_default(),
            optimizer: self.optimizer.to_string(),
            batch_size: self.args.batch_size,
            steps_per_epoch: self.steps_per_epoch,
            params: model.count_params(),
            seed: self.args.seed,
            policy: mixed_precision::global_policy().name().to_string(),
            iterations: model.iterations(),
            loss_scale: model.loss_scale(),
        }
    }
}

fn write_json(path: &Path, json: &HistoryJson) -> Result<(), BoxError> {
    std::fs::write(path, serde_json::to_string_pretty(json)?)
        .map_err(|e| format!("{}: {e}", path.display()).into())
}

/// The output directory, created and checked for writing before anything trains: `--out` (an
/// existing, non-empty one only with `--overwrite` or `--resume`), else a new
/// `runs/<timestamp>` that no earlier run has.
fn prepare_out_dir(args: &Args) -> Result<PathBuf, BoxError> {
    let dir = match &args.out {
        Some(dir) => {
            let non_empty = std::fs::read_dir(dir)
                .map(|mut entries| entries.next().is_some())
                .unwrap_or(false);
            if non_empty && !args.overwrite && !args.resume {
                return Err(format!(
                    "--out {}: the directory is not empty (an earlier run?); pass --overwrite to \
                     replace its files, or name another directory",
                    dir.display()
                )
                .into());
            }
            std::fs::create_dir_all(dir).map_err(|e| format!("--out {}: {e}", dir.display()))?;
            dir.clone()
        }
        None => new_run_dir(&default_out_dir())?,
    };
    // A file written and removed now, rather than an error after hours of training.
    let probe = dir.join(format!(".write-test-{}", std::process::id()));
    std::fs::write(&probe, b"ok")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| format!("--out {}: cannot write there: {e}", dir.display()))?;
    Ok(dir)
}

/// `base`, or `base-2`, `base-3`, ...: the first that did not exist, created here (so two runs
/// started in the same second get different directories).
fn new_run_dir(base: &Path) -> Result<PathBuf, BoxError> {
    if let Some(parent) = base.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let name = base
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    for n in 1..10_000 {
        let candidate = match n {
            1 => base.to_path_buf(),
            n => base.with_file_name(format!("{name}-{n}")),
        };
        match std::fs::create_dir(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("{}: {e}", candidate.display()).into()),
        }
    }
    Err(format!("{}: no free run directory name", base.display()).into())
}

/// The `--checkpoint-dir` callback. A checkpoint already there is resumed with `--resume`,
/// discarded with `--overwrite`, and otherwise an error: a new run never silently continues,
/// or silently replaces, an earlier one.
fn prepare_checkpoint(dir: &Path, args: &Args) -> Result<BackupAndRestore, BoxError> {
    let backup = BackupAndRestore::new(dir);
    match (backup.has_checkpoint(), args.resume, args.overwrite) {
        (true, false, false) => Err(format!(
            "--checkpoint-dir {}: it holds the checkpoint of an earlier run; pass --resume to \
             continue it, or --overwrite to start afresh",
            dir.display()
        )
        .into()),
        (true, false, true) => {
            let path = backup.checkpoint_path();
            std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(backup)
        }
        (false, true, _) => Err(format!(
            "--resume: there is no checkpoint in {} ({} is missing)",
            dir.display(),
            backup.checkpoint_path().display()
        )
        .into()),
        _ => {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("--checkpoint-dir {}: {e}", dir.display()))?;
            Ok(backup)
        }
    }
}

fn default_out_dir() -> PathBuf {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    Path::new("runs").join(format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    ))
}

mod plot {
    //! The learning curves: loss and accuracy per epoch, train and validation.

    use std::path::Path;

    use anygpu::nn::History;
    use plotters::prelude::*;
    use plotters::style::FontStyle;

    const TRAIN: RGBColor = RGBColor(31, 119, 180);
    const VALID: RGBColor = RGBColor(255, 127, 14);

    /// Registers a sans-serif TTF found on this machine; `false` when there is none (the chart
    /// is then drawn without text).
    fn register_font() -> bool {
        let candidates = [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
            "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
            "/System/Library/Fonts/Supplemental/Arial.ttf",
            "/Library/Fonts/Arial.ttf",
            "C:\\Windows\\Fonts\\arial.ttf",
        ];
        for path in candidates {
            if let Ok(bytes) = std::fs::read(path) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    }

    fn range(series: &[&[f64]], floor_zero: bool) -> (f64, f64) {
        let values = series
            .iter()
            .flat_map(|s| s.iter().copied())
            .filter(|v| v.is_finite());
        let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
        if !lo.is_finite() {
            return (0.0, 1.0);
        }
        let pad = ((hi - lo) * 0.1).max(1e-3);
        let lo = if floor_zero {
            (lo - pad).max(0.0)
        } else {
            lo - pad
        };
        (lo, hi + pad)
    }

    pub fn learning_curves(path: &Path, h: &History) -> Result<(), String> {
        let text = register_font();
        let root = BitMapBackend::new(path, (1200, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (left, right) = root.split_horizontally(600);
        let epochs = h.epochs().max(2) as f64;
        let panels = [
            (left, "loss", [&h.loss[..], &h.val_loss[..]]),
            (right, "accuracy", [&h.accuracy[..], &h.val_accuracy[..]]),
        ];
        for (area, title, [train, valid]) in panels {
            let (lo, hi) = range(&[train, valid], true);
            let mut builder = ChartBuilder::on(&area);
            builder.margin(20);
            if text {
                builder
                    .caption(title, ("sans-serif", 24))
                    .x_label_area_size(40)
                    .y_label_area_size(55);
            }
            let mut chart = builder
                .build_cartesian_2d(1.0..epochs, lo..hi)
                .map_err(|e| e.to_string())?;
            if text {
                let whole_epochs = |x: &f64| format!("{x:.0}");
                chart
                    .configure_mesh()
                    .x_labels(h.epochs().clamp(2, 12))
                    .x_label_formatter(&whole_epochs)
                    .x_desc("epoch")
                    .y_desc(title)
                    .draw()
                    .map_err(|e| e.to_string())?;
            } else {
                chart
                    .plotting_area()
                    .draw(&Rectangle::new(
                        [(1.0, lo), (epochs, hi)],
                        BLACK.stroke_width(1),
                    ))
                    .map_err(|e| e.to_string())?;
            }
            for (series, color, label) in [(train, TRAIN, "train"), (valid, VALID, "validation")] {
                if series.is_empty() {
                    continue;
                }
                let points: Vec<(f64, f64)> = series
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| ((i + 1) as f64, v))
                    .collect();
                let drawn = chart
                    .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                    .map_err(|e| e.to_string())?;
                if text {
                    drawn.label(label).legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                }
                chart
                    .draw_series(
                        points
                            .into_iter()
                            .map(|p| Circle::new(p, 3, color.filled())),
                    )
                    .map_err(|e| e.to_string())?;
            }
            if text {
                chart
                    .configure_series_labels()
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .draw()
                    .map_err(|e| e.to_string())?;
            }
        }
        root.present().map_err(|e| e.to_string())
    }
}

/// `--strategy multi-worker`: the MPI strategy with feature `mpi`, and without it a stand-in
/// that says how to build it.
mod workers {
    use super::BoxError;
    use anygpu::LogicalDevice;

    /// This process's MPI rank as the launcher exported it (Open MPI, MPICH/PMI, Slurm), for
    /// the log prefix before MPI starts; 0 outside a job.
    pub fn rank_from_env() -> usize {
        env_index(&[
            "OMPI_COMM_WORLD_RANK",
            "PMI_RANK",
            "PMIX_RANK",
            "SLURM_PROCID",
        ])
    }

    /// This process's index among the workers on its machine (Horovod's `local_rank`).
    pub fn local_rank() -> usize {
        env_index(&[
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "MPI_LOCALRANKID",
            "SLURM_LOCALID",
        ])
    }

    fn env_index(names: &[&str]) -> usize {
        names
            .iter()
            .find_map(|n| std::env::var(n).ok()?.parse().ok())
            .unwrap_or(0)
    }

    /// `[worker k] ` on workers other than 0.
    pub fn tag(rank: usize) -> String {
        match rank {
            0 => String::new(),
            k => format!("[worker {k}] "),
        }
    }

    #[cfg(feature = "mpi")]
    pub use with_mpi::*;

    #[cfg(feature = "mpi")]
    mod with_mpi {
        use super::*;
        use anygpu::distribute::MultiWorkerMirroredStrategy;

        pub type Workers = MultiWorkerMirroredStrategy;

        /// Starts the strategy over `devices` and prints this worker's part.
        pub fn start(devices: &[LogicalDevice], global: usize) -> Result<Workers, BoxError> {
            let strategy = MultiWorkerMirroredStrategy::with_devices(devices)?;
            let k = strategy.worker_index();
            if k == 0 {
                println!(
                    "MultiWorkerMirroredStrategy: {} workers, {} replicas in sync, global batch \
                     {global}",
                    strategy.num_workers(),
                    strategy.num_replicas_in_sync()
                );
            }
            let names: Vec<String> = strategy
                .local_devices()
                .iter()
                .map(|d| format!("{} ({})", d.name(), super::super::adapter(d)))
                .collect();
            println!(
                "{}worker {k}: devices {}, {} examples of each global batch of {global}",
                tag(k),
                names.join(", "),
                strategy.worker_batch_size(global)
            );
            Ok(strategy)
        }

        /// This build has MPI.
        pub fn require() -> Result<(), BoxError> {
            Ok(())
        }

        /// Exits with `result`'s error: an error only this worker has aborts every worker,
        /// one they agreed on (`Error::Distributed`) is every worker's and each exits by
        /// itself (the library's `exit_on_error`).
        pub fn exit_on_error(_rank: usize, result: Result<(), BoxError>) {
            MultiWorkerMirroredStrategy::exit_on_error(result)
        }

        pub fn rank(strategy: &Workers) -> usize {
            strategy.worker_index()
        }

        /// (whole reduction, MPI_Allreduce) in ms, summed over the steps so far.
        pub fn all_reduce_ms(strategy: &Workers) -> (f64, f64) {
            let t = strategy.all_reduce_times();
            (t.total.as_secs_f64() * 1e3, t.mpi.as_secs_f64() * 1e3)
        }
    }

    #[cfg(not(feature = "mpi"))]
    pub use without_mpi::*;

    #[cfg(not(feature = "mpi"))]
    mod without_mpi {
        use super::*;

        /// No workers in a build without MPI: nothing of this type exists.
        pub enum Workers {}

        impl Workers {
            pub fn agree<T>(&self, _: &str, _: anygpu::Result<T>) -> anygpu::Result<T> {
                match *self {}
            }
            pub fn scope<R>(&self, _: impl FnOnce() -> R) -> anygpu::Result<R> {
                match *self {}
            }
        }

        pub fn rank(w: &Workers) -> usize {
            match *w {}
        }

        pub fn all_reduce_ms(w: &Workers) -> (f64, f64) {
            match *w {}
        }

        pub fn start(_: &[LogicalDevice], _: usize) -> Result<Workers, BoxError> {
            Err(require().err().unwrap_or_else(|| "no MPI".into()))
        }

        /// Says how to get a build with MPI.
        pub fn require() -> Result<(), BoxError> {
            Err(
                "--strategy multi-worker needs MPI: build with `cargo build --release \
                 --features mpi --example fashion_mnist` (Open MPI and libclang installed), \
                 then start it with `mpirun -n 2 target/release/examples/fashion_mnist \
                 --strategy multi-worker`"
                    .into(),
            )
        }

        pub fn exit_on_error(rank: usize, result: Result<(), BoxError>) {
            if let Err(e) = result {
                eprintln!("{}error: {e}", tag(rank));
                std::process::exit(1);
            }
        }
    }
}
