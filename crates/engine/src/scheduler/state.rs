//! The scheduler's state: its sequences, the waiting queue and the running
//! set, the allocator that holds their slots and pages, and the prefix
//! cache. Queries and the calls that add and remove sequences are here;
//! planning and committing steps are in the sibling files.

use std::collections::{HashMap, VecDeque};

use super::policy::{AdmissionPolicy, INIT_NEW_TOKEN_RATIO};
use crate::allocator::{Allocator, SeqCache};
use crate::executor::{ArenaGeometry, CacheGeometry};
use crate::prefix_cache::{
    snapshot_points, CacheOp, PrefixCache, PrefixCacheConfig, PrefixCacheStats,
};
use crate::request::{RequestId, SamplingParams, StopParams};

/// The limits the scheduler enforces (already capped by the executor's geometry).
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    pub max_num_batched_tokens: usize,
    pub max_num_seqs: usize,
    pub max_model_len: usize,
    /// Cap per prefill chunk; 0: the budget only.
    pub long_prefill_token_threshold: usize,
    pub eos_token_ids: Vec<u32>,
    /// `enabled` with `max_snapshots > 0` turns the prefix cache on.
    pub prefix_cache: PrefixCacheConfig,
    /// Snapshot points a prefill row may carry inside it (the executor's
    /// [`crate::Executor::max_row_snapshots`], 0 when the config turns the
    /// in-step snapshot off): a chunk runs through up to this many points
    /// in one step and ends at the next one.
    pub row_snapshots: usize,
    /// How admission leaves room for the running sequences' growth.
    pub admission: AdmissionPolicy,
}

/// A request as the scheduler keeps it.
#[derive(Debug)]
pub(super) struct Sequence {
    /// Prompt, then the output so far.
    pub(super) tokens: Vec<u32>,
    pub(super) prompt_len: usize,
    pub(super) sampling: SamplingParams,
    pub(super) stop: StopParams,
    pub(super) seed: u64,
    /// Tokens whose state and KV are in the cache (0 when waiting).
    pub(super) computed: usize,
    pub(super) cache: Option<SeqCache>,
    /// Admitted at least once (a preempted sequence is waiting again but
    /// has been admitted).
    pub(super) admitted_once: bool,
    /// Positions after which the state is published to the prefix cache
    /// (ascending; empty without a cache). Prefill chunks end there.
    pub(super) points: Vec<usize>,
    /// Prompt tokens served from the prefix cache at first admission.
    pub(super) cached_tokens: usize,
    /// Tokens computed when the sequence was last preempted (0: not
    /// preempted since its last admission): what readmission recomputes,
    /// less a prefix-cache hit.
    pub(super) lost: usize,
}

impl Sequence {
    pub(super) fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}

#[derive(Debug)]
pub struct Scheduler {
    pub(super) config: SchedulerConfig,
    pub(super) alloc: Allocator,
    pub(super) seqs: HashMap<RequestId, Sequence>,
    pub(super) waiting: VecDeque<RequestId>,
    /// Admission order (oldest first); preemption takes from the back.
    pub(super) running: Vec<RequestId>,
    pub(super) preemptions: u64,
    /// Tokens computed again after preemptions (readmissions past their
    /// prefix-cache hit).
    pub(super) recomputed_tokens: u64,
    /// [`AdmissionPolicy::NewTokenRatio`]'s weight on outputs to come.
    pub(super) new_token_ratio: f64,
    pub(super) cache: Option<PrefixCache>,
    /// Executor work for the cache not yet handed out (see
    /// [`Scheduler::take_cache_ops`]).
    pub(super) cache_ops: Vec<CacheOp>,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, geometry: &CacheGeometry) -> Self {
        Self::with_arena(config, geometry, None)
    }

    /// A scheduler whose pages and slots come from the executor's `arena`
    /// (`None`: all there from the start).
    pub fn with_arena(
        config: SchedulerConfig,
        geometry: &CacheGeometry,
        arena: Option<ArenaGeometry>,
    ) -> Self {
        assert!(config.max_num_batched_tokens >= config.max_num_seqs.max(1));
        let alloc = match arena {
            Some(arena) => Allocator::with_arena(geometry, arena),
            None => Allocator::new(geometry),
        };
        let pc = &config.prefix_cache;
        let cache = (pc.enabled && pc.max_snapshots > 0)
            .then(|| PrefixCache::new(geometry.page_size, pc.max_snapshots));
        Scheduler {
            config,
            alloc,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            preemptions: 0,
            recomputed_tokens: 0,
            new_token_ratio: INIT_NEW_TOKEN_RATIO,
            cache,
            cache_ops: Vec::new(),
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Queues a request (already validated: prompt not empty and shorter
    /// than `max_model_len`).
    pub fn add(
        &mut self,
        id: RequestId,
        prompt: Vec<u32>,
        sampling: SamplingParams,
        stop: StopParams,
        seed: u64,
    ) {
        assert!(!prompt.is_empty() && prompt.len() < self.config.max_model_len);
        let prompt_len = prompt.len();
        let points = match &self.cache {
            Some(_) => snapshot_points(&prompt, &self.config.prefix_cache),
            None => Vec::new(),
        };
        let seq = Sequence {
            tokens: prompt,
            prompt_len,
            sampling,
            stop,
            seed,
            computed: 0,
            cache: None,
            admitted_once: false,
            points,
            cached_tokens: 0,
            lost: 0,
        };
        assert!(self.seqs.insert(id, seq).is_none(), "duplicate {id:?}");
        self.waiting.push_back(id);
    }

    pub fn is_idle(&self) -> bool {
        self.seqs.is_empty()
    }

    pub fn contains(&self, id: RequestId) -> bool {
        self.seqs.contains_key(&id)
    }

    pub fn ids(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.seqs.keys().copied()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn allocator(&self) -> &Allocator {
        &self.alloc
    }

    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Tokens computed a second time because their sequence was preempted.
    pub fn recomputed_tokens(&self) -> u64 {
        self.recomputed_tokens
    }

    /// Snapshot markers for the sequences added from now on.
    pub fn set_snapshot_markers(&mut self, markers: Vec<Vec<u32>>) {
        self.config.prefix_cache.snapshot_after = markers;
    }

    /// The prefix cache's counts (`None`: no cache).
    pub fn prefix_cache_stats(&self) -> Option<PrefixCacheStats> {
        self.cache.as_ref().map(PrefixCache::stats)
    }

    /// Executor work for the cache produced since the last plan (snapshots
    /// to take after the step just committed): run it, in order, before
    /// the next step.
    pub fn take_cache_ops(&mut self) -> Vec<CacheOp> {
        std::mem::take(&mut self.cache_ops)
    }

    /// Removes a request wherever it is and frees its slot and pages.
    /// Returns whether it was there.
    pub fn remove(&mut self, id: RequestId) -> bool {
        let Some(mut seq) = self.seqs.remove(&id) else {
            return false;
        };
        if let Some(cache) = seq.cache.take() {
            self.alloc.close(cache);
        }
        self.running.retain(|&r| r != id);
        self.waiting.retain(|&r| r != id);
        true
    }
}
