// Standalone twin of crates/gdn-kernels/examples/skinny_bench.rs for a
// machine without the bundle: the skinny kernels (skinny_linear.cu compiled
// in) against cuBLAS (libcublas.so.13 opened at run time) on the
// Qwen3.5-4B shapes, plus device-to-device copy bandwidth. Same method and
// JSON lines as the Rust benchmark (CUDA graphs of back-to-back calls over
// weight copies > L2, events, median of 5).
// Build (here):  nvcc -std=c++17 -O3 -arch=sm_90a -cudart static \
//                  -o .carry/bin/skinny_harness checks/gpu/skinny_harness.cu -ldl
// Run (H200):    .carry/bin/skinny_harness
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../../crates/gdn-kernels/cuda/skinny_linear.cu"

#define CK(x)                                                                        \
    do {                                                                             \
        cudaError_t e = (x);                                                         \
        if (e != cudaSuccess) {                                                      \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

typedef int (*create_t)(void**);
typedef int (*set_stream_t)(void*, cudaStream_t);
typedef int (*gemm_ex_t)(void*, int, int, int, int, int, const void*, const void*, int, int,
                         const void*, int, int, const void*, void*, int, int, int, int);
static create_t cublas_create;
static set_stream_t cublas_set_stream;
static gemm_ex_t cublas_gemm_ex;
static void* handle;
// cublas_api.h / library_types.h values.
enum { OP_N = 0, OP_T = 1, R_16BF = 14, R_32F = 0, COMPUTE_32F = 68, GEMM_DEFAULT = -1 };

__global__ void fill(bf16* p, size_t n, unsigned seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)(i * 2654435761u) ^ (seed * 0x9e3779b9u);
        h ^= h >> 15; h *= 0x2c1b3c6du; h ^= h >> 12; h *= 0x297a2d39u; h ^= h >> 15;
        p[i] = __float2bfloat16(scale * ((h >> 8) * (2.f / 16777216.f) - 1.f));
    }
}

struct Cfg { int warps, unroll; };  // unroll 0: cuBLAS

template <typename Out>
void launch(cudaStream_t s, Cfg c, Out* y, const bf16* x, const bf16* w, int m, int n, int k) {
    if (c.unroll == 0) {
        const float alpha = 1.f, beta = 0.f;
        int r = cublas_gemm_ex(handle, OP_T, OP_N, n, m, k, &alpha, w, R_16BF, k, x, R_16BF, k,
                               &beta, y, sizeof(Out) == 4 ? R_32F : R_16BF, n, COMPUTE_32F,
                               GEMM_DEFAULT);
        if (r != 0) { fprintf(stderr, "cublasGemmEx: %d\n", r); exit(1); }
        return;
    }
    const bool r2 = m > 8;
    const int smem = c.warps == 1 ? 0 : c.warps * 16 * 8 * (r2 ? 2 : 1) * 4;
    dim3 grid((n + 15) / 16), block(c.warps * 32);
    constexpr bool f32 = sizeof(Out) == 4;
    // Explicit table (the kernel names are extern "C" per output type).
    void* f = nullptr;
    if (f32) {
        if (!r2) f = c.unroll == 2 ? (void*)skinny_linear_r1_u2_f32 : c.unroll == 4 ? (void*)skinny_linear_r1_u4_f32 : (void*)skinny_linear_r1_u8_f32;
        else f = c.unroll == 2 ? (void*)skinny_linear_r2_u2_f32 : (void*)skinny_linear_r2_u4_f32;
    } else {
        if (!r2) f = c.unroll == 2 ? (void*)skinny_linear_r1_u2_bf16 : c.unroll == 4 ? (void*)skinny_linear_r1_u4_bf16 : (void*)skinny_linear_r1_u8_bf16;
        else f = c.unroll == 2 ? (void*)skinny_linear_r2_u2_bf16 : (void*)skinny_linear_r2_u4_bf16;
    }
    void* args[] = {&y, &x, &w, &m, &n, &k};
    CK(cudaLaunchKernel(f, grid, block, args, smem, s));
}

template <typename Body>
float time_graph(cudaStream_t s, int calls, Body body) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; ++i) body(i);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    std::vector<float> t;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int r = 0; r < 5; ++r) {
        CK(cudaEventRecord(a, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms / calls);
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    std::sort(t.begin(), t.end());
    return t[2];
}

static float to_f(float v) { return v; }
static float to_f(bf16 v) { return __bfloat162float(v); }

template <typename Out>
void bench(cudaStream_t s, const char* label, std::vector<bf16*>& ws, const bf16* x, int m, int n,
           int k, double& cublas_sum, double& best_sum, int per_step) {
    Out* y;
    CK(cudaMalloc(&y, sizeof(Out) * (size_t)m * n));
    const double bytes = ((double)n * k + (double)m * k) * 2 + (double)m * n * sizeof(Out);
    int calls = std::min(256, std::max((int)ws.size(), (int)std::ceil((1 << 30) / bytes)));
    std::vector<Cfg> cfgs = {{0, 0}};
    for (int w : {1, 2, 4, 8, 16})
        for (int u : {2, 4, 8})
            if (!(m > 8 && u == 8)) cfgs.push_back({w, u});
    float cub = NAN, best = INFINITY;
    Cfg bc{0, 0};
    for (Cfg c : cfgs) {
        float ms = time_graph(s, calls, [&](int i) { launch<Out>(s, c, y, x, ws[i % ws.size()], m, n, k); });
        char name[32];
        if (c.unroll == 0) snprintf(name, sizeof name, "cublas");
        else snprintf(name, sizeof name, "skinny_w%d_u%d", c.warps, c.unroll);
        printf("{\"kind\": \"linear\", \"shape\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"out\": \"%s\", \"path\": \"%s\", \"ms\": %.5f, \"gbps\": %.1f}\n",
               label, m, n, k, sizeof(Out) == 4 ? "f32" : "bf16", name, ms, bytes / (ms * 1e-3) / 1e9);
        if (c.unroll == 0) cub = ms;
        else if (ms < best) { best = ms; bc = c; }
    }
    // Best config's output vs cuBLAS's.
    std::vector<Out> a((size_t)m * n), b((size_t)m * n);
    launch<Out>(s, Cfg{0, 0}, y, x, ws[0], m, n, k);
    CK(cudaMemcpyAsync(a.data(), y, sizeof(Out) * a.size(), cudaMemcpyDeviceToHost, s));
    launch<Out>(s, bc, y, x, ws[0], m, n, k);
    CK(cudaMemcpyAsync(b.data(), y, sizeof(Out) * b.size(), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    double scale = 0, worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        scale = std::max(scale, (double)std::fabs(to_f(a[i])));
        worst = std::max(worst, (double)std::fabs(to_f(a[i]) - to_f(b[i])));
    }
    printf("{\"kind\": \"best\", \"shape\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"cublas_ms\": %.5f, \"cublas_gbps\": %.1f, \"skinny_ms\": %.5f, \"skinny_gbps\": %.1f, \"skinny_config\": \"skinny_w%d_u%d\", \"heuristic_config\": \"none\", \"heuristic_ms\": NaN, \"speedup_vs_cublas\": %.3f, \"max_rel_diff_vs_cublas\": %.2e}\n",
           label, m, n, k, cub, bytes / (cub * 1e-3) / 1e9, best, bytes / (best * 1e-3) / 1e9,
           bc.warps, bc.unroll, cub / best, worst / std::max(scale, 1e-30));
    fflush(stdout);
    cublas_sum += cub * per_step;
    best_sum += std::min(cub, best) * per_step;
    CK(cudaFree(y));
}

int main() {
    void* lib = dlopen("libcublas.so.13", RTLD_NOW);
    if (!lib) lib = dlopen("libcublas.so", RTLD_NOW);
    if (!lib) { fprintf(stderr, "no libcublas: %s\n", dlerror()); return 1; }
    cublas_create = (create_t)dlsym(lib, "cublasCreate_v2");
    cublas_set_stream = (set_stream_t)dlsym(lib, "cublasSetStream_v2");
    cublas_gemm_ex = (gemm_ex_t)dlsym(lib, "cublasGemmEx");
    if (!cublas_create || !cublas_set_stream || !cublas_gemm_ex) { fprintf(stderr, "cublas symbols missing\n"); return 1; }
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (cublas_create(&handle) != 0 || cublas_set_stream(handle, s) != 0) { fprintf(stderr, "cublas init failed\n"); return 1; }
    {
        // As qwen35_bench and skinny_bench: 5 plain 4 GiB copies, not in a graph.
        const size_t bytes = 4ull << 30;
        void *src, *dst;
        CK(cudaMalloc(&src, bytes));
        CK(cudaMalloc(&dst, bytes));
        CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        CK(cudaEventRecord(a, s));
        for (int i = 0; i < 5; ++i) CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        ms /= 5;
        printf("{\"kind\": \"copy\", \"bytes\": %zu, \"ms\": %.4f, \"gbps_read_plus_write\": %.1f, \"gbps_read\": %.1f}\n",
               bytes, ms, 2.0 * bytes / (ms * 1e-3) / 1e9, bytes / (ms * 1e-3) / 1e9);
        CK(cudaFree(src));
        CK(cudaFree(dst));
    }
    struct Shape { const char* label; int n, k; bool f32; int per_step; };
    const Shape shapes[] = {{"deltanet_in_proj", 12352, 2560, false, 24}, {"out_proj_o_proj", 2560, 4096, false, 32},
                            {"attention_qkv", 10240, 2560, false, 8},     {"mlp_gate_up", 18432, 2560, false, 32},
                            {"mlp_down", 2560, 9216, false, 32},          {"lm_head", 248320, 2560, true, 1}};
    const int rows[] = {1, 2, 4, 8, 16};
    double cub[5] = {0}, best[5] = {0};
    for (const Shape& sh : shapes) {
        const size_t wbytes = (size_t)sh.n * sh.k * 2;
        const int copies = std::max<size_t>(1, ((512ull << 20) + wbytes - 1) / wbytes);
        std::vector<bf16*> ws(copies);
        for (int c = 0; c < copies; ++c) {
            CK(cudaMalloc(&ws[c], wbytes));
            fill<<<1024, 256, 0, s>>>(ws[c], (size_t)sh.n * sh.k, 7 + c, 0.05f);
        }
        bf16* x;
        CK(cudaMalloc(&x, (size_t)16 * sh.k * 2));
        fill<<<64, 256, 0, s>>>(x, (size_t)16 * sh.k, 3, 1.f);
        for (int i = 0; i < 5; ++i) {
            if (sh.f32) bench<float>(s, sh.label, ws, x, rows[i], sh.n, sh.k, cub[i], best[i], sh.per_step);
            else bench<bf16>(s, sh.label, ws, x, rows[i], sh.n, sh.k, cub[i], best[i], sh.per_step);
        }
        for (bf16* w : ws) CK(cudaFree(w));
        CK(cudaFree(x));
    }
    for (int i = 0; i < 5; ++i)
        printf("{\"kind\": \"step\", \"m\": %d, \"gemms\": 129, \"cublas_ms\": %.4f, \"best_of_both_ms\": %.4f}\n", rows[i], cub[i], best[i]);
    return 0;
}
