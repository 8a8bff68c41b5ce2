//! Keras' callbacks that watch a metric or steer the learning rate: [`EarlyStopping`],
//! [`ReduceLROnPlateau`] (both on Keras' `MonitorCallback` rules, [`MonitorMode`]) and
//! [`LearningRateScheduler`].
//!
//! The monitored value is the last epoch's entry in the history (`loss`, `accuracy`,
//! `val_loss`, `val_accuracy`, `learning_rate`); when it is missing (`val_loss` without
//! validation data) the callback warns as Keras does, through `log::warn!`, and does nothing
//! that epoch.

use crate::error::{Error, Result};
use crate::nn::callbacks::{Callback, FitContext};

/// Whether the monitored quantity should fall or rise (Keras' `mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MonitorMode {
    /// From the metric's name: `loss`/`val_loss` fall, `accuracy`/`val_accuracy` rise.
    #[default]
    Auto,
    /// Lower is better.
    Min,
    /// Higher is better.
    Max,
}

/// Keras' `MonitorCallback`: the comparison and the best value so far.
#[derive(Clone, Debug, PartialEq)]
struct Monitor {
    monitor: String,
    mode: MonitorMode,
    /// `abs(min_delta)`, negated when lower is better (Keras' `_set_monitor_op`).
    min_delta: f64,
    /// Whether higher is better, once decided.
    greater: Option<bool>,
}

impl Monitor {
    fn new(monitor: &str, mode: MonitorMode, min_delta: f64) -> Monitor {
        Monitor {
            monitor: monitor.to_string(),
            mode,
            min_delta: min_delta.abs(),
            greater: None,
        }
    }

    /// Keras' `_set_monitor_op`, on the first epoch's end.
    fn decide(&mut self, callback: &str) -> Result<bool> {
        if let Some(g) = self.greater {
            return Ok(g);
        }
        let greater = match self.mode {
            MonitorMode::Min => false,
            MonitorMode::Max => true,
            // The direction of the compiled metric, as Keras 3 takes it from the metric.
            MonitorMode::Auto => match self.monitor.strip_prefix("val_").unwrap_or(&self.monitor) {
                "loss" | "mean_squared_error" | "mean_absolute_error" => false,
                key if key.ends_with("accuracy") => true,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "{callback} callback received monitor={}, but Keras isn't able to \
                         automatically determine whether that metric should be maximized or \
                         minimized. Pass `mode='max'` in order to monitor based on the highest \
                         metric value, or pass `mode='min'` in order to use the lowest value.",
                        self.monitor
                    )))
                }
            },
        };
        if !greater {
            self.min_delta = -self.min_delta;
        }
        self.greater = Some(greater);
        Ok(greater)
    }

    /// Keras' `_is_improvement`: `op(value - min_delta, reference)`, true without a reference.
    fn is_improvement(&self, value: f64, reference: Option<f64>) -> bool {
        let Some(reference) = reference else {
            return true;
        };
        if self.greater == Some(true) {
            value - self.min_delta > reference
        } else {
            value - self.min_delta < reference
        }
    }
}

/// Stops training when a monitored metric has stopped improving
/// (`keras.callbacks.EarlyStopping`), Keras' defaults: `monitor="val_loss", min_delta=0,
/// patience=0, mode="auto", baseline=None, restore_best_weights=False, start_from_epoch=0`.
///
/// After each epoch from `start_from_epoch` on: an improvement (by more than `min_delta`) on
/// the best value so far records it (and, with `restore_best_weights`, the weights) and resets
/// the wait unless a `baseline` is set and not beaten; otherwise, once `patience` epochs went
/// without one (and after the first epoch), `fit` stops. With `restore_best_weights` the best
/// epoch's weights are put back when training ends.
///
/// ```
/// use anygpu::data::Dataset;
/// use anygpu::nn::{Activation, Dense, EarlyStopping, Loss, Sequential, Sgd, Verbosity};
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let mut model = Sequential::new();
/// model.add(Dense::new(2).activation(Activation::Softmax).input_shape(&[2]))?;
/// // A learning rate of 0: the loss never improves, so training stops after the second epoch.
/// model.compile(Loss::sparse_categorical_crossentropy(), Sgd::new(0.0), &[])?;
/// model.set_verbose(Verbosity::Silent);
/// let data = Dataset::from_tensor_slices(vec![0.5; 8], &[2], vec![0, 1, 0, 1])?.batch(2, false);
/// let mut stop = EarlyStopping::new("loss");
/// let history = model.fit_with_callbacks(&data, 10, None, None, &mut [&mut stop])?;
/// assert_eq!((history.epochs(), stop.stopped_epoch()), (2, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct EarlyStopping {
    monitor: Monitor,
    /// `patience`: epochs without improvement before stopping.
    pub patience: usize,
    /// `baseline`: a value the metric must beat for the wait to reset.
    pub baseline: Option<f64>,
    /// `restore_best_weights`.
    pub restore_best_weights: bool,
    /// `start_from_epoch`: epochs to wait before watching at all.
    pub start_from_epoch: usize,
    wait: usize,
    stopped_epoch: usize,
    best: Option<f64>,
    best_weights: Option<Vec<Vec<f32>>>,
    best_epoch: usize,
}

impl Default for EarlyStopping {
    fn default() -> Self {
        EarlyStopping::new("val_loss")
    }
}

impl EarlyStopping {
    /// Watches `monitor` with Keras' other defaults.
    pub fn new(monitor: &str) -> EarlyStopping {
        EarlyStopping {
            monitor: Monitor::new(monitor, MonitorMode::Auto, 0.0),
            patience: 0,
            baseline: None,
            restore_best_weights: false,
            start_from_epoch: 0,
            wait: 0,
            stopped_epoch: 0,
            best: None,
            best_weights: None,
            best_epoch: 0,
        }
    }

    /// `min_delta=` (its absolute value counts, as in Keras).
    pub fn min_delta(mut self, min_delta: f64) -> EarlyStopping {
        self.monitor.min_delta = min_delta.abs();
        self
    }

    /// `patience=`.
    pub fn patience(mut self, patience: usize) -> EarlyStopping {
        self.patience = patience;
        self
    }

    /// `mode=`.
    pub fn mode(mut self, mode: MonitorMode) -> EarlyStopping {
        self.monitor.mode = mode;
        self
    }

    /// `baseline=`.
    pub fn baseline(mut self, baseline: f64) -> EarlyStopping {
        self.baseline = Some(baseline);
        self
    }

    /// `restore_best_weights=`.
    pub fn restore_best_weights(mut self, restore: bool) -> EarlyStopping {
        self.restore_best_weights = restore;
        self
    }

    /// `start_from_epoch=`.
    pub fn start_from_epoch(mut self, epoch: usize) -> EarlyStopping {
        self.start_from_epoch = epoch;
        self
    }

    /// The 0-based epoch training stopped after (0 when it did not stop early).
    pub fn stopped_epoch(&self) -> usize {
        self.stopped_epoch
    }

    /// The 0-based epoch of the best value, and the value.
    pub fn best(&self) -> (usize, Option<f64>) {
        (self.best_epoch, self.best)
    }

    /// Keras' `on_epoch_end` for 0-based `epoch` and the monitored value (`None`: missing);
    /// `weights` reads the model's weights when they are to be kept. Returns whether to stop.
    fn epoch_end(
        &mut self,
        epoch: usize,
        current: Option<f64>,
        weights: &mut dyn FnMut() -> Result<Vec<Vec<f32>>>,
    ) -> Result<bool> {
        self.monitor.decide("EarlyStopping")?;
        let Some(current) = current else {
            return Ok(false);
        };
        if epoch < self.start_from_epoch {
            return Ok(false);
        }
        if self.restore_best_weights && self.best_weights.is_none() {
            self.best_weights = Some(weights()?);
            self.best_epoch = epoch;
        }
        self.wait += 1;
        if self.monitor.is_improvement(current, self.best) {
            self.best = Some(current);
            self.best_epoch = epoch;
            if self.restore_best_weights {
                self.best_weights = Some(weights()?);
            }
            if self.baseline.is_none() || self.monitor.is_improvement(current, self.baseline) {
                self.wait = 0;
            }
            return Ok(false);
        }
        if self.wait >= self.patience && epoch > 0 {
            self.stopped_epoch = epoch;
            return Ok(true);
        }
        Ok(false)
    }
}

impl Callback for EarlyStopping {
    fn on_train_begin(&mut self, _fit: &mut FitContext<'_>) -> Result<()> {
        self.wait = 0;
        self.stopped_epoch = 0;
        self.best = None;
        self.best_weights = None;
        self.best_epoch = 0;
        Ok(())
    }

    fn on_epoch_end(&mut self, fit: &mut FitContext<'_>) -> Result<()> {
        let epoch = fit.epoch().saturating_sub(1);
        let (current, keys) = fit.epoch_log(&self.monitor.monitor);
        if current.is_none() {
            log::warn!(
                "Early stopping conditioned on metric `{}` which is not available. Available \
                 metrics are: {}",
                self.monitor.monitor,
                keys.join(",")
            );
        }
        let model = fit.model();
        let stop = self.epoch_end(epoch, current, &mut || model.get_weights())?;
        if stop {
            fit.stop_training();
        }
        Ok(())
    }

    fn on_train_end(&mut self, fit: &mut FitContext<'_>) -> Result<()> {
        if let (true, Some(weights)) = (self.restore_best_weights, self.best_weights.as_ref()) {
            fit.model_mut().set_weights(weights)?;
        }
        Ok(())
    }
}

/// Lowers the learning rate when a metric has stopped improving
/// (`keras.callbacks.ReduceLROnPlateau`), Keras' defaults: `monitor="val_loss", factor=0.1,
/// patience=10, mode="auto", min_delta=1e-4, cooldown=0, min_lr=0.0`.
///
/// After `patience` epochs without an improvement by more than `min_delta`, the rate becomes
/// `max(lr * factor, min_lr)` (when it is above `min_lr`), then `cooldown` epochs pass before
/// the waiting starts again. The rate of each epoch goes into the history
/// ([`History::learning_rate`](crate::nn::History::learning_rate)), before any reduction.
///
/// ```
/// use anygpu::data::Dataset;
/// use anygpu::nn::{Activation, Dense, Loss, ReduceLROnPlateau, Sequential, Sgd, Verbosity};
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let mut model = Sequential::new();
/// model.add(Dense::new(2).activation(Activation::Softmax).input_shape(&[2]))?;
/// model.compile(Loss::sparse_categorical_crossentropy(), Sgd::new(0.0), &[])?;
/// model.set_verbose(Verbosity::Silent);
/// let data = Dataset::from_tensor_slices(vec![0.5; 8], &[2], vec![0, 1, 0, 1])?.batch(2, false);
/// let mut plateau = ReduceLROnPlateau::new("loss").patience(1);
/// let history = model.fit_with_callbacks(&data, 3, None, None, &mut [&mut plateau])?;
/// assert_eq!(history.learning_rate, [0.0, 0.0, 0.0]); // 0 is never above min_lr
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct ReduceLROnPlateau {
    monitor: Monitor,
    /// `factor` (< 1).
    pub factor: f64,
    /// `patience`.
    pub patience: usize,
    /// `cooldown`: epochs after a reduction before waiting again.
    pub cooldown: usize,
    /// `min_lr`: the floor.
    pub min_lr: f64,
    wait: usize,
    cooldown_counter: usize,
    best: Option<f64>,
}

impl Default for ReduceLROnPlateau {
    fn default() -> Self {
        ReduceLROnPlateau::new("val_loss")
    }
}

impl ReduceLROnPlateau {
    /// Watches `monitor` with Keras' other defaults.
    pub fn new(monitor: &str) -> ReduceLROnPlateau {
        ReduceLROnPlateau {
            monitor: Monitor::new(monitor, MonitorMode::Auto, 1e-4),
            factor: 0.1,
            patience: 10,
            cooldown: 0,
            min_lr: 0.0,
            wait: 0,
            cooldown_counter: 0,
            best: None,
        }
    }

    /// `factor=` (checked at the start of `fit`: Keras refuses `factor >= 1`).
    pub fn factor(mut self, factor: f64) -> ReduceLROnPlateau {
        self.factor = factor;
        self
    }

    /// `patience=`.
    pub fn patience(mut self, patience: usize) -> ReduceLROnPlateau {
        self.patience = patience;
        self
    }

    /// `mode=`.
    pub fn mode(mut self, mode: MonitorMode) -> ReduceLROnPlateau {
        self.monitor.mode = mode;
        self
    }

    /// `min_delta=`.
    pub fn min_delta(mut self, min_delta: f64) -> ReduceLROnPlateau {
        self.monitor.min_delta = min_delta.abs();
        self
    }

    /// `cooldown=`.
    pub fn cooldown(mut self, cooldown: usize) -> ReduceLROnPlateau {
        self.cooldown = cooldown;
        self
    }

    /// `min_lr=`.
    pub fn min_lr(mut self, min_lr: f64) -> ReduceLROnPlateau {
        self.min_lr = min_lr;
        self
    }

    /// Keras' `on_epoch_end` for the monitored value (`None`: missing) and the rate `lr`:
    /// the new rate, when it is reduced.
    fn epoch_end(&mut self, current: Option<f64>, lr: f32) -> Result<Option<f32>> {
        self.monitor.decide("ReduceLROnPlateau")?;
        let Some(current) = current else {
            return Ok(None);
        };
        if self.cooldown_counter > 0 {
            self.cooldown_counter -= 1;
            self.wait = 0;
        }
        if self.monitor.is_improvement(current, self.best) {
            self.best = Some(current);
            self.wait = 0;
        } else if self.cooldown_counter == 0 {
            self.wait += 1;
            // Keras compares the float32 rate, as float64, with float32(min_lr), then works
            // in float64 before the variable rounds it.
            let old = f64::from(lr);
            if self.wait >= self.patience && old > f64::from(self.min_lr as f32) {
                let new = (old * self.factor).max(self.min_lr);
                self.cooldown_counter = self.cooldown;
                self.wait = 0;
                return Ok(Some(new as f32));
            }
        }
        Ok(None)
    }
}

impl Callback for ReduceLROnPlateau {
    fn on_train_begin(&mut self, _fit: &mut FitContext<'_>) -> Result<()> {
        if self.factor >= 1.0 {
            return Err(Error::InvalidArgument(format!(
                "ReduceLROnPlateau does not support a factor >= 1.0. Received factor={}",
                self.factor
            )));
        }
        self.best = None;
        self.cooldown_counter = 0;
        self.wait = 0;
        Ok(())
    }

    fn on_epoch_end(&mut self, fit: &mut FitContext<'_>) -> Result<()> {
        fit.log_learning_rate();
        let (current, keys) = fit.epoch_log(&self.monitor.monitor);
        if current.is_none() {
            log::warn!(
                "Learning rate reduction is conditioned on metric `{}` which is not available. \
                 Available metrics are: {}.",
                self.monitor.monitor,
                keys.join(",")
            );
        }
        let lr = fit
            .model()
            .learning_rate()
            .ok_or_else(|| Error::Model("ReduceLROnPlateau: the model is not compiled".into()))?;
        if let Some(new) = self.epoch_end(current, lr)? {
            fit.model_mut().set_learning_rate(new)?;
        }
        Ok(())
    }
}

/// Sets the learning rate before every epoch from a function of the 0-based epoch and the
/// current rate (`keras.callbacks.LearningRateScheduler(schedule)`); the rate of each epoch
/// goes into the history ([`History::learning_rate`](crate::nn::History::learning_rate)).
///
/// ```
/// use anygpu::data::Dataset;
/// use anygpu::nn::{Activation, Dense, LearningRateScheduler, Loss, Sequential, Sgd, Verbosity};
/// let _cpu = anygpu::with_device("/cpu:0")?;
/// let mut model = Sequential::new();
/// model.add(Dense::new(2).activation(Activation::Softmax).input_shape(&[2]))?;
/// model.compile(Loss::sparse_categorical_crossentropy(), Sgd::new(0.1), &[])?;
/// model.set_verbose(Verbosity::Silent);
/// let data = Dataset::from_tensor_slices(vec![0.5; 8], &[2], vec![0, 1, 0, 1])?.batch(2, false);
/// let mut halve = LearningRateScheduler::new(|epoch, lr| if epoch < 1 { lr } else { lr * 0.5 });
/// let history = model.fit_with_callbacks(&data, 3, None, None, &mut [&mut halve])?;
/// assert_eq!(history.learning_rate, [0.1f32 as f64, 0.05f32 as f64, 0.025f32 as f64]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LearningRateScheduler {
    schedule: Box<dyn FnMut(usize, f64) -> f64 + Send>,
}

impl LearningRateScheduler {
    /// Calls `schedule(epoch, lr)` before every epoch (0-based) with the current rate, and sets
    /// the rate to what it returns.
    pub fn new(schedule: impl FnMut(usize, f64) -> f64 + Send + 'static) -> LearningRateScheduler {
        LearningRateScheduler {
            schedule: Box::new(schedule),
        }
    }
}

impl std::fmt::Debug for LearningRateScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LearningRateScheduler")
    }
}

impl Callback for LearningRateScheduler {
    fn on_epoch_begin(&mut self, fit: &mut FitContext<'_>) -> Result<()> {
        let lr = fit.model().learning_rate().ok_or_else(|| {
            Error::Model("LearningRateScheduler: the model is not compiled".into())
        })?;
        let new = (self.schedule)(fit.epoch(), f64::from(lr));
        fit.model_mut().set_learning_rate(new as f32)
    }

    fn on_epoch_end(&mut self, fit: &mut FitContext<'_>) -> Result<()> {
        fit.log_learning_rate();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! Decision sequences on fixed metric series, against Keras 3 run by hand on the same
    //! series (`keras/src/callbacks/early_stopping.py`, `reduce_lr_on_plateau.py`).
    use super::*;

    /// The epoch EarlyStopping stops after (None: never), and the best epoch.
    fn early(stop: &mut EarlyStopping, series: &[Option<f64>]) -> (Option<usize>, usize) {
        stop.wait = 0;
        stop.best = None;
        let mut weights = || Ok(vec![vec![0.0f32]]);
        for (epoch, &v) in series.iter().enumerate() {
            if stop.epoch_end(epoch, v, &mut weights).expect("a decision") {
                return (Some(epoch), stop.best_epoch);
            }
        }
        (None, stop.best_epoch)
    }

    #[test]
    fn early_stopping_follows_keras_on_fixed_series() {
        let s = |v: &[f64]| v.iter().map(|&x| Some(x)).collect::<Vec<_>>();
        // patience 0: stops at the first epoch that does not improve (not epoch 0).
        let mut e = EarlyStopping::new("val_loss");
        assert_eq!(early(&mut e, &s(&[1.0, 0.9, 0.95, 0.8])), (Some(2), 1));
        // patience 2: two epochs in a row without improvement.
        let mut e = EarlyStopping::new("val_loss").patience(2);
        assert_eq!(
            early(&mut e, &s(&[1.0, 1.1, 0.9, 0.95, 0.92, 0.5])),
            (Some(4), 2)
        );
        // min_delta: 1.0 -> 0.96 is not an improvement by more than 0.05.
        let mut e = EarlyStopping::new("loss").min_delta(0.05).patience(1);
        assert_eq!(early(&mut e, &s(&[1.0, 0.96, 0.9, 0.8])), (Some(1), 0));
        // accuracy rises under mode auto.
        let mut e = EarlyStopping::new("val_accuracy").patience(1);
        assert_eq!(early(&mut e, &s(&[0.5, 0.6, 0.7, 0.65])), (Some(3), 2));
        // mode max on a loss name.
        let mut e = EarlyStopping::new("loss").mode(MonitorMode::Max);
        assert_eq!(early(&mut e, &s(&[1.0, 0.5])), (Some(1), 0));
        // baseline: improvements that do not beat it leave the wait counting (without one,
        // the wait would reset at epoch 1 and training stop at epoch 3).
        let mut e = EarlyStopping::new("val_loss").patience(2).baseline(0.5);
        assert_eq!(early(&mut e, &s(&[1.0, 0.9, 0.95, 0.97])), (Some(2), 1));
        let mut e = EarlyStopping::new("val_loss").patience(2);
        assert_eq!(early(&mut e, &s(&[1.0, 0.9, 0.95, 0.97])), (Some(3), 1));
        // start_from_epoch: the first two epochs are not watched.
        let mut e = EarlyStopping::new("val_loss").start_from_epoch(2);
        assert_eq!(early(&mut e, &s(&[1.0, 2.0, 3.0, 4.0])), (Some(3), 2));
        // a missing value neither improves nor waits.
        let mut e = EarlyStopping::new("val_loss").patience(1);
        assert_eq!(
            early(&mut e, &[Some(1.0), None, None, Some(1.5)]),
            (Some(3), 0)
        );
        // an unknown metric under mode auto is Keras' ValueError.
        let mut e = EarlyStopping::new("val_f1");
        let mut w = || Ok(vec![]);
        assert!(e.epoch_end(0, Some(1.0), &mut w).is_err());
        // The compiled metrics' own directions under mode auto: accuracies up, errors down.
        let rising = s(&[0.5, 0.6, 0.7, 0.8]);
        let mut e = EarlyStopping::new("val_sparse_top_k_categorical_accuracy").patience(1);
        assert_eq!(
            early(&mut e, &rising),
            (None, 3),
            "an accuracy improves upwards"
        );
        let mut e = EarlyStopping::new("mean_absolute_error").patience(1);
        assert_eq!(
            early(&mut e, &rising),
            (Some(1), 0),
            "an error improves downwards"
        );
        let mut e = EarlyStopping::new("val_mean_squared_error").patience(1);
        assert_eq!(early(&mut e, &rising), (Some(1), 0));
    }

    /// The rate after each epoch of ReduceLROnPlateau on `series`, from `lr`.
    fn plateau(r: &mut ReduceLROnPlateau, series: &[f64], mut lr: f32) -> Vec<f32> {
        series
            .iter()
            .map(|&v| {
                if let Some(new) = r.epoch_end(Some(v), lr).expect("a decision") {
                    lr = new;
                }
                lr
            })
            .collect()
    }

    #[test]
    fn reduce_lr_on_plateau_follows_keras_on_fixed_series() {
        // patience 2, factor 0.5: reductions after epochs 3 and 5 (wait resets after each).
        let mut r = ReduceLROnPlateau::new("val_loss").patience(2).factor(0.5);
        assert_eq!(
            plateau(&mut r, &[1.0, 0.9, 0.9, 0.9, 0.95, 0.91, 0.5], 0.1),
            [0.1, 0.1, 0.1, 0.05, 0.05, 0.025, 0.025]
        );
        // min_delta 1e-4: 0.99995 is no improvement on 1.0.
        let mut r = ReduceLROnPlateau::new("loss").patience(1).factor(0.5);
        assert_eq!(plateau(&mut r, &[1.0, 0.99995], 0.1), [0.1, 0.05]);
        // cooldown 2: the epoch after a reduction counts for nothing, the next one waits
        // again (Keras decrements the counter before it checks it).
        let mut r = ReduceLROnPlateau::new("loss")
            .patience(1)
            .factor(0.5)
            .cooldown(2);
        assert_eq!(
            plateau(&mut r, &[1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 0.1),
            [0.1, 0.05, 0.05, 0.025, 0.025, 0.0125]
        );
        // min_lr: the floor, and no reduction at it.
        let mut r = ReduceLROnPlateau::new("loss")
            .patience(1)
            .factor(0.1)
            .min_lr(0.005);
        assert_eq!(
            plateau(&mut r, &[1.0, 1.0, 1.0, 1.0], 0.1),
            [0.1, 0.01, 0.005, 0.005]
        );
    }
}
