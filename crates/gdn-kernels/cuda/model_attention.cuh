// Part of model_kernels.cu (included there in this order, after
// model_common.cuh; not a standalone header): our paged attention (decode with
// splits and their combine, the WMMA prefill fallback) and the output gate
// after FlashInfer's FA3.
#pragma once

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
