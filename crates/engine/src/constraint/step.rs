//! The engine thread's side of structured outputs: each constrained
//! request's matcher, the masks handed out for a step (computed on the
//! pool while the executor runs, each after its matcher consumed the
//! tokens sampled since its last mask), and what those jobs found.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::matcher::{MatcherError, RequestMatcher};
use super::pool::MaskPool;
use super::Compiled;
use crate::executor::{AllowedTokens, PendingMask};
use crate::metrics::Metrics;
use crate::request::RequestId;
use crate::scheduler::Plan;

/// The constrained requests' matchers and the pool their masks run on.
pub(crate) struct StepConstraints {
    matchers: HashMap<RequestId, Tracked>,
    pool: MaskPool,
    /// The executor's logits width.
    width: usize,
}

/// A request's matcher and how many of its output tokens it was given
/// (the engine thread's count: the matcher itself may be busy on the pool).
struct Tracked {
    matcher: Arc<Mutex<RequestMatcher>>,
    given: usize,
}

/// A step's masks: one entry per plan row (`Some` for a constrained row
/// that samples), and the reports of the jobs computing them.
pub(crate) struct StepMasks {
    pub(crate) allowed: Vec<Option<AllowedTokens>>,
    pending: Vec<Arc<PendingMask>>,
    reports: mpsc::Receiver<Report>,
}

/// What a mask job did.
struct Report {
    id: RequestId,
    elapsed: Duration,
    outcome: Result<MaskOutcome, MatcherError>,
}

/// Where a mask job found its matcher once the output was consumed.
enum MaskOutcome {
    /// The grammar goes on: the mask is what may come next.
    Open,
    /// The grammar has ended: the mask allows only EOS.
    Ended,
}

/// What a step's mask jobs found: requests the grammar had ended (they end
/// with the step's EOS), and requests whose matcher failed (they cannot go
/// on).
#[derive(Default)]
pub(crate) struct Advanced {
    pub(crate) stopped: Vec<RequestId>,
    pub(crate) failed: Vec<(RequestId, MatcherError)>,
}

impl StepConstraints {
    pub(crate) fn new(threads: usize, width: usize) -> Self {
        StepConstraints {
            matchers: HashMap::new(),
            pool: MaskPool::new(threads),
            width,
        }
    }

    pub(crate) fn add(&mut self, id: RequestId, compiled: Compiled) {
        let matcher = Arc::new(Mutex::new(RequestMatcher::new(compiled)));
        self.matchers.insert(id, Tracked { matcher, given: 0 });
    }

    /// Drops the matchers of requests that ended.
    pub(crate) fn retain(&mut self, mut alive: impl FnMut(RequestId) -> bool) {
        self.matchers.retain(|&id, _| alive(id));
    }

    /// Starts the masks of the plan's constrained sampling rows; `output`
    /// gives a request's output so far (a matcher behind it replays the
    /// rest first).
    pub(crate) fn start_masks<'a>(
        &mut self,
        plan: &Plan,
        output: impl Fn(RequestId) -> &'a [u32],
    ) -> StepMasks {
        let (done, reports) = mpsc::channel();
        let mut pending = Vec::new();
        let mut jobs = Vec::new();
        let allowed = plan
            .rows
            .iter()
            .map(|row| {
                let tracked = self.matchers.get_mut(&row.id).filter(|_| row.sample)?;
                let output = output(row.id);
                // The token sampled last step (more after a preemption):
                // the job consumes them before the mask.
                let missed = output.get(tracked.given..).unwrap_or_default().to_vec();
                tracked.given = tracked.given.max(output.len());
                let mask = Arc::new(PendingMask::default());
                pending.push(mask.clone());
                jobs.push(MaskJob {
                    id: row.id,
                    matcher: tracked.matcher.clone(),
                    missed,
                    mask: mask.clone(),
                });
                Some(AllowedTokens::pending(mask))
            })
            .collect();
        // One task per pool thread, each taking the next row's mask until
        // none is left: a few hand-offs a step instead of one a row (each
        // wakes a thread on the engine thread's time), and a slow mask
        // holds up only its own thread.
        let queue = Arc::new(MaskQueue {
            jobs,
            next: AtomicUsize::new(0),
        });
        for _ in 0..self.pool.width().min(queue.jobs.len()) {
            let (queue, done, width) = (queue.clone(), done.clone(), self.width);
            self.pool.run(move || {
                while let Some(job) = queue.jobs.get(queue.next.fetch_add(1, Ordering::Relaxed)) {
                    let _ = done.send(job.run(width));
                }
            });
        }
        StepMasks {
            allowed,
            pending,
            reports,
        }
    }

    /// After a step: counts its masks and collects what their jobs found,
    /// the requests whose grammar had ended (their mask allowed only EOS:
    /// they end with this step's token) and the matchers that failed.
    ///
    /// The matchers are not advanced here: the next step's mask job
    /// consumes the sampled token first, on the pool while the device runs
    /// that step's forward, which keeps the advances off the engine
    /// thread's path between two steps (docs/results/h200-2026-12-03-s11).
    pub(crate) fn finish_step(&mut self, masks: StepMasks, metrics: &Metrics) -> Advanced {
        let mut advanced = Advanced::default();
        if masks.pending.is_empty() {
            return advanced;
        }
        let waited = masks.pending.iter().filter(|m| m.waited()).count();
        metrics.structured_output_steps.inc();
        metrics
            .structured_output_masks
            .inc_by(masks.pending.len() as u64);
        metrics.structured_output_mask_waits.inc_by(waited as u64);
        if waited > 0 {
            metrics.structured_output_steps_waited.inc();
            let blocked: f64 = masks.pending.iter().map(|m| m.wait_seconds()).sum();
            metrics.structured_output_wait_seconds.observe(blocked);
        }
        if masks.pending.iter().any(|m| m.late()) {
            metrics.structured_output_steps_late.inc();
        }
        // Every job reports once (its mask is already fulfilled, so this
        // waits only for jobs whose mask no sampler read).
        for report in masks.reports.iter().take(masks.pending.len()) {
            metrics
                .structured_output_mask_seconds
                .observe(report.elapsed.as_secs_f64());
            match report.outcome {
                Ok(MaskOutcome::Open) => {}
                Ok(MaskOutcome::Ended) => advanced.stopped.push(report.id),
                Err(error) => advanced.failed.push((report.id, error)),
            }
        }
        advanced
    }
}

/// A constrained row's mask to compute.
struct MaskJob {
    id: RequestId,
    matcher: Arc<Mutex<RequestMatcher>>,
    /// Output tokens its matcher has not consumed yet.
    missed: Vec<u32>,
    mask: Arc<PendingMask>,
}

/// A step's mask jobs, taken in order by the pool's tasks.
struct MaskQueue {
    jobs: Vec<MaskJob>,
    next: AtomicUsize,
}

impl MaskJob {
    /// Computes and fulfils the mask (all-zero when the matcher fails: the
    /// request fails after the step whatever the sampler picks).
    fn run(&self, width: usize) -> Report {
        let started = Instant::now();
        let words = catch_unwind(AssertUnwindSafe(|| {
            let mut matcher = self.matcher.lock().unwrap_or_else(|e| e.into_inner());
            matcher.replay(&self.missed)?;
            let ended = matcher.is_stopped();
            let words = matcher.mask(width)?;
            Ok((
                words,
                if ended {
                    MaskOutcome::Ended
                } else {
                    MaskOutcome::Open
                },
            ))
        }))
        .unwrap_or_else(|_| Err(MatcherError("the matcher panicked".into())));
        let (words, outcome) = match words {
            Ok((words, outcome)) => (words, Ok(outcome)),
            Err(e) => (vec![0; width.div_ceil(32)], Err(e)),
        };
        self.mask.fulfil(words);
        Report {
            id: self.id,
            elapsed: started.elapsed(),
            outcome,
        }
    }
}
