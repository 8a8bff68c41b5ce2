//! The pipelined training step's setting ([`Sequential::set_pipeline`]) and entry; the
//! micro-batch programs and the stage threads are `nn/pipeline.rs`.

use crate::error::{Error, Result};
use crate::nn::objective::Objective;
use crate::nn::pipeline::{self, Examples, Pipeline, PipelineGradients, StageStats};

use super::Sequential;

impl Sequential {
    /// The pipelined forward, loss and backward (see [`Pipeline`]); keeps the stages' figures.
    pub(super) fn pipelined(
        &mut self,
        p: Pipeline,
        examples: Examples<'_>,
        loss: (&Objective, f32),
    ) -> Result<PipelineGradients> {
        let out = pipeline::gradients(p, &self.stages(), examples, loss)?;
        self.pipeline_stats.clone_from(&out.stats);
        Ok(out)
    }

    /// Trains with micro-batches pipelined through the model's stages (see [`Pipeline`]) from
    /// the next step on; `None` goes back to the serial step. Only training steps are
    /// pipelined (`fit`, [`train_step`](Sequential::train_step),
    /// [`loss_and_gradients`](Sequential::loss_and_gradients)); `evaluate` and `predict` run
    /// each batch through the layers in turn.
    ///
    /// ```
    /// use anygpu::nn::{Dense, Pipeline, Sequential};
    /// let mut model = Sequential::new();
    /// model.add(Dense::new(2).input_shape(&[3]))?;
    /// model.set_pipeline(Pipeline::gpipe(4))?;
    /// assert_eq!(model.pipeline(), Some(Pipeline::gpipe(4)));
    /// assert!(model.set_pipeline(Pipeline::gpipe(0)).is_err());
    /// model.set_pipeline(None)?;
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 micro-batches, or for a model created under a
    /// [`MirroredStrategy`](crate::distribute::MirroredStrategy) (its replicas each hold the
    /// whole model: there is nothing to pipeline). The setting is unchanged on error.
    pub fn set_pipeline(&mut self, pipeline: impl Into<Option<Pipeline>>) -> Result<()> {
        let pipeline = pipeline.into();
        if let Some(p) = &pipeline {
            p.validate()?;
            if let Some(strategy) = self.strategy() {
                return Err(Error::InvalidArgument(format!(
                    "set_pipeline: this model is mirrored by a MirroredStrategy over {:?}, which \
                     runs the whole model on every replica; pipelining needs a model split over \
                     devices",
                    strategy
                        .devices()
                        .iter()
                        .map(|d| d.name())
                        .collect::<Vec<_>>()
                )));
            }
        }
        self.pipeline = pipeline;
        Ok(())
    }

    /// The pipeline training steps use, if any ([`set_pipeline`](Sequential::set_pipeline)).
    pub fn pipeline(&self) -> Option<Pipeline> {
        self.pipeline
    }

    /// What each stage did in the last pipelined step, first stage first (empty before one):
    /// its layers, device, and host time busy and waiting. The stages' busy times show their
    /// imbalance; the waits, the bubble.
    pub fn pipeline_stats(&self) -> &[StageStats] {
        &self.pipeline_stats
    }
}
