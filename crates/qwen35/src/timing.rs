//! Wall time of named start-up phases (loading, uploading, capturing), kept
//! in the order they ran so a caller can report where a cold start went.

use std::time::{Duration, Instant};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhaseTimes(Vec<(String, Duration)>);

impl PhaseTimes {
    /// Runs `f` and records its wall time under `phase`.
    pub fn time<T>(&mut self, phase: impl Into<String>, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.push(phase, start.elapsed());
        out
    }

    pub fn push(&mut self, phase: impl Into<String>, took: Duration) {
        self.0.push((phase.into(), took));
    }

    pub fn extend(&mut self, other: &PhaseTimes) {
        self.0.extend(other.0.iter().cloned());
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, Duration)> {
        self.0.iter().map(|(p, d)| (p.as_str(), *d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_keep_their_order_and_measure_the_closure() {
        let mut t = PhaseTimes::default();
        let v = t.time("sleep", || {
            std::thread::sleep(Duration::from_millis(20));
            7
        });
        assert_eq!(v, 7);
        t.push("given", Duration::from_millis(3));
        let mut u = PhaseTimes::default();
        u.push("later", Duration::from_millis(1));
        t.extend(&u);
        let names: Vec<&str> = t.iter().map(|(p, _)| p).collect();
        assert_eq!(names, ["sleep", "given", "later"]);
        let slept = t.iter().next().unwrap().1;
        assert!(slept >= Duration::from_millis(20), "{slept:?}");
        assert_eq!(t.iter().nth(1).unwrap().1, Duration::from_millis(3));
    }
}
