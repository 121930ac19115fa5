// The case file that `gpu_sampling.rs::emit_cases_for_the_cpu_emulation`
// writes (one row of logits, its parameters, adjustments and allowed-token
// mask, the CPU sampler's answer), read the same way by the CPU emulation (main.cpp) and
// the device harness (device_main.cu). Include after sampling.cu (it needs
// RowParams, Adjustment and kOutWords).
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

namespace {  // the kernel's types live in an anonymous namespace
namespace cases {
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

struct Case {
    uint32_t vocab;
    std::vector<float> x;
    RowParams p{};
    std::vector<Adjustment> adj;  // at least one entry (a kernel argument)
    std::vector<uint32_t> mask;   // empty: every token allowed (p.mask_row kNoMask)
    uint32_t want;
    float want_lp;
    std::vector<std::pair<uint32_t, float>> top;
};

inline Case read(Reader& r) {
    Case c;
    c.vocab = r.get<uint32_t>();
    c.x.resize(c.vocab);
    for (auto& v : c.x) v = r.get<float>();
    c.p.seed = r.get<uint64_t>();
    c.p.draw = r.get<uint64_t>();
    c.p.temperature = r.get<float>();
    c.p.top_p = r.get<float>();
    c.p.min_p = r.get<float>();
    c.p.repetition_penalty = r.get<float>();
    c.p.top_k = r.get<uint32_t>();
    c.p.logprobs = r.get<int32_t>();
    const uint32_t na = r.get<uint32_t>();
    c.adj.assign(na > 0 ? na : 1, Adjustment{});
    for (uint32_t i = 0; i < na; ++i) {
        c.adj[i].token = r.get<uint32_t>();
        c.adj[i].flags = r.get<uint32_t>();
        c.adj[i].subtract = r.get<float>();
    }
    c.p.adj_end = na;
    c.mask.resize(r.get<uint32_t>());
    for (auto& w : c.mask) w = r.get<uint32_t>();
    c.p.mask_row = c.mask.empty() ? kNoMask : 0;
    c.want = r.get<uint32_t>();
    c.want_lp = r.get<float>();
    c.top.resize(r.get<uint32_t>());
    for (auto& t : c.top) t.first = r.get<uint32_t>(), t.second = r.get<float>();
    return c;
}

inline float word_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline bool close(float a, float b) {
    return (std::isnan(a) && std::isnan(b)) || a == b || std::fabs(a - b) <= 1e-4f;
}

// Whether the kernel's output words for `c` equal the CPU sampler's answer
// (token, logprob within 1e-4, the top list); prints the row if not, with
// both top lists when `verbose`.
inline bool check(uint32_t index, const Case& c, const uint32_t* out, bool verbose) {
    const float lp = word_float(out[1]);
    bool ok = out[0] == c.want && close(lp, c.want_lp);
    for (size_t i = 0; i < c.top.size() && ok; ++i)
        ok = out[2 + i] == c.top[i].first && close(word_float(out[2 + kMaxTop + i]), c.top[i].second);
    // A masked row's list ends where the CPU's does: the entries after it are
    // not finite (src/sampling.rs drops them).
    const int asked = c.p.logprobs < 0 ? 0 : std::min<int>(std::min(c.p.logprobs, kMaxTop), (int)c.vocab);
    for (int i = (int)c.top.size(); i < asked && ok && !c.mask.empty(); ++i)
        ok = !std::isfinite(word_float(out[2 + kMaxTop + i]));
    if (ok) return true;
    const RowParams& p = c.p;
    printf("case %u (vocab %u): kernel %u logprob %g, cpu %u logprob %g (T %g top_k %u top_p %g min_p %g "
           "repetition %g logprobs %d, %u adjustments, %s)\n",
           index, c.vocab, out[0], lp, c.want, c.want_lp, p.temperature, p.top_k, p.top_p, p.min_p,
           p.repetition_penalty, p.logprobs, p.adj_end, c.mask.empty() ? "no mask" : "masked");
    if (verbose)
        for (size_t i = 0; i < c.top.size(); ++i)
            printf("  top %zu: kernel %u (%g, x %g) cpu %u (%g, x %g)\n", i, out[2 + i],
                   word_float(out[2 + kMaxTop + i]), c.x[out[2 + i] < c.vocab ? out[2 + i] : 0],
                   c.top[i].first, c.top[i].second, c.x[c.top[i].first]);
    return false;
}
}  // namespace cases
}  // namespace
