//! The admission policies under KV pressure, on the engine with the fake
//! executor: the CPU demo shape of `examples/admission_sim` (a page pool
//! that holds about four of sixteen concurrent requests, a lone request
//! always fits). For each policy every request completes with its full
//! output, the run ends within a bound (no livelock), the preemptions and
//! the recomputed tokens of `EngineStats` are asserted and agree with the
//! rows the fake executed and with the metrics, and the greedy outputs are
//! those of the same requests on a roomy pool (and of the fake model run
//! alone).

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use engine::{AdmissionPolicy, EngineStats, GenerateRequest, SamplingParams};
use engine_testkit::{collect, RowRecord};

/// The CPU demo shape: 64 pages of 64 positions, 16 running at most, a
/// budget of 8192, 32 requests of 1000 prompt tokens and 64 output tokens.
const PAGE: usize = 64;
const PRESSED_PAGES: usize = 64;
const MAX_NUM_SEQS: usize = 16;
const BUDGET: usize = 8192;
const REQUESTS: usize = 32;
const PROMPT: usize = 1000;
const OUTPUT: usize = 64;
/// Every request's whole length at once, and then some.
const ROOMY_PAGES: usize = REQUESTS * (PROMPT + OUTPUT).div_ceil(PAGE) + 16;
/// A run that has not ended by then is stuck.
const DEADLINE: Duration = Duration::from_secs(60);

/// Greedy requests; every fourth with penalties, so that its continuation
/// depends on the output it had before a preemption.
fn demo_requests() -> Vec<GenerateRequest> {
    (0..REQUESTS as u32)
        .map(|i| {
            let mut r = request(prompt(i, PROMPT), OUTPUT, 0);
            r.sampling = if i % 4 == 3 {
                SamplingParams {
                    temperature: 0.0,
                    repetition_penalty: 1.3,
                    presence_penalty: 0.5,
                    frequency_penalty: 0.3,
                    seed: Some(0),
                    ..SamplingParams::default()
                }
            } else {
                SamplingParams {
                    temperature: 0.0,
                    seed: Some(0),
                    ..SamplingParams::default()
                }
            };
            r
        })
        .collect()
}

struct Run {
    outputs: Vec<Vec<u32>>,
    stats: EngineStats,
    steps: Vec<Vec<RowRecord>>,
    metrics: String,
}

/// Runs `requests` on a pool of `num_pages`. The first request's step is
/// held until the others are queued, so the run is the same every time.
async fn run(policy: AdmissionPolicy, num_pages: usize, requests: &[GenerateRequest]) -> Run {
    let mut config = config(BUDGET, MAX_NUM_SEQS);
    config.admission = policy;
    let s = start(config, geometry(MAX_NUM_SEQS, num_pages, PAGE));
    s.control.hold();
    let mut streams = vec![s.handle.submit(requests[0].clone()).expect("accepted")];
    assert!(s.control.wait_blocked(Duration::from_secs(10)));
    streams.extend(
        requests[1..]
            .iter()
            .map(|r| s.handle.submit(r.clone()).expect("accepted")),
    );
    s.control.run_free();
    let outputs = tokio::time::timeout(DEADLINE, async {
        let mut outputs = Vec::new();
        for (r, stream) in requests.iter().zip(streams) {
            let (tokens, end) = collect(stream).await;
            finished_length(&end, r.prompt.len(), r.stop.max_tokens);
            outputs.push(tokens);
        }
        outputs
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{}: not finished after {DEADLINE:?}: {:?}",
            policy.name(),
            s.handle.stats()
        )
    });
    let stats = wait_released(&s.handle);
    assert_clean(&s);
    Run {
        outputs,
        stats,
        steps: s.control.steps(),
        metrics: metrics_text(&s.registry),
    }
}

/// What every pressed run must show, whatever its policy: the outputs of
/// the roomy pool and of the model run alone, a step count below running
/// the requests one after another, and preemption counts that agree with
/// the rows the fake executed and with the metrics.
fn check_run(name: &str, pressed: &Run, roomy: &Run, requests: &[GenerateRequest]) {
    let stats = &pressed.stats;
    println!("{name}: {stats:?}");
    assert_eq!(pressed.outputs.len(), requests.len());
    for (i, (r, tokens)) in requests.iter().zip(&pressed.outputs).enumerate() {
        assert_eq!(tokens.len(), OUTPUT, "{name}: request {i}");
        assert_eq!(
            tokens, &roomy.outputs[i],
            "{name}: request {i} differs from the roomy pool"
        );
        assert_eq!(
            tokens,
            &reference_tokens(r, &[EOS]),
            "{name}: request {i} differs from the model run alone"
        );
    }
    // No livelock: fewer steps than serving the requests one at a time
    // (one prefill step and OUTPUT - 1 decodes each).
    let serial = (REQUESTS * OUTPUT) as u64;
    assert!(
        stats.steps < serial,
        "{name}: {} steps, serial would take {serial}",
        stats.steps
    );
    // Each admission starts at position 0 (no prefix cache): a request
    // started more than once was preempted in between.
    let mut starts: HashMap<u32, u64> = HashMap::new();
    for row in pressed.steps.iter().flatten().filter(|r| r.start == 0) {
        *starts.entry(row.tokens[0]).or_default() += 1;
    }
    assert_eq!(starts.len(), REQUESTS, "{name}");
    let readmissions: u64 = starts.values().map(|n| n - 1).sum();
    assert_eq!(readmissions, stats.preemptions, "{name}: {starts:?}");
    // Every position a request computes once (its prompt and all but its
    // last output token), plus what readmissions computed again.
    let computed: usize = pressed.steps.iter().flatten().map(|r| r.tokens.len()).sum();
    let once = REQUESTS * (PROMPT + OUTPUT - 1);
    assert_eq!(
        computed as u64,
        once as u64 + stats.recomputed_tokens,
        "{name}: {stats:?}"
    );
    // A victim had computed at least one token, at most all but its last.
    assert!(stats.recomputed_tokens >= stats.preemptions, "{name}");
    assert!(
        stats.recomputed_tokens <= stats.preemptions * (PROMPT + OUTPUT - 1) as u64,
        "{name}: {stats:?}"
    );
    assert_eq!(
        metric_value(&pressed.metrics, "vllm:num_preemptions_total"),
        stats.preemptions as f64,
        "{name}"
    );
    assert_eq!(
        metric_value(&pressed.metrics, "gdn:recomputed_tokens_total"),
        stats.recomputed_tokens as f64,
        "{name}"
    );
    // The roomy pool never preempts.
    assert_eq!(
        (roomy.stats.preemptions, roomy.stats.recomputed_tokens),
        (0, 0),
        "{name}: roomy pool"
    );
    assert_eq!(stats.pages_total, PRESSED_PAGES, "{name}");
}

/// The pressed and the roomy run of `policy`.
async fn pressed_and_roomy(policy: AdmissionPolicy) -> (Run, Run) {
    let requests = demo_requests();
    let pressed = run(policy, PRESSED_PAGES, &requests).await;
    let roomy = run(policy, ROOMY_PAGES, &requests).await;
    check_run(policy.name(), &pressed, &roomy, &requests);
    (pressed, roomy)
}

#[tokio::test]
async fn kv_pressure_watermark_preempts_and_recomputes() {
    let (pressed, _) = pressed_and_roomy(AdmissionPolicy::Watermark).await;
    let stats = &pressed.stats;
    // Admitted with one free page per running sequence, the prefills fill
    // the pool and the decodes push the latest out.
    assert!(stats.preemptions > 0, "{stats:?}");
    assert!(stats.recomputed_tokens > 0, "{stats:?}");
}

#[tokio::test]
async fn kv_pressure_reserve_never_preempts() {
    let (pressed, _) = pressed_and_roomy(AdmissionPolicy::Reserve).await;
    let stats = &pressed.stats;
    assert_eq!((stats.preemptions, stats.recomputed_tokens), (0, 0));
    // The pool held several requests at once all the same.
    let widest = pressed.steps.iter().map(Vec::len).max().unwrap();
    assert!(widest >= 3, "at most {widest} rows in a step");
}

#[tokio::test]
async fn kv_pressure_new_token_ratio_preempts_at_most_twice() {
    let (pressed, _) = pressed_and_roomy(AdmissionPolicy::NewTokenRatio).await;
    let stats = &pressed.stats;
    // The ratio decays step by step, so admission counts less and less of
    // the outputs to come and can admit one request too many: a preemption
    // or two may follow, after which the ratio rises again.
    assert!(stats.preemptions <= 2, "{stats:?}");
    // Fewer than the watermark on the same requests.
    let watermark = run(AdmissionPolicy::Watermark, PRESSED_PAGES, &demo_requests()).await;
    assert!(
        stats.preemptions < watermark.stats.preemptions
            && stats.recomputed_tokens < watermark.stats.recomputed_tokens,
        "new-token-ratio {stats:?}, watermark {:?}",
        watermark.stats
    );
    // The default policy.
    assert_eq!(
        engine::EngineConfig::new(vec![EOS]).admission,
        AdmissionPolicy::NewTokenRatio
    );
}
