// The sampling kernel's source compiled by nvcc here (not the bundle's
// cubin) and run on the device over a case file, so that build variants
// (optimisation level, -G, -fmad) can be compared against the CPU sampler's
// answers on the same rows: a difference that goes away at -O0 or -G points
// at the compiler or at undefined behaviour in the source, one that stays
// at the arithmetic or at a race (run under compute-sanitizer racecheck).
// Usage: device_main <cases file> [verbose [first [count]]]: rows
// first..first+count only (for compute-sanitizer); exits 1 on a difference.
#include "../../crates/gdn-kernels/cuda/sampling.cu"
#include "cases.h"
#include <cuda_runtime.h>

#define CHECK(x)                                                                     \
    do {                                                                             \
        cudaError_t err_ = (x);                                                         \
        if (err_ != cudaSuccess) {                                                      \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); \
            exit(2);                                                                 \
        }                                                                            \
    } while (0)

template <class T> T* upload(const std::vector<T>& v) {
    T* d;
    CHECK(cudaMalloc(&d, v.size() * sizeof(T)));
    CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

// Every case alone (one block), then all cases of one vocabulary together in one launch.
int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s <cases file> [verbose]\n", argv[0]);
        return 2;
    }
    const bool verbose = argc > 2 && atoi(argv[2]) != 0;
    const uint32_t first = argc > 3 ? (uint32_t)atoi(argv[3]) : 0;
    const uint32_t count = argc > 4 ? (uint32_t)atoi(argv[4]) : ~0u;
    cases::Reader r{fopen(argv[1], "rb")};
    if (!r.f) {
        perror(argv[1]);
        return 2;
    }
    const uint32_t n = r.get<uint32_t>();
    std::vector<cases::Case> all;
    for (uint32_t i = 0; i < n; ++i) {
        cases::Case c = cases::read(r);
        if (i >= first && i - first < count) all.push_back(std::move(c));
    }
    const uint32_t kept = (uint32_t)all.size();
    int bad_alone = 0, bad_together = 0;
    for (uint32_t i = 0; i < kept; ++i) {
        const cases::Case& c = all[i];
        float* x = upload(c.x);
        RowParams* p = upload(std::vector<RowParams>{c.p});
        Adjustment* adj = upload(c.adj);
        uint32_t* out;
        CHECK(cudaMalloc(&out, kOutWords * 4));
        uint32_t* mask = nullptr;
        if (c.mask.empty()) {
            sample_rows<<<1, kThreads>>>(x, c.vocab, p, adj, out);
        } else {
            mask = upload(c.mask);
            sample_rows_masked<<<1, kThreads>>>(x, c.vocab, p, adj, mask, (int64_t)c.mask.size(), out);
        }
        CHECK(cudaGetLastError());
        std::vector<uint32_t> host(kOutWords);
        CHECK(cudaMemcpy(host.data(), out, kOutWords * 4, cudaMemcpyDeviceToHost));
        bad_alone += !cases::check(first + i, c, host.data(), verbose);
        cudaFree(x), cudaFree(p), cudaFree(adj), cudaFree(out), cudaFree(mask);
    }
    printf("alone: %u rows, %d differ from the CPU sampler\n", kept, bad_alone);
    // Together: runs of equal vocabulary in one launch, rows in file order.
    for (uint32_t b = 0; b < kept;) {
        uint32_t e = b;
        while (e < kept && all[e].vocab == all[b].vocab) ++e;
        const uint32_t vocab = all[b].vocab;
        std::vector<float> xs;
        std::vector<RowParams> ps;
        std::vector<Adjustment> adjs;
        std::vector<uint32_t> masks;  // the masked rows' words, in row order
        const size_t mask_words = (vocab + 31) / 32;
        for (uint32_t i = b; i < e; ++i) {
            RowParams p = all[i].p;
            if (!all[i].mask.empty()) {
                p.mask_row = (uint32_t)(masks.size() / mask_words);
                masks.insert(masks.end(), all[i].mask.begin(), all[i].mask.end());
            }
            p.logits_row = i - b;
            p.adj_begin = (uint32_t)adjs.size();
            p.adj_end = p.adj_begin + all[i].p.adj_end;
            adjs.insert(adjs.end(), all[i].adj.begin(), all[i].adj.begin() + all[i].p.adj_end);
            xs.insert(xs.end(), all[i].x.begin(), all[i].x.end());
            ps.push_back(p);
        }
        if (adjs.empty()) adjs.push_back(Adjustment{});
        float* x = upload(xs);
        RowParams* p = upload(ps);
        Adjustment* adj = upload(adjs);
        uint32_t* out;
        CHECK(cudaMalloc(&out, (e - b) * kOutWords * 4));
        uint32_t* mask = nullptr;
        if (masks.empty()) {
            sample_rows<<<e - b, kThreads>>>(x, vocab, p, adj, out);
        } else {
            mask = upload(masks);
            sample_rows_masked<<<e - b, kThreads>>>(x, vocab, p, adj, mask, (int64_t)mask_words, out);
        }
        CHECK(cudaGetLastError());
        std::vector<uint32_t> host((e - b) * kOutWords);
        CHECK(cudaMemcpy(host.data(), out, host.size() * 4, cudaMemcpyDeviceToHost));
        for (uint32_t i = b; i < e; ++i)
            bad_together += !cases::check(first + i, all[i], &host[(i - b) * kOutWords], false);
        cudaFree(x), cudaFree(p), cudaFree(adj), cudaFree(out), cudaFree(mask);
        b = e;
    }
    printf("together: %u rows, %d differ from the CPU sampler\n", kept, bad_together);
    return bad_alone + bad_together != 0;
}
