//! Randomised workloads (fixed seeds, bounded sizes): random pools,
//! budgets, thresholds, prompt and output lengths, arrivals and aborts.
//! Every request that is not aborted must get exactly the tokens of the
//! fake model run alone; the fake executor checks every row; everything is
//! released at the end.

mod common;

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

async fn one_workload(seed: u64) -> u64 {
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
    let s = start(config, geometry(num_slots, num_pages, page_size));
    let max_model_len = s.handle.max_model_len().unwrap();

    let mut tasks = Vec::new();
    for i in 0..24u32 {
        let prompt_len = 1 + rng.below(max_model_len / 2);
        let max_tokens = 1 + rng.below(max_model_len - prompt_len);
        let mut r = request(prompt(i % 60, prompt_len), max_tokens, rng.next());
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
                    Event::Failed(why) => panic!("request failed: {why}"),
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
    wait_released(&s.handle).preemptions
}

#[tokio::test]
async fn random_workloads_match_the_model_run_alone() {
    let mut preemptions = 0;
    for seed in 0..20 {
        preemptions += one_workload(seed).await;
    }
    // The small pools must have exercised preemption.
    assert!(preemptions > 0);
}
