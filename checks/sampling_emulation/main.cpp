// Runs the sampling kernel's source (crates/gdn-kernels/cuda/sampling.cu)
// on the CPU through cuda_shim.h over the cases that
// `gpu_sampling.rs::emit_cases_for_the_cpu_emulation` wrote with the CPU
// sampler's answers; prints every row that differs (token, logprobs within
// 1e-4, the top list) and exits 1 if any does.
#include "cuda_shim.h"
#include "../../crates/gdn-kernels/cuda/sampling.cu"
#include <cstdio>
#include <cstdlib>

#include "cases.h"

namespace {
// One block of 1024 threads over one row (the masked kernel when `mask`
// has words).
void launch(float* x, uint32_t vocab, const RowParams* p, Adjustment* adj,
            const std::vector<uint32_t>& mask, uint32_t* out) {
    std::barrier<> block(1024);
    g_block = &block;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    for (int w = 0; w < 32; ++w) {
        warps.emplace_back(new std::barrier<>(32));
        g_warp[w] = warps.back().get();
    }
    blockIdx.x = 0;
    std::vector<std::thread> threads;
    const uint32_t* words = mask.data();
    const int64_t mask_words = (int64_t)mask.size();
    for (unsigned t = 0; t < 1024; ++t)
        threads.emplace_back([=] {
            threadIdx.x = t;
            if (mask_words == 0)
                sample_rows(x, vocab, p, adj, out);
            else
                sample_rows_masked(x, vocab, p, adj, words, mask_words, out);
        });
    for (auto& t : threads) t.join();
}
}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s <cases file>\n", argv[0]);
        return 2;
    }
    cases::Reader r{fopen(argv[1], "rb")};
    if (!r.f) {
        perror(argv[1]);
        return 2;
    }
    const uint32_t n = r.get<uint32_t>();
    int bad = 0;
    for (uint32_t i = 0; i < n; ++i) {
        cases::Case c = cases::read(r);
        std::vector<uint32_t> out(kOutWords, 0xdeadbeefu);
        launch(c.x.data(), c.vocab, &c.p, c.adj.data(), c.mask, out.data());
        bad += !cases::check(i, c, out.data(), false);
    }
    printf("%u rows, %d differ from the CPU sampler\n", n, bad);
    return bad != 0;
}
