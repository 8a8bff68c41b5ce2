//! Keras' `BatchNormalization` and `Dropout`: the two layers whose training pass differs from
//! their inference pass ([`Layer::call`]'s `training` flag), and, for batch normalization,
//! non-trainable state ([`Layer::non_trainable_weights`]).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::mixed_precision::Policy;
use crate::nn::init::zeros;
use crate::nn::layer_config;
use crate::nn::layers::{
    bad_input, not_built, on_gpu, replace, saved, weights_of, DeferredNormalization, Layer,
    StemConv,
};
use crate::nn::replica_group::{self, ReplicaGroup};
use crate::ops::spec::{Activation as OpActivation, ActivationFn, DropoutMask};
use crate::ops::{self, BatchNormVariables};
use crate::tensor::{DType, Tensor};

/// `shape` filled with ones on `device`.
fn ones(shape: &[usize], device: &LogicalDevice) -> Result<Tensor> {
    let n = shape.iter().product();
    Tensor::from_slice_on(&vec![1.0f32; n], shape, device)
}

/// Batch normalization (`keras.layers.BatchNormalization(axis=-1, momentum=0.99,
/// epsilon=1e-3, center=True, scale=True)`): in training, each channel (the last axis) is
/// normalized with the batch's mean and biased variance and the moving statistics move
/// towards them (`moving = moving * momentum + batch * (1 - momentum)`); in inference the
/// moving statistics normalize. Then `* gamma + beta`.
///
/// Weights, in Keras' order: `gamma` (ones, with `scale`), `beta` (zeros, with `center`), and
/// the non-trainable `moving_mean` (zeros) and `moving_variance` (ones), all `[channels]` and
/// float32 whatever the dtype policy (Keras computes batch normalization in float32 and casts
/// the output to the compute dtype; here the float16 kernels read and write float16
/// activations and compute in float32).
///
/// ```
/// use anygpu::nn::{BatchNormalization, Layer};
/// let bn = BatchNormalization::new();
/// assert_eq!(bn.compute_output_shape(&[28, 28, 32])?, [28, 28, 32]);
/// assert!(bn.compute_output_shape(&[4, 28, 28, 32]).is_err()); // rank 2 or 4 (with the batch)
/// assert!(BatchNormalization::new().axis(1).compute_output_shape(&[28, 28, 32]).is_err());
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// Under a [`crate::distribute::MirroredStrategy`] each replica normalizes with its own
/// batch statistics (Keras' default `synchronized=False`) and the replicas' moving statistics
/// are averaged after every step, so that they agree. With
/// [`synchronized(true)`](BatchNormalization::synchronized) the replicas normalize with the
/// moments of the whole global batch (their sums added across replicas in training, forward
/// and backward), so a mirrored step computes what one device computes on the whole batch. In
/// a [`crate::nn::Pipeline`] each micro-batch is normalized with its own statistics and moves
/// the moving ones.
///
/// Differences from Keras: `axis=-1` only (the last axis, for inputs of shape `[features]` or
/// `[height, width, channels]`); `synchronized=True` within one process (a
/// `MultiWorkerMirroredStrategy` refuses it); no renorm, masks, regularizers or constraints;
/// fixed initializers.
#[derive(Debug, Clone)]
pub struct BatchNormalization {
    axis: isize,
    momentum: f32,
    epsilon: f32,
    center: bool,
    scale: bool,
    synchronized: bool,
    input_shape: Option<Vec<usize>>,
    policy: Option<Policy>,
    /// `[gamma?, beta?]` once built.
    weights: Vec<Tensor>,
    /// `[moving_mean, moving_variance]` once built.
    moving: Vec<Tensor>,
    /// The ones and zeros that stand in for `gamma` and `beta` without `scale` or `center`.
    fixed: Vec<Tensor>,
}

impl Default for BatchNormalization {
    fn default() -> Self {
        BatchNormalization::new()
    }
}

impl BatchNormalization {
    /// Keras' defaults: `axis=-1, momentum=0.99, epsilon=1e-3, center=True, scale=True,
    /// synchronized=False`.
    pub fn new() -> BatchNormalization {
        BatchNormalization {
            axis: -1,
            momentum: 0.99,
            epsilon: 1e-3,
            center: true,
            scale: true,
            synchronized: false,
            input_shape: None,
            policy: None,
            weights: Vec::new(),
            moving: Vec::new(),
            fixed: Vec::new(),
        }
    }

    /// `axis=`, counted with the batch axis as Keras does: -1 or the last axis (1 for
    /// `[n, features]`, 3 for NHWC); another fails when the layer is added.
    pub fn axis(mut self, axis: isize) -> BatchNormalization {
        self.axis = axis;
        self
    }

    /// `momentum=` of the moving statistics.
    pub fn momentum(mut self, momentum: f32) -> BatchNormalization {
        self.momentum = momentum;
        self
    }

    /// `epsilon=`, added to the variance.
    pub fn epsilon(mut self, epsilon: f32) -> BatchNormalization {
        self.epsilon = epsilon;
        self
    }

    /// `center=`: with it, the trainable offset `beta`.
    pub fn center(mut self, center: bool) -> BatchNormalization {
        self.center = center;
        self
    }

    /// `scale=`: with it, the trainable scale `gamma`.
    pub fn scale(mut self, scale: bool) -> BatchNormalization {
        self.scale = scale;
        self
    }

    /// `synchronized=`: under a [`crate::distribute::MirroredStrategy`], normalize each
    /// replica's examples with the moments of the global batch (the replicas' sums added
    /// before normalizing, and the gradient's sums likewise in the backward pass) instead of
    /// its own. Costs a rendezvous of the replicas and two small reads from each device per
    /// layer and pass; the same as `false` on one device.
    ///
    /// ```
    /// use anygpu::distribute::MirroredStrategy;
    /// use anygpu::nn::{Activation, BatchNormalization, Dense, Loss, Sequential, Sgd};
    /// use anygpu::{Runtime, Tensor};
    /// let rt = Runtime::builder().virtual_cpus(2).build()?;
    /// let strategy = MirroredStrategy::with_devices(&rt.list_logical_devices("CPU")?)?;
    /// let mut model = strategy.scope(|| {
    ///     let mut m = Sequential::with_seed(1);
    ///     m.add(Dense::new(4).input_shape(&[3]))?;
    ///     m.add(BatchNormalization::new().synchronized(true))?;
    ///     m.add(Dense::new(2).activation(Activation::Softmax))?;
    ///     m.compile(Loss::sparse_categorical_crossentropy(), Sgd::new(0.1), &[])?;
    ///     Ok::<_, anygpu::Error>(m)
    /// })??;
    /// let x = Tensor::from_vec((0..24).map(|v| v as f32 / 24.0).collect(), &[8, 3])?;
    /// let y = Tensor::from_vec(vec![0i32, 1, 0, 1, 1, 0, 1, 0], &[8])?;
    /// assert!(model.train_on_batch(&x, &y)?.is_finite());
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn synchronized(mut self, synchronized: bool) -> BatchNormalization {
        self.synchronized = synchronized;
        self
    }

    /// The replica group to synchronize over: the running mirrored step's, when
    /// `synchronized` and it has several replicas.
    ///
    /// # Errors
    /// A step that spans workers: the group holds only this worker's replicas.
    fn sync_group(&self) -> Result<Option<(std::sync::Arc<ReplicaGroup>, usize)>> {
        if !self.synchronized {
            return Ok(None);
        }
        match replica_group::current() {
            Some((group, _)) if group.multi_worker() => Err(Error::Model(
                "BatchNormalization(synchronized=True) is not supported under \
                 MultiWorkerMirroredStrategy: it synchronizes the replicas of one process only; \
                 use synchronized=False (each replica's own statistics)"
                    .into(),
            )),
            Some((group, index)) if group.size() > 1 => Ok(Some((group, index))),
            _ => Ok(None),
        }
    }

    /// A training pass normalized with the moments of every replica of `group`: this
    /// replica's moments (from the training kernel, with stand-ins for the moving statistics)
    /// are summed over the group, `x` is normalized with the sums' mean and biased variance
    /// (by the inference kernel), and the moving statistics move by them once. Keeps
    /// `[x, [mean; inv], mean, variance]`.
    fn call_synchronized(
        &self,
        x: &Tensor,
        v: BatchNormVariables<'_>,
        (group, index): (&ReplicaGroup, usize),
    ) -> Result<(Tensor, Vec<Tensor>)> {
        // The moments are summed across replicas on the host: the profiler names these waits.
        let _cause = crate::profiler::WaitCause::enter(
            "BatchNormalization(synchronized=True): moments summed across replicas",
        );
        let device = x.device_handle();
        let c = v.gamma.len();
        let (stand_in_mean, stand_in_var) = (zeros(&[c], device)?, ones(&[c], device)?);
        let own = BatchNormVariables {
            moving_mean: &stand_in_mean,
            moving_variance: &stand_in_var,
            ..v
        };
        let (_, stats) = ops::batch_normalization_training(x, own, self.momentum, self.epsilon)?;
        let stats = stats.to_vec::<f32>()?;
        let (mean, inv) = stats.split_at(c);
        // Per channel: the count, Σx and Σx² of this replica, in f64 (its mean and variance
        // are float32 values, exact in f64).
        let m = (x.len() / c.max(1)) as f64;
        let eps = f64::from(self.epsilon);
        let mut part = vec![m];
        part.extend(mean.iter().map(|&u| m * f64::from(u)));
        part.extend(mean.iter().zip(inv).map(|(&u, &i)| {
            let var = (1.0 / f64::from(i).powi(2) - eps).max(0.0);
            m * (var + f64::from(u).powi(2))
        }));
        let what = "BatchNormalization(synchronized=True): the batch moments";
        let sum = group.all_reduce_sum(index, part, what)?;
        let total = sum[0];
        let global_mean: Vec<f64> = sum[1..=c].iter().map(|s| s / total).collect();
        let global_var: Vec<f32> = global_mean
            .iter()
            .zip(&sum[1 + c..])
            .map(|(u, sq)| (sq / total - u * u).max(0.0) as f32)
            .collect();
        let global_mean: Vec<f32> = global_mean.iter().map(|&u| u as f32).collect();
        let mean_t = Tensor::from_slice_on(&global_mean, &[c], device)?;
        let var_t = Tensor::from_slice_on(&global_var, &[c], device)?;
        let y = ops::batch_normalization_inference(
            x,
            BatchNormVariables {
                moving_mean: &mean_t,
                moving_variance: &var_t,
                ..v
            },
            self.epsilon,
        )?;
        // The moving statistics move as the training kernel moves them, by the group's moments.
        let one_minus = 1.0 - self.momentum;
        for (moving, batch) in [
            (v.moving_mean, &global_mean),
            (v.moving_variance, &global_var),
        ] {
            let old = moving.to_vec::<f32>()?;
            let new: Vec<f32> = old
                .iter()
                .zip(batch)
                .map(|(m, b)| m * self.momentum + b * one_minus)
                .collect();
            moving.assign(&Tensor::from_slice_on(&new, &[c], device)?)?;
        }
        let mut global_stats = global_mean;
        global_stats.extend(global_var.iter().map(|v| 1.0 / (v + self.epsilon).sqrt()));
        let global_stats = Tensor::from_slice_on(&global_stats, &[2, c], device)?;
        Ok((y, vec![x.clone(), global_stats, mean_t, var_t]))
    }

    /// The gradients of [`BatchNormalization::call_synchronized`]: the gradient kernel's
    /// `dx` uses this replica's sums `Σdy` and `Σdy·x̂`; with the group's sums over all `M`
    /// rows, `dx += gamma·inv·((Σdy/m - ΣΣdy/M) + x̂·(Σdy·x̂/m - ΣΣdy·x̂/M))`, a per-channel
    /// affine map of `x̂` that the inference kernel computes. `dgamma` and `dbeta` stay this
    /// replica's: the strategy adds them up like every gradient.
    fn backward_synchronized(
        &self,
        saved: [Tensor; 4],
        dy: &Tensor,
        (group, index): (&ReplicaGroup, usize),
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let _cause = crate::profiler::WaitCause::enter(
            "BatchNormalization(synchronized=True): gradient sums summed across replicas",
        );
        let [x, stats, mean_t, var_t] = saved;
        let (gamma, _) = self.gamma_beta()?;
        let (dx, dgamma, dbeta) =
            ops::batch_normalization_backward(&x, dy, gamma, &stats, self.epsilon)?;
        let c = gamma.len();
        let m = (x.len() / c.max(1)) as f64;
        let (dg, db) = (dgamma.to_vec::<f32>()?, dbeta.to_vec::<f32>()?);
        let mut part = vec![m];
        part.extend(dg.iter().chain(&db).map(|&v| f64::from(v)));
        let what = "BatchNormalization(synchronized=True): the gradient sums";
        let sum = group.all_reduce_sum(index, part, what)?;
        let total = sum[0];
        let (g, inv) = (gamma.to_vec::<f32>()?, stats.to_vec::<f32>()?);
        let per_channel = |k: usize, own: f32, all: f64| {
            let step = f64::from(own) / m - all / total;
            (f64::from(g[k]) * f64::from(inv[c + k]) * step) as f32
        };
        let scale: Vec<f32> = (0..c).map(|k| per_channel(k, dg[k], sum[1 + k])).collect();
        let shift: Vec<f32> = (0..c)
            .map(|k| per_channel(k, db[k], sum[1 + c + k]))
            .collect();
        let device = x.device_handle();
        let (scale, shift) = (
            Tensor::from_slice_on(&scale, &[c], device)?,
            Tensor::from_slice_on(&shift, &[c], device)?,
        );
        let correction = ops::batch_normalization_inference(
            &x,
            BatchNormVariables {
                gamma: &scale,
                beta: &shift,
                moving_mean: &mean_t,
                moving_variance: &var_t,
            },
            self.epsilon,
        )?;
        // The sum in float32 (a float16 `dx` under mixed precision: the kernels compute in
        // float32 too).
        let dx = match dx.dtype() {
            DType::F32 => dx.add(&correction)?,
            dtype => dx
                .cast(DType::F32)?
                .add(&correction.cast(DType::F32)?)?
                .cast(dtype)?,
        };
        Ok((dx, dgamma, dbeta))
    }

    /// `input_shape=`, for the first layer of a model.
    pub fn input_shape(mut self, shape: &[usize]) -> BatchNormalization {
        self.input_shape = Some(shape.to_vec());
        self
    }

    /// `dtype=`: this layer's dtype policy, whatever the global one.
    pub fn dtype_policy(mut self, policy: Policy) -> BatchNormalization {
        self.policy = Some(policy);
        self
    }

    /// `(gamma, beta)`, or the ones and zeros standing in for them.
    fn gamma_beta(&self) -> Result<(&Tensor, &Tensor)> {
        let mut trained = self.weights.iter();
        let mut fixed = self.fixed.iter();
        let mut pick = |own: bool| if own { trained.next() } else { fixed.next() };
        match (pick(self.scale), pick(self.center)) {
            (Some(g), Some(b)) => Ok((g, b)),
            _ => Err(not_built("BatchNormalization")),
        }
    }

    /// The backward pass of a fused ReLU form (`act` must be ReLU's, the layer not
    /// synchronized) from the gradient `dy` of that form's output: `op` takes the kept input,
    /// `dy`, `(gamma, beta)`, the kept statistics and epsilon.
    #[allow(clippy::type_complexity)] // backward's pair, optional
    fn relu_backward(
        &self,
        saved_tensors: &[Tensor],
        (dy, act): (&Tensor, ActivationFn),
        need_dx: bool,
        op: impl FnOnce(
            &Tensor,
            &Tensor,
            (&Tensor, &Tensor),
            &Tensor,
            f32,
        ) -> Result<(Tensor, Tensor, Tensor)>,
    ) -> Result<Option<(Option<Tensor>, Vec<Tensor>)>> {
        if act != ActivationFn::RELU || self.synchronized {
            return Ok(None);
        }
        let [x, stats] = saved::<2>("BatchNormalization", saved_tensors)?;
        let (gamma, beta) = self.gamma_beta()?;
        let (dx, dgamma, dbeta) = op(&x, dy, (gamma, beta), &stats, self.epsilon)?;
        Ok(Some((
            need_dx.then_some(dx),
            self.trained_grads(dgamma, dbeta),
        )))
    }

    /// Whether a CPU-only fused form of the layer with the activation `act` after it runs on
    /// `t` (its input, or its output's gradient): a ReLU, not synchronized, `t` float32 on
    /// the CPU.
    fn fused_on_cpu(&self, act: ActivationFn, t: &Tensor) -> bool {
        act == ActivationFn::RELU && !self.synchronized && t.dtype() == DType::F32 && !on_gpu(t)
    }

    /// The gradients of the trained weights, in [`Layer::weights`] order: `dgamma` with
    /// `scale`, `dbeta` with `center`.
    fn trained_grads(&self, dgamma: Tensor, dbeta: Tensor) -> Vec<Tensor> {
        let mut grads = Vec::new();
        if self.scale {
            grads.push(dgamma);
        }
        if self.center {
            grads.push(dbeta);
        }
        grads
    }

    fn variables(&self) -> Result<BatchNormVariables<'_>> {
        let (gamma, beta) = self.gamma_beta()?;
        let [moving_mean, moving_variance] = &self.moving[..] else {
            return Err(not_built("BatchNormalization"));
        };
        Ok(BatchNormVariables {
            gamma,
            beta,
            moving_mean,
            moving_variance,
        })
    }

    fn check_hyper_parameters(&self) -> Result<()> {
        let bad = |what: &str, value: f32, limit: &str| {
            Err(Error::InvalidArgument(format!(
                "BatchNormalization: {what}={value} is not valid; it must be {limit}"
            )))
        };
        if !(self.momentum.is_finite() && (0.0..=1.0).contains(&self.momentum)) {
            return bad("momentum", self.momentum, "in [0, 1]");
        }
        if !(self.epsilon.is_finite() && self.epsilon >= 0.0) {
            return bad("epsilon", self.epsilon, "finite and >= 0");
        }
        Ok(())
    }
}

impl Layer for BatchNormalization {
    fn dtype_policy(&self) -> Option<Policy> {
        self.policy
    }

    fn boxed_clone(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }

    fn get_config(&self) -> Option<serde_json::Value> {
        let mut c = serde_json::Map::new();
        c.insert("axis".into(), self.axis.into());
        c.insert("momentum".into(), layer_config::num(self.momentum));
        c.insert("epsilon".into(), layer_config::num(self.epsilon));
        c.insert("center".into(), self.center.into());
        c.insert("scale".into(), self.scale.into());
        c.insert("synchronized".into(), self.synchronized.into());
        Some(layer_config::with_dtype(c, self.policy))
    }

    fn class_name(&self) -> &'static str {
        "BatchNormalization"
    }

    fn base_name(&self) -> &'static str {
        "batch_normalization"
    }

    fn declared_input_shape(&self) -> Option<&[usize]> {
        self.input_shape.as_deref()
    }

    fn compute_output_shape(&self, input_shape: &[usize]) -> Result<Vec<usize>> {
        self.check_hyper_parameters()?;
        // Keras' rank counts the batch axis.
        let rank = input_shape.len() + 1;
        if rank != 2 && rank != 4 {
            return Err(bad_input(
                "BatchNormalization",
                input_shape,
                format!(
                    ": BatchNormalization takes inputs of rank 2 ([batch, features]) or 4 \
                     ([batch, height, width, channels]), got rank {rank} (input_shape \
                     {input_shape:?})"
                ),
            ));
        }
        if self.axis != -1 && self.axis != rank as isize - 1 {
            return Err(Error::InvalidArgument(format!(
                "BatchNormalization: axis={} is not supported for inputs of rank {rank}; only \
                 the last axis (axis=-1 or axis={})",
                self.axis,
                rank - 1
            )));
        }
        if input_shape.contains(&0) {
            return Err(bad_input(
                "BatchNormalization",
                input_shape,
                format!(": every axis of the input must be non-empty, got {input_shape:?}"),
            ));
        }
        Ok(input_shape.to_vec())
    }

    fn build(&mut self, input_shape: &[usize], _seed: u64, device: &LogicalDevice) -> Result<()> {
        self.compute_output_shape(input_shape)?;
        let c = input_shape[input_shape.len() - 1];
        let mut weights = Vec::new();
        let mut fixed = Vec::new();
        for (own, value) in [(self.scale, 1.0), (self.center, 0.0)] {
            let t = if value == 1.0 {
                ones(&[c], device)?
            } else {
                zeros(&[c], device)?
            };
            if own {
                weights.push(t);
            } else {
                fixed.push(t);
            }
        }
        self.moving = vec![zeros(&[c], device)?, ones(&[c], device)?];
        self.weights = weights;
        self.fixed = fixed;
        Ok(())
    }

    fn weights(&self) -> Vec<(&'static str, &Tensor)> {
        let names: &[&'static str] = match (self.scale, self.center) {
            (true, true) => &["gamma", "beta"],
            (true, false) => &["gamma"],
            (false, true) => &["beta"],
            (false, false) => &[],
        };
        weights_of(names, &self.weights)
    }

    fn set_weight(&mut self, index: usize, value: Tensor) -> Result<()> {
        replace("BatchNormalization", &mut self.weights, index, value)
    }

    fn non_trainable_weights(&self) -> Vec<(&'static str, &Tensor)> {
        weights_of(&["moving_mean", "moving_variance"], &self.moving)
    }

    fn set_non_trainable_weight(&mut self, index: usize, value: Tensor) -> Result<()> {
        replace("BatchNormalization", &mut self.moving, index, value)
    }

    fn forward(&self, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        self.call(x, true)
    }

    /// Training: the batch statistics normalize, the moving statistics are updated in place on
    /// the layer's device; `[x, statistics]` are kept for the backward pass. Inference: the
    /// moving statistics normalize, nothing is kept.
    fn call(&self, x: &Tensor, training: bool) -> Result<(Tensor, Vec<Tensor>)> {
        let v = self.variables()?;
        if !training {
            let y = ops::batch_normalization_inference(x, v, self.epsilon)?;
            return Ok((y, Vec::new()));
        }
        if let Some((group, index)) = self.sync_group()? {
            return self.call_synchronized(x, v, (&group, index));
        }
        let (y, stats) = ops::batch_normalization_training(x, v, self.momentum, self.epsilon)?;
        Ok((y, vec![x.clone(), stats]))
    }

    /// A `ReLU()` after the layer runs in its passes (TensorFlow's `_FusedBatchNormEx`): the
    /// normalized values go through the ReLU as they are written, and the backward pass
    /// recomputes where they were positive from `x` (kept anyway), so neither the ReLU's own
    /// pass nor its gradient's runs. Not for synchronized batch normalization.
    fn call_with_activation(
        &self,
        x: &Tensor,
        act: ActivationFn,
        training: bool,
    ) -> Result<Option<(Tensor, Vec<Tensor>)>> {
        if act != ActivationFn::RELU || self.synchronized {
            return Ok(None);
        }
        let v = self.variables()?;
        if !training {
            let y = ops::batch_normalization_relu_inference(x, v, self.epsilon)?;
            return Ok(Some((y, Vec::new())));
        }
        let (y, stats) = ops::batch_normalization_relu_training(x, v, self.momentum, self.epsilon)?;
        Ok(Some((y, vec![x.clone(), stats])))
    }

    fn backward_with_activation(
        &self,
        saved_tensors: &[Tensor],
        dy: &Tensor,
        act: ActivationFn,
        need_dx: bool,
    ) -> Result<Option<(Option<Tensor>, Vec<Tensor>)>> {
        let op = ops::batch_normalization_relu_backward;
        self.relu_backward(saved_tensors, (dy, act), need_dx, op)
    }

    /// On the CPU, in float32, with a ReLU: the statistics, and the moving statistics'
    /// update, of [`call_with_activation`](Layer::call_with_activation)'s training pass; the
    /// layer after the ReLU normalizes as it reads `x`. Keeps what that pass keeps.
    fn call_with_activation_deferred(
        &self,
        x: &Tensor,
        act: ActivationFn,
    ) -> Result<Option<(DeferredNormalization, Vec<Tensor>)>> {
        if !self.fused_on_cpu(act, x) {
            return Ok(None);
        }
        let v = self.variables()?;
        let stats =
            ops::batch_normalization_statistics_training(x, v, self.momentum, self.epsilon)?;
        let deferred = DeferredNormalization {
            z: x.clone(),
            gamma: v.gamma.clone(),
            beta: v.beta.clone(),
            stats: stats.clone(),
        };
        Ok(Some((deferred, vec![x.clone(), stats])))
    }

    /// On the CPU, in float32, with a ReLU.
    fn call_with_activation_and_mean(
        &self,
        x: &Tensor,
        act: ActivationFn,
        training: bool,
    ) -> Result<Option<(Tensor, Vec<Tensor>)>> {
        if !self.fused_on_cpu(act, x) || x.rank() != 4 {
            return Ok(None);
        }
        let v = self.variables()?;
        if !training {
            let pooled = ops::batch_normalization_relu_mean_inference(x, v, self.epsilon)?;
            return Ok(Some((pooled, Vec::new())));
        }
        let (pooled, stats) =
            ops::batch_normalization_relu_mean_training(x, v, self.momentum, self.epsilon)?;
        Ok(Some((pooled, vec![x.clone(), stats])))
    }

    fn backward_with_activation_from_mean(
        &self,
        saved_tensors: &[Tensor],
        dpooled: &Tensor,
        act: ActivationFn,
        need_dx: bool,
    ) -> Result<Option<(Option<Tensor>, Vec<Tensor>)>> {
        let op = ops::batch_normalization_relu_mean_backward;
        self.relu_backward(saved_tensors, (dpooled, act), need_dx, op)
    }

    /// On the CPU, in float32, with a ReLU after the layer and a convolution without
    /// activation before it: the convolution's kernel gradient forms the normalization's input
    /// gradient block by block.
    fn backward_into_stem(
        &self,
        stem: &StemConv,
        stem_input: &Tensor,
        saved_tensors: &[Tensor],
        dy: &Tensor,
        act: ActivationFn,
    ) -> Result<Option<(Vec<Tensor>, Vec<Tensor>)>> {
        if !self.fused_on_cpu(act, dy) || stem.activation != OpActivation::Linear {
            return Ok(None);
        }
        let [z, stats] = saved::<2>("BatchNormalization", saved_tensors)?;
        let (gamma, beta) = self.gamma_beta()?;
        let bn = ops::NormalizedOutput {
            z: &z,
            dy,
            gamma,
            relu_beta: Some(beta),
            stats: &stats,
        };
        let k = stem.kernel.shape();
        let (dk, db, dgamma, dbeta) = ops::conv2d_backward_weights_normalized(
            stem_input,
            bn,
            k,
            stem.bias.is_some(),
            stem.options,
        )?;
        let stem_grads = [Some(dk), db].into_iter().flatten().collect();
        Ok(Some((stem_grads, self.trained_grads(dgamma, dbeta))))
    }

    fn backward(
        &self,
        saved_tensors: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Vec<Tensor>)> {
        let (dx, dgamma, dbeta) = if saved_tensors.len() == 4 {
            let group = self.sync_group()?.ok_or_else(|| {
                Error::Model(
                    "BatchNormalization(synchronized=True): the backward pass runs outside the \
                     mirrored step whose forward pass it follows"
                        .into(),
                )
            })?;
            let saved = saved::<4>("BatchNormalization", saved_tensors)?;
            self.backward_synchronized(saved, dy, (&group.0, group.1))?
        } else {
            let [x, stats] = saved::<2>("BatchNormalization", saved_tensors)?;
            let (gamma, _) = self.gamma_beta()?;
            ops::batch_normalization_backward(&x, dy, gamma, &stats, self.epsilon)?
        };
        Ok((need_dx.then_some(dx), self.trained_grads(dgamma, dbeta)))
    }
}

// ---------------------------------------------------------------------------------------------

/// Inverted dropout (`keras.layers.Dropout(rate, seed=None)`): in training each element is
/// zeroed with probability `rate` and the others are scaled by `1 / (1 - rate)`; in inference
/// (and with `rate = 0`) the identity.
///
/// The mask is a counter-based hash of (seed, step, element index) (see
/// [`DropoutMask`]): the same seed draws the same masks on CPU:0 and every GPU, in every run,
/// and each training step draws a new one (the layer counts its training calls). Without a
/// seed the layer takes one from the model's seed and its index
/// ([`crate::nn::Sequential::with_seed`]). The backward pass applies the forward pass's mask.
///
/// ```
/// use anygpu::nn::{Dropout, Layer};
/// assert_eq!(Dropout::new(0.5).compute_output_shape(&[128])?, [128]);
/// assert!(Dropout::new(1.0).compute_output_shape(&[128]).is_err());
/// # Ok::<(), anygpu::Error>(())
/// ```
///
/// Differences from Keras: no `noise_shape`; `rate=1` (everything dropped) is refused; the
/// random stream is not TensorFlow's, so masks differ from Keras' for the same seed; the step
/// counter is not part of checkpoints (a resumed run draws the masks of a fresh layer).
#[derive(Debug)]
pub struct Dropout {
    rate: f32,
    seed: Option<u64>,
    /// The seed `build` derived from the model's, used without `seed`.
    model_seed: u64,
    input_shape: Option<Vec<usize>>,
    policy: Option<Policy>,
    /// Training calls so far: the mask's step.
    step: AtomicU64,
}

impl Clone for Dropout {
    fn clone(&self) -> Self {
        Dropout {
            rate: self.rate,
            seed: self.seed,
            model_seed: self.model_seed,
            input_shape: self.input_shape.clone(),
            policy: self.policy,
            // Its own counter, from where this one is: a replica draws the primary's masks.
            step: AtomicU64::new(self.step.load(Ordering::Relaxed)),
        }
    }
}

impl Dropout {
    /// Drops a `rate` fraction of the elements in training (`0 <= rate < 1`, checked when the
    /// layer is added).
    pub fn new(rate: f32) -> Dropout {
        Dropout {
            rate,
            seed: None,
            model_seed: 0,
            input_shape: None,
            policy: None,
            step: AtomicU64::new(0),
        }
    }

    /// `seed=`: the masks' seed.
    pub fn seed(mut self, seed: u64) -> Dropout {
        self.seed = Some(seed);
        self
    }

    /// `input_shape=`, for the first layer of a model.
    pub fn input_shape(mut self, shape: &[usize]) -> Dropout {
        self.input_shape = Some(shape.to_vec());
        self
    }

    /// `dtype=`: this layer's dtype policy, whatever the global one.
    pub fn dtype_policy(mut self, policy: Policy) -> Dropout {
        self.policy = Some(policy);
        self
    }

    /// The rate.
    pub fn rate(&self) -> f32 {
        self.rate
    }

    /// Training calls so far (the step of the next mask).
    pub fn steps(&self) -> u64 {
        self.step.load(Ordering::Relaxed)
    }

    fn check_rate(&self) -> Result<()> {
        if !(self.rate.is_finite() && (0.0..1.0).contains(&self.rate)) {
            return Err(Error::InvalidArgument(format!(
                "Dropout: invalid value received for argument `rate`. Expected a float value \
                 in [0, 1). Received: rate={}",
                self.rate
            )));
        }
        Ok(())
    }
}

impl Layer for Dropout {
    fn dtype_policy(&self) -> Option<Policy> {
        self.policy
    }

    fn boxed_clone(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }

    fn get_config(&self) -> Option<serde_json::Value> {
        let mut c = serde_json::Map::new();
        c.insert("rate".into(), layer_config::num(self.rate));
        c.insert("seed".into(), self.seed.into());
        c.insert("noise_shape".into(), serde_json::Value::Null);
        Some(layer_config::with_dtype(c, self.policy))
    }

    fn class_name(&self) -> &'static str {
        "Dropout"
    }

    fn base_name(&self) -> &'static str {
        "dropout"
    }

    fn declared_input_shape(&self) -> Option<&[usize]> {
        self.input_shape.as_deref()
    }

    fn compute_output_shape(&self, input_shape: &[usize]) -> Result<Vec<usize>> {
        self.check_rate()?;
        Ok(input_shape.to_vec())
    }

    fn build(&mut self, input_shape: &[usize], seed: u64, _device: &LogicalDevice) -> Result<()> {
        self.compute_output_shape(input_shape)?;
        self.model_seed = seed;
        Ok(())
    }

    fn weights(&self) -> Vec<(&'static str, &Tensor)> {
        Vec::new()
    }

    fn set_weight(&mut self, index: usize, value: Tensor) -> Result<()> {
        replace("Dropout", &mut [], index, value)
    }

    fn forward(&self, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        self.call(x, true)
    }

    /// Training: a new mask (kept for the backward pass); inference, or `rate = 0`: `x`.
    fn call(&self, x: &Tensor, training: bool) -> Result<(Tensor, Vec<Tensor>)> {
        if !training || self.rate == 0.0 {
            return Ok((x.clone(), Vec::new()));
        }
        self.check_rate()?;
        let step = self.step.fetch_add(1, Ordering::Relaxed);
        let mask = DropoutMask::new(self.rate, self.seed.unwrap_or(self.model_seed), step);
        let (y, mask) = ops::dropout(x, &mask)?;
        Ok((y, vec![mask]))
    }

    fn backward(
        &self,
        saved_tensors: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Vec<Tensor>)> {
        if !need_dx {
            return Ok((None, Vec::new()));
        }
        let dx = match saved_tensors {
            // The identity (rate 0).
            [] => dy.clone(),
            [mask] => ops::dropout_backward(dy, mask)?,
            _ => {
                return Err(Error::Model(format!(
                    "Dropout.backward: expected at most 1 saved tensor from forward, got {}",
                    saved_tensors.len()
                )))
            }
        };
        Ok((Some(dx), Vec::new()))
    }
}
