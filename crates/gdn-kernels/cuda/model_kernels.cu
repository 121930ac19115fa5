// The Qwen3.5 model kernels around the GEMMs and the GDN prefill: embedding,
// norms, the DeltaNet conv/gate/decode steps, attention over a paged KV cache,
// the routed experts of the MoE layers.
// Compiled ahead of time into plain cubins (sm_80 .. sm_120, no PTX), loaded
// with cuModuleLoadData and launched by name from src/model_ops/, which owns
// every launch geometry and checks every buffer length before launching.
//
// Numerics follow Hugging Face's bf16 forward (transformers 5.17,
// modeling_qwen3_5.py): activations are stored in bf16 wherever HF stores
// them, arithmetic inside a kernel is fp32, recurrent state is fp32 (or, as
// a setting, stored in bf16 with fp32 math: see StateIo). No fast
// math: RoPE angles of positions > 4096 need the precise sinf/cosf.
//
// Shared layouts (packed varlen batch of N sequences, T tokens):
//   tok_seq[T]       batch index of each token's sequence
//   cu_seqlens[N+1]  token offsets of the sequences in this batch (int32)
//   seq_slot[N]      state slot of each sequence (recurrent + conv state)
//   positions[T]     absolute position of each token in its sequence
//   block_table[N, max_blocks]  KV-cache page of each page-sized run of positions
//   conv state       bf16 [slots, kw-1, C], oldest input first
//   recurrent state  f32 or bf16 [slots, Hv, 128 (v), 128 (k)], k contiguous (FlashInfer's)
//   KV cache         bf16 [pages, page_size, Hkv, D]

#include <cuda_bf16.h>
#include <mma.h>
#include <cstdint>

// The kernels live in parts of a few hundred lines each, included into one
// translation unit (one cubin; the parts share model_common.cuh's helpers).
#include "model_common.cuh"
#include "model_norms.cuh"
#include "model_deltanet_conv.cuh"
#include "model_deltanet_decode.cuh"
#include "model_attention_prep.cuh"
#include "model_attention.cuh"
#include "model_attention_decode_tc.cuh"
#include "model_elementwise.cuh"
#include "model_moe.cuh"
#include "model_moe_tc.cuh"
