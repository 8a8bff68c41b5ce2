//! A training step is all or nothing: an error before the update (here an injected failure
//! in one layer's backward pass) leaves every weight, every optimizer slot and the iteration
//! count as they were, on one device and on a model split over two; and a batch of no
//! examples moves nothing, not even SGD's momentum or Adam's moments.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anygpu::nn::{Activation, Adam, Dense, Layer, Loss, Optimizer, Sequential, Sgd};
use anygpu::{Error, LogicalDevice, Result, Runtime, Tensor};

/// A [`Dense`] layer whose backward pass fails while `fail` is set: the stand-in for a device
/// running out of memory half-way through the backward pass.
#[derive(Debug, Clone)]
struct Flaky {
    inner: Dense,
    fail: Arc<AtomicBool>,
}

impl Layer for Flaky {
    fn class_name(&self) -> &'static str {
        self.inner.class_name()
    }
    fn base_name(&self) -> &'static str {
        self.inner.base_name()
    }
    fn activation(&self) -> Activation {
        Layer::activation(&self.inner)
    }
    fn compute_output_shape(&self, input_shape: &[usize]) -> Result<Vec<usize>> {
        self.inner.compute_output_shape(input_shape)
    }
    fn build(&mut self, input_shape: &[usize], seed: u64, device: &LogicalDevice) -> Result<()> {
        self.inner.build(input_shape, seed, device)
    }
    fn weights(&self) -> Vec<(&'static str, &Tensor)> {
        self.inner.weights()
    }
    fn set_weight(&mut self, index: usize, value: Tensor) -> Result<()> {
        self.inner.set_weight(index, value)
    }
    fn forward(&self, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        self.inner.forward(x)
    }
    fn backward(
        &self,
        saved: &[Tensor],
        dy: &Tensor,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Vec<Tensor>)> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(Error::Model("injected: out of memory in backward".into()));
        }
        self.inner.backward(saved, dy, need_dx)
    }
    fn boxed_clone(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }
}

fn cpu_runtime(cpus: usize) -> Runtime {
    common::builder()
        .virtual_cpus(cpus)
        .build()
        .expect("a runtime of virtual CPUs builds")
}

/// Dense(4) on `lower` → Flaky Dense(4) on `lower` → Dense(3, softmax) on `upper`: the
/// failing layer sits below a layer whose backward pass has already run when it fails.
fn model(
    lower: &LogicalDevice,
    upper: &LogicalDevice,
    optimizer: Optimizer,
) -> (Sequential, Arc<AtomicBool>) {
    let fail = Arc::new(AtomicBool::new(false));
    let mut m = Sequential::with_seed(3);
    m.add_on(
        lower,
        Dense::new(4).activation(Activation::Selu).input_shape(&[3]),
    )
    .unwrap();
    m.add_on(
        lower,
        Flaky {
            inner: Dense::new(4).activation(Activation::Selu),
            fail: Arc::clone(&fail),
        },
    )
    .unwrap();
    m.add_on(upper, Dense::new(3).activation(Activation::Softmax))
        .unwrap();
    m.compile(Loss::sparse_categorical_crossentropy(), optimizer, &[])
        .unwrap();
    (m, fail)
}

fn batch(device: &LogicalDevice, rows: usize) -> (Tensor, Tensor) {
    let x = Tensor::from_slice_on(&common::values(rows * 3, 7), &[rows, 3], device).unwrap();
    let labels: Vec<i32> = (0..rows as i32).map(|i| i % 3).collect();
    let y = Tensor::from_slice_on(&labels, &[rows], device).unwrap();
    (x, y)
}

/// Everything a step may change: weights, optimizer slots (by name), iterations.
type State = (Vec<Vec<f32>>, Vec<(String, Vec<f32>)>, u64);

fn state(m: &Sequential) -> State {
    let slots = m
        .optimizer_variables()
        .into_iter()
        .map(|(n, t)| (n, t.to_vec::<f32>().unwrap()))
        .collect();
    (m.get_weights().unwrap(), slots, m.iterations())
}

fn optimizers() -> [Optimizer; 2] {
    [Sgd::new(0.1).momentum(0.9).into(), Adam::new(0.01).into()]
}

fn failed_backward_changes_nothing(lower: &LogicalDevice, upper: &LogicalDevice) {
    for optimizer in optimizers() {
        let (mut m, fail) = model(lower, upper, optimizer);
        let (x, y) = batch(lower, 6);
        m.train_step(&x, &y).unwrap();
        let before = state(&m);
        assert_eq!(before.2, 1);
        assert!(
            !before.1.is_empty(),
            "{optimizer}: the slots exist after one step"
        );

        fail.store(true, Ordering::SeqCst);
        let err = m.train_step(&x, &y).unwrap_err();
        assert!(err.to_string().contains("injected"), "{err}");
        assert_eq!(
            state(&m),
            before,
            "{optimizer}: a step that failed in the backward pass changes no weight, slot or \
             iteration count"
        );

        // And the model still trains as if the failed step never happened.
        fail.store(false, Ordering::SeqCst);
        let (mut twin, _) = model(lower, upper, optimizer);
        twin.train_step(&x, &y).unwrap();
        twin.train_step(&x, &y).unwrap();
        m.train_step(&x, &y).unwrap();
        assert_eq!(state(&m), state(&twin), "{optimizer}");
    }
}

#[test]
fn a_failed_backward_pass_on_one_device_changes_nothing() {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    failed_backward_changes_nothing(&cpu, &cpu);
}

#[test]
fn a_failed_backward_pass_on_the_lower_device_of_a_split_model_changes_nothing() {
    let rt = cpu_runtime(2);
    let (c0, c1) = (rt.device("CPU:0").unwrap(), rt.device("CPU:1").unwrap());
    failed_backward_changes_nothing(&c0, &c1);
}

#[test]
fn an_empty_batch_moves_no_weight_momentum_or_adam_state() {
    let rt = cpu_runtime(1);
    let cpu = rt.cpu().unwrap();
    for optimizer in optimizers() {
        let (mut m, _) = model(&cpu, &cpu, optimizer);
        let (x, y) = batch(&cpu, 4);
        m.train_step(&x, &y).unwrap();
        let before = state(&m);
        let (empty_x, empty_y) = batch(&cpu, 0);
        let out = m.train_step(&empty_x, &empty_y).unwrap();
        assert_eq!(out.batch_size(), 0);
        assert!(
            out.loss().unwrap().is_nan(),
            "the mean loss of no examples is NaN"
        );
        assert_eq!(
            state(&m),
            before,
            "{optimizer}: an empty batch leaves weights, slots and iterations as they were"
        );
        // A misshapen empty batch is still an error.
        let wrong = Tensor::from_slice_on(&[0f32; 0], &[0, 5], &cpu).unwrap();
        assert!(m.train_step(&wrong, &empty_y).is_err());
    }
}
