// Part of model_kernels.cu (included there in this order, after
// model_common.cuh; not a standalone header): the DeltaNet input side of
// prefill and mixed batches, the causal conv, SiLU, q/k L2 norm and gates
// (gdn_conv_prep, gdn_conv_prep_k4), and the conv state's update.
#pragma once

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
