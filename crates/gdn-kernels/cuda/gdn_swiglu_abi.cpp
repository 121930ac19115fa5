// Host wrapper behind gdn_swiglu_abi.h: checks the call, fills the generated
// CuTe tensor structs of the exported quack SwiGLU GEMM and calls its
// cute_dsl_gdn_quack_swiglu_sm90_wrapper. Host code only; the generated header
// comes from the bundle build (dsl.header_dir).
#include "gdn_abi.h"
#include "gdn_swiglu_abi.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <mutex>

// The last-error state and the load-error hook (before the generated headers).
#include "cute_dsl_host_support.h"

#include "quack_swiglu_sm90.h"

namespace {

gdn_quack_swiglu_sm90_Kernel_Module_t g_module;
std::mutex g_mutex;
int g_refs = 0;

bool extent(int64_t x) { return x > 0 && x <= 0x7fffffff; }
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool overlaps(const void* a, uint64_t a_bytes, const void* b, uint64_t b_bytes) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

}  // namespace

extern "C" {

const uint64_t gdn_swiglu_gemm_args_layout[14] = {
    offsetof(gdn_swiglu_gemm_args, abi_version),   offsetof(gdn_swiglu_gemm_args, struct_size),
    offsetof(gdn_swiglu_gemm_args, output),        offsetof(gdn_swiglu_gemm_args, x),
    offsetof(gdn_swiglu_gemm_args, w),             offsetof(gdn_swiglu_gemm_args, m),
    offsetof(gdn_swiglu_gemm_args, n),             offsetof(gdn_swiglu_gemm_args, k),
    offsetof(gdn_swiglu_gemm_args, x_stride),      offsetof(gdn_swiglu_gemm_args, output_stride),
    offsetof(gdn_swiglu_gemm_args, max_active_clusters), offsetof(gdn_swiglu_gemm_args, reserved),
    offsetof(gdn_swiglu_gemm_args, stream),        sizeof(gdn_swiglu_gemm_args),
};

uint32_t gdn_swiglu_abi_version(void) { return GDN_SWIGLU_ABI_VERSION; }
const char* gdn_swiglu_last_error(void) { return g_last_error; }

int32_t gdn_swiglu_load(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_refs++ > 0) return GDN_OK;
  take_load_error();  // a failure of an earlier load is not this one's
  gdn_quack_swiglu_sm90_Kernel_Module_Load(&g_module);
  if (const cudaError_t e = take_load_error(); e != cudaSuccess) {
    g_refs = 0;
    return fail_load("SwiGLU GEMM module", e);
  }
  return GDN_OK;
}

int32_t gdn_swiglu_unload(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_refs == 0) return fail(GDN_ERR_GEOMETRY, "the SwiGLU GEMM module is not loaded");
  if (--g_refs == 0) gdn_quack_swiglu_sm90_Kernel_Module_Unload(&g_module);
  return GDN_OK;
}

int32_t gdn_swiglu_gemm(const gdn_swiglu_gemm_args* args) {
  if (args == nullptr) return fail(GDN_ERR_NULL_POINTER, "args is NULL");
  if (args->abi_version != GDN_SWIGLU_ABI_VERSION)
    return fail(GDN_ERR_ABI_VERSION, "abi_version differs from GDN_SWIGLU_ABI_VERSION");
  if (args->struct_size != sizeof(gdn_swiglu_gemm_args))
    return fail(GDN_ERR_STRUCT_SIZE, "struct_size differs from sizeof(gdn_swiglu_gemm_args)");
  const gdn_swiglu_gemm_args& a = *args;
  if (!a.output || !a.x || !a.w) return fail(GDN_ERR_NULL_POINTER, "output, x or w is NULL");
  const int64_t half = a.n / 2;
  // Every extent is an int32 in the generated tensor structs.
  if (!extent(a.m) || !extent(a.n) || !extent(a.k) || a.n % 2 != 0)
    return fail(GDN_ERR_GEOMETRY, "m, n and k must be positive and below 2^31, n even");
  if (a.k % 8 != 0 || half % 8 != 0 || a.x_stride % 8 != 0 || a.output_stride % 8 != 0)
    return fail(GDN_ERR_GEOMETRY, "k, n/2 and both row strides must be multiples of 8 (16-byte TMA rows)");
  if (a.x_stride < a.k || a.output_stride < half)
    return fail(GDN_ERR_GEOMETRY, "a row stride is shorter than its row");
  if (!aligned16(a.output) || !aligned16(a.x) || !aligned16(a.w))
    return fail(GDN_ERR_GEOMETRY, "output, x and w must be 16-byte aligned");
  if (a.max_active_clusters <= 0 || a.reserved != 0)
    return fail(GDN_ERR_GEOMETRY, "max_active_clusters must be positive and reserved 0");
  const uint64_t out_bytes = static_cast<uint64_t>((a.m - 1) * a.output_stride + half) * 2;
  const uint64_t x_bytes = static_cast<uint64_t>((a.m - 1) * a.x_stride + a.k) * 2;
  const uint64_t w_bytes = static_cast<uint64_t>(a.n * a.k) * 2;
  if (overlaps(a.output, out_bytes, a.x, x_bytes) || overlaps(a.output, out_bytes, a.w, w_bytes))
    return fail(GDN_ERR_GEOMETRY, "output overlaps x or w");
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_refs == 0) return fail(GDN_ERR_KERNEL, "the SwiGLU GEMM module is not loaded (gdn_swiglu_load first)");
  }
  const int32_t m = static_cast<int32_t>(a.m), n = static_cast<int32_t>(a.n), k = static_cast<int32_t>(a.k);
  gdn_quack_swiglu_sm90_Tensor_x_t x{const_cast<void*>(a.x), {m, k}, {a.x_stride}};
  gdn_quack_swiglu_sm90_Tensor_w_t w{const_cast<void*>(a.w), {n, k}, {a.k}};
  gdn_quack_swiglu_sm90_Tensor_out_t out{a.output, {m, static_cast<int32_t>(half)}, {a.output_stride}};
  const int32_t ret = cute_dsl_gdn_quack_swiglu_sm90_wrapper(&g_module, &x, &w, &out, a.max_active_clusters,
                                                             static_cast<cudaStream_t>(a.stream));
  if (ret != 0) {
    char msg[160];
    std::snprintf(msg, sizeof(msg), "the exported kernel returned %d (%s)", ret,
                  cudaGetErrorString(static_cast<cudaError_t>(ret)));
    return fail(GDN_ERR_KERNEL, msg);
  }
  return GDN_OK;
}

}  // extern "C"
