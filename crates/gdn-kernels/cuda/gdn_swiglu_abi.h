/* The project's C ABI over the fused gate/up projection + SwiGLU of the MLP:
 * quack-kernels 0.6.5's SM90 GEMM with its SwiGLU epilogue, exported ahead of
 * time with the CuTe DSL (generator/cute_dsl/quack_swiglu.py, unit
 * dsl_quack_sm90). The generated header, its tensor structs and the
 * cute_dsl_gdn_quack_swiglu_sm90_wrapper name stay inside gdn_swiglu_abi.cpp.
 *
 *   output[m, j] = silu(g) * u,  g = x[m, :] . w[j, :],  u = x[m, :] . w[n/2 + j, :]
 *
 * x bf16 [m, k] (row stride x_stride elements), w bf16 [n, k] dense (rows
 * [0, n/2) the gate projection, [n/2, n) the up projection: one
 * [W_gate; W_up] tensor), output bf16 [m, n/2] (row stride output_stride).
 * fp32 accumulation; g and u stay fp32 through the activation (sigmoid with
 * the hardware's approximate exp2 and reciprocal) and the product is rounded
 * to bf16 once. The kernel's TMA loads need 16-byte aligned pointers, k, n/2
 * and both strides multiples of 8 elements, and every extent below 2^31.
 * sm_90a only: gdn_swiglu_load fails on any other GPU.
 *
 * Status codes are gdn_abi.h's gdn_status.
 */
#ifndef GDN_SWIGLU_ABI_H
#define GDN_SWIGLU_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GDN_SWIGLU_ABI_VERSION 1u

typedef struct gdn_swiglu_gemm_args {
  uint32_t abi_version; /* = GDN_SWIGLU_ABI_VERSION */
  uint32_t struct_size; /* = sizeof(gdn_swiglu_gemm_args) */
  void* output;         /* bf16 [m, n/2] */
  const void* x;        /* bf16 [m, k] */
  const void* w;        /* bf16 [n, k]: gate rows, then up rows */
  int64_t m;
  int64_t n; /* gate + up rows: twice the output width */
  int64_t k;
  int64_t x_stride;      /* elements between rows of x, >= k */
  int64_t output_stride; /* elements between rows of output, >= n/2 */
  /* Persistent scheduler: clusters of 2 CTAs resident at once (half the SM
   * count on an H200: one 2-CTA cluster per SM pair). */
  int32_t max_active_clusters;
  int32_t reserved; /* 0 */
  void* stream;     /* cudaStream_t */
} gdn_swiglu_gemm_args;

uint32_t gdn_swiglu_abi_version(void);

/* Loads the kernel on every device (reference counted, as gdn_dsl_load). */
int32_t gdn_swiglu_load(void);
int32_t gdn_swiglu_unload(void);

/* Enqueues one fused gate/up + SwiGLU on args->stream. */
int32_t gdn_swiglu_gemm(const gdn_swiglu_gemm_args* args);

/* Detail of the last failure on this thread (static storage, never NULL). */
const char* gdn_swiglu_last_error(void);

/* offsetof() of every gdn_swiglu_gemm_args field in declaration order, then
 * sizeof(gdn_swiglu_gemm_args). */
extern const uint64_t gdn_swiglu_gemm_args_layout[14];

#ifdef __cplusplus
}
#endif

#endif /* GDN_SWIGLU_ABI_H */
