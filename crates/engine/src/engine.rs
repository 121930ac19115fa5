//! The engine's public face: start it, submit requests, read their event
//! streams, watch its state, shut it down. The work happens on the engine
//! thread ([`crate::worker`]); this side validates, queues and reads
//! shared snapshots, and never blocks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::mpsc as tokio_mpsc;

use crate::config::{ConfigError, EngineConfig};
use crate::constraint::{Compiled, ConstraintError, ConstraintSpec};
use crate::executor::{BoxError, Executor};
use crate::metrics::Metrics;
use crate::protocol::{Command, EngineStats, Shared, Submission};
use crate::request::{
    EngineState, Event, Failure, FailureCause, GenerateRequest, InvalidParam, RequestId,
    SubmitError,
};
use crate::worker::{self, LoadError};

/// How long an overloaded client is told to wait before retrying. A fixed
/// second: short enough for the `openai` client (it honours Retry-After up
/// to 60 s), long enough not to hammer a full queue.
const OVERLOADED_RETRY_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug, Error)]
pub enum EngineStartError {
    /// A configuration value out of range (the error names it).
    #[error("invalid engine configuration: {0}")]
    Config(ConfigError),
    /// The metrics could not be registered (e.g. a second engine in one registry).
    #[error("registering engine metrics: {0}")]
    Metrics(prometheus::Error),
    /// The engine thread could not be spawned.
    #[error("spawning the engine thread: {0}")]
    Spawn(std::io::Error),
}

/// Namespace for [`Engine::start`].
pub struct Engine;

impl Engine {
    /// Spawns the engine thread. `make_executor` runs on the engine thread
    /// (CUDA contexts are created there; the executor need not be `Send`);
    /// while it runs, `state()` is `Loading`. Metrics are registered into
    /// `registry`.
    pub fn start<F>(
        config: EngineConfig,
        make_executor: F,
        registry: &prometheus::Registry,
    ) -> Result<EngineHandle, EngineStartError>
    where
        F: FnOnce() -> Result<Box<dyn Executor>, BoxError> + Send + 'static,
    {
        config.check().map_err(EngineStartError::Config)?;
        let metrics = Metrics::register(registry).map_err(EngineStartError::Metrics)?;
        let shared = Arc::new(Shared::new(config));
        let (commands, inbox) = mpsc::channel();
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("gdn-engine".into())
            .spawn(move || {
                let make_executor = move || make_executor().map_err(LoadError::Factory);
                worker::run(thread_shared, make_executor, inbox, metrics)
            })
            .map_err(EngineStartError::Spawn)?;
        Ok(EngineHandle { shared, commands })
    }
}

/// Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
    commands: mpsc::Sender<Command>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl EngineHandle {
    /// Compiles `spec` as [`Self::submit`] would (into the engine's cache
    /// of compiled grammars, so the submit that follows finds it there):
    /// the HTTP layer's check before it starts a response. Takes up to the
    /// compile timeout on a grammar not yet cached: call it off the
    /// async runtime's threads.
    pub fn check_constraint(&self, spec: &ConstraintSpec) -> Result<(), ConstraintError> {
        self.compile(spec).map(drop)
    }

    fn compile(&self, spec: &ConstraintSpec) -> Result<Compiled, ConstraintError> {
        match &self.shared.config.structured_outputs {
            Some(compiler) => compiler.compile(spec),
            None => Err(ConstraintError::Unsupported),
        }
    }

    /// Validates against the engine's limits, queues, and returns the
    /// request's stream at once. It blocks only to compile a constraint
    /// the engine has not cached ([`Self::check_constraint`] first keeps
    /// that off the caller's thread); a constraint that cannot be used
    /// gives [`SubmitError::Constraint`].
    pub fn submit(&self, request: GenerateRequest) -> Result<RequestStream, SubmitError> {
        match self.shared.state() {
            EngineState::Loading => return Err(SubmitError::Loading),
            EngineState::Draining => return Err(SubmitError::ShuttingDown),
            EngineState::Dead(why) => return Err(SubmitError::Dead(why)),
            EngineState::Ready => {}
        }
        if request.prompt.is_empty() {
            return Err(SubmitError::Invalid("prompt must not be empty".into()));
        }
        let vocab_size = self
            .shared
            .vocab_size
            .lock()
            .unwrap()
            .expect("known once Ready");
        if let Some(&bad) = request.prompt.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(SubmitError::Invalid(format!(
                "prompt token id {bad} is out of range (vocabulary size {vocab_size})"
            )));
        }
        if let Some(&bad) = request
            .snapshot_points
            .iter()
            .find(|&&q| q == 0 || q >= request.prompt.len())
        {
            return Err(SubmitError::Invalid(format!(
                "snapshot point {bad} is outside the prompt (1..{})",
                request.prompt.len()
            )));
        }
        let invalid = |e: InvalidParam| SubmitError::Invalid(e.to_string());
        request.sampling.check().map_err(invalid)?;
        request.stop.check().map_err(invalid)?;
        let max_model_len = self
            .shared
            .max_model_len
            .lock()
            .unwrap()
            .expect("known once Ready");
        let prompt_tokens = request.prompt.len();
        let max_tokens = request.stop.max_tokens;
        if prompt_tokens >= max_model_len || prompt_tokens + max_tokens > max_model_len {
            return Err(SubmitError::TooLong {
                prompt_tokens,
                max_tokens,
                max_model_len,
            });
        }
        let constraint = match &request.constraint {
            Some(spec) => Some(self.compile(spec).map_err(SubmitError::Constraint)?),
            None => None,
        };
        // Only requests beyond what the running batch holds wait for
        // admission: a burst within the free slots is never refused.
        let limit = self
            .shared
            .running_capacity
            .load(Ordering::Acquire)
            .saturating_add(self.shared.config.max_num_queued_reqs);
        let took =
            self.shared
                .in_flight
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |in_flight| {
                    (in_flight < limit).then_some(in_flight + 1)
                });
        if took.is_err() {
            return Err(SubmitError::Overloaded {
                retry_after: OVERLOADED_RETRY_AFTER,
            });
        }
        let token_limit = self.shared.config.max_num_queued_tokens;
        let took =
            self.shared
                .queued_tokens
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                    (queued == 0 || queued.saturating_add(prompt_tokens) <= token_limit)
                        .then_some(queued + prompt_tokens)
                });
        if let Err(queued_tokens) = took {
            self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::TooManyQueuedTokens {
                retry_after: OVERLOADED_RETRY_AFTER,
                queued_tokens,
                prompt_tokens,
                limit: token_limit,
            });
        }
        let id = self.shared.next_id();
        let (events, receiver) = tokio_mpsc::unbounded_channel();
        let stopped_by_client = Arc::new(AtomicBool::new(false));
        let submission = Submission {
            id,
            request,
            constraint,
            events,
            stopped_by_client: stopped_by_client.clone(),
            arrival: Instant::now(),
        };
        if self
            .commands
            .send(Command::Submit(Box::new(submission)))
            .is_err()
        {
            self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
            self.shared
                .queued_tokens
                .fetch_sub(prompt_tokens, Ordering::AcqRel);
            return Err(SubmitError::Dead("the engine thread has stopped".into()));
        }
        Ok(RequestStream {
            id,
            events: receiver,
            stopped_by_client,
            done: false,
        })
    }

    pub fn state(&self) -> EngineState {
        self.shared.state()
    }

    /// `max_model_len` in force (after capping by the executor); `None` while loading.
    pub fn max_model_len(&self) -> Option<usize> {
        *self.shared.max_model_len.lock().unwrap()
    }

    /// Prompt tokens of the requests submitted and not yet admitted.
    pub fn queued_tokens(&self) -> usize {
        self.shared.queued_tokens.load(Ordering::Acquire)
    }

    pub fn stats(&self) -> EngineStats {
        self.shared.stats.lock().unwrap().clone()
    }

    /// Replaces the prefix cache's snapshot markers
    /// (`PrefixCacheConfig::snapshot_after`) for the requests submitted
    /// after this call (the server knows them once its tokenizer loaded,
    /// which may be after the engine started).
    pub fn set_snapshot_markers(&self, markers: Vec<Vec<u32>>) {
        // Fails only when the thread is gone: nothing left to configure.
        let _ = self.commands.send(Command::SetSnapshotMarkers(markers));
    }

    /// Refuses new work (`submit` gives `ShuttingDown`), lets running and
    /// waiting requests finish until `deadline`, then cuts off the rest
    /// (they get `Event::Failed` with [`FailureCause::ShutDown`]) and stops
    /// the thread. Resolves when it stopped, with how many were cut off.
    pub async fn shutdown(&self, deadline: Duration) -> Drained {
        {
            let mut state = self.shared.state.lock().unwrap();
            if !matches!(*state, EngineState::Dead(_)) {
                *state = EngineState::Draining;
            }
        }
        // Fails only when the thread is gone, which is what we wait for.
        let _ = self
            .commands
            .send(Command::Shutdown(Instant::now() + deadline));
        self.stopped().await;
        Drained {
            cut_off: self.shared.cut_at_shutdown.load(Ordering::Acquire),
        }
    }

    /// Resolves once the engine thread has stopped: after
    /// [`EngineHandle::shutdown`], or on its own when loading failed or a
    /// step could not go on ([`EngineHandle::state`] is then
    /// [`EngineState::Dead`] with the reason; every request has had its
    /// `Failed` event).
    pub async fn stopped(&self) {
        let mut stopped = self.shared.stopped.subscribe();
        // Err: the sender is gone, which also means stopped.
        let _ = stopped.wait_for(|stopped| *stopped).await;
    }
}

/// How a shutdown ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drained {
    /// Requests the drain deadline cut off (0: every request finished).
    pub cut_off: usize,
}

/// A request's events: tokens, then exactly one `Finished` or `Failed`.
/// Dropping it before the terminal event aborts the request (the engine
/// frees its slot and pages within one step).
#[derive(Debug)]
pub struct RequestStream {
    id: RequestId,
    events: tokio_mpsc::UnboundedReceiver<Event>,
    stopped_by_client: Arc<AtomicBool>,
    done: bool,
}

impl RequestStream {
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// Ends the request because the client found its own stop (a stop
    /// string in the text): the engine frees it as it frees an abort, but
    /// counts it as finished with reason `stop`, not as aborted.
    pub fn stop(self) {
        // Set before the drop closes the channel: the engine thread reads
        // it only once it sees the channel closed (the channel's close is
        // a release, its check an acquire).
        self.stopped_by_client.store(true, Ordering::Release);
    }

    /// The next event; `None` after the terminal event.
    pub async fn next(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        match self.events.recv().await {
            Some(event) => {
                self.done = matches!(event, Event::Finished { .. } | Event::Failed(_));
                Some(event)
            }
            None => {
                // The engine dropped the request without a terminal event:
                // only a bug or a panic outside the step does that. Say so
                // rather than end silently.
                self.done = true;
                Some(Event::Failed(Failure::new(
                    FailureCause::EngineStopped,
                    "the engine stopped",
                )))
            }
        }
    }
}
