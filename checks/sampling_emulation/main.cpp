// Runs the sampling kernel's source (crates/gdn-kernels/cuda/sampling.cu)
// on the CPU through cuda_shim.h over the cases that
// `gpu_sampling.rs::emit_cases_for_the_cpu_emulation` wrote with the CPU
// sampler's answers; prints every row that differs (token, logprobs within
// 1e-4, the top list) and exits 1 if any does.
#include "cuda_shim.h"
#include "../../crates/gdn-kernels/cuda/sampling.cu"
#include <cstdio>
#include <cstdlib>

namespace {
struct Reader {
    FILE* f;
    template <class T> T get() {
        T v;
        if (fread(&v, sizeof(T), 1, f) != 1) {
            fprintf(stderr, "truncated case file\n");
            exit(2);
        }
        return v;
    }
};
bool close(float a, float b) {
    return (std::isnan(a) && std::isnan(b)) || a == b || std::fabs(a - b) <= 1e-4f;
}
// One block of 1024 threads over one row.
void launch(float* x, uint32_t vocab, const RowParams* p, Adjustment* adj, uint32_t* out) {
    std::barrier<> block(1024);
    g_block = &block;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    for (int w = 0; w < 32; ++w) {
        warps.emplace_back(new std::barrier<>(32));
        g_warp[w] = warps.back().get();
    }
    blockIdx.x = 0;
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < 1024; ++t)
        threads.emplace_back([=] {
            threadIdx.x = t;
            sample_rows(x, vocab, p, adj, out);
        });
    for (auto& t : threads) t.join();
}
}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s <cases file>\n", argv[0]);
        return 2;
    }
    Reader r{fopen(argv[1], "rb")};
    if (!r.f) {
        perror(argv[1]);
        return 2;
    }
    const uint32_t n = r.get<uint32_t>();
    int bad = 0;
    for (uint32_t c = 0; c < n; ++c) {
        const uint32_t vocab = r.get<uint32_t>();
        std::vector<float> x(vocab);
        for (auto& v : x) v = r.get<float>();
        RowParams p{};
        p.seed = r.get<uint64_t>();
        p.draw = r.get<uint64_t>();
        p.temperature = r.get<float>();
        p.top_p = r.get<float>();
        p.min_p = r.get<float>();
        p.repetition_penalty = r.get<float>();
        p.top_k = r.get<uint32_t>();
        p.logprobs = r.get<int32_t>();
        const uint32_t na = r.get<uint32_t>();
        std::vector<Adjustment> adj(na > 0 ? na : 1);
        for (uint32_t i = 0; i < na; ++i) {
            adj[i].token = r.get<uint32_t>();
            adj[i].flags = r.get<uint32_t>();
            adj[i].subtract = r.get<float>();
        }
        p.adj_end = na;
        const uint32_t want = r.get<uint32_t>();
        const float want_lp = r.get<float>();
        std::vector<std::pair<uint32_t, float>> top(r.get<uint32_t>());
        for (auto& t : top) t.first = r.get<uint32_t>(), t.second = r.get<float>();
        std::vector<uint32_t> out(kOutWords, 0xdeadbeefu);
        launch(x.data(), vocab, &p, adj.data(), out.data());
        const float lp = __uint_as_float(out[1]);
        bool ok = out[0] == want && close(lp, want_lp);
        for (size_t i = 0; i < top.size() && ok; ++i)
            ok = out[2 + i] == top[i].first && close(__uint_as_float(out[2 + kMaxTop + i]), top[i].second);
        if (!ok) {
            ++bad;
            printf("case %u (vocab %u): kernel %u logprob %g, cpu %u logprob %g (T %g top_k %u top_p %g min_p %g "
                   "repetition %g logprobs %d, %u adjustments)\n",
                   c, vocab, out[0], lp, want, want_lp, p.temperature, p.top_k, p.top_p, p.min_p,
                   p.repetition_penalty, p.logprobs, na);
        }
    }
    printf("%u rows, %d differ from the CPU sampler\n", n, bad);
    return bad != 0;
}
