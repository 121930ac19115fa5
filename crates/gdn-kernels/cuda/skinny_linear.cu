// Skinny linear layers for decode steps: y[m, n] = sum_k x[m, k] w[n, k],
// m <= 16 rows of x, bf16 in, fp32 accumulate, bf16 or fp32 out (the same
// contract as the cuBLAS path of gemm.rs). A decode step of a small batch is
// a pure weight stream: every byte of w is read once, x and y are tiny, so
// the kernel is designed for bytes in flight rather than for reuse.
//
// Why it looks the way it does (an earlier one-warp-per-column kernel with
// one 16-byte load in flight per lane and x re-read from global for every
// row reached only 0.76-0.81 of cuBLAS on the H200):
// - A block owns a tile of 16 output columns (16 rows of w) over the whole
//   of k; its warps split k in groups of U steps of 32 elements, interleaved
//   (no split-K pass; the block sums its warps' partials in shared memory).
// - Every lane issues 2 U independent 16-byte weight loads (rows g and g + 8
//   of the tile, 8 consecutive k each) and the matching x loads before it
//   uses any of them; the weight loads skip L1 (read once) so x stays there.
// - The multiply-adds run on the tensor cores (mma.m16n8k16, bf16 in, fp32
//   accumulate): with CUDA-core FMAs, eight rows of x already cost as many
//   instructions per weight byte as the SMs can issue at full bandwidth.
//   The 16 w rows are the mma's M, up to 8 rows of x its N (a second mma
//   for rows 8..15). The sum over k does not depend on the order of k, so
//   each lane feeds the mma the 8 consecutive k it loaded: A's k pairs
//   {2t, 2t+1, 2t+8, 2t+9} of the PTX fragment layout are mapped to the
//   lane's physical k {8t .. 8t+3} (first mma) and {8t+4 .. 8t+7} (second),
//   and B (x) gets exactly the same mapping, so sum_k A[i, k] B[k, j] is
//   the true dot product.
// Requires k % 8 == 0 and 16-byte aligned x and w (checked by the caller).
// grid ceil(N / 16), block 32 * warps (warps <= kMaxWarps), dynamic shared
// memory warps * 512 * TB bytes (none for one warp).
#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

namespace {

constexpr int kTileCols = 16;  // output columns per block (rows of w): the mma's M
constexpr int kStep = 32;      // k per warp step: 4 lanes x 8 bf16
constexpr int kMaxWarps = 16;

// Weight stream: read once, so no L1 allocation; ask L2 for 256-byte
// prefetch (the next steps of the same rows).
__device__ __forceinline__ uint4 load_weight(const bf16* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

__device__ __forceinline__ uint4 load_x(const bf16* p) {
    return __ldg(reinterpret_cast<const uint4*>(p));
}

// d += A * B, A 16x16 (row), B 16x8 (col), bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                            uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// TB: blocks of 8 rows of x (1: m <= 8, 2: m <= 16). U: steps of 32 k per
// warp per round (loads in flight per lane: 2 U weight + TB U x).
template <int TB, int U, typename Out>
__device__ __forceinline__ void skinny_linear(Out* __restrict__ y, const bf16* __restrict__ x,
                                              const bf16* __restrict__ w, int M, int N, int K) {
    // [warps][kTileCols][TB * 8] partial sums (dynamic: warps * 512 TB bytes,
    // so that small blocks leave room for many of them on an SM).
    extern __shared__ float partial[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * kTileCols;
    // Columns past N and rows of x past M read the last valid row instead
    // (no predicated loads in the main loop); what they produce lands in
    // accumulators that are never stored.
    const bf16* wa = w + (int64_t)min(n0 + g, N - 1) * K + t * 8;
    const bf16* wb = w + (int64_t)min(n0 + g + 8, N - 1) * K + t * 8;
    const bf16* xr[TB];
#pragma unroll
    for (int b = 0; b < TB; ++b) xr[b] = x + (int64_t)min(b * 8 + g, M - 1) * K + t * 8;
    // Two accumulator sets (even and odd steps): two independent mma chains,
    // so a round's multiplies take half the dependent latency.
    float acc[TB][4], acc2[TB][4];
#pragma unroll
    for (int b = 0; b < TB; ++b) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[b][e] = acc2[b][e] = 0.f;
    }

    // Full rounds: every load of the round is issued before the first mma.
    const int round = U * kStep, stride = warps * round;
    int s0 = warp * round;
    for (; s0 + round <= K; s0 += stride) {
        uint4 va[U], vb[U], vx[TB][U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            va[u] = load_weight(wa + s0 + u * kStep);
            vb[u] = load_weight(wb + s0 + u * kStep);
#pragma unroll
            for (int b = 0; b < TB; ++b) vx[b][u] = load_x(xr[b] + s0 + u * kStep);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int b = 0; b < TB; ++b) {
                mma_16x8x16(acc[b], va[u].x, vb[u].x, va[u].y, vb[u].y, vx[b][u].x, vx[b][u].y);
                mma_16x8x16(acc2[b], va[u].z, vb[u].z, va[u].w, vb[u].w, vx[b][u].z, vx[b][u].w);
            }
        }
    }
    // The tail of k (at most one partial round, in one warp): a step at or
    // past k is zero in both operands. k % 8 == 0, so a lane's 8 elements
    // are all inside k or all outside.
    if (s0 < K) {
        const uint4 zero = make_uint4(0, 0, 0, 0);
        for (int k = s0; k < K; k += kStep) {
            const bool in = k + t * 8 < K;
            const uint4 a = in ? load_weight(wa + k) : zero;
            const uint4 c = in ? load_weight(wb + k) : zero;
#pragma unroll
            for (int b = 0; b < TB; ++b) {
                const uint4 v = in ? load_x(xr[b] + k) : zero;
                mma_16x8x16(acc[b], a.x, c.x, a.y, c.y, v.x, v.y);
                mma_16x8x16(acc2[b], a.z, c.z, a.w, c.w, v.z, v.w);
            }
        }
    }
#pragma unroll
    for (int b = 0; b < TB; ++b) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[b][e] += acc2[b][e];
    }
    // acc[b]: (column g, row 8b + 2t), (g, 8b + 2t + 1), (g + 8, 8b + 2t), (g + 8, 8b + 2t + 1).
    constexpr int kRows = TB * 8;
    if (warps == 1) {
#pragma unroll
        for (int b = 0; b < TB; ++b) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = g + (e >> 1) * 8, r = b * 8 + 2 * t + (e & 1);
                if (r < M && n0 + c < N) store(y + (int64_t)r * N + n0 + c, acc[b][e]);
            }
        }
        return;
    }
#pragma unroll
    for (int b = 0; b < TB; ++b) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int c = g + (e >> 1) * 8, r = b * 8 + 2 * t + (e & 1);
            partial[(warp * kTileCols + c) * kRows + r] = acc[b][e];
        }
    }
    __syncthreads();
    // Column-fastest so that a row's 16 outputs are one contiguous store.
    for (int i = threadIdx.x; i < kTileCols * kRows; i += blockDim.x) {
        const int c = i % kTileCols, r = i / kTileCols;
        if (r < M && n0 + c < N) {
            float s = 0.f;
            for (int v = 0; v < warps; ++v) s += partial[(v * kTileCols + c) * kRows + r];
            store(y + (int64_t)r * N + n0 + c, s);
        }
    }
}

}  // namespace

#define GDN_SKINNY_LINEAR(TB, U)                                                               \
    extern "C" __global__ void __launch_bounds__(kMaxWarps * 32, 1)                            \
        skinny_linear_r##TB##_u##U##_bf16(bf16* y, const bf16* x, const bf16* w, int M, int N, \
                                          int K) {                                             \
        skinny_linear<TB, U>(y, x, w, M, N, K);                                                \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(kMaxWarps * 32, 1)                            \
        skinny_linear_r##TB##_u##U##_f32(float* y, const bf16* x, const bf16* w, int M, int N, \
                                         int K) {                                              \
        skinny_linear<TB, U>(y, x, w, M, N, K);                                                \
    }

// r1: m <= 8, r2: m <= 16; U = 2, 4, 8 steps per round. The bound of one
// block of 512 threads per SM (the minimum of 1 matters: without it ptxas
// keeps registers low by issuing each load just before its mma, one round
// trip to memory per step) leaves up to 128 registers per thread.
GDN_SKINNY_LINEAR(1, 2)
GDN_SKINNY_LINEAR(1, 4)
GDN_SKINNY_LINEAR(1, 8)
GDN_SKINNY_LINEAR(2, 2)
GDN_SKINNY_LINEAR(2, 4)
