// Part of model_kernels.cu (included there after model_moe.cuh, whose
// header describes the MoE layer): the tensor-core expert GEMMs for many
// rows per expert (prefill), on WMMA tiles. Kept apart from model_moe.cuh
// so the CPU emulation of the other MoE kernels (checks/moe_emulation) need
// not know WMMA.
#pragma once

namespace {

// 64 x 64 output tiles, k steps of 32, 4 warps of 32 x 32 each.
constexpr int kMoeTcRows = 64;
constexpr int kMoeTcCols = 64;
constexpr int kMoeTcK = 32;
constexpr int kMoeTcLds = kMoeTcK + 8;  // padded shared rows (bank spread)

}  // namespace

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

MOE_EXPERT_KERNEL(moe_gemm_gate_up, moe_gemm_tc_impl, true)
MOE_EXPERT_KERNEL(moe_gemm_down, moe_gemm_tc_impl, false)
#undef MOE_EXPERT_KERNEL
