//! Dynamic loss scaling decided on the device: the state the kernels keep (the step's flag,
//! the scale's exponent, the counter, the iteration count; see [`ops::loss_scale_state`]) and
//! what the host knows of it.
//!
//! The host never waits for a step's decision. After each step it starts reading a snapshot of
//! the state, and takes the snapshots the device has finished at the next steps, without
//! waiting; so it knows the state exactly as of some earlier step, and how many steps it has
//! not read since. A step's learning rate and Adam bias correction depend on the iteration
//! count (skipped steps do not count), so the host hands the update one rule per count the
//! device may be at — from the known count to the known count plus the unread steps — and the
//! kernel picks its own: Keras' numbers bit for bit. Past [`SCALED_RULES`] unread steps (a host
//! far ahead of its device) the host waits for older snapshots, which is the only wait.

use std::collections::VecDeque;

use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::ops;
use crate::tensor::{PendingWords, Tensor};

use super::state::LossScale;

/// Rules a loss-scaled update may carry: one more than the steps the host may leave unread.
pub(super) use crate::ops::nn_kernels::SCALED_RULES;

/// The loss-scale state as of some step: the exponent of the scale (`base * 2^e`), the finite
/// steps in a row, the applied steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Known {
    pub(super) e: i32,
    pub(super) counter: u64,
    pub(super) iterations: u64,
}

/// The state on a device and what the host knows of it.
pub(super) struct DeviceScale {
    /// Four int32 words on the variables' device.
    pub(super) state: Tensor,
    /// The scale when the state was made: the scale is `base * 2^e`.
    pub(super) base: f32,
    /// The state after the last step whose snapshot the host read.
    known: Known,
    /// The steps recorded on the device so far, and how many of them `known` includes.
    steps: u64,
    known_steps: u64,
    /// Snapshots of the steps after it, oldest first, each with the steps it includes, on
    /// their way to the host (a step that failed after moving the state may have none).
    pending: VecDeque<(u64, PendingWords)>,
}

impl std::fmt::Debug for DeviceScale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceScale")
            .field("state", &self.state)
            .field("base", &self.base)
            .field("known", &self.known)
            .field("unread", &(self.steps - self.known_steps))
            .finish()
    }
}

/// `x * 2^e`, exact for a normal result.
fn ldexp(x: f32, e: i32) -> f32 {
    ops::cpu::loss_scale::ldexp(x, e)
}

impl DeviceScale {
    /// A state on `device` starting at `scale` (its base), `counter` and `iterations`.
    pub(super) fn new(
        device: &LogicalDevice,
        scale: LossScale,
        iterations: u64,
    ) -> Result<DeviceScale> {
        Ok(DeviceScale {
            state: ops::loss_scale_state(device, scale.counter, iterations)?,
            base: scale.scale,
            known: Known {
                e: 0,
                counter: scale.counter,
                iterations,
            },
            steps: 0,
            known_steps: 0,
            pending: VecDeque::new(),
        })
    }

    pub(super) fn device(&self) -> &LogicalDevice {
        self.state.device_handle()
    }

    /// `1 / base`, the inverse scale at exponent 0 (the host path's `1 / scale` then).
    pub(super) fn inverse_base(&self) -> f32 {
        1.0 / self.base
    }

    /// The known iteration count, and the steps recorded since that the host has not read.
    pub(super) fn known_iterations(&self) -> (u64, usize) {
        let unread = self.steps - self.known_steps;
        (
            self.known.iterations,
            usize::try_from(unread).unwrap_or(usize::MAX),
        )
    }

    /// Counts a step whose rules were recorded on the device (before its snapshot is asked
    /// for: a step that fails in between still counts as unread).
    pub(super) fn recorded(&mut self) {
        self.steps += 1;
    }

    /// The state of the words of a snapshot or of the live state, `after` the known one.
    fn decode(&self, words: &[u32]) -> Result<Known> {
        let &[_, e, counter, iterations] = words else {
            return Err(Error::Model(format!(
                "LossScaleOptimizer: the loss-scale state read back {} words, not 4",
                words.len()
            )));
        };
        // The device counts modulo 2^32 from the known count.
        let ahead = iterations.wrapping_sub(self.known.iterations as u32);
        Ok(Known {
            e: e as i32,
            counter: u64::from(counter),
            iterations: self.known.iterations + u64::from(ahead),
        })
    }

    /// The loss scale and counter of `k`.
    pub(super) fn loss_scale(&self, k: Known) -> LossScale {
        LossScale {
            scale: ldexp(self.base, k.e),
            counter: k.counter,
        }
    }

    /// Takes the snapshots the device has finished, oldest first, without waiting. A
    /// snapshot whose read failed is dropped (the error returned); a later one, or the live
    /// state, answers for its steps.
    pub(super) fn poll(&mut self) -> Result<()> {
        while let Some((steps, front)) = self.pending.front_mut() {
            let steps = *steps;
            let words = match front.try_finish() {
                Ok(Some(words)) => words,
                Ok(None) => break,
                Err(e) => {
                    self.pending.pop_front();
                    return Err(e);
                }
            };
            self.pending.pop_front();
            self.known = self.decode(&words)?;
            self.known_steps = steps;
        }
        Ok(())
    }

    /// Waits for the oldest snapshots while more than `unread` steps are unread; reads the
    /// live state when no snapshot is left to bring it down (a step that failed after moving
    /// the state).
    pub(super) fn read_until(&mut self, unread: usize) -> Result<()> {
        let too_many = |d: &Self| d.steps - d.known_steps > unread as u64;
        if !too_many(self) {
            return Ok(());
        }
        let _cause = crate::profiler::WaitCause::enter(
            "LossScaleOptimizer: the host is more steps ahead of the device than an update \
             carries rules for (SCALED_RULES)",
        );
        while too_many(self) {
            let Some((steps, front)) = self.pending.pop_front() else {
                self.known = self.read_now()?;
                self.known_steps = self.steps;
                break;
            };
            let words = front.finish()?;
            self.known = self.decode(&words)?;
            self.known_steps = steps;
        }
        Ok(())
    }

    /// Starts reading a snapshot of the state as the steps recorded so far leave it.
    pub(super) fn snapshot(&mut self) -> Result<()> {
        self.pending
            .push_back((self.steps, self.state.words_begin()?));
        Ok(())
    }

    /// The state now, read from the device (waits for the steps recorded so far).
    pub(super) fn read_now(&self) -> Result<Known> {
        let _cause =
            crate::profiler::WaitCause::enter("LossScaleOptimizer: reading the loss scale");
        let words = self.state.words()?;
        self.decode(&words)
    }
}
