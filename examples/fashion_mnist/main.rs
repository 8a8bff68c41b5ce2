//! The TensorFlow GPU guide's Fashion-MNIST CNN, end to end, with `tf.config`'s device control:
//! list the GPUs, configure them (visibility, memory growth, virtual devices), build the
//! tutorial's `Sequential` model (or, `--model modern`, a modern CNN) — on one device, split
//! over three, mirrored, pipelined, or over several worker processes — compile it, `fit` it,
//! evaluate it on the test set, save it.
//!
//! ```text
//! cargo run --release --example fashion_mnist                  # the tutorial: 10 epochs
//! cargo run --release --example fashion_mnist -- --help        # one flag per scenario
//! cargo run --release --example fashion_mnist -- --epochs 1 --steps-per-epoch 5   # CI
//! cargo run --release --example fashion_mnist -- --model modern    # BatchNorm, AdamW, ...
//! ```
//!
//! README.md beside this file lists the flags, the output of a run, and the files beside this
//! one, which hold what the guide leaves out (flags, output folders, plotting, timing, MPI).

mod args;
mod data;
mod devices;
mod distributed;
mod models;
mod output;
mod plot;
mod timing;

use anygpu::data::Dataset;
use anygpu::distribute::MirroredStrategy;
use anygpu::nn::{Callback, Optimizer, Sequential};
use anygpu::{config, mixed_precision, DeviceKind, LogicalDevice, Tensor};
use clap::Parser;

use args::{Args, Strategy};
use distributed::Workers;
use output::Output;

/// Any error; the library's `anygpu::Error` travels in it unchanged to `exit_on_error`.
type BoxError = Box<dyn std::error::Error>;

fn main() {
    distributed::init_logger();
    // An error only this worker has would leave the others waiting: the library ends them all.
    distributed::exit_on_error(distributed::rank_from_env(), run(Args::parse()));
}

fn run(args: Args) -> Result<(), BoxError> {
    args.check()?;
    if args.dry_run {
        println!("{args:#?}");
        return Ok(());
    }
    if args.mixed_precision {
        mixed_precision::set_global_policy("mixed_float16")?;
    }
    let multi = args.strategy == Some(Strategy::MultiWorker);
    if multi {
        distributed::require()?;
    }
    if let Some(threads) = args.intra_op_threads {
        config::threading::set_intra_op_parallelism_threads(threads)?;
    }
    // Worker 0 alone prints the run and writes its files: where they go is checked now, not
    // after hours of training.
    let chief = distributed::is_chief();
    let mut out = match args.trains() {
        true => Some(Output::prepare(&args, chief)?),
        false => None,
    };

    // 1. tf.config: list the GPUs and configure them, before anything touches a device.
    let gpus = config::list_physical_devices(DeviceKind::Gpu);
    if chief {
        println!("Num GPUs Available: {}", gpus.len());
    }
    let layers_on_cpu = devices::set_visible(&args, &gpus, chief)?;
    devices::set_virtual_devices(&args)?;
    devices::set_memory_growth(&args)?;
    config::set_log_device_placement(args.log_placement);
    let logical_gpus = config::list_logical_devices("GPU")?;
    if chief {
        devices::print_gpus(gpus.len(), &logical_gpus);
    }
    let layer_devices = devices::for_layers(&args, &logical_gpus, layers_on_cpu)?;
    let workers = match multi {
        true => Some(distributed::start(&layer_devices, args.batch_size)?),
        false => None,
    };

    // 2. The data.
    let data = data::load(&args, workers.as_ref())?;
    let optimizer = args.optimizer(data.steps_per_epoch);

    // 3. The model, compiled: built inside the strategy's scope when there is one.
    let mut model = match &workers {
        Some(workers) => multi_worker(workers, &args, &layer_devices, optimizer.clone())?,
        None if args.strategy == Some(Strategy::Mirrored) => mirrored(&args, optimizer.clone())?,
        // One device, or the three blocks on three devices (--split).
        None => models::build(&args, &layer_devices, optimizer.clone())?,
    };
    if chief {
        model.print_summary();
        // What compile made of it (wrapped in loss scaling under mixed_float16).
        println!("optimizer: {}", model.optimizer().unwrap_or(&optimizer));
    }
    if let Some(micro_batches) = args.pipeline {
        pipeline(&mut model, micro_batches, &args)?;
    }
    if args.log_placement {
        log_placement_of_one_step(&mut model, &data.train)?;
    }

    // --time-steps N, --profile DIR: a few timed steps instead of training.
    let Some(out) = out.as_mut() else {
        return timing::time_steps(&mut model, &data.train, &args, workers.as_ref());
    };

    // 4. Train, with Keras' callbacks: BackupAndRestore, CSVLogger, TensorBoard (and the
    // modern model's EarlyStopping).
    out.announce();
    let steps = data.steps_per_epoch;
    let mut early = models::early_stopping(&args);
    let mut callbacks = out.callbacks();
    callbacks.extend(early.as_mut().map(|e| e as &mut dyn Callback));
    let fitted = model.fit_with_callbacks(
        &data.train,
        args.epochs(),
        Some(steps),
        Some(&data.valid),
        &mut callbacks,
    );
    // The finished epochs are kept; the error goes on as it came.
    fitted.map_err(|e| out.fit_failed(&model, steps, e))?;

    // 5. Evaluate on the test set, and save the trained model.
    let test = model.evaluate(&data.test, None)?;
    if !chief {
        let rank = distributed::rank_from_env();
        println!(
            "{}done: test_accuracy {:.4}, {:.0} global images/s in fit",
            distributed::tag(rank),
            test.accuracy.unwrap_or(f64::NAN),
            output::mean_ips(model.history())
        );
        return Ok(());
    }
    match test.accuracy {
        Some(a) => println!("test_loss: {:.4} - test_accuracy: {a:.4}", test.loss),
        None => println!("test_loss: {:.4}", test.loss),
    }
    out.save(&model, &test, steps)?;
    timing::print_stages(&model);
    timing::print_memory(&logical_gpus);
    Ok(())
}

/// `tf.distribute.MirroredStrategy`: the whole model on every logical GPU (CPU:0 without
/// one), each batch split among them.
fn mirrored(args: &Args, optimizer: Optimizer) -> Result<Sequential, BoxError> {
    let strategy = MirroredStrategy::new()?;
    println!("Number of devices: {}", strategy.num_replicas_in_sync());
    let sizes = strategy.replica_batch_sizes(args.batch_size);
    for (d, n) in strategy.devices().iter().zip(&sizes) {
        let (name, adapter) = (d.name(), devices::adapter(d));
        println!("  replica {name} on {adapter}: {n} examples per batch");
    }
    Ok(strategy.scope(|| models::build(args, &[], optimizer))??)
}

/// `tf.distribute.MultiWorkerMirroredStrategy`: this worker's replica on `devices`, the
/// gradients summed with the other workers' every step.
fn multi_worker(
    workers: &Workers,
    args: &Args,
    devices: &[LogicalDevice],
    optimizer: Optimizer,
) -> Result<Sequential, BoxError> {
    Ok(workers.scope(|| models::build(args, devices, optimizer))??)
}

/// `--pipeline M`: each batch flows through the `--split` model's stages (one thread per
/// device) in `M` micro-batches, in `--schedule`'s order.
fn pipeline(model: &mut Sequential, micro_batches: usize, args: &Args) -> Result<(), BoxError> {
    model.set_pipeline(args.pipeline_schedule(micro_batches))?;
    let schedule = args.schedule;
    println!("pipeline: {schedule:?}, {micro_batches} micro-batches per batch");
    Ok(())
}

/// `tf.debugging.set_log_device_placement(True)` for one forward/backward pass (no update),
/// then quiet for training.
fn log_placement_of_one_step(model: &mut Sequential, train: &Dataset) -> Result<(), BoxError> {
    let devices = model.devices();
    let batch = train.iter().next().ok_or("the training set is empty")?;
    let x = Tensor::from_slice_on(&batch.x, &batch.x_shape, &devices[0])?;
    let y = Tensor::from_slice_on(&batch.y, &[batch.y.len()], &devices[devices.len() - 1])?;
    model.loss_and_gradients(&x, &y)?;
    config::set_log_device_placement(false);
    println!("(placement logging off for the rest of the run)");
    Ok(())
}
