// Part of model_kernels.cu (included there after model_elementwise.cuh; not a
// standalone header): the routed experts of a Qwen3.5 MoE layer
// (transformers' qwen3_5_moe). The caller computes the router logits
// [T, E] with its GEMM and adds the shared expert; these kernels do the rest:
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
//      one for a few rows per expert (decode: each tile's expert weights are
//      read once for its <= 8 rows) and a tensor-core one (WMMA bf16, tiles
//      of 64 rows x 64 columns) for many. src/model_ops/moe.rs picks one.
//   4. moe_combine: out[t] = sum over slots s in order of w[t, s] * y[pair
//      row of (t, s)] (no atomics: bit-reproducible), plus the gated shared
//      expert when given.
//
// Rounding follows HF's bf16 forward: the gate and up projections, the
// SwiGLU product, the down projection, the routing weight (cast to bf16
// after the renormalisation) and each weighted expert output are rounded
// to bf16 where HF materialises them; the sum over the k experts is fp32
// (HF adds in bf16 in expert order), rounded once.
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
// Tensor-core kernels: 64 x 64 output tiles, k steps of 32, 4 warps of
// 32 x 32 each.
constexpr int kMoeTcRows = 64;
constexpr int kMoeTcCols = 64;
constexpr int kMoeTcK = 32;
constexpr int kMoeTcLds = kMoeTcK + 8;  // padded shared rows (bank spread)

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
// in registers (16 a lane), k <= 16 rounds of a warp argmax.
extern "C" __global__ void moe_topk_softmax(const bf16* __restrict__ logits, int tokens,
                                            int experts, int top_k, int32_t* __restrict__ ids,
                                            float* __restrict__ weights) {
    constexpr int kPer = kMoeMaxExperts / 32;
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= tokens) return;
    const bf16* row = logits + t * experts;
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

// 3a. GEMV: out[r, n] = in_row(r) . w_e[n] for the <= 8 rows r of tile
// blockIdx.x (expert e), columns n of blockIdx.y's group of 16 (2 a warp);
// w_e [N, K] (down) or [2N, K] with SwiGLU (gate rows 0..N, up rows N..2N).
// Each lane streams 8 consecutive k of every weight row the warp needs
// (16-byte loads; K % 8 == 0) against the same k of all the tile's rows.
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
    const bf16* wrow[kW];
#pragma unroll
    for (int c = 0; c < kW; ++c) {
        const int col = min(n0 + c % kMoeGemvColsPerWarp, N - 1);
        wrow[c] = we + (int64_t)(c < kMoeGemvColsPerWarp ? col : N + col) * K;
    }
    const bf16* xrow[kMoeGemvRows];
#pragma unroll
    for (int i = 0; i < kMoeGemvRows; ++i)
        xrow[i] = in + moe_src_row(row_src, src_div, r0 + min(i, rows - 1)) * K;
    float acc[kW][kMoeGemvRows];
#pragma unroll
    for (int c = 0; c < kW; ++c)
#pragma unroll
        for (int i = 0; i < kMoeGemvRows; ++i) acc[c][i] = 0.f;
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
        for (int i = 0; i < kMoeGemvRows; ++i) {
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
    for (int i = 0; i < kMoeGemvRows; ++i) {
        if (i >= rows) break;
#pragma unroll
        for (int c = 0; c < kW; ++c) acc[c][i] = warp_sum(acc[c][i]);
        if (lane < kMoeGemvColsPerWarp && n0 + lane < N) {
            float v = 0.f;
#pragma unroll
            for (int c = 0; c < kMoeGemvColsPerWarp; ++c) {
                if (c != lane) continue;
                if (SWIGLU) {
                    const float g = rbf(acc[c][i]), u = rbf(acc[c + kMoeGemvColsPerWarp][i]);
                    v = rbf(silu(g)) * u;
                } else {
                    v = acc[c][i];
                }
            }
            out[(int64_t)(r0 + i) * N + n0 + lane] = bf(v);
        }
    }
}

// 3b. Tensor cores: out[r, n] for the <= 64 rows of tile blockIdx.x and the
// 64 columns of blockIdx.y (SwiGLU: 64 gate and the matching 64 up columns,
// two accumulators, combined element by element in the epilogue: the two
// fragments have the same type, so their elements pair up). Per k step of
// 32, the A rows (gathered by row) and the B rows go to padded shared tiles
// through 16-byte loads (K % 32 == 0; the next step's are in flight during
// this step's MMAs), rows and columns past the tile as zeros; each of the
// 4 warps multiplies a 32 x 32 quarter.
// grid (tile bound, ceil(N / 64)), block 128.
template <bool SWIGLU>
__device__ void moe_gemm_tc_impl(bf16* __restrict__ out, const bf16* __restrict__ in,
                                 const int32_t* __restrict__ row_src, int src_div,
                                 const bf16* __restrict__ w, int K, int N,
                                 const int32_t* __restrict__ tile_expert,
                                 const int32_t* __restrict__ tile_row,
                                 const int32_t* __restrict__ tile_end,
                                 const int32_t* __restrict__ num_tiles) {
    using namespace nvcuda;
    constexpr int kB = SWIGLU ? 2 : 1;
    constexpr int kBRows = kB * kMoeTcCols;
    constexpr int kLdc = kMoeTcCols + 4;
    __shared__ __align__(128) bf16 sA[kMoeTcRows * kMoeTcLds];
    __shared__ __align__(128) bf16 sB[kBRows * kMoeTcLds];
    __shared__ __align__(128) float sC[kMoeTcRows * kLdc];
    const int tile = blockIdx.x;
    if (tile >= num_tiles[0]) return;
    const int tid = threadIdx.x, warp = tid >> 5;
    const int e = tile_expert[tile], r0 = tile_row[tile];
    const int rows = tile_end[tile] - r0;
    const int n0 = blockIdx.y * kMoeTcCols;
    const bf16* we = w + (int64_t)e * kB * N * K;

    // Each thread loads fixed 16-byte chunks: A rows tid / 4 + 32 i, chunk
    // tid % 4; B rows likewise over kBRows.
    constexpr int kARounds = kMoeTcRows * 4 / 128, kBRounds = kBRows * 4 / 128;
    const int chunk = tid & 3;
    const bf16* a_src[kARounds];
#pragma unroll
    for (int i = 0; i < kARounds; ++i) {
        const int r = (tid >> 2) + 32 * i;
        a_src[i] = r < rows ? in + moe_src_row(row_src, src_div, r0 + r) * K + chunk * 8 : nullptr;
    }
    const bf16* b_src[kBRounds];
#pragma unroll
    for (int i = 0; i < kBRounds; ++i) {
        const int j = (tid >> 2) + 32 * i;  // row of sB
        const int col = n0 + j % kMoeTcCols;
        const int wr = j < kMoeTcCols ? col : N + col;
        b_src[i] = col < N ? we + (int64_t)wr * K + chunk * 8 : nullptr;
    }

    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kB][2][2];
#pragma unroll
    for (int b = 0; b < kB; ++b)
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[b][i][j], 0.f);

    // The next k step's global loads are issued into registers before the
    // MMAs of the current one, so their latency overlaps the tensor cores.
    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4 a_next[kARounds], b_next[kBRounds];
    auto fetch = [&](int k0) {
#pragma unroll
        for (int i = 0; i < kARounds; ++i)
            a_next[i] = a_src[i] ? *reinterpret_cast<const uint4*>(a_src[i] + k0) : zero;
#pragma unroll
        for (int i = 0; i < kBRounds; ++i)
            b_next[i] = b_src[i] ? *reinterpret_cast<const uint4*>(b_src[i] + k0) : zero;
    };
    fetch(0);
    for (int k0 = 0; k0 < K; k0 += kMoeTcK) {
#pragma unroll
        for (int i = 0; i < kARounds; ++i)
            *reinterpret_cast<uint4*>(sA + ((tid >> 2) + 32 * i) * kMoeTcLds + chunk * 8) = a_next[i];
#pragma unroll
        for (int i = 0; i < kBRounds; ++i)
            *reinterpret_cast<uint4*>(sB + ((tid >> 2) + 32 * i) * kMoeTcLds + chunk * 8) = b_next[i];
        __syncthreads();
        if (k0 + kMoeTcK < K) fetch(k0 + kMoeTcK);
#pragma unroll
        for (int kk = 0; kk < kMoeTcK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a[2];
#pragma unroll
            for (int i = 0; i < 2; ++i)
                wmma::load_matrix_sync(a[i], sA + (wm + 16 * i) * kMoeTcLds + kk, kMoeTcLds);
#pragma unroll
            for (int b = 0; b < kB; ++b) {
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> bf_;
                    wmma::load_matrix_sync(
                        bf_, sB + (b * kMoeTcCols + wn + 16 * j) * kMoeTcLds + kk, kMoeTcLds);
#pragma unroll
                    for (int i = 0; i < 2; ++i) wmma::mma_sync(acc[b][i][j], a[i], bf_, acc[b][i][j]);
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            if (SWIGLU) {
#pragma unroll
                for (int q = 0; q < acc[0][i][j].num_elements; ++q) {
                    const float g = rbf(acc[0][i][j].x[q]), u = rbf(acc[kB - 1][i][j].x[q]);
                    acc[0][i][j].x[q] = rbf(silu(g)) * u;
                }
            }
            wmma::store_matrix_sync(sC + (wm + 16 * i) * kLdc + wn + 16 * j, acc[0][i][j], kLdc,
                                    wmma::mem_row_major);
        }
    __syncthreads();
    // 8 columns a thread: one 16-byte store where the 8 lie inside N.
    for (int c = tid; c < kMoeTcRows * (kMoeTcCols / 8); c += blockDim.x) {
        const int r = c / (kMoeTcCols / 8), col = (c % (kMoeTcCols / 8)) * 8;
        if (r >= rows || n0 + col >= N) continue;
        bf16* dst = out + (int64_t)(r0 + r) * N + n0 + col;
        const float* src = sC + r * kLdc + col;
        if (n0 + col + 8 <= N && (N & 7) == 0) {
            bf16 v[8];
#pragma unroll
            for (int q = 0; q < 8; ++q) v[q] = bf(src[q]);
            uint4 packed;
            copy_bits(&packed, v, sizeof packed);
            *reinterpret_cast<uint4*>(dst) = packed;
        } else {
            for (int q = 0; q < 8 && n0 + col + q < N; ++q) dst[q] = bf(src[q]);
        }
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
MOE_EXPERT_KERNEL(moe_gemm_gate_up, moe_gemm_tc_impl, true)
MOE_EXPERT_KERNEL(moe_gemm_down, moe_gemm_tc_impl, false)
#undef MOE_EXPERT_KERNEL

// 4. out[t] = bf16(sum_s bf16(bf16(w[t, s]) * y[pair_row[t k + s]])), the
// slots in order, plus bf16(bf16(sigmoid(gate[t])) * shared[t]) when
// `shared` is set (HF adds the routed and the shared outputs as bf16
// tensors: the routed sum is rounded first). 8 columns a thread (H % 8 ==
// 0). grid T, block 256.
extern "C" __global__ void moe_combine(bf16* __restrict__ out, const bf16* __restrict__ y,
                                       const int32_t* __restrict__ pair_row,
                                       const float* __restrict__ weights, int top_k, int hidden,
                                       const bf16* __restrict__ shared,
                                       const bf16* __restrict__ shared_gate) {
    const int64_t t = blockIdx.x;
    const float g = shared ? rbf(sigmoid(f(shared_gate[t]))) : 0.f;
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
