//! Scheduler policy, driven directly (no executor): every planned step is
//! checked against the rules it must keep, with tokens from a fixed
//! function of (request, output index).

use std::collections::{HashMap, HashSet};

use super::*;
use crate::executor::{CacheGeometry, SampledToken};
use crate::prefix_cache::{CacheOp, PrefixCacheConfig};
use crate::request::{FinishReason, RequestId, SamplingParams, StopParams};

mod admission;
mod arena;

const EOS: u32 = 0;

fn geometry(num_slots: usize, num_pages: usize, page_size: usize) -> CacheGeometry {
    CacheGeometry {
        num_slots,
        num_pages,
        page_size,
        vocab_size: 64,
        max_model_len: num_pages * page_size,
    }
}

/// A scheduler under the watermark policy: the rules below are checked
/// where admission takes the most (the reserving policies: `admission.rs`).
fn scheduler(budget: usize, max_num_seqs: usize, threshold: usize, g: CacheGeometry) -> Scheduler {
    scheduler_with(
        AdmissionPolicy::Watermark,
        budget,
        max_num_seqs,
        threshold,
        g,
    )
}

fn scheduler_with(
    admission: AdmissionPolicy,
    budget: usize,
    max_num_seqs: usize,
    threshold: usize,
    g: CacheGeometry,
) -> Scheduler {
    Scheduler::new(
        SchedulerConfig {
            max_num_batched_tokens: budget,
            max_num_seqs,
            max_model_len: g.max_model_len,
            long_prefill_token_threshold: threshold,
            eos_token_ids: vec![EOS],
            prefix_cache: Default::default(),
            row_snapshots: 0,
            admission,
        },
        &g,
    )
}

/// A scheduler with the prefix cache on (a pool of `max_snapshots`), a
/// 64-token budget and no prefill threshold; `row_snapshots` as the
/// executor would declare (0: snapshots at chunk boundaries).
fn cached_scheduler(
    g: CacheGeometry,
    max_num_seqs: usize,
    max_snapshots: usize,
    row_snapshots: usize,
) -> Scheduler {
    Scheduler::new(
        SchedulerConfig {
            max_num_batched_tokens: 64,
            max_num_seqs,
            max_model_len: g.max_model_len,
            long_prefill_token_threshold: 0,
            eos_token_ids: vec![EOS],
            prefix_cache: PrefixCacheConfig {
                enabled: true,
                max_snapshots,
                ..PrefixCacheConfig::default()
            },
            row_snapshots,
            admission: AdmissionPolicy::Watermark,
        },
        &g,
    )
}

fn stop(max_tokens: usize) -> StopParams {
    StopParams {
        max_tokens,
        min_tokens: 0,
        stop_token_ids: Vec::new(),
        ignore_eos: true,
    }
}

fn add(s: &mut Scheduler, id: u64, prompt_len: usize, max_tokens: usize) {
    let prompt = (0..prompt_len as u32).map(|i| 1 + i % 50).collect();
    s.add(
        RequestId(id),
        prompt,
        SamplingParams::default(),
        stop(max_tokens),
        id,
    );
}

/// Never EOS.
fn fake_token(id: RequestId, output_len: usize) -> u32 {
    1 + ((id.0 as usize * 31 + output_len * 7) % 50) as u32
}

/// The fake tokens of `plan`'s sampling rows, in row order.
fn fake_sampled(s: &Scheduler, plan: &Plan) -> Vec<SampledToken> {
    plan.rows
        .iter()
        .filter(|r| r.sample)
        .map(|r| SampledToken {
            token: fake_token(r.id, s.seqs[&r.id].output_len()),
            logprob: 0.0,
            top_logprobs: Vec::new(),
        })
        .collect()
}

/// What the checks saw during a run.
#[derive(Default)]
struct Run {
    finished: HashMap<RequestId, (usize, FinishReason)>,
    first_admitted: Vec<RequestId>,
    steps: usize,
}

/// Runs steps until idle or `max_steps`; `check(scheduler after planning,
/// plan, step index)` sees every plan, each checked by [`step_checked`].
fn drive(
    s: &mut Scheduler,
    max_steps: usize,
    mut check: impl FnMut(&Scheduler, &Plan, usize),
) -> Run {
    let mut run = Run::default();
    while !s.is_idle() {
        assert!(run.steps < max_steps, "not idle after {max_steps} steps");
        step_checked(s, &mut run, &mut check);
    }
    assert_eq!(s.alloc.slots_used(), 0);
    assert_eq!(s.alloc.pages_used(), 0);
    run
}

/// Plans and commits one step, checking the budget, max_num_seqs, slot
/// exclusivity, decode-first and that the oldest running sequence advances.
fn step_checked(
    s: &mut Scheduler,
    run: &mut Run,
    check: &mut impl FnMut(&Scheduler, &Plan, usize),
) {
    let decoders: HashSet<RequestId> = s
        .running
        .iter()
        .copied()
        .filter(|id| s.seqs[id].tokens.len() - s.seqs[id].computed == 1)
        .collect();
    let oldest = s.running.first().copied();
    let plan = s.schedule();
    assert!(!plan.rows.is_empty(), "empty step with work pending");
    assert!(
        plan.num_tokens() <= s.config.max_num_batched_tokens,
        "budget exceeded"
    );
    assert!(s.running.len() <= s.config.max_num_seqs);
    if let Some(oldest) = oldest {
        assert!(
            plan.rows.iter().any(|r| r.id == oldest),
            "the oldest did not advance"
        );
    }
    // Decode first: every decoder has a row unless it was preempted or is
    // the latest admitted waiting for a page; decoders come before any
    // prefill row.
    for id in &decoders {
        let waits_for_page = s.running.last() == Some(id) && s.alloc.pages_free() == 0;
        assert!(
            plan.preempted.contains(id) || plan.rows.iter().any(|r| r.id == *id) || waits_for_page,
            "decoder {id:?} got no row"
        );
    }
    let first_prefill = plan.rows.iter().position(|r| !decoders.contains(&r.id));
    if let Some(first) = first_prefill {
        assert!(plan.rows[first..].iter().all(|r| !decoders.contains(&r.id)));
    }
    let slots: HashSet<_> = plan
        .rows
        .iter()
        .map(|r| s.seqs[&r.id].cache.as_ref().unwrap().slot)
        .collect();
    assert_eq!(slots.len(), plan.rows.len(), "a slot twice in one step");
    check(s, &plan, run.steps);
    run.first_admitted.extend(&plan.first_admitted);
    let sampled = fake_sampled(s, &plan);
    for outcome in s.commit(&plan, sampled) {
        if let Some(reason) = outcome.finish {
            run.finished
                .insert(outcome.id, (outcome.output_len, reason));
        }
    }
    run.steps += 1;
}

#[test]
fn budget_decode_first_fcfs_and_counts_back_to_zero() {
    let mut s = scheduler(32, 6, 0, geometry(8, 200, 4));
    for id in 0..20 {
        add(&mut s, id, 1 + (id as usize * 17) % 60, 3 + id as usize % 9);
    }
    let run = drive(&mut s, 10_000, |_, _, _| {});
    let ids: Vec<RequestId> = (0..20).map(RequestId).collect();
    assert_eq!(run.first_admitted, ids, "admission is not FCFS");
    for id in 0..20u64 {
        assert_eq!(
            run.finished[&RequestId(id)],
            (3 + id as usize % 9, FinishReason::Length)
        );
    }
}

#[test]
fn max_num_seqs_caps_running() {
    let mut s = scheduler(64, 2, 0, geometry(8, 100, 4));
    for id in 0..5 {
        add(&mut s, id, 3, 4);
    }
    let mut peak = 0;
    drive(&mut s, 1000, |s, _, _| peak = peak.max(s.running.len()));
    assert_eq!(peak, 2);
}

#[test]
fn long_prefill_threshold_caps_chunks() {
    let mut s = scheduler(64, 4, 10, geometry(4, 100, 4));
    add(&mut s, 0, 95, 2);
    let mut chunks = Vec::new();
    drive(&mut s, 1000, |_, plan, _| {
        for row in &plan.rows {
            if row.len > 1 || row.start == 0 {
                chunks.push((row.start, row.len, row.sample));
            }
        }
    });
    assert_equal_chunks(&chunks, 95, 10);
}

/// `chunks` (start, len, samples) cover `0..total` in order, as few as the
/// cap allows, sizes within one token of each other, only the last samples.
fn assert_equal_chunks(chunks: &[(usize, usize, bool)], total: usize, cap: usize) {
    assert_eq!(chunks.len(), total.div_ceil(cap), "{chunks:?}");
    let mut at = 0;
    for (i, &(start, len, sample)) in chunks.iter().enumerate() {
        assert_eq!(start, at, "{chunks:?}");
        assert!(len <= cap, "{chunks:?}");
        assert_eq!(sample, i + 1 == chunks.len(), "{chunks:?}");
        at += len;
    }
    assert_eq!(at, total);
    let lens = chunks.iter().map(|c| c.1);
    assert!(
        lens.clone().max().unwrap() - lens.min().unwrap() <= 1,
        "{chunks:?}"
    );
}

#[test]
fn a_prompt_over_the_budget_is_cut_into_equal_chunks_not_a_short_tail() {
    // 8,416 tokens under a budget of 8,192 (the measured case,
    // docs/results/h200-2026-12-01/README.md): 4,208 + 4,208,
    // not 8,192 + 224; and a prompt within the budget stays whole.
    for (prompt, budget) in [(8416usize, 8192usize), (20000, 8192), (130, 64), (64, 64)] {
        let page = 16;
        let mut s = scheduler(budget, 4, 0, geometry(4, prompt / page + 8, page));
        add(&mut s, 0, prompt, 1);
        let mut chunks = Vec::new();
        drive(&mut s, 1000, |_, plan, _| {
            for row in &plan.rows {
                if row.start < prompt {
                    chunks.push((row.start, row.len, row.sample));
                }
            }
        });
        assert_equal_chunks(&chunks, prompt, budget);
    }
}

#[test]
fn a_100k_prompt_neither_starves_decodes_nor_waits_forever() {
    let budget = 512;
    let page = 16;
    // Pages for the long prompt and the short ones, with room to spare.
    let mut s = scheduler(budget, 8, 256, geometry(8, 100_000 / page + 200, page));
    add(&mut s, 0, 20, 400);
    add(&mut s, 1, 30, 400);
    // Get the two short ones decoding first.
    assert_eq!(drive_steps(&mut s, 2).len(), 2);
    add(&mut s, 2, 100_000, 3);
    for id in 3..6 {
        add(&mut s, id, 10, 5);
    }
    let mut long_prefill_steps = 0;
    let mut long_done_prefill_at = None;
    let mut short_admitted_at = HashMap::new();
    let run = drive(&mut s, 2000, |s, plan, step| {
        let long = plan.rows.iter().find(|r| r.id == RequestId(2));
        if let Some(row) = long {
            if row.len > 1 {
                long_prefill_steps += 1;
                // The decoders ran in this very step (decode first).
                for id in [0, 1] {
                    if s.contains(RequestId(id)) {
                        assert!(plan
                            .rows
                            .iter()
                            .any(|r| r.id == RequestId(id) && r.len == 1));
                    }
                }
            }
            if row.sample && long_done_prefill_at.is_none() {
                long_done_prefill_at = Some(step);
            }
        }
        for &id in &plan.first_admitted {
            short_admitted_at.insert(id, step);
        }
    });
    // The long prompt was admitted at once (a free slot and pages for its
    // first chunk) and prefilled in threshold-sized chunks: 100k / 256.
    assert_eq!(short_admitted_at[&RequestId(2)], 0);
    assert_eq!(long_prefill_steps, 100_000usize.div_ceil(256));
    // The short requests behind it were admitted while it was still
    // prefilling (the threshold leaves room), so they did not wait for it.
    let done = long_done_prefill_at.expect("the long prompt finished its prefill");
    for id in 3..6 {
        assert!(short_admitted_at[&RequestId(id)] < done);
    }
    for id in 0..6 {
        assert!(
            run.finished.contains_key(&RequestId(id)),
            "request {id} starved"
        );
    }
    assert_eq!(run.finished[&RequestId(2)].0, 3);
}

/// Runs `n` steps and returns the finished ids (for warm-up).
fn drive_steps(s: &mut Scheduler, n: usize) -> Vec<RequestId> {
    let mut running = Vec::new();
    for _ in 0..n {
        let plan = s.schedule();
        let sampled = fake_sampled(s, &plan);
        s.commit(&plan, sampled);
        running = s.running.clone();
    }
    running
}

#[test]
fn without_threshold_the_head_is_not_overtaken() {
    // A long prompt at the head of the queue while the pool is busy: later
    // short requests that would fit must not be admitted before it.
    let page = 16;
    let mut s = scheduler(512, 8, 0, geometry(8, 4000 / page + 8, page));
    add(&mut s, 0, 100, 60); // holds pages while decoding
    drive_steps(&mut s, 1);
    add(&mut s, 1, 4000, 2); // needs nearly the whole pool
    add(&mut s, 2, 5, 2);
    let mut admitted: Vec<RequestId> = Vec::new();
    let run = drive(&mut s, 5000, |_, plan, _| {
        admitted.extend(&plan.first_admitted)
    });
    assert_eq!(admitted, vec![RequestId(1), RequestId(2)]);
    assert_eq!(run.finished.len(), 3);
}

#[test]
fn out_of_pages_preempts_the_latest_admitted_and_recomputes() {
    // 12 pages of 4 = 48 positions for three sequences that grow to 30 each.
    let mut s = scheduler(64, 3, 0, geometry(3, 12, 4));
    for id in 0..3 {
        add(&mut s, id, 10, 20);
    }
    let mut preempted = Vec::new();
    let mut recomputed = HashSet::new();
    let mut lost = 0;
    let run = drive(&mut s, 1000, |s, plan, _| {
        for &id in &plan.preempted {
            preempted.push(id);
            lost += s.seqs[&id].lost;
            // Requeued at the front with its output kept, nothing cached.
            assert_eq!(s.waiting.front(), Some(&id));
            assert_eq!(s.seqs[&id].computed, 0);
            assert!(s.seqs[&id].cache.is_none());
            assert!(!s.running.contains(&id));
        }
        for row in &plan.rows {
            if row.start == 0 && s.seqs[&row.id].output_len() > 0 {
                recomputed.insert(row.id);
            }
        }
    });
    assert!(!preempted.is_empty(), "the pool was meant to run out");
    // The oldest request is never the victim while younger ones run.
    assert!(!preempted.contains(&RequestId(0)));
    assert_eq!(recomputed, preempted.iter().copied().collect());
    for id in 0..3 {
        assert_eq!(run.finished[&RequestId(id)], (20, FinishReason::Length));
    }
    assert_eq!(s.preemptions(), preempted.len() as u64);
    // Without a prefix cache every computed token of a victim runs again.
    assert!(lost > 0);
    assert_eq!(s.recomputed_tokens(), lost as u64);
}

#[test]
fn max_model_len_ends_with_length() {
    let mut s = scheduler(64, 2, 0, geometry(2, 3, 4)); // max_model_len 12
    add(&mut s, 0, 9, 100);
    let run = drive(&mut s, 100, |_, _, _| {});
    assert_eq!(run.finished[&RequestId(0)], (3, FinishReason::Length));
}

#[test]
fn stop_ids_eos_and_min_tokens() {
    let mut s = scheduler(64, 2, 0, geometry(2, 20, 4));
    let eos_stop = StopParams {
        max_tokens: 10,
        min_tokens: 2,
        stop_token_ids: vec![9],
        ignore_eos: false,
    };
    s.add(
        RequestId(0),
        vec![1, 2],
        SamplingParams::default(),
        eos_stop,
        0,
    );
    // Below min_tokens: EOS and the stop id are banned.
    let mut banned = s.banned(RequestId(0));
    banned.sort();
    assert_eq!(banned, vec![EOS, 9]);
    let commit_one = |s: &mut Scheduler, token: u32| {
        let plan = s.schedule();
        let sampled = vec![SampledToken {
            token,
            logprob: 0.0,
            top_logprobs: Vec::new(),
        }];
        s.commit(&plan, sampled).pop().unwrap()
    };
    assert_eq!(commit_one(&mut s, 5).finish, None);
    assert_eq!(s.banned(RequestId(0)), vec![9, EOS]);
    assert_eq!(commit_one(&mut s, 6).finish, None);
    assert!(s.banned(RequestId(0)).is_empty());
    let last = commit_one(&mut s, 9);
    assert_eq!(last.finish, Some(FinishReason::Stop { token: 9 }));
    assert_eq!(last.output_len, 3);
    assert!(s.is_idle());

    // ignore_eos: EOS is an ordinary token, not banned, no stop.
    let ignore = StopParams {
        max_tokens: 2,
        min_tokens: 1,
        stop_token_ids: Vec::new(),
        ignore_eos: true,
    };
    s.add(RequestId(1), vec![1], SamplingParams::default(), ignore, 0);
    assert!(s.banned(RequestId(1)).is_empty());
    assert_eq!(commit_one(&mut s, EOS).finish, None);
    assert_eq!(commit_one(&mut s, EOS).finish, Some(FinishReason::Length));
    assert_eq!(s.alloc.slots_used() + s.alloc.pages_used(), 0);
}

#[test]
fn remove_frees_running_and_waiting() {
    let mut s = scheduler(8, 1, 0, geometry(1, 10, 4));
    add(&mut s, 0, 5, 10);
    add(&mut s, 1, 5, 10);
    drive_steps(&mut s, 1);
    assert_eq!((s.num_running(), s.num_waiting()), (1, 1));
    assert!(s.remove(RequestId(1)));
    assert!(s.remove(RequestId(0)));
    assert!(!s.remove(RequestId(0)));
    assert!(s.is_idle());
    assert_eq!(s.alloc.slots_used() + s.alloc.pages_used(), 0);
}

#[test]
fn admission_leaves_a_page_per_running_sequence() {
    // 6 pages of 4. Request 0 (prompt 8) holds 2 pages and decodes.
    let mut s = scheduler(64, 4, 0, geometry(4, 6, 4));
    add(&mut s, 0, 8, 10);
    drive_steps(&mut s, 1);
    // Its decode at position 8 takes a third page: 3 free, 1 kept for
    // request 0, so a 16-token prompt is granted 8 positions (2 pages).
    add(&mut s, 1, 16, 2);
    let plan = s.schedule();
    let row = plan.rows.iter().find(|r| r.id == RequestId(1)).unwrap();
    assert_eq!((row.start, row.len), (0, 8));
    assert_eq!(s.alloc.pages_free(), 1);
}

#[test]
fn random_arrivals_and_removals_keep_every_rule() {
    // SplitMix64, fixed seeds.
    let mut state = 0u64;
    let mut next = move |n: usize| -> usize {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % n as u64) as usize
    };
    for _ in 0..40 {
        let page_size = 1 + next(8);
        let max_len = 20 + next(100);
        let g = geometry(
            1 + next(6),
            max_len.div_ceil(page_size) + next(40),
            page_size,
        );
        let max_num_seqs = 1 + next(g.num_slots + 2);
        let budget = max_num_seqs + next(48);
        let mut s = scheduler(budget, max_num_seqs, next(2) * next(20), g);
        let mut run = Run::default();
        let mut expected = HashMap::new();
        let mut removed = HashSet::new();
        for id in 0..60u64 {
            let prompt_len = 1 + next(max_len / 2);
            let max_tokens = 1 + next(max_len - prompt_len);
            add(&mut s, id, prompt_len, max_tokens);
            expected.insert(RequestId(id), max_tokens);
            for _ in 0..next(4) {
                if !s.is_idle() {
                    step_checked(&mut s, &mut run, &mut |_, _, _| {});
                }
            }
            if next(8) == 0 {
                let victim = RequestId(next(id as usize + 1) as u64);
                if s.remove(victim) {
                    removed.insert(victim);
                }
            }
        }
        while !s.is_idle() {
            assert!(run.steps < 100_000);
            step_checked(&mut s, &mut run, &mut |_, _, _| {});
        }
        assert_eq!((s.alloc.slots_used(), s.alloc.pages_used()), (0, 0));
        // FCFS: first admissions in arrival order.
        assert!(run.first_admitted.windows(2).all(|w| w[0] < w[1]));
        for (id, max_tokens) in expected {
            if !removed.contains(&id) {
                assert_eq!(run.finished[&id], (max_tokens, FinishReason::Length));
            }
        }
    }
}

#[test]
fn snapshot_points_marker_last_but_one_and_interval() {
    let cfg = |marker: Vec<u32>, interval| PrefixCacheConfig {
        enabled: true,
        max_snapshots: 8,
        snapshot_after: vec![marker],
        snapshot_interval: interval,
        snapshot_before_last_token: true,
        in_step_snapshots: true,
    };
    // 100 tokens, the marker [7, 8] at 10..12 and 60..62: its last end is 62.
    let mut prompt: Vec<u32> = (0..100).map(|i| 20 + i % 50).collect();
    prompt[10..12].copy_from_slice(&[7, 8]);
    prompt[60..62].copy_from_slice(&[7, 8]);
    assert_eq!(snapshot_points(&prompt, &cfg(vec![7, 8], 0)), vec![62, 99]);
    assert_eq!(
        snapshot_points(&prompt, &cfg(vec![7, 8], 40)),
        vec![40, 62, 80, 99]
    );
    // A marker within MARKER_COVERS_END of the end covers the end.
    prompt[90..92].copy_from_slice(&[7, 8]);
    assert_eq!(snapshot_points(&prompt, &cfg(vec![7, 8], 0)), vec![92]);
    // No marker in the prompt; a one-token prompt has no point at all.
    assert_eq!(snapshot_points(&prompt, &cfg(vec![9, 9], 0)), vec![99]);
    assert!(snapshot_points(&[5], &cfg(vec![], 0)).is_empty());
    // Without the last-token point (the server's default) only the marker
    // and the interval remain.
    let no_last = |marker, interval| PrefixCacheConfig {
        snapshot_before_last_token: false,
        ..cfg(marker, interval)
    };
    prompt[90..92].copy_from_slice(&[30, 31]);
    assert_eq!(
        snapshot_points(&prompt, &no_last(vec![7, 8], 40)),
        vec![40, 62, 80]
    );
    assert!(snapshot_points(&prompt, &no_last(vec![9, 9], 0)).is_empty());
}

/// Branch points at the plan level: two prompts sharing 40 tokens (pages
/// of 8) queued together. The first is planned up to its last-but-one
/// point (50) and the second's admission cuts that row at 40 (the branch
/// point) and waits; after the commit the snapshot at 40 is taken, and the
/// next plan admits the second at 40 with its restore.
#[test]
fn a_branch_point_cuts_the_sharers_row_and_the_newcomer_waits_for_it() {
    let g = geometry(4, 32, 8);
    let mut s = cached_scheduler(g, 4, 8, 0);
    let shared: Vec<u32> = (0..40).map(|i| 1 + i % 50).collect();
    let a = [&shared[..], &[51; 11]].concat();
    let b = [&shared[..], &[52; 9]].concat();
    s.add(RequestId(1), a, SamplingParams::default(), stop(2), 1);
    s.add(RequestId(2), b, SamplingParams::default(), stop(2), 2);
    let plan = s.schedule();
    assert_eq!(
        plan.rows,
        vec![Scheduled {
            id: RequestId(1),
            start: 0,
            len: 40,
            sample: false,
            snapshots: vec![],
        }]
    );
    assert_eq!(s.num_waiting(), 1);
    assert_eq!(s.prefix_cache_stats().unwrap().branch_points, 1);
    assert!(s.commit(&plan, vec![]).is_empty());
    let taken = s.take_cache_ops();
    assert!(
        matches!(taken[..], [CacheOp::Take { .. }]),
        "the snapshot at 40: {taken:?}"
    );
    let plan = s.schedule();
    let second = plan.rows.iter().find(|r| r.id == RequestId(2)).unwrap();
    assert_eq!(
        (second.start, second.len),
        (40, 8),
        "resumed at 40, up to its last-but-one point"
    );
    assert!(plan
        .cache_ops
        .iter()
        .any(|op| matches!(op, CacheOp::Restore { .. })));
    // The first goes on from 40 to its own last-but-one point.
    let first = plan.rows.iter().find(|r| r.id == RequestId(1)).unwrap();
    assert_eq!((first.start, first.len), (40, 10));
}

/// The same two sharers and a third, unrelated prompt behind them: the
/// second waits for the first's branch snapshot, and the third is admitted
/// past it in the same step instead of idling behind it; the second keeps
/// its place and resumes at 40 in the next plan.
#[test]
fn a_sequence_waiting_for_a_snapshot_does_not_hold_up_the_queue() {
    let g = geometry(4, 32, 8);
    let mut s = cached_scheduler(g, 4, 8, 0);
    let shared: Vec<u32> = (0..40).map(|i| 1 + i % 50).collect();
    let a = [&shared[..], &[51; 11]].concat();
    let b = [&shared[..], &[52; 9]].concat();
    let c: Vec<u32> = (0..12).map(|i| 60 - i).collect();
    s.add(RequestId(1), a, SamplingParams::default(), stop(2), 1);
    s.add(RequestId(2), b, SamplingParams::default(), stop(2), 2);
    s.add(RequestId(3), c, SamplingParams::default(), stop(2), 3);
    let plan = s.schedule();
    let rows: Vec<(RequestId, usize, usize)> =
        plan.rows.iter().map(|r| (r.id, r.start, r.len)).collect();
    assert_eq!(rows, vec![(RequestId(1), 0, 40), (RequestId(3), 0, 11)]);
    assert_eq!(plan.first_admitted, vec![RequestId(1), RequestId(3)]);
    assert_eq!(plan.waiting_for_snapshot, vec![RequestId(2)]);
    assert_eq!(s.num_waiting(), 1);
    assert!(s.commit(&plan, vec![]).is_empty());
    s.take_cache_ops();
    let plan = s.schedule();
    assert_eq!(plan.first_admitted, vec![RequestId(2)]);
    assert!(plan.waiting_for_snapshot.is_empty());
    let second = plan.rows.iter().find(|r| r.id == RequestId(2)).unwrap();
    assert_eq!((second.start, second.len), (40, 8), "resumed at 40");
}

/// A sequence that waits for pages, not for a snapshot, still stops
/// admission: nobody behind it overtakes.
#[test]
fn a_sequence_that_does_not_fit_still_holds_the_queue() {
    // 2 slots: the first two take both, the third cannot start, and a
    // fourth behind it must not either (no slot), nor after a slot frees
    // before the third.
    let g = geometry(2, 32, 8);
    let mut s = cached_scheduler(g, 4, 8, 0);
    for id in 1..=4u64 {
        let prompt: Vec<u32> = (0..9).map(|i| 1 + (id as u32 * 7 + i) % 50).collect();
        s.add(
            RequestId(id),
            prompt,
            SamplingParams::default(),
            stop(2),
            id,
        );
    }
    let plan = s.schedule();
    assert_eq!(plan.first_admitted, vec![RequestId(1), RequestId(2)]);
    assert!(plan.waiting_for_snapshot.is_empty());
    assert_eq!(s.num_waiting(), 2);
}

/// The same two prompts with the in-step snapshot: the first's row is not
/// cut at the branch point but takes its snapshot there inside the step
/// (and its last-but-one point's), samples, and publishes both after the
/// commit without a copy; the second resumes at 40 in the next plan.
#[test]
fn a_branch_point_inside_a_planned_row_is_taken_in_the_step() {
    let g = geometry(4, 32, 8);
    let mut s = cached_scheduler(g, 4, 8, usize::MAX);
    let shared: Vec<u32> = (0..40).map(|i| 1 + i % 50).collect();
    let a = [&shared[..], &[51; 11]].concat();
    let b = [&shared[..], &[52; 9]].concat();
    s.add(RequestId(1), a, SamplingParams::default(), stop(2), 1);
    s.add(RequestId(2), b, SamplingParams::default(), stop(2), 2);
    let plan = s.schedule();
    assert_eq!(plan.rows.len(), 1);
    let row = &plan.rows[0];
    assert_eq!(
        (row.id, row.start, row.len, row.sample),
        (RequestId(1), 0, 51, true)
    );
    let points: Vec<usize> = row.snapshots.iter().map(|p| p.at).collect();
    assert_eq!(points, vec![40, 50]);
    let at_40 = row.snapshots[0].snapshot;
    assert_eq!(s.num_waiting(), 1);
    assert_eq!(
        s.prefix_cache_stats().unwrap().snapshots,
        0,
        "not before the commit"
    );
    let token = SampledToken {
        token: 7,
        logprob: f32::NAN,
        top_logprobs: vec![],
    };
    assert_eq!(s.commit(&plan, vec![token]).len(), 1);
    let taken = s.take_cache_ops();
    assert!(taken.is_empty(), "taken in the step, no copy: {taken:?}");
    assert_eq!(s.prefix_cache_stats().unwrap().snapshots, 2);
    let plan = s.schedule();
    let second = plan.rows.iter().find(|r| r.id == RequestId(2)).unwrap();
    assert_eq!((second.start, second.len), (40, 9));
    assert!(plan
        .cache_ops
        .iter()
        .any(|op| matches!(op, CacheOp::Restore { snapshot, .. } if *snapshot == at_40)));
}

/// A step that fails gives its reservations back: with a pool of one, the
/// reserved id is free again for the next plan, and nothing is published.
#[test]
fn an_abandoned_step_gives_its_snapshots_back() {
    let g = geometry(2, 16, 8);
    let mut s = cached_scheduler(g, 2, 1, usize::MAX);
    s.add(
        RequestId(1),
        vec![3; 20],
        SamplingParams::default(),
        stop(2),
        1,
    );
    let plan = s.schedule();
    assert_eq!(plan.rows[0].snapshots.len(), 1, "{plan:?}");
    s.abandon(&plan);
    s.remove(RequestId(1));
    let stats = s.prefix_cache_stats().unwrap();
    assert_eq!((stats.snapshots, stats.snapshots_taken), (0, 0));
    s.add(
        RequestId(2),
        vec![3; 20],
        SamplingParams::default(),
        stop(2),
        2,
    );
    let plan = s.schedule();
    assert_eq!(
        plan.rows[0].snapshots.len(),
        1,
        "the id is free again: {plan:?}"
    );
}
