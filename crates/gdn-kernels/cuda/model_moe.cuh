// Part of model_kernels.cu (included there after model_elementwise.cuh; not a
// standalone header; checks/moe_emulation runs it on the CPU): the routed
// experts of a Qwen3.5 MoE layer (transformers' qwen3_5_moe). The caller
// computes the router logits [T, stride] with its GEMM (columns 0..E; with a
// shared expert, column E is its gate logit, `shared_expert_gate`); these
// kernels do the rest:
//
//   1. moe_topk_softmax: per token, softmax in fp32 over all E experts, the
//      k largest probabilities (ties: the lower expert index wins), divided
//      by their sum -> ids [T, k] i32, weights [T, k] f32.
//   2. moe_route: groups the T * k (token, slot) pairs by expert, on the
//      device (no host sync, so it runs inside a captured graph): the
//      permuted order `sorted_pair[row] = pair` (experts in index order, one
//      contiguous run of rows each), its inverse `pair_row[pair] = row`, and
//      a tile list (expert, first row, end row) of runs of at most
//      `tile_rows` rows, with its length in num_tiles[0]. The grid of the
//      expert kernels is sized from the bound ceil(T k / tile_rows) +
//      min(E, T k) and blocks past num_tiles exit.
//   3. The expert GEMMs over the tile list, bf16 in, fp32 accumulate:
//      gate_up with SwiGLU in the epilogue -> act [T k, I] bf16 (permuted
//      rows), then down -> y [T k, H] bf16. Two kernels each: a GEMV-style
//      one for a few rows per expert (each tile's expert weights are read
//      once for its <= 8 rows) and a tensor-core one (model_moe_tc.cuh) for
//      many. src/model_ops/moe.rs picks one.
//   4. moe_combine: out[t] = sum over slots s in order of w[t, s] * y[pair
//      row of (t, s)] (no atomics: bit-reproducible), plus the gated shared
//      expert's output when given.
//
// The direct path, for a few tokens (decode at small batches), skips the
// grouping and the separate shared-expert GEMMs: moe_direct_gate_up runs
// one block row per (token, slot) pair, plus one per token for the shared
// expert, reading the pair's expert weights itself (a repeated expert is
// read again: few tokens rarely repeat one), and moe_direct_down_combine
// runs each token's down projections, the weighted sum and the gated
// shared expert in one kernel. Three launches a layer after the router GEMM
// instead of five plus the shared expert's GEMMs: at a batch of one, the
// launches, not the bytes, were most of the layer's time
// (docs/performance.md, MoE routed experts).
//
// Rounding follows HF's bf16 forward: the gate and up projections, the
// SwiGLU product, the down projection, the routing weight (cast to bf16
// after the renormalisation) and each weighted expert output are rounded
// to bf16 where HF materialises them; the sum over the k experts is fp32
// (HF adds in bf16 in expert order), rounded once. Both paths compute each
// dot product in the same order (moe_gemv_dots), so the routed part of a
// token's output is the same bits on the direct and the GEMV path.
//
// The rows an expert's tile covers are independent of each other in every
// kernel (a row's result depends on its own inputs only, in a fixed order),
// so the order moe_route's shared-memory atomics give the rows within an
// expert does not change any output bit.
#pragma once

namespace {

constexpr int kMoeMaxExperts = 512;
constexpr int kMoeMaxTopK = 16;
constexpr int kMoeRouteThreads = 1024;
// GEMV kernels: tiles of up to 8 rows; 8 warps a block, 2 output columns a
// warp.
constexpr int kMoeGemvRows = 8;
constexpr int kMoeGemvWarps = 8;
constexpr int kMoeGemvColsPerWarp = 2;
// GEMV tiles on tensor cores: 4 warps a block, 16 output columns a warp.
constexpr int kMoeMmaWarps = 4;

__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// Exclusive prefix sums of (a, b) over the threads of a block of
// kMoeRouteThreads (every thread calls it); `total_*` gets the block totals.
__device__ void moe_block_scan2(int& a, int& b, int& total_a, int& total_b) {
    __shared__ int wa[32], wb[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int ia = a, ib = b;
    for (int o = 1; o < 32; o <<= 1) {
        const int ua = __shfl_up_sync(0xffffffffu, ia, o);
        const int ub = __shfl_up_sync(0xffffffffu, ib, o);
        if (lane >= o) ia += ua, ib += ub;
    }
    if (lane == 31) wa[warp] = ia, wb[warp] = ib;
    __syncthreads();
    if (warp == 0) {
        int sa = wa[lane], sb = wb[lane];
        for (int o = 1; o < 32; o <<= 1) {
            const int ua = __shfl_up_sync(0xffffffffu, sa, o);
            const int ub = __shfl_up_sync(0xffffffffu, sb, o);
            if (lane >= o) sa += ua, sb += ub;
        }
        wa[lane] = sa, wb[lane] = sb;  // inclusive over warps
    }
    __syncthreads();
    const int before_a = warp ? wa[warp - 1] : 0, before_b = warp ? wb[warp - 1] : 0;
    a = before_a + ia - a;
    b = before_b + ib - b;
    total_a = wa[31];
    total_b = wb[31];
}

}  // namespace

// 1. grid ceil(T / 8), block 256: one warp per token, E <= 512 probabilities
// in registers (16 a lane), k <= 16 rounds of a warp argmax. Token t's
// logits start at logits[t * stride].
extern "C" __global__ void moe_topk_softmax(const bf16* __restrict__ logits, int stride,
                                            int tokens, int experts, int top_k,
                                            int32_t* __restrict__ ids,
                                            float* __restrict__ weights) {
    constexpr int kPer = kMoeMaxExperts / 32;
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= tokens) return;
    const bf16* row = logits + t * stride;
    float p[kPer];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const int e = i * 32 + lane;
        p[i] = e < experts ? f(row[e]) : -INFINITY;
        m = fmaxf(m, p[i]);
    }
    m = warp_max(m);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        p[i] = i * 32 + lane < experts ? expf(p[i] - m) : 0.f;
        s += p[i];
    }
    s = warp_sum(s);
    // Probabilities are >= 0; -1 marks an expert past E or already taken.
#pragma unroll
    for (int i = 0; i < kPer; ++i) p[i] = i * 32 + lane < experts ? p[i] / s : -1.f;
    float mine = 0.f, picked_sum = 0.f;
    int mine_id = 0;
    for (int j = 0; j < top_k; ++j) {
        // This lane's best (its experts ascend with i: strict > keeps the
        // lower index on a tie), then the warp's, lower index on a tie.
        float v = -2.f;
        int e = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < kPer; ++i)
            if (p[i] > v) v = p[i], e = i * 32 + lane;
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, o);
            const int oe = __shfl_xor_sync(0xffffffffu, e, o);
            if (ov > v || (ov == v && oe < e)) v = ov, e = oe;
        }
        if ((e & 31) == lane) {
#pragma unroll
            for (int i = 0; i < kPer; ++i)
                if (i * 32 + lane == e) p[i] = -1.f;
        }
        if (lane == j) mine = v, mine_id = e;
        picked_sum += v;
    }
    if (lane < top_k) {
        ids[t * top_k + lane] = mine_id;
        weights[t * top_k + lane] = mine / picked_sum;
    }
}

// 2. One block of 1024 threads (E <= 512): counts per expert in shared
// memory, exclusive scans of the counts and of the tiles per expert, the
// tile list, then each pair's row.
extern "C" __global__ void moe_route(const int32_t* __restrict__ ids, int pairs, int experts,
                                     int tile_rows, int32_t* __restrict__ sorted_pair,
                                     int32_t* __restrict__ pair_row,
                                     int32_t* __restrict__ tile_expert,
                                     int32_t* __restrict__ tile_row, int32_t* __restrict__ tile_end,
                                     int32_t* __restrict__ num_tiles) {
    __shared__ int cursor[kMoeMaxExperts];
    const int tid = threadIdx.x;
    for (int e = tid; e < experts; e += blockDim.x) cursor[e] = 0;
    __syncthreads();
    for (int p = tid; p < pairs; p += blockDim.x) atomicAdd(&cursor[ids[p]], 1);
    __syncthreads();
    const int count = tid < experts ? cursor[tid] : 0;
    int first_row = count, first_tile = (count + tile_rows - 1) / tile_rows;
    const int tiles = first_tile;
    int total_rows, total_tiles;
    moe_block_scan2(first_row, first_tile, total_rows, total_tiles);
    if (tid < experts) {
        cursor[tid] = first_row;
        for (int i = 0; i < tiles; ++i) {
            tile_expert[first_tile + i] = tid;
            tile_row[first_tile + i] = first_row + i * tile_rows;
            tile_end[first_tile + i] = min(first_row + (i + 1) * tile_rows, first_row + count);
        }
    }
    if (tid == 0) num_tiles[0] = total_tiles;
    __syncthreads();
    for (int p = tid; p < pairs; p += blockDim.x) {
        const int r = atomicAdd(&cursor[ids[p]], 1);
        sorted_pair[r] = p;
        pair_row[p] = r;
    }
}

// Input row `r` of the permuted order: x[sorted_pair[r] / top_k] for
// gate_up (row_src set), act[r] for down (row_src null).
__device__ __forceinline__ int64_t moe_src_row(const int32_t* row_src, int src_div, int r) {
    return row_src ? row_src[r] / src_div : r;
}

// One warp's dot products for the output columns n0, n0 + 1 of expert
// weights `we` ([N, K]; with SwiGLU [2N, K], gate rows 0..N, up rows
// N..2N: the gate and up rows of both columns) against the `rows` <= ROWS
// input rows xrow[i]. Each lane streams 8 consecutive k of every weight row
// (16-byte loads; K % 8 == 0) against the same k of every input row, then
// the warp sums: every lane ends with acc[c][i] over all of K, the same bits
// on every lane (xor butterfly). Column c is n0 + c % 2; with SwiGLU, c >= 2
// is the up row of column n0 + c - 2. A column past N reads row N - 1 (the
// caller does not store it).
template <bool SWIGLU, int ROWS>
__device__ __forceinline__ void moe_gemv_dots(
    float (&acc)[SWIGLU ? 2 * kMoeGemvColsPerWarp : kMoeGemvColsPerWarp][ROWS],
    const bf16* const (&xrow)[ROWS], int rows, const bf16* __restrict__ we, int K, int N, int n0,
    int lane) {
    constexpr int kW = SWIGLU ? 2 * kMoeGemvColsPerWarp : kMoeGemvColsPerWarp;
    const bf16* wrow[kW];
#pragma unroll
    for (int c = 0; c < kW; ++c) {
        const int col = min(n0 + c % kMoeGemvColsPerWarp, N - 1);
        wrow[c] = we + (int64_t)(c < kMoeGemvColsPerWarp ? col : N + col) * K;
    }
#pragma unroll
    for (int c = 0; c < kW; ++c)
#pragma unroll
        for (int i = 0; i < ROWS; ++i) acc[c][i] = 0.f;
#pragma unroll 2
    for (int k0 = lane * 8; k0 < K; k0 += 256) {
        float wv[kW][8];
#pragma unroll
        for (int c = 0; c < kW; ++c) {
            const uint4 raw = *reinterpret_cast<const uint4*>(wrow[c] + k0);
            bf16 b8[8];
            copy_bits(b8, &raw, sizeof raw);
#pragma unroll
            for (int q = 0; q < 8; ++q) wv[c][q] = f(b8[q]);
        }
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            if (i < rows) {
                const uint4 raw = *reinterpret_cast<const uint4*>(xrow[i] + k0);
                bf16 x8[8];
                copy_bits(x8, &raw, sizeof raw);
#pragma unroll
                for (int q = 0; q < 8; ++q) {
                    const float xv = f(x8[q]);
#pragma unroll
                    for (int c = 0; c < kW; ++c) acc[c][i] = fmaf(xv, wv[c][q], acc[c][i]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
        if (i < rows) {
#pragma unroll
            for (int c = 0; c < kW; ++c) acc[c][i] = warp_sum(acc[c][i]);
        }
    }
}

// The value lane `lane` (< 2) stores for row i: its column's dot product,
// or with SwiGLU bf16(silu(bf16(gate)) * bf16(up)) as HF rounds it.
template <bool SWIGLU, int ROWS>
__device__ __forceinline__ float moe_gemv_value(
    const float (&acc)[SWIGLU ? 2 * kMoeGemvColsPerWarp : kMoeGemvColsPerWarp][ROWS], int i,
    int lane) {
    float v = 0.f;
#pragma unroll
    for (int c = 0; c < kMoeGemvColsPerWarp; ++c) {
        if (c != lane) continue;
        if (SWIGLU) {
            const float g = rbf(acc[c][i]), u = rbf(acc[c + (SWIGLU ? kMoeGemvColsPerWarp : 0)][i]);
            v = rbf(silu(g)) * u;
        } else {
            v = acc[c][i];
        }
    }
    return v;
}

// 3a. GEMV: out[r, n] = in_row(r) . w_e[n] for the <= 8 rows r of tile
// blockIdx.x (expert e), columns n of blockIdx.y's group of 16 (2 a warp);
// w_e [N, K] (down) or [2N, K] with SwiGLU (gate rows 0..N, up rows N..2N).
// grid (tile bound, ceil(N / 16)), block 256.
template <bool SWIGLU>
__device__ void moe_gemv_impl(bf16* __restrict__ out, const bf16* __restrict__ in,
                              const int32_t* __restrict__ row_src, int src_div,
                              const bf16* __restrict__ w, int K, int N,
                              const int32_t* __restrict__ tile_expert,
                              const int32_t* __restrict__ tile_row,
                              const int32_t* __restrict__ tile_end,
                              const int32_t* __restrict__ num_tiles) {
    constexpr int kW = SWIGLU ? 2 * kMoeGemvColsPerWarp : kMoeGemvColsPerWarp;
    const int tile = blockIdx.x;
    if (tile >= num_tiles[0]) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n0 = (blockIdx.y * kMoeGemvWarps + warp) * kMoeGemvColsPerWarp;
    if (n0 >= N) return;
    const int e = tile_expert[tile], r0 = tile_row[tile];
    const int rows = tile_end[tile] - r0;
    const bf16* we = w + (int64_t)e * (SWIGLU ? 2 : 1) * N * K;
    const bf16* xrow[kMoeGemvRows];
#pragma unroll
    for (int i = 0; i < kMoeGemvRows; ++i)
        xrow[i] = in + moe_src_row(row_src, src_div, r0 + min(i, rows - 1)) * K;
    float acc[kW][kMoeGemvRows];
    moe_gemv_dots<SWIGLU, kMoeGemvRows>(acc, xrow, rows, we, K, N, n0, lane);
#pragma unroll
    for (int i = 0; i < kMoeGemvRows; ++i) {
        if (i >= rows) break;
        if (lane < kMoeGemvColsPerWarp && n0 + lane < N)
            out[(int64_t)(r0 + i) * N + n0 + lane] =
                bf(moe_gemv_value<SWIGLU, kMoeGemvRows>(acc, i, lane));
    }
}

#define MOE_EXPERT_KERNEL(name, impl, swiglu)                                                   \
    extern "C" __global__ void name(                                                           \
        bf16* __restrict__ out, const bf16* __restrict__ in, const int32_t* __restrict__ row_src, \
        int src_div, const bf16* __restrict__ w, int K, int N,                                  \
        const int32_t* __restrict__ tile_expert, const int32_t* __restrict__ tile_row,          \
        const int32_t* __restrict__ tile_end, const int32_t* __restrict__ num_tiles) {          \
        impl<swiglu>(out, in, row_src, src_div, w, K, N, tile_expert, tile_row, tile_end,      \
                     num_tiles);                                                                \
    }
MOE_EXPERT_KERNEL(moe_gemv_gate_up, moe_gemv_impl, true)
MOE_EXPERT_KERNEL(moe_gemv_down, moe_gemv_impl, false)

// d += A[16 x 16] B[16 x 8] (mma.sync m16n8k16, bf16 in, fp32 accumulate):
// lane (g, c) = (lane / 4, lane % 4) holds a = {A[g][2c..2c+1], A[g+8][2c..2c+1],
// A[g][2c+8..2c+9], A[g+8][2c+8..2c+9]}, b = {B[2c..2c+1][g], B[2c+8..2c+9][g]},
// d = {D[g][2c], D[g][2c+1], D[g+8][2c], D[g+8][2c+1]}. The CPU emulation
// (checks/moe_emulation) defines GDN_HOST_EMULATION and its own.
#ifndef GDN_HOST_EMULATION
__device__ __forceinline__ void moe_mma_16816(float (&d)[4], uint32_t a0, uint32_t a1,
                                              uint32_t a2, uint32_t a3, uint32_t b0,
                                              uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#endif

// 3c. GEMV on tensor cores: the same tiles of <= 8 rows and the same output
// as 3a, with the expert's weights as the MMA's A operand (16 output
// columns a warp) and the tile's rows as its B operand (8 columns; rows past
// the tile are zeros). Each weight is still read once per tile, but the
// multiply-adds leave the CUDA cores: at 4-8 rows a tile, 3a's FMAs and
// conversions, not its bytes, bound it (docs/performance.md, MoE routed
// experts). Per 32 k, lane (g, c) loads 16 bytes (k 8c..8c+7) of weight rows
// n0 + g and n0 + g + 8 and of the tile's row g: two k16 MMAs take them as
// their k (2c, 2c+1, 2c+8, 2c+9), the first k 8c..8c+3, the second
// 8c+4..8c+7. A and B permute k alike, so the sums are the same dot
// products (summed in the tensor cores' order, not 3a's).
// grid (tile bound, ceil(N / 64)), block 128 (4 warps of 16 columns);
// N % 16 == 0, K % 32 == 0.
template <bool SWIGLU>
__device__ void moe_gemv_mma_impl(bf16* __restrict__ out, const bf16* __restrict__ in,
                                  const int32_t* __restrict__ row_src, int src_div,
                                  const bf16* __restrict__ w, int K, int N,
                                  const int32_t* __restrict__ tile_expert,
                                  const int32_t* __restrict__ tile_row,
                                  const int32_t* __restrict__ tile_end,
                                  const int32_t* __restrict__ num_tiles) {
    constexpr int kA = SWIGLU ? 2 : 1;  // gate (and up) row blocks
    const int tile = blockIdx.x;
    if (tile >= num_tiles[0]) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n0 = (blockIdx.y * kMoeMmaWarps + warp) * 16;
    if (n0 >= N) return;
    const int e = tile_expert[tile], r0 = tile_row[tile];
    const int rows = tile_end[tile] - r0;
    const int g = lane >> 2, c = lane & 3;
    const bf16* we = w + (int64_t)e * kA * N * K;
    const bf16* arow[kA][2];
#pragma unroll
    for (int a = 0; a < kA; ++a)
#pragma unroll
        for (int h = 0; h < 2; ++h) arow[a][h] = we + (int64_t)(a * N + n0 + g + 8 * h) * K + 8 * c;
    const bool has_row = g < rows;
    const bf16* xrow = in + moe_src_row(row_src, src_div, r0 + min(g, rows - 1)) * K + 8 * c;
    float acc[kA][4];
#pragma unroll
    for (int a = 0; a < kA; ++a)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[a][q] = 0.f;
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll 4
    for (int k0 = 0; k0 < K; k0 += 32) {
        uint4 wv[kA][2];
#pragma unroll
        for (int a = 0; a < kA; ++a)
#pragma unroll
            for (int h = 0; h < 2; ++h) wv[a][h] = *reinterpret_cast<const uint4*>(arow[a][h] + k0);
        const uint4 xv = has_row ? *reinterpret_cast<const uint4*>(xrow + k0) : zero;
#pragma unroll
        for (int a = 0; a < kA; ++a) {
            moe_mma_16816(acc[a], wv[a][0].x, wv[a][1].x, wv[a][0].y, wv[a][1].y, xv.x, xv.y);
            moe_mma_16816(acc[a], wv[a][0].z, wv[a][1].z, wv[a][0].w, wv[a][1].w, xv.z, xv.w);
        }
    }
    // acc[a][q]: output column n0 + g + 8 (q / 2), tile row 2c + q % 2.
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int r = 2 * c + (q & 1), col = n0 + g + 8 * (q >> 1);
        if (r >= rows) continue;
        float v = acc[0][q];
        if (SWIGLU) v = rbf(silu(rbf(acc[0][q]))) * rbf(acc[kA - 1][q]);
        out[(int64_t)(r0 + r) * N + col] = bf(v);
    }
}
MOE_EXPERT_KERNEL(moe_gemv_mma_gate_up, moe_gemv_mma_impl, true)
MOE_EXPERT_KERNEL(moe_gemv_mma_down, moe_gemv_mma_impl, false)

// Direct path, gate_up: act[p * act_ld + n] for pair p = blockIdx.x. Pairs
// below T k are (token p / k, slot p % k) on expert ids[p] (w [E, 2I, K]);
// with `shared_w` ([2 Is, K]), pairs T k + t are token t's shared expert.
// Columns as moe_gemv_impl's, of N = I or Is.
// grid (T k (+ T), ceil(max(I, Is) / 16)), block 256.
extern "C" __global__ void moe_direct_gate_up(bf16* __restrict__ act, int act_ld,
                                              const bf16* __restrict__ x,
                                              const int32_t* __restrict__ ids, int tokens,
                                              int top_k, const bf16* __restrict__ w, int inter,
                                              const bf16* __restrict__ shared_w,
                                              int shared_inter, int K) {
    const int p = blockIdx.x, routed = tokens * top_k;
    const bool shared = p >= routed;
    const int N = shared ? shared_inter : inter;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n0 = (blockIdx.y * kMoeGemvWarps + warp) * kMoeGemvColsPerWarp;
    if (n0 >= N) return;
    const bf16* we = shared ? shared_w : w + (int64_t)ids[p] * 2 * inter * K;
    const bf16* const xrow[1] = {x + (int64_t)(shared ? p - routed : p / top_k) * K};
    float acc[2 * kMoeGemvColsPerWarp][1];
    moe_gemv_dots<true, 1>(acc, xrow, 1, we, K, N, n0, lane);
    if (lane < kMoeGemvColsPerWarp && n0 + lane < N)
        act[(int64_t)p * act_ld + n0 + lane] = bf(moe_gemv_value<true, 1>(acc, 0, lane));
}

// Direct path, down and combine: out[t, n] for token t = blockIdx.x and the
// columns n of blockIdx.y's group of 16 (2 a warp): sum over slots s in
// order of bf16(bf16(w[t, s]) * bf16(act[t k + s] . down_e[n])) (down w
// [E, H, I], e = ids[t k + s]), rounded once, plus the shared expert as
// moe_combine adds it: its output from act[T k + t] . shared_w[n] (shared_w
// [H, Is]) or read from shared_out [T, H]; its gate from logits[t * stride +
// experts]. The same bits as moe_gemv_down then moe_combine.
// grid (T, ceil(H / 16)), block 256.
extern "C" __global__ void moe_direct_down_combine(
    bf16* __restrict__ out, const bf16* __restrict__ act, int act_ld,
    const int32_t* __restrict__ ids, const float* __restrict__ weights, int tokens, int top_k,
    const bf16* __restrict__ w, int inter, const bf16* __restrict__ shared_w, int shared_inter,
    const bf16* __restrict__ shared_out, const bf16* __restrict__ logits, int stride,
    int experts, int hidden) {
    const int t = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n0 = (blockIdx.y * kMoeGemvWarps + warp) * kMoeGemvColsPerWarp;
    if (n0 >= hidden) return;
    float sum[kMoeGemvColsPerWarp] = {0.f, 0.f};
#pragma unroll 2
    for (int s = 0; s < top_k; ++s) {
        const int p = t * top_k + s;
        const bf16* const xrow[1] = {act + (int64_t)p * act_ld};
        float acc[kMoeGemvColsPerWarp][1];
        moe_gemv_dots<false, 1>(acc, xrow, 1, w + (int64_t)ids[p] * hidden * inter, inter,
                                hidden, n0, lane);
        const float ws = rbf(weights[p]);
#pragma unroll
        for (int c = 0; c < kMoeGemvColsPerWarp; ++c) sum[c] += rbf(rbf(acc[c][0]) * ws);
    }
    // Every lane goes on (the shared expert's warp sums need all 32); lanes
    // 0 and 1 store their column.
    const int col = min(n0 + lane, hidden - 1);
    float v = lane == 0 ? sum[0] : sum[1];
    if (shared_w || shared_out) {
        float shared;
        if (shared_w) {
            const bf16* const xrow[1] = {act + (int64_t)(tokens * top_k + t) * act_ld};
            float acc[kMoeGemvColsPerWarp][1];
            moe_gemv_dots<false, 1>(acc, xrow, 1, shared_w, shared_inter, hidden, n0, lane);
            shared = rbf(lane == 0 ? acc[0][0] : acc[1][0]);
        } else {
            shared = f(shared_out[(int64_t)t * hidden + col]);
        }
        const float g = rbf(sigmoid(f(logits[(int64_t)t * stride + experts])));
        v = rbf(v) + rbf(g * shared);
    }
    if (lane < kMoeGemvColsPerWarp && n0 + lane < hidden)
        out[(int64_t)t * hidden + n0 + lane] = bf(v);
}

// 4. out[t] = bf16(sum_s bf16(bf16(w[t, s]) * y[pair_row[t k + s]])), the
// slots in order, plus bf16(bf16(sigmoid(gate)) * shared[t]) when `shared`
// is set, gate = logits[t * stride + experts] (HF adds the routed and the
// shared outputs as bf16 tensors: the routed sum is rounded first). 8
// columns a thread (H % 8 == 0). grid T, block 256.
extern "C" __global__ void moe_combine(bf16* __restrict__ out, const bf16* __restrict__ y,
                                       const int32_t* __restrict__ pair_row,
                                       const float* __restrict__ weights, int top_k, int hidden,
                                       const bf16* __restrict__ shared,
                                       const bf16* __restrict__ logits, int stride,
                                       int experts) {
    const int64_t t = blockIdx.x;
    const float g = shared ? rbf(sigmoid(f(logits[t * stride + experts]))) : 0.f;
    for (int c0 = threadIdx.x * 8; c0 < hidden; c0 += blockDim.x * 8) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int s = 0; s < top_k; ++s) {
            const int64_t r = pair_row[t * top_k + s];
            const float w = rbf(weights[t * top_k + s]);
            const uint4 raw = *reinterpret_cast<const uint4*>(y + r * hidden + c0);
            bf16 y8[8];
            copy_bits(y8, &raw, sizeof raw);
#pragma unroll
            for (int q = 0; q < 8; ++q) acc[q] += rbf(f(y8[q]) * w);
        }
        bf16 o[8];
        if (shared) {
            const uint4 raw = *reinterpret_cast<const uint4*>(shared + t * hidden + c0);
            bf16 s8[8];
            copy_bits(s8, &raw, sizeof raw);
#pragma unroll
            for (int q = 0; q < 8; ++q) o[q] = bf(rbf(acc[q]) + rbf(g * f(s8[q])));
        } else {
#pragma unroll
            for (int q = 0; q < 8; ++q) o[q] = bf(acc[q]);
        }
        uint4 packed;
        copy_bits(&packed, o, sizeof packed);
        *reinterpret_cast<uint4*>(out + t * hidden + c0) = packed;
    }
}
