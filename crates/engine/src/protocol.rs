//! What passes between the engine's handle ([`crate::EngineHandle`], any
//! thread) and the engine thread ([`crate::worker`]): commands one way
//! over a channel, and the state both sides read behind locks and atomics
//! the other way. Both sides depend on this module and not on each other.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{mpsc as tokio_mpsc, watch};

use crate::config::EngineConfig;
use crate::constraint::Compiled;
use crate::prefix_cache::PrefixCacheStats;
use crate::request::{EngineState, Event, GenerateRequest, RequestId};

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
    /// Tokens computed again after preemptions.
    pub recomputed_tokens: u64,
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
    /// The request's constraint, compiled at submit.
    pub constraint: Option<Compiled>,
    pub events: tokio_mpsc::UnboundedSender<Event>,
    /// Set by [`crate::RequestStream::stop`] before it drops the stream:
    /// the client ended the request itself (a stop string), not an abort.
    pub stopped_by_client: Arc<AtomicBool>,
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
    /// Submitted and not yet ended (running, waiting, or on their way to
    /// the engine thread).
    pub in_flight: AtomicUsize,
    /// How many requests run at once (`max_num_seqs`, capped by the
    /// executor's state slots); 0 until loaded. Requests in flight beyond
    /// it are the ones waiting for admission.
    pub running_capacity: AtomicUsize,
    /// The prompt tokens of the requests submitted and not yet admitted
    /// for the first time.
    pub queued_tokens: AtomicUsize,
    /// Requests the drain deadline cut off at shutdown.
    pub cut_at_shutdown: AtomicUsize,
    next_id: AtomicU64,
    /// True once the engine thread has stopped.
    pub stopped: watch::Sender<bool>,
}

impl Shared {
    /// The state of an engine still loading its executor.
    pub fn new(config: EngineConfig) -> Self {
        let (stopped, _) = watch::channel(false);
        Shared {
            config,
            state: Mutex::new(EngineState::Loading),
            max_model_len: Mutex::new(None),
            vocab_size: Mutex::new(None),
            stats: Mutex::new(EngineStats::default()),
            in_flight: AtomicUsize::new(0),
            running_capacity: AtomicUsize::new(0),
            queued_tokens: AtomicUsize::new(0),
            cut_at_shutdown: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            stopped,
        }
    }

    /// A fresh request id.
    pub fn next_id(&self) -> RequestId {
        RequestId(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    pub fn set_state(&self, state: EngineState) {
        *self.state.lock().unwrap() = state;
    }

    pub fn state(&self) -> EngineState {
        self.state.lock().unwrap().clone()
    }
}
