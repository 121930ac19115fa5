// Host emulation of the CUDA features crates/gdn-kernels/cuda/sampling.cu
// uses, so that its source runs on a machine without a GPU: one OS thread
// per CUDA thread of one block (blocks run one after another), a barrier for
// __syncthreads, a barrier per warp around each warp intrinsic (a warp
// intrinsic reached by part of a warp deadlocks here, as it would misbehave
// there), one mutex for the atomics. Host libm's log/exp stand in for
// CUDA's (both within an ulp), so this checks the kernel's logic, not the
// device's rounding.
#pragma once
#include <cstdint>
#include <cmath>
#include <cstring>
#include <thread>
#include <barrier>
#include <mutex>
#include <vector>
#include <algorithm>
#include <memory>
using std::isnan; using std::isfinite; using std::max; using std::min;
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
inline thread_local Dim3 threadIdx;
inline Dim3 blockIdx, blockDim{1024, 1, 1};
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __restrict__
#define __shared__ static
inline std::barrier<>* g_block;
inline std::barrier<>* g_warp[32];
inline std::mutex g_atomic;
inline uint64_t g_slot[1024];
inline int g_vals[1024];
inline void __syncthreads() { g_block->arrive_and_wait(); }
inline int __syncthreads_count(int p) {
  g_vals[threadIdx.x] = p != 0; __syncthreads();
  int c = 0; for (int i = 0; i < 1024; ++i) c += g_vals[i];
  __syncthreads(); return c;
}
inline int __syncthreads_or(int p) { return __syncthreads_count(p) > 0; }
inline void warp_bar() { g_warp[threadIdx.x >> 5]->arrive_and_wait(); }
template <class T> T __shfl_xor_sync(unsigned, T v, int o) {
  uint64_t b = 0; memcpy(&b, &v, sizeof(T)); g_slot[threadIdx.x] = b; warp_bar();
  uint64_t r = g_slot[(threadIdx.x & ~31u) | ((threadIdx.x & 31u) ^ (unsigned)o)]; warp_bar();
  T out; memcpy(&out, &r, sizeof(T)); return out;
}
inline unsigned __match_any_sync(unsigned, unsigned d) {
  g_slot[threadIdx.x] = d; warp_bar(); unsigned m = 0, base = threadIdx.x & ~31u;
  for (unsigned l = 0; l < 32; ++l) if (g_slot[base + l] == d) m |= 1u << l;
  warp_bar(); return m;
}
inline unsigned __ballot_sync(unsigned, int p) {
  g_slot[threadIdx.x] = p != 0; warp_bar(); unsigned m = 0, base = threadIdx.x & ~31u;
  for (unsigned l = 0; l < 32; ++l) if (g_slot[base + l]) m |= 1u << l;
  warp_bar(); return m;
}
inline unsigned atomicAdd(unsigned* a, unsigned v) { std::lock_guard g(g_atomic); unsigned o = *a; *a += v; return o; }
inline double atomicAdd(double* a, double v) { std::lock_guard g(g_atomic); double o = *a; *a += v; return o; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fsub_rn(float a, float b) { return a - b; }
