// The CUDA features model_moe.cuh uses beyond the DeltaNet emulation's shim
// (checks/deltanet_decode_emulation/cuda_shim.h, included): shfl_up, int
// atomics, uint4, WMMA with every lane holding the whole 16 x 16 tile
// (element i of two accumulators still pairs up, as the epilogue needs),
// and the mma.sync m16n8k16 of model_moe.cuh's tensor-core GEMV.
#pragma once
#include "cuda_shim.h"
#include <algorithm>
template <class T> T __shfl_up_sync(unsigned, T v, int o) {
  uint64_t b = 0; memcpy(&b, &v, sizeof(T)); g_slot[threadIdx.x] = b; warp_bar();
  unsigned lane = threadIdx.x & 31u;
  uint64_t r = lane >= (unsigned)o ? g_slot[threadIdx.x - o] : b; warp_bar();
  T out; memcpy(&out, &r, sizeof(T)); return out;
}
inline int atomicAdd(int* a, int v) { std::lock_guard g(g_atomic); int o = *a; *a += v; return o; }
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
#define __align__(n) __attribute__((aligned(n)))
using std::max;
namespace nvcuda { namespace wmma {
struct matrix_a {}; struct matrix_b {}; struct accumulator {}; struct row_major {}; struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
// Every lane holds the whole 16 x 16 tile (the emulation's stand-in for the
// distributed fragment; element i of two accumulators still pair up).
template <class Use, int M, int N, int K, class T, class L = void> struct fragment {
  static constexpr int num_elements = M * N; float x[M * N];
};
template <class U, class T, class L> void load_matrix_sync(fragment<U, 16, 16, 16, T, L>& f, const T* p, unsigned ldm) {
  for (int r = 0; r < 16; ++r) for (int c = 0; c < 16; ++c) {
    // row_major: element (r, c) at p[r * ldm + c]; col_major: at p[c * ldm + r].
    f.x[r * 16 + c] = std::is_same<L, row_major>::value ? __bfloat162float(p[r * ldm + c]) : __bfloat162float(p[c * ldm + r]);
  }
}
template <class A, class B> void mma_sync(fragment<accumulator,16,16,16,float>& d, const A& a, const B& b, const fragment<accumulator,16,16,16,float>& c) {
  float o[256];
  for (int i = 0; i < 16; ++i) for (int j = 0; j < 16; ++j) { float s = c.x[i*16+j]; for (int k = 0; k < 16; ++k) s += a.x[i*16+k] * b.x[k*16+j]; o[i*16+j] = s; }
  memcpy(d.x, o, sizeof o);
}
inline void fill_fragment(fragment<accumulator,16,16,16,float>& f, float v) { for (auto& e : f.x) e = v; }
inline void store_matrix_sync(float* p, const fragment<accumulator,16,16,16,float>& f, unsigned ldm, layout_t) {
  warp_bar();  // lanes write the same values: one lane writes
  if ((threadIdx.x & 31) == 0) for (int i = 0; i < 16; ++i) for (int j = 0; j < 16; ++j) p[i * ldm + j] = f.x[i*16+j];
  warp_bar();
}
}}
// mma.sync m16n8k16 (bf16 in, fp32 out) as model_moe.cuh's moe_mma_16816
// documents the fragments: the warp's lanes exchange them, then each lane
// sums its four outputs over k in order in fp32 (the tensor cores' order
// is unspecified: compare with a tolerance).
inline uint32_t g_frag[1024][6];
inline float bf16_lo(uint32_t v) { uint32_t u = v << 16; float f; memcpy(&f, &u, 4); return f; }
inline float bf16_hi(uint32_t v) { uint32_t u = v & 0xffff0000u; float f; memcpy(&f, &u, 4); return f; }
#define GDN_HOST_EMULATION 1
inline void moe_mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  const unsigned base = threadIdx.x & ~31u, lane = threadIdx.x & 31u;
  const uint32_t mine[6] = {a0, a1, a2, a3, b0, b1};
  memcpy(g_frag[threadIdx.x], mine, sizeof mine);
  warp_bar();
  // A[r][k], B[k][n] from the lanes holding them.
  auto A = [&](int r, int k) {
    const int c = (k & 7) >> 1, hi = k >= 8, l = (r & 7) * 4 + c;
    const uint32_t v = g_frag[base + l][(r >= 8) + 2 * hi];
    return (k & 1) ? bf16_hi(v) : bf16_lo(v);
  };
  auto B = [&](int k, int n) {
    const int c = (k & 7) >> 1, hi = k >= 8, l = n * 4 + c;
    const uint32_t v = g_frag[base + l][4 + hi];
    return (k & 1) ? bf16_hi(v) : bf16_lo(v);
  };
  const int g = lane >> 2, c = lane & 3;
  for (int q = 0; q < 4; ++q) {
    const int r = g + 8 * (q >> 1), n = 2 * c + (q & 1);
    float s = d[q];
    for (int k = 0; k < 16; ++k) s += A(r, k) * B(k, n);
    d[q] = s;
  }
  warp_bar();
}
