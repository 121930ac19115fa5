/* The project's stable C ABI for the FlashInfer SM90 Gated DeltaNet prefill.
 *
 * This header is the only contract between the host launcher in the bundle and
 * its callers (the gdn-kernels crate). No C++ types cross it: plain pointers,
 * fixed-width integers, integer status codes. Every call takes a pointer to an
 * argument struct that starts with its ABI version and its own size, so an old
 * caller and a new launcher (or the reverse) refuse each other instead of
 * misreading fields.
 *
 * Tensor contract (all device pointers, packed varlen, contiguous):
 *   q, k        bf16  [total_tokens, num_qk_heads, 128]   (already L2-normalised)
 *   v           bf16  [total_tokens, num_v_heads, 128]
 *   output      bf16  [total_tokens, num_v_heads, 128]
 *   alpha, beta fp32  [total_tokens, num_v_heads]          (alpha = exp(g), linear decay)
 *   cu_seqlens  int64 [num_seqs + 1]
 *   input_state fp32  [num_seqs, num_v_heads, 128 (v), 128 (k)] or NULL for zeros
 *   output_state fp32 same shape as input_state; must not overlap input_state
 *   output must not overlap q, k, v or output_state (checked by byte ranges)
 *   workspace   gdn_prefill_sm90_workspace_bytes(sm_count) bytes, private to one stream
 * Geometry: num_v_heads = r * num_qk_heads with r >= 1.
 */
#ifndef GDN_ABI_H
#define GDN_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GDN_ABI_VERSION 1u
#define GDN_HEAD_DIM 128

enum gdn_status {
  GDN_OK = 0,
  GDN_ERR_ABI_VERSION = 1,  /* args->abi_version is not GDN_ABI_VERSION */
  GDN_ERR_STRUCT_SIZE = 2,  /* args->struct_size is not sizeof(gdn_prefill_args) */
  GDN_ERR_NULL_POINTER = 3, /* a required pointer is NULL */
  GDN_ERR_GEOMETRY = 4,     /* head counts, lengths or sm_count out of range */
  GDN_ERR_WORKSPACE = 5,    /* workspace smaller than required */
  GDN_ERR_KERNEL = 6,       /* the CUTLASS operation refused or failed to launch */
  GDN_ERR_UNKNOWN = 7       /* any other C++ exception */
};

typedef struct gdn_prefill_args {
  uint32_t abi_version; /* = GDN_ABI_VERSION */
  uint32_t struct_size; /* = sizeof(gdn_prefill_args) */
  void* output;
  float* output_state;
  const void* q;
  const void* k;
  const void* v;
  const float* input_state; /* NULL: start from a zero state */
  const float* alpha;
  const float* beta;
  const int64_t* cu_seqlens;
  void* workspace;
  uint64_t workspace_bytes;
  int64_t total_tokens;
  int32_t num_seqs;
  int32_t num_qk_heads;
  int32_t num_v_heads;
  int32_t sm_count;
  float scale;
  uint32_t reserved; /* must be 0 */
  void* stream;      /* cudaStream_t; NULL is the legacy default stream */
} gdn_prefill_args;

/* GDN_ABI_VERSION of the launcher that was linked. */
uint32_t gdn_abi_version(void);

/* Workspace bytes the launch needs for a device with sm_count multiprocessors. */
uint64_t gdn_prefill_sm90_workspace_bytes(int32_t sm_count);

/* Enqueues one prefill on args->stream. Returns a gdn_status. */
int32_t gdn_prefill_sm90(const gdn_prefill_args* args);

/* Detail of the last failure on this thread (static storage, never NULL). */
const char* gdn_last_error(void);

/* offsetof() of every gdn_prefill_args field in declaration order, then
 * sizeof(gdn_prefill_args): lets callers check their bindings field by field. */
extern const uint64_t gdn_prefill_args_layout[22];

#ifdef __cplusplus
}
#endif

#endif /* GDN_ABI_H */
