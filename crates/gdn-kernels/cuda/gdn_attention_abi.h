/* The project's stable C ABI for FlashInfer's SM90 (FA3) paged prefill
 * attention, as the bundle ships it: head dim 256, bf16 q/k/v/o, causal
 * (bottom-right aligned: query i of a sequence with qo_len queries and kv_len
 * keys sees keys 0..kv_len - qo_len + i), NHD pages, default variant (no
 * soft cap, no sliding window).
 *
 * Like gdn_abi.h: plain pointers, fixed-width integers, status codes; the
 * argument struct starts with its ABI version and its own size.
 *
 * Tensor contract:
 *   q            bf16 device [total_q, num_qo_heads, 256], contiguous
 *   out          bf16 device [total_q, num_qo_heads, 256], contiguous, not overlapping q
 *   k_cache,
 *   v_cache      bf16 device [num_pages, page_size, num_kv_heads, 256] each
 *   block_table  int32 device [num_seqs, max_blocks]: sequence s's page j holds
 *                its keys j * page_size .. (j + 1) * page_size
 *   qo_indptr    int32 HOST [num_seqs + 1]: sequence s's queries are rows
 *                qo_indptr[s] .. qo_indptr[s + 1] of q and out
 *   kv_len       int32 HOST [num_seqs]: keys of sequence s (>= its query count)
 *   workspace    device, gdn_attention_sm90_workspace_bytes() bytes, private to
 *                the stream until the launch has run (the schedule is copied
 *                into it on the stream, then read by the kernel)
 * The call plans the schedule on the host (FlashInfer's PrefillSM90Plan over
 * the current device's SM count), copies it on args->stream from pageable
 * host memory (staged: the call's host memory is free when it returns) and
 * enqueues the kernel. Not for CUDA graph capture (the schedule is baked per
 * call).
 */
#ifndef GDN_ATTENTION_ABI_H
#define GDN_ATTENTION_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GDN_ATTENTION_ABI_VERSION 1u
#define GDN_ATTENTION_HEAD_DIM 256
/* Query rows per CTA tile of the head-dim-256 kernel (FlashInfer's CTA_Q). */
#define GDN_ATTENTION_CTA_Q 128
/* Work items per head above which FlashInfer's plan switches to the
 * same-schedule-for-all-heads kernel, which the bundle does not ship:
 * ceil(total_q / 128) + num_seqs - 1 must not exceed this. */
#define GDN_ATTENTION_MAX_WORKS_PER_HEAD 4096

/* Status codes: the same meanings as gdn_abi.h's gdn_status. */
typedef struct gdn_attention_args {
  uint32_t abi_version; /* = GDN_ATTENTION_ABI_VERSION */
  uint32_t struct_size; /* = sizeof(gdn_attention_args) */
  void* out;
  const void* q;
  const void* k_cache;
  const void* v_cache;
  const int32_t* block_table;
  const int32_t* qo_indptr;
  const int32_t* kv_len;
  void* workspace;
  uint64_t workspace_bytes;
  int32_t num_seqs;
  int32_t num_qo_heads;
  int32_t num_kv_heads;
  int32_t page_size;
  int32_t max_blocks;
  float sm_scale;
  void* stream; /* cudaStream_t; NULL is the legacy default stream */
} gdn_attention_args;

/* GDN_ATTENTION_ABI_VERSION of the launcher that was linked. */
uint32_t gdn_attention_abi_version(void);

/* Workspace bytes for a launch of total_q queries in num_seqs sequences over
 * num_qo_heads heads on a device of sm_count multiprocessors (0: bad input). */
uint64_t gdn_attention_sm90_workspace_bytes(int64_t total_q, int32_t num_seqs,
                                            int32_t num_qo_heads, int32_t sm_count);

/* Plans and enqueues one causal paged prefill on args->stream. Returns a
 * gdn_status; gdn_attention_last_error() says why on failure. */
int32_t gdn_attention_sm90(const gdn_attention_args* args);

/* Detail of the last failure on this thread (static storage, never NULL). */
const char* gdn_attention_last_error(void);

/* offsetof() of every gdn_attention_args field in declaration order, then
 * sizeof(gdn_attention_args). */
extern const uint64_t gdn_attention_args_layout[18];

#ifdef __cplusplus
}
#endif

#endif /* GDN_ATTENTION_ABI_H */
