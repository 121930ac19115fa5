// quack-kernels' SM90 GEMM with a fused SwiGLU epilogue (exported ahead of
// time by docs/results/quack-probe-2026-12-01, concat layout: the weight is
// one [W_gate; W_up] tensor as in our runtime) against what the runtime does
// today: cuBLAS gate/up (bf16 out, fp32 compute) then silu_mul_bf16 from
// model_kernels.cu. Numerics against an fp32 naive GEMM with two roundings
// of the epilogue (the runtime's/PyTorch eager's: bf16 g and u, bf16 silu,
// bf16 product; and fused: one rounding of silu(g) * u), then time side by
// side with CUDA events. JSON lines on stdout. A benchmark harness, not a
// gate. Build: checks/gpu/build_swiglu_harness.sh.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../../crates/gdn-kernels/cuda/model_kernels.cu"
#include "quack_swiglu_sm90_concatB.h"

#define CK(x)                                                                         \
    do {                                                                              \
        cudaError_t e_ = (x);                                                         \
        if (e_ != cudaSuccess) {                                                      \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

// cuBLAS loaded at run time, as the runtime does (libcublas.so.13).
typedef int (*create_fn)(void**);
typedef int (*set_stream_fn)(void*, cudaStream_t);
typedef int (*gemm_ex_fn)(void*, int, int, int, int, int, const void*, const void*, int, int, const void*,
                          int, int, const void*, void*, int, int, int, int);
constexpr int kOpN = 0, kOpT = 1, kR16BF = 14, kCompute32F = 68, kGemmDefault = -1;

// preact[m, n] = sum_k x[m, k] * w[n, k] in fp32, 16x16 tiles.
__global__ void naive_gemm(float* out, const bf16* x, const bf16* w, int M, int N, int K) {
    __shared__ float xs[16][17], ws[16][17];
    const int m = blockIdx.y * 16 + threadIdx.y, n = blockIdx.x * 16 + threadIdx.x;
    float acc = 0.f;
    for (int k0 = 0; k0 < K; k0 += 16) {
        const int nw = blockIdx.x * 16 + threadIdx.y;  // the w row this thread stages
        xs[threadIdx.y][threadIdx.x] = m < M ? __bfloat162float(x[(size_t)m * K + k0 + threadIdx.x]) : 0.f;
        ws[threadIdx.y][threadIdx.x] = nw < N ? __bfloat162float(w[(size_t)nw * K + k0 + threadIdx.x]) : 0.f;
        __syncthreads();
        for (int k = 0; k < 16; ++k) acc += xs[threadIdx.y][k] * ws[threadIdx.x][k];
        __syncthreads();
    }
    if (m < M && n < N) out[(size_t)m * N + n] = acc;
}

__global__ void fill(bf16* p, size_t n, uint32_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
        p[i] = __float2bfloat16(((h & 0xffffff) / 16777216.f * 2.f - 1.f) * scale);
    }
}

static float b2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t f2b(float f) { __nv_bfloat16 b = __float2bfloat16(f); uint16_t u; memcpy(&u, &b, 2); return u; }
static float rb(float f) { return b2f(f2b(f)); }
static int ulps(uint16_t a, uint16_t b) {  // distance in bf16 steps, across zero too
    auto key = [](uint16_t v) { return (v & 0x8000) ? -(int)(v & 0x7fff) : (int)v; };
    return std::abs(key(a) - key(b));
}

struct Cmp { int max_ulp = 0; size_t over1 = 0, n = 0; };
static void cmp(Cmp& c, uint16_t got, uint16_t want) {
    const int u = ulps(got, want);
    c.max_ulp = u > c.max_ulp ? u : c.max_ulp; c.over1 += u > 1; ++c.n;
}

int main(int argc, char** argv) {
    const int K = 2560, I = 9216, N = 2 * I;
    // Row counts from the command line (default 1 17 1024 8192), at most 8192.
    std::vector<int> Ms = {1, 17, 1024, 8192};
    if (argc > 1) Ms.clear();
    for (int i = 1; i < argc; ++i) Ms.push_back(std::min(8192, std::max(1, atoi(argv[i]))));
    int dev = 0, sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const char* mac = getenv("MAX_ACTIVE_CLUSTERS");  // unset or empty: half the SMs
    const int clusters = mac && *mac ? atoi(mac) : sms / 2;
    void* lib = dlopen("libcublas.so.13", RTLD_NOW);
    if (!lib) { fprintf(stderr, "libcublas.so.13: %s\n", dlerror()); return 1; }
    auto create = (create_fn)dlsym(lib, "cublasCreate_v2");
    auto set_stream = (set_stream_fn)dlsym(lib, "cublasSetStream_v2");
    auto gemm_ex = (gemm_ex_fn)dlsym(lib, "cublasGemmEx");
    void* blas; cudaStream_t st;
    CK(cudaStreamCreate(&st));
    if (create(&blas) || set_stream(blas, st)) { fprintf(stderr, "cublas init failed\n"); return 1; }
    quack_swiglu_sm90_Kernel_Module_t mod;
    quack_swiglu_sm90_Kernel_Module_Load(&mod);
    const int Mmax = 8192;
    bf16 *x, *w, *gu, *ref_out, *q_out; float* pre;
    CK(cudaMalloc(&x, (size_t)Mmax * K * 2)); CK(cudaMalloc(&w, (size_t)N * K * 2));
    CK(cudaMalloc(&gu, (size_t)Mmax * N * 2)); CK(cudaMalloc(&ref_out, (size_t)Mmax * I * 2));
    CK(cudaMalloc(&q_out, (size_t)Mmax * I * 2)); CK(cudaMalloc(&pre, (size_t)Mmax * N * 4));
    fill<<<1024, 256, 0, st>>>(x, (size_t)Mmax * K, 1u, 1.f);
    fill<<<1024, 256, 0, st>>>(w, (size_t)N * K, 2u, 0.05f);
    printf("{\"gpu_sms\": %d, \"max_active_clusters\": %d}\n", sms, clusters);
    for (int M : Ms) {
        auto quack = [&] {
            quack_swiglu_sm90_Tensor_x_t tx{x, {M, K}, {K}};
            quack_swiglu_sm90_Tensor_w_t tw{w, {N, K}, {K}};
            quack_swiglu_sm90_Tensor_out_t to{q_out, {M, I}, {I}};
            return cute_dsl_quack_swiglu_sm90_wrapper(&mod, &tx, &tw, &to, clusters, st);
        };
        auto runtime = [&] {
            const float one = 1.f, zero = 0.f;
            int rc = gemm_ex(blas, kOpT, kOpN, N, M, K, &one, w, kR16BF, K, x, kR16BF, K, &zero, gu, kR16BF, N,
                             kCompute32F, kGemmDefault);
            silu_mul_bf16<<<M * ((I + 2047) / 2048), 256, 0, st>>>(ref_out, gu, M, I);
            return rc;
        };
        if (quack() || runtime()) { fprintf(stderr, "launch failed at M=%d\n", M); return 1; }
        naive_gemm<<<dim3(N / 16, (M + 15) / 16), dim3(16, 16), 0, st>>>(pre, x, w, M, N, K);
        CK(cudaStreamSynchronize(st));
        std::vector<float> p((size_t)M * N);
        std::vector<uint16_t> q((size_t)M * I), r((size_t)M * I);
        CK(cudaMemcpy(p.data(), pre, p.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(q.data(), q_out, q.size() * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(r.data(), ref_out, r.size() * 2, cudaMemcpyDeviceToHost));
        Cmp q_eager, q_fused, r_eager, r_fused;
        for (int m = 0; m < M; ++m)
            for (int j = 0; j < I; ++j) {
                const float g = p[(size_t)m * N + j], u = p[(size_t)m * N + I + j];
                const float gb = rb(g), ub = rb(u);
                const uint16_t eager = f2b(rb(gb / (1.f + std::exp(-gb))) * ub);
                const uint16_t fused = f2b(g / (1.f + std::exp(-g)) * u);
                cmp(q_eager, q[(size_t)m * I + j], eager); cmp(q_fused, q[(size_t)m * I + j], fused);
                cmp(r_eager, r[(size_t)m * I + j], eager); cmp(r_fused, r[(size_t)m * I + j], fused);
            }
        auto time_us = [&](auto&& fn) {
            cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
            for (int i = 0; i < 3; ++i) fn();
            const int iters = M >= 1024 ? 20 : 200;
            CK(cudaEventRecord(a, st));
            for (int i = 0; i < iters; ++i) fn();
            CK(cudaEventRecord(b, st)); CK(cudaEventSynchronize(b));
            float ms; CK(cudaEventElapsedTime(&ms, a, b));
            return ms * 1000.f / iters;
        };
        // Alternate twice, side by side.
        float tq[2], tr[2];
        for (int round = 0; round < 2; ++round) { tq[round] = time_us(quack); tr[round] = time_us(runtime); }
        printf("{\"m\": %d, \"n\": %d, \"k\": %d, \"quack_us\": [%.1f, %.1f], \"cublas_plus_silu_mul_us\": [%.1f, %.1f], "
               "\"quack_vs_eager\": {\"max_ulp\": %d, \"over_1_ulp\": %zu, \"n\": %zu}, "
               "\"quack_vs_fused\": {\"max_ulp\": %d, \"over_1_ulp\": %zu}, "
               "\"runtime_vs_eager\": {\"max_ulp\": %d, \"over_1_ulp\": %zu}, "
               "\"runtime_vs_fused\": {\"max_ulp\": %d, \"over_1_ulp\": %zu}}\n",
               M, N, K, tq[0], tq[1], tr[0], tr[1], q_eager.max_ulp, q_eager.over1, q_eager.n, q_fused.max_ulp,
               q_fused.over1, r_eager.max_ulp, r_eager.over1, r_fused.max_ulp, r_fused.over1);
        fflush(stdout);
    }
    return 0;
}
