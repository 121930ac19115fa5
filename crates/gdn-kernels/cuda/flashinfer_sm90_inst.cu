// Explicit instantiations of FlashInfer's generation-1 SM90 GDN prefill that
// the bundle ships: bf16 q/k/v/o, fp32 state, alpha and beta on, no
// checkpointing, with and without an initial state. GDN_IS_GVA (set per unit
// by generator/artifacts.json) selects GVA (Hv = r * Hqk, r >= 2) or Hv == Hqk.
// Only what is instantiated here is compiled: FlashInfer's full module has 64
// variants and would take ~1.5 h on 2 cores.
#include <cuda_bf16.h>

#include "flashinfer/flat/prefill/prefill_kernel_delta_rule_sm90.cuh"

#ifndef GDN_IS_GVA
#error "GDN_IS_GVA must be defined to true or false"
#endif

// cudafe++ names this unit's module ID (which appears in the cubin's symbol
// names) after its first non-template external symbol; a unit with none gets
// its process ID instead, so two builds of the same source differ. This anchor
// makes the module ID a function of the source alone (docs/reproducibility.md).
#if GDN_IS_GVA
extern "C" const char gdn_flashinfer_sm90_gva_module_anchor[] = "flashinfer 0.6.13 sm90 gdn prefill, gva";
#else
extern "C" const char gdn_flashinfer_sm90_mha_module_anchor[] = "flashinfer 0.6.13 sm90 gdn prefill, hv == hqk";
#endif

// gdn_abi.cpp sizes the workspace as 128 bytes per SM: FlashInfer's
// CollectiveStoreO::get_workspace_size is sizeof(cute::TmaDescriptor) * sm_count.
static_assert(sizeof(cute::TmaDescriptor) == 128, "workspace formula in gdn_abi.cpp is stale");

namespace flat {

#define GDN_INSTANTIATE(INIT_STATE)                                                              \
  template void launch_delta_rule_prefill_kernel_gbai<GDN_IS_GVA, true, true, INIT_STATE, false, \
                                                      cutlass::arch::Sm90, nv_bfloat16,          \
                                                      nv_bfloat16, float>(                       \
      cudaStream_t, nv_bfloat16*, float*, nv_bfloat16 const*, nv_bfloat16 const*,                \
      nv_bfloat16 const*, float const*, float const*, float const*, int64_t const*, uint8_t*,    \
      int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int64_t, float, int32_t, float*,     \
      int64_t const*, int32_t);

GDN_INSTANTIATE(false)
GDN_INSTANTIATE(true)

}  // namespace flat
