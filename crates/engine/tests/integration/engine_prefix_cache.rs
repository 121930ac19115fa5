//! The prefix cache on the fake executor: every request must get exactly
//! the tokens of the fake model run alone (`lone_run`, no engine, no
//! cache), the fake checks every row (a resumed row's earlier KV must be its
//! own prefix's, its restored state must hold exactly `start` tokens), and
//! `cached_tokens` must be the position the design promises for each case.

use crate::common;

use common::*;
use engine::prefix_cache::PrefixCacheConfig;
use engine::{
    AdmissionPolicy, EngineConfig, Event, Executor, GenerateRequest, PageId, SampleSeed,
    SampleSpec, SamplingParams, SlotId, SnapshotId, StepRow, SubmitError, Usage,
};
use engine_testkit::{collect, FakeControl, FakeExecutor};

const PAGE: usize = 8;
/// The "end of preamble" marker of these tests (chat: `<|im_start|>assistant\n`).
const MARK: [u32; 2] = [62, 63];

/// `len` tokens in 1..=60 (never EOS, never part of `MARK`).
fn body(tag: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 1 + (tag * 31 + i * 17 + i * i) % 60)
        .collect()
}

fn cat(parts: &[&[u32]]) -> Vec<u32> {
    parts.concat()
}

fn cached(
    in_step: bool,
    budget: usize,
    seqs: usize,
    marker: bool,
    max_snapshots: usize,
) -> EngineConfig {
    let mut c = config(budget, seqs);
    c.prefix_cache = PrefixCacheConfig {
        enabled: true,
        max_snapshots,
        snapshot_after: if marker { vec![MARK.to_vec()] } else { vec![] },
        snapshot_interval: 0,
        snapshot_before_last_token: true,
        in_step_snapshots: in_step,
    };
    c
}

/// Runs `r` to the end; checks its tokens against the fake model alone.
async fn run(s: &Started, r: &GenerateRequest) -> (Vec<u32>, Usage) {
    let (tokens, end) = collect(s.handle.submit(r.clone()).expect("accepted")).await;
    assert_eq!(
        tokens,
        reference_tokens(r, &[EOS]),
        "tokens differ from the model alone"
    );
    match end {
        Event::Finished { usage, .. } => (tokens, usage),
        other => panic!("expected Finished, got {other:?}"),
    }
}

fn metric(s: &Started, name: &str) -> f64 {
    metric_value(&metrics_text(&s.registry), name)
}

fn assert_no_violation(s: &Started) {
    assert!(
        s.control.violations().is_empty(),
        "{:?}",
        s.control.violations()
    );
}

async fn exact_repeat_resumes_before_the_last_prompt_token(in_step: bool) {
    let s = start_with_snapshots(cached(in_step, 64, 4, false, 16), geometry(4, 64, PAGE), 16);
    let r = request(body(1, 40), 6, 7);
    let (_, first) = run(&s, &r).await;
    assert_eq!(first.cached_tokens, 0);
    for _ in 0..2 {
        let (_, again) = run(&s, &r).await;
        assert_eq!(again.cached_tokens, 39);
        assert_eq!(again.prompt_tokens, 40);
    }
    assert_no_violation(&s);
    // Pages only the cache holds count as free, as vLLM's cached blocks do.
    let stats = wait_released(&s.handle);
    assert!(stats.pages_cached >= 5, "{stats:?}");
    assert_eq!(metric(&s, "vllm:kv_cache_usage_perc"), 0.0);
    assert!(metric(&s, "gdn:prefix_cache_pages") >= 5.0);
    assert_eq!(metric(&s, "vllm:prefix_cache_queries_total"), 120.0);
    assert_eq!(metric(&s, "vllm:prefix_cache_hits_total"), 78.0);
    assert_eq!(metric(&s, "gdn:prefix_cache_snapshot_hits_total"), 2.0);
    assert_eq!(metric(&s, "gdn:prefix_cache_snapshot_misses_total"), 1.0);
}

async fn without_the_last_token_point_a_repeat_hits_from_its_second_repeat(in_step: bool) {
    // The server's default: no snapshot before the last prompt token, so a
    // prefill is never cut short for it. The first repeat finds the whole
    // prompt's KV but no state: it takes a branch point there (before the
    // last token) and the later repeats resume at it.
    let mut c = cached(in_step, 64, 4, false, 16);
    c.prefix_cache.snapshot_before_last_token = false;
    let s = start_with_snapshots(c, geometry(4, 64, PAGE), 16);
    let r = request(body(1, 40), 6, 7);
    let got: Vec<usize> = {
        let mut got = vec![];
        for _ in 0..4 {
            got.push(run(&s, &r).await.1.cached_tokens);
        }
        got
    };
    assert_eq!(got, vec![0, 0, 39, 39]);
    assert_eq!(metric(&s, "gdn:prefix_cache_branch_points_total"), 1.0);
    assert_no_violation(&s);
}

async fn shared_system_prompt_hits_at_the_marker(in_step: bool) {
    let s = start_with_snapshots(cached(in_step, 64, 4, true, 16), geometry(4, 64, PAGE), 16);
    let system = cat(&[&body(2, 29), &MARK]);
    for (i, len) in [5usize, 9, 12, 7].into_iter().enumerate() {
        let r = request(cat(&[&system, &body(10 + i as u32, len)]), 5, i as u64);
        let (_, usage) = run(&s, &r).await;
        assert_eq!(usage.cached_tokens, if i == 0 { 0 } else { system.len() });
    }
    assert_no_violation(&s);
}

/// A system prompt without a marker (raw completions), and questions that
/// differ from their first token (`body` tags 10.. start with distinct
/// tokens), so the shared prefix is exactly the system prompt.
fn sharers(system: &[u32], n: u32, question_len: usize) -> Vec<GenerateRequest> {
    (0..n)
        .map(|i| {
            let question = body(10 + i, question_len + i as usize % 3);
            request(cat(&[system, &question]), 5, i as u64)
        })
        .collect()
}

async fn a_shared_prefix_without_a_marker_is_served_from_a_branch_point(in_step: bool) {
    // The first request publishes only its own points (last-but-one, end of
    // generation); the second shares 29 tokens of KV with it but no state,
    // so its prefill stops at 29 to snapshot there (a branch point); from
    // the third on, every sharer resumes at 29.
    let s = start_with_snapshots(cached(in_step, 64, 4, false, 16), geometry(4, 64, PAGE), 16);
    let system = body(2, 29);
    let requests = sharers(&system, 5, 6);
    for (i, r) in requests.iter().enumerate() {
        let (_, usage) = run(&s, r).await;
        assert_eq!(
            usage.cached_tokens,
            if i < 2 { 0 } else { system.len() },
            "request {i}"
        );
    }
    assert_eq!(metric(&s, "gdn:prefix_cache_branch_points_total"), 1.0);
    // Only the second found KV it could not use (29 tokens of it).
    assert_eq!(
        metric(&s, "gdn:prefix_cache_kv_only_hits_unusable_total"),
        1.0
    );
    assert_eq!(
        metric(&s, "gdn:prefix_cache_kv_only_unusable_tokens_total"),
        29.0
    );
    // The second request's prefill stopped exactly at the branch point,
    // or (in-step) took its snapshot there inside the step.
    let second = &requests[1].prompt;
    let stopped = s.control.steps().iter().flatten().any(|row| {
        let at_29 = if in_step {
            // With its last-but-one point.
            row.tokens.len() == second.len() && row.snapshots == [29, second.len() - 1]
        } else {
            row.tokens.len() == system.len()
        };
        row.start == 0 && row.tokens[..29] == second[..29] && at_29
    });
    assert!(
        stopped,
        "no prefill chunk of the second request ended at 29 (in step: {in_step})"
    );
    assert_no_violation(&s);
}

async fn a_long_document_resumes_at_its_last_periodic_point(in_step: bool) {
    // Periodic points every 2 pages: the first sharer of a 40-token
    // document (no marker) resumes at 32, the last point inside it, and
    // computes only 32..40 before its branch point at 40, where the next
    // sharers resume; without the points it computes all 40 (the test
    // above: 0, 0, then the whole prefix).
    let mut config = cached(in_step, 64, 4, false, 16);
    config.prefix_cache.snapshot_interval = 2 * PAGE;
    let s = start_with_snapshots(config, geometry(4, 64, PAGE), 16);
    let document = body(3, 40);
    let cached_tokens: Vec<usize> = {
        let mut got = vec![];
        for r in sharers(&document, 4, 6) {
            got.push(run(&s, &r).await.1.cached_tokens);
        }
        got
    };
    assert_eq!(cached_tokens, [0, 32, 40, 40]);
    assert_eq!(metric(&s, "gdn:prefix_cache_branch_points_total"), 1.0);
    assert_no_violation(&s);
}

async fn eight_sharers_arriving_together_take_one_branch_snapshot(in_step: bool) {
    // Cold cache, eight sharers of a 29-token prefix queued in one go: the
    // first admitted stops at 29 (its row of that step is cut there), the
    // seven others wait for its snapshot instead of taking their own, and
    // all resume there.
    let s = start_with_snapshots(
        cached(in_step, 256, 9, false, 32),
        geometry(9, 128, PAGE),
        32,
    );
    let system = body(3, 29);
    let requests = sharers(&system, 8, 5);
    // An unrelated request's step is held while the sharers queue, so they
    // are all waiting when the next step is planned (else the first could
    // be planned alone and run past 29 before the others arrive; then the
    // second takes the branch point: see the sequential test).
    s.control.hold();
    let blocker = s
        .handle
        .submit(request(body(59, 6), 2, 0))
        .expect("accepted");
    assert!(s.control.wait_blocked(std::time::Duration::from_secs(10)));
    let streams: Vec<_> = requests
        .iter()
        .map(|r| s.handle.submit(r.clone()).expect("accepted"))
        .collect();
    s.control.run_free();
    collect(blocker).await;
    let mut cached_tokens = vec![];
    for (r, stream) in requests.iter().zip(streams) {
        let (tokens, end) = collect(stream).await;
        assert_eq!(tokens, reference_tokens(r, &[EOS]));
        match end {
            Event::Finished { usage, .. } => cached_tokens.push(usage.cached_tokens),
            other => panic!("{other:?}"),
        }
    }
    let mut want = vec![system.len(); 8];
    want[0] = 0;
    assert_eq!(cached_tokens, want);
    assert_eq!(metric(&s, "gdn:prefix_cache_branch_points_total"), 1.0);
    let stats = wait_released(&s.handle).prefix_cache.unwrap();
    // One snapshot at 29; the others are each request's own points.
    assert_eq!(stats.snapshot_hits, 7, "{stats:?}");
    assert_no_violation(&s);
}

async fn a_newcomer_waits_for_a_pending_branch_snapshot_it_shares(in_step: bool) {
    // A is cached. B and C arrive together: B shares the 29-token system
    // prompt with A and takes a branch point there; C shares 38 tokens with
    // A but only 29 with B. C must not take its own snapshot of what B is
    // about to publish: it waits, resumes at 29, and branches again at 38.
    let s = start_with_snapshots(
        cached(in_step, 256, 4, false, 32),
        geometry(4, 128, PAGE),
        32,
    );
    let system = body(6, 29);
    let x = body(20, 12);
    let a = request(cat(&[&system, &x]), 4, 1);
    assert_eq!(run(&s, &a).await.1.cached_tokens, 0);
    let b = request(cat(&[&system, &body(21, 7)]), 4, 2);
    let c = request(cat(&[&system, &x[..9], &body(22, 6)]), 4, 3);
    assert_ne!(x[9], body(22, 6)[0]);
    s.control.hold();
    let streams: Vec<_> = [&b, &c]
        .iter()
        .map(|r| s.handle.submit((*r).clone()).expect("accepted"))
        .collect();
    s.control.run_free();
    let mut cached_tokens = vec![];
    for (r, stream) in [&b, &c].into_iter().zip(streams) {
        let (tokens, end) = collect(stream).await;
        assert_eq!(tokens, reference_tokens(r, &[EOS]));
        match end {
            Event::Finished { usage, .. } => cached_tokens.push(usage.cached_tokens),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(cached_tokens, vec![0, 29]);
    assert_eq!(metric(&s, "gdn:prefix_cache_branch_points_total"), 2.0);
    // The next sharer of C's longer prefix resumes at 38.
    let d = request(cat(&[&system, &x[..9], &body(23, 4)]), 4, 4);
    assert_eq!(run(&s, &d).await.1.cached_tokens, 38);
    assert_no_violation(&s);
}

async fn a_callers_snapshot_point_serves_the_next_sharer(in_step: bool) {
    // The server passes where a chat's preamble ends: the first request
    // snapshots there, so the second resumes there (no branch point
    // needed); a point shorter than a page is ignored; a point outside the
    // prompt is refused at submit.
    let s = start_with_snapshots(cached(in_step, 64, 4, false, 16), geometry(4, 64, PAGE), 16);
    let system = body(7, 29);
    let mut requests = sharers(&system, 3, 6);
    requests[0].snapshot_points = vec![29, 5];
    for (i, r) in requests.iter().enumerate() {
        let (_, usage) = run(&s, r).await;
        assert_eq!(
            usage.cached_tokens,
            if i == 0 { 0 } else { 29 },
            "request {i}"
        );
    }
    assert_eq!(metric(&s, "gdn:prefix_cache_branch_points_total"), 0.0);
    // Point 5 (less than a page) took no snapshot: a prompt of system[..6]
    // and more finds nothing at 5.
    let short = request(cat(&[&system[..6], &body(30, 4)]), 2, 9);
    assert_eq!(run(&s, &short).await.1.cached_tokens, 0);
    for bad in [0, 35] {
        let mut r = request(cat(&[&system, &body(31, 6)]), 2, 9);
        r.snapshot_points = vec![bad];
        match s.handle.submit(r) {
            Err(SubmitError::Invalid(why)) => assert!(why.contains("snapshot point"), "{why}"),
            other => panic!("point {bad}: expected Invalid, got {:?}", other.err()),
        }
    }
    assert_no_violation(&s);
}

async fn the_next_turn_resumes_at_the_end_of_the_generation(in_step: bool) {
    let s = start_with_snapshots(cached(in_step, 64, 4, true, 32), geometry(4, 64, PAGE), 32);
    let mut history = cat(&[&body(3, 20), &MARK]);
    for turn in 0..4u32 {
        let r = request(history.clone(), 6, turn as u64);
        let (out, usage) = run(&s, &r).await;
        // The first turn finds nothing; each later one resumes where the
        // previous generation stopped computing (its last token is new).
        if turn > 0 {
            assert_eq!(usage.cached_tokens, history.len() - 1 - 9 - MARK.len());
        } else {
            assert_eq!(usage.cached_tokens, 0);
        }
        history = cat(&[&history, &out, &body(20 + turn, 9), &MARK]);
    }
    assert_no_violation(&s);
}

async fn eight_concurrent_sharers_of_one_prefix(in_step: bool) {
    let s = start_with_snapshots(
        cached(in_step, 256, 8, true, 32),
        geometry(8, 128, PAGE),
        32,
    );
    let system = cat(&[&body(4, 45), &MARK]);
    let seed = request(cat(&[&system, &body(30, 4)]), 3, 99);
    assert_eq!(run(&s, &seed).await.1.cached_tokens, 0);
    let requests: Vec<GenerateRequest> = (0..8u32)
        .map(|i| request(cat(&[&system, &body(40 + i, 3 + i as usize)]), 8, i as u64))
        .collect();
    // Steps wait until every sharer is queued, so they run together.
    s.control.hold();
    let streams: Vec<_> = requests
        .iter()
        .map(|r| s.handle.submit(r.clone()).expect("accepted"))
        .collect();
    s.control.run_free();
    for (r, stream) in requests.iter().zip(streams) {
        let (tokens, end) = collect(stream).await;
        assert_eq!(tokens, reference_tokens(r, &[EOS]));
        match end {
            Event::Finished { usage, .. } => assert_eq!(usage.cached_tokens, system.len()),
            other => panic!("{other:?}"),
        }
    }
    assert_no_violation(&s);
    // Eight rows shared the prefix's pages in the same steps.
    let shared_step = s.control.steps().iter().any(|rows| {
        rows.len() >= 2
            && rows.iter().all(|r| r.start >= system.len() / PAGE * PAGE)
            && rows.windows(2).all(|w| w[0].pages[0] == w[1].pages[0])
    });
    assert!(shared_step, "no step had sharers reading the same page");
}

async fn a_tiny_snapshot_budget_evicts_the_least_recently_used(in_step: bool) {
    let s = start_with_snapshots(cached(in_step, 64, 2, false, 2), geometry(2, 64, PAGE), 16);
    let prompts: Vec<Vec<u32>> = (0..5).map(|i| body(50 + i, 20 + i as usize)).collect();
    for p in &prompts {
        assert_eq!(run(&s, &request(p.clone(), 4, 3)).await.1.cached_tokens, 0);
    }
    // Two snapshots kept: the last two prompts' (before their last token;
    // an end of generation saves 3 tokens over it, less than any held
    // snapshot, so it is not taken once the pool is full); the first
    // prompt's are gone, the least recently used of their class.
    let last = prompts.last().unwrap();
    let (_, usage) = run(&s, &request(last.clone(), 4, 3)).await;
    assert_eq!(usage.cached_tokens, last.len() - 1);
    let (_, usage) = run(&s, &request(prompts[0].clone(), 4, 3)).await;
    assert_eq!(usage.cached_tokens, 0);
    let stats = wait_released(&s.handle).prefix_cache.unwrap();
    assert!(stats.snapshots <= 2, "{stats:?}");
    // Prompts 1 to 4 each evicted at least one (prompt 0's end of
    // generation, then the least recently used last-but-one); prompt 0's
    // repeat more (with the in-step snapshot it also takes a branch point
    // where its pages are still cached).
    assert!(stats.snapshot_evictions >= 5, "{stats:?}");
    assert_eq!(
        metric(&s, "gdn:prefix_cache_snapshots"),
        stats.snapshots as f64
    );
    assert_eq!(
        metric(&s, "gdn:prefix_cache_snapshot_bytes"),
        (stats.snapshots * engine_testkit::FAKE_SNAPSHOT_BYTES) as f64
    );
    assert_no_violation(&s);
}

async fn a_tiny_snapshot_budget_keeps_what_saves_the_most_prefill(in_step: bool) {
    // Two snapshots. P (40 tokens) leaves one before its last prompt token
    // (saves 39) and one at the end of its generation (saves 3 over it).
    // Q (12 tokens, unrelated): its last-but-one (saves 11) evicts P's end
    // of generation (3 < 11); its end of generation (saves 3) is not taken,
    // every held snapshot saving more. So P's repeat hits at 39 and Q's
    // at 11.
    let s = start_with_snapshots(cached(in_step, 64, 2, false, 2), geometry(2, 64, PAGE), 16);
    let p = request(body(80, 40), 4, 1);
    let q = request(body(81, 12), 4, 2);
    assert_eq!(run(&s, &p).await.1.cached_tokens, 0);
    assert_eq!(run(&s, &q).await.1.cached_tokens, 0);
    assert_eq!(run(&s, &p).await.1.cached_tokens, 39);
    assert_eq!(run(&s, &q).await.1.cached_tokens, 11);
    let stats = wait_released(&s.handle).prefix_cache.unwrap();
    assert_eq!(stats.snapshots, 2, "{stats:?}");
    assert_no_violation(&s);
}

async fn running_requests_take_pages_back_from_the_cache(in_step: bool) {
    // 12 pages of 8: each request needs 6; the cache must give its pages
    // back for every new prompt, and never blocks a request.
    let s = start_with_snapshots(cached(in_step, 64, 2, false, 16), geometry(2, 12, PAGE), 16);
    for i in 0..6u32 {
        let r = request(body(60 + i, 40), 8, 5);
        assert_eq!(run(&s, &r).await.1.cached_tokens, 0);
    }
    let stats = wait_released(&s.handle);
    let cache = stats.prefix_cache.unwrap();
    assert!(cache.snapshot_evictions > 0, "{cache:?}");
    assert_no_violation(&s);
}

async fn preempted_sharers_resume_exactly(in_step: bool) {
    // 4 slots, 20 pages of 8: four sharers of 48 tokens growing to 80 each
    // cannot all fit, so the latest are preempted and readmitted (through
    // the cache again) until all finish.
    let mut config = cached(in_step, 64, 4, true, 16);
    // The watermark admits them all and preempts.
    config.admission = AdmissionPolicy::Watermark;
    let s = start_with_snapshots(config, geometry(4, 20, PAGE), 16);
    let system = cat(&[&body(5, 38), &MARK]);
    assert_eq!(
        run(&s, &request(cat(&[&system, &[7]]), 2, 0))
            .await
            .1
            .cached_tokens,
        0
    );
    let requests: Vec<GenerateRequest> = (0..4u32)
        .map(|i| request(cat(&[&system, &body(70 + i, 8)]), 32, i as u64))
        .collect();
    s.control.hold();
    let streams: Vec<_> = requests
        .iter()
        .map(|r| s.handle.submit(r.clone()).expect("accepted"))
        .collect();
    s.control.run_free();
    for (r, stream) in requests.iter().zip(streams) {
        let (tokens, end) = collect(stream).await;
        assert_eq!(tokens, reference_tokens(r, &[EOS]));
        match end {
            Event::Finished { usage, .. } => assert_eq!(usage.cached_tokens, system.len()),
            other => panic!("{other:?}"),
        }
    }
    let stats = wait_released(&s.handle);
    assert!(stats.preemptions > 0, "no preemption: {stats:?}");
    assert_no_violation(&s);
}

/// The fake refuses the mistakes a prefix cache can make, so the tests
/// above can fail: restoring another sequence's snapshot, or resuming
/// without copying the partial page.
#[test]
fn the_fake_catches_a_wrong_restore_or_a_missing_page_copy() {
    let g = geometry(2, 8, 4);
    let mut fake = FakeExecutor::with_snapshots(g, 2, FakeControl::new());
    let params = SamplingParams::default();
    let run_row = |fake: &mut FakeExecutor,
                   slot,
                   start,
                   tokens: &[u32],
                   pages: &[PageId],
                   history: &[u32]| {
        let spec = SampleSpec {
            params: &params,
            history,
            prompt_len: history.len(),
            seed: SampleSeed { seed: 0, draw: 0 },
            banned: &[],
            allowed: None,
        };
        fake.step(&[StepRow {
            slot: SlotId(slot),
            start,
            tokens,
            pages,
            sample: Some(spec),
            snapshots: &[],
        }])
    };
    let a = [1, 2, 3, 4, 5, 6];
    let b = [1, 2, 3, 4, 9, 9];
    run_row(&mut fake, 0, 0, &a, &[PageId(0), PageId(1)], &a).unwrap();
    fake.snapshot(SlotId(0), SnapshotId(0)).unwrap();
    run_row(&mut fake, 1, 0, &b, &[PageId(2), PageId(3)], &b).unwrap();
    fake.snapshot(SlotId(1), SnapshotId(1)).unwrap();
    let next = |h: &[u32]| cat(&[h, &[7]]);
    // Right: a's snapshot, a's first page shared, its partial page copied.
    fake.restore(SnapshotId(0), SlotId(1)).unwrap();
    fake.copy_page(PageId(1), PageId(4)).unwrap();
    run_row(&mut fake, 1, 6, &[7], &[PageId(0), PageId(4)], &next(&a)).unwrap();
    // Wrong snapshot (b's state over a's pages).
    fake.restore(SnapshotId(1), SlotId(1)).unwrap();
    fake.copy_page(PageId(1), PageId(5)).unwrap();
    let err = run_row(&mut fake, 1, 6, &[7], &[PageId(0), PageId(5)], &next(&b));
    assert!(format!("{err:?}").contains("is not its own"), "{err:?}");
    // Right snapshot, partial page not copied.
    fake.restore(SnapshotId(0), SlotId(1)).unwrap();
    let err = run_row(&mut fake, 1, 6, &[7], &[PageId(0), PageId(6)], &next(&a));
    assert!(format!("{err:?}").contains("is not its own"), "{err:?}");
    // A dropped snapshot cannot be restored.
    fake.drop_snapshot(SnapshotId(0));
    assert!(fake.restore(SnapshotId(0), SlotId(1)).is_err());
}

/// A chat prompt: a 29-token system preamble (the caller's point, as the
/// server passes it), a question, the marker and two tokens after it.
fn chat_prompt(system: &[u32], question: &[u32]) -> GenerateRequest {
    let mut r = request(cat(&[system, question, &MARK, &[33, 34]]), 4, 5);
    r.snapshot_points = vec![system.len()];
    r
}

/// The prefill rows of the only request run so far (it ran alone): rows
/// starting before its prompt's end.
fn prefill_rows(s: &Started, prompt_len: usize) -> Vec<engine_testkit::RowRecord> {
    s.control
        .steps()
        .into_iter()
        .flatten()
        .filter(|row| row.start < prompt_len)
        .collect()
}

#[tokio::test]
async fn a_preamble_and_a_marker_point_are_snapshotted_in_one_step() {
    // The prompt has two points, 29 (preamble) and 40 (after the marker);
    // it fits one step's budget. In-step, it is prefilled in one step that
    // takes both snapshots; an executor taking one per row needs two steps,
    // one taking none (or the in-step snapshot turned off) three, as
    // before. Each way the snapshots serve the next requests.
    let system = body(8, 29);
    let a = chat_prompt(&system, &body(40, 9));
    assert_eq!(a.prompt.len(), 42);
    for (row_snapshots, in_step, want) in [
        (usize::MAX, true, vec![(0, 42, vec![29, 40])]),
        (1, true, vec![(0, 40, vec![29]), (40, 2, vec![])]),
        (
            0,
            true,
            vec![(0, 29, vec![]), (29, 11, vec![]), (40, 2, vec![])],
        ),
        (
            usize::MAX,
            false,
            vec![(0, 29, vec![]), (29, 11, vec![]), (40, 2, vec![])],
        ),
    ] {
        let s = start_with_row_snapshots(
            cached(in_step, 64, 4, true, 16),
            geometry(4, 64, PAGE),
            16,
            row_snapshots,
        );
        assert_eq!(run(&s, &a).await.1.cached_tokens, 0);
        let rows: Vec<(usize, usize, Vec<usize>)> = prefill_rows(&s, 42)
            .into_iter()
            .map(|r| (r.start, r.tokens.len(), r.snapshots))
            .collect();
        assert_eq!(rows, want, "{row_snapshots} per row, in step: {in_step}");
        // The preamble's snapshot serves another question...
        let b = chat_prompt(&system, &body(41, 7));
        assert_eq!(run(&s, &b).await.1.cached_tokens, 29);
        // ...and the marker's the next turn of the first conversation.
        let c = request(cat(&[&a.prompt[..40], &[35, 36, 37]]), 4, 6);
        assert_eq!(run(&s, &c).await.1.cached_tokens, 40);
        assert_no_violation(&s);
    }
}

#[tokio::test]
async fn a_failed_step_publishes_none_of_its_snapshots() {
    // The step that takes the two snapshots fails (the fake then leaves
    // garbage in them): neither may be published, and both ids go back to
    // the pool of two, so the next request takes them again and serves the
    // third. A published garbage snapshot would be refused at its restore.
    let s = start_with_snapshots(cached(true, 64, 4, true, 2), geometry(4, 64, PAGE), 2);
    let system = body(9, 29);
    let a = chat_prompt(&system, &body(42, 9));
    s.control.fail_next(engine_testkit::FakeFailure::StepFailed);
    let (tokens, end) = collect(s.handle.submit(a.clone()).expect("accepted")).await;
    assert!(
        tokens.is_empty() && matches!(end, Event::Failed(_)),
        "{end:?}"
    );
    assert_eq!(prefill_rows(&s, 42)[0].snapshots, vec![29, 40]);
    let stats = wait_released(&s.handle).prefix_cache.unwrap();
    assert_eq!(
        (stats.snapshots, stats.snapshots_taken),
        (0, 0),
        "{stats:?}"
    );
    let b = chat_prompt(&system, &body(43, 9));
    assert_eq!(run(&s, &b).await.1.cached_tokens, 0);
    let c = chat_prompt(&system, &body(44, 5));
    assert_eq!(run(&s, &c).await.1.cached_tokens, 29);
    assert_no_violation(&s);
}

/// Every test above runs twice: snapshots at chunk boundaries (`chunked`)
/// and inside the step (`in_step`, the default).
macro_rules! both_ways {
    ($($name:ident),* $(,)?) => {
        mod chunked {
            $(#[tokio::test]
            async fn $name() {
                super::$name(false).await
            })*
        }
        mod in_step {
            $(#[tokio::test]
            async fn $name() {
                super::$name(true).await
            })*
        }
    };
}

both_ways!(
    exact_repeat_resumes_before_the_last_prompt_token,
    without_the_last_token_point_a_repeat_hits_from_its_second_repeat,
    shared_system_prompt_hits_at_the_marker,
    a_shared_prefix_without_a_marker_is_served_from_a_branch_point,
    a_long_document_resumes_at_its_last_periodic_point,
    eight_sharers_arriving_together_take_one_branch_snapshot,
    a_newcomer_waits_for_a_pending_branch_snapshot_it_shares,
    a_callers_snapshot_point_serves_the_next_sharer,
    the_next_turn_resumes_at_the_end_of_the_generation,
    eight_concurrent_sharers_of_one_prefix,
    a_tiny_snapshot_budget_evicts_the_least_recently_used,
    a_tiny_snapshot_budget_keeps_what_saves_the_most_prefill,
    running_requests_take_pages_back_from_the_cache,
    preempted_sharers_resume_exactly
);
