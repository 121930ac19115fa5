// Host launcher behind gdn_abi.h. Validates the argument struct, picks the
// instantiation, and turns every C++ exception into a status code: nothing
// C++ crosses the C boundary.
#include "gdn_abi.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>
#include <exception>

// Declared here, defined (explicitly instantiated) in flashinfer_sm90_inst.cu.
// Forward-declaring keeps this unit free of CUTLASS: the declaration must
// match FlashInfer's template exactly, and a mismatch fails at link time.
namespace cutlass {
namespace arch {
struct Sm90;
}
}  // namespace cutlass

namespace flat {
template <bool IsGVA, bool NeedsBeta, bool NeedsAlpha, bool InitStateFromInput,
          bool EnableCheckpointing, typename ArchTag, typename TO, typename TQKV, typename TState>
void launch_delta_rule_prefill_kernel_gbai(
    cudaStream_t stream, TO* output, TState* output_state, TQKV const* q, TQKV const* k,
    TQKV const* v, TState const* input_state, float const* alpha, float const* beta,
    int64_t const* cu_seqlens, uint8_t* workspace_buffer, int32_t num_seqs, int32_t num_q_heads,
    int32_t num_k_heads, int32_t num_v_heads, int32_t num_o_heads, int32_t head_size,
    int64_t total_seqlen, float scale, int32_t sm_count, float* state_checkpoints,
    int64_t const* checkpoint_cu_starts, int32_t checkpoint_every_n_tokens);
}  // namespace flat

namespace {

thread_local char g_last_error[256] = "no error";

int32_t fail(int32_t status, const char* detail) {
  std::snprintf(g_last_error, sizeof(g_last_error), "%s", detail);
  return status;
}

constexpr uint64_t kTmaDescriptorBytes = 128;  // static_assert'ed in flashinfer_sm90_inst.cu

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlaps(const void* a, uint64_t a_bytes, const void* b, uint64_t b_bytes) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return a != nullptr && b != nullptr && x < y + b_bytes && y < x + a_bytes;
}

template <bool IsGVA, bool InitState>
void launch(const gdn_prefill_args& a) {
  flat::launch_delta_rule_prefill_kernel_gbai<IsGVA, true, true, InitState, false,
                                              cutlass::arch::Sm90, nv_bfloat16, nv_bfloat16,
                                              float>(
      static_cast<cudaStream_t>(a.stream), static_cast<nv_bfloat16*>(a.output), a.output_state,
      static_cast<const nv_bfloat16*>(a.q), static_cast<const nv_bfloat16*>(a.k),
      static_cast<const nv_bfloat16*>(a.v), a.input_state, a.alpha, a.beta, a.cu_seqlens,
      static_cast<uint8_t*>(a.workspace), a.num_seqs, a.num_qk_heads, a.num_qk_heads,
      a.num_v_heads, a.num_v_heads, GDN_HEAD_DIM, a.total_tokens, a.scale, a.sm_count, nullptr,
      nullptr, 0);
}

}  // namespace

extern "C" {

const uint64_t gdn_prefill_args_layout[22] = {
    offsetof(gdn_prefill_args, abi_version),  offsetof(gdn_prefill_args, struct_size),
    offsetof(gdn_prefill_args, output),       offsetof(gdn_prefill_args, output_state),
    offsetof(gdn_prefill_args, q),            offsetof(gdn_prefill_args, k),
    offsetof(gdn_prefill_args, v),            offsetof(gdn_prefill_args, input_state),
    offsetof(gdn_prefill_args, alpha),        offsetof(gdn_prefill_args, beta),
    offsetof(gdn_prefill_args, cu_seqlens),   offsetof(gdn_prefill_args, workspace),
    offsetof(gdn_prefill_args, workspace_bytes), offsetof(gdn_prefill_args, total_tokens),
    offsetof(gdn_prefill_args, num_seqs),     offsetof(gdn_prefill_args, num_qk_heads),
    offsetof(gdn_prefill_args, num_v_heads),  offsetof(gdn_prefill_args, sm_count),
    offsetof(gdn_prefill_args, scale),        offsetof(gdn_prefill_args, reserved),
    offsetof(gdn_prefill_args, stream),       sizeof(gdn_prefill_args),
};

uint32_t gdn_abi_version(void) { return GDN_ABI_VERSION; }

uint64_t gdn_prefill_sm90_workspace_bytes(int32_t sm_count) {
  return sm_count > 0 ? kTmaDescriptorBytes * static_cast<uint64_t>(sm_count) : 0;
}

const char* gdn_last_error(void) { return g_last_error; }

int32_t gdn_prefill_sm90(const gdn_prefill_args* args) {
  if (args == nullptr) return fail(GDN_ERR_NULL_POINTER, "args is NULL");
  if (args->abi_version != GDN_ABI_VERSION)
    return fail(GDN_ERR_ABI_VERSION, "abi_version differs from the launcher's GDN_ABI_VERSION");
  if (args->struct_size != sizeof(gdn_prefill_args))
    return fail(GDN_ERR_STRUCT_SIZE, "struct_size differs from sizeof(gdn_prefill_args)");
  const gdn_prefill_args& a = *args;
  if (!a.output || !a.output_state || !a.q || !a.k || !a.v || !a.alpha || !a.beta ||
      !a.cu_seqlens || !a.workspace)
    return fail(GDN_ERR_NULL_POINTER, "a required pointer is NULL");
  if (a.num_seqs <= 0 || a.num_qk_heads <= 0 || a.num_v_heads < a.num_qk_heads ||
      a.num_v_heads % a.num_qk_heads != 0 || a.total_tokens < 0 || a.sm_count <= 0 ||
      a.reserved != 0)
    return fail(GDN_ERR_GEOMETRY, "num_seqs, head counts, total_tokens or sm_count out of range");
  const uint64_t state_bytes = static_cast<uint64_t>(a.num_seqs) * a.num_v_heads * GDN_HEAD_DIM *
                               GDN_HEAD_DIM * sizeof(float);
  const uint64_t out_bytes =
      static_cast<uint64_t>(a.total_tokens) * a.num_v_heads * GDN_HEAD_DIM * sizeof(uint16_t);
  const uint64_t qk_bytes =
      static_cast<uint64_t>(a.total_tokens) * a.num_qk_heads * GDN_HEAD_DIM * sizeof(uint16_t);
  if (overlaps(a.input_state, state_bytes, a.output_state, state_bytes))
    return fail(GDN_ERR_GEOMETRY, "input_state overlaps output_state");
  if (overlaps(a.output, out_bytes, a.q, qk_bytes) || overlaps(a.output, out_bytes, a.k, qk_bytes) ||
      overlaps(a.output, out_bytes, a.v, out_bytes) ||
      overlaps(a.output, out_bytes, a.output_state, state_bytes))
    return fail(GDN_ERR_GEOMETRY, "output overlaps an input or the output state");
  if (a.workspace_bytes < gdn_prefill_sm90_workspace_bytes(a.sm_count))
    return fail(GDN_ERR_WORKSPACE, "workspace smaller than gdn_prefill_sm90_workspace_bytes()");
  const bool gva = a.num_v_heads > a.num_qk_heads;
  const bool init = a.input_state != nullptr;
  try {
    if (gva && init) launch<true, true>(a);
    else if (gva) launch<true, false>(a);
    else if (init) launch<false, true>(a);
    else launch<false, false>(a);
  } catch (const std::exception& e) {
    return fail(GDN_ERR_KERNEL, e.what());
  } catch (...) {
    return fail(GDN_ERR_UNKNOWN, "unknown C++ exception");
  }
  return GDN_OK;
}

}  // extern "C"
