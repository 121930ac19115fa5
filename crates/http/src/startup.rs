//! Where a cold start goes. Each start-up phase (demo unpack, tokenizer,
//! chat template, CUDA context, weights upload, cache, each decode graph
//! bucket, bind, ...) records its wall time here, from whichever thread ran
//! it; once the engine is ready one line `startup: phase=ms ... ready=ms`
//! goes to the log and every phase is a gauge
//! `gdn:startup_phase_seconds{phase=...}` in `/metrics`. `ready` is the
//! time from process start (or from this record's creation where no
//! process start was marked) to the engine being ready. The tokenizer and
//! template load while the engine thread loads the weights, so phases
//! overlap: their sum can exceed `ready`.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use prometheus::{GaugeVec, Opts, Registry};

static PROCESS_START: OnceLock<Instant> = OnceLock::new();

/// Marks the process start (first thing in `main`).
pub fn mark_process_start() {
    PROCESS_START.get_or_init(Instant::now);
}

pub struct Startup {
    origin: Instant,
    phases: Mutex<Vec<(String, Duration)>>,
    gauge: GaugeVec,
}

impl Startup {
    pub fn new() -> Arc<Startup> {
        let gauge = GaugeVec::new(
            Opts::new(
                "gdn:startup_phase_seconds",
                "Wall time of each start-up phase (ready: process start to engine ready)",
            ),
            &["phase"],
        )
        .expect("a valid metric definition");
        Arc::new(Startup {
            origin: PROCESS_START.get().copied().unwrap_or_else(Instant::now),
            phases: Mutex::new(Vec::new()),
            gauge,
        })
    }

    pub fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.gauge.clone()))
    }

    pub fn record(&self, phase: &str, took: Duration) {
        self.gauge
            .with_label_values(&[phase])
            .set(took.as_secs_f64());
        self.phases.lock().unwrap().push((phase.to_string(), took));
    }

    /// Runs `f` and records its wall time under `phase`.
    pub fn time<T>(&self, phase: &str, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.record(phase, start.elapsed());
        out
    }

    /// Records `ready` (since the origin) and returns the summary line:
    /// the phases in the order they were recorded, in milliseconds.
    pub fn ready(&self) -> String {
        self.record("ready", self.origin.elapsed());
        self.summary()
    }

    pub fn summary(&self) -> String {
        let phases = self.phases.lock().unwrap();
        let mut line = String::from("startup:");
        for (phase, took) in phases.iter() {
            line.push_str(&format!(" {phase}={:.0}", took.as_secs_f64() * 1e3));
        }
        line
    }

    /// The recorded phases, in order.
    pub fn phases(&self) -> Vec<(String, Duration)> {
        self.phases.lock().unwrap().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_go_to_the_line_in_order_and_to_the_gauges() {
        let startup = Startup::new();
        let registry = Registry::new();
        startup.register(&registry).unwrap();
        startup.record("tokenizer", Duration::from_millis(250));
        let v = startup.time("bind", || {
            std::thread::sleep(Duration::from_millis(15));
            3
        });
        assert_eq!(v, 3);
        let line = startup.ready();
        assert!(line.starts_with("startup: tokenizer=250 bind="), "{line}");
        let ready = startup.phases().last().unwrap().1;
        assert!(ready >= Duration::from_millis(15), "{ready:?}");
        assert!(line.ends_with(&format!(" ready={:.0}", ready.as_secs_f64() * 1e3)));
        let mut text = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut text,
        )
        .unwrap();
        let text = String::from_utf8(text).unwrap();
        let value = |phase: &str| -> Option<f64> {
            let key = format!("gdn:startup_phase_seconds{{phase=\"{phase}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&key))
                .map(|v| v.parse().unwrap())
        };
        assert_eq!(value("tokenizer"), Some(0.25), "{text}");
        assert!(value("bind").unwrap() >= 0.015);
        assert_eq!(value("ready"), Some(ready.as_secs_f64()));
    }
}
