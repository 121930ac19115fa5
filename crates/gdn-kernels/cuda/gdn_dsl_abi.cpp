// Host wrapper behind gdn_dsl_abi.h: fills the generated CuTe tensor structs
// of FlashInfer 0.7.2.post1's exported GDN kernels and calls their
// cute_dsl_gdn_<variant>_wrapper functions. Views and workspace layouts
// follow FlashInfer's host code, cited per function. Host code only; the
// generated headers come from the bundle build (dsl.header_dir).
#include "gdn_abi.h"
#include "gdn_dsl_abi.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <mutex>

// The last-error state and the load-error hook (before the generated headers).
#include "cute_dsl_host_support.h"

#include "sm90_prefill.h"
#include "sm90_prefill_init.h"
#include "sm90cp_t.h"
#include "sm90cp_mn.h"
#include "sm90cp_fixup_simt8.h"
#include "sm90cp_fixup_simt8_init.h"
#include "sm90cp_fixup_hmma.h"
#include "sm90cp_fixup_hmma_init.h"
#include "sm90cp_prefill.h"
#include "sm90cp_prefill_init.h"
#include "sm100_sm148_h16x16.h"
#include "sm100_sm148_h16x16_init.h"
#include "sm100_sm148_h16x32.h"
#include "sm100_sm148_h16x32_init.h"
#include "sm100_sm148_h16x48.h"
#include "sm100_sm148_h16x48_init.h"
#include "sm120_prefill.h"
#include "sm120_prefill_init.h"

namespace {

constexpr int64_t D = GDN_HEAD_DIM;
constexpr int64_t DD = D * D;
constexpr int32_t kSm100SmCount = 148;  // --sm-count of the dsl_sm100 unit
constexpr int32_t kSm100QkHeads = 16;
constexpr uint64_t kTensormapBytes = 128;  // one TMA descriptor per SM
constexpr uint64_t kAlign = 256;

#define MODULE(V) gdn_##V##_Kernel_Module_t g_mod_##V;
MODULE(sm90_prefill) MODULE(sm90_prefill_init)
MODULE(sm90cp_t) MODULE(sm90cp_mn) MODULE(sm90cp_fixup_simt8) MODULE(sm90cp_fixup_simt8_init)
MODULE(sm90cp_fixup_hmma) MODULE(sm90cp_fixup_hmma_init) MODULE(sm90cp_prefill) MODULE(sm90cp_prefill_init)
MODULE(sm100_sm148_h16x16) MODULE(sm100_sm148_h16x16_init) MODULE(sm100_sm148_h16x32)
MODULE(sm100_sm148_h16x32_init) MODULE(sm100_sm148_h16x48) MODULE(sm100_sm148_h16x48_init)
MODULE(sm120_prefill) MODULE(sm120_prefill_init)
#undef MODULE

std::mutex g_mutex;
int g_refs[5] = {0, 0, 0, 0, 0};

#define LOAD(V) gdn_##V##_Kernel_Module_Load(&g_mod_##V);
#define UNLOAD(V) gdn_##V##_Kernel_Module_Unload(&g_mod_##V);
#define FAMILY(OP, kernel)                                                                   \
  switch (kernel) {                                                                          \
    case GDN_DSL_SM90: OP(sm90_prefill) OP(sm90_prefill_init) break;                         \
    case GDN_DSL_SM90_CP:                                                                    \
      OP(sm90cp_t) OP(sm90cp_mn) OP(sm90cp_fixup_simt8) OP(sm90cp_fixup_simt8_init)          \
      OP(sm90cp_fixup_hmma) OP(sm90cp_fixup_hmma_init) OP(sm90cp_prefill) OP(sm90cp_prefill_init) \
      break;                                                                                 \
    case GDN_DSL_SM100:                                                                      \
      OP(sm100_sm148_h16x16) OP(sm100_sm148_h16x16_init) OP(sm100_sm148_h16x32)              \
      OP(sm100_sm148_h16x32_init) OP(sm100_sm148_h16x48) OP(sm100_sm148_h16x48_init) break;  \
    case GDN_DSL_SM120: OP(sm120_prefill) OP(sm120_prefill_init) break;                      \
    default: break;                                                                          \
  }

bool valid_kernel(int32_t k) { return k >= GDN_DSL_SM90 && k <= GDN_DSL_SM120; }

uint64_t align_up(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// FlashInfer gdn_kernels/delta_rule_dsl/varlen_helper.py: chunk_bound_host,
// an upper bound of the chunks of num_items sequences with total tokens.
int64_t chunk_bound(int64_t num_items, int64_t total, int64_t chunk) {
  const int64_t m = num_items < total ? num_items : total;
  return m + (total - m) / chunk;
}

struct CpLayout {
  int64_t t_blocks, cp_chunks, max_cp_chunks, max_t_blocks;
  uint64_t t_off, transfer_off, local_off, fixed_off, tensormaps_off, total;
};

// FlashInfer delta_rule_cp_sm90.py: T [Tb, Hsab, 64, 64] (input dtype) with
// Tb = workspace_num_chunks_host(cu, 64, T); local transfer, local state and
// fixed state [C, Hsab, 128, 128] f32 with C = workspace_num_chunks_host(cu,
// chunk_len, T); prefill tensormaps SM count x 128 B. Here one workspace, each
// piece 256-byte aligned.
CpLayout cp_layout(const gdn_dsl_prefill_args& a) {
  CpLayout l{};
  const int64_t hs = a.num_v_heads;
  l.t_blocks = chunk_bound(a.num_seqs, a.total_tokens, 64);
  l.cp_chunks = chunk_bound(a.num_seqs, a.total_tokens, a.cp_chunk_len);
  l.max_t_blocks = (a.max_seqlen + 63) / 64;  // max_num_chunks_host
  l.max_cp_chunks = (a.max_seqlen + a.cp_chunk_len - 1) / a.cp_chunk_len;
  const uint64_t state = static_cast<uint64_t>(l.cp_chunks) * hs * DD * sizeof(float);
  l.t_off = 0;
  l.transfer_off = align_up(static_cast<uint64_t>(l.t_blocks) * hs * 64 * 64 * 2);
  l.local_off = l.transfer_off + align_up(state);
  l.fixed_off = l.local_off + align_up(state);
  l.tensormaps_off = l.fixed_off + align_up(state);
  l.total = l.tensormaps_off + kTensormapBytes * static_cast<uint64_t>(a.sm_count);
  return l;
}

bool fits_i32(int64_t x) { return x >= 0 && x <= 0x7fffffff; }

char* at(void* base, uint64_t off) { return static_cast<char*>(base) + off; }

// SM90 / SM120 non-CP: FlashInfer gdn_prefill.py + delta_rule_sm90.py views:
// q (T, D, Hq):(Hq*D, 1, D); k/v/o (D, T, H):(1, H*D, D); alpha/beta flat;
// state (N, Hsab, D, D) contiguous; tensormaps SM count x 128 B; grid_x =
// num_seqs * Hsab is computed inside the exported entry.
#define NONCP_TENSORS(V)                                                                       \
  gdn_##V##_Tensor_q_t q{const_cast<void*>(a.q), {T, (int32_t)D, hq}, {hq * D, D}};            \
  gdn_##V##_Tensor_k_t k{const_cast<void*>(a.k), {(int32_t)D, T, hq}, {hq * D, D}};            \
  gdn_##V##_Tensor_v_t v{const_cast<void*>(a.v), {(int32_t)D, T, hv}, {hv * D, D}};            \
  gdn_##V##_Tensor_o_t o{a.output, {(int32_t)D, T, hv}, {hv * D, D}};                          \
  gdn_##V##_Tensor_alpha_t al{const_cast<float*>(a.alpha), {T * hv}};                          \
  gdn_##V##_Tensor_beta_t be{const_cast<float*>(a.beta), {T * hv}};                            \
  gdn_##V##_Tensor_state_t st{a.output_state, {N, hv, (int32_t)D, (int32_t)D}, {hv * DD, DD, D}}; \
  gdn_##V##_Tensor_tensormaps_t tm{a.workspace, {a.sm_count * (int32_t)kTensormapBytes}};      \
  gdn_##V##_Tensor_cu_seqlens_t cu{const_cast<int64_t*>(a.cu_seqlens), {N + 1}};
#define NONCP_INIT(V)                                                                          \
  gdn_##V##_Tensor_init_state_t is{const_cast<float*>(a.input_state),                         \
                                   {N, hv, (int32_t)D, (int32_t)D}, {hv * DD, DD, D}};

int32_t run_noncp(const gdn_dsl_prefill_args& a, bool sm120) {
  const int32_t T = (int32_t)a.total_tokens, N = a.num_seqs, hq = a.num_qk_heads,
                hv = a.num_v_heads;
  cudaStream_t s = static_cast<cudaStream_t>(a.stream);
  const bool init = a.input_state != nullptr;
  int32_t ret;
#define CALL(V)                                                                                \
  {                                                                                            \
    NONCP_TENSORS(V)                                                                           \
    ret = cute_dsl_gdn_##V##_wrapper(&g_mod_##V, &q, &k, &v, &o, &al, &be, &st, &tm, &cu,      \
                                     a.scale, hq, hq, hv, hv, N, s);                           \
  }
#define CALL_INIT(V)                                                                           \
  {                                                                                            \
    NONCP_TENSORS(V) NONCP_INIT(V)                                                             \
    ret = cute_dsl_gdn_##V##_wrapper(&g_mod_##V, &q, &k, &v, &o, &al, &be, &st, &is, &tm, &cu, \
                                     a.scale, hq, hq, hv, hv, N, s);                           \
  }
  if (!sm120) {
    if (init) CALL_INIT(sm90_prefill_init) else CALL(sm90_prefill)
  } else {
    if (init) CALL_INIT(sm120_prefill_init) else CALL(sm120_prefill)
  }
#undef CALL
#undef CALL_INIT
  return ret;
}

// SM90 context parallel: FlashInfer delta_rule_cp_sm90.py cp_delta_rule_dsl_sm90
// (T precompute -> MN precompute -> fixup -> prefill), with its views:
// t flat for the T kernel and (64, 64, Hsab, Tb):(64, 1, 4096, Hsab*4096)
// after; fixup transfer/local (D, D, H, C):(D, 1, D*D, H*D*D); fixup kind by
// state heads (<= 16: simt rows 8 (<= 8 would be rows 4, not exported); else hmma).
int32_t run_cp(const gdn_dsl_prefill_args& a) {
  const CpLayout l = cp_layout(a);
  const int32_t T = (int32_t)a.total_tokens, N = a.num_seqs, hq = a.num_qk_heads,
                hv = a.num_v_heads, Tb = (int32_t)l.t_blocks, C = (int32_t)l.cp_chunks;
  cudaStream_t s = static_cast<cudaStream_t>(a.stream);
  void* t_ptr = at(a.workspace, l.t_off);
  void* transfer = at(a.workspace, l.transfer_off);
  void* local = at(a.workspace, l.local_off);
  void* fixed = at(a.workspace, l.fixed_off);
  void* tmaps = at(a.workspace, l.tensormaps_off);
  const int32_t state_elems = (int32_t)(l.cp_chunks * hv * DD);
  const bool init = a.input_state != nullptr;
  int32_t ret;
  {
    gdn_sm90cp_t_Tensor_k_t k{const_cast<void*>(a.k), {(int32_t)D, T, hq}, {hq * D, D}};
    gdn_sm90cp_t_Tensor_beta_t be{const_cast<float*>(a.beta), {T * hv}};
    gdn_sm90cp_t_Tensor_t_t t{t_ptr, {Tb * hv * 64 * 64}};
    gdn_sm90cp_t_Tensor_cu_seqlens_t cu{const_cast<int64_t*>(a.cu_seqlens), {N + 1}};
    ret = cute_dsl_gdn_sm90cp_t_wrapper(&g_mod_sm90cp_t, &k, &be, &t, &cu, hq, hv, Tb,
                                        (int32_t)l.max_t_blocks, N, s);
    if (ret != 0) return ret;
  }
  {
    gdn_sm90cp_mn_Tensor_k_t k{const_cast<void*>(a.k), {(int32_t)D, T, hq}, {hq * D, D}};
    gdn_sm90cp_mn_Tensor_v_t v{const_cast<void*>(a.v), {(int32_t)D, T, hv}, {hv * D, D}};
    gdn_sm90cp_mn_Tensor_t_t t{t_ptr, {64, 64, hv, Tb}, {64, 4096, (int64_t)hv * 4096}};
    gdn_sm90cp_mn_Tensor_alpha_t al{const_cast<float*>(a.alpha), {T * hv}};
    gdn_sm90cp_mn_Tensor_transfer_t tr{transfer, {state_elems}};
    gdn_sm90cp_mn_Tensor_local_state_t ls{local, {state_elems}};
    gdn_sm90cp_mn_Tensor_cu_seqlens_t cu{const_cast<int64_t*>(a.cu_seqlens), {N + 1}};
    ret = cute_dsl_gdn_sm90cp_mn_wrapper(&g_mod_sm90cp_mn, &k, &v, &t, &al, &tr, &ls, &cu,
                                         a.cp_chunk_len, hq, hv, hv, C, (int32_t)l.max_cp_chunks,
                                         N, s);
    if (ret != 0) return ret;
  }
#define FIXUP(V, ...)                                                                          \
  {                                                                                            \
    gdn_##V##_Tensor_transfer_t tr{transfer, {(int32_t)D, (int32_t)D, hv, C},                  \
                                   {D, DD, (int64_t)hv * DD}};                                 \
    gdn_##V##_Tensor_local_state_t ls{local, {(int32_t)D, (int32_t)D, hv, C},                  \
                                      {D, DD, (int64_t)hv * DD}};                              \
    gdn_##V##_Tensor_fixed_state_t fx{fixed, {state_elems}};                                   \
    gdn_##V##_Tensor_cu_seqlens_t cu{const_cast<int64_t*>(a.cu_seqlens), {N + 1}};             \
    __VA_ARGS__                                                                                \
  }
#define INIT_STATE(V)                                                                          \
  gdn_##V##_Tensor_init_state_t is{const_cast<float*>(a.input_state),                         \
                                   {N, hv, (int32_t)D, (int32_t)D}, {hv * DD, DD, D}};
  if (hv <= 16) {
    if (init)
      FIXUP(sm90cp_fixup_simt8_init, INIT_STATE(sm90cp_fixup_simt8_init) ret =
                cute_dsl_gdn_sm90cp_fixup_simt8_init_wrapper(&g_mod_sm90cp_fixup_simt8_init, &tr,
                                                             &ls, &is, &fx, &cu, a.cp_chunk_len,
                                                             C, N, hv, s);)
    else
      FIXUP(sm90cp_fixup_simt8, ret = cute_dsl_gdn_sm90cp_fixup_simt8_wrapper(
                                    &g_mod_sm90cp_fixup_simt8, &tr, &ls, &fx, &cu,
                                    a.cp_chunk_len, C, N, hv, s);)
  } else {
    if (init)
      FIXUP(sm90cp_fixup_hmma_init, INIT_STATE(sm90cp_fixup_hmma_init) ret =
                cute_dsl_gdn_sm90cp_fixup_hmma_init_wrapper(&g_mod_sm90cp_fixup_hmma_init, &tr,
                                                            &ls, &is, &fx, &cu, a.cp_chunk_len, C,
                                                            N, hv, s);)
    else
      FIXUP(sm90cp_fixup_hmma, ret = cute_dsl_gdn_sm90cp_fixup_hmma_wrapper(
                                   &g_mod_sm90cp_fixup_hmma, &tr, &ls, &fx, &cu, a.cp_chunk_len,
                                   C, N, hv, s);)
  }
  if (ret != 0) return ret;
#define PREFILL(V, ...)                                                                        \
  {                                                                                            \
    gdn_##V##_Tensor_q_t q{const_cast<void*>(a.q), {T, (int32_t)D, hq}, {hq * D, D}};          \
    gdn_##V##_Tensor_k_t k{const_cast<void*>(a.k), {(int32_t)D, T, hq}, {hq * D, D}};          \
    gdn_##V##_Tensor_v_t v{const_cast<void*>(a.v), {(int32_t)D, T, hv}, {hv * D, D}};          \
    gdn_##V##_Tensor_t_t t{t_ptr, {64, 64, hv, Tb}, {64, 4096, (int64_t)hv * 4096}};           \
    gdn_##V##_Tensor_o_t o{a.output, {(int32_t)D, T, hv}, {hv * D, D}};                        \
    gdn_##V##_Tensor_alpha_t al{const_cast<float*>(a.alpha), {T * hv}};                        \
    gdn_##V##_Tensor_state_t st{a.output_state, {N, hv, (int32_t)D, (int32_t)D},              \
                                {hv * DD, DD, D}};                                             \
    gdn_##V##_Tensor_fixed_state_t fx{fixed, {state_elems}};                                   \
    gdn_##V##_Tensor_tensormaps_t tm{tmaps, {a.sm_count * (int32_t)kTensormapBytes}};          \
    gdn_##V##_Tensor_cu_seqlens_t cu{const_cast<int64_t*>(a.cu_seqlens), {N + 1}};             \
    __VA_ARGS__                                                                                \
  }
  if (init)
    PREFILL(sm90cp_prefill_init, INIT_STATE(sm90cp_prefill_init) ret =
                cute_dsl_gdn_sm90cp_prefill_init_wrapper(
                    &g_mod_sm90cp_prefill_init, &q, &k, &v, &t, &o, &al, &st, &fx, &is, &tm, &cu,
                    a.scale, hq, hq, hv, hv, a.cp_chunk_len, C, (int32_t)l.max_cp_chunks, N, s);)
  else
    PREFILL(sm90cp_prefill, ret = cute_dsl_gdn_sm90cp_prefill_wrapper(
                                &g_mod_sm90cp_prefill, &q, &k, &v, &t, &o, &al, &st, &fx, &tm,
                                &cu, a.scale, hq, hq, hv, hv, a.cp_chunk_len, C,
                                (int32_t)l.max_cp_chunks, N, s);)
#undef FIXUP
#undef PREFILL
#undef INIT_STATE
  return ret;
}

// SM100: FlashInfer blackwell/gated_delta_net_chunked.py, persistent: head
// counts are static extents (only T is dynamic), cu_seqlens int32, workspace
// get_workspace_size(148, ..., is_persistent=True) = 148 x 4 x 128 B.
int32_t run_sm100(const gdn_dsl_prefill_args& a) {
  const int32_t T = (int32_t)a.total_tokens, N = a.num_seqs, hv = a.num_v_heads;
  cudaStream_t s = static_cast<cudaStream_t>(a.stream);
  const bool init = a.input_state != nullptr;
  int32_t ret = -1;
#define SM100(V, ...)                                                                          \
  {                                                                                            \
    gdn_##V##_Tensor_q_t q{const_cast<void*>(a.q), {T}};                                       \
    gdn_##V##_Tensor_k_t k{const_cast<void*>(a.k), {T}};                                       \
    gdn_##V##_Tensor_v_t v{const_cast<void*>(a.v), {T}};                                       \
    gdn_##V##_Tensor_gate_t g{const_cast<float*>(a.alpha), {T}};                               \
    gdn_##V##_Tensor_beta_t be{const_cast<float*>(a.beta), {T}};                               \
    gdn_##V##_Tensor_o_t o{a.output, {T}};                                                     \
    gdn_##V##_Tensor_cu_seqlens_t cu{const_cast<int32_t*>(a.cu_seqlens_i32), {N + 1}};         \
    gdn_##V##_Tensor_state_t st{a.output_state, {N, hv, (int32_t)D, (int32_t)D},              \
                                {hv * DD, DD, D}};                                             \
    gdn_##V##_Tensor_workspace_t ws{a.workspace};                                              \
    __VA_ARGS__                                                                                \
  }
#define SM100_PAIR(V)                                                                          \
  {                                                                                            \
  if (init)                                                                                    \
    SM100(V##_init, gdn_##V##_init_Tensor_init_state_t is{const_cast<float*>(a.input_state),  \
                                                          {N, hv, (int32_t)D, (int32_t)D},     \
                                                          {hv * DD, DD, D}};                   \
          ret = cute_dsl_gdn_##V##_init_wrapper(&g_mod_##V##_init, &q, &k, &v, &g, &be, &o,    \
                                                &cu, &is, &st, a.scale, &ws, s);)              \
  else SM100(V, ret = cute_dsl_gdn_##V##_wrapper(&g_mod_##V, &q, &k, &v, &g, &be, &o, &cu, &st, \
                                                 a.scale, &ws, s);)                              \
  }
  if (hv == 16) SM100_PAIR(sm100_sm148_h16x16)
  else if (hv == 32) SM100_PAIR(sm100_sm148_h16x32)
  else if (hv == 48) SM100_PAIR(sm100_sm148_h16x48)
#undef SM100
#undef SM100_PAIR
  return ret;
}

bool overlaps(const void* a, uint64_t a_bytes, const void* b, uint64_t b_bytes) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return a != nullptr && b != nullptr && x < y + b_bytes && y < x + a_bytes;
}

}  // namespace

extern "C" {

const uint64_t gdn_dsl_prefill_args_layout[25] = {
    offsetof(gdn_dsl_prefill_args, abi_version),    offsetof(gdn_dsl_prefill_args, struct_size),
    offsetof(gdn_dsl_prefill_args, kernel),         offsetof(gdn_dsl_prefill_args, cp_chunk_len),
    offsetof(gdn_dsl_prefill_args, output),         offsetof(gdn_dsl_prefill_args, output_state),
    offsetof(gdn_dsl_prefill_args, q),              offsetof(gdn_dsl_prefill_args, k),
    offsetof(gdn_dsl_prefill_args, v),              offsetof(gdn_dsl_prefill_args, input_state),
    offsetof(gdn_dsl_prefill_args, alpha),          offsetof(gdn_dsl_prefill_args, beta),
    offsetof(gdn_dsl_prefill_args, cu_seqlens),     offsetof(gdn_dsl_prefill_args, cu_seqlens_i32),
    offsetof(gdn_dsl_prefill_args, workspace),      offsetof(gdn_dsl_prefill_args, workspace_bytes),
    offsetof(gdn_dsl_prefill_args, total_tokens),   offsetof(gdn_dsl_prefill_args, num_seqs),
    offsetof(gdn_dsl_prefill_args, max_seqlen),     offsetof(gdn_dsl_prefill_args, num_qk_heads),
    offsetof(gdn_dsl_prefill_args, num_v_heads),    offsetof(gdn_dsl_prefill_args, sm_count),
    offsetof(gdn_dsl_prefill_args, scale),          offsetof(gdn_dsl_prefill_args, stream),
    sizeof(gdn_dsl_prefill_args),
};

uint32_t gdn_dsl_abi_version(void) { return GDN_DSL_ABI_VERSION; }
int32_t gdn_dsl_sm100_baked_sm_count(void) { return kSm100SmCount; }
int32_t gdn_dsl_sm100_baked_qk_heads(void) { return kSm100QkHeads; }
const char* gdn_dsl_last_error(void) { return g_last_error; }

uint64_t gdn_dsl_workspace_bytes(const gdn_dsl_prefill_args* args) {
  if (args == nullptr || args->sm_count <= 0 || args->num_v_heads <= 0) return 0;
  switch (args->kernel) {
    case GDN_DSL_SM90:
    case GDN_DSL_SM120:
      return kTensormapBytes * static_cast<uint64_t>(args->sm_count);
    case GDN_DSL_SM100:
      return kTensormapBytes * 4 * kSm100SmCount;
    case GDN_DSL_SM90_CP:
      if (args->cp_chunk_len <= 0 || args->cp_chunk_len % 64 != 0 || args->num_seqs <= 0 ||
          args->total_tokens < 0 || args->max_seqlen < 0)
        return 0;
      return cp_layout(*args).total;
    default:
      return 0;
  }
}

int32_t gdn_dsl_load(int32_t kernel) {
  if (!valid_kernel(kernel)) return fail(GDN_ERR_GEOMETRY, "unknown DSL kernel family");
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_refs[kernel]++ > 0) return GDN_OK;
  take_load_error();  // a failure of an earlier load is not this one's
  FAMILY(LOAD, kernel)
  if (const cudaError_t e = take_load_error(); e != cudaSuccess) {
    FAMILY(UNLOAD, kernel)
    g_refs[kernel] = 0;
    return fail_load("DSL modules", e);
  }
  return GDN_OK;
}

int32_t gdn_dsl_unload(int32_t kernel) {
  if (!valid_kernel(kernel)) return fail(GDN_ERR_GEOMETRY, "unknown DSL kernel family");
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_refs[kernel] == 0) return fail(GDN_ERR_GEOMETRY, "DSL kernel family is not loaded");
  if (--g_refs[kernel] == 0) { FAMILY(UNLOAD, kernel) }
  return GDN_OK;
}

int32_t gdn_dsl_prefill(const gdn_dsl_prefill_args* args) {
  if (args == nullptr) return fail(GDN_ERR_NULL_POINTER, "args is NULL");
  if (args->abi_version != GDN_DSL_ABI_VERSION)
    return fail(GDN_ERR_ABI_VERSION, "abi_version differs from GDN_DSL_ABI_VERSION");
  if (args->struct_size != sizeof(gdn_dsl_prefill_args))
    return fail(GDN_ERR_STRUCT_SIZE, "struct_size differs from sizeof(gdn_dsl_prefill_args)");
  const gdn_dsl_prefill_args& a = *args;
  if (!valid_kernel(a.kernel)) return fail(GDN_ERR_GEOMETRY, "unknown DSL kernel family");
  const bool i32_cu = a.kernel == GDN_DSL_SM100;
  if (!a.output || !a.output_state || !a.q || !a.k || !a.v || !a.alpha || !a.beta ||
      !a.workspace || (i32_cu ? !a.cu_seqlens_i32 : !a.cu_seqlens))
    return fail(GDN_ERR_NULL_POINTER, "a required pointer is NULL");
  if (a.num_seqs <= 0 || a.num_qk_heads <= 0 || a.num_v_heads < a.num_qk_heads ||
      a.num_v_heads % a.num_qk_heads != 0 || a.total_tokens <= 0 || a.sm_count <= 0 ||
      a.max_seqlen <= 0 || a.max_seqlen > a.total_tokens)
    return fail(GDN_ERR_GEOMETRY, "num_seqs, head counts, total_tokens, max_seqlen or sm_count out of range");
  // Every dynamic extent is an int32 in the generated tensor structs.
  if (!fits_i32(a.total_tokens * a.num_v_heads * D) ||
      !fits_i32(static_cast<int64_t>(a.num_seqs) * a.num_v_heads * DD))
    return fail(GDN_ERR_GEOMETRY, "tokens or sequences exceed the kernels' 32-bit extents");
  if (a.kernel == GDN_DSL_SM90_CP) {
    if (a.cp_chunk_len <= 0 || a.cp_chunk_len % 64 != 0)
      return fail(GDN_ERR_GEOMETRY, "cp_chunk_len must be a positive multiple of 64");
    const CpLayout l = cp_layout(a);
    if (!fits_i32(l.cp_chunks * a.num_v_heads * DD) || !fits_i32(l.t_blocks * a.num_v_heads * 4096))
      return fail(GDN_ERR_GEOMETRY, "CP workspace extents exceed 32 bits; use a longer cp_chunk_len");
  }
  if (a.kernel == GDN_DSL_SM100) {
    if (a.sm_count != kSm100SmCount)
      return fail(GDN_ERR_GEOMETRY, "the SM100 kernels are built for exactly 148 SMs");
    if (a.num_qk_heads != kSm100QkHeads ||
        (a.num_v_heads != 16 && a.num_v_heads != 32 && a.num_v_heads != 48))
      return fail(GDN_ERR_GEOMETRY, "the SM100 kernels bake in Hqk 16 and Hv 16, 32 or 48");
  }
  const uint64_t state_bytes = static_cast<uint64_t>(a.num_seqs) * a.num_v_heads * DD * 4;
  const uint64_t out_bytes = static_cast<uint64_t>(a.total_tokens) * a.num_v_heads * D * 2;
  const uint64_t qk_bytes = static_cast<uint64_t>(a.total_tokens) * a.num_qk_heads * D * 2;
  if (overlaps(a.input_state, state_bytes, a.output_state, state_bytes))
    return fail(GDN_ERR_GEOMETRY, "input_state overlaps output_state");
  if (overlaps(a.output, out_bytes, a.q, qk_bytes) || overlaps(a.output, out_bytes, a.k, qk_bytes) ||
      overlaps(a.output, out_bytes, a.v, out_bytes) ||
      overlaps(a.output, out_bytes, a.output_state, state_bytes))
    return fail(GDN_ERR_GEOMETRY, "output overlaps an input or the output state");
  const uint64_t need = gdn_dsl_workspace_bytes(args);
  if (a.workspace_bytes < need)
    return fail(GDN_ERR_WORKSPACE, "workspace smaller than gdn_dsl_workspace_bytes()");
  if (reinterpret_cast<uintptr_t>(a.workspace) % kAlign != 0)
    return fail(GDN_ERR_WORKSPACE, "workspace must be 256-byte aligned");
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_refs[a.kernel] == 0)
      return fail(GDN_ERR_KERNEL, "DSL kernel family not loaded (gdn_dsl_load first)");
  }
  int32_t ret;
  switch (a.kernel) {
    case GDN_DSL_SM90: ret = run_noncp(a, false); break;
    case GDN_DSL_SM120: ret = run_noncp(a, true); break;
    case GDN_DSL_SM90_CP: ret = run_cp(a); break;
    default: ret = run_sm100(a); break;
  }
  if (ret != 0) {
    char msg[160];
    std::snprintf(msg, sizeof(msg), "the exported kernel returned %d (%s)", ret,
                  cudaGetErrorString(static_cast<cudaError_t>(ret)));
    return fail(GDN_ERR_KERNEL, msg);
  }
  return GDN_OK;
}

}  // extern "C"
