// Part of model_kernels.cu (included there in this order, after
// model_common.cuh; not a standalone header): SwiGLU's silu_mul, row copies
// between state slots, and the random fills of the benchmarks.
#pragma once

// SwiGLU: out = bf16(bf16(silu(gate)) * up), gate_up = [T, 2I] (gate | up).
// Each thread owns 8 consecutive columns of a row (16-byte loads and stores
// where I % 8 == 0): grid rows * ceil(I / 2048), block 256. Why: one thread
// per element with a 64-bit division for its row ran at ~2.6x the copy
// time on the H200 (ncu, 2026-12-01: 290 us a layer at 8192 tokens).
extern "C" __global__ void silu_mul_bf16(bf16* __restrict__ out, const bf16* __restrict__ gate_up,
                                         int64_t rows, int inter) {
    const int per_row = (inter + 2047) / 2048;
    const int64_t r = blockIdx.x / per_row;
    const int c0 = ((int)(blockIdx.x % per_row) * blockDim.x + threadIdx.x) * 8;
    if (r >= rows || c0 >= inter) return;
    const bf16* gate = gate_up + r * 2 * inter + c0;
    const bf16* up = gate + inter;
    bf16* dst = out + r * inter + c0;
    if ((inter & 7) == 0) {
        const uint4 gv = *reinterpret_cast<const uint4*>(gate);
        const uint4 uv = *reinterpret_cast<const uint4*>(up);
        const bf16* g8 = reinterpret_cast<const bf16*>(&gv);
        const bf16* u8 = reinterpret_cast<const bf16*>(&uv);
        uint4 ov;
        bf16* o8 = reinterpret_cast<bf16*>(&ov);
#pragma unroll
        for (int e = 0; e < 8; ++e) o8[e] = bf(rbf(silu(f(g8[e]))) * f(u8[e]));
        *reinterpret_cast<uint4*>(dst) = ov;
    } else {
        for (int e = 0; e < 8 && c0 + e < inter; ++e)
            dst[e] = bf(rbf(silu(f(gate[e]))) * f(up[e]));
    }
}

// dst[dst_rows[n] or n] = src[src_rows[n] or n], rows of `width` elements
// (state slots to and from a packed batch, last tokens to the lm_head). The
// mixed-type instances widen a bf16 state's slots into the GDN prefill's f32
// initial state and round its f32 final state back to nearest-even bf16.
// grid (N, ceil(width / 1024)), block 256.
__device__ __forceinline__ float convert_elem(float x, float*) { return x; }
__device__ __forceinline__ bf16 convert_elem(bf16 x, bf16*) { return x; }
__device__ __forceinline__ float convert_elem(bf16 x, float*) { return f(x); }
__device__ __forceinline__ bf16 convert_elem(float x, bf16*) { return bf(x); }
template <typename TD, typename TS>
__device__ void copy_rows_impl(TD* dst, const int32_t* dst_rows, const TS* src,
                               const int32_t* src_rows, int64_t width) {
    const int n = blockIdx.x;
    const int64_t d = dst_rows ? dst_rows[n] : n, s = src_rows ? src_rows[n] : n;
    const int64_t begin = (int64_t)blockIdx.y * 1024;
    for (int64_t e = begin + threadIdx.x; e < width && e < begin + 1024; e += blockDim.x)
        dst[d * width + e] = convert_elem(src[s * width + e], (TD*)nullptr);
}
extern "C" __global__ void copy_rows_f32(float* dst, const int32_t* dst_rows, const float* src,
                                         const int32_t* src_rows, int64_t width) {
    copy_rows_impl(dst, dst_rows, src, src_rows, width);
}
extern "C" __global__ void copy_rows_bf16(bf16* dst, const int32_t* dst_rows, const bf16* src,
                                          const int32_t* src_rows, int64_t width) {
    copy_rows_impl(dst, dst_rows, src, src_rows, width);
}
extern "C" __global__ void copy_rows_bf16_to_f32(float* dst, const int32_t* dst_rows,
                                                 const bf16* src, const int32_t* src_rows,
                                                 int64_t width) {
    copy_rows_impl(dst, dst_rows, src, src_rows, width);
}
extern "C" __global__ void copy_rows_f32_to_bf16(bf16* dst, const int32_t* dst_rows,
                                                 const float* src, const int32_t* src_rows,
                                                 int64_t width) {
    copy_rows_impl(dst, dst_rows, src, src_rows, width);
}

// Deterministic pseudo-random fill (benchmarks with random weights): a hash of
// (seed, index) mapped to uniform [-1, 1) times `scale`, plus `offset`.
__device__ __forceinline__ float hash_uniform(uint64_t seed, uint64_t i) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * (2.f / 16777216.f) - 1.f;
}
extern "C" __global__ void fill_uniform_bf16(bf16* out, int64_t n, uint64_t seed, float scale,
                                             float offset) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = bf(offset + scale * hash_uniform(seed, i));
}
extern "C" __global__ void fill_uniform_f32(float* out, int64_t n, uint64_t seed, float scale,
                                            float offset) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = offset + scale * hash_uniform(seed, i);
}
