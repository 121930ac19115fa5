// Part of model_kernels.cu (included there in this order, after
// model_common.cuh; not a standalone header): the attention input side: q/k
// RMSNorm, partial RoPE, KV-cache writes (attn_prep).
#pragma once

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
