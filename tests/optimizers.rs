//! RMSprop, weight decay and gradient clipping against the f64 oracle on CPU:0 and every GPU;
//! clipping under a MirroredStrategy (every replica clips the summed gradients alike);
//! schedules counting only applied steps; the learning-rate and early-stopping callbacks
//! inside `fit`.

mod common;

use common::{compiled, small_cnn};

use anygpu::data::Dataset;
use anygpu::distribute::MirroredStrategy;
use anygpu::nn::{
    Callback, EarlyStopping, ExponentialDecay, FitContext, LossScaleOptimizer, Optimizer,
    ReduceLROnPlateau, RmsProp, Sgd,
};
use anygpu::ops;
use anygpu::ops::reference::{self as r, assert_close, random_vec, to_f64};
use anygpu::ops::spec::{ClipMode, RmspropParams};
use anygpu::{KindFilter, LogicalDevice, Tensor};

/// Runs `f` with `self` as the default device.
trait ScopeRun {
    fn scope_run<R>(&self, f: impl FnOnce() -> R) -> R;
}

impl ScopeRun for LogicalDevice {
    fn scope_run<R>(&self, f: impl FnOnce() -> R) -> R {
        let _scope = self.scope();
        f()
    }
}

fn put(dev: &LogicalDevice, data: &[f32]) -> Tensor {
    Tensor::from_slice_on(data, &[data.len()], dev).expect("upload")
}

fn get(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().expect("readback")
}

/// A runtime (kept alive by the caller) and CPU:0 with every GPU.
fn devices() -> (anygpu::Runtime, Vec<LogicalDevice>) {
    common::gpus_at_least(1, "optimizers");
    let rt = common::builder().build().expect("a runtime");
    let devices = common::available(rt.list_logical_devices(KindFilter::All).expect("devices"));
    (rt, devices)
}

#[test]
fn rmsprop_decay_and_clipping_kernels_match_the_oracle_on_every_device() {
    let (_rt, devices) = devices();
    for dev in devices {
        let _s = dev.scope();
        for len in [1, 7, 300, 100_003] {
            let what = format!("{dev} len {len}");
            let w = random_vec(len, 1);
            let g = random_vec(len, 2);
            let v0: Vec<f32> = random_vec(len, 3).iter().map(|v| 0.01 * v.abs()).collect();
            let a0: Vec<f32> = random_vec(len, 4)
                .iter()
                .zip(&v0)
                .map(|(r, v)| r * v.sqrt())
                .collect();
            let m0: Vec<f32> = random_vec(len, 5).iter().map(|v| 0.01 * v).collect();
            let (w64, g64) = (to_f64(&w), to_f64(&g));
            let gt = put(&dev, &g);
            for (centered, momentum) in [(false, 0.0), (false, 0.9), (true, 0.0), (true, 0.5)] {
                let p = RmspropParams {
                    lr: 0.01,
                    rho: 0.9,
                    momentum,
                    epsilon: 1e-7,
                    centered,
                };
                let (wt, vt, at, mt) = (
                    put(&dev, &w),
                    put(&dev, &v0),
                    put(&dev, &a0),
                    put(&dev, &m0),
                );
                ops::rmsprop_update(
                    &wt,
                    &gt,
                    &vt,
                    centered.then_some(&at),
                    (momentum != 0.0).then_some(&mt),
                    &p,
                )
                .unwrap_or_else(|e| panic!("rmsprop {what}: {e}"));
                let (a64, m64) = (to_f64(&a0), to_f64(&m0));
                let (ew, ev, ea, em) = r::rmsprop(
                    &w64,
                    &g64,
                    &to_f64(&v0),
                    centered.then_some(&a64[..]),
                    (momentum != 0.0).then_some(&m64[..]),
                    &p,
                );
                let tag = format!("rmsprop centered={centered} momentum={momentum} {what}");
                assert_close(&get(&wt), &ew, 1e-5, &format!("{tag} w"));
                assert_close(&get(&vt), &ev, 1e-6, &format!("{tag} velocity"));
                if let Some(ea) = ea {
                    assert_close(&get(&at), &ea, 1e-6, &format!("{tag} average"));
                }
                if let Some(em) = em {
                    assert_close(&get(&mt), &em, 1e-5, &format!("{tag} momentum"));
                }
            }

            let wt = put(&dev, &w);
            ops::weight_decay_update(&wt, 0.004, 0.01).expect("weight decay");
            assert_close(
                &get(&wt),
                &r::weight_decay(&w64, 0.004, 0.01),
                1e-7,
                &format!("decay {what}"),
            );

            let sum_squares: f64 = g64.iter().map(|g| g * g).sum();
            let st = Tensor::from_slice_on(&[sum_squares as f32], &[1], &dev).expect("upload");
            let zero = Tensor::from_slice_on(&[0.0f32], &[1], &dev).expect("upload");
            for (mode, ss, ss64) in [
                (ClipMode::Norm(0.5), &st, sum_squares),
                (ClipMode::Norm(1e6), &st, sum_squares),
                (ClipMode::Norm(0.5), &zero, 0.0),
                (ClipMode::GlobalNorm(0.5), &st, sum_squares),
                (ClipMode::GlobalNorm(1e6), &st, sum_squares),
                (ClipMode::Value(0.25), &st, sum_squares),
            ] {
                let out = ops::clip_gradient(&gt, Some(ss), mode)
                    .unwrap_or_else(|e| panic!("{mode:?} {what}: {e}"));
                assert_eq!(out.device(), dev.full_name(), "{mode:?} {what}: placement");
                assert_close(
                    &get(&out),
                    &r::clip(&g64, mode, ss64),
                    1e-6,
                    &format!("{mode:?} {what}"),
                );
            }
            // A global norm that is not finite gives NaN everywhere, as Keras' clip_by_global_norm.
            let inf = Tensor::from_slice_on(&[f32::INFINITY], &[1], &dev).expect("upload");
            let out = ops::clip_gradient(&gt, Some(&inf), ClipMode::GlobalNorm(1.0)).expect("clip");
            assert!(
                get(&out).iter().all(|v| v.is_nan()),
                "{what}: infinite global norm"
            );
        }
    }
}

#[test]
fn clip_values_and_sums_are_checked() {
    let rt = common::builder().build().expect("rt");
    let cpu = rt.cpu().expect("CPU:0");
    let g = put(&cpu, &[1.0, 2.0]);
    assert!(
        ops::clip_gradient(&g, None, ClipMode::Norm(1.0)).is_err(),
        "a norm needs its sum"
    );
    assert!(
        ops::clip_gradient(&g, None, ClipMode::Value(0.0)).is_err(),
        "clip 0"
    );
    assert!(
        ops::clip_gradient(&g, Some(&g), ClipMode::Norm(1.0)).is_err(),
        "two-element sum"
    );
    let err = Sgd::new(0.1).clipnorm(1.0).clipvalue(1.0);
    let mut m = small_cnn(1).expect("model");
    let e = m
        .compile(
            anygpu::nn::Loss::sparse_categorical_crossentropy(),
            err,
            &[],
        )
        .expect_err("two clips");
    assert!(
        e.to_string()
            .contains("Only one of `clipnorm`, `clipvalue` and `global_clipnorm`"),
        "{e}"
    );
}

/// Four steps of `optimizer` on one device, then mirrored over `replicas`: the same weights.
fn mirrored_clips_like_one_device(replicas: &[LogicalDevice], optimizer: Optimizer) {
    let (batch, steps) = (12, 4);
    let (x, y) = common::synthetic(batch * steps, 3);
    let single = &replicas[0];
    let batches: Vec<(Tensor, Tensor)> = (0..steps)
        .map(|s| {
            let rows = s * batch..(s + 1) * batch;
            (
                Tensor::from_slice_on(
                    &x[rows.start * 64..rows.end * 64],
                    &[batch, 8, 8, 1],
                    single,
                )
                .expect("a batch"),
                Tensor::from_slice_on(&y[rows], &[batch], single).expect("labels"),
            )
        })
        .collect();
    let mut reference = single
        .scope_run(|| compiled(small_cnn(4)?, optimizer.clone()))
        .expect("single-device model");
    let strategy = MirroredStrategy::with_devices(replicas).expect("a strategy");
    let mut model = strategy
        .scope(|| compiled(small_cnn(4)?, optimizer.clone()))
        .expect("scope")
        .expect("mirrored model");
    for (x, y) in &batches {
        reference.train_on_batch(x, y).expect("single step");
        model.train_on_batch(x, y).expect("mirrored step");
    }
    let want = reference.get_weights().expect("weights");
    for replica in 0..replicas.len() {
        let got = model.replica_weights(replica).expect("replica weights");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            common::assert_close(
                &format!("{optimizer} replica {replica} weight {i}"),
                g,
                w,
                2e-4,
            );
        }
    }
}

#[test]
fn mirrored_replicas_clip_the_summed_gradients_alike() {
    let clipped: [Optimizer; 3] = [
        Sgd::new(0.2).momentum(0.5).global_clipnorm(0.05).into(),
        RmsProp::new(0.01)
            .centered(true)
            .momentum(0.5)
            .clipnorm(0.02)
            .weight_decay(0.1)
            .into(),
        anygpu::nn::AdamW::new(0.01).clipvalue(0.01).into(),
    ];
    let rt = common::builder().virtual_cpus(2).build().expect("2 CPUs");
    let cpus = rt.list_logical_devices("CPU").expect("CPUs");
    for opt in &clipped {
        mirrored_clips_like_one_device(&cpus, opt.clone());
    }
    if common::gpus_at_least(1, "mirrored clipping on a GPU").is_some() {
        let all = common::available(rt.list_logical_devices(KindFilter::All).expect("devices"));
        let gpu = all
            .iter()
            .find(|d| d.device_type() == anygpu::DeviceKind::Gpu)
            .expect("a GPU")
            .clone();
        for opt in &clipped {
            mirrored_clips_like_one_device(&[gpu.clone(), cpus[0].clone()], opt.clone());
        }
    }
}

#[test]
fn a_schedule_counts_only_the_steps_loss_scaling_applied() {
    let rt = common::builder().build().expect("rt");
    let cpu = rt.cpu().expect("CPU:0");
    let schedule = ExponentialDecay::new(0.1, 1, 0.5);
    let opt = LossScaleOptimizer::new(Sgd::default().learning_rate_schedule(schedule.clone()));
    let mut m = cpu
        .scope_run(|| compiled(small_cnn(2)?, opt.into()))
        .expect("model");
    let (mut x, y) = common::synthetic(8, 1);
    let finite = Tensor::from_slice_on(&x, &[8, 8, 8, 1], &cpu).expect("x");
    // An infinity in the input makes every gradient NaN: loss scaling skips that step.
    x[5] = f32::INFINITY;
    let infinite = Tensor::from_slice_on(&x, &[8, 8, 8, 1], &cpu).expect("x");
    let y = Tensor::from_slice_on(&y, &[8], &cpu).expect("y");
    assert_eq!(m.learning_rate(), Some(schedule.value(0)));
    m.train_on_batch(&infinite, &y).expect("a skipped step");
    assert_eq!(m.iterations(), 0, "the skipped step is not counted");
    assert_eq!(m.learning_rate(), Some(schedule.value(0)));
    m.train_on_batch(&finite, &y).expect("a step");
    assert_eq!(m.iterations(), 1);
    assert_eq!(m.learning_rate(), Some(0.05));
    assert!(
        m.set_learning_rate(0.1).is_err(),
        "a schedule's rate is not settable"
    );
}

/// Records the weights and the validation loss after every epoch.
#[derive(Default)]
struct Recorder {
    weights: Vec<Vec<Vec<f32>>>,
}

impl Callback for Recorder {
    fn on_epoch_end(&mut self, fit: &mut FitContext<'_>) -> anygpu::Result<()> {
        self.weights.push(fit.model().get_weights()?);
        Ok(())
    }
}

fn data(n: usize, seed: u64) -> Dataset {
    let (x, y) = common::synthetic(n, seed);
    Dataset::from_tensor_slices(x, &[8, 8, 1], y)
        .expect("a dataset")
        .batch(8, false)
}

#[test]
fn early_stopping_restores_the_best_epochs_weights_in_fit() {
    let rt = common::builder().build().expect("rt");
    let cpu = rt.cpu().expect("CPU:0");
    let mut m = cpu
        .scope_run(|| compiled(small_cnn(6)?, Sgd::new(0.5).into()))
        .expect("model");
    // Validation labels shifted by one class: the better the model learns, the worse its
    // validation loss, so training stops early.
    let train = data(32, 1);
    let (x, y) = common::synthetic(16, 2);
    let shifted: Vec<i32> = y.iter().map(|c| (c + 1) % 3).collect();
    let val = Dataset::from_tensor_slices(x, &[8, 8, 1], shifted)
        .expect("a dataset")
        .batch(8, false);
    let mut rec = Recorder::default();
    let mut stop = EarlyStopping::new("val_loss")
        .patience(1)
        .restore_best_weights(true);
    let history = m
        .fit_with_callbacks(
            &train,
            30,
            None,
            Some(&val),
            &mut [&mut rec as &mut dyn Callback, &mut stop],
        )
        .expect("fit");
    let (best_epoch, best) = stop.best();
    let losses = &history.val_loss;
    let min = losses.iter().copied().fold(f64::INFINITY, f64::min);
    assert_eq!(
        best,
        Some(min),
        "the best value is the lowest val_loss of {losses:?}"
    );
    assert_eq!(losses[best_epoch], min);
    assert!(history.epochs() < 30, "stopped early: {losses:?}");
    assert_eq!(stop.stopped_epoch(), history.epochs() - 1);
    assert_eq!(m.get_weights().expect("weights"), rec.weights[best_epoch]);
}

#[test]
fn reduce_lr_on_plateau_lowers_the_rate_in_fit_and_logs_it() {
    let rt = common::builder().build().expect("rt");
    let cpu = rt.cpu().expect("CPU:0");
    // A rate of 0 never changes the loss: a plateau from the start. `min_lr` below 0 lets it
    // be "reduced" from 0 (0 > -1) to max(0 * 0.5, -1) = 0, so use a tiny rate instead.
    let mut m = cpu
        .scope_run(|| compiled(small_cnn(6)?, Sgd::new(1e-30).into()))
        .expect("model");
    let train = data(16, 1);
    let mut plateau = ReduceLROnPlateau::new("loss").patience(2).factor(0.5);
    let history = m
        .fit_with_callbacks(&train, 5, None, None, &mut [&mut plateau])
        .expect("fit");
    let lr0 = f64::from(1e-30f32);
    let half = f64::from((lr0 * 0.5) as f32);
    // Logged before each epoch's reduction: reduced after epoch 3 (index 2), then waits 2 more.
    assert_eq!(history.learning_rate, [lr0, lr0, lr0, half, half]);
    assert_eq!(m.learning_rate(), Some((half * 0.5) as f32));
    // A monitor that is not logged only warns.
    let mut missing = ReduceLROnPlateau::new("val_loss");
    m.fit_with_callbacks(&train, 1, None, None, &mut [&mut missing])
        .expect("a missing metric is a warning");
}
