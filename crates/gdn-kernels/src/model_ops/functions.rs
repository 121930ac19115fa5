//! The kernels of the `model_kernels` cubin, by name: one table for the
//! whole unit, loaded once when [`crate::ModelOps`] is made (a kernel the
//! cubin lacks fails there, not mid-step). Each family's ops pick theirs
//! from it.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule};

use crate::shared::error::{During, GdnError, Op};

/// Every kernel of the cubin, grouped by the family whose ops launch it.
pub(crate) struct Functions {
    pub(crate) embedding: CudaFunction,
    pub(crate) add_rmsnorm: CudaFunction,
    pub(crate) add_rmsnorm_vec8: CudaFunction,
    pub(crate) conv_prep: CudaFunction,
    /// The same kernel for 4-tap conv kernels (Qwen3.5's), kw a constant.
    pub(crate) conv_prep_k4: CudaFunction,
    pub(crate) conv_update: CudaFunction,
    pub(crate) decode_step: CudaFunction,
    pub(crate) decode_step_bf16: CudaFunction,
    pub(crate) gated_rmsnorm: CudaFunction,
    /// By blocks per (sequence, value head): 1, 2, 4; f32 and bf16 state.
    pub(crate) decode_fused: [CudaFunction; 3],
    pub(crate) decode_fused_bf16: [CudaFunction; 3],
    pub(crate) attn_prep: CudaFunction,
    /// By head dim 32, 64, 128, 256: one token per block (decode) and
    /// tensor-core query tiles (prefill).
    pub(crate) attention: [CudaFunction; 4],
    /// The same decode kernels for GQA groups <= 4 (half the registers).
    pub(crate) attention_g4: [CudaFunction; 4],
    pub(crate) attention_prefill: [CudaFunction; 4],
    /// The tensor-core decode with 2 and 3 tiles in flight per warp.
    pub(crate) attention_decode_tc: [CudaFunction; 2],
    pub(crate) attention_combine: CudaFunction,
    pub(crate) attention_gate: CudaFunction,
    pub(crate) silu_mul: CudaFunction,
    pub(crate) copy_f32: CudaFunction,
    pub(crate) copy_bf16: CudaFunction,
    /// A bf16 state's slots to an f32 packed batch and back.
    pub(crate) widen_bf16: CudaFunction,
    pub(crate) narrow_f32: CudaFunction,
    pub(crate) fill_bf16: CudaFunction,
    pub(crate) fill_f32: CudaFunction,
    pub(crate) moe: MoeFunctions,
}

/// The routed experts' kernels (`moe/ops.rs`).
pub(crate) struct MoeFunctions {
    pub(crate) topk_softmax: CudaFunction,
    pub(crate) route: CudaFunction,
    pub(crate) gemv_gate_up: CudaFunction,
    pub(crate) gemv_down: CudaFunction,
    pub(crate) gemv_mma_gate_up: CudaFunction,
    pub(crate) gemv_mma_down: CudaFunction,
    pub(crate) gemm_gate_up: CudaFunction,
    pub(crate) gemm_down: CudaFunction,
    pub(crate) combine: CudaFunction,
    pub(crate) direct_gate_up: CudaFunction,
    pub(crate) direct_down_combine: CudaFunction,
}

impl Functions {
    /// Every kernel of the unit from `module`, in the order the table lists
    /// them (the first one missing is the error).
    pub(crate) fn load(module: &Arc<CudaModule>) -> Result<Self, GdnError> {
        const OP: Op = Op::ModelKernels;
        let l = |name: &str| module.load_function(name).during(OP);
        Ok(Functions {
            embedding: l("embedding_bf16")?,
            add_rmsnorm: l("add_rmsnorm_bf16")?,
            add_rmsnorm_vec8: l("add_rmsnorm_vec8_bf16")?,
            conv_prep: l("gdn_conv_prep")?,
            conv_prep_k4: l("gdn_conv_prep_k4")?,
            conv_update: l("gdn_conv_state_update")?,
            decode_step: l("gdn_decode_step")?,
            decode_step_bf16: l("gdn_decode_step_bf16")?,
            gated_rmsnorm: l("gated_rmsnorm_bf16")?,
            decode_fused: [
                l("gdn_decode_fused_s1")?,
                l("gdn_decode_fused_s2")?,
                l("gdn_decode_fused_s4")?,
            ],
            decode_fused_bf16: [
                l("gdn_decode_fused_bf16_s1")?,
                l("gdn_decode_fused_bf16_s2")?,
                l("gdn_decode_fused_bf16_s4")?,
            ],
            attn_prep: l("attn_prep")?,
            attention: [
                l("attention_d1")?,
                l("attention_d2")?,
                l("attention_d4")?,
                l("attention_d8")?,
            ],
            attention_g4: [
                l("attention_g4_d1")?,
                l("attention_g4_d2")?,
                l("attention_g4_d4")?,
                l("attention_g4_d8")?,
            ],
            attention_decode_tc: [l("attention_decode_tc_s2")?, l("attention_decode_tc_s3")?],
            attention_combine: l("attention_combine")?,
            attention_gate: l("attention_gate_bf16")?,
            attention_prefill: [
                l("attention_prefill_d32")?,
                l("attention_prefill_d64")?,
                l("attention_prefill_d128")?,
                l("attention_prefill_d256")?,
            ],
            silu_mul: l("silu_mul_bf16")?,
            copy_f32: l("copy_rows_f32")?,
            copy_bf16: l("copy_rows_bf16")?,
            widen_bf16: l("copy_rows_bf16_to_f32")?,
            narrow_f32: l("copy_rows_f32_to_bf16")?,
            fill_bf16: l("fill_uniform_bf16")?,
            fill_f32: l("fill_uniform_f32")?,
            moe: MoeFunctions {
                topk_softmax: l("moe_topk_softmax")?,
                route: l("moe_route")?,
                gemv_gate_up: l("moe_gemv_gate_up")?,
                gemv_down: l("moe_gemv_down")?,
                gemv_mma_gate_up: l("moe_gemv_mma_gate_up")?,
                gemv_mma_down: l("moe_gemv_mma_down")?,
                gemm_gate_up: l("moe_gemm_gate_up")?,
                gemm_down: l("moe_gemm_down")?,
                combine: l("moe_combine")?,
                direct_gate_up: l("moe_direct_gate_up")?,
                direct_down_combine: l("moe_direct_down_combine")?,
            },
        })
    }
}
