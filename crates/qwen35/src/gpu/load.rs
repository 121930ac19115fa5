//! Where the GPU model's weights come from: a checkpoint (uploaded once
//! through pinned staging buffers, bf16 matrices, f32 vectors) or, for
//! benchmarks of full-size models without a checkpoint, deterministic
//! random values generated on the device.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use gdn_kernels::ModelOps;
use half::bf16;

use super::upload::Staging;
use crate::error::LoadError;
use crate::experts::ExpertLayout;
use crate::weights::{RawTensor, Weights};

pub(crate) trait WeightSource {
    /// The named tensors, each of its given shape, one after the other in
    /// one bf16 buffer (fused projections; a layer's experts).
    fn stacked(&mut self, parts: &[(&str, Vec<usize>)]) -> Result<CudaSlice<bf16>, LoadError>;
    /// The named `[rows_i, cols]` matrices stacked row-wise into one bf16
    /// matrix (fused projections).
    fn matrix(
        &mut self,
        parts: &[(&str, usize)],
        cols: usize,
    ) -> Result<CudaSlice<bf16>, LoadError> {
        let shaped: Vec<(&str, Vec<usize>)> = parts
            .iter()
            .map(|&(name, rows)| (name, vec![rows, cols]))
            .collect();
        self.stacked(&shaped)
    }
    /// How layer `layer` stores its routed experts (a random source makes
    /// the fused layout's tensors).
    fn expert_layout(&self, layer: usize) -> Result<ExpertLayout, LoadError>;
    /// A tensor of the given shape as a flat f32 vector.
    fn vector(&mut self, name: &str, shape: &[usize]) -> Result<CudaSlice<f32>, LoadError>;
    fn contains(&self, name: &str) -> bool;
}

pub(crate) struct Checkpoint<'a> {
    pub weights: &'a Weights,
    pub stream: Arc<CudaStream>,
    pub staging: Staging,
}

impl WeightSource for Checkpoint<'_> {
    fn stacked(&mut self, parts: &[(&str, Vec<usize>)]) -> Result<CudaSlice<bf16>, LoadError> {
        let raw = parts
            .iter()
            .map(|(name, shape)| self.weights.raw(name, shape))
            .collect::<Result<Vec<RawTensor>, LoadError>>()?;
        let len = raw.iter().map(RawTensor::len).sum();
        // SAFETY: the staging copies write every element before any use
        // (same stream).
        let mut buf = unsafe { self.stream.alloc::<bf16>(len) }?;
        self.staging.upload(&raw, &mut buf)?;
        Ok(buf)
    }
    fn vector(&mut self, name: &str, shape: &[usize]) -> Result<CudaSlice<f32>, LoadError> {
        Ok(self.stream.clone_htod(&self.weights.get(name, shape)?)?)
    }
    fn contains(&self, name: &str) -> bool {
        self.weights.contains(name)
    }
    fn expert_layout(&self, layer: usize) -> Result<ExpertLayout, LoadError> {
        crate::experts::expert_layout(self.weights, layer)
    }
}

/// Random weights: matrices uniform with std 0.02 (HF's initializer range),
/// norm weights 0 (zero-centred norms multiply by 1 + w), the DeltaNet output
/// norm weight 1, A_log 0 and dt_bias 0 (decay exp(-softplus(a))), conv
/// taps uniform in [-0.5, 0.5).
pub(crate) struct Random<'a> {
    pub ops: &'a ModelOps,
    pub seed: u64,
}

fn name_seed(seed: u64, name: &str) -> u64 {
    name.bytes().fold(seed ^ 0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x1000_0000_01b3)
    })
}

impl WeightSource for Random<'_> {
    fn stacked(&mut self, parts: &[(&str, Vec<usize>)]) -> Result<CudaSlice<bf16>, LoadError> {
        let len: usize = parts.iter().map(|p| p.1.iter().product::<usize>()).sum();
        let mut buf = self.ops.stream().alloc_zeros::<bf16>(len)?;
        let seed = name_seed(self.seed, parts[0].0);
        // Uniform in [-a, a) has std a / sqrt(3).
        self.ops
            .fill_uniform_bf16(&mut buf, seed, 0.02 * 3f32.sqrt(), 0.0)?;
        Ok(buf)
    }
    fn vector(&mut self, name: &str, shape: &[usize]) -> Result<CudaSlice<f32>, LoadError> {
        let mut buf = self
            .ops
            .stream()
            .alloc_zeros::<f32>(shape.iter().product())?;
        let seed = name_seed(self.seed, name);
        let (scale, offset) = if name.ends_with("linear_attn.norm.weight") {
            (0.0, 1.0)
        } else if name.ends_with("conv1d.weight") {
            (0.5, 0.0)
        } else {
            (0.0, 0.0)
        };
        self.ops.fill_uniform_f32(&mut buf, seed, scale, offset)?;
        Ok(buf)
    }
    fn contains(&self, _name: &str) -> bool {
        false
    }
    fn expert_layout(&self, _layer: usize) -> Result<ExpertLayout, LoadError> {
        Ok(ExpertLayout::Fused)
    }
}
