//! How the engine uses the prefix cache.

/// How the engine uses the prefix cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixCacheConfig {
    pub enabled: bool,
    /// Snapshots kept at most (also capped by the executor's pool).
    pub max_snapshots: usize,
    /// Token sequences after whose last occurrence in a prompt the state is
    /// snapshotted (chat: `<|im_start|>assistant\n`, where the next turn's
    /// prompt leaves this one).
    pub snapshot_after: Vec<Vec<u32>>,
    /// Also snapshot at every multiple of this many prompt tokens (0: off).
    pub snapshot_interval: usize,
    /// Also snapshot before each prompt's last token, so that an exact
    /// repeat hits on its first repeat (the last token must be recomputed
    /// for its logits). Off in the server by default: the prefill then
    /// ends one token early and the last token waits for the next step,
    /// which under load is a full step of TTFT (docs/prefix-caching.md,
    /// "Where snapshots are taken, and why"); without it repeats still hit
    /// from the second repeat on, through a branch point.
    pub snapshot_before_last_token: bool,
    /// Take snapshots inside a step when the executor can
    /// ([`crate::Executor::max_row_snapshots`]): a prefill chunk runs
    /// through its snapshot points instead of ending at each, so a point
    /// costs a second, small forward in the same step rather than a step
    /// of latency. Off: chunks end at points (as with an executor that
    /// cannot).
    pub in_step_snapshots: bool,
}

impl Default for PrefixCacheConfig {
    fn default() -> Self {
        PrefixCacheConfig {
            enabled: false,
            max_snapshots: usize::MAX,
            snapshot_after: Vec::new(),
            snapshot_interval: 0,
            snapshot_before_last_token: true,
            in_step_snapshots: true,
        }
    }
}
