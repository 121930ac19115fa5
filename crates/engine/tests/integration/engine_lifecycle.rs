//! Abort, failures, shutdown, overload, loading and metrics of the engine
//! thread, with the fake executor.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use engine::{Engine, EngineState, Event, FailureCause, SamplingParams, SubmitError};
use engine_testkit::{collect, FakeControl, FakeExecutor, FakeFailure};

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn dropping_a_stream_frees_its_slot_and_pages_within_one_step() {
    let s = start(config(64, 4), geometry(4, 64, 4));
    s.control.hold();
    let gone = s.handle.submit(request(prompt(0, 9), 50, 1)).unwrap();
    let kept_request = request(prompt(1, 5), 20, 2);
    let kept = s.handle.submit(kept_request.clone()).unwrap();
    let mut gone = gone;
    s.control.release(1);
    assert!(matches!(gone.next().await, Some(Event::Token(_))));
    // The engine may already be held inside the next step, with `gone` in it.
    let steps_at_drop = s.control.num_steps();
    drop(gone);
    s.control.release(2);
    assert!(s.control.wait_steps(steps_at_drop + 2, WAIT));
    let steps = s.control.steps();
    let gone_slot = slot_of(&steps, 0).unwrap();
    // At most the step in flight at the drop still ran it; not the next.
    // A row of `gone` after its first token continues past its 9-token
    // prompt; `kept` may hold the same slot by then (when it arrived after
    // step 0 was planned, it is admitted after the drop), but not that far.
    assert!(
        !steps[steps_at_drop + 1]
            .iter()
            .any(|r| r.slot == gone_slot && r.start >= 9),
        "the aborted request ran a step after the one in flight: {steps:?}"
    );
    // Its slot and pages are free while the other request still runs.
    let until = Instant::now() + WAIT;
    loop {
        let stats = s.handle.stats();
        if stats.slots_used == 1 {
            assert_eq!(stats.running, 1);
            assert_eq!(stats.aborted, 1);
            break;
        }
        assert!(Instant::now() < until, "{stats:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
    s.control.run_free();
    let (tokens, _) = collect(kept).await;
    assert_eq!(tokens, reference_tokens(&kept_request, &[EOS]));
    let text = metrics_text(&s.registry);
    assert_eq!(metric_value(&text, "gdn:requests_aborted_total"), 1.0);
    assert_eq!(
        metric_value(
            &text,
            "vllm:request_success_total{finished_reason=\"abort\"}"
        ),
        1.0
    );
    assert_clean(&s);
}

#[tokio::test]
async fn a_failed_step_fails_only_its_requests() {
    // One request runs at a time, so the second waits outside the failing step.
    let s = start(config(64, 1), geometry(2, 64, 4));
    s.control.hold();
    let failing = s.handle.submit(request(prompt(0, 9), 10, 1)).unwrap();
    assert!(s.control.wait_blocked(WAIT));
    let waiting_request = request(prompt(1, 7), 10, 2);
    let waiting = s.handle.submit(waiting_request.clone()).unwrap();
    s.control.fail_next(FakeFailure::StepFailed);
    s.control.run_free();
    let (tokens, end) = collect(failing).await;
    assert!(tokens.is_empty());
    assert!(
        matches!(&end, Event::Failed(f) if f.cause == FailureCause::StepFailed),
        "{end:?}"
    );
    let (tokens, end) = collect(waiting).await;
    assert_eq!(tokens, reference_tokens(&waiting_request, &[EOS]));
    finished_length(&end, 7, 10);
    assert_eq!(s.handle.state(), EngineState::Ready);
    // The engine goes on serving.
    let again = request(prompt(2, 4), 3, 3);
    let (tokens, _) = collect(s.handle.submit(again.clone()).unwrap()).await;
    assert_eq!(tokens, reference_tokens(&again, &[EOS]));
    let text = metrics_text(&s.registry);
    assert_eq!(
        metric_value(
            &text,
            "vllm:request_success_total{finished_reason=\"error\"}"
        ),
        1.0
    );
    assert_clean(&s);
}

async fn engine_dies_on(failure: FakeFailure, expect_in_state: &str) {
    let s = start(config(64, 1), geometry(2, 64, 4));
    s.control.hold();
    let running = s.handle.submit(request(prompt(0, 9), 10, 1)).unwrap();
    assert!(s.control.wait_blocked(WAIT));
    let waiting = s.handle.submit(request(prompt(1, 9), 10, 1)).unwrap();
    s.control.fail_next(failure);
    s.control.run_free();
    for stream in [running, waiting] {
        let (tokens, end) = collect(stream).await;
        assert!(tokens.is_empty());
        assert!(
            matches!(&end, Event::Failed(f) if f.cause == FailureCause::EngineStopped),
            "{end:?}"
        );
    }
    match s.handle.state() {
        EngineState::Dead(why) => assert!(why.contains(expect_in_state), "{why}"),
        other => panic!("expected Dead, got {other:?}"),
    }
    match s.handle.submit(request(prompt(2, 3), 1, 1)) {
        Err(SubmitError::Dead(_)) => {}
        other => panic!("expected Dead, got {:?}", other.map(|s| s.id())),
    }
    // The thread has stopped: shutdown returns at once.
    tokio::time::timeout(WAIT, s.handle.shutdown(Duration::from_secs(60)))
        .await
        .expect("shutdown of a dead engine returns");
    assert!(s.control.violations().is_empty());
    wait_released(&s.handle);
}

#[tokio::test]
async fn fatal_turns_the_engine_dead() {
    engine_dies_on(FakeFailure::Fatal, "lost").await;
}

#[tokio::test]
async fn an_executor_panic_turns_the_engine_dead_instead_of_hanging() {
    engine_dies_on(FakeFailure::Panic, "panicked").await;
}

#[tokio::test]
async fn shutdown_drains_running_and_waiting_requests() {
    let s = start(config(64, 2), geometry(2, 64, 4));
    let requests: Vec<_> = (0..5)
        .map(|i| request(prompt(i, 6), 30, i as u64))
        .collect();
    let collectors: Vec<_> = requests
        .iter()
        .map(|r| tokio::spawn(collect(s.handle.submit(r.clone()).unwrap())))
        .collect();
    let handle = s.handle.clone();
    let shutdown = tokio::spawn(async move { handle.shutdown(WAIT).await });
    let until = Instant::now() + WAIT;
    while s.handle.state() != EngineState::Draining {
        assert!(Instant::now() < until);
        tokio::task::yield_now().await;
    }
    assert_eq!(
        s.handle.submit(request(prompt(9, 3), 1, 1)).err(),
        Some(SubmitError::ShuttingDown)
    );
    let drained = tokio::time::timeout(WAIT, shutdown).await.unwrap().unwrap();
    assert_eq!(drained.cut_off, 0);
    for (r, collector) in requests.iter().zip(collectors) {
        let (tokens, end) = collector.await.unwrap();
        assert_eq!(tokens, reference_tokens(r, &[EOS]));
        finished_length(&end, 6, 30);
    }
    assert_clean(&s);
}

#[tokio::test]
async fn shutdown_aborts_what_is_left_at_the_deadline() {
    let s = start(config(64, 2), geometry(2, 64, 4));
    s.control.set_delay(Duration::from_millis(5));
    let streams: Vec<_> = (0..3)
        .map(|i| s.handle.submit(request(prompt(i, 6), 200, 1)).unwrap())
        .collect();
    let started = Instant::now();
    let drained = tokio::time::timeout(WAIT, s.handle.shutdown(Duration::from_millis(50)))
        .await
        .expect("shutdown returns after its deadline");
    assert!(started.elapsed() >= Duration::from_millis(50));
    // The shutdown says how many it cut off, and so does each one's event.
    assert_eq!(drained.cut_off, 3);
    for stream in streams {
        let (tokens, end) = collect(stream).await;
        assert!(tokens.len() < 200);
        match end {
            Event::Failed(failure) => assert_eq!(failure.cause, FailureCause::ShutDown),
            other => panic!("expected Failed, got {other:?}"),
        }
    }
    assert_clean(&s);
}

#[tokio::test]
async fn a_full_queue_is_overloaded_with_a_retry_after() {
    let mut config = config(64, 1);
    config.max_num_queued_reqs = 2;
    let s = start(config, geometry(2, 64, 4));
    s.control.hold();
    let running = s.handle.submit(request(prompt(0, 4), 3, 1)).unwrap();
    // Admitted (no longer queued) once its step is held.
    assert!(s.control.wait_blocked(WAIT));
    let queued: Vec<_> = (1..3)
        .map(|i| s.handle.submit(request(prompt(i, 4), 3, 1)).unwrap())
        .collect();
    match s.handle.submit(request(prompt(3, 4), 3, 1)) {
        Err(SubmitError::Overloaded { retry_after }) => {
            assert!(retry_after >= Duration::from_secs(1))
        }
        other => panic!("expected Overloaded, got {:?}", other.map(|s| s.id())),
    }
    s.control.run_free();
    for stream in std::iter::once(running).chain(queued) {
        let (tokens, _) = collect(stream).await;
        assert_eq!(tokens.len(), 3);
    }
    // Room again.
    let (tokens, _) = collect(s.handle.submit(request(prompt(4, 4), 2, 1)).unwrap()).await;
    assert_eq!(tokens.len(), 2);
    assert_clean(&s);
}

#[tokio::test]
async fn queued_prompt_tokens_are_bounded_and_given_back() {
    let mut config = config(64, 1);
    config.max_num_queued_tokens = 10;
    config.max_num_queued_reqs = 3;
    let s = start(config, geometry(2, 64, 4));
    s.control.hold();
    let running = s.handle.submit(request(prompt(0, 8), 3, 1)).unwrap();
    // Admitted once its step is held: no longer queued.
    assert!(s.control.wait_blocked(WAIT));
    assert_eq!(s.handle.queued_tokens(), 0);
    // Two prompts fill the limit exactly; one token more is refused.
    let first = s.handle.submit(request(prompt(1, 6), 3, 1)).unwrap();
    let second = s.handle.submit(request(prompt(2, 4), 3, 1)).unwrap();
    assert_eq!(s.handle.queued_tokens(), 10);
    match s.handle.submit(request(prompt(3, 1), 3, 1)) {
        Err(SubmitError::TooManyQueuedTokens {
            retry_after,
            queued_tokens,
            prompt_tokens,
            limit,
        }) => {
            assert!(retry_after >= Duration::from_secs(1));
            assert_eq!((queued_tokens, prompt_tokens, limit), (10, 1, 10));
        }
        other => panic!(
            "expected TooManyQueuedTokens, got {:?}",
            other.map(|s| s.id())
        ),
    }
    // A queued request that goes away gives its tokens back.
    drop(first);
    s.control.run_free();
    for stream in [running, second] {
        let (tokens, _) = collect(stream).await;
        assert_eq!(tokens.len(), 3);
    }
    wait_released(&s.handle);
    assert_eq!(s.handle.queued_tokens(), 0);
    // An empty queue takes a prompt above the limit (it bounds the backlog,
    // it does not refuse long prompts); the next one waits behind it.
    s.control.hold();
    let running = s.handle.submit(request(prompt(4, 4), 2, 1)).unwrap();
    assert!(s.control.wait_blocked(WAIT));
    let long = s.handle.submit(request(prompt(5, 12), 2, 1)).unwrap();
    assert!(matches!(
        s.handle.submit(request(prompt(6, 1), 2, 1)),
        Err(SubmitError::TooManyQueuedTokens {
            queued_tokens: 12,
            ..
        })
    ));
    s.control.run_free();
    for stream in [running, long] {
        let (tokens, _) = collect(stream).await;
        assert_eq!(tokens.len(), 2);
    }
    assert_eq!(s.handle.queued_tokens(), 0);
    // The refusals took no place in the request count: three requests
    // queue again (the limit is 3).
    s.control.hold();
    let running = s.handle.submit(request(prompt(7, 4), 2, 1)).unwrap();
    assert!(s.control.wait_blocked(WAIT));
    let queued: Vec<_> = (8..11)
        .map(|i| s.handle.submit(request(prompt(i, 2), 2, 1)).unwrap())
        .collect();
    s.control.run_free();
    for stream in std::iter::once(running).chain(queued) {
        assert_eq!(collect(stream).await.0.len(), 2);
    }
    assert_eq!(s.handle.queued_tokens(), 0);
    assert_clean(&s);
}

#[tokio::test]
async fn limits_are_checked_at_submit_with_the_numbers() {
    let mut config = config(64, 2);
    config.max_model_len = 10_000; // capped by the executor to 48
    let s = start(config, geometry(2, 12, 4));
    assert_eq!(s.handle.max_model_len(), Some(48));
    let too_long = s.handle.submit(request(prompt(0, 48), 1, 1)).err();
    assert_eq!(
        too_long,
        Some(SubmitError::TooLong {
            prompt_tokens: 48,
            max_tokens: 1,
            max_model_len: 48
        })
    );
    let too_many = s.handle.submit(request(prompt(0, 40), 9, 1)).err();
    assert_eq!(
        too_many,
        Some(SubmitError::TooLong {
            prompt_tokens: 40,
            max_tokens: 9,
            max_model_len: 48
        })
    );
    // Exactly at the limit is fine, and ends by length at max_model_len.
    let (tokens, end) = collect(s.handle.submit(request(prompt(0, 40), 8, 1)).unwrap()).await;
    assert_eq!(tokens.len(), 8);
    finished_length(&end, 40, 8);
    let out_of_vocab = s.handle.submit(request(vec![1, VOCAB as u32], 1, 1)).err();
    assert!(
        matches!(&out_of_vocab, Some(SubmitError::Invalid(m)) if m.contains(&VOCAB.to_string())),
        "{out_of_vocab:?}"
    );
    let empty = s.handle.submit(request(Vec::new(), 1, 1)).err();
    assert!(matches!(empty, Some(SubmitError::Invalid(m)) if m.contains("prompt")));
    let mut hot = request(prompt(0, 3), 1, 1);
    hot.sampling = SamplingParams {
        temperature: -1.0,
        ..SamplingParams::default()
    };
    assert!(
        matches!(s.handle.submit(hot).err(), Some(SubmitError::Invalid(m)) if m.contains("temperature"))
    );
    let mut min = request(prompt(0, 3), 2, 1);
    min.stop.min_tokens = 3;
    assert!(
        matches!(s.handle.submit(min).err(), Some(SubmitError::Invalid(m)) if m.contains("min_tokens"))
    );
    assert_eq!(s.handle.stats().waiting, 0);
    assert_clean(&s);
}

#[tokio::test]
async fn loading_then_ready_or_dead() {
    let control = FakeControl::new();
    let registry = prometheus::Registry::new();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let g = geometry(2, 16, 4);
    let make = FakeExecutor::factory(g, control.clone());
    let handle = Engine::start(
        config(64, 2),
        move || {
            wait.recv().unwrap();
            make()
        },
        &registry,
    )
    .unwrap();
    assert_eq!(handle.state(), EngineState::Loading);
    assert_eq!(handle.max_model_len(), None);
    assert_eq!(
        handle.submit(request(prompt(0, 3), 1, 1)).err(),
        Some(SubmitError::Loading)
    );
    go.send(()).unwrap();
    let until = Instant::now() + WAIT;
    while handle.state() != EngineState::Ready {
        assert!(Instant::now() < until);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(handle.max_model_len(), Some(64));
    let (tokens, _) = collect(handle.submit(request(prompt(0, 3), 2, 1)).unwrap()).await;
    assert_eq!(tokens.len(), 2);
    wait_released(&handle);

    // A factory that fails leaves the engine dead with its reason.
    let failed = Engine::start(
        config(64, 2),
        || Err("no device".into()),
        &prometheus::Registry::new(),
    )
    .unwrap();
    let until = Instant::now() + WAIT;
    loop {
        match failed.state() {
            EngineState::Dead(why) => {
                assert!(why.contains("no device"), "{why}");
                break;
            }
            EngineState::Loading => assert!(Instant::now() < until),
            other => panic!("{other:?}"),
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(matches!(
        failed.submit(request(prompt(0, 3), 1, 1)).err(),
        Some(SubmitError::Dead(_))
    ));
    // A second engine in one registry is refused, not silently unmetered.
    assert!(Engine::start(config(64, 2), FakeExecutor::factory(g, control), &registry).is_err());
    // A budget below max_num_seqs is refused.
    assert!(Engine::start(
        config(4, 8),
        || Err("unused".into()),
        &prometheus::Registry::new()
    )
    .is_err());
}

#[tokio::test]
async fn metrics_carry_the_vllm_names_and_counts() {
    let s = start(config(64, 4), geometry(4, 64, 4));
    let requests: Vec<_> = (0..3)
        .map(|i| request(prompt(i, 5 + i as usize), 4, 1))
        .collect();
    for r in &requests {
        collect(s.handle.submit(r.clone()).unwrap()).await;
    }
    wait_released(&s.handle);
    let text = metrics_text(&s.registry);
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_preemptions_total",
        "vllm:request_success_total",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "gdn:state_slots_used",
        "gdn:state_slots_total",
        "gdn:step_duration_seconds",
        "gdn:tokens_per_step",
        "gdn:requests_aborted_total",
    ] {
        assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
    }
    assert_eq!(
        metric_value(&text, "vllm:prompt_tokens_total"),
        (5 + 6 + 7) as f64
    );
    assert_eq!(metric_value(&text, "vllm:generation_tokens_total"), 12.0);
    assert_eq!(
        metric_value(
            &text,
            "vllm:request_success_total{finished_reason=\"length\"}"
        ),
        3.0
    );
    assert_eq!(
        metric_value(&text, "vllm:time_to_first_token_seconds_count"),
        3.0
    );
    assert_eq!(
        metric_value(&text, "vllm:inter_token_latency_seconds_count"),
        9.0
    );
    assert_eq!(
        metric_value(&text, "vllm:e2e_request_latency_seconds_count"),
        3.0
    );
    assert_eq!(metric_value(&text, "gdn:state_slots_total"), 4.0);
    assert_eq!(metric_value(&text, "gdn:state_slots_used"), 0.0);
    assert_eq!(metric_value(&text, "vllm:num_requests_running"), 0.0);
    assert_eq!(metric_value(&text, "vllm:kv_cache_usage_perc"), 0.0);
    assert_eq!(
        metric_value(&text, "gdn:step_duration_seconds_count"),
        s.handle.stats().steps as f64
    );
    assert_clean(&s);
}

#[test]
fn handles_and_streams_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<engine::EngineHandle>();
    send::<engine::RequestStream>();
}
