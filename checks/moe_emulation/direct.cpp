// Runs the MoE kernels of crates/gdn-kernels/cuda/model_moe.cuh on the CPU
// through moe_shim.h (one OS thread per CUDA
// thread, blocks one after another) on a tiny layer with a shared expert of
// another width than the routed ones (E 8, top-2, H 64, I 32, Is 48, as the
// MoE fixtures), for 1 to 4 tokens, and checks bit for bit:
//   - the direct path (moe_direct_gate_up, moe_direct_down_combine) with the
//     shared expert's output given equals the grouped GEMV path
//     (moe_topk_softmax, moe_route, moe_gemv_gate_up, moe_gemv_down,
//     moe_combine) with the same output;
//   - the direct path with the shared expert's weights equals the GEMV path
//     given the shared expert's output as the GEMV kernels compute it (one
//     expert's tile of the tokens' rows);
//   - the routing: ids are each token's two largest logits.
// So the direct kernels' indexing (pairs, the shared rows, Is != I, the act
// row stride) is checked here before any GPU runs them; the GPU gate
// (gpu_moe_ops.rs) checks all paths against an f64 reference. Exits 1 on a
// difference.
#include "moe_shim.h"
#include <cstdio>
#include <algorithm>
#include <random>
#include "model_common.cuh"
#include "model_moe.cuh"
typedef __nv_bfloat16 bf16;

static std::mt19937 rng(11);
static bf16 B(float a, float b) { return __float2bfloat16(std::uniform_real_distribution<float>(a, b)(rng)); }
static std::vector<bf16> rand_bf16(size_t n, float a) { std::vector<bf16> v(n); for (auto& x : v) x = B(-a, a); return v; }
static bool same(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  for (size_t i = 0; i < a.size(); ++i) if (a[i].bits != b[i].bits) return false;
  return a.size() == b.size();
}

constexpr int E = 8, K = 2, H = 64, I = 32, IS = 48, WIDTH = 16;  // (E + 1) rounded up to 8
constexpr int GEMV_COLS = 16;

struct Routing { std::vector<int32_t> ids; std::vector<float> w; };
static Routing topk(const std::vector<bf16>& logits, int t) {
  Routing r{std::vector<int32_t>(t * K), std::vector<float>(t * K)};
  launch({(unsigned)((t + 7) / 8), 1, 1}, 256, [&] {
    moe_topk_softmax(logits.data(), WIDTH, t, E, K, r.ids.data(), r.w.data());
  });
  return r;
}

// The GEMV path: route, gate_up, down, combine; `shared` [t, H] or empty;
// `mma`: the tensor-core GEMV kernels.
static std::vector<bf16> gemv_path(const std::vector<bf16>& x, const std::vector<bf16>& logits, const Routing& r,
                                   const std::vector<bf16>& gu, const std::vector<bf16>& dn,
                                   const std::vector<bf16>& shared, int t, bool mma = false) {
  const int pairs = t * K, bound = (pairs + 7) / 8 + std::min(E, pairs);
  std::vector<int32_t> sorted(pairs), pair_row(pairs), te(bound), tr(bound), tend(bound), nt(1);
  launch({1, 1, 1}, 1024, [&] {
    moe_route(r.ids.data(), pairs, E, 8, sorted.data(), pair_row.data(), te.data(), tr.data(), tend.data(), nt.data());
  });
  std::vector<bf16> act((size_t)pairs * I), y((size_t)pairs * H), out((size_t)t * H);
  if (mma) {
    launch({(unsigned)bound, (unsigned)((I + 63) / 64), 1}, 128, [&] {
      moe_gemv_mma_gate_up(act.data(), x.data(), sorted.data(), K, gu.data(), H, I, te.data(), tr.data(), tend.data(), nt.data());
    });
    launch({(unsigned)bound, (unsigned)((H + 63) / 64), 1}, 128, [&] {
      moe_gemv_mma_down(y.data(), act.data(), nullptr, 1, dn.data(), I, H, te.data(), tr.data(), tend.data(), nt.data());
    });
  } else {
    launch({(unsigned)bound, (unsigned)((I + GEMV_COLS - 1) / GEMV_COLS), 1}, 256, [&] {
      moe_gemv_gate_up(act.data(), x.data(), sorted.data(), K, gu.data(), H, I, te.data(), tr.data(), tend.data(), nt.data());
    });
    launch({(unsigned)bound, (unsigned)(H / GEMV_COLS), 1}, 256, [&] {
      moe_gemv_down(y.data(), act.data(), nullptr, 1, dn.data(), I, H, te.data(), tr.data(), tend.data(), nt.data());
    });
  }
  launch({(unsigned)t, 1, 1}, 256, [&] {
    moe_combine(out.data(), y.data(), pair_row.data(), r.w.data(), K, H, shared.empty() ? nullptr : shared.data(),
                logits.data(), WIDTH, E);
  });
  return out;
}

// The shared expert's output as the GEMV kernels compute it: one expert
// (its weights) with one tile of the t token rows.
static std::vector<bf16> shared_by_gemv(const std::vector<bf16>& x, const std::vector<bf16>& sgu,
                                        const std::vector<bf16>& sdn, int t) {
  std::vector<int32_t> te{0}, tr{0}, tend{t}, nt{1}, rows(t);
  for (int i = 0; i < t; ++i) rows[i] = i;
  std::vector<bf16> act((size_t)t * IS), y((size_t)t * H);
  launch({1, (unsigned)(IS / GEMV_COLS), 1}, 256, [&] {
    moe_gemv_gate_up(act.data(), x.data(), rows.data(), 1, sgu.data(), H, IS, te.data(), tr.data(), tend.data(), nt.data());
  });
  launch({1, (unsigned)(H / GEMV_COLS), 1}, 256, [&] {
    moe_gemv_down(y.data(), act.data(), nullptr, 1, sdn.data(), IS, H, te.data(), tr.data(), tend.data(), nt.data());
  });
  return y;
}

// The direct path; `sgu`/`sdn` (the shared expert's weights) or `shared`
// (its output), or neither.
static std::vector<bf16> direct_path(const std::vector<bf16>& x, const std::vector<bf16>& logits, const Routing& r,
                                     const std::vector<bf16>& gu, const std::vector<bf16>& dn,
                                     const std::vector<bf16>* sgu, const std::vector<bf16>* sdn,
                                     const std::vector<bf16>& shared, int t) {
  const int ld = std::max(I, IS), rows = t * K + (sgu ? t : 0);
  std::vector<bf16> act((size_t)(t * K + t) * ld), out((size_t)t * H);
  launch({(unsigned)rows, (unsigned)((ld + GEMV_COLS - 1) / GEMV_COLS), 1}, 256, [&] {
    moe_direct_gate_up(act.data(), ld, x.data(), r.ids.data(), t, K, gu.data(), I, sgu ? sgu->data() : nullptr, IS, H);
  });
  launch({(unsigned)t, (unsigned)(H / GEMV_COLS), 1}, 256, [&] {
    moe_direct_down_combine(out.data(), act.data(), ld, r.ids.data(), r.w.data(), t, K, dn.data(), I,
                            sdn ? sdn->data() : nullptr, IS, shared.empty() ? nullptr : shared.data(),
                            logits.data(), WIDTH, E, H);
  });
  return out;
}

int main() {
  int failures = 0;
  const auto gu = rand_bf16((size_t)E * 2 * I * H, 0.3f), dn = rand_bf16((size_t)E * H * I, 0.3f);
  const auto sgu = rand_bf16((size_t)2 * IS * H, 0.3f), sdn = rand_bf16((size_t)H * IS, 0.3f);
  for (int t = 1; t <= 4; ++t) {
    const auto x = rand_bf16((size_t)t * H, 1.f);
    auto logits = rand_bf16((size_t)t * WIDTH, 2.f);
    for (int i = 0; i < t; ++i) for (int c = E + 1; c < WIDTH; ++c) logits[i * WIDTH + c] = __float2bfloat16(0.f);
    const Routing r = topk(logits, t);
    for (int i = 0; i < t; ++i) {
      std::vector<int> order(E);
      for (int e = 0; e < E; ++e) order[e] = e;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return __bfloat162float(logits[i * WIDTH + a]) > __bfloat162float(logits[i * WIDTH + b]);
      });
      for (int s = 0; s < K; ++s) if (r.ids[i * K + s] != order[s]) {
        std::printf("T %d token %d slot %d: expert %d, want %d\n", t, i, s, r.ids[i * K + s], order[s]);
        ++failures;
      }
    }
    const std::vector<bf16> none;
    const auto given = rand_bf16((size_t)t * H, 1.f);
    const bool plain = same(gemv_path(x, logits, r, gu, dn, none, t), direct_path(x, logits, r, gu, dn, nullptr, nullptr, none, t));
    const bool with_output = same(gemv_path(x, logits, r, gu, dn, given, t),
                                  direct_path(x, logits, r, gu, dn, nullptr, nullptr, given, t));
    const auto computed = shared_by_gemv(x, sgu, sdn, t);
    const bool with_weights = same(gemv_path(x, logits, r, gu, dn, computed, t),
                                   direct_path(x, logits, r, gu, dn, &sgu, &sdn, none, t));
    std::printf("T %d: direct = GEMV without a shared expert %s, with its output %s, with its weights %s\n", t,
                plain ? "yes" : "NO", with_output ? "yes" : "NO", with_weights ? "yes" : "NO");
    failures += !plain + !with_output + !with_weights;
  }
  // The tensor-core GEMV against the CUDA-core one over tiles of 1 to 8
  // rows (and an expert with two tiles): the same sums in another order, so
  // outputs within two bf16 ulps of the larger, and most of them equal.
  for (int t : {3, 16, 40}) {
    const auto x = rand_bf16((size_t)t * H, 1.f);
    auto logits = rand_bf16((size_t)t * WIDTH, 2.f);
    const Routing r = topk(logits, t);
    const auto given = rand_bf16((size_t)t * H, 1.f);
    const auto a = gemv_path(x, logits, r, gu, dn, given, t), b = gemv_path(x, logits, r, gu, dn, given, t, true);
    int far = 0, equal = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const float u = __bfloat162float(a[i]), v = __bfloat162float(b[i]);
      equal += a[i].bits == b[i].bits;
      if (std::fabs(u - v) > 2.f / 128.f * std::max(std::fabs(u), std::fabs(v)) + 1e-6f) ++far;
    }
    std::printf("T %d: tensor-core GEMV vs CUDA-core GEMV: %d of %zu outputs equal, %d further than 2 ulp\n", t, equal,
                a.size(), far);
    if (far || equal * 2 < (int)a.size()) ++failures;
  }
  if (failures) { std::printf("%d difference(s)\n", failures); return 1; }
  std::printf("the direct MoE path matches the GEMV path bit for bit\n");
  return 0;
}
