// The Qwen3.5 model kernels around the GEMMs and the GDN prefill: embedding,
// norms, the DeltaNet conv/gate/decode steps, attention over a paged KV cache.
// Compiled ahead of time into plain cubins (sm_80 .. sm_120, no PTX), loaded
// with cuModuleLoadData and launched by name from src/model_ops/, which owns
// every launch geometry and checks every buffer length before launching.
//
// Numerics follow Hugging Face's bf16 forward (transformers 5.17,
// modeling_qwen3_5.py): activations are stored in bf16 wherever HF stores
// them, arithmetic inside a kernel is fp32, recurrent state is fp32. No fast
// math: RoPE angles of positions > 4096 need the precise sinf/cosf.
//
// Shared layouts (packed varlen batch of N sequences, T tokens):
//   tok_seq[T]       batch index of each token's sequence
//   cu_seqlens[N+1]  token offsets of the sequences in this batch (int32)
//   seq_slot[N]      state slot of each sequence (recurrent + conv state)
//   positions[T]     absolute position of each token in its sequence
//   block_table[N, max_blocks]  KV-cache page of each page-sized run of positions
//   conv state       bf16 [slots, kw-1, C], oldest input first
//   recurrent state  f32 [slots, Hv, 128 (v), 128 (k)], k contiguous (FlashInfer's)
//   KV cache         bf16 [pages, page_size, Hkv, D]

#include <cuda_bf16.h>
#include <mma.h>
#include <cstdint>

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

// out[t] = table[ids[t]]; grid T, block any.
extern "C" __global__ void embedding_bf16(bf16* __restrict__ out, const bf16* __restrict__ table,
                                          const int32_t* __restrict__ ids, int hidden) {
    const int64_t t = blockIdx.x;
    const bf16* row = table + (int64_t)ids[t] * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[t * hidden + i] = row[i];
}

// Zero-centred RMSNorm with the residual add in front:
//   if delta: residual = bf16(residual + delta)      (HF: hidden = residual + hidden)
//   out = bf16(residual / rms(residual) * (1 + w))
// grid T, block 256, dynamic shared memory hidden floats.
extern "C" __global__ void add_rmsnorm_bf16(bf16* __restrict__ out, bf16* __restrict__ residual,
                                            const bf16* __restrict__ delta,
                                            const float* __restrict__ weight, int hidden,
                                            float eps) {
    extern __shared__ float xs[];
    const int64_t base = (int64_t)blockIdx.x * hidden;
    float ss = 0.f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float x = f(residual[base + i]);
        if (delta != nullptr) {
            x = rbf(x + f(delta[base + i]));
            residual[base + i] = bf(x);
        }
        xs[i] = x;
        ss += x * x;
    }
    const float r = rsqrtf(block_sum(ss) / hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        out[base + i] = bf(xs[i] * r * (1.f + weight[i]));
}

// add_rmsnorm_bf16 for rows of hidden % 8 == 0 and hidden <= 8 * 1024: each
// thread keeps 8 consecutive values in registers (one 16-byte load of the
// residual and of delta), so a row costs one round trip to memory instead of
// hidden / 256 dependent ones. Why: a decode step runs 65 norms over one row
// each; the strided loop above took 9.7 us a row on the H200 (ncu,
// 2026-12-01), 15% of the batch-1 step. grid T, block hidden / 8 rounded up
// to a warp, no shared memory beyond block_sum's.
extern "C" __global__ void add_rmsnorm_vec8_bf16(bf16* __restrict__ out, bf16* __restrict__ residual,
                                                 const bf16* __restrict__ delta,
                                                 const float* __restrict__ weight, int hidden,
                                                 float eps) {
    const int64_t base = (int64_t)blockIdx.x * hidden;
    const int i0 = threadIdx.x * 8;
    const bool active = i0 < hidden;
    float x[8];
    float ss = 0.f;
    if (active) {
        uint4 rv = *reinterpret_cast<const uint4*>(residual + base + i0);
        bf16* r8 = reinterpret_cast<bf16*>(&rv);
        if (delta != nullptr) {
            const uint4 dv = *reinterpret_cast<const uint4*>(delta + base + i0);
            const bf16* d8 = reinterpret_cast<const bf16*>(&dv);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                x[e] = rbf(f(r8[e]) + f(d8[e]));
                r8[e] = bf(x[e]);
            }
            *reinterpret_cast<uint4*>(residual + base + i0) = rv;
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) x[e] = f(r8[e]);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) ss += x[e] * x[e];
    }
    const float r = rsqrtf(block_sum(ss) / hidden + eps);
    if (active) {
        const float4 w0 = *reinterpret_cast<const float4*>(weight + i0);
        const float4 w1 = *reinterpret_cast<const float4*>(weight + i0 + 4);
        const float w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        uint4 ov;
        bf16* o8 = reinterpret_cast<bf16*>(&ov);
#pragma unroll
        for (int e = 0; e < 8; ++e) o8[e] = bf(x[e] * r * (1.f + w[e]));
        *reinterpret_cast<uint4*>(out + base + i0) = ov;
    }
}

// DeltaNet input side for every token: causal depthwise conv1d over the
// [q | k | v] channels (conv state supplies the inputs before the chunk),
// SiLU, q/k L2 norm (eps 1e-6), and the gates
//   beta = sigmoid(b)                          (bf16, as HF's b.sigmoid())
//   alpha = exp(-exp(A_log) * softplus(a + dt_bias))   (fp32)
// proj is the fused input projection [T, ld]: qkv at column 0, b at col_b,
// a at col_a. One warp per (head group of 128 channels: q heads, then k
// heads, then v heads; `tokens_per_warp` <= 32 consecutive tokens), 4
// channels a lane (8-byte accesses where ld allows), 8 warps a block: grid
// ceil(ceil(T / tokens_per_warp) * (2*Hk + Hv) / 8), block 256. The caller
// takes 1 token a warp for small batches (decode: every warp in flight at
// once) and more for prefill.
// A warp walks its tokens as a sliding window: the taps' inputs before the
// current token stay in registers (`window`), each token's own row is loaded
// once, `Prefetch` rows ahead of its use, and the conv state is read
// only for the first kw - 1 tokens of a sequence's chunk (a tap whose input
// precedes the chunk). The per-token sequence lookups are loaded once per
// warp, a token a lane, and passed by shuffles. Its channels' conv weights
// stay in registers for all its tokens; the group-0 warp also computes its
// tokens' gates.
// Why: one 128-thread block per (token, group) took 590 us a layer at 8192
// tokens on the H200 (ncu, 2026-12-01: 11.6% of the 4B's prefill, ~9x its
// memory traffic at the copy rate); a warp per (token, group) took as long
// (the conv weights, re-read for every token, dominated); a warp over 8
// tokens with the weights in registers but every tap re-read and every
// lookup a dependent load chain per token took 311 us (~5x the copy time).
// The sums keep the former kernels' order (taps oldest first; the L2 norm as
// a butterfly over each 32 channels, then (w0 + w2) + (w1 + w3) over the
// four 32-channel quarters), which gdn_decode_fused reproduces: the values
// are the same bits as before and as the fused decode's.
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
// MaxTaps bounds kw - 1 and sizes the registers: the general kernel
// (kMaxConvTaps) used 118 registers a thread (16 warps an SM with 256-thread
// blocks); gdn_conv_prep_k4 is the same body for kw == 4 (Qwen3.5's taps)
// as a constant, with fewer registers and 6 rows in flight a warp instead of
// 4 (and its steady path, below). Nsight Compute put the kernel at 62% of the SM's issue
// rate and 23% of DRAM bandwidth at 8k tokens: instructions, not bytes, bound
// it, and a constant kw removes the per-tap bounds checks.
// One parameter list for the body and both kernels.
#define GDN_CONV_PREP_PARAMS                                                         \
    bf16* __restrict__ q_out, bf16* __restrict__ k_out, bf16* __restrict__ v_out,   \
        float* __restrict__ alpha_out, float* __restrict__ beta_out,                \
        const bf16* __restrict__ proj, int ld, int col_b, int col_a,                \
        const float* __restrict__ conv_w,    /* [C, kw] */                          \
        const bf16* __restrict__ conv_state, /* [slots, kw-1, C] */                 \
        const int32_t* __restrict__ tok_seq, const int32_t* __restrict__ cu_seqlens, \
        const int32_t* __restrict__ seq_slot, const float* __restrict__ a_log,      \
        const float* __restrict__ dt_bias, int hk, int hv, int kw, int num_tokens,  \
        int tokens_per_warp
// One token's conv outputs from its four channels' sums: SiLU rounded to
// bf16 as HF stores it, then for a q/k group (`qk`, warp-uniform) the L2
// norm over the group's 128 channels. `dst` is this lane's 4 outputs.
__device__ __forceinline__ void conv_emit(const float (&acc)[4], bool qk, bf16* dst) {
    float x[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = rbf(silu(acc[e]));
    bf16 o[4];
    if (qk) {
        // Butterfly levels 16, 8, 4 of a 32-channel quarter are lane xors
        // 4, 2, 1 here; levels 2 and 1 are within the lane; then the quarters.
        float ss[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            ss[e] = x[e] * x[e];
            for (int m = 4; m > 0; m >>= 1) ss[e] += __shfl_xor_sync(0xffffffffu, ss[e], m);
        }
        const float quarter = (ss[0] + ss[2]) + (ss[1] + ss[3]);
        const float half = quarter + __shfl_xor_sync(0xffffffffu, quarter, 16);
        const float tot = half + __shfl_xor_sync(0xffffffffu, half, 8);
        const float r = rsqrtf(tot + 1e-6f);
#pragma unroll
        for (int e = 0; e < 4; ++e) o[e] = bf(x[e] * r);
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[e] = bf(x[e]);
    }
    store4(dst, o);
}
// The gates of tokens [t0, t_end), a value head a lane (run by group 0's warp).
__device__ __forceinline__ void conv_gates(float* __restrict__ alpha_out,
                                           float* __restrict__ beta_out,
                                           const bf16* __restrict__ proj, int ld, int col_b,
                                           int col_a, const float* __restrict__ a_log,
                                           const float* __restrict__ dt_bias, int hv, int t0,
                                           int t_end) {
    for (int t = t0; t < t_end; ++t) {
        for (int h = threadIdx.x & 31; h < hv; h += 32) {
            const float b = f(proj[(int64_t)t * ld + col_b + h]);
            const float a = f(proj[(int64_t)t * ld + col_a + h]) + dt_bias[h];
            const float softplus = a > 20.f ? a : log1pf(expf(a));
            beta_out[(int64_t)t * hv + h] = rbf(sigmoid(b));
            alpha_out[(int64_t)t * hv + h] = expf(-expf(a_log[h]) * softplus);
        }
    }
}
// A warp's share of the conv: tokens [t0, t_end) of channel group g (q, k or
// v head). False for the warps past the last tile (work is whole warps only).
struct ConvWarpTile {
    int t0, t_end, g;
};
__device__ __forceinline__ bool conv_warp_tile(int num_tokens, int tokens_per_warp, int groups,
                                               ConvWarpTile& tile) {
    const int64_t work = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int tiles = (num_tokens + tokens_per_warp - 1) / tokens_per_warp;
    if (work >= (int64_t)tiles * groups) return false;
    tile.t0 = (int)(work / groups) * tokens_per_warp;
    tile.g = (int)(work % groups);
    tile.t_end = min(tile.t0 + tokens_per_warp, num_tokens);
    return true;
}
// Token t's output row of group g: the first hk groups are q heads, the next
// hk k heads, the last hv v heads.
__device__ __forceinline__ bf16* conv_out_row(bf16* q_out, bf16* k_out, bf16* v_out, int hk,
                                              int hv, int g, int64_t t) {
    const int D = kGdnDim;
    return g < hk       ? q_out + (t * hk + g) * D
           : g < 2 * hk ? k_out + (t * hk + (g - hk)) * D
                        : v_out + (t * hv + (g - 2 * hk)) * D;
}
template <int MaxTaps, int Prefetch, int FixedKw>
__device__ __forceinline__ void conv_prep_body(GDN_CONV_PREP_PARAMS) {
    // A compile-time width folds the taps' bounds checks and window shifts.
    const int width = FixedKw > 0 ? FixedKw : kw;
    const int D = kGdnDim;
    const int groups = 2 * hk + hv;
    const int C = groups * D;
    const int lane = threadIdx.x & 31;
    ConvWarpTile tile;
    if (!conv_warp_tile(num_tokens, tokens_per_warp, groups, tile)) return;
    const int t0 = tile.t0, t_end = tile.t_end, g = tile.g;
    const int c0 = g * D + 4 * lane;  // this lane's first channel
    const int taps = width - 1;          // inputs before the current token
    // width <= MaxTaps + 1 (the ops check it: MaxTaps bounds the state).
    float w[4][MaxTaps + 1];
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
        for (int j = 0; j <= MaxTaps; ++j) w[e][j] = j < width ? conv_w[(c0 + e) * width + j] : 0.f;
    // 8-byte accesses need 4-channel alignment of every proj row.
    const bool vec = (ld & 3) == 0;
    // Lane l holds token t0 + l's index within its chunk and its slot.
    int my_index = 0;
    int64_t my_slot = 0;
    if (t0 + lane < t_end) {
        const int s = tok_seq[t0 + lane];
        my_index = t0 + lane - cu_seqlens[s];
        my_slot = seq_slot[s];
    }
    // window[j]: proj row t - taps + j of the current token t (rows before
    // the batch never count: their taps read the conv state).
    uint2 window[MaxTaps];
#pragma unroll
    for (int j = 0; j < MaxTaps; ++j) {
        const int row = t0 - taps + j;
        window[j] = j < taps && row >= 0 ? load4(proj + (int64_t)row * ld + c0, vec) : make_uint2(0, 0);
    }
    uint2 ahead[Prefetch];
#pragma unroll
    for (int u = 0; u < Prefetch; ++u)
        ahead[u] = t0 + u < t_end ? load4(proj + (int64_t)(t0 + u) * ld + c0, vec) : make_uint2(0, 0);
    for (int tb = t0; tb < t_end; tb += Prefetch) {
        uint2 next[Prefetch];
#pragma unroll
        for (int u = 0; u < Prefetch; ++u) {
            const int row = tb + Prefetch + u;
            next[u] = row < t_end ? load4(proj + (int64_t)row * ld + c0, vec) : make_uint2(0, 0);
        }
#pragma unroll
        for (int u = 0; u < Prefetch; ++u) {
            const int t = tb + u;
            if (t >= t_end) break;  // warp-uniform
            const int i = __shfl_sync(0xffffffffu, my_index, t - t0);
            const int64_t slot = __shfl_sync(0xffffffffu, my_slot, t - t0);
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int j = 0; j <= MaxTaps; ++j) {
                if (j > taps) break;
                const int src = i - taps + j;  // chunk index of the tap's input
                uint2 x;
                if (j == taps) {
                    x = ahead[u];
                } else if (src >= 0) {
                    x = window[j];
                } else {  // the conv state is always 8-byte aligned
                    x = load4(conv_state + (slot * taps + (taps + src)) * C + c0, true);
                }
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[e] += w[e][j] * unpack4(x, e);
            }
#pragma unroll
            for (int j = 0; j + 1 < MaxTaps; ++j)
                if (j + 1 < taps) window[j] = window[j + 1];
#pragma unroll
            for (int j = 0; j < MaxTaps; ++j)
                if (j + 1 == taps) window[j] = ahead[u];
            bf16* dst = conv_out_row(q_out, k_out, v_out, hk, hv, g, t);
            conv_emit(acc, g < 2 * hk, dst + 4 * lane);
        }
#pragma unroll
        for (int u = 0; u < Prefetch; ++u) ahead[u] = next[u];
    }
    if (g == 0) conv_gates(alpha_out, beta_out, proj, ld, col_b, col_a, a_log, dt_bias, hv, t0, t_end);
}

#define GDN_CONV_PREP_ARGS                                                                     \
    q_out, k_out, v_out, alpha_out, beta_out, proj, ld, col_b, col_a, conv_w, conv_state,     \
        tok_seq, cu_seqlens, seq_slot, a_log, dt_bias, hk, hv, kw, num_tokens, tokens_per_warp
extern "C" __global__ void gdn_conv_prep(GDN_CONV_PREP_PARAMS) {
    conv_prep_body<kMaxConvTaps, 4, 0>(GDN_CONV_PREP_ARGS);
}
// The steady state of kw == 4: a warp whose tokens are all at least 3 into
// their sequences (every tap is a row of this batch, none reads the conv
// state). Returns false, having done nothing, for any other warp. The same
// arithmetic as conv_prep_body (the same bits) without its per-token work:
// no sequence lookups or per-tap checks, each row unpacked once, pointers
// advanced by a row instead of recomputed in 64 bits for every access, and
// U rows loaded ahead of the U tokens in use.
// Why: Nsight Compute's per-instruction counts for conv_prep_body<3, 6, 4>
// at 8k tokens on the H200 (2026-12-02, seventh session) were 273 warp
// instructions a (token, group), about half of them integer work (address
// arithmetic, the lookups, checks, re-unpacking the taps) around ~120 of
// arithmetic, with the kernel issue-bound at 213 us (25% of DRAM bandwidth).
// This path took it to 170 us with 4 rows ahead at 80 registers (24 warps an
// SM), 162 us with 2 rows ahead at 64 (32 warps an SM; 4 rows ahead spill
// there), and 40 -> 33 us at 1k tokens (ncu, docs/benchmarks.md).
template <int U>
__device__ __forceinline__ bool conv_prep_k4_steady(GDN_CONV_PREP_PARAMS) {
    const int D = kGdnDim;
    const int groups = 2 * hk + hv;
    const int lane = threadIdx.x & 31;
    ConvWarpTile tile;
    if (!conv_warp_tile(num_tokens, tokens_per_warp, groups, tile)) return true;
    const int t0 = tile.t0, t_end = tile.t_end, g = tile.g;
    // 8-byte row accesses need 4-channel alignment of every proj row.
    if ((ld & 3) != 0) return false;
    int my_index = 3;
    if (t0 + lane < t_end) my_index = t0 + lane - cu_seqlens[tok_seq[t0 + lane]];
    if (__any_sync(0xffffffffu, my_index < 3)) return false;
    const int c0 = g * D + 4 * lane;
    float w[4][4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
        for (int j = 0; j < 4; ++j) w[e][j] = conv_w[(c0 + e) * 4 + j];
    // x0..x2: the inputs of the taps before the current token, oldest first.
    const bf16* row = proj + (int64_t)(t0 - 3) * ld + c0;
    float x0[4], x1[4], x2[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        x0[e] = unpack4(load4(row, true), e);
        x1[e] = unpack4(load4(row + ld, true), e);
        x2[e] = unpack4(load4(row + 2 * ld, true), e);
    }
    row += 3 * (int64_t)ld;  // token t0's row
    const bool qk = g < 2 * hk;
    const int64_t step = (int64_t)(qk ? hk : hv) * D;
    bf16* dst = conv_out_row(q_out, k_out, v_out, hk, hv, g, t0) + 4 * lane;
    const int64_t ahead = (int64_t)U * ld;
    uint2 cur[U];
#pragma unroll
    for (int u = 0; u < U; ++u) cur[u] = t0 + u < t_end ? load4(row + u * (int64_t)ld, true) : make_uint2(0, 0);
    int t = t0;
    for (;; t += U) {
        const bool full = t + U <= t_end;  // warp-uniform
        uint2 next[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            next[u] = full && t + U + u < t_end ? load4(row + ahead + u * (int64_t)ld, true) : make_uint2(0, 0);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (!full && t + u >= t_end) break;
            float x3[4], acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                x3[e] = unpack4(cur[u], e);
                acc[e] += w[e][0] * x0[e];
                acc[e] += w[e][1] * x1[e];
                acc[e] += w[e][2] * x2[e];
                acc[e] += w[e][3] * x3[e];
            }
            conv_emit(acc, qk, dst);
            dst += step;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                x0[e] = x1[e];
                x1[e] = x2[e];
                x2[e] = x3[e];
            }
        }
        if (!full) break;
        row += ahead;
#pragma unroll
        for (int u = 0; u < U; ++u) cur[u] = next[u];
    }
    if (g == 0) conv_gates(alpha_out, beta_out, proj, ld, col_b, col_a, a_log, dt_bias, hv, t0, t_end);
    return true;
}
// kw == 4 only (the op picks it then): warps at a sequence's start (their
// taps read the conv state) take the general body, which spills a few
// registers at this kernel's 64 (the steady path does not; see above).
extern "C" __global__ void __launch_bounds__(256, 4) gdn_conv_prep_k4(GDN_CONV_PREP_PARAMS) {
    if (conv_prep_k4_steady<2>(GDN_CONV_PREP_ARGS)) return;
    conv_prep_body<3, 6, 4>(GDN_CONV_PREP_ARGS);
}

// After gdn_conv_prep: each sequence's conv state becomes the last kw-1
// inputs it has seen (older state fills in for chunks shorter than kw-1).
// One thread per (sequence, channel) reads everything before writing, so the
// update is in place. grid (N, ceil(C / 256)), block 256.
extern "C" __global__ void gdn_conv_state_update(bf16* __restrict__ conv_state,
                                                 const bf16* __restrict__ proj, int ld,
                                                 const int32_t* __restrict__ cu_seqlens,
                                                 const int32_t* __restrict__ seq_slot, int C,
                                                 int kw) {
    const int s = blockIdx.x;
    const int start = cu_seqlens[s], len = cu_seqlens[s + 1] - start;
    const int64_t slot = seq_slot[s];
    const int taps = kw - 1;
    for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < C; c += gridDim.y * blockDim.x) {
        bf16 keep[kMaxConvTaps];
        for (int j = 0; j < taps; ++j) {
            const int src = len - taps + j;
            keep[j] = src >= 0 ? proj[(int64_t)(start + src) * ld + c]
                               : conv_state[(slot * taps + (taps + src)) * C + c];
        }
        for (int j = 0; j < taps; ++j) conv_state[(slot * taps + j) * C + c] = keep[j];
    }
}

// One recurrent gated-delta-rule step for a batch of single tokens, in place
// on the state slots (same math as the GDN oracle):
//   S = alpha S;  d = beta (v - S k);  S += d k^T;  out = scale S q
// grid (Hv, N, splits), block 256: one warp per value row, 4 k-columns per
// lane; block z takes rows [z * 128 / splits, (z + 1) * 128 / splits), so a
// batch of one still spreads over Hv * splits blocks.
extern "C" __global__ void gdn_decode_step(bf16* __restrict__ out, float* __restrict__ state,
                                           const int32_t* __restrict__ seq_slot,
                                           const bf16* __restrict__ q, const bf16* __restrict__ k,
                                           const bf16* __restrict__ v,
                                           const float* __restrict__ alpha,
                                           const float* __restrict__ beta, int hk, int hv,
                                           float scale) {
    const int D = kGdnDim;
    const int h = blockIdx.x, n = blockIdx.y;
    const int kh = h / (hv / hk);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float* S = state + ((int64_t)seq_slot[n] * hv + h) * D * D;
    float kk[4], qq[4];
    for (int e = 0; e < 4; ++e) {
        kk[e] = f(k[((int64_t)n * hk + kh) * D + lane * 4 + e]);
        qq[e] = f(q[((int64_t)n * hk + kh) * D + lane * 4 + e]);
    }
    const float a = alpha[(int64_t)n * hv + h], b = beta[(int64_t)n * hv + h];
    const int rows_per_block = D / gridDim.z;
    const int row_end = (blockIdx.z + 1) * rows_per_block;
    for (int row = blockIdx.z * rows_per_block + warp; row < row_end; row += warps) {
        float4* p = reinterpret_cast<float4*>(S + (int64_t)row * D + lane * 4);
        float4 s = *p;
        s.x *= a; s.y *= a; s.z *= a; s.w *= a;
        const float pred = warp_sum(s.x * kk[0] + s.y * kk[1] + s.z * kk[2] + s.w * kk[3]);
        const float d = b * (f(v[((int64_t)n * hv + h) * D + row]) - pred);
        s.x += d * kk[0]; s.y += d * kk[1]; s.z += d * kk[2]; s.w += d * kk[3];
        *p = s;
        const float o = warp_sum(s.x * qq[0] + s.y * qq[1] + s.z * qq[2] + s.w * qq[3]);
        if (lane == 0) out[((int64_t)n * hv + h) * D + row] = bf(o * scale);
    }
}

// DeltaNet output norm (HF Qwen3_5RMSNormGated): per value head,
//   out = bf16( bf16(w * bf16(o / rms(o))) * silu(z) )   (plain weight, not 1 + w)
// z comes from the fused projection at col_z. grid ceil(rows / 8), block 256:
// one warp per (token, head) row of 128, 4 values a lane in 8-byte accesses
// (z too where ld and col_z keep them aligned). Why: 2-byte accesses took
// 96 us a layer at 8192 tokens on the H200 (ncu, 2026-12-01), 2x the copy
// time of its 200 MB.
extern "C" __global__ void gated_rmsnorm_bf16(bf16* __restrict__ out, const bf16* __restrict__ o,
                                              const bf16* __restrict__ proj, int ld, int col_z,
                                              const float* __restrict__ weight, int rows, int hv,
                                              float eps) {
    const int D = kGdnDim;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int64_t t = row / hv, h = row % hv;
    const uint2 o4 = load4(o + (int64_t)row * D + lane * 4, true);
    const uint2 z4 = load4(proj + t * ld + col_z + h * D + lane * 4, ((ld | col_z) & 3) == 0);
    const float4 w4 = *reinterpret_cast<const float4*>(weight + lane * 4);
    const float w[4] = {w4.x, w4.y, w4.z, w4.w};
    float x[4], ss = 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        x[e] = unpack4(o4, e);
        ss += x[e] * x[e];
    }
    const float r = rsqrtf(warp_sum(ss) / D + eps);
    bf16 y[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) y[e] = bf(rbf(w[e] * rbf(x[e] * r)) * silu(unpack4(z4, e)));
    store4(out + (int64_t)row * D + lane * 4, y);
}

// ---------------------------------------------------------------------------
// Fused DeltaNet decode (one token per sequence): conv + SiLU, conv-state
// update, q/k L2 norm, gates, the recurrent delta-rule step and the gated
// RMSNorm of the output in one kernel, with the numerics of gdn_conv_prep ->
// gdn_decode_step -> gated_rmsnorm_bf16 above (same roundings, same
// reduction orders). Why: at batch 1 those four launches (plus the conv-state
// update) cost 17.6 us a DeltaNet layer on the H200 (ncu, 2026-12-01), each
// bound by launch and memory latency, not by the 2 x 64 KB of state a head
// reads and writes.
//
// grid (Hv, N_chunk, splits), block 256. Block (h, n, z) owns value rows
// [z * 128 / splits, (z + 1) * 128 / splits) of head h of sequence seq0 + n:
//   1. it issues the loads of its state rows first (in registers), so the
//      whole state is in flight while the conv runs;
//   2. threads 0..255 run the conv of the 256 q|k channels of q/k head
//      kh = h / (Hv / Hk) (every block of the group needs all of them for
//      the dot products; recomputing beats a second launch), threads
//      0..rows-1 the conv of its v rows (those channels are this block's
//      alone, so it advances their conv state in place);
//   3. one warp per row: the delta-rule step, o = scale S q into `out`;
//   4. the last of the (Hv / Hk) * splits blocks of (n, kh) to arrive
//      (a counter in `arrivals`, which it resets to 0 for the next launch)
//      advances the q|k conv state (every block of the group has read it by
//      then) and applies the gated RMSNorm to the group's heads, reading
//      the other blocks' o rows from L2.
// ---------------------------------------------------------------------------

namespace {

constexpr int kFusedThreads = 256;  // one thread per q|k channel of a head group
constexpr int kFusedWarps = kFusedThreads / 32;

template <int kRowsPerWarp>
__device__ __forceinline__ void gdn_decode_fused_impl(
    bf16* __restrict__ out, float* __restrict__ state, bf16* __restrict__ conv_state,
    unsigned* __restrict__ arrivals, const bf16* __restrict__ proj, int ld, int col_z,
    int col_b, int col_a, const float* __restrict__ conv_w, const float* __restrict__ a_log,
    const float* __restrict__ dt_bias, const float* __restrict__ norm_w,
    const int32_t* __restrict__ seq_slot, int seq0, int hk, int hv, int kw, float scale,
    float eps) {
    constexpr int D = kGdnDim;
    constexpr int kRows = kRowsPerWarp * kFusedWarps;  // value rows of this block
    constexpr int kSplits = D / kRows;
    static_assert(kSplits * kRows == D && kRows <= kFusedThreads, "rows per block");
    __shared__ float qk_s[2 * D];  // normalised q | k, rounded to bf16
    __shared__ float v_s[kRows];
    __shared__ float partial[kFusedWarps];
    __shared__ float gate_s[2];  // alpha, beta
    __shared__ bool last_s;

    const int h = blockIdx.x, nl = blockIdx.y, z = blockIdx.z;
    const int64_t n = seq0 + nl;
    const int group = hv / hk, kh = h / group;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int C = (2 * hk + hv) * D;
    const int taps = kw - 1;
    const int64_t slot = seq_slot[n];
    const int row_first = z * kRows;

    // 1. This block's state rows, loaded before anything else.
    float* S = state + (slot * hv + h) * D * D;
    const int row0 = row_first + warp * kRowsPerWarp;
    float4 st[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i)
        st[i] = *reinterpret_cast<const float4*>(S + (int64_t)(row0 + i) * D + lane * 4);

    // 2. Conv over the old taps and the new input (same order as gdn_conv_prep).
    const bf16* x_row = proj + n * ld;
    bf16* cs = conv_state + slot * taps * C;
    const int qk_c = tid < D ? kh * D + tid : (hk + kh) * D + (tid - D);
    bf16 qk_old[kMaxConvTaps];
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < kMaxConvTaps; ++j) {
        if (j < taps) {
            qk_old[j] = cs[(int64_t)j * C + qk_c];
            acc += conv_w[qk_c * kw + j] * f(qk_old[j]);
        }
    }
    const bf16 qk_new = x_row[qk_c];
    acc += conv_w[qk_c * kw + taps] * f(qk_new);
    const float xqk = rbf(silu(acc));

    if (tid < kRows) {
        const int c = (2 * hk + h) * D + row_first + tid;
        bf16 v_old[kMaxConvTaps];
        float va = 0.f;
#pragma unroll
        for (int j = 0; j < kMaxConvTaps; ++j) {
            if (j < taps) {
                v_old[j] = cs[(int64_t)j * C + c];
                va += conv_w[c * kw + j] * f(v_old[j]);
            }
        }
        const bf16 v_new = x_row[c];
        va += conv_w[c * kw + taps] * f(v_new);
        v_s[tid] = rbf(silu(va));
        // Only this block reads these channels: advance their conv state now.
#pragma unroll
        for (int j = 0; j + 1 < kMaxConvTaps; ++j)
            if (j + 1 < taps) cs[(int64_t)j * C + c] = v_old[j + 1];
        cs[(int64_t)(taps - 1) * C + c] = v_new;
    }
    if (tid == kFusedThreads - 1) {
        const float b = f(x_row[col_b + h]);
        const float a = f(x_row[col_a + h]) + dt_bias[h];
        const float softplus = a > 20.f ? a : log1pf(expf(a));
        gate_s[1] = rbf(sigmoid(b));
        gate_s[0] = expf(-expf(a_log[h]) * softplus);
    }

    // L2 norm of q (threads 0..127, warps 0-3) and k (warps 4-7); the sum
    // in block_sum's order over four warps, so the values equal gdn_conv_prep's.
    const float ss = warp_sum(xqk * xqk);
    if (lane == 0) partial[warp] = ss;
    __syncthreads();
    const int p = tid < D ? 0 : 4;
    const float tot = (partial[p] + partial[p + 2]) + (partial[p + 1] + partial[p + 3]);
    qk_s[tid] = rbf(xqk * rsqrtf(tot + 1e-6f));
    __syncthreads();

    // 3. The delta-rule step, one warp per row (gdn_decode_step's math).
    float kk[4], qq[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        qq[e] = qk_s[lane * 4 + e];
        kk[e] = qk_s[D + lane * 4 + e];
    }
    const float alpha = gate_s[0], beta = gate_s[1];
    bf16* o_head = out + (n * hv + h) * D;
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
        const int row = row0 + i;
        float4 s = st[i];
        s.x *= alpha; s.y *= alpha; s.z *= alpha; s.w *= alpha;
        const float pred = warp_sum(s.x * kk[0] + s.y * kk[1] + s.z * kk[2] + s.w * kk[3]);
        const float d = beta * (v_s[row - row_first] - pred);
        s.x += d * kk[0]; s.y += d * kk[1]; s.z += d * kk[2]; s.w += d * kk[3];
        *reinterpret_cast<float4*>(S + (int64_t)row * D + lane * 4) = s;
        const float o = warp_sum(s.x * qq[0] + s.y * qq[1] + s.z * qq[2] + s.w * qq[3]);
        if (lane == 0) o_head[row] = bf(o * scale);
    }

    // 4. Arrive; the group's last block finishes the group.
    __threadfence();
    __syncthreads();
    unsigned* counter = arrivals + (int64_t)nl * hk + kh;
    if (tid == 0) last_s = atomicAdd(counter, 1u) == (unsigned)(group * kSplits - 1);
    __syncthreads();
    if (!last_s) return;
    __threadfence();

    // Every block of the group has read the old q|k taps: advance them.
#pragma unroll
    for (int j = 0; j + 1 < kMaxConvTaps; ++j)
        if (j + 1 < taps) cs[(int64_t)j * C + qk_c] = qk_old[j + 1];
    cs[(int64_t)(taps - 1) * C + qk_c] = qk_new;

    // Gated RMSNorm of the group's heads, one warp per head (as
    // gated_rmsnorm_bf16). o rows of other blocks are read through L2 (ldcg).
    for (int j = warp; j < group; j += kFusedWarps) {
        const int hh = kh * group + j;
        bf16* row = out + (n * hv + hh) * D;
        const uint2 raw = __ldcg(reinterpret_cast<const uint2*>(row + lane * 4));
        const unsigned words[2] = {raw.x, raw.y};  // bf16 pairs, lower address low
        float x[4], sq = 0.f;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            x[e] = f(__ushort_as_bfloat16((unsigned short)(words[e >> 1] >> (16 * (e & 1)))));
            sq += x[e] * x[e];
        }
        const float r = rsqrtf(warp_sum(sq) / D + eps);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int c = lane * 4 + e;
            const float zg = f(x_row[col_z + hh * D + c]);
            row[c] = bf(rbf(norm_w[c] * rbf(x[e] * r)) * silu(zg));
        }
    }
    if (tid == 0) *counter = 0u;
}

}  // namespace

// The fused decode with 4, 2 or 1 blocks per (sequence, value head); see
// ModelOps::deltanet_decode_fused for which runs when.
#define GDN_DECODE_FUSED(SPLITS)                                                               \
    extern "C" __global__ void __launch_bounds__(kFusedThreads) gdn_decode_fused_s##SPLITS(   \
        bf16* __restrict__ out, float* __restrict__ state, bf16* __restrict__ conv_state,      \
        unsigned* __restrict__ arrivals, const bf16* __restrict__ proj, int ld, int col_z,     \
        int col_b, int col_a, const float* __restrict__ conv_w,                                \
        const float* __restrict__ a_log, const float* __restrict__ dt_bias,                    \
        const float* __restrict__ norm_w, const int32_t* __restrict__ seq_slot, int seq0,      \
        int hk, int hv, int kw, float scale, float eps) {                                      \
        gdn_decode_fused_impl<kGdnDim / (SPLITS * kFusedWarps)>(                               \
            out, state, conv_state, arrivals, proj, ld, col_z, col_b, col_a, conv_w, a_log,    \
            dt_bias, norm_w, seq_slot, seq0, hk, hv, kw, scale, eps);                          \
    }
GDN_DECODE_FUSED(4)
GDN_DECODE_FUSED(2)
GDN_DECODE_FUSED(1)
// --------------------------- end of the fused DeltaNet decode ---------------

// Attention input side: q/k zero-centred RMSNorm per head, partial NeoX RoPE
// on the first 2*rot_half dims (cos/sin rounded to bf16 like HF's), then q to
// q_out and k, v into their KV-cache pages. proj is the fused [q|gate per
// head, k, v] projection. One warp per (token, run of `heads_per_warp`
// heads of the Hq + Hkv), head_dim / 32 values a lane (see attn_prep_run for
// the specialised and the general path): grid
// ceil(T * ceil((Hq + Hkv) / heads_per_warp) / 8), block 256. The warp computes its token's RoPE (cos, sin) and KV page once
// for its run and loads the next head's row before working on the current
// one. The caller sizes the runs so that short batches still spread over
// one warp a head.
// Why: a block of head_dim threads per (token, head) with a block-wide sum
// and 2-byte accesses took 269 us a layer at 8192 tokens on the H200 (ncu,
// 2026-12-01), ~3x its memory time. A warp per (token, head) with the values
// a lane known only at run time took 185 us (ncu, 2026-12-02): 592 warp
// instructions a head, most of them its general per-value code (RoPE as a
// branch per value over shared memory, which the whole warp issues for the
// 8 rotary lanes, a bf16 array packed through local memory) and the 64-bit
// division of the work index. Runs of heads with that same general code
// took 194 us; with the specialised path below (about 190 instructions a
// head) 58 us, and 11 us instead of 28 at 1k tokens (docs/benchmarks.md).
constexpr int kMaxHeadDim = 256;
// Two bf16 as one 32-bit word, the first in the low half (memory order).
__device__ __forceinline__ unsigned pack_bf16x2(bf16 lo, bf16 hi) {
    unsigned short l, h;
    copy_bits(&l, &lo, sizeof l);
    copy_bits(&h, &hi, sizeof h);
    return (unsigned)l | ((unsigned)h << 16);
}
// The run of heads [h_begin, h_end) of token t. kVec: 8 values a lane as a
// compile-time constant with 16-byte accesses and RoPE partners by shuffles
// (head dim 256, ld % 8 == 0, rot_half % 8 == 0: Qwen3.5); otherwise the
// general path (D / 32 values a lane, 2-byte accesses, partners through
// shared memory).
template <bool kVec>
__device__ __forceinline__ void attn_prep_run(
    bf16* __restrict__ q_out, bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
    const bf16* __restrict__ proj, int ld, const float* __restrict__ q_norm,
    const float* __restrict__ k_norm, const float* __restrict__ inv_freq, int rot_half,
    const int32_t* __restrict__ positions, const int32_t* __restrict__ tok_seq,
    const int32_t* __restrict__ block_table, int max_blocks, int page, int hq, int hkv,
    float eps, int D, int t, int h_begin, int h_end, float* __restrict__ y,
    float* __restrict__ rope_cos, float* __restrict__ rope_sin) {
    if (kVec) D = 256;  // a constant for the compiler (the caller checked it)
    const int lane = threadIdx.x & 31;
    const int per_lane = kVec ? 8 : D / 32, d0 = lane * per_lane;
    const bf16* token_row = proj + (int64_t)t * ld;
    // Head h's input values of this lane.
    auto head_src = [&](int h) {
        return token_row + (h < hq ? h * 2 * D : hq * 2 * D + (h - hq) * D) + d0;
    };
    // This token's (cos, sin) per rotary frequency, one frequency a lane.
    const int pos = positions[t];
    for (int i = lane; i < rot_half; i += 32) {
        const float angle = (float)pos * inv_freq[i];
        rope_cos[i] = rbf(cosf(angle));
        rope_sin[i] = rbf(sinf(angle));
    }
    // The token's place in the KV cache, where the run has a k head.
    int64_t kv_row = 0;
    if (h_end > hq) {
        const int64_t page_id = block_table[(int64_t)tok_seq[t] * max_blocks + pos / page];
        kv_row = (page_id * page + pos % page) * hkv;
    }
    // kVec: this lane's 8 (cos, sin) and RoPE partner lane, once for the run.
    bool rot_lane = false, first_half = false;
    int partner_lane = lane;
    float rot_c[8], rot_s[8];
    if constexpr (kVec) {
        rot_lane = d0 < 2 * rot_half;
        first_half = d0 < rot_half;
        if (rot_lane) partner_lane = first_half ? lane + rot_half / 8 : lane - rot_half / 8;
        __syncwarp();  // the angles are in shared memory
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const int i = rot_lane ? (first_half ? d0 : d0 - rot_half) + e : 0;
            rot_c[e] = rope_cos[i];
            rot_s[e] = rope_sin[i];
        }
    }
    uint4 next = make_uint4(0, 0, 0, 0);
    if (kVec) next = *reinterpret_cast<const uint4*>(head_src(h_begin));
    for (int h = h_begin; h < h_end; ++h) {
        const bool is_q = h < hq;
        const int kh = h - hq;
        float x[8];
        if (kVec) {
            const uint4 raw = next;
            if (h + 1 < h_end) next = *reinterpret_cast<const uint4*>(head_src(h + 1));
            bf16 v8[8];
            copy_bits(v8, &raw, sizeof raw);
#pragma unroll
            for (int e = 0; e < 8; ++e) x[e] = f(v8[e]);
        } else {
            const bf16* src = head_src(h);
#pragma unroll
            for (int e = 0; e < 8; ++e) x[e] = e < per_lane ? f(src[e]) : 0.f;
        }
        float ss = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) ss += x[e] * x[e];
        const float r = rsqrtf(warp_sum(ss) / D + eps);
        const float* norm = (is_q ? q_norm : k_norm) + d0;
        bf16 val[8];
        if constexpr (kVec) {
            // RoPE's partner of each value sits in lane +- rot_half / 8 at the
            // same e (rot_half % 8 == 0): a shuffle each, no shared memory.
            const float4 n0 = *reinterpret_cast<const float4*>(norm);
            const float4 n1 = *reinterpret_cast<const float4*>(norm + 4);
            const float nw[8] = {n0.x, n0.y, n0.z, n0.w, n1.x, n1.y, n1.z, n1.w};
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const float yv = rbf(x[e] * r * (1.f + nw[e]));
                const float partner = __shfl_sync(0xffffffffu, yv, partner_lane);
                // y c - p s below the rotary half, y c + p s above (one rounding
                // of the product, then the fused multiply-add, as before).
                const float v = rot_lane ? fmaf(first_half ? -partner : partner, rot_s[e], yv * rot_c[e]) : yv;
                val[e] = bf(v);
            }
        } else {
            __syncwarp();  // the previous head's partners are read
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (e < per_lane) y[d0 + e] = rbf(x[e] * r * (1.f + norm[e]));
            __syncwarp();
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const int d = d0 + e;
                float v = e < per_lane ? y[d] : 0.f;
                if (e < per_lane && d < 2 * rot_half) {
                    const int i = d < rot_half ? d : d - rot_half;
                    const float c = rope_cos[i], s = rope_sin[i];
                    v = d < rot_half ? y[d] * c - y[d + rot_half] * s : y[d] * c + y[d - rot_half] * s;
                }
                val[e] = bf(v);
            }
        }
        bf16* dst;
        const bf16* v_src = nullptr;
        bf16* v_dst = nullptr;
        if (is_q) {
            dst = q_out + ((int64_t)t * hq + h) * D + d0;
        } else {
            const int64_t at = (kv_row + kh) * D + d0;
            dst = k_cache + at;
            v_dst = v_cache + at;
            v_src = token_row + hq * 2 * D + hkv * D + kh * D + d0;
        }
        if (kVec) {
            uint4 packed;  // pairs packed in registers (a bf16 array went to local memory)
            unsigned* words = reinterpret_cast<unsigned*>(&packed);
#pragma unroll
            for (int w = 0; w < 4; ++w) words[w] = pack_bf16x2(val[2 * w], val[2 * w + 1]);
            *reinterpret_cast<uint4*>(dst) = packed;
            if (v_dst != nullptr) *reinterpret_cast<uint4*>(v_dst) = *reinterpret_cast<const uint4*>(v_src);
        } else {
            for (int e = 0; e < per_lane; ++e) {
                dst[e] = val[e];
                if (v_dst != nullptr) v_dst[e] = v_src[e];
            }
        }
    }
}
extern "C" __global__ void __launch_bounds__(256, 4) attn_prep(
    bf16* __restrict__ q_out, bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
    const bf16* __restrict__ proj, int ld, const float* __restrict__ q_norm,
    const float* __restrict__ k_norm, const float* __restrict__ inv_freq, int rot_half,
    const int32_t* __restrict__ positions, const int32_t* __restrict__ tok_seq,
    const int32_t* __restrict__ block_table, int max_blocks, int page, int hq, int hkv,
    float eps, int head_dim, int num_tokens, int heads_per_warp) {
    __shared__ __align__(16) float y_all[8][kMaxHeadDim];
    __shared__ float rope_cos[8][kMaxHeadDim / 2], rope_sin[8][kMaxHeadDim / 2];
    const int warp = threadIdx.x >> 5;
    const int heads = hq + hkv;
    const int runs = (heads + heads_per_warp - 1) / heads_per_warp;
    const int64_t work = (int64_t)blockIdx.x * 8 + warp;
    if (work >= (int64_t)num_tokens * runs) return;  // whole warps only
    const int t = (int)(work / runs);
    const int h_begin = (int)(work % runs) * heads_per_warp;
    const int h_end = min(h_begin + heads_per_warp, heads);
#define ATTN_PREP_RUN_ARGS                                                                     \
    q_out, k_cache, v_cache, proj, ld, q_norm, k_norm, inv_freq, rot_half, positions, tok_seq, \
        block_table, max_blocks, page, hq, hkv, eps, head_dim, t, h_begin, h_end, y_all[warp], \
        rope_cos[warp], rope_sin[warp]
    if (head_dim == 256 && (ld & 7) == 0 && rot_half % 8 == 0)
        attn_prep_run<true>(ATTN_PREP_RUN_ARGS);
    else
        attn_prep_run<false>(ATTN_PREP_RUN_ARGS);
#undef ATTN_PREP_RUN_ARGS
}

// Causal attention of each token over its sequence's cached keys 0..pos
// (GQA: the block serves the G = Hq/Hkv query heads of one KV head), online
// softmax in fp32 per warp over an interleaved share of the keys, warps
// merged at the end; the output is multiplied by sigmoid(gate) (Qwen3.5's
// gated attention). grid (T, Hkv, splits), block 128. DPL = head dim / 32:
// lane i owns dimensions [i*DPL, (i+1)*DPL), loaded as one vector.
// With splits > 1 (flash-decoding: short batches with long contexts) block z
// takes the z-th contiguous share of the keys and writes its partial softmax
// state -- (m, l) to ws_ml[T, Hq, splits, 2] and the unnormalised
// accumulator to ws_acc[T, Hq, splits, D] -- for attention_combine.
//
// Why KPI keys per warp step: a warp that took one key at a time (scalar
// loads, then G dependent warp reductions) was a serial chain of memory
// round trips: 108 us a layer at batch 16 and 1,024 keys on the H200 (ncu,
// 2026-12-01), where the KV it reads (64 MB) streams in ~16 us. Loading KPI
// keys' K and V rows (one 16-byte vector a lane each for D = 256) before
// using any, and reducing the KPI x G dot products in one interleaved
// butterfly, keeps that many loads and shuffles in flight. MAXG (the largest
// GQA group the kernel serves) sizes the per-head registers: a G <= 4 model
// (Qwen3.5-4B) takes the MAXG = 4 instance and half the registers.
template <int DPL>
struct KvVec;  // DPL bf16 values as one load
template <> struct KvVec<1> { typedef unsigned short T; };
template <> struct KvVec<2> { typedef unsigned int T; };
template <> struct KvVec<4> { typedef uint2 T; };
template <> struct KvVec<8> { typedef uint4 T; };

template <int DPL>
__device__ __forceinline__ void unpack_bf16(const typename KvVec<DPL>::T& v, float* out) {
    const bf16* h = reinterpret_cast<const bf16*>(&v);
#pragma unroll
    for (int e = 0; e < DPL; ++e) out[e] = f(h[e]);
}

template <int DPL, int MAXG>
__device__ void attention_impl(bf16* __restrict__ out, const bf16* __restrict__ q,
                               const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
                               const bf16* __restrict__ proj, int ld,
                               const int32_t* __restrict__ positions,
                               const int32_t* __restrict__ tok_seq,
                               const int32_t* __restrict__ block_table, int max_blocks, int page,
                               int hq, int hkv, float scale, float* __restrict__ ws_ml,
                               float* __restrict__ ws_acc) {
    constexpr int D = DPL * 32;
    constexpr int KPI = MAXG <= 4 ? 4 : 2;  // keys a warp loads before using any
    typedef typename KvVec<DPL>::T Vec;
    __shared__ float sh_m[kAttnWarps][MAXG], sh_l[kAttnWarps][MAXG];
    __shared__ float sh_acc[kAttnWarps][MAXG][D];
    const int64_t t = blockIdx.x;
    const int kh = blockIdx.y;
    const int G = hq / hkv;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float qr[MAXG][DPL], acc[MAXG][DPL], m[MAXG], l[MAXG];
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < DPL; ++e) {
            acc[g][e] = 0.f;
            qr[g][e] = g < G ? f(q[(t * hq + kh * G + g) * D + lane * DPL + e]) * scale : 0.f;
        }
    }
    const int pos = positions[t];
    const int32_t* pages = block_table + (int64_t)tok_seq[t] * max_blocks;
    const int splits = gridDim.z, z = blockIdx.z;
    const int share = (pos + splits) / splits;  // ceil((pos + 1) / splits)
    const int j_end = min(pos + 1, (z + 1) * share);
    for (int j0 = z * share + warp * KPI; j0 < j_end; j0 += kAttnWarps * KPI) {
        Vec kv[KPI], vv[KPI];
#pragma unroll
        for (int u = 0; u < KPI; ++u) {
            const int j = min(j0 + u, j_end - 1);  // past the end: a valid key, weight 0 below
            const int64_t at =
                (((int64_t)pages[j / page] * page + j % page) * hkv + kh) * D + lane * DPL;
            kv[u] = *reinterpret_cast<const Vec*>(k_cache + at);
            vv[u] = *reinterpret_cast<const Vec*>(v_cache + at);
        }
        float score[KPI][MAXG];
#pragma unroll
        for (int u = 0; u < KPI; ++u) {
            float kr[DPL];
            unpack_bf16<DPL>(kv[u], kr);
#pragma unroll
            for (int g = 0; g < MAXG; ++g) {
                float dot = 0.f;
#pragma unroll
                for (int e = 0; e < DPL; ++e) dot += qr[g][e] * kr[e];
                score[u][g] = dot;
            }
        }
        // One butterfly over all KPI x MAXG partial dot products at once.
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
            for (int u = 0; u < KPI; ++u) {
#pragma unroll
                for (int g = 0; g < MAXG; ++g)
                    score[u][g] += __shfl_xor_sync(0xffffffffu, score[u][g], o);
            }
        }
#pragma unroll
        for (int g = 0; g < MAXG; ++g) {
            if (g >= G) break;
            float m_new = m[g];
#pragma unroll
            for (int u = 0; u < KPI; ++u)
                if (j0 + u < j_end) m_new = fmaxf(m_new, score[u][g]);
            const float corr = expf(m[g] - m_new);  // 0 on the first keys (m = -inf)
            float p[KPI];
#pragma unroll
            for (int u = 0; u < KPI; ++u) {
                p[u] = j0 + u < j_end ? expf(score[u][g] - m_new) : 0.f;
                l[g] = u == 0 ? l[g] * corr + p[u] : l[g] + p[u];
            }
#pragma unroll
            for (int e = 0; e < DPL; ++e) acc[g][e] *= corr;
#pragma unroll
            for (int u = 0; u < KPI; ++u) {
                float vr[DPL];
                unpack_bf16<DPL>(vv[u], vr);
#pragma unroll
                for (int e = 0; e < DPL; ++e) acc[g][e] += p[u] * vr[e];
            }
            m[g] = m_new;
        }
    }
    // Constant indices only (full unroll), so acc/m/l stay in registers.
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
        if (g < G) {
            if (lane == 0) {
                sh_m[warp][g] = m[g];
                sh_l[warp][g] = l[g];
            }
#pragma unroll
            for (int e = 0; e < DPL; ++e) sh_acc[warp][g][lane * DPL + e] = acc[g][e];
        }
    }
    __syncthreads();
    // Merge: thread d of the block combines dimension d of every head.
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int g = idx / D, d = idx % D;
        float mx = -INFINITY;
        for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, sh_m[w][g]);
        float num = 0.f, den = 0.f;
        for (int w = 0; w < kAttnWarps; ++w) {
            const float c = sh_m[w][g] == -INFINITY ? 0.f : expf(sh_m[w][g] - mx);
            num += c * sh_acc[w][g][d];
            den += c * sh_l[w][g];
        }
        const int h = kh * G + g;
        if (splits > 1) {
            const int64_t part = (t * hq + h) * splits + z;
            ws_acc[part * D + d] = num;
            if (d == 0) {
                ws_ml[part * 2] = mx;
                ws_ml[part * 2 + 1] = den;
            }
            continue;
        }
        const float gate = f(proj[t * ld + h * 2 * D + D + d]);
        out[(t * hq + h) * D + d] = bf(rbf(num / den) * sigmoid(gate));
    }
}

// Combines the partial softmax states of attention_d* with splits > 1.
// grid (T, Hq), block D (>= 32), splits <= 64 (model_ops/attention.rs). The
// splits' (m, l) pairs go through shared memory once and every thread then
// sums its dimension over the splits with independent loads: a thread that
// walked the splits reading m and l itself took 10.6 us at 33 splits on
// the H200 (ncu, 2026-12-01), a memory round trip per split.
extern "C" __global__ void attention_combine(bf16* __restrict__ out, const float* __restrict__ ws_ml,
                                             const float* __restrict__ ws_acc,
                                             const bf16* __restrict__ proj, int ld, int hq,
                                             int splits) {
    __shared__ float weight[64];
    __shared__ float den_share;
    const int D = blockDim.x, d = threadIdx.x;
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y;
    const int64_t base = (t * hq + h) * splits;
    if (d < 32) {
        // One warp: the splits' maximum, their weights and the denominator.
        float m[2], l[2];
        float mx = -INFINITY;
        for (int k = 0; k < 2; ++k) {
            const int z = d + 32 * k;
            m[k] = z < splits ? ws_ml[(base + z) * 2] : -INFINITY;
            l[k] = z < splits ? ws_ml[(base + z) * 2 + 1] : 0.f;
            mx = fmaxf(mx, m[k]);
        }
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float den = 0.f;
        for (int k = 0; k < 2; ++k) {
            const float c = m[k] == -INFINITY ? 0.f : expf(m[k] - mx);
            weight[d + 32 * k] = c;
            den += c * l[k];
        }
        den = warp_sum(den);
        if (d == 0) den_share = den;
    }
    __syncthreads();
    float num = 0.f;
#pragma unroll 8
    for (int z = 0; z < splits; ++z) num += weight[z] * ws_acc[(base + z) * D + d];
    const float gate = f(proj[t * ld + h * 2 * D + D + d]);
    out[(t * hq + h) * D + d] = bf(rbf(num / den_share) * sigmoid(gate));
}

#define GDN_ATTENTION(NAME, DPL, MAXG)                                                       \
    extern "C" __global__ void __launch_bounds__(kAttnWarps * 32) NAME(                      \
        bf16* out, const bf16* q, const bf16* k_cache, const bf16* v_cache, const bf16* proj, \
        int ld, const int32_t* positions, const int32_t* tok_seq, const int32_t* block_table, \
        int max_blocks, int page, int hq, int hkv, float scale, float* ws_ml,                \
        float* ws_acc) {                                                                     \
        attention_impl<DPL, MAXG>(out, q, k_cache, v_cache, proj, ld, positions, tok_seq,    \
                                  block_table, max_blocks, page, hq, hkv, scale, ws_ml,      \
                                  ws_acc);                                                   \
    }
// Head dims 32, 64, 128 and 256 (Qwen3.5 uses 256; the test models 32), for
// GQA groups up to 8 and (fewer registers) up to 4.
GDN_ATTENTION(attention_d1, 1, kMaxGqa)
GDN_ATTENTION(attention_d2, 2, kMaxGqa)
GDN_ATTENTION(attention_d4, 4, kMaxGqa)
GDN_ATTENTION(attention_d8, 8, kMaxGqa)
GDN_ATTENTION(attention_g4_d1, 1, 4)
GDN_ATTENTION(attention_g4_d2, 2, 4)
GDN_ATTENTION(attention_g4_d4, 4, 4)
GDN_ATTENTION(attention_g4_d8, 8, 4)

// Prefill attention on tensor cores (WMMA bf16 16x16x16, fp32 accumulate).
// A block takes one query tile -- up to 16 consecutive tokens of one sequence
// (tiles[2b] = first token row, tiles[2b+1] = rows) -- and one KV head; warp g
// serves query head kh*G + g, so the K/V tiles staged in shared memory are
// shared by the whole GQA group. Two passes over the key tiles 0..last
// position: pass 1 finds each row's softmax max and sum from S = QK^T, pass 2
// accumulates O += softmax(S) V in registers (recomputing S costs 1.5x the
// QK^T FLOPs but avoids rescaling the accumulators, whose row mapping WMMA
// does not expose). Causal mask per row; keys past the last position are
// zero-filled (0 * garbage could be NaN). Epilogue as in attention_impl:
// bf16(o) * sigmoid(gate). grid (tiles, Hkv), block 32*G, dynamic shared
// memory attn_prefill_smem(D, G).
constexpr int kQTile = 16;
constexpr int kKTile = 32;

template <int D>
__device__ void attention_prefill_impl(
    bf16* __restrict__ out, const bf16* __restrict__ q, const bf16* __restrict__ k_cache,
    const bf16* __restrict__ v_cache, const bf16* __restrict__ proj, int ld,
    const int32_t* __restrict__ tiles, const int32_t* __restrict__ positions,
    const int32_t* __restrict__ tok_seq, const int32_t* __restrict__ block_table, int max_blocks,
    int page, int hq, int hkv, float scale) {
    using namespace nvcuda;
    constexpr int NF = D / 16;
    extern __shared__ __align__(128) unsigned char smem[];
    const int G = hq / hkv;
    const int kh = blockIdx.y;
    const int t0 = tiles[2 * blockIdx.x], rows = tiles[2 * blockIdx.x + 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = kh * G + warp;
    bf16* sQ = reinterpret_cast<bf16*>(smem);                       // [G][16][D]
    bf16* sK = sQ + G * kQTile * D;                                  // [32][D]
    bf16* sV = sK + kKTile * D;                                      // [32][D]
    float* sS = reinterpret_cast<float*>(sV + kKTile * D);           // [G][16][32]
    bf16* sP = reinterpret_cast<bf16*>(sS + G * kQTile * kKTile);    // [G][16][32]
    float* sO = reinterpret_cast<float*>(sP + G * kQTile * kKTile);  // [G][16][16]
    bf16* myQ = sQ + warp * kQTile * D;
    float* myS = sS + warp * kQTile * kKTile;
    bf16* myP = sP + warp * kQTile * kKTile;
    float* myO = sO + warp * kQTile * 16;

    const int32_t* pages = block_table + (int64_t)tok_seq[t0] * max_blocks;
    const int last_pos = positions[t0 + rows - 1];
    // This lane's row (two lanes per row, 16 columns each) and its position.
    const int r = lane >> 1, half = lane & 1;
    const int my_pos = r < rows ? positions[t0 + r] : -1;

    for (int i = lane; i < kQTile * D; i += 32) {
        const int row = i / D, d = i % D;
        myQ[i] = row < rows ? q[((int64_t)(t0 + row) * hq + h) * D + d] : bf(0.f);
    }
    auto load_tile = [&](int j0, bool with_v) {
        constexpr int kChunks = kKTile * D / 8;  // 16-byte chunks
        for (int c = threadIdx.x; c < kChunks; c += blockDim.x) {
            const int row = c / (D / 8), col = (c % (D / 8)) * 8;
            const int j = j0 + row;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (j <= last_pos) {
                const int64_t at = (((int64_t)pages[j / page] * page + j % page) * hkv + kh) * D + col;
                kv = *reinterpret_cast<const uint4*>(k_cache + at);
                if (with_v) vv = *reinterpret_cast<const uint4*>(v_cache + at);
            }
            *reinterpret_cast<uint4*>(sK + row * D + col) = kv;
            if (with_v) *reinterpret_cast<uint4*>(sV + row * D + col) = vv;
        }
    };
    // S = Q K^T for the staged tile, into myS (row-major 16 x 32).
    auto scores = [&]() {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
#pragma unroll
        for (int n = 0; n < kKTile / 16; ++n) {
            wmma::fill_fragment(c, 0.f);
#pragma unroll
            for (int k = 0; k < NF; ++k) {
                wmma::load_matrix_sync(a, myQ + k * 16, D);
                wmma::load_matrix_sync(b, sK + n * 16 * D + k * 16, D);
                wmma::mma_sync(c, a, b, c);
            }
            wmma::store_matrix_sync(myS + n * 16, c, kKTile, wmma::mem_row_major);
        }
        __syncwarp();
    };

    // Pass 1: row max and sum.
    float m = -INFINITY, l = 0.f;
    for (int j0 = 0; j0 <= last_pos; j0 += kKTile) {
        __syncthreads();  // previous tile fully consumed
        load_tile(j0, false);
        __syncthreads();
        if (warp < G) {
            scores();
            float tile_max = -INFINITY;
            for (int c = half * 16; c < half * 16 + 16; ++c)
                if (j0 + c <= my_pos) tile_max = fmaxf(tile_max, myS[r * kKTile + c] * scale);
            if (tile_max != -INFINITY) {
                const float m_new = fmaxf(m, tile_max);
                float sum = 0.f;
                for (int c = half * 16; c < half * 16 + 16; ++c)
                    if (j0 + c <= my_pos) sum += expf(myS[r * kKTile + c] * scale - m_new);
                l = l * expf(m - m_new) + sum;
                m = m_new;
            }
            __syncwarp();
        }
    }
    {  // combine the two halves of each row
        const float m2 = __shfl_xor_sync(0xffffffffu, m, 1), l2 = __shfl_xor_sync(0xffffffffu, l, 1);
        const float mr = fmaxf(m, m2);
        l = (m == -INFINITY ? 0.f : l * expf(m - mr)) + (m2 == -INFINITY ? 0.f : l2 * expf(m2 - mr));
        m = mr;
    }
    const float inv_l = l > 0.f ? 1.f / l : 0.f;

    // Pass 2: O = softmax(S) V.
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[NF];
#pragma unroll
    for (int n = 0; n < NF; ++n) wmma::fill_fragment(o[n], 0.f);
    for (int j0 = 0; j0 <= last_pos; j0 += kKTile) {
        __syncthreads();
        load_tile(j0, true);
        __syncthreads();
        if (warp < G) {
            scores();
            for (int c = half * 16; c < half * 16 + 16; ++c) {
                const float p = j0 + c <= my_pos ? expf(myS[r * kKTile + c] * scale - m) * inv_l : 0.f;
                myP[r * kKTile + c] = bf(p);
            }
            __syncwarp();
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
#pragma unroll
            for (int k = 0; k < kKTile / 16; ++k) {
                wmma::load_matrix_sync(a, myP + k * 16, kKTile);
#pragma unroll
                for (int n = 0; n < NF; ++n) {
                    wmma::load_matrix_sync(b, sV + k * 16 * D + n * 16, D);
                    wmma::mma_sync(o[n], a, b, o[n]);
                }
            }
        }
    }
    if (warp >= G) return;
#pragma unroll
    for (int n = 0; n < NF; ++n) {
        wmma::store_matrix_sync(myO, o[n], 16, wmma::mem_row_major);
        __syncwarp();
        for (int i = lane; i < kQTile * 16; i += 32) {
            const int row = i / 16, d = n * 16 + i % 16;
            if (row < rows) {
                const int64_t t = t0 + row;
                const float gate = f(proj[t * ld + h * 2 * D + D + d]);
                out[(t * hq + h) * D + d] = bf(rbf(myO[i]) * sigmoid(gate));
            }
        }
        __syncwarp();
    }
}

#define GDN_ATTENTION_PREFILL(D)                                                                \
    extern "C" __global__ void attention_prefill_d##D(                                         \
        bf16* out, const bf16* q, const bf16* k_cache, const bf16* v_cache, const bf16* proj,  \
        int ld, const int32_t* tiles, const int32_t* positions, const int32_t* tok_seq,        \
        const int32_t* block_table, int max_blocks, int page, int hq, int hkv, float scale) {  \
        attention_prefill_impl<D>(out, q, k_cache, v_cache, proj, ld, tiles, positions,        \
                                  tok_seq, block_table, max_blocks, page, hq, hkv, scale);     \
    }
GDN_ATTENTION_PREFILL(32)
GDN_ATTENTION_PREFILL(64)
GDN_ATTENTION_PREFILL(128)
GDN_ATTENTION_PREFILL(256)

// out[t, h, :] = bf16(out[t, h, :] * sigmoid(gate_h)) in place, gate_h the
// head's gate columns of proj: the gate of Qwen3.5's attention after
// FlashInfer's FA3 kernel, whose bf16 output is what our attention kernels
// round o to (rbf(o)) before they gate. 8 values of a head a thread (16-byte
// accesses where ld % 8 == 0; head_dim is a multiple of 32): grid
// (T, ceil(Hq * head_dim / 2048)), block 256. Why: a thread a value took
// 113 us a layer at 8192 tokens on the H200 (ncu, 2026-12-01), 2.4x the
// copy time.
extern "C" __global__ void attention_gate_bf16(bf16* __restrict__ out, const bf16* __restrict__ proj,
                                               int ld, int hq, int head_dim) {
    const int64_t t = blockIdx.x;
    const int i0 = (blockIdx.y * blockDim.x + threadIdx.x) * 8;
    if (i0 >= hq * head_dim) return;
    const int h = i0 / head_dim, d = i0 % head_dim;
    const bf16* gate = proj + t * ld + (int64_t)h * 2 * head_dim + head_dim + d;
    bf16* o = out + t * hq * head_dim + i0;
    bf16 g8[8], o8[8];
    const bool vec = (ld & 7) == 0;
    if (vec) {
        const uint4 graw = *reinterpret_cast<const uint4*>(gate);
        const uint4 oraw = *reinterpret_cast<const uint4*>(o);
        copy_bits(g8, &graw, sizeof graw);
        copy_bits(o8, &oraw, sizeof oraw);
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            g8[e] = gate[e];
            o8[e] = o[e];
        }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) o8[e] = bf(f(o8[e]) * sigmoid(f(g8[e])));
    if (vec) {
        uint4 packed;
        copy_bits(&packed, o8, sizeof packed);
        *reinterpret_cast<uint4*>(o) = packed;
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = o8[e];
    }
}

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
// (state slots to and from a packed batch, last tokens to the lm_head).
// grid (N, ceil(width / 1024)), block 256.
template <typename T>
__device__ void copy_rows_impl(T* dst, const int32_t* dst_rows, const T* src,
                               const int32_t* src_rows, int64_t width) {
    const int n = blockIdx.x;
    const int64_t d = dst_rows ? dst_rows[n] : n, s = src_rows ? src_rows[n] : n;
    const int64_t begin = (int64_t)blockIdx.y * 1024;
    for (int64_t e = begin + threadIdx.x; e < width && e < begin + 1024; e += blockDim.x)
        dst[d * width + e] = src[s * width + e];
}
extern "C" __global__ void copy_rows_f32(float* dst, const int32_t* dst_rows, const float* src,
                                         const int32_t* src_rows, int64_t width) {
    copy_rows_impl(dst, dst_rows, src, src_rows, width);
}
extern "C" __global__ void copy_rows_bf16(bf16* dst, const int32_t* dst_rows, const bf16* src,
                                          const int32_t* src_rows, int64_t width) {
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
