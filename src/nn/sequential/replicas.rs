//! The model's layers as the passes see them: the primary replica's stages (layer, device,
//! compute dtype), every replica's layers for passes that update nothing, every replica's view
//! for a training step, and a replica's weights.

use crate::error::{Error, Result};
use crate::mixed_precision::Policy;
use crate::nn::layers::variables;
use crate::nn::mirrored::ReplicaView;
use crate::nn::pass::Stage;

use super::Sequential;

impl Sequential {
    /// The primary replica's layers with their devices (the whole model when not mirrored).
    pub(in crate::nn) fn stages(&self) -> Vec<Stage<'_>> {
        self.entries
            .iter()
            .map(|e| Stage {
                layer: e.layer.as_ref(),
                device: &e.device,
                dtype: e.policy.compute_dtype_on(&e.device),
            })
            .collect()
    }

    /// Host copies of the weights of replica `replica` (0 is the primary, as
    /// [`get_weights`](Sequential::get_weights)); they equal the primary's bit for bit after
    /// every step.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a replica the model does not have; device errors.
    pub fn replica_weights(&self, replica: usize) -> Result<Vec<Vec<f32>>> {
        if replica == 0 {
            return self.get_weights();
        }
        let mirror = self
            .mirrors
            .as_ref()
            .and_then(|m| m.replicas.get(replica - 1))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "replica {replica}: the model has {} replica(s)",
                    self.mirrors.as_ref().map_or(1, |m| m.replicas.len() + 1)
                ))
            })?;
        mirror
            .layers
            .iter()
            .flat_map(|l| {
                variables(l.as_ref())
                    .into_iter()
                    .map(|(_, t)| t.to_vec::<f32>())
            })
            .collect()
    }

    /// Every replica's layers, the primary first, for passes that update nothing.
    pub(in crate::nn) fn replica_layers(&self) -> Vec<ReplicaView<'_>> {
        let Some(first) = self.entries.first() else {
            return Vec::new();
        };
        let policies: Vec<Policy> = self.entries.iter().map(|e| e.policy).collect();
        let mut views = vec![ReplicaView {
            device: &first.device,
            layers: self.entries.iter().map(|e| e.layer.as_ref()).collect(),
            policies: policies.clone(),
            optimizer: None,
        }];
        if let Some(m) = &self.mirrors {
            views.extend(m.replicas.iter().map(|r| ReplicaView {
                device: &r.device,
                layers: r.layers.iter().map(AsRef::as_ref).collect(),
                policies: policies.clone(),
                optimizer: None,
            }));
        }
        views
    }

    /// Every replica as a training step sees it, the primary first.
    pub(super) fn replica_views(&mut self) -> Vec<ReplicaView<'_>> {
        let primary_device = match self.entries.first() {
            Some(e) => &e.device,
            None => return Vec::new(),
        };
        let policies: Vec<Policy> = self.entries.iter().map(|e| e.policy).collect();
        let mut views = vec![ReplicaView {
            device: primary_device,
            layers: self.entries.iter().map(|e| e.layer.as_ref()).collect(),
            policies: policies.clone(),
            optimizer: self.compiled.as_mut().map(|c| &mut c.optimizer),
        }];
        if let Some(m) = self.mirrors.as_mut() {
            views.extend(m.replicas.iter_mut().map(|r| ReplicaView {
                device: &r.device,
                layers: r.layers.iter().map(AsRef::as_ref).collect(),
                policies: policies.clone(),
                optimizer: r.optimizer.as_mut(),
            }));
        }
        views
    }
}
