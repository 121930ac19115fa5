//! The request timeline's server side (`--request-timeline`, off by
//! default): stamps from the moment a generation request reaches its
//! handler (body read, JSON decoded, template rendered, prompt tokenized,
//! submitted to the engine) to the first output text handed to the
//! response, joined with the engine's stamps that come with the first
//! token ([`engine::EngineTimeline`]: accepted, scheduled, every step with
//! the executor's host prep / launch / device forward / sampling split).
//! One log line per request, when its first text goes out (or when it ends
//! without any):
//!
//! ```text
//! [INFO gdn_server::timeline] request_timeline {"request": ..., "ms": {...}, "steps": [...]}
//! ```
//!
//! Times are milliseconds since the handler received the request, whose
//! wall-clock time is `received_unix_ms` (to line up requests).
//! `checks/bench/ttft_breakdown.sh` reads these lines. Off, a [`Timeline`]
//! is an empty `Option`: no clock is read and nothing is logged.

use std::time::{Instant, SystemTime};

use engine::timeline::ms_between;
use engine::{EngineTimeline, StepMark};
use serde_json::{json, Map, Value as Json};

/// The lines' log target: its name from before the HTTP layer was a crate
/// of its own, kept so that log filters and the logs quoted under
/// docs/results/ (e.g. docs/results/h200-2026-12-01/README.md) still match.
pub const LOG_TARGET: &str = "gdn_server::timeline";
/// What each line starts with (after the logger's prefix).
pub const LINE_TAG: &str = "request_timeline";

#[derive(Debug)]
struct Marks {
    received: Instant,
    /// The wall clock at `received`: lines of requests served together can
    /// be put on one time axis (steps they shared have the same times).
    received_wall: SystemTime,
    marks: Vec<(&'static str, Instant)>,
    engine: Option<Box<EngineTimeline>>,
    /// Tokens received before the first text went out.
    tokens: usize,
}

/// One request's server-side stamps (`None` inside: the timeline is off).
#[derive(Debug, Default)]
pub struct Timeline(Option<Box<Marks>>);

impl Timeline {
    /// Starts the record now (the request was received) when `on`.
    pub fn start(on: bool) -> Self {
        Timeline(on.then(|| {
            Box::new(Marks {
                received: Instant::now(),
                received_wall: SystemTime::now(),
                marks: Vec::new(),
                engine: None,
                tokens: 0,
            })
        }))
    }

    pub fn off() -> Self {
        Timeline(None)
    }

    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Stamps `what` now (nothing when off).
    pub fn mark(&mut self, what: &'static str) {
        if let Some(m) = self.0.as_mut() {
            m.marks.push((what, Instant::now()));
        }
    }

    /// A token arrived from the engine (the first one may carry the
    /// engine's record).
    pub fn token(&mut self, engine: Option<&EngineTimeline>) {
        let Some(m) = self.0.as_mut() else { return };
        m.tokens += 1;
        if m.tokens == 1 {
            m.marks.push(("first_token_received", Instant::now()));
        }
        if let (None, Some(e)) = (&m.engine, engine) {
            m.engine = Some(Box::new(e.clone()));
        }
    }

    /// The first text is handed to the response now (or the request ended
    /// without text): logs the line once and turns the record off.
    pub fn first_text(&mut self, request_id: &str, what: &'static str) {
        let Some(mut m) = self.0.take() else { return };
        m.marks.push((what, Instant::now()));
        log::info!(target: LOG_TARGET, "{LINE_TAG} {}", line(request_id, &m));
    }
}

fn ms(m: &Marks, at: Instant) -> Json {
    json!((ms_between(m.received, at) * 1e3).round() / 1e3)
}

fn step_json(m: &Marks, s: &StepMark) -> Json {
    let mut o = Map::new();
    for (k, at) in [
        ("planned", s.planned),
        ("exec_start", s.exec_start),
        ("exec_end", s.exec_end),
        ("committed", s.committed),
    ] {
        o.insert(k.into(), ms(m, at));
    }
    o.insert("rows".into(), json!(s.rows));
    o.insert("tokens".into(), json!(s.tokens));
    o.insert("start".into(), json!(s.start));
    o.insert("len".into(), json!(s.len));
    o.insert("sampled".into(), json!(s.sampled));
    o.insert("cache_ops_before".into(), json!(s.cache_ops_before));
    o.insert("snapshots_in_row".into(), json!(s.snapshots_in_row));
    if let Some(p) = s.phases {
        let d = |d: std::time::Duration| json!((d.as_secs_f64() * 1e6).round() / 1e3);
        o.insert("host_prep".into(), d(p.host_prep));
        o.insert("launch".into(), d(p.launch));
        o.insert("forward".into(), d(p.forward));
        o.insert("sample".into(), d(p.sample));
    }
    Json::Object(o)
}

/// The JSON of one record.
fn line(request_id: &str, m: &Marks) -> Json {
    let mut stamps: Vec<(&str, Instant)> = m.marks.clone();
    let mut steps = Vec::new();
    let (mut prompt_tokens, mut cached_tokens) = (Json::Null, Json::Null);
    if let Some(e) = &m.engine {
        stamps.push(("engine_submitted", e.submitted));
        stamps.push(("engine_accepted", e.accepted));
        if let Some(at) = e.first_scheduled {
            stamps.push(("first_scheduled", at));
        }
        stamps.push(("first_token_sent", e.first_token_sent));
        steps = e.steps.iter().map(|s| step_json(m, s)).collect();
        prompt_tokens = json!(e.prompt_tokens);
        cached_tokens = json!(e.cached_tokens);
    }
    // In time order, as [name, ms] pairs (a JSON object would not keep it).
    stamps.sort_by_key(|&(_, at)| at);
    let times: Vec<Json> = stamps
        .into_iter()
        .map(|(what, at)| json!([what, ms(m, at)]))
        .collect();
    let received_unix_ms = m
        .received_wall
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| (d.as_secs_f64() * 1e6).round() / 1e3);
    json!({
        "request": request_id,
        "received_unix_ms": received_unix_ms,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "tokens_before_text": m.tokens,
        "ms": times,
        "steps": steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn off_stamps_nothing_and_logs_nothing() {
        let mut t = Timeline::start(false);
        t.mark("body_read");
        t.token(None);
        t.first_text("r", "first_text");
        assert!(!t.is_on());
        assert!(t.0.is_none());
    }

    #[test]
    fn the_line_orders_server_and_engine_stamps_from_reception() {
        let mut t = Timeline::start(true);
        let received = t.0.as_ref().unwrap().received;
        let at = |ms: u64| received + Duration::from_millis(ms);
        t.0.as_mut().unwrap().marks.push(("tokenized", at(2)));
        let step = StepMark {
            planned: at(3),
            exec_start: at(4),
            exec_end: at(30),
            committed: at(31),
            phases: Some(engine::StepPhases {
                host_prep: Duration::from_micros(250),
                launch: Duration::from_millis(2),
                forward: Duration::from_millis(25),
                sample: Duration::from_micros(500),
            }),
            rows: 1,
            tokens: 1024,
            start: 0,
            len: 1024,
            cache_ops_before: 0,
            snapshots_in_row: 0,
            sampled: true,
        };
        let engine = EngineTimeline {
            submitted: at(2),
            accepted: at(3),
            first_scheduled: Some(at(3)),
            steps: vec![step],
            first_token_sent: at(32),
            prompt_tokens: 1024,
            cached_tokens: 0,
        };
        t.token(Some(&engine));
        t.token(None);
        let m = t.0.as_ref().unwrap();
        let j = line("req-1", m);
        assert_eq!(j["request"], "req-1");
        let wall = j["received_unix_ms"].as_f64().unwrap();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
            * 1e3;
        assert!(wall <= now && now - wall < 60_000.0, "{wall} vs {now}");
        assert_eq!(j["prompt_tokens"], 1024);
        assert_eq!(j["tokens_before_text"], 2);
        let times: Vec<(String, f64)> = j["ms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_str().unwrap().to_string(), p[1].as_f64().unwrap()))
            .collect();
        let at_ms = |name: &str| times.iter().find(|(n, _)| n == name).unwrap().1;
        assert_eq!(at_ms("tokenized"), 2.0);
        assert_eq!(at_ms("engine_submitted"), 2.0);
        assert_eq!(at_ms("engine_accepted"), 3.0);
        assert_eq!(at_ms("first_scheduled"), 3.0);
        assert_eq!(at_ms("first_token_sent"), 32.0);
        assert!(at_ms("first_token_received") >= 0.0);
        assert_eq!(times.len(), 6);
        // In time order.
        assert!(times.windows(2).all(|w| w[0].1 <= w[1].1), "{times:?}");
        let s = &j["steps"][0];
        assert_eq!(s["exec_start"], 4.0);
        assert_eq!(s["exec_end"], 30.0);
        assert_eq!(s["forward"], 25.0);
        assert_eq!(s["host_prep"], 0.25);
        assert_eq!(s["len"], 1024);
        assert_eq!(s["sampled"], true);
        // Logging ends the record.
        t.first_text("req-1", "first_text");
        assert!(!t.is_on());
    }
}
