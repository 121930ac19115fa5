// The CUDA features model_moe.cuh uses beyond the DeltaNet emulation's shim
// (checks/deltanet_decode_emulation/cuda_shim.h, included): shfl_up, int
// atomics, uint4, and WMMA with every lane holding the whole 16 x 16 tile
// (element i of two accumulators still pairs up, as the epilogue needs).
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
