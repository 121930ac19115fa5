//! The admission policies under page pressure: what each admits, that the
//! reservation never preempts, the new-token ratio's course, and that
//! every policy finishes every request.

use super::*;

/// Runs `requests` (prompt, max_tokens) to the end under `policy` on
/// `pages` pages of 4 positions; returns the preemptions and, per step,
/// the running count.
fn run_policy(policy: AdmissionPolicy, pages: usize, requests: &[(usize, usize)]) -> (u64, Run) {
    let mut s = scheduler_with(policy, 64, 8, 0, geometry(8, pages, 4));
    for (id, &(prompt, max_tokens)) in requests.iter().enumerate() {
        add(&mut s, id as u64, prompt, max_tokens);
    }
    let run = drive(&mut s, 20_000, |_, _, _| {});
    for (id, &(_, max_tokens)) in requests.iter().enumerate() {
        assert_eq!(
            run.finished[&RequestId(id as u64)],
            (max_tokens, FinishReason::Length),
            "{policy:?}: request {id}"
        );
    }
    (s.preemptions(), run)
}

#[test]
fn the_reservation_admits_only_what_fits_to_the_end_and_never_preempts() {
    // 12 pages of 4; each request grows to 10 + 20 = 30 positions, 8 pages.
    let requests = [(10, 20); 5];
    let mut s = scheduler_with(AdmissionPolicy::Reserve, 64, 8, 0, geometry(8, 12, 4));
    for id in 0..5 {
        add(&mut s, id, 10, 20);
    }
    let run = drive(&mut s, 5000, |s, _, _| {
        let projected: usize = s.running.iter().map(|_| 8).sum();
        assert!(
            projected <= 12,
            "{} running need {projected} pages",
            s.running.len()
        );
    });
    assert_eq!(s.preemptions(), 0);
    assert_eq!(run.finished.len(), 5);
    // The watermark admits two at once on the same pool, and they collide.
    let (watermark, _) = run_policy(AdmissionPolicy::Watermark, 12, &requests);
    assert!(watermark > 0, "the watermark was meant to preempt");
}

#[test]
fn the_new_token_ratio_weighs_the_outputs_to_come_and_rises_after_a_preemption() {
    let mut s = scheduler_with(AdmissionPolicy::NewTokenRatio, 64, 8, 0, geometry(8, 12, 4));
    assert_eq!(s.new_token_ratio(), policy::INIT_NEW_TOKEN_RATIO);
    // 10 + ceil(0.7 x 20) = 24 positions, 6 pages: two fit in 12.
    for id in 0..3 {
        add(&mut s, id, 10, 20);
    }
    let plan = s.schedule();
    assert_eq!(plan.first_admitted, vec![RequestId(0), RequestId(1)]);
    let decay = (policy::INIT_NEW_TOKEN_RATIO - policy::MIN_NEW_TOKEN_RATIO)
        / policy::NEW_TOKEN_RATIO_DECAY_STEPS;
    assert!((s.new_token_ratio() - (policy::INIT_NEW_TOKEN_RATIO - decay)).abs() < 1e-12);
    let mut run = Run::default();
    let mut before = s.new_token_ratio();
    let mut rose = false;
    let tokens = fake_sampled(&s, &plan);
    s.commit(&plan, tokens);
    // The two grow to 8 pages each: 16 > 12, so one is preempted, and the
    // ratio then rises to what the running ones used of their budgets.
    while !s.is_idle() {
        assert!(run.steps < 5000);
        step_checked(&mut s, &mut run, &mut |s: &Scheduler, plan: &Plan, _| {
            if !plan.preempted.is_empty() {
                assert!(
                    s.new_token_ratio() > before,
                    "{} <= {before}",
                    s.new_token_ratio()
                );
                assert!(s.new_token_ratio() <= 1.0);
                rose = true;
            }
            before = s.new_token_ratio();
        });
    }
    assert!(rose, "the pool was meant to run out");
    assert_eq!(run.finished.len(), 3);
    // Idle again: the next request starts from the initial ratio.
    assert_ne!(s.new_token_ratio(), policy::INIT_NEW_TOKEN_RATIO - decay);
    add(&mut s, 9, 4, 2);
    s.schedule();
    assert_eq!(s.new_token_ratio(), policy::INIT_NEW_TOKEN_RATIO - decay);
}

#[test]
fn an_unbounded_max_tokens_counts_at_most_the_clip() {
    // max_tokens up to the context (a client that sets none): the ratio
    // policy counts at most CLIP_MAX_NEW_TOKENS of it, the reservation all.
    let g = geometry(8, 4096, 4);
    let admitted = |policy| {
        let mut s = scheduler_with(policy, 64, 8, 0, g);
        for id in 0..8 {
            add(&mut s, id, 8, g.max_model_len - 8);
        }
        s.schedule().first_admitted.len()
    };
    assert_eq!(admitted(AdmissionPolicy::Reserve), 1);
    // ceil(0.7 x 4096) + 8 = 2876 positions, 719 pages: 5 of 4096 pages.
    assert_eq!(admitted(AdmissionPolicy::NewTokenRatio), 5);
    assert_eq!(admitted(AdmissionPolicy::Watermark), 8);
}

#[test]
fn every_policy_finishes_every_request_under_pressure() {
    // Mixed lengths on 40 pages of 4 (160 positions): a lone request always
    // fits, many together do not.
    let requests: Vec<(usize, usize)> = (0..24)
        .map(|i| (1 + (i * 37) % 90, 1 + (i * 53) % 60))
        .collect();
    let mut preemptions = Vec::new();
    for policy in [
        AdmissionPolicy::Watermark,
        AdmissionPolicy::Reserve,
        AdmissionPolicy::NewTokenRatio,
    ] {
        let (n, _) = run_policy(policy, 40, &requests);
        preemptions.push((policy, n));
    }
    assert_eq!(preemptions[1], (AdmissionPolicy::Reserve, 0));
    assert!(preemptions[0].1 > preemptions[2].1, "{preemptions:?}");
}
