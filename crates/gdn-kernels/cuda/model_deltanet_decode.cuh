// Part of model_kernels.cu (included there in this order, after
// model_common.cuh; not a standalone header): the DeltaNet recurrent step for
// single tokens, the gated RMSNorm of DeltaNet outputs, and the fused DeltaNet
// decode.
#pragma once

// The recurrent state's storage: f32, or bf16 (half the bytes a step reads
// and writes). The math is f32 either way: a bf16 state is widened into f32
// registers on load and rounded to nearest-even bf16 on store, once a step.
// Four consecutive state values of one row (a lane's k columns) at a time.
template <typename S> struct StateIo;
template <> struct StateIo<float> {
    using Raw = float4;  // as loaded, before widening
    static __device__ __forceinline__ Raw load(const float* p) {
        return *reinterpret_cast<const float4*>(p);
    }
    static __device__ __forceinline__ float4 widen(const Raw& r) { return r; }
    static __device__ __forceinline__ void store(float* p, const float4& s) {
        *reinterpret_cast<float4*>(p) = s;
    }
};
template <> struct StateIo<bf16> {
    using Raw = uint2;
    static __device__ __forceinline__ Raw load(const bf16* p) { return load4(p, true); }
    static __device__ __forceinline__ float4 widen(const Raw& r) {
        return make_float4(unpack4(r, 0), unpack4(r, 1), unpack4(r, 2), unpack4(r, 3));
    }
    static __device__ __forceinline__ void store(bf16* p, const float4& s) {
        const bf16 v[4] = {bf(s.x), bf(s.y), bf(s.z), bf(s.w)};
        store4(p, v);
    }
};

// One recurrent gated-delta-rule step for a batch of single tokens, in place
// on the state slots (same math as the GDN oracle):
//   S = alpha S;  d = beta (v - S k);  S += d k^T;  out = scale S q
// grid (Hv, N, splits), block 256: one warp per value row, 4 k-columns per
// lane; block z takes rows [z * 128 / splits, (z + 1) * 128 / splits), so a
// batch of one still spreads over Hv * splits blocks. The f32 math of a row
// runs on the stored state widened (StateIo); the result is stored back.
template <typename S>
__device__ __forceinline__ void gdn_decode_step_impl(
    bf16* __restrict__ out, S* __restrict__ state, const int32_t* __restrict__ seq_slot,
    const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
    const float* __restrict__ alpha, const float* __restrict__ beta, int hk, int hv,
    float scale) {
    const int D = kGdnDim;
    const int h = blockIdx.x, n = blockIdx.y;
    const int kh = h / (hv / hk);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    S* St = state + ((int64_t)seq_slot[n] * hv + h) * D * D;
    float kk[4], qq[4];
    for (int e = 0; e < 4; ++e) {
        kk[e] = f(k[((int64_t)n * hk + kh) * D + lane * 4 + e]);
        qq[e] = f(q[((int64_t)n * hk + kh) * D + lane * 4 + e]);
    }
    const float a = alpha[(int64_t)n * hv + h], b = beta[(int64_t)n * hv + h];
    const int rows_per_block = D / gridDim.z;
    const int row_end = (blockIdx.z + 1) * rows_per_block;
    for (int row = blockIdx.z * rows_per_block + warp; row < row_end; row += warps) {
        S* p = St + (int64_t)row * D + lane * 4;
        float4 s = StateIo<S>::widen(StateIo<S>::load(p));
        s.x *= a; s.y *= a; s.z *= a; s.w *= a;
        const float pred = warp_sum(s.x * kk[0] + s.y * kk[1] + s.z * kk[2] + s.w * kk[3]);
        const float d = b * (f(v[((int64_t)n * hv + h) * D + row]) - pred);
        s.x += d * kk[0]; s.y += d * kk[1]; s.z += d * kk[2]; s.w += d * kk[3];
        StateIo<S>::store(p, s);
        // The output reads the f32 values, not the rounded ones (f32 math).
        const float o = warp_sum(s.x * qq[0] + s.y * qq[1] + s.z * qq[2] + s.w * qq[3]);
        if (lane == 0) out[((int64_t)n * hv + h) * D + row] = bf(o * scale);
    }
}

#define GDN_DECODE_STEP(NAME, S)                                                               \
    extern "C" __global__ void NAME(bf16* __restrict__ out, S* __restrict__ state,            \
                                    const int32_t* __restrict__ seq_slot,                      \
                                    const bf16* __restrict__ q, const bf16* __restrict__ k,    \
                                    const bf16* __restrict__ v,                                \
                                    const float* __restrict__ alpha,                           \
                                    const float* __restrict__ beta, int hk, int hv,            \
                                    float scale) {                                             \
        gdn_decode_step_impl<S>(out, state, seq_slot, q, k, v, alpha, beta, hk, hv, scale);    \
    }
GDN_DECODE_STEP(gdn_decode_step, float)
GDN_DECODE_STEP(gdn_decode_step_bf16, bf16)

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

template <int kRowsPerWarp, typename S>
__device__ __forceinline__ void gdn_decode_fused_impl(
    bf16* __restrict__ out, S* __restrict__ state, bf16* __restrict__ conv_state,
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
    // (As stored: a bf16 state is widened in step 3, when the rows are used.)
    S* St = state + (slot * hv + h) * D * D;
    const int row0 = row_first + warp * kRowsPerWarp;
    typename StateIo<S>::Raw st[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i)
        st[i] = StateIo<S>::load(St + (int64_t)(row0 + i) * D + lane * 4);

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
        float4 s = StateIo<S>::widen(st[i]);
        s.x *= alpha; s.y *= alpha; s.z *= alpha; s.w *= alpha;
        const float pred = warp_sum(s.x * kk[0] + s.y * kk[1] + s.z * kk[2] + s.w * kk[3]);
        const float d = beta * (v_s[row - row_first] - pred);
        s.x += d * kk[0]; s.y += d * kk[1]; s.z += d * kk[2]; s.w += d * kk[3];
        StateIo<S>::store(St + (int64_t)row * D + lane * 4, s);
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
// ModelOps::deltanet_decode_fused for which runs when. `_bf16`: over a bf16
// state (StateIo).
#define GDN_DECODE_FUSED(NAME, SPLITS, S)                                                      \
    extern "C" __global__ void __launch_bounds__(kFusedThreads) NAME(                         \
        bf16* __restrict__ out, S* __restrict__ state, bf16* __restrict__ conv_state,          \
        unsigned* __restrict__ arrivals, const bf16* __restrict__ proj, int ld, int col_z,     \
        int col_b, int col_a, const float* __restrict__ conv_w,                                \
        const float* __restrict__ a_log, const float* __restrict__ dt_bias,                    \
        const float* __restrict__ norm_w, const int32_t* __restrict__ seq_slot, int seq0,      \
        int hk, int hv, int kw, float scale, float eps) {                                      \
        gdn_decode_fused_impl<kGdnDim / (SPLITS * kFusedWarps), S>(                            \
            out, state, conv_state, arrivals, proj, ld, col_z, col_b, col_a, conv_w, a_log,    \
            dt_bias, norm_w, seq_slot, seq0, hk, hv, kw, scale, eps);                          \
    }
GDN_DECODE_FUSED(gdn_decode_fused_s4, 4, float)
GDN_DECODE_FUSED(gdn_decode_fused_s2, 2, float)
GDN_DECODE_FUSED(gdn_decode_fused_s1, 1, float)
GDN_DECODE_FUSED(gdn_decode_fused_bf16_s4, 4, bf16)
GDN_DECODE_FUSED(gdn_decode_fused_bf16_s2, 2, bf16)
GDN_DECODE_FUSED(gdn_decode_fused_bf16_s1, 1, bf16)
// --------------------------- end of the fused DeltaNet decode ---------------
