//! The accuracy gate for MoE models: [`crate::gate`]'s method and limits,
//! against the exact forward with its bf16-ambiguous routing fitted.
//!
//! Why the plain gate cannot judge a MoE forward: a router runs the k
//! experts of highest logit, and where logits at the top-k boundary are
//! nearly equal (a near-tie), bf16 rounding decides which expert runs. A
//! flipped expert moves that token's log-probs by O(1), and through the
//! later layers' attention and DeltaNet state it moves later tokens' too,
//! often past the gate's limits. The tiny fixtures' routers are full of
//! near-ties, so even an exact f32 forward fails the plain gate against
//! HF's bf16 goldens (HF's bf16 forward flipped some of them), and no rule
//! that drops positions near a near-tie keeps enough positions while
//! dropping every moved one: one flip can move positions far after it by
//! more than a nat. The measurements are in docs/qwen35.md, "MoE: the
//! fitted gate".
//!
//! What the gate does instead ([`fit_routing`]): it runs the exact f32
//! forward (qwen35's `CpuModel`, equal to HF's fp32 logits and routing)
//! token by token, and at every router with more than one top-k set that
//! bf16 may pick ([`NEAR_TIE`]) tries each, keeping the combination whose
//! log-probs at that token are closest to the target's (HF's goldens, or
//! the engine under test). A flip's own effect is O(1) and bf16 noise
//! O(0.01), so the target's choices stand out. That fitted exact forward
//! then plays the part the exact forward plays for dense models: fitted to
//! HF's goldens it must pass the plain gate against them (the floor), and
//! an engine must pass the plain gate against the exact forward fitted to
//! its own logits, and against HF's goldens wherever its fit and HF's
//! agree ([`gate`], [`Fitted::agreeing`]). The fit only ever chooses
//! between experts whose router logits bf16 cannot tell apart: a wrong
//! expert, weight, norm or state anywhere else still moves the logits past
//! the limits (qwen35's tests/bf16_golden_floor.rs shows routing bugs
//! failing and bf16-sized router errors passing).

use qwen35::{CpuModel, CpuState, RowLogits};

use crate::gate::{compare, consistency, log_softmax, topk, GateStats, MAX_P99_ABS, TOP_COMPARED};
use crate::TopK;

/// Router-logit gap that bf16 may overturn: a top-k set is a candidate
/// when each of its experts' logits exceeds each left-out expert's minus
/// this. The fixtures' router logits reach |3|, where a bf16 step is 2^-6,
/// so rounding the router's output alone moves a gap by up to 2^-6 (0.016)
/// before the bf16 residual stream feeding the router adds its own error;
/// the largest gap the fit overturns for HF's goldens stays below this on
/// every prompt (docs/qwen35.md, "MoE: the fitted gate"). A larger value
/// only tries more sets (an unflipped decision fits as kept): it cannot
/// hide a wrong expert whose logit is not within this of the boundary.
pub const NEAR_TIE: f32 = 0.05;

/// How far two fits' log-probs may differ at a position for it to count
/// as one both targets can be judged at ([`Fitted::agreeing`]): a tenth
/// of the gate's p99 limit, so the routing difference uses little of the
/// limits (about the exact forward's mean error against HF's goldens,
/// docs/qwen35.md).
pub const AGREE: f32 = MAX_P99_ABS / 10.0;

/// One routing decision the fit took from outside the exact top-k: at
/// `layer`, the token at `position` runs another candidate set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Flip {
    pub layer: usize,
    pub position: usize,
    /// The router-logit lead bf16 overturned: the best left-out expert's
    /// logit minus the lowest chosen one's, on the fitted forward's state
    /// (below [`NEAR_TIE`]).
    pub gap: f32,
}

/// The exact forward with its ambiguous routing fitted to a target.
pub struct Fitted {
    /// `[T][vocab]`
    pub logits: Vec<Vec<f32>>,
    /// The decisions fitted away from the exact top-k, in token order.
    pub flips: Vec<Flip>,
    /// Routers that had more than one candidate set.
    pub ambiguous: usize,
}

impl Fitted {
    /// The fitted logits as a target for [`compare`] (top 64 per position).
    pub fn top64(&self) -> TopK {
        self.logits.iter().map(|r| topk(r, 64)).unzip()
    }

    /// Positions where `self` and `other` (fits of the same tokens to two
    /// targets) agree: the same argmax, and each of `self`'s top-8 tokens'
    /// log-probs within [`AGREE`]. Where two targets took different sides
    /// of a near-tie, the positions past it that the difference reaches
    /// are not comparable; the rest are.
    pub fn agreeing(&self, other: &Fitted) -> Vec<usize> {
        assert_eq!(
            self.logits.len(),
            other.logits.len(),
            "fits of other tokens"
        );
        (0..self.logits.len())
            .filter(|&p| {
                let (a, b) = (&self.logits[p], &other.logits[p]);
                if a == b {
                    return true;
                }
                let (ids, lps) = topk(a, TOP_COMPARED);
                let theirs = log_softmax(b);
                ids[0] == topk(b, 1).0[0]
                    && ids
                        .iter()
                        .zip(&lps)
                        .all(|(&t, lp)| (theirs[t as usize] - lp).abs() <= AGREE)
            })
            .collect()
    }

    /// The largest [`Flip::gap`] (0 without flips).
    pub fn max_gap(&self) -> f32 {
        self.flips.iter().map(|f| f.gap).fold(0.0, f32::max)
    }
}

/// The top-k sets bf16 may pick from one router's `logits`: those whose
/// every expert's logit exceeds every left-out expert's minus
/// [`NEAR_TIE`], the exact top-k first. Such a set holds every expert at
/// least [`NEAR_TIE`] above the k-th logit and draws the rest from those
/// above the (k+1)-th minus [`NEAR_TIE`].
fn candidate_sets(logits: &[f32], k: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let (kth, next) = (logits[order[k - 1]], logits[order[k]]);
    let must = order
        .iter()
        .take_while(|&&e| logits[e] >= kth + NEAR_TIE)
        .count();
    let pool: Vec<usize> = order[must..]
        .iter()
        .copied()
        .take_while(|&e| logits[e] > next - NEAR_TIE)
        .collect();
    let mut sets = vec![];
    subsets(&pool, k - must, &mut vec![], &mut |chosen| {
        let set: Vec<usize> = order[..must].iter().chain(chosen).copied().collect();
        if gap(logits, &set) < NEAR_TIE {
            sets.push(set);
        }
    });
    // `subsets` goes in pool order: the exact top-k comes first.
    debug_assert_eq!(sets[0][..], order[..k]);
    sets
}

/// The best left-out logit minus the lowest chosen one (<= 0 for the
/// exact top-k).
fn gap(logits: &[f32], set: &[usize]) -> f32 {
    let low = set.iter().map(|&e| logits[e]).fold(f32::INFINITY, f32::min);
    let high_out = (0..logits.len())
        .filter(|e| !set.contains(e))
        .map(|e| logits[e])
        .fold(f32::NEG_INFINITY, f32::max);
    high_out - low
}

/// Calls `f` with every `n`-subset of `pool`, appended to `pick`, in
/// lexicographic order.
fn subsets(pool: &[usize], n: usize, pick: &mut Vec<usize>, f: &mut dyn FnMut(&[usize])) {
    if n == 0 {
        return f(pick);
    }
    for i in 0..=pool.len().saturating_sub(n) {
        pick.push(pool[i]);
        subsets(&pool[i + 1..], n - 1, pick, f);
        pick.pop();
    }
}

/// Makes `set` the router's top-k: every other logit at or above the
/// set's lowest drops below it (the chosen experts' renormalised weights
/// depend on their own logits only).
fn force(logits: &mut [f32], set: &[usize]) {
    let low = set.iter().map(|&e| logits[e]).fold(f32::INFINITY, f32::min);
    for (e, l) in logits.iter_mut().enumerate() {
        if !set.contains(&e) && *l >= low {
            *l = low - 1.0;
        }
    }
}

/// One token run on a copy of a state, the `j`-th ambiguous router met
/// taking candidate `choice[j]` (0, the exact top-k, past its end).
struct Run {
    row: Vec<f32>,
    state: CpuState,
    /// Per ambiguous router met: (layer, candidates, gap of the one taken).
    met: Vec<(usize, usize, f32)>,
}

fn run_token(model: &CpuModel, state: &CpuState, token: u32, k: usize, choice: &[usize]) -> Run {
    let mut state = state.clone();
    let mut met = vec![];
    let (mut rows, _) = model
        .forward_with_router_hook(&[token], &mut state, RowLogits::All, &mut |layer, _, l| {
            let sets = candidate_sets(l, k);
            if sets.len() > 1 {
                let set = &sets[choice.get(met.len()).copied().unwrap_or(0)];
                met.push((layer, sets.len(), gap(l, set)));
                force(l, set);
            }
        })
        .expect("a fixture token");
    Run {
        row: rows.remove(0),
        state,
        met,
    }
}

/// The experts each token of `model` (a MoE model) picks.
fn experts_per_token(model: &CpuModel) -> usize {
    model
        .config
        .moe
        .as_ref()
        .expect("a MoE model")
        .num_experts_per_tok
}

/// Per position of `tokens`, whether the exact forward meets a router
/// there with more than one top-k set bf16 may pick (its top-k boundary
/// margin below [`NEAR_TIE`]): where two bf16 runs of the same tokens may
/// route differently, and every position after it may differ too.
pub fn routing_near_ties(model: &CpuModel, tokens: &[u32]) -> Vec<bool> {
    let k = experts_per_token(model);
    let mut near = vec![false; tokens.len()];
    let mut state = model.new_state();
    model
        .forward_with_router_hook(tokens, &mut state, RowLogits::None, &mut |_, p, l| {
            near[p] |= candidate_sets(l, k).len() > 1;
        })
        .expect("fixture tokens");
    near
}

/// How far one logits row is from a target row, in the gate's terms.
fn distance(row: &[f32], ids: &[u32], lps: &[f32]) -> f32 {
    let s = compare(&[row.to_vec()], &[ids.to_vec()], &[lps.to_vec()]);
    s.max_regret + s.mean_abs
}

/// The exact forward of `tokens` (from an empty state) with every
/// ambiguous routing decision fitted to the target (`ids`/`lps`: a top-k
/// row per token, best first, as HF's goldens and [`topk`] give them).
/// Each token's choices are fitted jointly (every combination of its
/// routers' candidate sets), in token order, on the state the earlier
/// choices left.
pub fn fit_routing(
    model: &CpuModel,
    tokens: &[u32],
    (ids, lps): (&[Vec<u32>], &[Vec<f32>]),
) -> Fitted {
    assert_eq!(tokens.len(), ids.len(), "a target row per token");
    let k = experts_per_token(model);
    let mut state = model.new_state();
    let mut fitted = Fitted {
        logits: Vec::with_capacity(tokens.len()),
        flips: vec![],
        ambiguous: 0,
    };
    for (t, &token) in tokens.iter().enumerate() {
        // Depth-first over the choices (a later router's candidates depend
        // on the earlier routers' choices).
        let mut best: Option<(f32, Vec<usize>, Run)> = None;
        let mut todo = vec![vec![]];
        while let Some(choice) = todo.pop() {
            let run = run_token(model, &state, token, k, &choice);
            // This run took the exact top-k at every router past `choice`:
            // each of their other candidates is a branch.
            for (j, &(_, n, _)) in run.met.iter().enumerate().skip(choice.len()) {
                for c in 1..n {
                    let mut branch = choice.clone();
                    branch.resize(j, 0);
                    branch.push(c);
                    todo.push(branch);
                }
            }
            let d = distance(&run.row, &ids[t], &lps[t]);
            if best.as_ref().is_none_or(|b| d < b.0) {
                best = Some((d, choice, run));
            }
        }
        let (_, choice, run) = best.expect("one run at least");
        fitted.ambiguous += run.met.len();
        for (j, &(layer, _, gap)) in run.met.iter().enumerate() {
            if choice.get(j).is_some_and(|&c| c != 0) {
                fitted.flips.push(Flip {
                    layer,
                    position: t,
                    gap,
                });
            }
        }
        fitted.logits.push(run.row);
        state = run.state;
    }
    fitted
}

/// [`fit_routing`] to an engine's logits (`[T][vocab]`) for `tokens`.
pub fn fit_to_logits(model: &CpuModel, tokens: &[u32], logits: &[Vec<f32>]) -> Fitted {
    let (ids, lps): TopK = logits.iter().map(|r| topk(r, 64)).unzip();
    fit_routing(model, tokens, (&ids, &lps))
}

/// The rows of `rows` at `positions`.
fn pick<T: Clone>(rows: &[T], positions: &[usize]) -> Vec<T> {
    positions.iter().map(|&p| rows[p].clone()).collect()
}

/// The MoE gate of one engine run (see the module doc).
#[derive(Clone, Copy, Debug)]
pub struct MoeGate {
    /// The engine against the exact forward fitted to it.
    pub vs_fit: GateStats,
    /// The engine against HF's goldens where its fit and HF's agree.
    pub vs_hf: GateStats,
    /// Routing decisions the engine's fit took from outside the exact
    /// top-k, and the largest gap they overturned.
    pub flips: usize,
    pub max_gap: f32,
}

impl MoeGate {
    pub fn passes(&self) -> bool {
        self.vs_fit.passes() && self.vs_hf.passes()
    }
}

/// Gates an engine's `logits` for `tokens` against the exact forward
/// fitted to them, and against HF's `golden` (top-k rows of the same
/// positions) wherever that fit agrees with `hf_fit` (the exact forward
/// fitted to `golden`). Returns the engine's fit too (for [`consistent`]).
pub fn gate(
    model: &CpuModel,
    tokens: &[u32],
    logits: &[Vec<f32>],
    (golden, hf_fit): (&TopK, &Fitted),
) -> (MoeGate, Fitted) {
    let fit = fit_to_logits(model, tokens, logits);
    let (fi, fl) = fit.top64();
    let same = fit.agreeing(hf_fit);
    let vs_hf = compare(
        &pick(logits, &same),
        &pick(&golden.0, &same),
        &pick(&golden.1, &same),
    );
    let g = MoeGate {
        vs_fit: compare(logits, &fi, &fl),
        vs_hf,
        flips: fit.flips.len(),
        max_gap: fit.max_gap(),
    };
    (g, fit)
}

/// [`crate::gate::consistency`] of two engine runs of the same tokens,
/// over the positions where their fits agree (two runs may take
/// different sides of a near-tie; past it they need not agree).
pub fn consistent(a: (&[Vec<f32>], &Fitted), b: (&[Vec<f32>], &Fitted)) -> GateStats {
    let same = a.1.agreeing(b.1);
    consistency(&pick(a.0, &same), &pick(b.0, &same))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_the_exact_top_k_and_the_sets_within_the_near_tie() {
        // Top-2 of [2.0, 1.0, 0.99, 0.5, 0.97]: expert 0 is certain; 1, 2
        // and 4 lie within 0.05 of each other, 3 far below.
        let logits = [2.0, 1.0, 0.99, 0.5, 0.97];
        assert_eq!(
            candidate_sets(&logits, 2),
            vec![vec![0, 1], vec![0, 2], vec![0, 4]]
        );
        // No near-tie: the exact set only.
        assert_eq!(candidate_sets(&[2.0, 1.0, 0.5, 0.0], 2), vec![vec![0, 1]]);
        // A near-tie between the first two does not change the set.
        assert_eq!(candidate_sets(&[1.0, 0.99, 0.5, 0.0], 2), vec![vec![0, 1]]);
    }

    #[test]
    fn forcing_a_set_keeps_its_logits_and_ranks_it_first() {
        let mut logits = vec![2.0, 1.0, 0.99, 0.5];
        force(&mut logits, &[0, 2]);
        assert_eq!((logits[0], logits[2]), (2.0, 0.99));
        assert!(logits[1] < 0.99 && logits[3] == 0.5, "{logits:?}");
        assert!((gap(&[2.0, 1.0, 0.99, 0.5], &[0, 2]) - 0.01).abs() < 1e-6);
    }
}
