// Part of model_kernels.cu (included there after model_attention.cuh, whose
// attention_combine merges this kernel's splits): decode attention on tensor
// cores for head dim 256 and GQA groups up to 8 (Qwen3.5's 4B, 27B and
// 35B-A3B shapes), over the bf16 paged KV cache. sm_80 and later (mma.sync
// bf16, ldmatrix, cp.async); other head dims keep attention_d*.
//
// Why: a decode step deep into long contexts is a stream over the KV cache,
// and the CUDA-core kernel (attention_d8) spends its time in the per-key
// warp reductions rather than in the loads (docs/performance.md, decode
// attention against its KV-read floor). Here the dot products and the
// weighted sum are tensor-core MMAs and the loads are asynchronous, so a
// warp keeps a tile of keys in flight while it computes on the previous one.
//
// Work split (graph-safe, planned on the device): grid (T, Hkv, splits);
// block (t, kh, z) takes keys [z * share, min((z + 1) * share, pos + 1)) of
// its sequence, `share` = max(ceil((pos + 1) / splits), min_share) rounded
// up to a whole tile, computed here from positions[t]: a captured graph's
// split count is sized for its tier's longest context, and a row shorter
// than that leaves its last blocks empty instead of cutting its keys into
// shares too small to stream (the blocks past the row's keys write an
// empty partial, weight 0 in attention_combine). Its kTcWarps warps take
// the range's 8-key tiles round-robin, each with its own STAGES-deep
// cp.async ring in shared memory (no block barrier in the main loop); the
// warps' softmax states merge at the end. splits == 1 writes the gated
// output; splits > 1 writes (m, l) and the unnormalised accumulator to the
// workspace in attention_combine's layout (ws_ml [T, Hq, splits, 2],
// ws_acc [T, Hq, splits, 256]).
//
// Per 8-key tile, per warp (m16n8k16 / m16n8k8, bf16 in, fp32 accumulate):
//   S[16 x 8]  = Q[16 heads (G used) x 256] . K^T  (16 MMAs; Q's A fragments
//                stay in registers; K^T's B fragments by ldmatrix)
//   online softmax per head row (exp2 domain), P rounded to bf16
//   O^T[256 x 8] += V^T[256 x 8 keys] . P^T[8 keys x 8 heads]  (16 MMAs;
//                V^T's A fragments by ldmatrix.trans; P^T's B fragment is
//                S's accumulator layout as is)
// A thread holds O^T for heads 2c, 2c+1 (c = lane % 4) at dims 16i + r and
// 16i + r + 8 (r = lane / 4). Shared-memory rows are 512 bytes (one key's
// head), so the 16-byte chunks are XOR-swizzled by the key's row (chunk ^
// row) to keep ldmatrix's eight rows on distinct banks.

namespace {

constexpr int kTcDim = 256;
constexpr int kTcKeys = 8;                       // keys per warp tile
constexpr int kTcWarps = 4;                      // warps per block
constexpr int kTcChunks = kTcDim / 8;            // 16-byte chunks per key row
constexpr int kTcTileBytes = kTcKeys * kTcDim * 2;  // K or V of one tile

__device__ __forceinline__ uint32_t tc_smem(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void tc_cp_async16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void tc_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void tc_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void tc_ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void tc_ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// d += A[16 x 16] B[16 x 8]; A rows r + 8 (a1, a3) are zero here (G <= 8).
__device__ __forceinline__ void tc_mma_16816(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0,
                                             uint32_t b1) {
    const uint32_t zero = 0;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(zero), "r"(a2), "r"(zero), "r"(b0), "r"(b1));
}
// d += A[16 x 8] B[8 x 8].
__device__ __forceinline__ void tc_mma_1688(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}
__device__ __forceinline__ uint32_t tc_pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t bits;
    copy_bits(&bits, &v, sizeof bits);
    return bits;
}

// Byte offset of logical 16-byte chunk `ch` of key row `row` in a tile.
__device__ __forceinline__ uint32_t tc_swizzle(int row, int ch) {
    return row * (kTcDim * 2) + ((ch ^ (row & 7)) << 4);
}

template <int STAGES>
__device__ void attention_decode_tc_impl(
    bf16* __restrict__ out, const bf16* __restrict__ q, const bf16* __restrict__ k_cache,
    const bf16* __restrict__ v_cache, const bf16* __restrict__ proj, int ld,
    const int32_t* __restrict__ positions, const int32_t* __restrict__ tok_seq,
    const int32_t* __restrict__ block_table, int max_blocks, int page, int hq, int hkv,
    float scale, float* __restrict__ ws_ml, float* __restrict__ ws_acc, int min_share) {
    constexpr float kLog2e = 1.4426950408889634f;
    constexpr float kLn2 = 0.6931471805599453f;
    extern __shared__ __align__(128) unsigned char tc_smem_raw[];
    const int64_t t = blockIdx.x;
    const int kh = blockIdx.y;
    const int G = hq / hkv;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r = lane >> 2, c = lane & 3;

    const int pos = positions[t];
    const int32_t* pages = block_table + (int64_t)tok_seq[t] * max_blocks;
    const int splits = gridDim.z, z = blockIdx.z;
    const int share =
        (max((pos + splits) / splits, min_share) + kTcKeys - 1) / kTcKeys * kTcKeys;
    const int j_begin = min(pos + 1, z * share);
    const int j_end = min(pos + 1, j_begin + share);
    const int tiles = (j_end - j_begin + kTcKeys - 1) / kTcKeys;

    // Q's A fragments, the bf16 values as stored (rows r >= G are zero);
    // the softmax scale (into the exp2 domain) applies to S in fp32.
    const float qscale = scale * kLog2e;
    uint32_t qa0[kTcDim / 16], qa2[kTcDim / 16];
    {
        const bf16* qrow = q + (t * hq + kh * G + min(r, G - 1)) * kTcDim;
#pragma unroll
        for (int s = 0; s < kTcDim / 16; ++s) {
            const int e = 16 * s + 2 * c;
            qa0[s] = r < G ? *reinterpret_cast<const uint32_t*>(qrow + e) : 0u;
            qa2[s] = r < G ? *reinterpret_cast<const uint32_t*>(qrow + e + 8) : 0u;
        }
    }

    unsigned char* ring = tc_smem_raw + (size_t)warp * STAGES * 2 * kTcTileBytes;
    // This lane's part of a tile load: key row kk, chunks c4 + 4i.
    const int kk = lane >> 2, c4 = lane & 3;
    auto load_tile = [&](int tile, int stage) {
        const int j = min(j_begin + tile * kTcKeys + kk, j_end - 1);  // past the end: weight 0
        const int64_t at = (((int64_t)pages[j / page] * page + j % page) * hkv + kh) * kTcDim;
        unsigned char* kdst = ring + stage * 2 * kTcTileBytes;
        unsigned char* vdst = kdst + kTcTileBytes;
#pragma unroll
        for (int i = 0; i < kTcChunks / 4; ++i) {
            const int ch = c4 + 4 * i;
            tc_cp_async16(tc_smem(kdst + tc_swizzle(kk, ch)), k_cache + at + ch * 8);
            tc_cp_async16(tc_smem(vdst + tc_swizzle(kk, ch)), v_cache + at + ch * 8);
        }
    };

    float o[kTcDim / 16][4];
#pragma unroll
    for (int i = 0; i < kTcDim / 16; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m = -INFINITY, l = 0.f;  // head r's running max (exp2 domain) and this lane's sum

    // This warp's tiles: warp, warp + kTcWarps, ...
    const int mine = tiles > warp ? (tiles - warp + kTcWarps - 1) / kTcWarps : 0;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < mine) load_tile(warp + s * kTcWarps, s);
        tc_cp_async_commit();
    }
    for (int i = 0; i < mine; ++i) {
        tc_cp_async_wait<STAGES - 2>();
        __syncwarp();
        {
            const int next = i + STAGES - 1;
            if (next < mine) load_tile(warp + next * kTcWarps, next % STAGES);
            tc_cp_async_commit();
        }
        const unsigned char* kt = ring + (i % STAGES) * 2 * kTcTileBytes;
        const unsigned char* vt = kt + kTcTileBytes;
        // S = Q K^T: two interleaved accumulators for independent MMA chains.
        float sa[4] = {0.f, 0.f, 0.f, 0.f}, sb[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int s = 0; s < kTcDim / 16; s += 2) {
            // Matrices: chunks 2s, 2s+1, 2s+2, 2s+3 of keys 0..7.
            uint32_t kb[4];
            tc_ldmatrix_x4(kb, tc_smem(kt + tc_swizzle(lane & 7, 2 * s + (lane >> 3))));
            tc_mma_16816(sa, qa0[s], qa2[s], kb[0], kb[1]);
            tc_mma_16816(sb, qa0[s + 1], qa2[s + 1], kb[2], kb[3]);
        }
        const int key0 = j_begin + (warp + i * kTcWarps) * kTcKeys + 2 * c;
        float s0 = key0 < j_end ? (sa[0] + sb[0]) * qscale : -INFINITY;
        float s1 = key0 + 1 < j_end ? (sa[1] + sb[1]) * qscale : -INFINITY;
        float mx = fmaxf(s0, s1);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m, mx);  // finite: every tile has a key
        const float corr = exp2f(m - m_new);  // 0 on the first tile (m = -inf)
        const float p0 = exp2f(s0 - m_new), p1 = exp2f(s1 - m_new);
        l = l * corr + p0 + p1;
        m = m_new;
        // O^T rows belong to heads 2c and 2c + 1: their lanes' factors.
        const float corr_lo = __shfl_sync(0xffffffffu, corr, 8 * c);
        const float corr_hi = __shfl_sync(0xffffffffu, corr, 8 * c + 4);
        const uint32_t pb = tc_pack_bf16(p0, p1);
#pragma unroll
        for (int dt = 0; dt < kTcDim / 16; dt += 2) {
            // Matrices: chunks 2dt .. 2dt+3 of keys 0..7, transposed.
            uint32_t va[4];
            tc_ldmatrix_x4_trans(va, tc_smem(vt + tc_swizzle(lane & 7, 2 * dt + (lane >> 3))));
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                float(&acc)[4] = o[dt + u];
                acc[0] *= corr_lo;
                acc[1] *= corr_hi;
                acc[2] *= corr_lo;
                acc[3] *= corr_hi;
                tc_mma_1688(acc, va[2 * u], va[2 * u + 1], pb);
            }
        }
    }
    tc_cp_async_wait<0>();
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);

    // Merge the warps: (m, l) per head and O^T per warp through shared
    // memory (the rings are done).
    __syncthreads();
    float* sh_o = reinterpret_cast<float*>(tc_smem_raw);  // [warps][8 heads][256]
    float* sh_m = sh_o + kTcWarps * 8 * kTcDim;             // [warps][8]
    float* sh_l = sh_m + kTcWarps * 8;
    if (c == 0) {
        sh_m[warp * 8 + r] = m;
        sh_l[warp * 8 + r] = l;
    }
#pragma unroll
    for (int dt = 0; dt < kTcDim / 16; ++dt) {
        float* base = sh_o + warp * 8 * kTcDim;
        base[(2 * c) * kTcDim + 16 * dt + r] = o[dt][0];
        base[(2 * c + 1) * kTcDim + 16 * dt + r] = o[dt][1];
        base[(2 * c) * kTcDim + 16 * dt + r + 8] = o[dt][2];
        base[(2 * c + 1) * kTcDim + 16 * dt + r + 8] = o[dt][3];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * kTcDim; idx += blockDim.x) {
        const int g = idx / kTcDim, d = idx % kTcDim;
        float mx = -INFINITY;
        for (int w = 0; w < kTcWarps; ++w) mx = fmaxf(mx, sh_m[w * 8 + g]);
        float num = 0.f, den = 0.f;
        for (int w = 0; w < kTcWarps; ++w) {
            const float wm = sh_m[w * 8 + g];
            const float cw = wm == -INFINITY ? 0.f : exp2f(wm - mx);
            num += cw * sh_o[(w * 8 + g) * kTcDim + d];
            den += cw * sh_l[w * 8 + g];
        }
        const int h = kh * G + g;
        if (splits > 1) {
            const int64_t part = (t * hq + h) * splits + z;
            ws_acc[part * kTcDim + d] = num;
            if (d == 0) {
                ws_ml[part * 2] = mx == -INFINITY ? -INFINITY : mx * kLn2;
                ws_ml[part * 2 + 1] = den;
            }
            continue;
        }
        const float gate = f(proj[t * ld + h * 2 * kTcDim + kTcDim + d]);
        out[(t * hq + h) * kTcDim + d] = bf(rbf(num / den) * sigmoid(gate));
    }
}

}  // namespace

#define GDN_ATTENTION_DECODE_TC(NAME, STAGES, MIN_BLOCKS)                                    \
    extern "C" __global__ void __launch_bounds__(kTcWarps * 32, MIN_BLOCKS) NAME(            \
        bf16* out, const bf16* q, const bf16* k_cache, const bf16* v_cache, const bf16* proj, \
        int ld, const int32_t* positions, const int32_t* tok_seq, const int32_t* block_table, \
        int max_blocks, int page, int hq, int hkv, float scale, float* ws_ml,                \
        float* ws_acc, int min_share) {                                                      \
        attention_decode_tc_impl<STAGES>(out, q, k_cache, v_cache, proj, ld, positions,       \
                                         tok_seq, block_table, max_blocks, page, hq, hkv,     \
                                         scale, ws_ml, ws_acc, min_share);                    \
    }
// Two and three tiles in flight per warp: 64 KB of shared memory a block
// (three blocks an SM, registers capped to fit) and 96 KB (two);
// model_ops/attention.rs picks by measurement.
GDN_ATTENTION_DECODE_TC(attention_decode_tc_s2, 2, 3)
GDN_ATTENTION_DECODE_TC(attention_decode_tc_s3, 3, 2)
