// FlashInfer 0.6.13's generation-1 SM90 GDN prefill with the value dimension
// split across GDN_VSPLIT_COUNT CTAs per (sequence, value head)
// (patches/0001-flat-gdn-value-split.patch), and its C ABI entry
// (gdn_vsplit_abi.h). bf16 q/k/v/o, fp32 state, alpha and beta on, no
// checkpointing, with and without an initial state; FlashInfer's GVA grouping,
// which also covers Hv == Hqk (ratio 1: the same head indices as IsGVA=false).
// Compiles; not yet run on a GPU.
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>
#include <exception>

#include "flashinfer/flat/prefill/prefill_kernel_delta_rule_sm90.cuh"
#include "gdn_vsplit_abi.h"

// The module ID anchor (see flashinfer_sm90_inst.cu and docs/reproducibility.md).
extern "C" const char gdn_flashinfer_sm90_vsplit_module_anchor[] =
    "flashinfer 0.6.13 sm90 gdn prefill, value split";

// The workspace is gdn_prefill_sm90_workspace_bytes(): one TMA descriptor per SM
// (CollectiveStoreO::get_workspace_size).
static_assert(sizeof(cute::TmaDescriptor) == 128, "workspace formula in gdn_abi.cpp is stale");

namespace {

thread_local char g_last_error[256] = "no error";

int32_t fail(int32_t status, const char* detail) {
  std::snprintf(g_last_error, sizeof(g_last_error), "%s", detail);
  return status;
}

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlaps(const void* a, uint64_t a_bytes, const void* b, uint64_t b_bytes) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return a != nullptr && b != nullptr && x < y + b_bytes && y < x + a_bytes;
}

template <bool B>
using Bool = std::conditional_t<B, cute::true_type, cute::false_type>;

// FlashInfer's launch_delta_rule_prefill_kernel_gbai for this one configuration,
// plus Option<kNumVSplits>.
template <bool InitState>
void launch(const gdn_prefill_args& a) {
  using namespace flat::kernel;
  using T = flat::map_to_cutlass_t<nv_bfloat16>;
  using Options = std::tuple<Option<Tag::kIsDeltaRule, cute::true_type>,
                             Option<Tag::kIsGVA, cute::true_type>,
                             Option<Tag::kNeedsBeta, cute::true_type>,
                             Option<Tag::kNeedsAlpha, cute::true_type>,
                             Option<Tag::kInitStateFromInput, Bool<InitState>>,
                             Option<Tag::kEnableCheckpointing, cute::false_type>,
                             Option<Tag::kNumVSplits, cute::Int<GDN_VSPLIT_COUNT>>>;
  using TileShape = cute::Shape<cute::_64, cute::_64, cute::_128>;
  using Layout = cute::tuple<int64_t, cute::_1, int32_t>;  // (token, d, head)
  using Builder = FlatBuilderDeltaRule<T, float, float, TileShape, Layout, Layout, Layout, Layout,
                                       cutlass::gemm::KernelTmaWarpSpecializedCooperative, Options>;
  static_assert(Builder::CollectiveMainloop::kVSplits == GDN_VSPLIT_COUNT);
  static_assert(Builder::CollectiveMainloop::NumStateMmaWarpGroups == 1);
  using Operation = cutlass::device::Universal<typename Builder::Kernel>;
  // CollectiveStoreO keeps one tail TMA descriptor per SM (indexed by %smid), so two CTAs
  // must never share an SM. Registers forbid it (384 threads x 168 registers, ptxas -v),
  // and so does shared memory (an SM has 228 KiB):
  static_assert(2 * Operation::Kernel::SharedStorageSize > 228 * 1024);

  const int32_t d = GDN_HEAD_DIM, hq = a.num_qk_heads, hv = a.num_v_heads;
  cutlass::KernelHardwareInfo hw_info;
  hw_info.sm_count = a.sm_count;
  typename Operation::Arguments arguments{
      .problem_size = {.cu_seqlens = a.cu_seqlens,
                       .total_seqlen = a.total_tokens,
                       .num_seqs = a.num_seqs,
                       .num_q_heads = hq,
                       .num_k_heads = hq,
                       .num_v_heads = hv,
                       .num_o_heads = hv,
                       .num_sab_heads = hv,
                       .head_size = d},
      .mainloop = {.ptr_Q = (T*)a.q,
                   .dQ = {int64_t(hq) * d, cute::_1{}, d},
                   .ptr_K = (T*)a.k,
                   .dK = {int64_t(hq) * d, cute::_1{}, d},
                   .ptr_V = (T*)a.v,
                   .dV = {int64_t(hv) * d, cute::_1{}, d},
                   .ptr_O = (T*)a.output,
                   .dO = {int64_t(hv) * d, cute::_1{}, d},
                   .ptr_output_state = a.output_state,
                   .ptr_input_state = a.input_state,
                   .scale = a.scale,
                   .alpha_ptr = a.alpha,
                   .alpha_stride = {hv, 1},
                   .beta_ptr = a.beta,
                   .beta_stride = {hv, 1},
                   .ptr_state_checkpoints = nullptr,
                   .checkpoint_cu_starts = nullptr,
                   .checkpoint_every_n_tokens = 0},
      .hw_info = hw_info};
  Operation op;
  if (op.can_implement(arguments) != cutlass::Status::kSuccess)
    throw std::runtime_error("can_implement failed");
  auto stream = static_cast<cudaStream_t>(a.stream);
  if (op.initialize(arguments, static_cast<uint8_t*>(a.workspace), stream) !=
      cutlass::Status::kSuccess)
    throw std::runtime_error("initialize failed");
  if (op.run(stream) != cutlass::Status::kSuccess) throw std::runtime_error("run failed");
}

}  // namespace

extern "C" {

const char* gdn_vsplit_last_error(void) { return g_last_error; }

// The checks of gdn_prefill_sm90, copied from gdn_abi.cpp (plus the grid's 32-bit
// limit): that unit's bytes are locked and were verified on the H200, so it was
// left as it is when this unit was added. Fold both into one header the next time
// gdn_abi is relocked anyway.
int32_t gdn_prefill_sm90_vsplit(const gdn_prefill_args* args) {
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
      a.reserved != 0 || int64_t(a.num_seqs) * a.num_v_heads * GDN_VSPLIT_COUNT > INT32_MAX)
    return fail(GDN_ERR_GEOMETRY, "num_seqs, head counts, total_tokens or sm_count out of range");
  const uint64_t state_bytes = uint64_t(a.num_seqs) * a.num_v_heads * GDN_HEAD_DIM * GDN_HEAD_DIM * 4;
  const uint64_t out_bytes = uint64_t(a.total_tokens) * a.num_v_heads * GDN_HEAD_DIM * 2;
  const uint64_t qk_bytes = uint64_t(a.total_tokens) * a.num_qk_heads * GDN_HEAD_DIM * 2;
  if (overlaps(a.input_state, state_bytes, a.output_state, state_bytes))
    return fail(GDN_ERR_GEOMETRY, "input_state overlaps output_state");
  if (overlaps(a.output, out_bytes, a.q, qk_bytes) || overlaps(a.output, out_bytes, a.k, qk_bytes) ||
      overlaps(a.output, out_bytes, a.v, out_bytes) ||
      overlaps(a.output, out_bytes, a.output_state, state_bytes))
    return fail(GDN_ERR_GEOMETRY, "output overlaps an input or the output state");
  if (a.workspace_bytes < uint64_t(a.sm_count) * sizeof(cute::TmaDescriptor))
    return fail(GDN_ERR_WORKSPACE, "workspace smaller than gdn_prefill_sm90_workspace_bytes()");
  try {
    if (a.input_state != nullptr) launch<true>(a);
    else launch<false>(a);
  } catch (const std::exception& e) {
    return fail(GDN_ERR_KERNEL, e.what());
  } catch (...) {
    return fail(GDN_ERR_UNKNOWN, "unknown C++ exception");
  }
  return GDN_OK;
}

}  // extern "C"
