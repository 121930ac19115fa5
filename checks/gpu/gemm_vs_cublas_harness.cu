// quack-kernels 0.6.5's plain SM90 GEMM (D = x @ w^T, bf16 in and out, fp32 accumulator, no
// epilogue beyond the store; exported ahead of time in a few tile/cluster configs by
// docs/results/quack-gemm-probe-2026-12-02) against cuBLAS (cublasGemmEx, CUBLAS_COMPUTE_32F,
// bf16, CUBLAS_GEMM_DEFAULT: what crates/gdn-kernels/src/gemm.rs calls) on Qwen3.5-4B's prefill
// linear layers. x [M, K] and w [N, K] row-major (nn.Linear), d [M, N] row-major.
//
// Per (layer, M): every quack variant's output against cuBLAS's (whole tensor) and both against
// an fp32 dot product on sampled elements; then CUDA-event timings, alternating (variants,
// cuBLAS) twice. Each timed call reads the next weight of a ring of distinct weights (ring
// >= max(120 MB, 2x L2)), so the weight comes from HBM as in the runtime (one read per
// layer). One JSON line per (layer, M) on stdout. A benchmark harness, not a gate.
// Build: checks/gpu/build_gemm_harness.sh. Usage: gemm_vs_cublas_harness [M...] (default
// 512 1024 2048 4096 8192). Env: MAX_ACTIVE_CLUSTERS (unset or empty: SMs / cluster size of
// each variant), LAYERS (comma list of in_proj,qkv,out_proj,down; default all).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "quack_gemm_sm90_128x128_c2x1_pp.h"
#include "quack_gemm_sm90_128x192_c2x1_pp.h"
#include "quack_gemm_sm90_128x256_c2x1_coop.h"
#include "quack_gemm_sm90_256x128_c2x1_coop.h"

typedef __nv_bfloat16 bf16;

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

// cuBLAS loaded at run time, as the runtime does (libcublas.so.13).
typedef int (*create_fn)(void**);
typedef int (*set_stream_fn)(void*, cudaStream_t);
typedef int (*gemm_ex_fn)(void*, int, int, int, int, int, const void*, const void*, int, int, const void*,
                          int, int, const void*, void*, int, int, int, int);
constexpr int kOpN = 0, kOpT = 1, kR16BF = 14, kCompute32F = 68, kGemmDefault = -1;

__device__ __host__ inline uint32_t mix(uint32_t h) {
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    return h;
}

__global__ void fill(bf16* p, size_t n, uint32_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint32_t h = mix((uint32_t)i * 2654435761u ^ seed);
        p[i] = __float2bfloat16(((h & 0xffffff) / 16777216.f * 2.f - 1.f) * scale);
    }
}

// The fp32 reference on S sampled elements: ref[s] = sum_k x[m_s, k] * w[n_s, k] (one warp each).
__global__ void sampled_ref(float* ref, int* idx_m, int* idx_n, const bf16* x, const bf16* w, int M, int N, int K,
                            int S, uint32_t seed) {
    const int s = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (s >= S) return;
    const int m = mix(2u * s + 1u + seed) % M, n = mix(2u * s + 2u + seed * 7u) % N;
    float acc = 0.f;
    for (int k = lane; k < K; k += 32)
        acc += __bfloat162float(x[(size_t)m * K + k]) * __bfloat162float(w[(size_t)n * K + k]);
    for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) { ref[s] = acc; idx_m[s] = m; idx_n[s] = n; }
}

// stats[0] = max |a - b|, stats[1] = max |b| (float bits, non-negative: integer max is float
// max), stats[2] = number of elements whose bits differ.
__global__ void compare_full(unsigned* stats, const bf16* a, const bf16* b, size_t n) {
    float md = 0.f, mb = 0.f; unsigned nd = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float fa = __bfloat162float(a[i]), fb = __bfloat162float(b[i]);
        const float e = fabsf(fa - fb);
        md = fmaxf(md, e == e ? e : INFINITY);  // a NaN (e.g. an element never stored) counts as inf
        mb = fmaxf(mb, fabsf(fb));
        nd += __bfloat16_as_ushort(a[i]) != __bfloat16_as_ushort(b[i]);
    }
    atomicMax(&stats[0], __float_as_uint(md)); atomicMax(&stats[1], __float_as_uint(mb));
    atomicAdd(&stats[2], nd);
}

struct Variant {
    const char* name;
    int cluster_size;
    std::function<int(const bf16* x, const bf16* w, bf16* d, int M, int N, int K, int clusters, cudaStream_t)> run;
};

// One launcher per exported variant (each its own symbol prefix and module).
#define QUACK_VARIANT(P, CS)                                                                          \
    [&] {                                                                                             \
        static P##_Kernel_Module_t mod;                                                               \
        P##_Kernel_Module_Load(&mod);                                                                 \
        return Variant{#P, CS, [](const bf16* x, const bf16* w, bf16* d, int M, int N, int K,         \
                                  int clusters, cudaStream_t st) {                                    \
                           P##_Tensor_x_t tx{(void*)x, {M, K}, {K}};                                  \
                           P##_Tensor_w_t tw{(void*)w, {N, K}, {K}};                                  \
                           P##_Tensor_d_t td{(void*)d, {M, N}, {N}};                                  \
                           return (int)cute_dsl_##P##_wrapper(&mod, &tx, &tw, &td, clusters, st);     \
                       }};                                                                            \
    }()

struct Layer { const char* name; int n, k; };

__global__ void empty_kernel() {}

int main(int argc, char** argv) {
    const bool separate = getenv("SEPARATE") && atoi(getenv("SEPARATE")) != 0;
    std::vector<int> Ms = {512, 1024, 2048, 4096, 8192};
    if (argc > 1) Ms.clear();
    for (int i = 1; i < argc; ++i) Ms.push_back(std::min(8192, std::max(1, atoi(argv[i]))));
    const int Mmax = *std::max_element(Ms.begin(), Ms.end());
    std::vector<Layer> layers = {{"in_proj", 12352, 2560}, {"qkv", 10240, 2560}, {"out_proj", 2560, 4096},
                                 {"down", 2560, 9216}};
    if (const char* sel = getenv("LAYERS"); sel && *sel) {
        const std::string s = std::string(",") + sel + ",";
        layers.erase(std::remove_if(layers.begin(), layers.end(),
                                    [&](const Layer& l) { return s.find(std::string(",") + l.name + ",") == std::string::npos; }),
                     layers.end());
    }
    int ndev = 0;
    if (cudaError_t e = cudaGetDeviceCount(&ndev); e != cudaSuccess || ndev == 0) {
        fprintf(stderr, "no usable CUDA device: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "device count 0");
        return 2;
    }
    int dev = 0, sms = 0, major = 0, l2 = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    if (major != 9) { fprintf(stderr, "needs an SM90 GPU (sm_90a kernels); this one is sm_%d\n", major * 10); return 2; }
    const char* mac = getenv("MAX_ACTIVE_CLUSTERS");
    void* lib = dlopen("libcublas.so.13", RTLD_NOW);
    if (!lib) { fprintf(stderr, "libcublas.so.13: %s (set LD_LIBRARY_PATH)\n", dlerror()); return 2; }
    auto create = (create_fn)dlsym(lib, "cublasCreate_v2");
    auto set_stream = (set_stream_fn)dlsym(lib, "cublasSetStream_v2");
    auto gemm_ex = (gemm_ex_fn)dlsym(lib, "cublasGemmEx");
    if (!create || !set_stream || !gemm_ex) { fprintf(stderr, "cuBLAS symbols missing\n"); return 2; }
    void* blas; cudaStream_t st;
    CK(cudaStreamCreate(&st));
    if (create(&blas) || set_stream(blas, st)) { fprintf(stderr, "cublas init failed\n"); return 1; }

    std::vector<Variant> variants = {
        QUACK_VARIANT(quack_gemm_sm90_128x192_c2x1_pp, 2),    // quack's SM90 default
        QUACK_VARIANT(quack_gemm_sm90_128x256_c2x1_coop, 2),
        QUACK_VARIANT(quack_gemm_sm90_128x128_c2x1_pp, 2),
        QUACK_VARIANT(quack_gemm_sm90_256x128_c2x1_coop, 2),
    };
    CK(cudaGetLastError());
    auto clusters_of = [&](const Variant& v) { return mac && *mac ? atoi(mac) : sms / v.cluster_size; };

    int Kmax = 0;
    for (auto& l : layers) Kmax = std::max(Kmax, l.k);
    size_t dmax = 0;
    for (auto& l : layers) dmax = std::max(dmax, (size_t)Mmax * l.n);
    const int S = 65536;  // sampled reference elements
    bf16 *x, *d_ref, *d_q; float* ref; int *im, *in_; unsigned* stats;
    CK(cudaMalloc(&x, (size_t)Mmax * Kmax * 2));
    CK(cudaMalloc(&d_ref, dmax * 2)); CK(cudaMalloc(&d_q, dmax * 2));
    CK(cudaMalloc(&ref, S * 4)); CK(cudaMalloc(&im, S * 4)); CK(cudaMalloc(&in_, S * 4));
    CK(cudaMalloc(&stats, 3 * sizeof(unsigned)));
    fill<<<1024, 256, 0, st>>>(x, (size_t)Mmax * Kmax, 1u, 1.f);
    CK(cudaGetLastError());
    const size_t kRingBytes = std::max<size_t>(120ull << 20, 2ull * l2 + 1);
    printf("{\"gpu_sms\": %d, \"l2_bytes\": %d, \"separate\": %d, \"max_active_clusters\": %s, \"variants\": [", sms, l2, (int)separate,
           mac && *mac ? mac : "\"sms/cluster_size\"");
    for (size_t i = 0; i < variants.size(); ++i) printf("%s\"%s\"", i ? ", " : "", variants[i].name);
    printf("]}\n");
    fflush(stdout);

    for (const Layer& L : layers) {
        const int N = L.n, K = L.k;
        const size_t wbytes = (size_t)N * K * 2;
        const int ring = wbytes >= kRingBytes ? 1 : (int)((kRingBytes + wbytes - 1) / wbytes);
        std::vector<bf16*> ws(ring);
        for (int r = 0; r < ring; ++r) {
            CK(cudaMalloc(&ws[r], wbytes));
            fill<<<1024, 256, 0, st>>>(ws[r], (size_t)N * K, 2u + 977u * r, 0.05f);
        }
        CK(cudaGetLastError());
        for (int M : Ms) {
            int call = 0;
            auto cublas = [&](bf16* out, const bf16* w) {
                const float one = 1.f, zero = 0.f;
                return gemm_ex(blas, kOpT, kOpN, N, M, K, &one, w, kR16BF, K, x, kR16BF, K, &zero, out, kR16BF, N,
                               kCompute32F, kGemmDefault);
            };
            // Numerics (weight 0): sampled fp32 reference, cuBLAS, then each variant.
            sampled_ref<<<S / 8, 256, 0, st>>>(ref, im, in_, x, ws[0], M, N, K, S, 12345u);
            CK(cudaMemsetAsync(d_ref, 0xff, (size_t)M * N * 2, st));  // NaN: a skipped store shows
            if (cublas(d_ref, ws[0])) { fprintf(stderr, "cublasGemmEx failed (%s M=%d)\n", L.name, M); return 1; }
            CK(cudaStreamSynchronize(st));
            std::vector<float> h_ref(S); std::vector<int> h_m(S), h_n(S);
            CK(cudaMemcpy(h_ref.data(), ref, S * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(h_m.data(), im, S * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(h_n.data(), in_, S * 4, cudaMemcpyDeviceToHost));
            float ref_max = 0.f;
            for (float r : h_ref) ref_max = std::max(ref_max, std::fabs(r));
            auto vs_fp32 = [&](const bf16* dev_out, float* max_abs) {  // over the sampled elements
                std::vector<uint16_t> o((size_t)M * N);
                CK(cudaMemcpy(o.data(), dev_out, o.size() * 2, cudaMemcpyDeviceToHost));
                float m = 0.f;
                for (int s = 0; s < S; ++s) {
                    uint32_t u = (uint32_t)o[(size_t)h_m[s] * N + h_n[s]] << 16; float f; memcpy(&f, &u, 4);
                    const float e = std::fabs(f - h_ref[s]);
                    m = (e == e) ? std::max(m, e) : INFINITY;
                }
                *max_abs = m;
            };
            float cublas_fp32_abs; vs_fp32(d_ref, &cublas_fp32_abs);
            std::string errs;
            for (const Variant& v : variants) {
                CK(cudaMemsetAsync(d_q, 0xff, (size_t)M * N * 2, st));
                if (int rc = v.run(x, ws[0], d_q, M, N, K, clusters_of(v), st)) {
                    fprintf(stderr, "%s failed (%d) at %s M=%d\n", v.name, rc, L.name, M); return 1;
                }
                CK(cudaGetLastError());
                CK(cudaMemsetAsync(stats, 0, 3 * sizeof(unsigned), st));
                compare_full<<<1024, 256, 0, st>>>(stats, d_q, d_ref, (size_t)M * N);
                CK(cudaStreamSynchronize(st));
                unsigned h[3]; CK(cudaMemcpy(h, stats, sizeof h, cudaMemcpyDeviceToHost));
                float md, mb; memcpy(&md, &h[0], 4); memcpy(&mb, &h[1], 4);
                float q_fp32_abs; vs_fp32(d_q, &q_fp32_abs);
                char buf[512];
                snprintf(buf, sizeof buf,
                         "%s\"%s\": {\"vs_cublas_max_abs\": %.4g, \"vs_cublas_rel\": %.3g, \"vs_cublas_frac_differ\": %.4g, "
                         "\"vs_fp32_sampled_max_abs\": %.4g, \"vs_fp32_sampled_rel\": %.3g}",
                         errs.empty() ? "" : ", ", v.name, md, mb > 0 ? md / mb : NAN, (double)h[2] / ((double)M * N),
                         q_fp32_abs, ref_max > 0 ? q_fp32_abs / ref_max : NAN);
                errs += buf;
            }
            // Timing: warmup, then iters calls, each on the next weight of the ring.
            auto time_us = [&](auto&& fn) {
                cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
                for (int i = 0; i < 3; ++i) fn(ws[call++ % ring]);
                const int iters = M >= 1024 ? 20 : 100;
                CK(cudaEventRecord(a, st));
                for (int i = 0; i < iters; ++i) {
                    fn(ws[call++ % ring]);
                    // SEPARATE=1: an empty kernel between calls, so quack's programmatic
                    // dependent launch cannot overlap one GEMM's start with the previous
                    // GEMM's tail (in the runtime a GEMM follows other kernels).
                    if (separate) empty_kernel<<<1, 32, 0, st>>>();
                }
                CK(cudaEventRecord(b, st)); CK(cudaEventSynchronize(b));
                CK(cudaGetLastError());
                float ms; CK(cudaEventElapsedTime(&ms, a, b));
                CK(cudaEventDestroy(a)); CK(cudaEventDestroy(b));
                return ms * 1000.f / iters;
            };
            std::vector<float> tq[2]; float tc[2];
            for (int round = 0; round < 2; ++round) {
                for (const Variant& v : variants) {
                    const int cl = clusters_of(v);
                    tq[round].push_back(time_us([&](const bf16* w) { return v.run(x, w, d_q, M, N, K, cl, st); }));
                }
                tc[round] = time_us([&](const bf16* w) { return cublas(d_ref, w); });
            }
            const double flops = 2.0 * M * N * K;
            std::string times;
            float best = INFINITY; const char* best_name = "";
            for (size_t i = 0; i < variants.size(); ++i) {
                char buf[160];
                snprintf(buf, sizeof buf, "%s\"%s\": [%.1f, %.1f]", i ? ", " : "", variants[i].name, tq[0][i], tq[1][i]);
                times += buf;
                const float t = std::min(tq[0][i], tq[1][i]);
                if (t < best) { best = t; best_name = variants[i].name; }
            }
            const float tcb = std::min(tc[0], tc[1]);
            printf("{\"layer\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"weight_ring\": %d, \"quack_us\": {%s}, "
                   "\"cublas_us\": [%.1f, %.1f], \"best_quack\": \"%s\", \"speedup_best_quack_over_cublas\": %.3f, "
                   "\"cublas_tflops\": %.0f, \"best_quack_tflops\": %.0f, \"cublas_vs_fp32_sampled_max_abs\": %.4g, "
                   "\"cublas_vs_fp32_sampled_rel\": %.3g, \"fp32_sampled_max\": %.4g, \"errors\": {%s}}\n",
                   L.name, M, N, K, ring, times.c_str(), tc[0], tc[1], best_name, tcb / best, flops / tcb * 1e-6,
                   flops / best * 1e-6, cublas_fp32_abs, ref_max > 0 ? cublas_fp32_abs / ref_max : NAN, ref_max,
                   errs.c_str());
            fflush(stdout);
        }
        for (bf16* w : ws) CK(cudaFree(w));
    }
    return 0;
}
