//! The engine's public face: start it, submit requests, read their event
//! streams, watch its state, shut it down. The work happens on the engine
//! thread ([`crate::worker`]); this side validates, queues and reads
//! shared snapshots, and never blocks.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::{mpsc as tokio_mpsc, watch};

use crate::executor::Executor;
use crate::metrics::Metrics;
use crate::prefix_cache::{PrefixCacheConfig, PrefixCacheStats};
use crate::request::{EngineState, Event, GenerateRequest, InvalidParam, RequestId, SubmitError};
use crate::worker::{self, LoadError};

/// How long an overloaded client is told to wait before retrying. A fixed
/// second: short enough for the `openai` client (it honours Retry-After up
/// to 60 s), long enough not to hammer a full queue.
const OVERLOADED_RETRY_AFTER: Duration = Duration::from_secs(1);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Token budget per step (vLLM's default 8192).
    pub max_num_batched_tokens: usize,
    /// Running requests at most (also capped by the executor's slots).
    pub max_num_seqs: usize,
    /// Longest prompt + output (also capped by the executor).
    pub max_model_len: usize,
    /// Waiting requests at most before `SubmitError::Overloaded`.
    pub max_num_queued_reqs: usize,
    /// Prompt tokens of the waiting requests at most before
    /// `SubmitError::TooManyQueuedTokens` (`usize::MAX`: no limit). An
    /// empty queue takes any prompt: the limit bounds the backlog, it does
    /// not refuse a long prompt outright.
    pub max_num_queued_tokens: usize,
    /// The model's EOS ids (generation_config / config).
    pub eos_token_ids: Vec<u32>,
    /// Cap per prefill chunk so one long prompt leaves room in a step for
    /// others (0: the budget only).
    pub long_prefill_token_threshold: usize,
    /// The prefix cache (off by default here; the server decides). Its
    /// snapshot budget is also capped by the executor's snapshot pool; an
    /// executor without one runs without a cache.
    pub prefix_cache: PrefixCacheConfig,
    /// The request timeline ([`crate::timeline`]): stamps per request up
    /// to its first token, handed out with it. Off by default.
    pub request_timeline: bool,
}

impl EngineConfig {
    /// vLLM's defaults where it has one; lengths are then capped by the executor.
    pub fn new(eos_token_ids: Vec<u32>) -> Self {
        EngineConfig {
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            max_model_len: usize::MAX,
            max_num_queued_reqs: 1024,
            max_num_queued_tokens: usize::MAX,
            eos_token_ids,
            long_prefill_token_threshold: 0,
            prefix_cache: PrefixCacheConfig::default(),
            request_timeline: false,
        }
    }

    fn check(&self) -> Result<(), ConfigError> {
        if self.max_num_seqs == 0 {
            return Err(ConfigError::NoSeqs);
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            // Decodes come first and take one token each: a budget below the
            // running count would leave some decode without a turn.
            return Err(ConfigError::BudgetBelowSeqs {
                max_num_batched_tokens: self.max_num_batched_tokens,
                max_num_seqs: self.max_num_seqs,
            });
        }
        if self.max_model_len < 2 {
            return Err(ConfigError::ModelLenTooShort);
        }
        Ok(())
    }
}

/// A configuration value out of range (the message names it).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ConfigError {
    #[error("max_num_seqs must be at least 1")]
    NoSeqs,
    #[error("max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs ({max_num_seqs})")]
    BudgetBelowSeqs {
        max_num_batched_tokens: usize,
        max_num_seqs: usize,
    },
    #[error("max_model_len must be at least 2")]
    ModelLenTooShort,
}

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

/// Snapshot for tests and `/metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub slots_used: usize,
    pub slots_total: usize,
    /// Pages held by requests (vLLM's `kv_cache_usage_perc` counts these).
    pub pages_used: usize,
    /// Pages held by the prefix cache alone (given back on demand).
    pub pages_cached: usize,
    pub pages_total: usize,
    pub preemptions: u64,
    pub steps: u64,
    pub aborted: u64,
    /// The prefix cache's counts and holdings (`None`: no cache).
    pub prefix_cache: Option<PrefixCacheStats>,
    /// Bytes of one snapshot (the executor's).
    pub snapshot_bytes: usize,
}

/// A request handed to the engine thread.
pub(crate) struct Submission {
    pub id: RequestId,
    pub request: GenerateRequest,
    pub events: tokio_mpsc::UnboundedSender<Event>,
    pub arrival: Instant,
}

pub(crate) enum Command {
    Submit(Box<Submission>),
    /// Finish what is running and waiting until the instant, then abort the rest and stop.
    Shutdown(Instant),
    /// The prefix cache's snapshot markers from now on.
    SetSnapshotMarkers(Vec<Vec<u32>>),
}

/// What both sides see.
pub(crate) struct Shared {
    pub config: EngineConfig,
    pub state: Mutex<EngineState>,
    /// In force once loaded.
    pub max_model_len: Mutex<Option<usize>>,
    /// The executor's, once loaded (prompt ids must be below it).
    pub vocab_size: Mutex<Option<usize>>,
    pub stats: Mutex<EngineStats>,
    /// Submitted and not yet admitted for the first time (or gone).
    pub queued: AtomicUsize,
    /// The prompt tokens of those requests.
    pub queued_tokens: AtomicUsize,
    next_id: AtomicU64,
    /// True once the engine thread has stopped.
    pub stopped: watch::Sender<bool>,
}

impl Shared {
    pub fn set_state(&self, state: EngineState) {
        *self.state.lock().unwrap() = state;
    }

    pub fn state(&self) -> EngineState {
        self.state.lock().unwrap().clone()
    }
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
        F: FnOnce() -> Result<Box<dyn Executor>, String> + Send + 'static,
    {
        config.check().map_err(EngineStartError::Config)?;
        let metrics = Metrics::register(registry).map_err(EngineStartError::Metrics)?;
        let (stopped, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(EngineState::Loading),
            max_model_len: Mutex::new(None),
            vocab_size: Mutex::new(None),
            stats: Mutex::new(EngineStats::default()),
            queued: AtomicUsize::new(0),
            queued_tokens: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            stopped,
        });
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
    /// Validates against the engine's limits, queues, and returns the
    /// request's stream at once (never blocks).
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
        let limit = self.shared.config.max_num_queued_reqs;
        let took = self
            .shared
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                (queued < limit).then_some(queued + 1)
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
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::TooManyQueuedTokens {
                retry_after: OVERLOADED_RETRY_AFTER,
                queued_tokens,
                prompt_tokens,
                limit: token_limit,
            });
        }
        let id = RequestId(self.shared.next_id.fetch_add(1, Ordering::Relaxed));
        let (events, receiver) = tokio_mpsc::unbounded_channel();
        let submission = Submission {
            id,
            request,
            events,
            arrival: Instant::now(),
        };
        if self
            .commands
            .send(Command::Submit(Box::new(submission)))
            .is_err()
        {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            self.shared
                .queued_tokens
                .fetch_sub(prompt_tokens, Ordering::AcqRel);
            return Err(SubmitError::Dead("the engine thread has stopped".into()));
        }
        Ok(RequestStream {
            id,
            events: receiver,
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
    /// waiting requests finish until `deadline`, then aborts the rest (they
    /// get `Event::Failed`) and stops the thread. Resolves when it stopped.
    pub async fn shutdown(&self, deadline: Duration) {
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

/// A request's events: tokens, then exactly one `Finished` or `Failed`.
/// Dropping it before the terminal event aborts the request (the engine
/// frees its slot and pages within one step).
#[derive(Debug)]
pub struct RequestStream {
    id: RequestId,
    events: tokio_mpsc::UnboundedReceiver<Event>,
    done: bool,
}

impl RequestStream {
    pub fn id(&self) -> RequestId {
        self.id
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
                Some(Event::Failed("the engine stopped".into()))
            }
        }
    }
}
