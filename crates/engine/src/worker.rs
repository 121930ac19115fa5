//! The engine thread: owns the executor and the scheduler, takes commands
//! from a channel (blocking when there is no work), runs one step at a
//! time and sends each request its events.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use thiserror::Error;
use tokio::sync::mpsc as tokio_mpsc;

use crate::constraint::StepConstraints;
use crate::executor::{AllowedTokens, ExecError, Executor};
use crate::metrics::Metrics;
use crate::prefix_cache::{CacheOp, PrefixCacheStats};
use crate::protocol::{Command, EngineStats, Shared, Submission};
use crate::request::{
    EngineState, Event, Failure, FailureCause, FinishReason, RequestId, TokenEvent, Usage,
};
use crate::scheduler::{Outcome, Plan, Scheduler};
use crate::timeline::{Pending, StepMark};

mod request_memory;
mod start;
pub(crate) use start::{run, LoadError};

/// Client-safe texts (details go to the log).
const STEP_FAILED: &str = "the request failed on the device; it may be retried";
const SHUT_DOWN: &str = "the server shut down before the request finished";
const ENGINE_STOPPED: &str = "the engine stopped; the request did not complete";
const CONSTRAINT_FAILED: &str = "the output could not continue under its constraint";

/// A request's client side, as the engine thread keeps it.
struct Client {
    events: tokio_mpsc::UnboundedSender<Event>,
    /// The client ended the request itself ([`crate::RequestStream::stop`]).
    stopped_by_client: Arc<AtomicBool>,
    /// Counted in `Shared::queued_tokens` until first admitted.
    prompt_tokens: usize,
    logprobs: bool,
    arrival: Instant,
    first_scheduled: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// The request timeline's stamps until the first token (`None` when
    /// the timeline is off, and after the first token).
    timeline: Option<Pending>,
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}

/// Why the engine thread stops serving (every request then fails).
#[derive(Debug, Error)]
enum Stop {
    #[error("executor panicked: {0}")]
    ExecutorPanicked(String),
    /// [`ExecError::Fatal`]'s message.
    #[error("executor lost: {0}")]
    ExecutorLost(String),
    #[error("scheduler planned an empty step with requests pending")]
    EmptyPlan,
    /// A snapshot that failed is in the tree but holds nothing usable: the
    /// cache cannot be trusted any more.
    #[error("taking prefix-cache snapshots: {0}")]
    Snapshots(ExecError),
    /// A map or unmap of the arena failed: what the allocator holds and
    /// what the executor has mapped may differ from here on.
    #[error("mapping the arena: {0}")]
    Memory(ExecError),
}

struct Worker {
    shared: Arc<Shared>,
    /// `None` once dead.
    executor: Option<Box<dyn Executor>>,
    scheduler: Scheduler,
    clients: HashMap<RequestId, Client>,
    metrics: Metrics,
    /// Seeds for requests without one.
    seeds: RandomState,
    steps: u64,
    aborted: u64,
    /// Set by a shutdown command.
    deadline: Option<Instant>,
    snapshot_bytes: usize,
    /// The cache counts last added to the metrics.
    published_cache: PrefixCacheStats,
    /// Constrained requests' matchers (`None`: structured outputs off).
    constraints: Option<StepConstraints>,
}

impl Worker {
    fn serve(&mut self, inbox: mpsc::Receiver<Command>) {
        loop {
            if self.scheduler.is_idle() {
                if self.deadline.is_some() {
                    return;
                }
                // No work: block until a command arrives (or every handle is gone).
                match inbox.recv() {
                    Ok(command) => self.handle(command),
                    Err(_) => return,
                }
            }
            while let Ok(command) = inbox.try_recv() {
                self.handle(command);
            }
            if let Some(deadline) = self.deadline {
                if Instant::now() >= deadline {
                    let cut = self.clients.len();
                    self.shared.cut_at_shutdown.store(cut, Ordering::Release);
                    if cut > 0 {
                        log::warn!("shutdown: the drain deadline cut off {cut} requests");
                    }
                    // vLLM counts requests cut off at shutdown as aborted.
                    self.fail_all(&Failure::new(FailureCause::ShutDown, SHUT_DOWN), "abort");
                    self.publish();
                    return;
                }
            }
            self.reap_aborted();
            if self.scheduler.is_idle() {
                self.publish();
                continue;
            }
            let outcome = catch_unwind(AssertUnwindSafe(|| self.step()));
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(stop)) => {
                    self.die(stop.to_string());
                    return;
                }
                Err(payload) => {
                    self.die(format!("engine panicked: {}", panic_text(&*payload)));
                    return;
                }
            }
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Submit(submission) => self.accept(*submission),
            Command::Shutdown(deadline) => {
                self.deadline = Some(self.deadline.map_or(deadline, |d| d.min(deadline)));
            }
            Command::SetSnapshotMarkers(markers) => self.scheduler.set_snapshot_markers(markers),
        }
    }

    fn accept(&mut self, submission: Submission) {
        let Submission {
            id,
            request,
            constraint,
            events,
            stopped_by_client,
            arrival,
        } = submission;
        if let (Some(compiled), Some(constraints)) = (constraint, self.constraints.as_mut()) {
            constraints.add(id, compiled);
        }
        let seed = request
            .sampling
            .seed
            .unwrap_or_else(|| self.seeds.hash_one(id));
        self.clients.insert(
            id,
            Client {
                events,
                stopped_by_client,
                prompt_tokens: request.prompt.len(),
                logprobs: request.sampling.logprobs.is_some(),
                arrival,
                first_scheduled: None,
                first_token: None,
                last_token: None,
                timeline: self
                    .shared
                    .config
                    .request_timeline
                    .then(|| Pending::new(arrival, Instant::now())),
            },
        );
        self.scheduler
            .add(id, request.prompt, request.sampling, request.stop, seed);
        self.scheduler
            .add_snapshot_points(id, &request.snapshot_points);
    }

    /// Removes a request that ends before the engine finished it (abort,
    /// failure, or the client's own stop), counted under `reason`.
    fn drop_request(&mut self, id: RequestId, reason: &str) -> Option<Client> {
        let queued_tokens = self
            .clients
            .get(&id)
            .filter(|c| c.first_scheduled.is_none() && self.scheduler.contains(id))
            .map(|c| c.prompt_tokens);
        self.scheduler.remove(id);
        if let Some(tokens) = queued_tokens {
            self.shared
                .queued_tokens
                .fetch_sub(tokens, Ordering::AcqRel);
        }
        self.metrics
            .request_success
            .with_label_values(&[reason])
            .inc();
        let client = self.clients.remove(&id);
        if client.is_some() {
            self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        client
    }

    /// Requests whose stream was dropped, freed before the next step: a
    /// client that found its own stop string finished them (`stop`); any
    /// other drop is an abort.
    fn reap_aborted(&mut self) {
        let gone: Vec<RequestId> = self
            .clients
            .iter()
            .filter(|(_, c)| c.events.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            let stopped = self.clients[&id].stopped_by_client.load(Ordering::Acquire);
            if stopped {
                if let Some(client) = self.drop_request(id, "stop") {
                    self.observe_end(&client, Instant::now());
                }
            } else {
                self.drop_request(id, "abort");
                self.aborted += 1;
                self.metrics.requests_aborted.inc();
            }
        }
    }

    /// The latency series of a request that finished (by the engine's stop
    /// or length, or by the client's stop string).
    fn observe_end(&self, client: &Client, now: Instant) {
        self.metrics
            .e2e_request_latency
            .observe((now - client.arrival).as_secs_f64());
        if let Some(first) = client.first_token {
            self.metrics
                .request_decode_time
                .observe((now - first).as_secs_f64());
        }
    }

    fn fail_all(&mut self, failure: &Failure, reason: &str) {
        let ids: Vec<RequestId> = self.clients.keys().copied().collect();
        for id in ids {
            if let Some(client) = self.drop_request(id, reason) {
                let _ = client.events.send(Event::Failed(failure.clone()));
            }
        }
    }

    fn die(&mut self, why: String) {
        log::error!("engine stopped: {why}");
        self.shared.set_state(EngineState::Dead(why));
        let failure = Failure::new(FailureCause::EngineStopped, ENGINE_STOPPED);
        self.fail_all(&failure, "error");
        self.publish();
    }

    /// Plans and runs one step. `Err`: the engine cannot go on.
    fn step(&mut self) -> Result<(), Stop> {
        let timed = self.shared.config.request_timeline;
        let planned = timed.then(Instant::now);
        if let Some(constraints) = self.constraints.as_mut() {
            constraints.retain(|id| self.clients.contains_key(&id));
        }
        let plan = self.scheduler.schedule();
        let now = Instant::now();
        for &id in &plan.first_admitted {
            if let Some(client) = self.clients.get_mut(&id) {
                self.shared
                    .queued_tokens
                    .fetch_sub(client.prompt_tokens, Ordering::AcqRel);
                client.first_scheduled = Some(now);
                if let Some(pending) = client.timeline.as_mut() {
                    pending.first_scheduled = Some(now);
                }
                self.metrics
                    .request_queue_time
                    .observe((now - client.arrival).as_secs_f64());
            }
        }
        self.metrics
            .num_preemptions
            .inc_by(plan.preempted.len() as u64);
        self.metrics
            .recomputed_tokens
            .inc_by(plan.recomputed_tokens as u64);
        if plan.rows.is_empty() {
            // Nothing fits (cannot happen with a non-empty scheduler and a
            // lone sequence always fitting); do not spin without a step.
            return Err(Stop::EmptyPlan);
        }
        let banned: Vec<Vec<u32>> = plan
            .rows
            .iter()
            .map(|r| self.scheduler.banned(r.id))
            .collect();
        // The masks compute on the pool from here on, through the cache
        // work and the forward.
        let masks = self
            .constraints
            .as_mut()
            .map(|c| c.start_masks(&plan, |id| self.scheduler.output(id)));
        let executor = self.executor.as_mut().expect("alive while serving");
        for &op in &plan.memory_ops {
            executor.memory(op).map_err(Stop::Memory)?;
        }
        if let Err(error) = self.run_cache_ops(&plan.cache_ops) {
            return self.step_error(&plan, error);
        }
        let allowed: &[Option<AllowedTokens>] = masks.as_ref().map_or(&[], |m| &m.allowed);
        let rows = self.scheduler.step_rows(&plan, &banned, allowed);
        let expected = rows.iter().filter(|r| r.sample.is_some()).count();
        let executor = self.executor.as_mut().expect("alive while serving");
        let started = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| executor.step(&rows)));
        let elapsed = started.elapsed();
        let phases = if timed {
            executor.last_step_phases()
        } else {
            None
        };
        drop(rows);
        self.steps += 1;
        self.metrics.step_duration.observe(elapsed.as_secs_f64());
        self.metrics
            .tokens_per_step
            .observe(plan.num_tokens() as f64);
        let sampled = match result {
            Err(payload) => return Err(Stop::ExecutorPanicked(panic_text(&*payload))),
            Ok(Err(error)) => return self.step_error(&plan, error),
            Ok(Ok(sampled)) if sampled.len() != expected => {
                let why = format!(
                    "executor returned {} tokens for {expected} sampling rows",
                    sampled.len()
                );
                self.fail_step(&plan, &why);
                return Ok(());
            }
            Ok(Ok(sampled)) => sampled,
        };
        let advanced = match (self.constraints.as_mut(), masks) {
            (Some(constraints), Some(masks)) => constraints.finish_step(masks, &self.metrics),
            _ => Default::default(),
        };
        let mut outcomes = self
            .scheduler
            .commit_with(&plan, sampled, &advanced.stopped);
        // A failed mask allowed nothing, so its row's token was drawn
        // blind and is no output of the constraint: it never goes out
        // (the failure below ends the request, whatever that token did).
        outcomes.retain(|o| !advanced.failed.iter().any(|(id, _)| *id == o.id));
        // Snapshots are taken now, while the slots hold exactly the
        // committed tokens (a finished request's slot is not reused before
        // the next plan).
        let ops = self.scheduler.take_cache_ops();
        if let Err(error) = self.run_cache_ops(&ops) {
            return Err(Stop::Snapshots(error));
        }
        // Resources of finished requests are already free: publish first so
        // a client that sees its terminal event sees them released.
        self.publish();
        if let Some(planned) = planned {
            let exec = (started, started + elapsed);
            self.mark_step(&plan, planned, exec, phases);
        }
        self.deliver(outcomes);
        self.fail_constrained(advanced.failed);
        Ok(())
    }

    /// Ends the requests whose matcher failed this step (their token of
    /// the step was withheld).
    fn fail_constrained(&mut self, failed: Vec<(RequestId, impl std::fmt::Display)>) {
        let mut clients = Vec::new();
        for (id, error) in failed {
            log::warn!("request {id:?}: its constraint failed: {error}");
            if !self.clients.contains_key(&id) {
                continue; // its client is gone
            }
            clients.extend(self.drop_request(id, "error"));
        }
        if clients.is_empty() {
            return;
        }
        // Freed before the clients hear, as for any other end.
        self.publish();
        for client in clients {
            let failure = Failure::new(FailureCause::StepFailed, CONSTRAINT_FAILED);
            let _ = client.events.send(Event::Failed(failure));
        }
    }

    /// The request timeline: adds this step to the record of every request
    /// in it that has no token yet.
    fn mark_step(
        &mut self,
        plan: &Plan,
        planned: Instant,
        (exec_start, exec_end): (Instant, Instant),
        phases: Option<crate::timeline::StepPhases>,
    ) {
        let committed = Instant::now();
        let tokens = plan.num_tokens();
        for row in &plan.rows {
            let Some(pending) = self
                .clients
                .get_mut(&row.id)
                .and_then(|c| c.timeline.as_mut())
            else {
                continue;
            };
            pending.steps.push(StepMark {
                planned,
                exec_start,
                exec_end,
                committed,
                phases,
                rows: plan.rows.len(),
                tokens,
                start: row.start,
                len: row.len,
                cache_ops_before: plan.cache_ops.len(),
                snapshots_in_row: row.snapshots.len(),
                sampled: row.sample,
            });
        }
    }

    /// Runs the prefix cache's executor work in order.
    fn run_cache_ops(&mut self, ops: &[CacheOp]) -> Result<(), ExecError> {
        let executor = self.executor.as_mut().expect("alive while serving");
        for &op in ops {
            match op {
                CacheOp::CopyPage { from, to } => executor.copy_page(from, to)?,
                CacheOp::Restore { snapshot, slot } => executor.restore(snapshot, slot)?,
                CacheOp::Take { slot, snapshot } => executor.snapshot(slot, snapshot)?,
                CacheOp::Drop(snapshot) => executor.drop_snapshot(snapshot),
            }
        }
        Ok(())
    }

    /// A failed step (or a failed restore before it): Fatal stops the
    /// engine, anything else fails the step's requests.
    fn step_error(&mut self, plan: &Plan, error: ExecError) -> Result<(), Stop> {
        if let ExecError::Fatal(why) = error {
            return Err(Stop::ExecutorLost(why));
        }
        self.fail_step(plan, &error.to_string());
        Ok(())
    }

    /// StepFailed / Refused: the step's requests fail, the others go on;
    /// the snapshots the step was to take are given back unpublished.
    fn fail_step(&mut self, plan: &Plan, why: &str) {
        log::error!("step failed ({} rows): {why}", plan.rows.len());
        self.scheduler.abandon(plan);
        for row in &plan.rows {
            if let Some(client) = self.drop_request(row.id, "error") {
                let failure = Failure::new(FailureCause::StepFailed, STEP_FAILED);
                let _ = client.events.send(Event::Failed(failure));
            }
        }
        self.publish();
    }

    fn deliver(&mut self, outcomes: Vec<Outcome>) {
        let now = Instant::now();
        for outcome in outcomes {
            let Some(client) = self.clients.get_mut(&outcome.id) else {
                continue;
            };
            self.metrics.generation_tokens.inc();
            match client.last_token {
                None => {
                    self.metrics.prompt_tokens.inc_by(outcome.prompt_len as u64);
                    self.metrics
                        .time_to_first_token
                        .observe((now - client.arrival).as_secs_f64());
                    if let Some(scheduled) = client.first_scheduled {
                        self.metrics
                            .request_prefill_time
                            .observe((now - scheduled).as_secs_f64());
                    }
                    client.first_token = Some(now);
                }
                Some(last) => self
                    .metrics
                    .inter_token_latency
                    .observe((now - last).as_secs_f64()),
            }
            client.last_token = Some(now);
            let timeline = client.timeline.take().map(|pending| {
                Box::new(pending.finish(Instant::now(), outcome.prompt_len, outcome.cached_tokens))
            });
            let token = TokenEvent {
                token: outcome.sampled.token,
                logprob: client.logprobs.then_some(outcome.sampled.logprob),
                top_logprobs: outcome.sampled.top_logprobs,
                cached_tokens: outcome.cached_tokens,
                timeline,
            };
            let _ = client.events.send(Event::Token(token));
            let Some(reason) = outcome.finish else {
                continue;
            };
            let client = self.clients.remove(&outcome.id).expect("present above");
            self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
            let label = match reason {
                FinishReason::Stop { .. } => "stop",
                FinishReason::Length => "length",
            };
            self.metrics
                .request_success
                .with_label_values(&[label])
                .inc();
            self.observe_end(&client, now);
            let _ = client.events.send(Event::Finished {
                reason,
                usage: Usage {
                    prompt_tokens: outcome.prompt_len,
                    completion_tokens: outcome.output_len,
                    cached_tokens: outcome.cached_tokens,
                },
            });
        }
    }

    fn publish(&mut self) {
        let alloc = self.scheduler.allocator();
        let stats = EngineStats {
            running: self.scheduler.num_running(),
            waiting: self.scheduler.num_waiting(),
            slots_used: alloc.slots_used(),
            slots_total: alloc.slots_total(),
            pages_used: alloc.pages_in_sequences(),
            pages_cached: alloc.pages_cache_only(),
            pages_total: alloc.pages_total(),
            preemptions: self.scheduler.preemptions(),
            recomputed_tokens: self.scheduler.recomputed_tokens(),
            steps: self.steps,
            aborted: self.aborted,
            prefix_cache: self.scheduler.prefix_cache_stats(),
            snapshot_bytes: self.snapshot_bytes,
        };
        if let Some(now) = stats.prefix_cache {
            let was = std::mem::replace(&mut self.published_cache, now);
            let m = &self.metrics;
            m.prefix_cache_queries
                .inc_by(now.queried_tokens - was.queried_tokens);
            m.prefix_cache_hits.inc_by(now.hit_tokens - was.hit_tokens);
            m.snapshot_hits
                .inc_by(now.snapshot_hits - was.snapshot_hits);
            m.snapshot_misses
                .inc_by(now.snapshot_misses - was.snapshot_misses);
            m.snapshots_taken
                .inc_by(now.snapshots_taken - was.snapshots_taken);
            m.snapshot_evictions
                .inc_by(now.snapshot_evictions - was.snapshot_evictions);
            m.kv_only_unusable
                .inc_by(now.kv_only_unusable - was.kv_only_unusable);
            m.kv_only_unusable_tokens
                .inc_by(now.kv_only_unusable_tokens - was.kv_only_unusable_tokens);
            m.branch_points
                .inc_by(now.branch_points - was.branch_points);
            m.snapshots.set(now.snapshots as i64);
            m.snapshot_bytes
                .set((now.snapshots * self.snapshot_bytes) as i64);
            m.prefix_cache_pages.set(now.pages as i64);
        }
        self.metrics.num_requests_running.set(stats.running as i64);
        self.metrics.num_requests_waiting.set(stats.waiting as i64);
        self.metrics.state_slots_used.set(stats.slots_used as i64);
        self.metrics
            .kv_cache_usage_perc
            .set(self.scheduler.allocator().usage());
        *self.shared.stats.lock().unwrap() = stats;
    }
}
