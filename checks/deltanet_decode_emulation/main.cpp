// Runs the DeltaNet kernels of crates/gdn-kernels/cuda/model_kernels.cu
// on the CPU through cuda_shim.h: the fused decode (gdn_decode_fused_s{4,2,1})
// against the unfused chain (gdn_conv_prep, gdn_conv_state_update,
// gdn_decode_step, gated_rmsnorm_bf16) over several steps of random states,
// comparing output, recurrent state and conv state bit for bit (same source
// arithmetic, no FMA contraction on the host) and that the arrival counters
// come back to zero. Blocks run one after another, so this checks the
// kernels' logic and indexing, not the device's concurrency or rounding.
// It includes model_kernels.cu's common and DeltaNet parts only (the
// attention parts need the GPU's headers).
#include "cuda_shim.h"
#include <cstdio>
#include "model_common.cuh"
#include "model_deltanet_conv.cuh"
#include "model_deltanet_decode.cuh"
#include <random>
#include <cstdlib>
#include <type_traits>
typedef __nv_bfloat16 bf16;
static std::mt19937 rng(7);
static float U(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }
static bf16 B(float a, float b) { return __float2bfloat16(U(a, b)); }

// DUMP=<file>: every case's inputs and the fused kernel's results, for the
// GPU test's reference checks (gpu_deltanet_decode.rs,
// `emulated_kernel_passes_the_reference_checks`): per case u32 hk, hv, kw,
// n, steps, i32 seq_slot[n], f32 conv_w, a_log, dt_bias, norm_w, then per
// step f32 proj, conv state, recurrent state (every slot), out, conv state,
// recurrent state after the step.
static FILE* g_dump;
template <class T> static void put(const std::vector<T>& v) {
  for (const T& x : v) {
    float f;
    if constexpr (std::is_same_v<T, bf16>) f = __bfloat162float(x); else f = (float)x;
    fwrite(&f, 4, 1, g_dump);
  }
}

int run(int hk, int hv, int kw, int n, int splits, int steps) {
  const int D = 128, C = (2 * hk + hv) * D, taps = kw - 1;
  const int ld = C + hv * D + 2 * hv, col_z = C, col_b = C + hv * D, col_a = col_b + hv;
  const int slots = n + 2;
  std::vector<int32_t> seq_slot(n), tok_seq(n), cu(n + 1);
  for (int s = 0; s < n; ++s) { seq_slot[s] = n - s; tok_seq[s] = s; cu[s] = s; }
  cu[n] = n;
  std::vector<float> conv_w(C * kw), a_log(hv), dt_bias(hv), norm_w(D);
  for (auto& x : conv_w) x = U(-.6f, .6f);
  for (auto& x : a_log) x = U(-1.5f, 1.f);
  for (auto& x : dt_bias) x = U(-1.f, 1.f);
  for (auto& x : norm_w) x = U(.5f, 1.5f);
  std::vector<bf16> cs1((size_t)slots * taps * C); for (auto& x : cs1) x = B(-2, 2);
  std::vector<float> st1((size_t)slots * hv * D * D); for (auto& x : st1) x = U(-.5f, .5f);
  auto cs2 = cs1; auto st2 = st1;
  std::vector<unsigned> arrivals(n * hk, 0);
  if (g_dump) {
    const uint32_t head[5] = {(uint32_t)hk, (uint32_t)hv, (uint32_t)kw, (uint32_t)n, (uint32_t)steps};
    fwrite(head, 4, 5, g_dump);
    fwrite(seq_slot.data(), 4, n, g_dump);
    put(conv_w); put(a_log); put(dt_bias); put(norm_w);
  }
  int bad = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<bf16> proj((size_t)n * ld); for (auto& x : proj) x = B(-2, 2);
    if (g_dump) { put(proj); put(cs2); put(st2); }
    // Unfused.
    std::vector<bf16> q(n * hk * D), k(n * hk * D), v(n * hv * D), core(n * hv * D), out1(n * hv * D), out2(n * hv * D);
    std::vector<float> alpha(n * hv), beta(n * hv);
    launch({(unsigned)((n * (2 * hk + hv) + 7) / 8), 1, 1}, 256, [&] {
      gdn_conv_prep(q.data(), k.data(), v.data(), alpha.data(), beta.data(), proj.data(), ld, col_b, col_a,
                    conv_w.data(), cs1.data(), tok_seq.data(), cu.data(), seq_slot.data(), a_log.data(), dt_bias.data(), hk, hv, kw, n, 1); });
    launch({(unsigned)n, (unsigned)((C + 255) / 256), 1}, 256, [&] {
      gdn_conv_state_update(cs1.data(), proj.data(), ld, cu.data(), seq_slot.data(), C, kw); });
    launch({(unsigned)hv, (unsigned)n, 4}, 256, [&] {
      gdn_decode_step(core.data(), st1.data(), seq_slot.data(), q.data(), k.data(), v.data(), alpha.data(), beta.data(), hk, hv, 1.f / std::sqrt(128.f)); });
    launch({(unsigned)((n * hv + 7) / 8), 1, 1}, 256, [&] {
      gated_rmsnorm_bf16(out1.data(), core.data(), proj.data(), ld, col_z, norm_w.data(), n * hv, hv, 1e-6f); });
    // Fused.
    launch({(unsigned)hv, (unsigned)n, (unsigned)splits}, 256, [&] {
      auto f = splits == 4 ? gdn_decode_fused_s4 : splits == 2 ? gdn_decode_fused_s2 : gdn_decode_fused_s1;
      f(out2.data(), st2.data(), cs2.data(), arrivals.data(), proj.data(), ld, col_z, col_b, col_a, conv_w.data(),
        a_log.data(), dt_bias.data(), norm_w.data(), seq_slot.data(), 0, hk, hv, kw, 1.f / std::sqrt(128.f), 1e-6f); });
    if (g_dump) { put(out2); put(cs2); put(st2); }
    int d_out = 0, d_st = 0, d_cs = 0, d_arr = 0;
    for (size_t i = 0; i < out1.size(); ++i) d_out += out1[i].bits != out2[i].bits;
    for (size_t i = 0; i < st1.size(); ++i) d_st += memcmp(&st1[i], &st2[i], 4) != 0;
    for (size_t i = 0; i < cs1.size(); ++i) d_cs += cs1[i].bits != cs2[i].bits;
    for (auto a : arrivals) d_arr += a != 0;
    int nonzero = 0; for (auto& o : out2) nonzero += o.bits != 0;
    printf("hk %d hv %d kw %d n %d splits %d step %d: differing out %d, state %d, conv %d, counters left %d (nonzero outputs %d/%zu)\n",
           hk, hv, kw, n, splits, step, d_out, d_st, d_cs, d_arr, nonzero, out2.size());
    bad += d_out + d_st + d_cs + d_arr;
  }
  return bad;
}
// gdn_conv_prep over a varlen batch of chunks (some shorter than the taps,
// so their taps read the conv state) at `per_warp` tokens a warp, against a
// plain per-token loop with the kernel's arithmetic in the kernel's order
// (taps oldest first; the L2 norm's butterfly over each 32 channels, then
// (q0 + q2) + (q1 + q3) over the quarters): q, k, v, alpha, beta bit for bit.
// `k4`: gdn_conv_prep_k4 (kw == 4), else the general gdn_conv_prep.
int run_prefill(int hk, int hv, int kw, const std::vector<int>& lens, int per_warp, bool k4) {
  const int D = 128, C = (2 * hk + hv) * D, taps = kw - 1, n = (int)lens.size();
  const int ld = C + hv * D + 2 * hv, col_b = C + hv * D, col_a = col_b + hv;
  std::vector<int32_t> seq_slot(n), cu(n + 1, 0), tok_seq;
  for (int s = 0; s < n; ++s) {
    seq_slot[s] = (s * 5 + 3) % (n + 2);
    cu[s + 1] = cu[s] + lens[s];
    for (int i = 0; i < lens[s]; ++i) tok_seq.push_back(s);
  }
  const int T = cu[n];
  std::vector<float> conv_w(C * kw), a_log(hv), dt_bias(hv);
  for (auto& x : conv_w) x = U(-.6f, .6f);
  for (auto& x : a_log) x = U(-1.5f, 1.f);
  for (auto& x : dt_bias) x = U(-1.f, 1.f);
  std::vector<bf16> cs((size_t)(n + 2) * taps * C); for (auto& x : cs) x = B(-2, 2);
  std::vector<bf16> proj((size_t)T * ld); for (auto& x : proj) x = B(-2, 2);
  std::vector<bf16> q(T * hk * D), k(T * hk * D), v(T * hv * D);
  std::vector<float> alpha(T * hv), beta(T * hv);
  const int warps = (T + per_warp - 1) / per_warp * (2 * hk + hv);
  const auto kernel = k4 ? gdn_conv_prep_k4 : gdn_conv_prep;
  launch({(unsigned)((warps + 7) / 8), 1, 1}, 256, [&] {
    kernel(q.data(), k.data(), v.data(), alpha.data(), beta.data(), proj.data(), ld, col_b, col_a,
                  conv_w.data(), cs.data(), tok_seq.data(), cu.data(), seq_slot.data(), a_log.data(), dt_bias.data(),
                  hk, hv, kw, T, per_warp); });
  auto r = [](float x) { return __bfloat162float(__float2bfloat16(x)); };
  int bad = 0;
  for (int t = 0; t < T; ++t) {
    const int s = tok_seq[t], i = t - cu[s];
    std::vector<float> x(C);
    for (int c = 0; c < C; ++c) {
      float acc = 0.f;
      for (int j = 0; j < kw; ++j) {
        const int src = i - taps + j;
        const bf16 in = src >= 0 ? proj[(size_t)(cu[s] + src) * ld + c]
                                 : cs[((size_t)seq_slot[s] * taps + (taps + src)) * C + c];
        acc += conv_w[c * kw + j] * __bfloat162float(in);
      }
      x[c] = r(acc / (1.f + std::exp(-acc)));
    }
    for (int g = 0; g < 2 * hk + hv; ++g) {
      const float* xg = &x[g * D];
      float scale = 1.f;
      if (g < 2 * hk) {
        float quarter[4];
        for (int qq = 0; qq < 4; ++qq) {
          float ss[4];
          for (int e = 0; e < 4; ++e) {
            float a[8];
            for (int l = 0; l < 8; ++l) a[l] = xg[32 * qq + 4 * l + e] * xg[32 * qq + 4 * l + e];
            ss[e] = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
          }
          quarter[qq] = (ss[0] + ss[2]) + (ss[1] + ss[3]);
        }
        scale = rsqrtf((quarter[0] + quarter[2]) + (quarter[1] + quarter[3]) + 1e-6f);
      }
      bf16* dst = g < hk ? &q[((size_t)t * hk + g) * D]
                : g < 2 * hk ? &k[((size_t)t * hk + g - hk) * D] : &v[((size_t)t * hv + g - 2 * hk) * D];
      for (int c = 0; c < D; ++c) bad += dst[c].bits != __float2bfloat16(g < 2 * hk ? xg[c] * scale : xg[c]).bits;
    }
    for (int h = 0; h < hv; ++h) {
      const float b = __bfloat162float(proj[(size_t)t * ld + col_b + h]);
      const float a = __bfloat162float(proj[(size_t)t * ld + col_a + h]) + dt_bias[h];
      const float softplus = a > 20.f ? a : std::log1p(std::exp(a));
      const float want_beta = r(1.f / (1.f + std::exp(-b)));
      bad += memcmp(&beta[t * hv + h], &want_beta, 4) != 0;
      const float want_alpha = std::exp(-std::exp(a_log[h]) * softplus);
      bad += memcmp(&alpha[t * hv + h], &want_alpha, 4) != 0;
    }
  }
  printf("prefill conv%s hk %d hv %d kw %d, %d chunks (%d tokens), %d a warp: differing values %d\n", k4 ? " (k4)" : "",
         hk, hv, kw, n, T, per_warp, bad);
  return bad;
}
int main() {
  if (const char* p = getenv("DUMP")) g_dump = fopen(p, "wb");
  int bad = 0;
  bad += run(2, 4, 4, 3, 4, 3);
  bad += run(2, 4, 4, 2, 2, 2);
  bad += run(1, 3, 9, 2, 1, 2);
  bad += run(2, 6, 2, 2, 4, 2);
  // 131: whole 32-token warps past the taps (gdn_conv_prep_k4's steady path)
  // and a short last one.
  const std::vector<int> lens = {1, 2, 37, 3, 5, 70, 131};
  for (bool k4 : {false, true})
    for (int per_warp : {1, 3, 8, 32}) bad += run_prefill(2, 4, 4, lens, per_warp, k4);
  bad += run_prefill(2, 6, 2, {33, 1, 2}, 32, false);
  bad += run_prefill(1, 3, 9, {4, 1, 19, 8}, 5, false);
  if (g_dump) fclose(g_dump);
  printf(bad ? "FAIL\n" : "all equal\n");
  return bad != 0;
}
