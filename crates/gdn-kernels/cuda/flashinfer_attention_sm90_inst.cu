// FlashInfer 0.6.13's SM90 (FA3) paged batch prefill, as the bundle ships it,
// and the C ABI launcher in front of it (gdn_attention_abi.h).
//
// One instantiation: head dim 256 (qk and vo), bf16 q/kv/o, int32 ids,
// causal, no sliding window, default variant (StandardAttention: no soft cap),
// over FlashInfer's own BatchPrefillPagedParams (default_params.cuh) - the
// same kernel FlashInfer's JIT builds from batch_prefill_paged_sm90_kernel_inst
// .jinja for these parameters, written out here instead of rendered. Only
// SAME_SCHEDULE_FOR_ALL_HEADS=false is instantiated: FlashInfer's plan picks
// the other only above 4096 query tiles per head (~524k tokens in one step),
// and the caller routes such batches to our own kernel (attention_select.rs).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>
#include <exception>
#include <vector>

#include "flashinfer/attention/hopper/default_params.cuh"
#include "flashinfer/attention/hopper/prefill_sm90.cuh"
#include "flashinfer/attention/hopper/variants.cuh"
#include "flashinfer/attention/scheduler.cuh"
#include "gdn_attention_abi.h"

// cudafe++ names this unit's module ID after its first non-template external
// symbol; this anchor makes it a function of the source alone (see
// flashinfer_sm90_inst.cu and docs/reproducibility.md).
extern "C" const char gdn_flashinfer_attention_sm90_module_anchor[] =
    "flashinfer 0.6.13 sm90 fa3 paged prefill, hdim 256, bf16, causal";

namespace {

using DType = cutlass::bfloat16_t;  // cutlass_dtype_t<nv_bfloat16>
using IdType = int32_t;
using Params = flashinfer::BatchPrefillPagedParams<DType, DType, DType, IdType>;
using Variant = flashinfer::DefaultAttention</*use_logits_soft_cap=*/false>;
constexpr uint32_t kHeadDim = GDN_ATTENTION_HEAD_DIM;
constexpr auto kMask = flashinfer::MaskMode::kCausal;

}  // namespace

namespace flashinfer {
template cudaError_t BatchPrefillWithPagedKVCacheDispatched<
    kHeadDim, kHeadDim, kMask, /*LEFT_SLIDING_WINDOW=*/false,
    /*SAME_SCHEDULE_FOR_ALL_HEADS=*/false, Variant, Params>(Params& params, bool enable_pdl,
                                                            cudaStream_t stream);
}  // namespace flashinfer

namespace {

thread_local char g_last_error[512] = "no error";

int32_t fail(int32_t status, const char* detail) {
  std::snprintf(g_last_error, sizeof(g_last_error), "%s", detail);
  return status;
}

// gdn_abi.h's status codes (kept numerically identical).
enum : int32_t {
  kOk = 0,
  kErrAbiVersion = 1,
  kErrStructSize = 2,
  kErrNullPointer = 3,
  kErrGeometry = 4,
  kErrWorkspace = 5,
  kErrKernel = 6,
  kErrUnknown = 7,
};

uint64_t align16(uint64_t x) { return (x + 15) / 16 * 16; }

// Work items of one head: FlashInfer's max_num_works_per_head.
int64_t works_per_head(int64_t total_q, int32_t num_seqs) {
  return (total_q + GDN_ATTENTION_CTA_Q - 1) / GDN_ATTENTION_CTA_Q + num_seqs - 1;
}

bool overlaps(const void* a, uint64_t a_bytes, const void* b, uint64_t b_bytes) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return a != nullptr && b != nullptr && x < y + b_bytes && y < x + a_bytes;
}

int32_t run(const gdn_attention_args& a) {
  const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  const int64_t total_q = a.qo_indptr[a.num_seqs];
  // FlashInfer's paged plan takes page offsets per sequence into kv_indices:
  // our block table is that array with a fixed row width.
  std::vector<IdType> kv_indptr(a.num_seqs + 1);
  for (int32_t s = 0; s <= a.num_seqs; ++s) kv_indptr[s] = s * a.max_blocks;
  // Pageable on purpose: cudaMemcpyAsync stages pageable memory before it
  // returns, so this buffer may die with the call.
  std::vector<uint8_t> host_schedule(a.workspace_bytes);
  flashinfer::PrefillPlanSM90Info plan;
  cudaError_t err = flashinfer::PrefillSM90Plan<IdType>(
      /*float_buffer=*/nullptr, 0, a.workspace, host_schedule.data(), a.workspace_bytes, plan,
      const_cast<IdType*>(a.qo_indptr), kv_indptr.data(), const_cast<IdType*>(a.kv_len),
      static_cast<uint32_t>(total_q), a.num_seqs, a.num_qo_heads, a.num_kv_heads, kHeadDim,
      kHeadDim, a.page_size, /*causal=*/true, /*enable_cuda_graph=*/false,
      /*sizeof_dtype_o=*/2, stream);
  if (err != cudaSuccess) return fail(kErrKernel, cudaGetErrorString(err));
  if (plan.same_schedule_for_all_heads)
    return fail(kErrGeometry, "the plan chose the same-schedule kernel, which is not shipped");

  Params p{};
  auto* ws = static_cast<uint8_t*>(a.workspace);
  auto at = [&](int64_t offset) { return reinterpret_cast<IdType*>(ws + offset); };
  p.q_ptr = static_cast<DType*>(const_cast<void*>(a.q));
  p.k_ptr = static_cast<DType*>(const_cast<void*>(a.k_cache));
  p.v_ptr = static_cast<DType*>(const_cast<void*>(a.v_cache));
  p.o_ptr = static_cast<DType*>(a.out);
  p.lse_ptr = nullptr;
  p.qo_tile_indices = at(plan.qo_tile_indices_offset);
  p.qo_indptr = at(plan.qo_indptr_offset);
  p.kv_indptr = at(plan.kv_indptr_offset);
  p.kv_indices = const_cast<IdType*>(a.block_table);
  p.qo_lens = at(plan.qo_len_offset);
  p.kv_lens = at(plan.kv_len_offset);
  p.head_indices = at(plan.head_indices_offset);
  p.work_indptr = at(plan.work_indptr_offset);
  p.batch_indices = at(plan.batch_indices_offset);
  p.additional_params.logits_soft_cap = 0.f;
  p.additional_params.sm_scale = a.sm_scale;
  p.additional_params.maybe_prefix_len_ptr = nullptr;
  p.additional_params.maybe_token_pos_in_items_ptr = nullptr;
  p.additional_params.token_pos_in_items_len = 0;
  p.additional_params.maybe_max_item_len_ptr = nullptr;
  const int64_t row = static_cast<int64_t>(a.num_qo_heads) * kHeadDim;
  const int64_t kv_row = static_cast<int64_t>(a.num_kv_heads) * kHeadDim;
  p.q_stride_n = row;
  p.q_stride_h = kHeadDim;
  p.o_stride_n = row;
  p.o_stride_h = kHeadDim;
  p.k_stride_n = kv_row;
  p.k_stride_h = kHeadDim;
  p.v_stride_n = kv_row;
  p.v_stride_h = kHeadDim;
  p.k_page_stride = kv_row * a.page_size;
  p.v_page_stride = kv_row * a.page_size;
  p.nnz_qo = total_q;
  p.num_qo_heads = a.num_qo_heads;
  p.num_kv_heads = a.num_kv_heads;
  p.group_size = a.num_qo_heads / a.num_kv_heads;
  p.page_size = a.page_size;
  p.window_left = -1;
  p.causal = true;
  err = flashinfer::BatchPrefillWithPagedKVCacheDispatched<kHeadDim, kHeadDim, kMask, false, false,
                                                           Variant, Params>(
      p, /*enable_pdl=*/false, stream);
  if (err != cudaSuccess) return fail(kErrKernel, cudaGetErrorString(err));
  return kOk;
}

}  // namespace

extern "C" {

const uint64_t gdn_attention_args_layout[18] = {
    offsetof(gdn_attention_args, abi_version),     offsetof(gdn_attention_args, struct_size),
    offsetof(gdn_attention_args, out),             offsetof(gdn_attention_args, q),
    offsetof(gdn_attention_args, k_cache),         offsetof(gdn_attention_args, v_cache),
    offsetof(gdn_attention_args, block_table),     offsetof(gdn_attention_args, qo_indptr),
    offsetof(gdn_attention_args, kv_len),          offsetof(gdn_attention_args, workspace),
    offsetof(gdn_attention_args, workspace_bytes), offsetof(gdn_attention_args, num_seqs),
    offsetof(gdn_attention_args, num_qo_heads),    offsetof(gdn_attention_args, num_kv_heads),
    offsetof(gdn_attention_args, page_size),       offsetof(gdn_attention_args, max_blocks),
    offsetof(gdn_attention_args, sm_scale),        offsetof(gdn_attention_args, stream),
};

uint32_t gdn_attention_abi_version(void) { return GDN_ATTENTION_ABI_VERSION; }

const char* gdn_attention_last_error(void) { return g_last_error; }

uint64_t gdn_attention_sm90_workspace_bytes(int64_t total_q, int32_t num_seqs,
                                            int32_t num_qo_heads, int32_t sm_count) {
  if (total_q <= 0 || num_seqs <= 0 || num_qo_heads <= 0 || sm_count <= 0) return 0;
  // PrefillSM90Plan's int buffer: seven arrays of one int32 per work item and
  // work_indptr (sm_count + 1 entries), each 16-byte aligned.
  const uint64_t works = static_cast<uint64_t>(works_per_head(total_q, num_seqs)) * num_qo_heads;
  return 7 * align16(works * sizeof(IdType)) + align16((sm_count + 1ull) * sizeof(IdType)) + 16;
}

int32_t gdn_attention_sm90(const gdn_attention_args* args) {
  if (args == nullptr) return fail(kErrNullPointer, "args is NULL");
  if (args->abi_version != GDN_ATTENTION_ABI_VERSION)
    return fail(kErrAbiVersion, "abi_version differs from GDN_ATTENTION_ABI_VERSION");
  if (args->struct_size != sizeof(gdn_attention_args))
    return fail(kErrStructSize, "struct_size differs from sizeof(gdn_attention_args)");
  const gdn_attention_args& a = *args;
  if (!a.out || !a.q || !a.k_cache || !a.v_cache || !a.block_table || !a.qo_indptr ||
      !a.kv_len || !a.workspace)
    return fail(kErrNullPointer, "a required pointer is NULL");
  if (a.num_seqs <= 0 || a.num_kv_heads <= 0 || a.num_qo_heads % a.num_kv_heads != 0 ||
      a.num_qo_heads < a.num_kv_heads || a.page_size <= 0 || a.max_blocks <= 0 ||
      !(a.sm_scale > 0.f))
    return fail(kErrGeometry, "num_seqs, head counts, page_size, max_blocks or sm_scale out of range");
  if (a.qo_indptr[0] != 0) return fail(kErrGeometry, "qo_indptr[0] is not 0");
  for (int32_t s = 0; s < a.num_seqs; ++s) {
    const int64_t qo_len = static_cast<int64_t>(a.qo_indptr[s + 1]) - a.qo_indptr[s];
    if (qo_len <= 0 || a.kv_len[s] < qo_len ||
        a.kv_len[s] > static_cast<int64_t>(a.max_blocks) * a.page_size) {
      char why[160];
      std::snprintf(why, sizeof(why), "sequence %d: %lld queries over %d keys (%d pages of %d)",
                    s, static_cast<long long>(qo_len), a.kv_len[s], a.max_blocks, a.page_size);
      return fail(kErrGeometry, why);
    }
  }
  const int64_t total_q = a.qo_indptr[a.num_seqs];
  if (works_per_head(total_q, a.num_seqs) > GDN_ATTENTION_MAX_WORKS_PER_HEAD)
    return fail(kErrGeometry, "more query tiles per head than the shipped schedule allows");
  const uint64_t q_bytes = static_cast<uint64_t>(total_q) * a.num_qo_heads * kHeadDim * 2;
  if (overlaps(a.out, q_bytes, a.q, q_bytes)) return fail(kErrGeometry, "out overlaps q");
  int device = 0, sm_count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return fail(kErrKernel, "cannot read the current device's SM count");
  if (a.workspace_bytes <
      gdn_attention_sm90_workspace_bytes(total_q, a.num_seqs, a.num_qo_heads, sm_count))
    return fail(kErrWorkspace, "workspace smaller than gdn_attention_sm90_workspace_bytes()");
  try {
    return run(a);
  } catch (const std::exception& e) {
    return fail(kErrKernel, e.what());
  } catch (...) {
    return fail(kErrUnknown, "unknown C++ exception");
  }
}

}  // extern "C"
