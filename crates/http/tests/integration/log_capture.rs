//! The log lines of this test binary. A process has one logger, and every
//! module of the binary shares it: each test tells its own lines apart by
//! request id (and by target where it wants one).

use std::sync::{Mutex, OnceLock};

/// Every record logged so far: (target, message).
static LINES: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        let line = (record.target().to_string(), record.args().to_string());
        LINES.lock().unwrap().push(line);
    }
    fn flush(&self) {}
}

/// Installs the capturing logger (once per process; later calls do nothing).
pub fn capture_logs() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        log::set_logger(&Capture).expect("no other logger in this binary");
        log::set_max_level(log::LevelFilter::Debug);
    });
}

/// The messages logged so far whose target and text pass `keep`.
pub fn captured(keep: impl Fn(&str, &str) -> bool) -> Vec<String> {
    let lines = LINES.lock().unwrap();
    lines
        .iter()
        .filter(|(target, message)| keep(target, message))
        .map(|(_, message)| message.clone())
        .collect()
}
