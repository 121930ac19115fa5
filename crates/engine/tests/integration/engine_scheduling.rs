//! The engine's scheduling seen from the executor: the fake records every
//! row and checks slots, pages and start positions.

use crate::common;

use std::collections::HashMap;

use common::*;
use engine::{AdmissionPolicy, FinishReason, SamplingParams};
use engine_testkit::collect;

#[tokio::test]
async fn budget_respected_fcfs_and_batching_does_not_change_tokens() {
    let budget = 16;
    let s = start(config(budget, 4), geometry(4, 64, 4));
    s.control.hold();
    let requests: Vec<_> = (0..10)
        .map(|i| {
            request(
                prompt(i, 3 + (i as usize * 11) % 40),
                4 + i as usize,
                7 + i as u64,
            )
        })
        .collect();
    let streams: Vec<_> = requests
        .iter()
        .map(|r| s.handle.submit(r.clone()).expect("accepted"))
        .collect();
    // Everything is queued before the first step runs.
    s.control.run_free();
    for (r, stream) in requests.iter().zip(streams) {
        let (tokens, end) = collect(stream).await;
        assert_eq!(tokens, reference_tokens(r, &[EOS]));
        finished_length(&end, r.prompt.len(), r.stop.max_tokens);
    }
    let steps = s.control.steps();
    for (i, step) in steps.iter().enumerate() {
        let tokens: usize = step.iter().map(|r| r.tokens.len()).sum();
        assert!(tokens <= budget, "step {i} ran {tokens} tokens > {budget}");
        assert!(
            step.len() <= 4,
            "step {i} ran {} rows > max_num_seqs",
            step.len()
        );
    }
    // FCFS: requests start in submission order.
    let mut started = Vec::new();
    for row in steps.iter().flatten() {
        if row.start == 0 && !started.contains(&row.tokens[0]) {
            started.push(row.tokens[0]);
        }
    }
    assert_eq!(started, (1..=10).collect::<Vec<u32>>());
    assert_clean(&s);
}

#[tokio::test]
async fn decodes_run_every_step_while_a_100k_prompt_prefills() {
    let page = 16;
    let mut config = config(1024, 4);
    config.long_prefill_token_threshold = 512;
    let s = start(config, geometry(4, 100_000 / page + 64, page));
    let short = request(prompt(0, 10), 300, 1);
    let long = request(prompt(1, 100_000), 2, 2);
    let behind = request(prompt(2, 12), 5, 3);
    // The short request is decoding when the long one arrives (steps are
    // held so that it does not run ahead meanwhile).
    s.control.hold();
    let mut short_stream = s.handle.submit(short.clone()).unwrap();
    s.control.release(1);
    let first = short_stream.next().await.unwrap();
    let long_stream = s.handle.submit(long.clone()).unwrap();
    let behind_stream = s.handle.submit(behind.clone()).unwrap();
    s.control.run_free();
    let (long_tokens, long_end) = collect(long_stream).await;
    let (behind_tokens, _) = collect(behind_stream).await;
    let (mut short_tokens, _) = collect(short_stream).await;
    match first {
        engine::Event::Token(t) => short_tokens.insert(0, t.token),
        other => panic!("{other:?}"),
    }
    assert_eq!(long_tokens, reference_tokens(&long, &[EOS]));
    finished_length(&long_end, 100_000, 2);
    assert_eq!(behind_tokens, reference_tokens(&behind, &[EOS]));
    assert_eq!(short_tokens, reference_tokens(&short, &[EOS]));

    let steps = s.control.steps();
    let short_slot = slot_of(&steps, 0).unwrap();
    let long_slot = slot_of(&steps, 1).unwrap();
    let behind_slot = slot_of(&steps, 2).unwrap();
    let chunk_steps: Vec<usize> = (0..steps.len())
        .filter(|&i| {
            steps[i]
                .iter()
                .any(|r| r.slot == long_slot && r.tokens.len() > 1)
        })
        .collect();
    assert_eq!(chunk_steps.len(), 100_000usize.div_ceil(512));
    for &i in &chunk_steps {
        assert!(
            steps[i]
                .iter()
                .any(|r| r.slot == short_slot && r.tokens.len() == 1),
            "step {i}: the decode was starved by the long prefill"
        );
    }
    // The request behind the long prompt started before its prefill ended.
    let behind_start = steps
        .iter()
        .position(|st| st.iter().any(|r| r.slot == behind_slot && r.start == 0))
        .unwrap();
    assert!(behind_start < *chunk_steps.last().unwrap());
    assert_clean(&s);
}

fn preemption_workload() -> Vec<engine::GenerateRequest> {
    let mut requests: Vec<_> = (0..4)
        .map(|i| request(prompt(i, 10 + i as usize), 20, 40 + i as u64))
        .collect();
    // Greedy with penalties: its continuation depends on the whole history.
    requests[2].sampling = SamplingParams {
        temperature: 0.0,
        repetition_penalty: 1.3,
        presence_penalty: 0.5,
        frequency_penalty: 0.3,
        seed: Some(0),
        ..SamplingParams::default()
    };
    requests
}

async fn run_all(s: &Started, requests: &[engine::GenerateRequest]) -> Vec<Vec<u32>> {
    let streams: Vec<_> = requests
        .iter()
        .map(|r| s.handle.submit(r.clone()).unwrap())
        .collect();
    let mut out = Vec::new();
    for (r, stream) in requests.iter().zip(streams) {
        let (tokens, end) = collect(stream).await;
        finished_length(&end, r.prompt.len(), r.stop.max_tokens);
        out.push(tokens);
    }
    out
}

#[tokio::test]
async fn preempted_requests_continue_exactly_as_unpreempted() {
    let requests = preemption_workload();
    // 12 pages of 4: room for one or two of the 30-position sequences;
    // the watermark admits both and preempts.
    let mut watermark = config(64, 4);
    watermark.admission = AdmissionPolicy::Watermark;
    let small = start(watermark, geometry(4, 12, 4));
    let preempted_run = run_all(&small, &requests).await;
    let stats = wait_released(&small.handle);
    assert!(
        stats.preemptions > 0,
        "the pool was meant to force preemption"
    );
    // Some request was recomputed: a start-0 row after its first token.
    let steps = small.control.steps();
    let mut starts: HashMap<u32, usize> = HashMap::new();
    for row in steps.iter().flatten().filter(|r| r.start == 0) {
        *starts.entry(row.tokens[0]).or_default() += 1;
    }
    assert!(
        starts.values().any(|&n| n > 1),
        "no recompute seen: {starts:?}"
    );
    assert_clean(&small);

    let big = start(config(64, 4), geometry(4, 64, 4));
    let plain_run = run_all(&big, &requests).await;
    assert_eq!(wait_released(&big.handle).preemptions, 0);
    assert_clean(&big);

    assert_eq!(preempted_run, plain_run);
    for (r, tokens) in requests.iter().zip(&preempted_run) {
        assert_eq!(tokens, &reference_tokens(r, &[EOS]));
    }
}

#[tokio::test]
async fn eos_stop_ids_min_tokens_and_logprobs() {
    let s = start(config(64, 8), geometry(8, 256, 4));
    let mut stopped_by_eos = 0;
    for seed in 0..8u64 {
        let mut r = request(prompt(seed as u32, 5), 150, seed);
        r.stop.ignore_eos = false;
        r.stop.min_tokens = if seed % 2 == 0 { 100 } else { 0 };
        r.stop.stop_token_ids = vec![5];
        r.sampling.logprobs = (seed == 3).then_some(3);
        let mut stream = s.handle.submit(r.clone()).unwrap();
        let mut tokens = Vec::new();
        let end = loop {
            match stream.next().await.unwrap() {
                engine::Event::Token(t) => {
                    if seed == 3 {
                        assert!(t.logprob.is_some());
                        assert_eq!(t.top_logprobs.len(), 3);
                    } else {
                        assert!(t.logprob.is_none() && t.top_logprobs.is_empty());
                    }
                    tokens.push(t.token)
                }
                other => break other,
            }
        };
        assert_eq!(tokens, reference_tokens(&r, &[EOS]));
        let banned_until = r.stop.min_tokens.min(tokens.len());
        assert!(!tokens[..banned_until].iter().any(|&t| t == EOS || t == 5));
        let last = *tokens.last().unwrap();
        match end {
            engine::Event::Finished {
                reason: FinishReason::Stop { token },
                usage,
            } => {
                assert!(token == EOS || token == 5);
                assert_eq!(token, last);
                assert_eq!(usage.completion_tokens, tokens.len());
                stopped_by_eos += 1;
            }
            engine::Event::Finished {
                reason: FinishReason::Length,
                ..
            } => {
                assert_eq!(tokens.len(), 150);
                assert!(last != EOS && last != 5);
            }
            other => panic!("{other:?}"),
        }
    }
    // With 2 of 64 ids ending a request, most of these end by a stop id.
    assert!(stopped_by_eos >= 4, "{stopped_by_eos}");
    assert_clean(&s);
}
