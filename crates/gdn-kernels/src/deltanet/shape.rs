//! The DeltaNet layer's shape, the per-token inputs its conv step produces
//! and the weights its fused decode reads, with the checks its ops share.

use cudarc::driver::CudaSlice;
use half::bf16;

use crate::deltanet::oracle::HEAD_DIM;
use crate::model_ops::{exact, pool};
use crate::shared::batch::DeviceBatch;
use crate::shared::error::{invalid, GdnError, Op};

/// The conv kernels take kernel sizes 2..=MAX_CONV_TAPS + 1.
const MAX_CONV_TAPS: usize = 8;

/// Shape of one Gated DeltaNet layer (head dim 128). Its fused input
/// projection has the columns `[q | k | v | z | b | a]`
/// (see [`DeltaNetShape::proj_width`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetShape {
    pub qk_heads: usize,
    pub v_heads: usize,
    pub conv_kernel: usize,
}

impl DeltaNetShape {
    /// Channels of the causal conv: `[q | k | v]`.
    pub fn conv_dim(&self) -> usize {
        (2 * self.qk_heads + self.v_heads) * HEAD_DIM
    }
    pub fn col_z(&self) -> usize {
        self.conv_dim()
    }
    pub fn col_b(&self) -> usize {
        self.col_z() + self.v_heads * HEAD_DIM
    }
    pub fn col_a(&self) -> usize {
        self.col_b() + self.v_heads
    }
    pub fn proj_width(&self) -> usize {
        self.col_a() + self.v_heads
    }
    /// Elements of one slot's conv state: `[kernel - 1, conv_dim]`.
    pub fn conv_state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
    }
    /// Elements of one slot's recurrent state: `[Hv, 128, 128]`.
    pub fn recurrent_state_len(&self) -> usize {
        self.v_heads * HEAD_DIM * HEAD_DIM
    }
    /// Whether the model kernels support this shape.
    pub fn check(&self) -> Result<(), GdnError> {
        let ok = self.qk_heads > 0
            && self.v_heads % self.qk_heads == 0
            && (2..=MAX_CONV_TAPS + 1).contains(&self.conv_kernel)
            && self.v_heads <= HEAD_DIM;
        ok.then_some(()).ok_or_else(|| {
            invalid(
                Op::DeltaNet,
                "shape",
                format!(
                    "unsupported {self:?} (Hv a multiple of Hqk and <= 128, conv kernel 2..=9)"
                ),
            )
        })
    }
}

/// The DeltaNet per-token inputs the conv step produces and the prefill /
/// decode steps consume.
pub struct DeltaNetInputs {
    /// `[T, Hqk, 128]`, L2-normalised.
    pub q: CudaSlice<bf16>,
    pub k: CudaSlice<bf16>,
    /// `[T, Hv, 128]`.
    pub v: CudaSlice<bf16>,
    /// `[T, Hv]`: linear decay `exp(g)` and write strength `sigmoid(b)`.
    pub alpha: CudaSlice<f32>,
    pub beta: CudaSlice<f32>,
}

/// The weights of one DeltaNet layer that the fused decode reads besides
/// its projection.
#[derive(Clone, Copy)]
pub struct DeltaNetWeights<'a> {
    /// `[conv_dim, conv_kernel]`.
    pub conv: &'a CudaSlice<f32>,
    /// `[Hv]` each.
    pub a_log: &'a CudaSlice<f32>,
    pub dt_bias: &'a CudaSlice<f32>,
    /// `[128]`: the gated output norm's weight.
    pub norm: &'a CudaSlice<f32>,
}

/// Refuses a batch that is not one token per sequence (the decode ops).
pub(crate) fn one_token_per_sequence(op: Op, batch: &DeviceBatch) -> Result<(), GdnError> {
    if batch.num_tokens != batch.num_seqs {
        return Err(invalid(
            op,
            "batch",
            format!(
                "needs one token per sequence, got {} tokens for {} sequences",
                batch.num_tokens, batch.num_seqs
            ),
        ));
    }
    Ok(())
}

/// The conv weight (`[conv_dim, kernel]`), the per-value-head gate
/// parameters of a DeltaNet layer of `shape`, and the conv state pool
/// holding every slot of `batch`.
pub(crate) fn check_conv_and_gates(
    op: Op,
    shape: DeltaNetShape,
    conv_weight: &CudaSlice<f32>,
    a_log: &CudaSlice<f32>,
    dt_bias: &CudaSlice<f32>,
    conv_state: &CudaSlice<bf16>,
    batch: &DeviceBatch,
) -> Result<(), GdnError> {
    pool(
        op,
        "conv_state",
        conv_state.len(),
        shape.conv_state_len(),
        batch.max_slot,
    )?;
    exact(
        op,
        "conv_weight",
        conv_weight.len(),
        shape.conv_dim() * shape.conv_kernel,
    )?;
    exact(op, "a_log", a_log.len(), shape.v_heads)?;
    exact(op, "dt_bias", dt_bias.len(), shape.v_heads)
}

impl DeltaNetInputs {
    /// Every buffer holds `tokens` rows of `shape`'s heads.
    pub(crate) fn check(
        &self,
        op: Op,
        shape: DeltaNetShape,
        tokens: usize,
    ) -> Result<(), GdnError> {
        let (hk, hv) = (shape.qk_heads, shape.v_heads);
        exact(op, "q", self.q.len(), tokens * hk * HEAD_DIM)?;
        exact(op, "k", self.k.len(), tokens * hk * HEAD_DIM)?;
        exact(op, "v", self.v.len(), tokens * hv * HEAD_DIM)?;
        exact(op, "alpha", self.alpha.len(), tokens * hv)?;
        exact(op, "beta", self.beta.len(), tokens * hv)
    }
}
