//! Which linear-layer calls leave cuBLAS for our skinny kernels: the
//! measured rule table ([`SKINNY_RULES`]) and its lookup ([`route_in`]),
//! which [`crate::Gemm::linear`] follows.

use crate::gemm::linear::GemmShape;
use crate::gemm::skinny::SkinnyConfig;

/// One entry of the routing rule: calls of exactly this `(n, k)` with
/// `min_m <= m <= max_m` rows run on the skinny kernels with `config`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkinnyRule {
    pub n: usize,
    pub k: usize,
    pub min_m: usize,
    pub max_m: usize,
    pub config: SkinnyConfig,
}

/// A [`SkinnyRule`] in one line (the rule table's entries).
const fn rule(
    n: usize,
    k: usize,
    min_m: usize,
    max_m: usize,
    warps: u32,
    k_unroll: u32,
) -> SkinnyRule {
    SkinnyRule {
        n,
        k,
        min_m,
        max_m,
        config: SkinnyConfig { warps, k_unroll },
    }
}

/// Which calls leave cuBLAS for the skinny kernels: a (shape, row range)
/// is listed, with the configuration that was fastest there, only where the
/// skinny kernels beat cuBLAS at every measured m of the range (cuBLAS's
/// time including its split-K reduce kernels). Qwen3.5-4B and -35B-A3B
/// shapes only; anything else stays on cuBLAS. One configuration per shape for m <= 8
/// (the r1 kernels do the same work for every m up to 8, so m = 3, 5..7 run
/// as measured at 4 and 8) and one for 9..16 where it won at m = 16 (r2: the
/// same work for every m in 9..16). Measured with
/// `checks/gpu/skinny_harness.cu` at d98e9bf (the kernels and method of
/// `examples/skinny_bench.rs`: CUDA graphs of back-to-back calls over weight
/// copies larger than L2, median of 5): per-shape times in
/// docs/results/h200-2026-12-01/`skinny_harness-d98e9bf.jsonl`, the
/// per-step sums in docs/performance.md ("Kernels inside the forward").
/// The 35B-A3B rows: `skinny_bench --preset 35b-a3b` (the same method),
/// docs/results/h200-2026-12-03-s12/call3/`skinny_bench_35b.jsonl`.
pub const SKINNY_RULES: &[SkinnyRule] = &[
    // DeltaNet in_proj 2560 -> 12352: skinny at m <= 8 and at 9..16.
    rule(12352, 2560, 1, 8, 2, 8),
    rule(12352, 2560, 9, 16, 2, 4),
    // DeltaNet out_proj and attention o_proj 4096 -> 2560: both ranges.
    rule(2560, 4096, 1, 8, 8, 4),
    rule(2560, 4096, 9, 16, 8, 4),
    // Attention qkv 2560 -> 10240: m <= 8 (at m = 16 cuBLAS is faster).
    rule(10240, 2560, 1, 8, 4, 2),
    // MLP gate_up 2560 -> 18432: m <= 8, by a small margin at each of
    // m = 1, 2, 4, 8 (at m = 16 cuBLAS is faster).
    rule(18432, 2560, 1, 8, 8, 4),
    // MLP down 9216 -> 2560: m <= 8 (at m = 16 cuBLAS is faster).
    rule(2560, 9216, 1, 8, 8, 4),
    // lm_head 2560 -> 248320 (fp32 out): both ranges.
    rule(248320, 2560, 1, 8, 1, 2),
    rule(248320, 2560, 9, 16, 2, 4),
    // Qwen3.5-35B-A3B (hidden 2048). DeltaNet in_proj 2048 -> 12352.
    rule(12352, 2048, 1, 8, 4, 8),
    rule(12352, 2048, 9, 16, 2, 4),
    // DeltaNet out_proj and attention o_proj 4096 -> 2048.
    rule(2048, 4096, 1, 8, 16, 4),
    rule(2048, 4096, 9, 16, 16, 2),
    // Attention qkv 2048 -> 9216: m <= 8 (at m = 16 cuBLAS is faster).
    rule(9216, 2048, 1, 8, 8, 4),
    // The MoE router 2048 -> 256 experts, and with the shared expert's gate
    // as one more row (padded to 264, `MoeShape::router_width`), which the
    // model runs: at 264 the same configurations were the fastest again,
    // ahead of cuBLAS at both row ranges (`skinny_bench --preset 35b-a3b`;
    // measured: docs/results/2026-12-07-s13/README.md).
    rule(256, 2048, 1, 8, 8, 8),
    rule(256, 2048, 9, 16, 16, 4),
    rule(264, 2048, 1, 8, 8, 8),
    rule(264, 2048, 9, 16, 16, 4),
    // The shared expert's gate 2048 -> 1 alone (cuBLAS runs a dot product
    // and a reduction kernel for it).
    rule(1, 2048, 1, 8, 16, 4),
    rule(1, 2048, 9, 16, 16, 2),
    // The shared expert's gate_up 2048 -> 1024 and down 512 -> 2048.
    rule(1024, 2048, 1, 8, 8, 8),
    rule(1024, 2048, 9, 16, 16, 4),
    rule(2048, 512, 1, 8, 4, 4),
    rule(2048, 512, 9, 16, 4, 4),
    // lm_head 2048 -> 248320 (fp32 out): both ranges.
    rule(248320, 2048, 1, 8, 1, 2),
    rule(248320, 2048, 9, 16, 2, 4),
];

/// Where [`crate::Gemm::linear`] sends a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearRoute {
    Cublas,
    Skinny(SkinnyConfig),
}

/// The route of `shape` under `rules` (first match wins; none: cuBLAS).
pub fn route_in(rules: &[SkinnyRule], shape: GemmShape) -> LinearRoute {
    let GemmShape { m, n, k } = shape;
    rules
        .iter()
        .find(|r| r.n == n && r.k == k && (r.min_m..=r.max_m).contains(&m))
        .map_or(LinearRoute::Cublas, |r| LinearRoute::Skinny(r.config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::ops::Gemm;

    /// (n, k) of the 4B's linear layers.
    const QWEN35_4B_SHAPES: [(usize, usize); 6] = [
        (12352, 2560),
        (2560, 4096),
        (10240, 2560),
        (18432, 2560),
        (2560, 9216),
        (248320, 2560),
    ];

    #[test]
    fn measured_rule_covers_decode_rows_of_the_4b_and_nothing_else() {
        // Every 4B shape takes the skinny kernels at m <= 8; the kernels
        // must have each configuration the table names.
        for (n, k) in QWEN35_4B_SHAPES {
            for m in 1..=8 {
                let LinearRoute::Skinny(c) = Gemm::route(GemmShape::new(m, n, k)) else {
                    panic!("m={m} n={n} k={k} on cuBLAS");
                };
                c.check(m).unwrap();
            }
            // Prefill-sized calls always stay on cuBLAS.
            for m in [17, 64, 1024] {
                assert_eq!(
                    Gemm::route(GemmShape::new(m, n, k)),
                    LinearRoute::Cublas,
                    "m={m} n={n} k={k}"
                );
            }
        }
        // At 9..16 rows only where skinny won at 16.
        for (n, k, skinny) in [
            (12352, 2560, true),
            (2560, 4096, true),
            (248320, 2560, true),
            (10240, 2560, false),
            (18432, 2560, false),
            (2560, 9216, false),
        ] {
            for m in 9..=16 {
                let r = Gemm::route(GemmShape::new(m, n, k));
                assert_eq!(r != LinearRoute::Cublas, skinny, "m={m} n={n} k={k}: {r:?}");
                if let LinearRoute::Skinny(c) = r {
                    c.check(m).unwrap();
                }
            }
        }
        // Other shapes (another model's) stay on cuBLAS.
        assert_eq!(
            Gemm::route(GemmShape::new(1, 5120, 5120)),
            LinearRoute::Cublas
        );
        // The ranges of one shape do not overlap (first match would hide one).
        for (i, a) in SKINNY_RULES.iter().enumerate() {
            for b in &SKINNY_RULES[i + 1..] {
                let overlap = a.min_m <= b.max_m && b.min_m <= a.max_m;
                assert!(!(a.n == b.n && a.k == b.k && overlap), "{a:?} / {b:?}");
            }
        }
    }

    #[test]
    fn rule_matches_shape_and_row_range_first_entry_first() {
        let a = SkinnyConfig {
            warps: 4,
            k_unroll: 4,
        };
        let b = SkinnyConfig {
            warps: 8,
            k_unroll: 2,
        };
        let rules = [
            SkinnyRule {
                n: 2560,
                k: 9216,
                min_m: 1,
                max_m: 4,
                config: a,
            },
            SkinnyRule {
                n: 2560,
                k: 9216,
                min_m: 1,
                max_m: 8,
                config: b,
            },
        ];
        assert_eq!(
            route_in(&rules, GemmShape::new(1, 2560, 9216)),
            LinearRoute::Skinny(a)
        );
        assert_eq!(
            route_in(&rules, GemmShape::new(4, 2560, 9216)),
            LinearRoute::Skinny(a)
        );
        assert_eq!(
            route_in(&rules, GemmShape::new(5, 2560, 9216)),
            LinearRoute::Skinny(b)
        );
        assert_eq!(
            route_in(&rules, GemmShape::new(9, 2560, 9216)),
            LinearRoute::Cublas
        );
        assert_eq!(
            route_in(&rules, GemmShape::new(1, 2560, 4096)),
            LinearRoute::Cublas
        );
        assert_eq!(
            route_in(&rules, GemmShape::new(1, 9216, 2560)),
            LinearRoute::Cublas
        );
    }
}
