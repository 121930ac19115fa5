//! Compares the admission policies on the scheduler alone: closed-loop
//! clients on a page pool of a measured set-up, every step planned and
//! committed as the engine thread would, the model replaced by a step-time
//! model. Prints, per scenario and policy, the preemptions, the tokens
//! computed again, the steps and the modelled throughput and TTFT.
//!
//! The step-time model fits the Qwen3.5-35B-A3B figures of the H100 side
//! by side in docs/performance.md (ITL at c = 32 and 64, TTFT of a lone
//! 1k prompt): `FIXED_MS` per step, `PER_DECODE_MS` per decode row and
//! `PER_PREFILL_TOKEN_MS` per prefill token. It ranks policies; absolute
//! times come from the GPU only.
//!
//! Run: `cargo run --release -p gdn-engine --example admission_sim`

use std::collections::VecDeque;

use engine::executor::{CacheGeometry, SampledToken};
use engine::prefix_cache::PrefixCacheConfig;
use engine::request::{RequestId, SamplingParams, StopParams};
use engine::scheduler::{Scheduler, SchedulerConfig};
use engine::{AdmissionPolicy, ArenaGeometry};

const FIXED_MS: f64 = 15.0;
const PER_DECODE_MS: f64 = 0.25;
const PER_PREFILL_TOKEN_MS: f64 = 0.06;
const EOS: u32 = 0;

/// A measured set-up: the pool, the limits and the load.
struct Scenario {
    name: &'static str,
    num_pages: usize,
    page_size: usize,
    max_num_seqs: usize,
    max_model_len: usize,
    budget: usize,
    concurrency: usize,
    requests: usize,
    prompt_len: usize,
    /// Output tokens of request `i` (it stops there).
    output_len: fn(usize) -> usize,
    /// `max_tokens` is the output length (a benchmark); else the client
    /// sets none and the request ends at EOS.
    max_tokens_set: bool,
    /// The pages and slots in one arena instead (`num_pages` is then the
    /// page ids).
    arena: Option<ArenaGeometry>,
}

#[derive(Default)]
struct Outcome {
    preemptions: u64,
    recomputed: u64,
    steps: u64,
    ms: f64,
    output_tokens: usize,
    ttft_ms: Vec<f64>,
}

fn run(s: &Scenario, policy: AdmissionPolicy) -> Outcome {
    let geometry = CacheGeometry {
        num_slots: s.max_num_seqs,
        num_pages: s.num_pages,
        page_size: s.page_size,
        vocab_size: 64,
        max_model_len: s.max_model_len,
    };
    let config = SchedulerConfig {
        max_num_batched_tokens: s.budget,
        max_num_seqs: s.max_num_seqs,
        max_model_len: s.max_model_len.min(s.num_pages * s.page_size),
        long_prefill_token_threshold: 0,
        eos_token_ids: vec![EOS],
        prefix_cache: PrefixCacheConfig::default(),
        row_snapshots: 0,
        admission: policy,
    };
    let mut sched = Scheduler::with_arena(config, &geometry, s.arena);
    let mut out = Outcome::default();
    let mut next = 0;
    let mut arrival = vec![0.0; s.requests];
    let mut first_token: Vec<Option<f64>> = vec![None; s.requests];
    let mut produced = vec![0usize; s.requests];
    let submit = |sched: &mut Scheduler, i: usize| {
        let prompt = (0..s.prompt_len)
            .map(|t| 1 + ((t * 7 + i) % 50) as u32)
            .collect();
        let want = (s.output_len)(i);
        let stop = StopParams {
            max_tokens: if s.max_tokens_set {
                want
            } else {
                s.max_model_len - s.prompt_len
            },
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            ignore_eos: s.max_tokens_set,
        };
        sched.add(
            RequestId(i as u64),
            prompt,
            SamplingParams::default(),
            stop,
            i as u64,
        );
    };
    let mut open: VecDeque<usize> = VecDeque::new();
    while next < s.requests.min(s.concurrency) {
        submit(&mut sched, next);
        open.push_back(next);
        next += 1;
    }
    while !sched.is_idle() {
        let plan = sched.schedule();
        assert!(!plan.rows.is_empty(), "{}: empty plan", s.name);
        let decodes = plan.rows.iter().filter(|r| r.len == 1).count();
        let prefill: usize = plan.rows.iter().filter(|r| r.len > 1).map(|r| r.len).sum();
        out.ms += FIXED_MS + PER_DECODE_MS * decodes as f64 + PER_PREFILL_TOKEN_MS * prefill as f64;
        out.steps += 1;
        let sampled = plan
            .rows
            .iter()
            .filter(|r| r.sample)
            .map(|r| {
                let i = r.id.0 as usize;
                // The token that ends the request where its client wants.
                let last = produced[i] + 1 == (s.output_len)(i);
                SampledToken {
                    token: if last && !s.max_tokens_set { EOS } else { 1 },
                    logprob: 0.0,
                    top_logprobs: Vec::new(),
                }
            })
            .collect();
        for outcome in sched.commit(&plan, sampled) {
            let i = outcome.id.0 as usize;
            produced[i] = outcome.output_len;
            first_token[i].get_or_insert(out.ms);
            if outcome.finish.is_some() {
                out.output_tokens += outcome.output_len;
                if next < s.requests {
                    arrival[next] = out.ms;
                    submit(&mut sched, next);
                    next += 1;
                }
            }
        }
    }
    out.preemptions = sched.preemptions();
    out.recomputed = sched.recomputed_tokens();
    out.ttft_ms = first_token
        .iter()
        .zip(&arrival)
        .map(|(t, a)| t.expect("every request produced a token") - a)
        .collect();
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // The 35B-A3B on one H100 at 0.95: 3,871 pages of 64 after 64 slots.
    let h100_35b = |concurrency, name| Scenario {
        name,
        num_pages: 3871,
        page_size: 64,
        max_num_seqs: 64,
        max_model_len: 9216,
        budget: 8192,
        concurrency,
        requests: concurrency,
        prompt_len: 8192,
        output_len: |_| 256,
        max_tokens_set: true,
        arena: None,
    };
    // The same memory as one arena (the GPU executor's layout): 3,871 pages
    // of 1.25 MiB and 64 slots of 61 MiB less the conv state kept out of
    // it, in 2 MiB chunks; 32 pages a group for 20 chunks, a slot for 30.
    let h100_35b_arena = |concurrency, name| Scenario {
        name,
        num_pages: 4326 / 20 * 32,
        arena: Some(ArenaGeometry {
            num_chunks: 4326,
            chunk_bytes: 2 << 20,
            pages_per_group: 32,
            chunks_per_page_group: 20,
            slots_per_group: 1,
            chunks_per_slot_group: 30,
        }),
        ..h100_35b(concurrency, name)
    };
    let scenarios = [
        // The CPU demo of the issue: 64 pages of 64, 16 at a time.
        Scenario {
            name: "cpu-demo 1000/64 c=16",
            num_pages: 64,
            page_size: 64,
            max_num_seqs: 16,
            max_model_len: 4096,
            budget: 8192,
            concurrency: 16,
            requests: 32,
            prompt_len: 1000,
            output_len: |_| 64,
            max_tokens_set: true,
            arena: None,
        },
        h100_35b(32, "35b-a3b h100 8192/256 c=32"),
        h100_35b(64, "35b-a3b h100 8192/256 c=64"),
        h100_35b_arena(32, "35b-a3b h100 arena 8192/256 c=32"),
        h100_35b_arena(64, "35b-a3b h100 arena 8192/256 c=64"),
        // Chat clients that set no max_tokens: outputs of 16-1,000 tokens
        // end at EOS, 2k prompts, 256 requests 64 at a time.
        Scenario {
            name: "35b-a3b h100 chat 2048/EOS c=64",
            num_pages: 3871,
            page_size: 64,
            max_num_seqs: 64,
            max_model_len: 9216,
            budget: 8192,
            concurrency: 64,
            requests: 256,
            prompt_len: 2048,
            output_len: |i| 16 + (i * 397) % 985,
            max_tokens_set: false,
            arena: None,
        },
    ];
    println!(
        "| scenario | policy | preemptions | recomputed tokens | steps | modelled out tok/s | modelled TTFT p50 (ms) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for s in &scenarios {
        for policy in [
            AdmissionPolicy::Watermark,
            AdmissionPolicy::Reserve,
            AdmissionPolicy::NewTokenRatio,
        ] {
            let o = run(s, policy);
            println!(
                "| {} | {} | {} | {} | {} | {:.0} | {:.0} |",
                s.name,
                policy.name(),
                o.preemptions,
                o.recomputed,
                o.steps,
                o.output_tokens as f64 / (o.ms / 1000.0),
                median(o.ttft_ms)
            );
        }
    }
}
