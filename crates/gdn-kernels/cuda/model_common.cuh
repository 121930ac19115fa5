// Part of model_kernels.cu (included there first; the DeltaNet CPU emulation in
// checks/deltanet_decode_emulation includes it too): the bf16 type and the
// helpers every part uses (conversions, roundings, SiLU, warp and block sums,
// bit copies and 4 x bf16 loads and stores) and the kernels' shared constants.
#pragma once

typedef __nv_bfloat16 bf16;

namespace {

constexpr int kGdnDim = 128;
constexpr int kMaxConvTaps = 8;
constexpr int kMaxGqa = 8;
constexpr int kAttnWarps = 4;

__device__ __forceinline__ float f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 bf(float x) { return __float2bfloat16(x); }
// Rounds through bf16, where HF materialises a bf16 tensor.
__device__ __forceinline__ float rbf(float x) { return f(bf(x)); }
__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Sum over the block; every thread gets the result. blockDim.x <= 1024.
__device__ float block_sum(float x) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    x = warp_sum(x);
    __syncthreads();  // `partial` may still be read by a previous call
    if (lane == 0) partial[warp] = x;
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    float t = lane < warps ? partial[lane] : 0.f;
    return warp_sum(t);
}

}  // namespace

// Bit copies between register types (bf16 lanes <-> uint2/uint4) go through
// __builtin_memcpy, not <cstring>'s memcpy: that one is declared by the build
// machine's glibc, and where the host compiler enables _FORTIFY_SOURCE
// (Ubuntu's gcc does) it becomes an inline __builtin___memcpy_chk wrapper that
// reaches the device code too. The H200's Ubuntu 24.04 build of this file gave
// other model_kernels sm_100/sm_120 cubins than Debian's (2026-12-02, docs/
// reproducibility.md); the builtin does not depend on the host's headers.
__device__ __forceinline__ void copy_bits(void* dst, const void* src, size_t bytes) {
    __builtin_memcpy(dst, src, bytes);
}
// Four bf16 to an 8-byte aligned address in one store.
__device__ __forceinline__ void store4(bf16* dst, const bf16 (&v)[4]) {
    uint2 packed;
    copy_bits(&packed, v, sizeof packed);
    *reinterpret_cast<uint2*>(dst) = packed;
}
// Four consecutive bf16 as one uint2: one 8-byte load where `aligned`.
// Through copy_bits: no bf16 object is written through a uint2 lvalue (the
// host emulation's compiler optimises on that).
__device__ __forceinline__ uint2 load4(const bf16* src, bool aligned) {
    if (aligned) return *reinterpret_cast<const uint2*>(src);
    bf16 x[4] = {src[0], src[1], src[2], src[3]};
    uint2 raw;
    copy_bits(&raw, x, sizeof raw);
    return raw;
}
__device__ __forceinline__ float unpack4(const uint2& raw, int e) {
    bf16 x[4];
    copy_bits(x, &raw, sizeof raw);
    return f(x[e]);
}
