// Portable Gated DeltaNet (GDN) prefill kernel: the fallback for GPUs where
// FlashInfer's SM90 kernel is not available. Compiled ahead of time into plain
// cubins (sm_80 .. sm_120), loaded with cuModuleLoadData and launched by name
// through the driver API; there is no host code in this file.
//
// Math (same as the CPU oracle, crates/gdn-kernels/src/oracle.rs): for each
// sequence n and value head h (q/k head h / (Hv / Hqk)), the state S[v][k]
// starts at state_in (or zero) and each token t does
//     S        = alpha[t, h] * S
//     pred[v]  = sum_k S[v][k] * k_t[k]
//     d[v]     = beta[t, h] * (v_t[v] - pred[v])
//     S[v][k] += d[v] * k_t[k]
//     out[t, h, v] = scale * sum_k S[v][k] * q_t[k]
// q and k are used as given (already L2-normalised by the caller). Head dim is
// fixed at 128; the state is kept in fp32 registers, accumulation is fp32.
//
// Work split: one block per (value head, sequence). Each of the 128 value rows
// of S is owned by a group of 4 consecutive lanes; lane `sub` of the group owns
// the 32 k columns {16*j + 4*sub + e : j in 0..8, e in 0..4}, held as 8 float4
// registers. Row reductions use two __shfl_xor_sync steps inside the group.
// q_t and k_t are staged in shared memory as fp32 (double-buffered, one
// __syncthreads per token); the next token's q/k/v/alpha/beta are prefetched
// into registers while the current token is computed.
//
// Aliasing: every state element is read and written by the same thread, and
// read (at the start) before it is written (at the end), so state_in may alias
// state_out. Pointers are assumed to be at least 16-byte aligned (cuMemAlloc
// gives 256), as are q/k rows (128 bf16 = 256 bytes each).

#include <cuda_bf16.h>
#include <cstdint>

// Threads per block: 128 value rows x 4 threads per row. The Rust launcher
// uses the same number (block = (512, 1, 1), grid = (Hv, N, 1), no dynamic
// shared memory). Needs <= 128 registers per thread; __launch_bounds__ below
// enforces it.
#define GDN_PORTABLE_BLOCK_THREADS 512

namespace {

constexpr int kHeadDim = 128;
constexpr int kThreadsPerRow = 4;
// float4 chunks of one row owned by one thread: 128 / (4 lanes * 4 floats).
constexpr int kChunks = kHeadDim / (kThreadsPerRow * 4);
// Threads that stage q/k into shared memory: 64 for q, 64 for k (bf16 pairs).
constexpr int kStagers = kHeadDim;

static_assert(GDN_PORTABLE_BLOCK_THREADS == kHeadDim * kThreadsPerRow,
              "block = one group of kThreadsPerRow threads per value row");
static_assert(kChunks == 8, "unexpected chunking");

__device__ __forceinline__ float group_sum(float x) {
    // Lanes 4g..4g+3 form a group; xor 1 and 2 stay inside it. Float addition
    // is commutative, so all four lanes end with bitwise-identical sums.
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(GDN_PORTABLE_BLOCK_THREADS, 1)
gdn_portable_prefill_bf16(
    __nv_bfloat16* __restrict__ out,          // [T, Hv, 128]
    float* state_out,                          // [N, Hv, 128(v), 128(k)], k contiguous
    const __nv_bfloat16* __restrict__ q,      // [T, Hqk, 128]
    const __nv_bfloat16* __restrict__ k,      // [T, Hqk, 128]
    const __nv_bfloat16* __restrict__ v,      // [T, Hv, 128]
    const float* state_in,                     // [N, Hv, 128, 128] or nullptr (zero initial state); may alias state_out
    const float* __restrict__ alpha,          // [T, Hv]
    const float* __restrict__ beta,           // [T, Hv]
    const int64_t* __restrict__ cu_seqlens,   // [N+1]
    int32_t num_qk_heads, int32_t num_v_heads, float scale) {
    __shared__ __align__(16) float sh_q[2][kHeadDim];
    __shared__ __align__(16) float sh_k[2][kHeadDim];

    const int h = static_cast<int>(blockIdx.x);
    const int n = static_cast<int>(blockIdx.y);
    // Uniform per block, so returning before any barrier is safe.
    if (h >= num_v_heads || num_qk_heads <= 0 || num_v_heads < num_qk_heads ||
        num_v_heads % num_qk_heads != 0) {
        return;
    }
    const int qk_head = h / (num_v_heads / num_qk_heads);

    const int tid = static_cast<int>(threadIdx.x);
    const int row = tid / kThreadsPerRow;  // value index v
    const int sub = tid % kThreadsPerRow;  // which k columns

    const int64_t seq_start = cu_seqlens[n];
    const int64_t seq_end = cu_seqlens[n + 1];

    // ---- initial state: s[j] = S[row][16j + 4sub .. 16j + 4sub + 3] ----
    const int64_t state_row =
        ((static_cast<int64_t>(n) * num_v_heads + h) * kHeadDim + row) * kHeadDim;
    float4 s[kChunks];
    if (state_in != nullptr) {
        const float4* src = reinterpret_cast<const float4*>(state_in + state_row);
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
            s[j] = src[j * kThreadsPerRow + sub];
        }
    } else {
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
            s[j] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }

    // ---- staging roles: threads [0, 64) load q pairs, [64, 128) k pairs ----
    const bool stager = tid < kStagers;
    const bool stage_k = tid >= kStagers / 2;
    const int pair = tid % (kStagers / 2);
    const __nv_bfloat16* qk_src = stage_k ? k : q;
    float* sh_dst0 = stage_k ? sh_k[0] : sh_q[0];
    float* sh_dst1 = stage_k ? sh_k[1] : sh_q[1];

    const int64_t qk_stride = static_cast<int64_t>(num_qk_heads) * kHeadDim;
    const int64_t v_stride = static_cast<int64_t>(num_v_heads) * kHeadDim;

    // Prefetched values of the next token.
    __nv_bfloat162 next_qk = __float2bfloat162_rn(0.f);
    float next_v = 0.f, next_a = 0.f, next_b = 0.f;

    auto prefetch = [&](int64_t t) {
        if (stager) {
            next_qk = reinterpret_cast<const __nv_bfloat162*>(
                qk_src + t * qk_stride + static_cast<int64_t>(qk_head) * kHeadDim)[pair];
        }
        next_v = __bfloat162float(v[t * v_stride + static_cast<int64_t>(h) * kHeadDim + row]);
        const int64_t ab = t * num_v_heads + h;
        next_a = alpha[ab];
        next_b = beta[ab];
    };
    auto stage = [&](float* dst) {
        if (stager) {
            const float2 f = __bfloat1622float2(next_qk);
            reinterpret_cast<float2*>(dst)[pair] = f;
        }
    };

    if (seq_start < seq_end) {
        prefetch(seq_start);
        stage(sh_dst0);
        __syncthreads();

        for (int64_t t = seq_start; t < seq_end; ++t) {
            const int buf = static_cast<int>((t - seq_start) & 1);
            const float a = next_a;
            const float b = next_b;
            const float v_val = next_v;
            const bool has_next = t + 1 < seq_end;
            if (has_next) {
                prefetch(t + 1);
            }

            const float4* k4 = reinterpret_cast<const float4*>(sh_k[buf]);
            const float4* q4 = reinterpret_cast<const float4*>(sh_q[buf]);

            // Decay, then pred = S k (4 partial sums for ILP).
            float4 kr[kChunks];
            float p0 = 0.f, p1 = 0.f, p2 = 0.f, p3 = 0.f;
#pragma unroll
            for (int j = 0; j < kChunks; ++j) {
                kr[j] = k4[j * kThreadsPerRow + sub];
                s[j].x *= a;
                s[j].y *= a;
                s[j].z *= a;
                s[j].w *= a;
                p0 = fmaf(s[j].x, kr[j].x, p0);
                p1 = fmaf(s[j].y, kr[j].y, p1);
                p2 = fmaf(s[j].z, kr[j].z, p2);
                p3 = fmaf(s[j].w, kr[j].w, p3);
            }
            const float pred = group_sum((p0 + p1) + (p2 + p3));
            const float delta = b * (v_val - pred);

            // Rank-1 update, then o = S q.
            float o0 = 0.f, o1 = 0.f, o2 = 0.f, o3 = 0.f;
#pragma unroll
            for (int j = 0; j < kChunks; ++j) {
                const float4 qr = q4[j * kThreadsPerRow + sub];
                s[j].x = fmaf(delta, kr[j].x, s[j].x);
                s[j].y = fmaf(delta, kr[j].y, s[j].y);
                s[j].z = fmaf(delta, kr[j].z, s[j].z);
                s[j].w = fmaf(delta, kr[j].w, s[j].w);
                o0 = fmaf(s[j].x, qr.x, o0);
                o1 = fmaf(s[j].y, qr.y, o1);
                o2 = fmaf(s[j].z, qr.z, o2);
                o3 = fmaf(s[j].w, qr.w, o3);
            }
            const float o = group_sum((o0 + o1) + (o2 + o3));
            if (sub == 0) {
                out[t * v_stride + static_cast<int64_t>(h) * kHeadDim + row] =
                    __float2bfloat16_rn(scale * o);
            }

            // Stage the next token into the other buffer. Its last readers
            // (token t-1) finished before the barrier ending iteration t-1.
            if (has_next) {
                stage(buf ? sh_dst0 : sh_dst1);
            }
            __syncthreads();
        }
    }

    // ---- final state (fp32), same elements this thread read ----
    float4* dst = reinterpret_cast<float4*>(state_out + state_row);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
        dst[j * kThreadsPerRow + sub] = s[j];
    }
}
