//! The MLP weights that `qwen35_bench`'s rooflines count, dense or MoE:
//! the parameters one token multiplies by (prefill FLOPs) and the
//! parameters one decode step of a batch reads (the memory floor).
//!
//! A dense layer's MLP is read whole by every step. A MoE layer's step
//! reads the router, the shared expert with its gate, and only the routed
//! experts some row of the batch picked; the benchmark does not see the
//! routing, so it counts the expected number of distinct experts under
//! uniform routing ([`expected_experts_touched`]). The benchmark's random
//! weights route nearly uniformly (rows with different tokens). A trained
//! router is less even and touches fewer: for per-expert pick rates that
//! sum to `k`, the expected count is largest when they are equal.

use qwen35::Config;

/// Expected distinct experts touched by `tokens` tokens that each pick
/// `top_k` distinct experts of `experts`, uniformly and independently.
///
/// An expert escapes one token's pick with probability
/// `C(E-1, k) / C(E, k) = 1 - k/E` (exactly), and all `B` tokens' with
/// `(1 - k/E)^B`, so the expectation is `E * (1 - (1 - k/E)^B)`: exact for
/// the uniform model, not an approximation of it (1 token: `k`; many: `E`).
pub fn expected_experts_touched(experts: usize, top_k: usize, tokens: usize) -> f64 {
    assert!(
        top_k <= experts && experts > 0,
        "top-{top_k} of {experts} experts"
    );
    let e = experts as f64;
    e * (1.0 - (1.0 - top_k as f64 / e).powf(tokens as f64))
}

/// One decoder layer's MLP matrices, in parameters, split by how a decode
/// step reads them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MlpParams {
    /// Read by every step whatever the routing: a dense MLP's gate, up and
    /// down (`3 H I`); a MoE layer's router `[E, H]`, shared expert
    /// (`3 H Is`) and shared-expert gate `[1, H]`.
    pub always: usize,
    /// One routed expert's gate, up and down (`3 H I`); 0 when dense.
    pub per_expert: usize,
    /// Routed experts and how many each token picks; (0, 0) when dense.
    pub experts: usize,
    pub top_k: usize,
}

impl MlpParams {
    pub fn of(c: &Config) -> MlpParams {
        let h = c.hidden_size;
        match c.moe {
            None => MlpParams {
                always: 3 * h * c.intermediate_size,
                per_expert: 0,
                experts: 0,
                top_k: 0,
            },
            Some(m) => MlpParams {
                always: m.num_experts * h + 3 * h * m.shared_expert_intermediate_size + h,
                per_expert: 3 * h * m.moe_intermediate_size,
                experts: m.num_experts,
                top_k: m.num_experts_per_tok,
            },
        }
    }

    /// Parameters one token multiplies by (its `top_k` experts and the
    /// parts every token runs): twice this is its FLOPs.
    pub fn per_token(&self) -> usize {
        self.always + self.top_k * self.per_expert
    }

    /// Expected distinct routed experts a decode step of `batch` rows
    /// touches; 0 for a dense MLP.
    pub fn experts_touched(&self, batch: usize) -> f64 {
        if self.experts == 0 {
            return 0.0;
        }
        expected_experts_touched(self.experts, self.top_k, batch)
    }

    /// Routed-expert parameters a decode step of `batch` rows reads
    /// (expected); 0 for a dense MLP, whose reads are all in `always`.
    pub fn routed_read(&self, batch: usize) -> f64 {
        self.experts_touched(batch) * self.per_expert as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every way `tokens` tokens can each pick `k` of `e` experts, and the
    /// mean count of distinct experts over them (all equally likely).
    fn brute_force_touched(e: usize, k: usize, tokens: usize) -> f64 {
        let picks: Vec<u32> = (0u32..1 << e)
            .filter(|m| m.count_ones() as usize == k)
            .collect();
        let mut total = 0u64;
        let mut outcomes = 0u64;
        let mut idx = vec![0usize; tokens];
        loop {
            let union = idx.iter().fold(0u32, |u, &i| u | picks[i]);
            total += u64::from(union.count_ones());
            outcomes += 1;
            // Next combination of picks, odometer style.
            let Some(t) = idx.iter().position(|&i| i + 1 < picks.len()) else {
                break;
            };
            idx[t] += 1;
            idx[..t].iter_mut().for_each(|i| *i = 0);
        }
        total as f64 / outcomes as f64
    }

    #[test]
    fn expected_touched_matches_a_brute_force_count() {
        for (e, k, tokens) in [
            (6, 2, 1),
            (6, 2, 3),
            (7, 3, 2),
            (8, 2, 4),
            (5, 5, 2),
            (9, 1, 3),
        ] {
            let want = brute_force_touched(e, k, tokens);
            let got = expected_experts_touched(e, k, tokens);
            assert!(
                (got - want).abs() < 1e-9,
                "E {e}, top-{k}, {tokens} tokens: formula {got}, brute force {want}"
            );
        }
    }

    #[test]
    fn expected_touched_at_the_35b_a3b_shape() {
        // One token reads exactly its 8 experts; a big batch nearly all 256.
        assert!((expected_experts_touched(256, 8, 1) - 8.0).abs() < 1e-9);
        let b128 = expected_experts_touched(256, 8, 128);
        assert!(b128 > 250.0 && b128 < 256.0, "{b128}");
    }

    #[test]
    fn mlp_params_of_the_benchmark_configs() {
        let dense = Config::from_json(qwen35::config::QWEN35_4B_TEXT).unwrap();
        let d = MlpParams::of(&dense);
        assert_eq!(
            (d.always, d.per_token()),
            (3 * 2560 * 9216, 3 * 2560 * 9216)
        );
        assert_eq!((d.experts_touched(64), d.routed_read(64)), (0.0, 0.0));
        let moe = Config::from_json(qwen35::config::QWEN35_35B_A3B_TEXT).unwrap();
        let m = MlpParams::of(&moe);
        let (h, expert) = (2048, 3 * 2048 * 512);
        assert_eq!(m.always, 256 * h + expert + h);
        assert_eq!(m.per_token(), m.always + 8 * expert);
        assert!((m.routed_read(1) - 8.0 * expert as f64).abs() < 1e-3);
    }
}
