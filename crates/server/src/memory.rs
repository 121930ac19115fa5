//! How the executor's memory is divided: the prefix cache's state-snapshot
//! budget (a count, bytes, or a share of the room the KV pages and the
//! snapshots divide), a KV page's bytes, and the GPU memory kept free for
//! a step's activations.

use qwen35::engine_exec::CacheRoom;

/// `--prefix-cache-state-budget`: snapshots, bytes to fill with them, or a
/// share of the cache memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StateBudget {
    Snapshots(usize),
    Bytes(usize),
    /// This share (strictly between 0 and 1) of the memory the KV pages and
    /// the snapshots divide between them.
    Fraction(f64),
    /// The default: this many snapshots, but never more than
    /// [`DEFAULT_SNAPSHOT_SHARE`] of that memory, so that a large model on
    /// a smaller card still gets KV pages from an unset flag (the 35B-A3B
    /// on an 80 GB card: 256 snapshots of 61 MiB took all of it,
    /// docs/results/2026-12-07-s14). On the H200's measured set-ups the
    /// count is the smaller term.
    AtMost(usize),
}

/// The largest share of the KV pages' and snapshots' memory that the
/// default snapshot pool takes.
pub const DEFAULT_SNAPSHOT_SHARE: f64 = 0.5;

impl StateBudget {
    /// Snapshots of `snapshot_bytes` each that the budget allows, `room`
    /// being what the KV pages and the snapshots share.
    pub fn snapshots(self, snapshot_bytes: usize, room: CacheRoom) -> usize {
        let bytes = match self {
            StateBudget::Snapshots(n) => return n,
            StateBudget::AtMost(n) => {
                let cap =
                    StateBudget::Fraction(DEFAULT_SNAPSHOT_SHARE).snapshots(snapshot_bytes, room);
                if cap < n {
                    log::info!(
                        "prefix cache: {cap} snapshots instead of the default {n}: \
                         {DEFAULT_SNAPSHOT_SHARE} of the cache memory ({room:?}) holds no more \
                         (--prefix-cache-state-budget sets it)"
                    );
                }
                return n.min(cap);
            }
            StateBudget::Bytes(b) => b,
            StateBudget::Fraction(f) => match room {
                CacheRoom::Shared(total) => (f * total as f64) as usize,
                // Snapshots on top of a fixed KV: f of the sum is f / (1 - f)
                // of the KV.
                CacheRoom::FixedKv(kv) => (f / (1.0 - f) * kv as f64) as usize,
            },
        };
        bytes / snapshot_bytes.max(1)
    }
}

/// A `--prefix-cache-state-budget` that is none of the three forms.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StateBudgetError {
    #[error("expected a snapshot count (64), a size (4GiB, 512MiB, 2GB) or a share of the cache memory (0.25, 25%), got {0:?}")]
    Unreadable(String),
    #[error("a share of the cache memory must lie strictly between 0 and 1 (0% and 100%: the KV pages need the rest), got {0:?}")]
    ShareOutOfRange(String),
}

/// Parses `--prefix-cache-state-budget`: `64`, `4GiB`, `512MiB`, `2GB`,
/// `0.25`, `25%`.
pub fn parse_state_budget(text: &str) -> Result<StateBudget, StateBudgetError> {
    let t = text.trim();
    let units: [(&str, usize); 6] = [
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("GB", 1_000_000_000),
        ("MB", 1_000_000),
        ("KB", 1_000),
    ];
    let bad = || StateBudgetError::Unreadable(text.to_string());
    let share = |f: f64| {
        if f > 0.0 && f < 1.0 {
            Ok(StateBudget::Fraction(f))
        } else {
            Err(StateBudgetError::ShareOutOfRange(text.to_string()))
        }
    };
    if let Some(percent) = t.strip_suffix('%') {
        let p: f64 = percent.trim().parse().map_err(|_| bad())?;
        return share(p / 100.0);
    }
    if t.contains('.') && t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return share(t.parse().map_err(|_| bad())?);
    }
    for (suffix, scale) in units {
        if let Some(number) = t.strip_suffix(suffix) {
            let n: f64 = number.trim().parse().map_err(|_| bad())?;
            if !(n.is_finite() && n >= 0.0) {
                return Err(bad());
            }
            return Ok(StateBudget::Bytes((n * scale as f64) as usize));
        }
    }
    t.parse().map(StateBudget::Snapshots).map_err(|_| bad())
}

/// GPU bytes kept free for a step's activations, logits and the decode
/// graphs (an estimate, not a measurement: 64 KiB per batched token, the
/// f32 logits of every running row, 512 MiB of workspace).
pub fn activation_reserve(max_num_batched_tokens: usize, max_num_seqs: usize) -> usize {
    let vocab_estimate = 256 * 1024;
    max_num_batched_tokens * 64 * 1024 + max_num_seqs * vocab_estimate * 4 + (512 << 20)
}

/// Bytes of one KV page as the GPU executor lays it out (bf16 keys and
/// values of every attention layer): what a page of the CPU executor's
/// pool stands for when a state budget is a share of the cache memory.
pub fn kv_page_bytes(config: &qwen35::Config, page_size: usize) -> usize {
    let attention_layers = config
        .layer_types
        .iter()
        .filter(|t| **t == qwen35::config::LayerType::Full)
        .count();
    attention_layers * 2 * config.num_key_value_heads * config.head_dim * page_size * 2
}
