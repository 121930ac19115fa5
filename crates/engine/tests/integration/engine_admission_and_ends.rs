//! How many requests the engine takes at once (the running batch plus
//! `max_num_queued_reqs` waiting beyond it), and how a request that the
//! client ends itself is counted, with the fake executor.

use crate::common;

use std::time::Duration;

use common::*;
use engine::{Event, SubmitError};
use engine_testkit::collect;

const WAIT: Duration = Duration::from_secs(10);

/// Submits until the engine refuses; the streams taken and the refusal.
fn fill(s: &Started, up_to: u32) -> (Vec<engine::RequestStream>, Option<SubmitError>) {
    let mut streams = Vec::new();
    for i in 0..up_to {
        match s.handle.submit(request(prompt(i, 4), 2, 1)) {
            Ok(stream) => streams.push(stream),
            Err(e) => return (streams, Some(e)),
        }
    }
    (streams, None)
}

#[tokio::test]
async fn a_burst_within_the_slots_is_admitted_and_only_the_rest_queues() {
    // Eight slots, two waiting places: a burst of ten arriving before any
    // step ran is taken whole (none of the first eight waits for a slot),
    // the eleventh is refused with a Retry-After.
    let mut config = config(64, 8);
    config.max_num_queued_reqs = 2;
    let s = start(config, geometry(8, 64, 4));
    s.control.hold();
    let (streams, refused) = fill(&s, 11);
    assert_eq!(streams.len(), 10, "refused early: {refused:?}");
    match refused {
        Some(SubmitError::Overloaded { retry_after }) => {
            assert!(retry_after >= Duration::from_secs(1))
        }
        other => panic!("expected Overloaded, got {other:?}"),
    }
    s.control.run_free();
    for stream in streams {
        assert_eq!(collect(stream).await.0.len(), 2);
    }
    assert_clean(&s);

    // The batch holds the executor's slots when they are fewer than
    // max_num_seqs: four slots and two waiting places take six.
    let mut config = common::config(64, 8);
    config.max_num_queued_reqs = 2;
    let s = start(config, geometry(4, 64, 4));
    s.control.hold();
    let (streams, refused) = fill(&s, 7);
    assert_eq!(streams.len(), 6);
    assert!(matches!(refused, Some(SubmitError::Overloaded { .. })));
    // A request that ends gives its place back.
    drop(streams);
    s.control.run_free();
    let until = std::time::Instant::now() + WAIT;
    while s.handle.stats().aborted < 6 {
        assert!(std::time::Instant::now() < until, "{:?}", s.handle.stats());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (streams, _) = fill(&s, 1);
    assert_eq!(
        collect(streams.into_iter().next().unwrap()).await.0.len(),
        2
    );
    assert_clean(&s);
}

#[tokio::test]
async fn a_request_the_client_stops_counts_as_finished_by_stop_not_aborted() {
    let s = start(config(64, 2), geometry(2, 64, 4));
    s.control.set_delay(Duration::from_millis(2));
    let mut stopped = s.handle.submit(request(prompt(0, 5), 100, 1)).unwrap();
    assert!(matches!(stopped.next().await, Some(Event::Token(_))));
    stopped.stop();
    let mut aborted = s.handle.submit(request(prompt(1, 5), 100, 1)).unwrap();
    assert!(matches!(aborted.next().await, Some(Event::Token(_))));
    drop(aborted);
    wait_released(&s.handle);
    let until = std::time::Instant::now() + WAIT;
    let text = loop {
        let text = metrics_text(&s.registry);
        let ended = metric_value(
            &text,
            "vllm:request_success_total{finished_reason=\"stop\"}",
        ) + metric_value(
            &text,
            "vllm:request_success_total{finished_reason=\"abort\"}",
        );
        if ended == 2.0 {
            break text;
        }
        assert!(std::time::Instant::now() < until, "{text}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let count = |reason: &str| {
        metric_value(
            &text,
            &format!("vllm:request_success_total{{finished_reason=\"{reason}\"}}"),
        )
    };
    assert_eq!((count("stop"), count("abort")), (1.0, 1.0));
    assert_eq!(metric_value(&text, "gdn:requests_aborted_total"), 1.0);
    assert_eq!(s.handle.stats().aborted, 1);
    // A finish: its end-to-end latency is observed, the abort's is not.
    assert_eq!(
        metric_value(&text, "vllm:e2e_request_latency_seconds_count"),
        1.0
    );
    assert_clean(&s);
}
