// Sampling on the device: one block per row of logits picks the row's token
// (greedy, or temperature, min-p, top-k, top-p and a seeded draw), with
// penalties and bans given as a sparse list per row, an optional bitmask of
// the tokens a row may sample (structured outputs), and the raw
// log-probabilities when asked. Compiled ahead of time into plain cubins
// (sm_80 .. sm_120, no PTX), launched by name from src/sampling.rs, which
// owns the launch geometry and checks every buffer and index first.
//
// The oracle is the engine's CPU sampler (crates/engine/src/sampler.rs):
// every step below is its definition, computed in a different order.
//   0. a row with a bitmask reads every token whose bit is clear as -inf,
//      before anything else: the logprobs are the masked row's log-softmax
//      (vLLM's), its top list only the finite ones (the allowed tokens),
//      and penalties, bans and the draw see only allowed tokens; should
//      every allowed token be -inf, the row takes the lowest allowed id
//      (the constraint holds whatever the logits). The mask is applied
//      where a value is read (never written back), so it costs no pass of
//      its own and a disallowed logit is not even loaded; a row without
//      one runs the unmasked instantiation;
//   1. logprobs (if asked): raw max, log-sum-exp (exp of the f32 difference,
//      summed in f64), the top L raw logprobs by (value desc, id asc);
//   2. adjustments in place: repetition (x > 0 ? x / r : x * r), then
//      x -= subtract, then bans to -inf; if nothing finite remains, every
//      ban of the row is lifted;
//   3. max and argmax (NaN as -inf, lowest id on ties): greedy ends here,
//      and so does a draw from a row whose max is not finite;
//   4. the draw: min-p keeps weight exp((x - max) / T) >= min_p (f64);
//      top-k keeps x >= the k-th largest survivor (exact radix select on
//      the order-preserving f32 key); top-p keeps the shortest prefix by
//      (x desc, id asc) whose mass before it is below top_p * total (radix
//      descent on f64 mass histograms, then ties at the threshold value in
//      id order); the race (the formula, documented once in the sampler's
//      module docs):
//        key     = splitmix64(seed ^ splitmix64(draw))
//        U_i     = ((splitmix64(key + i * GAMMA) >> 11) | 1) * 2^-53
//        score_i = (x_i - max) / T - ln(-ln U_i)      (f64; highest wins,
//                                                      lowest id on ties)
// No fast math here: the race's f64 division and logs must round as IEEE
// (CUDA's f64 `log` is within 1 ulp of the host's: two scores within a few
// ulps are the only place the two samplers can part).

#include <cstdint>

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxTop = 20;
// Output words per row: token, logprob bits, kMaxTop ids, kMaxTop logprob bits.
constexpr int kOutWords = 2 + 2 * kMaxTop;
constexpr float kGreedyTemperature = 1e-5f;
constexpr uint32_t kRepetition = 1, kBan = 2;
constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;
constexpr uint32_t kNoMask = 0xffffffffu;

// Host twin: `SampleRowParams` in src/sampling.rs (#[repr(C)]).
struct RowParams {
    uint64_t seed, draw;
    float temperature, top_p, min_p, repetition_penalty;
    uint32_t top_k;
    int32_t logprobs;  // -1: none
    uint32_t logits_row, adj_begin, adj_end;
    uint32_t mask_row;  // row of the masks; kNoMask: every token allowed
};

// Host twin: `SampleAdjustment`. `raw` and `saved` are written here.
struct Adjustment {
    uint32_t token, flags;
    float subtract;
    float raw;    // the sanitised raw logit (for the chosen token's logprob)
    float saved;  // the value a ban replaced (to lift it)
};

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
    uint64_t z = x + kGamma;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
__device__ __forceinline__ uint64_t race_key(uint64_t seed, uint64_t draw) {
    return splitmix64(seed ^ splitmix64(draw));
}
__device__ __forceinline__ double race_uniform(uint64_t key, uint32_t token) {
    const uint64_t bits = splitmix64(key + (uint64_t)token * kGamma);
    return (double)((bits >> 11) | 1ull) * (1.0 / 9007199254740992.0);
}
__device__ __forceinline__ double race_score(float x, float max, float t, double u) {
    return __ddiv_rn(__dsub_rn((double)x, (double)max), (double)t) - log(-log(u));
}

__device__ __forceinline__ float sanitize(float x) { return isnan(x) ? -INFINITY : x; }

// Which tokens a row may sample: every one (rows without a mask: the code
// of an unconstrained row is the code without masks), or those whose bit is
// set (bit i % 32 of word i / 32). The 32 lanes of a warp read consecutive
// tokens, so one word serves the whole warp.
struct AllTokens {
    static constexpr bool kMasked = false;
    __device__ __forceinline__ bool allowed(int) const { return true; }
};
struct AllowedBits {
    static constexpr bool kMasked = true;
    const uint32_t* words;
    __device__ __forceinline__ bool allowed(int i) const { return (words[i >> 5] >> (i & 31)) & 1u; }
};

// What the sampler sees of token i: NaN and disallowed tokens as -inf (a
// disallowed logit is not loaded).
template <class Mask>
__device__ __forceinline__ float value(const float* x, int i, Mask tokens) {
    return tokens.allowed(i) ? sanitize(x[i]) : -INFINITY;
}

// Order-preserving key of a non-NaN float (-0 folded into +0), so that
// equal keys are equal values.
__device__ __forceinline__ uint32_t order_key(float x) {
    const uint32_t b = __float_as_uint(x + 0.0f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// (value, id) pairs: higher value first, lower id on equal values.
__device__ __forceinline__ bool better(double a, int ia, double b, int ib) {
    return a > b || (a == b && ia < ib);
}

// Block reductions in two butterfly levels: each warp reduces its lanes,
// then every warp reduces the warps' results (one per lane: kWarps == 32),
// so every thread ends with the same value. A butterfly of a commutative
// combine gives every lane the same bits, so no broadcast is needed.
// Why not a serial loop over the warps' results: ptxas of CUDA 13.0 at -O2
// and -O3 (not -O1, not -G) miscompiled `for (w = 1; w < 32; ++w) if
// (better(sv[w], si[w], v, id)) ...` here: on the H200, 132 of 512 random
// rows got wrong top-logprobs lists or tokens, and an all-NaN row got an id
// read from elsewhere; the same source with the loop's reads in locals,
// with volatile arrays or with 16 warps was right (docs/gpu-tests.md).
static_assert(kWarps == 32, "the second level takes one warp result per lane");

__device__ __forceinline__ void warp_best(double& v, int& id) {
    for (int o = 16; o > 0; o >>= 1) {
        const double ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, id, o);
        if (better(ov, oi, v, id)) v = ov, id = oi;
    }
}

// Best (value, id) over the block; every thread gets it.
__device__ void block_best(double& v, int& id) {
    __shared__ double sv[kWarps];
    __shared__ int si[kWarps];
    warp_best(v, id);
    __syncthreads();  // the arrays may still be read by a previous call
    if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = v, si[threadIdx.x >> 5] = id;
    __syncthreads();
    v = sv[threadIdx.x & 31], id = si[threadIdx.x & 31];
    warp_best(v, id);
}

__device__ __forceinline__ double warp_sum(double x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Sum over the block in a fixed order; every thread gets it.
__device__ double block_sum(double x) {
    __shared__ double s[kWarps];
    x = warp_sum(x);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = x;
    __syncthreads();
    return warp_sum(s[threadIdx.x & 31]);
}

__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ float block_max(float x) {
    __shared__ float s[kWarps];
    x = warp_max(x);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = x;
    __syncthreads();
    return warp_max(s[threadIdx.x & 31]);
}

// The lowest id below n that `bits` allows; `none` if it allows none. The
// whole block calls it.
__device__ int lowest_allowed(const AllowedBits bits, int n, int none) {
    int first = 0x7fffffff;
    for (int w = (int)threadIdx.x; w < (n + 31) / 32; w += kThreads) {
        const uint32_t b = bits.words[w];
        const int t = w * 32 + __ffs((int)b) - 1;
        if (b != 0u && t < n) {
            first = t;  // this thread's words ascend: its first hit is its lowest
            break;
        }
    }
    double v = first < n ? 0.0 : -INFINITY;
    block_best(v, first);
    return v == 0.0 ? first : none;
}

// What the draw keeps of the row: the min-p survivors, cut by top-k and
// top-p once their thresholds are known.
struct Keep {
    float max, t, min_p;
    bool top_k;
    float kth;  // with top_k: keep x >= kth
    bool top_p;
    uint32_t key_p;  // with top_p: keep key > key_p, or key == key_p and id <= cut_p
    int cut_p;

    __device__ double weight(float x) const {
        return exp(__ddiv_rn(__dsub_rn((double)x, (double)max), (double)t));
    }
    __device__ bool survives(float x) const {
        return isfinite(x) && (min_p <= 0.f || weight(x) >= (double)min_p);
    }
    __device__ bool kept_before_p(float x) const { return survives(x) && (!top_k || x >= kth); }
    __device__ bool kept(float x, int i) const {
        if (!kept_before_p(x)) return false;
        if (!top_p) return true;
        const uint32_t k = order_key(x);
        return k > key_p || (k == key_p && i <= cut_p);
    }
};

}  // namespace

// One row: `x` its `n` logits (adjusted in place), `o` its kOutWords
// output words, `tokens` the ones it may sample. Each instantiation has its
// own shared scratch (both together are under 8 KB).
template <class Mask>
__device__ __forceinline__ void sample_row(float* __restrict__ x, int n, const RowParams p,
                                           Adjustment* __restrict__ adj, uint32_t* __restrict__ o,
                                           Mask tokens) {
    __shared__ uint32_t hist_count[256];
    __shared__ double hist_mass[256];
    __shared__ uint32_t s_word[4];
    __shared__ double s_mass;
    __shared__ int s_cut;
    __shared__ int warp_count[kWarps];
    const int tid = threadIdx.x, lane = tid & 31;

    // 1. Raw log-probabilities.
    double log_norm = 0.0;
    if (p.logprobs >= 0) {
        float m = -INFINITY;
        for (int i = tid; i < n; i += kThreads)
            if (tokens.allowed(i)) m = fmaxf(m, x[i]);  // fmaxf skips NaN
        m = block_max(m);
        if (!isfinite(m)) {
            log_norm = m;
        } else {
            double s = 0.0;
            for (int i = tid; i < n; i += kThreads)
                if (tokens.allowed(i)) s += exp((double)(sanitize(x[i]) - m));
            log_norm = (double)m + log(block_sum(s));
        }
        const int top = min(p.logprobs, min(kMaxTop, n));
        double pv = INFINITY;
        int pi = -1;
        for (int r = 0; r < top; ++r) {
            double v = -INFINITY;
            int id = 0x7fffffff;
            for (int i = tid; i < n; i += kThreads) {
                const double xi = value(x, i, tokens);
                if ((xi < pv || (xi == pv && i > pi)) && better(xi, i, v, id)) v = xi, id = i;
            }
            block_best(v, id);
            const float lp = (float)(v - log_norm);
            if (Mask::kMasked && !isfinite(lp)) {
                // The allowed tokens are listed: the rest (all after them)
                // are marked NaN and not searched for.
                if (tid == 0)
                    for (int rest = r; rest < top; ++rest) o[2 + kMaxTop + rest] = __float_as_uint(NAN);
                break;
            }
            if (tid == 0) {
                o[2 + r] = (uint32_t)id;
                o[2 + kMaxTop + r] = __float_as_uint(lp);
            }
            pv = v, pi = id;
        }
    }

    // 2. Penalties and bans, in place (one entry per token: no two threads
    // touch one logit).
    int any_ban = 0;
    for (uint32_t e = p.adj_begin + tid; e < p.adj_end; e += kThreads) {
        Adjustment& a = adj[e];
        float v = value(x, (int)a.token, tokens);
        a.raw = v;
        if (a.flags & kRepetition) v = v > 0.f ? __fdiv_rn(v, p.repetition_penalty)
                                               : __fmul_rn(v, p.repetition_penalty);
        v = __fsub_rn(v, a.subtract);
        if (a.flags & kBan) {
            a.saved = v;
            v = -INFINITY;
            any_ban = 1;
        }
        x[a.token] = v;
    }
    any_ban = __syncthreads_or(any_ban);

    // 3. Max and argmax; lift the bans of a row left with nothing finite.
    double best = -INFINITY;
    int best_id = 0x7fffffff;
    int finite = 0;
    for (int i = tid; i < n; i += kThreads) {
        const float v = value(x, i, tokens);
        finite |= isfinite(v);
        if (better(v, i, best, best_id)) best = v, best_id = i;
    }
    if (any_ban && !__syncthreads_or(finite)) {
        for (uint32_t e = p.adj_begin + tid; e < p.adj_end; e += kThreads)
            if (adj[e].flags & kBan) x[adj[e].token] = adj[e].saved;
        __syncthreads();
        best = -INFINITY, best_id = 0x7fffffff;
        for (int i = tid; i < n; i += kThreads) {
            const float v = value(x, i, tokens);
            if (better(v, i, best, best_id)) best = v, best_id = i;
        }
    }
    block_best(best, best_id);
    const float row_max = (float)best;
    int token = best_id;

    // 4. The draw.
    if (!(p.temperature < kGreedyTemperature) && isfinite(row_max)) {
        Keep k{row_max, p.temperature, p.min_p, false, 0.f, false, 0u, 0};
        // Top-k: the k-th largest survivor's key, 8 bits at a time.
        if (p.top_k > 0) {
            int count = 0;
            for (int i = tid; i < n; i += kThreads) count += k.survives(value(x, i, tokens));
            count = (int)block_sum((double)count);
            if ((uint32_t)count > p.top_k) {
                uint32_t prefix = 0, mask = 0, rank = p.top_k;
                for (int shift = 24; shift >= 0; shift -= 8) {
                    for (int d = tid; d < 256; d += kThreads) hist_count[d] = 0;
                    __syncthreads();
                    for (int base = 0; base < n; base += kThreads) {
                        const int i = base + tid;
                        const float v = i < n ? value(x, i, tokens) : -INFINITY;
                        const uint32_t key = order_key(v);
                        const bool in = i < n && (key & mask) == prefix && k.survives(v);
                        const uint32_t d = in ? (key >> shift) & 255u : 256u + lane;
                        const uint32_t peers = __match_any_sync(0xffffffffu, d);
                        if (in && lane == __ffs(peers) - 1) atomicAdd(&hist_count[d], __popc(peers));
                    }
                    __syncthreads();
                    if (tid == 0) {
                        uint32_t above = 0;
                        int d = 255;
                        for (; d > 0; --d) {
                            if (above + hist_count[d] >= rank) break;
                            above += hist_count[d];
                        }
                        s_word[0] = (uint32_t)d;
                        s_word[1] = rank - above;
                    }
                    __syncthreads();
                    prefix |= s_word[0] << shift;
                    mask |= 255u << shift;
                    rank = s_word[1];
                    __syncthreads();
                }
                k.top_k = true;
                k.kth = key_value(prefix);
            }
        }
        // Top-p: the largest key whose mass at or above it reaches the
        // limit, then how many of its ties (in id order) the prefix takes.
        if (p.top_p < 1.f) {
            double total = 0.0;
            for (int i = tid; i < n; i += kThreads) {
                const float v = value(x, i, tokens);
                if (k.kept_before_p(v)) total += k.weight(v);
            }
            const double limit = (double)p.top_p * block_sum(total);
            uint32_t prefix = 0, mask = 0;
            double above = 0.0;
            uint32_t ties = 0;
            for (int shift = 24; shift >= 0; shift -= 8) {
                for (int d = tid; d < 256; d += kThreads) hist_count[d] = 0, hist_mass[d] = 0.0;
                __syncthreads();
                for (int i = tid; i < n; i += kThreads) {
                    const float v = value(x, i, tokens);
                    const uint32_t key = order_key(v);
                    if ((key & mask) == prefix && k.kept_before_p(v)) {
                        const uint32_t d = (key >> shift) & 255u;
                        atomicAdd(&hist_count[d], 1u);
                        atomicAdd(&hist_mass[d], k.weight(v));
                    }
                }
                __syncthreads();
                if (tid == 0) {
                    double cum = above;
                    int chosen = -1, lowest = -1;
                    for (int d = 255; d >= 0; --d) {
                        if (hist_count[d] == 0) continue;
                        lowest = d;
                        if (cum + hist_mass[d] >= limit) {
                            chosen = d;
                            break;
                        }
                        cum += hist_mass[d];
                    }
                    if (chosen < 0) {
                        // The histograms' sum fell short of the reduction's
                        // total by rounding: keep everything down to the lowest.
                        chosen = lowest;
                        cum -= hist_mass[lowest];
                    }
                    s_word[0] = (uint32_t)chosen;
                    s_word[1] = hist_count[chosen];
                    s_mass = cum;
                }
                __syncthreads();
                prefix |= s_word[0] << shift;
                mask |= 255u << shift;
                above = s_mass;
                ties = s_word[1];
                __syncthreads();
            }
            // Tie j (0-based, id order) stays while above + j * w < limit.
            const double w = k.weight(key_value(prefix));
            const double room = (limit - above) / w;
            uint32_t take = ties;
            if (room < (double)ties) take = (uint32_t)max(1.0, ceil(room));
            k.top_p = true;
            k.key_p = prefix;
            k.cut_p = 0x7fffffff;
            if (take < ties) {
                // The id of the take-th tie: block-wide tiles in id order.
                if (tid == 0) s_cut = 0x7fffffff;
                uint32_t seen = 0;
                for (int base = 0; base < n; base += kThreads) {
                    const int i = base + tid;
                    const bool tie = i < n && order_key(value(x, i, tokens)) == prefix;
                    const int c = __syncthreads_count(tie);
                    if (seen + (uint32_t)c >= take) {
                        const uint32_t ballot = __ballot_sync(0xffffffffu, tie);
                        if (lane == 0) warp_count[tid >> 5] = __popc(ballot);
                        __syncthreads();
                        uint32_t rank = seen;
                        for (int w2 = 0; w2 < (tid >> 5); ++w2) rank += warp_count[w2];
                        rank += __popc(ballot & ((1u << lane) - 1u));
                        if (tie && rank + 1 == take) s_cut = i;
                        __syncthreads();
                        break;
                    }
                    seen += (uint32_t)c;
                }
                __syncthreads();
                k.cut_p = s_cut;
            }
        }
        // The race.
        const uint64_t key = race_key(p.seed, p.draw);
        double score = -INFINITY;
        int id = 0x7fffffff;
        for (int i = tid; i < n; i += kThreads) {
            const float v = value(x, i, tokens);
            if (!k.kept(v, i)) continue;
            const double s = race_score(v, row_max, p.temperature, race_uniform(key, (uint32_t)i));
            if (better(s, i, score, id)) score = s, id = i;
        }
        block_best(score, id);
        // A draw always keeps the row's maximum (weight 1), so `id` is a
        // token; should nothing be kept all the same, the greedy token
        // stands rather than an id outside the row.
        if (id < n) token = id;
    }
    // Never an index outside the row (the H200 read x[0x7fffffff] once).
    if (token < 0 || token >= n) token = 0;
    if constexpr (Mask::kMasked) {
        // Every allowed token is -inf (the argmax fell back to id 0).
        if (!tokens.allowed(token)) token = lowest_allowed(tokens, n, token);
    }

    if (tid == 0) {
        o[0] = (uint32_t)token;
        float lp = NAN;
        if (p.logprobs >= 0) {
            // The raw value: an adjusted token's was kept in its entry
            // (entries are sorted by id).
            float raw = value(x, token, tokens);
            uint32_t lo = p.adj_begin, hi = p.adj_end;
            while (lo < hi) {
                const uint32_t mid = (lo + hi) / 2;
                if (adj[mid].token < (uint32_t)token) lo = mid + 1;
                else hi = mid;
            }
            if (lo < p.adj_end && adj[lo].token == (uint32_t)token) raw = adj[lo].raw;
            lp = (float)((double)raw - log_norm);
        }
        o[1] = __float_as_uint(lp);
    }
}

// One block of kThreads per output row. `logits` rows are adjusted in place.
// Launched when no row of the step has a mask (mask_row is not read).
extern "C" __global__ void __launch_bounds__(kThreads)
    sample_rows(float* __restrict__ logits, int64_t vocab, const RowParams* __restrict__ params,
                Adjustment* __restrict__ adj, uint32_t* __restrict__ out) {
    const RowParams p = params[blockIdx.x];
    sample_row(logits + (int64_t)p.logits_row * vocab, (int)vocab, p, adj,
               out + (int64_t)blockIdx.x * kOutWords, AllTokens{});
}

// sample_rows for a step with masks: `masks` is [mask rows, mask_words]
// u32 (mask_words covers the vocabulary), read by the rows whose mask_row
// is not kNoMask; the others sample as sample_rows does. A kernel of its
// own so that steps without masks run sample_rows's code alone: with both
// instantiations in one kernel, ptxas (CUDA 13, -O3, sm_90) spills
// registers at the 1024-thread bound, and sample_rows alone spills none.
extern "C" __global__ void __launch_bounds__(kThreads)
    sample_rows_masked(float* __restrict__ logits, int64_t vocab, const RowParams* __restrict__ params,
                       Adjustment* __restrict__ adj, const uint32_t* __restrict__ masks, int64_t mask_words,
                       uint32_t* __restrict__ out) {
    const RowParams p = params[blockIdx.x];
    float* x = logits + (int64_t)p.logits_row * vocab;
    uint32_t* o = out + (int64_t)blockIdx.x * kOutWords;
    if (p.mask_row != kNoMask)
        sample_row(x, (int)vocab, p, adj, o, AllowedBits{masks + (int64_t)p.mask_row * mask_words});
    else
        sample_row(x, (int)vocab, p, adj, o, AllTokens{});
}
