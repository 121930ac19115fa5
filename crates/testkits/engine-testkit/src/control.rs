//! The test's side of a [`crate::FakeExecutor`]: every step's rows as the
//! fake saw them, the contract breaches it found, injected failures, a
//! delay per step, and steps held until released.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use engine::{PageId, SlotId};

/// One row as the fake saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowRecord {
    pub slot: SlotId,
    pub start: usize,
    pub tokens: Vec<u32>,
    pub pages: Vec<PageId>,
    pub sample: bool,
    /// The positions of the snapshots taken inside the row.
    pub snapshots: Vec<usize>,
}

/// What the next step does instead of running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FakeFailure {
    Refused,
    StepFailed,
    Fatal,
    Panic,
}

#[derive(Default)]
pub(crate) struct ControlState {
    pub(crate) steps: Vec<Vec<RowRecord>>,
    pub(crate) violations: Vec<String>,
    pub(crate) failures: VecDeque<FakeFailure>,
    /// `Some(n)`: n more steps may start, then each waits for a release.
    pub(crate) permits: Option<u64>,
    /// A step is waiting for a permit.
    pub(crate) blocked: bool,
    pub(crate) delay: Duration,
}

/// The test's side of a [`crate::FakeExecutor`]: cheap to clone.
#[derive(Clone, Default)]
pub struct FakeControl(pub(crate) Arc<(Mutex<ControlState>, Condvar)>);

impl FakeControl {
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, ControlState> {
        self.0 .0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every step's rows so far, in order.
    pub fn steps(&self) -> Vec<Vec<RowRecord>> {
        self.lock().steps.clone()
    }

    pub fn num_steps(&self) -> usize {
        self.lock().steps.len()
    }

    /// Contract breaches seen so far (empty when the engine behaved).
    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    /// The next step (after those already queued) fails this way.
    pub fn fail_next(&self, failure: FakeFailure) {
        self.lock().failures.push_back(failure);
    }

    /// Each step sleeps this long (to let a test act while one is running).
    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// From now on steps wait for [`Self::release`] (`hold` itself grants none).
    pub fn hold(&self) {
        self.lock().permits = Some(0);
    }

    /// Lets `n` more held steps run.
    pub fn release(&self, n: u64) {
        let mut state = self.lock();
        if let Some(permits) = state.permits.as_mut() {
            *permits += n;
        }
        self.0 .1.notify_all();
    }

    /// Steps run freely again.
    pub fn run_free(&self) {
        self.lock().permits = None;
        self.0 .1.notify_all();
    }

    /// Waits (polling) until a held step is waiting for a permit; false on timeout.
    pub fn wait_blocked(&self, timeout: Duration) -> bool {
        let until = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < until {
            if self.lock().blocked {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    /// Waits (polling) until at least `n` steps were recorded; false on timeout.
    pub fn wait_steps(&self, n: usize, timeout: Duration) -> bool {
        let until = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < until {
            if self.num_steps() >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.num_steps() >= n
    }
}
