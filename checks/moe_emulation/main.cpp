// model_moe.cuh's kernels run on the CPU (checks/moe_emulation/run.sh)
// against an f64 reference of transformers' qwen3_5_moe experts, the same
// reference and bounds as crates/gdn-kernels/tests/gpu_moe_ops.rs, on the
// grouped expert paths (GEMV tiles on CUDA cores and on tensor cores, 64-row
// tensor-core tiles; the direct path: direct.cpp), with a favoured expert (every
// token picks it), a shunned one (no token does) and the shared expert.
// Checks the ids exactly, the weights, that the routing is a permutation
// with its inverse, and the outputs; exits 1 on a difference. FULL=1 adds
// larger cases (E = 256, top-8; minutes on 2 cores).
#include "moe_shim.h"
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include "model_common.cuh"
#include "model_moe.cuh"
#include "model_moe_tc.cuh"

static float bfr(double x) { return __bfloat162float(__float2bfloat16((float)x)); }
// bf16 rounding of a reference value (through f32: a double rounding only
// where the f64 value lies within 2^-29 of a bf16 midpoint).
static double rb(double x) { return bfr(x); }
static double silu_d(double x) { return x / (1 + std::exp(-x)); }
static double sig_d(double x) { return 1 / (1 + std::exp(-x)); }

int fails = 0;
void run(int E, int K, int H, int I, int T, int fav, int shun, bool shared, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> U(-1, 1);
  // Router logits [T, W]: the shared expert's gate in column E (the op's
  // router_width: E + 1 rounded up to 8).
  const int W = (E + 1 + 7) / 8 * 8;
  std::vector<bf16> logits(T * W), x(T * H), gu((size_t)E * 2 * I * H), dn((size_t)E * H * I), sh(T * H), sg(T);
  for (int t = 0; t < T; ++t) {
    std::vector<int> rank(E); for (int e = 0; e < E; ++e) rank[e] = e;
    std::shuffle(rank.begin(), rank.end(), rng);
    auto place = [&](int ex, int r) { int at = std::find(rank.begin(), rank.end(), r) - rank.begin(); std::swap(rank[at], rank[ex]); };
    if (fav >= 0) place(fav, E - 1);
    if (shun >= 0) place(shun, 0);
    for (int e = 0; e < E; ++e) logits[t * W + e] = __float2bfloat16((rank[e] - E / 2.0) * 8.0 / E);
  }
  for (auto& v : x) v = __float2bfloat16(U(rng));
  for (auto& v : sh) v = __float2bfloat16(U(rng));
  for (int t = 0; t < T; ++t) logits[t * W + E] = sg[t] = __float2bfloat16(3 * U(rng));
  float gs = std::sqrt(3.f / H) * 2, ds = std::sqrt(3.f / I) * 4;
  for (auto& v : gu) v = __float2bfloat16(gs * U(rng));
  for (auto& v : dn) v = __float2bfloat16(ds * U(rng));
  int pairs = T * K;
  // reference
  std::vector<std::vector<std::pair<int, double>>> routes(T);
  std::vector<double> want(T * H), bound(T * H);
  for (int t = 0; t < T; ++t) {
    double m = -1e30; for (int e = 0; e < E; ++e) m = std::max(m, (double)f(logits[t*W+e]));
    std::vector<double> p(E); double z = 0; for (int e = 0; e < E; ++e) z += p[e] = std::exp(f(logits[t*W+e]) - m);
    std::vector<int> ord(E); for (int e = 0; e < E; ++e) ord[e] = e;
    std::stable_sort(ord.begin(), ord.end(), [&](int a, int b) { return p[a] > p[b]; });
    double s = 0; for (int j = 0; j < K; ++j) s += p[ord[j]] / z;
    for (int j = 0; j < K; ++j) routes[t].push_back({ord[j], p[ord[j]] / z / s});
    std::vector<double> routed(H, 0), extra(H, 0);
    for (auto [ex, w] : routes[t]) {
      std::vector<double> act(I), dact(I);
      for (int j = 0; j < I; ++j) {
        double g = 0, u = 0;
        for (int h = 0; h < H; ++h) { g += f(gu[((size_t)ex*2*I + j)*H + h]) * (double)f(x[t*H+h]); u += f(gu[((size_t)ex*2*I + I + j)*H + h]) * (double)f(x[t*H+h]); }
        g = rb(g); u = rb(u); double s_ = rb(silu_d(g)); act[j] = rb(s_ * u);
        dact[j] = (std::abs(act[j]) + std::abs(u) * (std::abs(s_) + 1.1 * std::abs(g)) + std::abs(s_ * u)) / 128;
      }
      double wb = rb(w);
      for (int n = 0; n < H; ++n) {
        double y = 0, spread = 0;
        for (int j = 0; j < I; ++j) { double d = f(dn[((size_t)ex*H + n)*I + j]); y += d * act[j]; spread += std::abs(d) * dact[j]; }
        y = rb(y);
        routed[n] += rb(y * wb);
        extra[n] += wb * (3.0 / 128 * std::abs(y) + spread);
      }
    }
    double g = rb(sig_d(f(sg[t])));
    for (int n = 0; n < H; ++n) {
      double shv = shared ? rb(g * f(sh[t*H+n])) : 0;
      double o = shared ? rb(rb(routed[n]) + shv) : rb(routed[n]);
      want[t*H+n] = o;
      bound[t*H+n] = extra[n] + (std::abs(o) + std::abs(routed[n]) + 2 * std::abs(shv)) / 128 + 1e-6;
    }
  }
  // path 0: GEMV tiles, 1: 64-row tensor-core tiles, 2: GEMV tiles on tensor cores.
  for (int path = 0; path < 3; ++path) {
    int tile_rows = path == 1 ? kMoeTcRows : kMoeGemvRows;
    std::vector<int32_t> ids(pairs, -7), sorted(pairs, -7), prow(pairs, -7);
    std::vector<float> wts(pairs);
    int bound_tiles = (pairs + tile_rows - 1) / tile_rows + std::min(E, pairs);
    std::vector<int32_t> te(bound_tiles, -7), tr(bound_tiles, -7), tend(bound_tiles, -7), nt(1, -7);
    std::vector<bf16> act((size_t)pairs * I), y((size_t)pairs * H), out(T * H);
    launch({(unsigned)((T + 7) / 8), 1, 1}, 256, [&] { moe_topk_softmax(logits.data(), W, T, E, K, ids.data(), wts.data()); });
    launch({1, 1, 1}, 1024, [&] { moe_route(ids.data(), pairs, E, tile_rows, sorted.data(), prow.data(), te.data(), tr.data(), tend.data(), nt.data()); });
    if (path == 0) {
      launch({(unsigned)bound_tiles, (unsigned)((I + 15) / 16), 1}, 256, [&] { moe_gemv_gate_up(act.data(), x.data(), sorted.data(), K, gu.data(), H, I, te.data(), tr.data(), tend.data(), nt.data()); });
      launch({(unsigned)bound_tiles, (unsigned)((H + 15) / 16), 1}, 256, [&] { moe_gemv_down(y.data(), act.data(), nullptr, 1, dn.data(), I, H, te.data(), tr.data(), tend.data(), nt.data()); });
    } else if (path == 2) {
      launch({(unsigned)bound_tiles, (unsigned)((I + 63) / 64), 1}, 128, [&] { moe_gemv_mma_gate_up(act.data(), x.data(), sorted.data(), K, gu.data(), H, I, te.data(), tr.data(), tend.data(), nt.data()); });
      launch({(unsigned)bound_tiles, (unsigned)((H + 63) / 64), 1}, 128, [&] { moe_gemv_mma_down(y.data(), act.data(), nullptr, 1, dn.data(), I, H, te.data(), tr.data(), tend.data(), nt.data()); });
    } else {
      launch({(unsigned)bound_tiles, (unsigned)((I + 63) / 64), 1}, 128, [&] { moe_gemm_gate_up(act.data(), x.data(), sorted.data(), K, gu.data(), H, I, te.data(), tr.data(), tend.data(), nt.data()); });
      launch({(unsigned)bound_tiles, (unsigned)((H + 63) / 64), 1}, 128, [&] { moe_gemm_down(y.data(), act.data(), nullptr, 1, dn.data(), I, H, te.data(), tr.data(), tend.data(), nt.data()); });
    }
    launch({(unsigned)T, 1, 1}, 256, [&] { moe_combine(out.data(), y.data(), prow.data(), wts.data(), K, H, shared ? sh.data() : nullptr, logits.data(), W, E); });
    int bad = 0;
    for (int t = 0; t < T; ++t) for (int s = 0; s < K; ++s) {
      if (ids[t*K+s] != routes[t][s].first) { if (bad++ < 5) printf("id t %d s %d: %d want %d\n", t, s, ids[t*K+s], routes[t][s].first); }
      double w = routes[t][s].second;
      if (std::abs(wts[t*K+s] - w) > 2e-6 * w) { if (bad++ < 5) printf("w t %d s %d: %g want %g\n", t, s, wts[t*K+s], w); }
    }
    // permutation checks
    std::set<int> seen(sorted.begin(), sorted.end());
    if ((int)seen.size() != pairs) { bad++; printf("sorted_pair not a permutation\n"); }
    for (int p = 0; p < pairs; ++p) if (sorted[prow[p]] != p) { if (bad++ < 5) printf("pair_row inverse broken at %d\n", p); }
    double se = 0, sw = 0, worst = 0;
    for (int i = 0; i < T * H; ++i) {
      double e = std::abs(f(out[i]) - want[i]); se += e*e; sw += want[i]*want[i]; worst = std::max(worst, e / bound[i]);
      if (e > bound[i]) { if (bad++ < 5) printf("out %d: %g want %g bound %g\n", i, f(out[i]), want[i], bound[i]); }
    }
    double rms = std::sqrt(se / sw);
    if (rms > 1.0 / 256) { bad++; printf("rms %g\n", rms); }
    printf("%s E %d k %d H %d I %d T %d fav %d shun %d shared %d: tiles %d, worst %.3f of bound, rms %.2e, %s\n", path == 0 ? "gemv   " : path == 1 ? "tc     " : "gemv_tc", E, K, H, I, T, fav, shun, shared, nt[0], worst, rms, bad ? "FAIL" : "ok");
    fails += bad != 0;
  }
}
int main() {
  run(8, 2, 64, 32, 1, -1, -1, false, 1);
  run(8, 2, 64, 32, 3, -1, -1, true, 2);
  run(8, 2, 64, 32, 17, -1, 5, false, 3);
  run(8, 2, 64, 96, 40, 2, -1, true, 4);
  if (getenv("FULL")) {
    run(8, 2, 64, 32, 300, -1, -1, false, 5);
    run(16, 4, 128, 64, 100, -1, 3, false, 6);
    run(256, 8, 64, 96, 40, -1, 0, true, 7);
    run(256, 8, 128, 64, 70, 77, -1, false, 8);
  }
  printf("%s\n", fails ? "FAILED" : "all ok");
  return fails != 0;
}
