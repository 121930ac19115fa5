//! The request timeline: off, no token carries a record; on, the first
//! token (only) carries the engine's stamps, one step mark per prefill
//! chunk, in order, with the executor's phases.

use crate::common;

use std::time::Duration;

use common::*;
use engine::{EngineTimeline, Event, RequestStream};

/// Every event of a stream, the terminal one last.
async fn events(mut stream: RequestStream) -> Vec<Event> {
    let mut out = Vec::new();
    while let Some(event) = stream.next().await {
        out.push(event);
    }
    out
}

fn timelines(events: &[Event]) -> Vec<Option<EngineTimeline>> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Token(t) => Some(t.timeline.as_deref().cloned()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn off_by_default_no_token_carries_a_timeline() {
    let s = start(config(8, 4), geometry(4, 32, 4));
    let stream = s.handle.submit(request(prompt(1, 20), 3, 7)).unwrap();
    let events = events(stream).await;
    let t = timelines(&events);
    assert_eq!(t.len(), 3);
    assert!(t.iter().all(Option::is_none));
    assert_clean(&s);
}

#[tokio::test]
async fn the_first_token_carries_one_mark_per_chunk_in_order() {
    let mut c = config(8, 4);
    c.request_timeline = true;
    let s = start(c, geometry(4, 32, 4));
    let delay = Duration::from_millis(3);
    s.control.set_delay(delay);
    // 20 prompt tokens under a budget of 8: three equal chunks (7, 7, 6).
    let stream = s.handle.submit(request(prompt(2, 20), 3, 7)).unwrap();
    let events = events(stream).await;
    let t = timelines(&events);
    assert_eq!(t.len(), 3);
    assert!(t[1].is_none() && t[2].is_none(), "only the first token");
    let tl = t[0].clone().expect("the first token carries the timeline");
    assert_eq!(tl.prompt_tokens, 20);
    assert_eq!(tl.cached_tokens, 0);
    let chunks: Vec<_> = tl.steps.iter().map(|m| (m.start, m.len)).collect();
    assert_eq!(chunks, vec![(0, 7), (7, 7), (14, 6)]);
    let sampled: Vec<bool> = tl.steps.iter().map(|m| m.sampled).collect();
    assert_eq!(sampled, vec![false, false, true]);
    assert!(tl.steps.iter().all(|m| m.rows == 1 && m.tokens == m.len));
    // Stamps in the order the work happened.
    let scheduled = tl.first_scheduled.expect("scheduled");
    assert!(tl.submitted <= tl.accepted && tl.accepted <= scheduled);
    assert!(tl.steps[0].planned <= scheduled);
    let mut last = tl.steps[0].planned;
    for m in &tl.steps {
        for at in [m.planned, m.exec_start, m.exec_end, m.committed] {
            assert!(last <= at, "{m:?}");
            last = at;
        }
        // The executor call holds the fake's delay, and its own split
        // reports it as the forward.
        assert!(m.exec_end - m.exec_start >= delay, "{m:?}");
        let phases = m.phases.expect("the fake reports phases when asked");
        assert!(phases.forward >= delay, "{phases:?}");
        assert!(phases.forward <= m.exec_end - m.exec_start, "{phases:?}");
    }
    assert!(last <= tl.first_token_sent);
    assert_clean(&s);
}

#[tokio::test]
async fn a_request_that_joins_running_decodes_records_the_shared_steps() {
    let mut c = config(16, 4);
    c.request_timeline = true;
    let s = start(c, geometry(4, 32, 4));
    s.control.hold();
    let first = s.handle.submit(request(prompt(3, 4), 6, 1)).unwrap();
    // Let the first request prefill and sample, then queue the second so
    // that it is admitted next to the first one's decode.
    s.control.release(1);
    assert!(s.control.wait_steps(1, Duration::from_secs(5)));
    assert!(s.control.wait_blocked(Duration::from_secs(5)));
    let second = s.handle.submit(request(prompt(4, 6), 2, 2)).unwrap();
    s.control.run_free();
    let (a, b) = (events(first).await, events(second).await);
    let tb = timelines(&b)[0].clone().expect("timeline");
    assert_eq!(tb.steps.len(), 1);
    let m = &tb.steps[0];
    // Its prefill row (6 tokens) shares the step with the first one's decode.
    assert_eq!((m.start, m.len, m.rows, m.tokens), (0, 6, 2, 7));
    assert!(m.sampled);
    let ta = timelines(&a)[0].clone().expect("timeline");
    assert_eq!(ta.steps.len(), 1);
    assert_eq!((ta.steps[0].rows, ta.steps[0].tokens), (1, 4));
    assert_clean(&s);
}
