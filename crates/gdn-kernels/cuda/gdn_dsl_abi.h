/* The project's C ABI over FlashInfer 0.7.2.post1's CuTe DSL GDN prefill
 * kernels (exported ahead of time with export_to_c; see
 * generator/cute_dsl/export_gdn.py). A sibling of gdn_abi.h with its own
 * version: the generated headers, their tensor structs (`gdn_<v>_Tensor_*_t`),
 * module handles and `cute_dsl_gdn_<v>_wrapper` names stay inside
 * gdn_dsl_abi.cpp; callers see only this header.
 *
 * Tensor contract: exactly gdn_abi.h's (bf16 q/k [T, Hqk, 128], v/output
 * [T, Hv, 128]; f32 alpha (linear decay) and beta [T, Hv]; f32 states
 * [N, Hv, 128 (v), 128 (k)]; cu_seqlens [N + 1]), with Hv = r * Hqk, r >= 1.
 * SM100 takes int32 cu_seqlens (cu_seqlens_i32), the others int64.
 *
 * Modules: gdn_dsl_load(kernel) loads every variant of a family on every
 * device (cudaLibraryLoadData through the DSL's dialect runtime) and counts
 * references; gdn_dsl_unload drops one and unloads at zero. A launch of a
 * family that is not loaded is refused. Status codes are gdn_abi.h's.
 */
#ifndef GDN_DSL_ABI_H
#define GDN_DSL_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GDN_DSL_ABI_VERSION 1u

enum gdn_dsl_kernel {
  GDN_DSL_SM90 = 1,    /* delta_rule_sm90, sm_90a */
  GDN_DSL_SM90_CP = 2, /* delta_rule_cp_sm90 (T, MN precompute, fixup, prefill), sm_90a */
  GDN_DSL_SM100 = 3,   /* blackwell gated_delta_net_chunked, sm_100a, 148 SMs and Hqk 16 baked in */
  GDN_DSL_SM120 = 4    /* delta_rule_sm120, sm_120a */
};

typedef struct gdn_dsl_prefill_args {
  uint32_t abi_version; /* = GDN_DSL_ABI_VERSION */
  uint32_t struct_size; /* = sizeof(gdn_dsl_prefill_args) */
  int32_t kernel;       /* enum gdn_dsl_kernel */
  int32_t cp_chunk_len; /* SM90 CP: tokens per context-parallel chunk, a multiple of 64; else 0 */
  void* output;
  float* output_state;
  const void* q;
  const void* k;
  const void* v;
  const float* input_state; /* NULL: start from a zero state */
  const float* alpha;
  const float* beta;
  const int64_t* cu_seqlens;     /* SM90, SM90 CP, SM120 */
  const int32_t* cu_seqlens_i32; /* SM100 */
  void* workspace;               /* gdn_dsl_workspace_bytes(args) bytes, 256-byte aligned */
  uint64_t workspace_bytes;
  int64_t total_tokens;
  int32_t num_seqs;
  int32_t max_seqlen; /* longest sequence (SM90 CP chunk bounds) */
  int32_t num_qk_heads;
  int32_t num_v_heads;
  int32_t sm_count;
  float scale;
  void* stream; /* cudaStream_t */
} gdn_dsl_prefill_args;

uint32_t gdn_dsl_abi_version(void);

/* Workspace the launch needs (depends on kernel, sm_count, heads, and for CP
 * on num_seqs, total_tokens and cp_chunk_len); 0 for invalid arguments. */
uint64_t gdn_dsl_workspace_bytes(const gdn_dsl_prefill_args* args);

/* SM count and Hqk baked into the SM100 kernels (the caller must match them). */
int32_t gdn_dsl_sm100_baked_sm_count(void);
int32_t gdn_dsl_sm100_baked_qk_heads(void);

int32_t gdn_dsl_load(int32_t kernel);
int32_t gdn_dsl_unload(int32_t kernel);

/* Enqueues one prefill on args->stream. Returns a gdn_status of gdn_abi.h. */
int32_t gdn_dsl_prefill(const gdn_dsl_prefill_args* args);

/* Detail of the last failure on this thread (static storage, never NULL). */
const char* gdn_dsl_last_error(void);

/* offsetof() of every gdn_dsl_prefill_args field in declaration order, then
 * sizeof(gdn_dsl_prefill_args). */
extern const uint64_t gdn_dsl_prefill_args_layout[25];

#ifdef __cplusplus
}
#endif

#endif /* GDN_DSL_ABI_H */
