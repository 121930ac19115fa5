// Host emulation of the CUDA features the DeltaNet decode kernels use (see
// main.cpp): one OS thread per CUDA thread of one block, blocks one after
// another, a barrier for __syncthreads and per warp around each shuffle, a
// mutex for the atomics; bf16 as its bit pattern with round-to-nearest-even.
#pragma once
#include <cstdint>
#include <cmath>
#include <cstring>
#include <thread>
#include <barrier>
#include <mutex>
#include <vector>
#include <memory>
#include <functional>
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
inline thread_local Dim3 threadIdx;
inline Dim3 blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define __shared__ static
inline std::barrier<>* g_block;
inline std::barrier<>* g_warp[32];
inline std::mutex g_atomic;
inline uint64_t g_slot[1024];
inline void __syncthreads() { g_block->arrive_and_wait(); }
inline void __threadfence() {}
inline void warp_bar() { g_warp[threadIdx.x >> 5]->arrive_and_wait(); }
template <class T> T __shfl_xor_sync(unsigned, T v, int o) {
  uint64_t b = 0; memcpy(&b, &v, sizeof(T)); g_slot[threadIdx.x] = b; warp_bar();
  uint64_t r = g_slot[(threadIdx.x & ~31u) | ((threadIdx.x & 31u) ^ (unsigned)o)]; warp_bar();
  T out; memcpy(&out, &r, sizeof(T)); return out;
}
template <class T> T __shfl_sync(unsigned, T v, int src) {
  uint64_t b = 0; memcpy(&b, &v, sizeof(T)); g_slot[threadIdx.x] = b; warp_bar();
  uint64_t r = g_slot[(threadIdx.x & ~31u) | ((unsigned)src & 31u)]; warp_bar();
  T out; memcpy(&out, &r, sizeof(T)); return out;
}
inline void __syncwarp() { warp_bar(); }
inline bool __any_sync(unsigned, bool p) {
  g_slot[threadIdx.x] = p; warp_bar();
  bool any = false;
  for (unsigned l = 0; l < 32; ++l) any |= g_slot[(threadIdx.x & ~31u) | l] != 0;
  warp_bar(); return any;
}
inline unsigned atomicAdd(unsigned* a, unsigned v) { std::lock_guard g(g_atomic); unsigned o = *a; *a += v; return o; }
struct __nv_bfloat16 { uint16_t bits; };
inline float __bfloat162float(__nv_bfloat16 x) { uint32_t u = (uint32_t)x.bits << 16; float f; memcpy(&f, &u, 4); return f; }
inline __nv_bfloat16 __float2bfloat16(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return {(uint16_t)((u >> 16) | 0x40)};
  u += 0x7fff + ((u >> 16) & 1); return {(uint16_t)(u >> 16)};
}
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
using std::min;
inline uint2 __ldcg(const uint2* p) { return *p; }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }

// Runs `k` over grid x block (blocks one after another, one OS thread per CUDA thread).
inline void launch(Dim3 grid, unsigned threads, std::function<void()> k) {
  gridDim = grid; blockDim = {threads, 1, 1};
  for (unsigned z = 0; z < grid.z; ++z) for (unsigned y = 0; y < grid.y; ++y) for (unsigned x = 0; x < grid.x; ++x) {
    blockIdx = {x, y, z};
    std::barrier<> block(threads); g_block = &block;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    for (unsigned w = 0; w < threads / 32; ++w) { warps.emplace_back(new std::barrier<>(32)); g_warp[w] = warps.back().get(); }
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < threads; ++t) ts.emplace_back([=] { threadIdx.x = t; k(); });
    for (auto& t : ts) t.join();
  }
}
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return {u}; }
