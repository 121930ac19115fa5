//! Randomised workloads (fixed seeds, bounded sizes): random pools,
//! budgets, thresholds, prompt and output lengths, arrivals and aborts.
//! Every request that is not aborted must get exactly the tokens of the
//! fake model run alone; the fake executor checks every row; everything is
//! released at the end.

use crate::common;

use std::time::Duration;

use common::*;
use engine::{Event, SamplingParams};

/// SplitMix64 (test-local randomness, independent of the engine's).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Runs one workload; with `cache`, the prefix cache is on and the prompts
/// share prefixes (three stems, cut at random lengths). Returns the
/// preemptions, the prompt tokens served from the cache, the branch
/// points set and the rows that took snapshots inside the step.
async fn one_workload(seed: u64, cache: bool) -> (u64, u64, u64, usize) {
    let mut rng = Rng(seed);
    let page_size = 1 + rng.below(8);
    let num_slots = 1 + rng.below(6);
    let max_len = 40 + rng.below(80);
    // From one lone sequence's worth of pages to plenty.
    let num_pages = max_len.div_ceil(page_size) + rng.below(3 * max_len / page_size);
    let max_num_seqs = 1 + rng.below(num_slots + 1);
    let mut config = config(max_num_seqs + rng.below(64), max_num_seqs);
    config.long_prefill_token_threshold = if rng.below(2) == 0 {
        0
    } else {
        1 + rng.below(16)
    };
    config.max_num_queued_reqs = 1000;
    let snapshots = 1 + rng.below(8);
    if cache {
        config.prefix_cache = engine::prefix_cache::PrefixCacheConfig {
            enabled: true,
            max_snapshots: snapshots,
            snapshot_after: vec![vec![5, 6]],
            snapshot_interval: rng.below(3) * (1 + rng.below(12)),
            snapshot_before_last_token: true,
            // Snapshots inside a step (any number, or one, per row) or at
            // chunk boundaries.
            in_step_snapshots: rng.below(3) > 0,
        };
    }
    let row_snapshots = if cache && rng.below(2) == 0 {
        1
    } else {
        usize::MAX
    };
    let s = start_with_row_snapshots(
        config,
        geometry(num_slots, num_pages, page_size),
        snapshots,
        row_snapshots,
    );
    let max_model_len = s.handle.max_model_len().unwrap();
    let stems: Vec<Vec<u32>> = (0..3)
        .map(|k| {
            (0..max_model_len as u32)
                .map(|i| 1 + (k * 11 + i * 7 + i * i * 3) % 63)
                .collect()
        })
        .collect();

    let mut tasks = Vec::new();
    for i in 0..24u32 {
        let prompt_len = 1 + rng.below(max_model_len / 2);
        let max_tokens = 1 + rng.below(max_model_len - prompt_len);
        let tokens = if cache {
            let stem = &stems[rng.below(3)];
            let shared = rng.below(prompt_len + 1);
            let mut p = stem[..shared].to_vec();
            p.extend(prompt(i % 60, prompt_len - shared));
            p
        } else {
            prompt(i % 60, prompt_len)
        };
        let mut r = request(tokens, max_tokens, rng.next());
        if rng.below(3) == 0 {
            r.sampling = SamplingParams {
                temperature: 0.0,
                repetition_penalty: 1.2,
                frequency_penalty: 0.4,
                seed: Some(0),
                ..SamplingParams::default()
            };
        }
        if rng.below(3) == 0 {
            r.stop.ignore_eos = false;
            r.stop.min_tokens = rng.below(max_tokens + 1);
        }
        // A quarter of the requests are dropped after a few tokens.
        let abort_after = (rng.below(4) == 0).then(|| rng.below(max_tokens));
        let stream = s.handle.submit(r.clone()).expect("accepted");
        let handle = s.handle.clone();
        tasks.push(tokio::spawn(async move {
            let mut stream = stream;
            let mut tokens = Vec::new();
            loop {
                if Some(tokens.len()) == abort_after {
                    return None; // drops the stream
                }
                match stream.next().await.expect("terminal event") {
                    Event::Token(t) => tokens.push(t.token),
                    Event::Finished { usage, .. } => {
                        assert_eq!(usage.completion_tokens, tokens.len());
                        return Some((r, tokens));
                    }
                    Event::Failed(why) => panic!("request failed: {why} ({:?})", handle.state()),
                }
            }
        }));
        if rng.below(4) == 0 {
            tokio::time::sleep(Duration::from_micros(rng.below(500) as u64)).await;
        }
    }
    for task in tasks {
        if let Some((r, tokens)) = task.await.unwrap() {
            assert_eq!(tokens, reference_tokens(&r, &[EOS]), "seed {seed}");
        }
    }
    assert!(
        s.control.violations().is_empty(),
        "seed {seed}: {:?}",
        s.control.violations()
    );
    let stats = wait_released(&s.handle);
    let cache = stats.prefix_cache.unwrap_or_default();
    let in_step = s
        .control
        .steps()
        .iter()
        .flatten()
        .filter(|row| !row.snapshots.is_empty())
        .count();
    (
        stats.preemptions,
        cache.hit_tokens,
        cache.branch_points,
        in_step,
    )
}

#[tokio::test]
async fn random_workloads_match_the_model_run_alone() {
    let mut preemptions = 0;
    for seed in 0..20 {
        preemptions += one_workload(seed, false).await.0;
    }
    // The small pools must have exercised preemption.
    assert!(preemptions > 0);
}

#[tokio::test]
async fn random_workloads_with_the_prefix_cache_match_the_model_run_alone() {
    let (mut preemptions, mut hits, mut branches, mut in_step) = (0, 0, 0, 0);
    for seed in 100..140 {
        let (p, h, b, i) = one_workload(seed, true).await;
        preemptions += p;
        hits += h;
        branches += b;
        in_step += i;
    }
    // Preemption, cache hits, branch points and snapshots inside a step
    // must have been exercised.
    assert!(
        preemptions > 0 && hits > 0 && branches > 0 && in_step > 0,
        "{preemptions} preemptions, {hits} hit tokens, {branches} branch points, {in_step} rows with in-step snapshots"
    );
}
