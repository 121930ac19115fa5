//! Where states are published: the points a prompt carries from the
//! start ([`snapshot_points`]), and the branch points found when a
//! sequence is admitted ([`branch_point`]). The scheduler applies the
//! decisions to its sequences and rows (`scheduler/snapshots.rs`).
//!
//! **Branch points.** A shared prefix without a snapshot point of its own
//! (a system prompt sent through raw completions, documents that share a
//! preamble) would never be served: every sharer's KV match runs past the
//! last snapshot and the state there does not exist. So when a waiting
//! sequence shares at least a page of tokens beyond its hit, either with
//! the cached KV or with a running sequence's tokens, the point where the
//! sharing ends becomes a snapshot point: the next sharers resume there.
//! The point is exact to the token, not rounded down to a page: the
//! kernels can end a chunk at any token, and the sharers diverge exactly
//! there; a page-aligned point would make every hit recompute up to a page
//! of shared tokens to save one page copy per hit and one tail page held.
//!
//! Who takes it: the earliest admitted running sequence that shares the
//! prefix and has not computed past it (its prefill stops there, its row
//! of the step being planned shortened if it went past, or taking the
//! snapshot inside the row; nothing is computed twice) and the newcomer
//! waits; else the newcomer itself (the others passed the point already).
//! A newcomer that finds a running sequence's point still ahead (a branch,
//! marker or last-but-one point it shares, at least a page beyond its own
//! hit) waits for it rather than taking a second snapshot of the same
//! prefix: requests of one group that arrive together are served by one
//! snapshot. Waiting ends: the point is ahead of a running sequence, which
//! either reaches it or leaves the running set. Meanwhile the sequences
//! behind the waiter may be admitted (it is passed over for the step,
//! keeping its place in the queue): a group's pending snapshot does not
//! hold up the other groups' requests.
//!
//! A snapshot is published only after a committed step, copied from the
//! slot of the sequence standing at the point (after the step, or inside
//! it into an id reserved at planning: the in-step snapshot) into the pool
//! (never a running slot), and resumed by copy: a published snapshot is
//! never written. With the in-step snapshot a running sharer's planned row
//! that runs past a new branch point takes the snapshot inside the row
//! instead of being cut there.

use super::config::PrefixCacheConfig;
use super::trie::common_prefix;

/// A marker point this close to the prompt's end makes the last-but-one
/// point redundant: a repeat resumes there and recomputes a few tokens
/// (chat: `<think>\n` after `<|im_start|>assistant\n`), which costs less
/// than another snapshot and another prefill chunk.
pub const MARKER_COVERS_END: usize = 16;

/// Where a prompt's state is published: after the last occurrence of each
/// marker; after its last-but-one token when the config asks (an exact
/// repeat must still compute the last prompt token, whose logits give the
/// first output token, so a snapshot at the very end could never serve it)
/// unless a marker point lies within [`MARKER_COVERS_END`] tokens before it; every
/// `snapshot_interval` tokens. Ascending, each at most once, all within the
/// prompt, none at 0.
pub fn snapshot_points(prompt: &[u32], config: &PrefixCacheConfig) -> Vec<usize> {
    let mut points = vec![];
    for marker in config.snapshot_after.iter().filter(|m| !m.is_empty()) {
        if let Some(at) = prompt.windows(marker.len()).rposition(|w| w == &marker[..]) {
            points.push(at + marker.len());
        }
    }
    let last_but_one = prompt.len() - 1;
    if config.snapshot_before_last_token
        && !points
            .iter()
            .any(|&q| q + MARKER_COVERS_END >= last_but_one)
    {
        points.push(last_but_one);
    }
    if config.snapshot_interval > 0 {
        points.extend(
            (1..)
                .map(|k| k * config.snapshot_interval)
                .take_while(|&q| q < prompt.len()),
        );
    }
    points.retain(|&q| q > 0 && q < prompt.len());
    points.sort_unstable();
    points.dedup();
    points
}

/// A running sequence, as the branch decision sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sharer<'a> {
    /// Its tokens so far (prompt, then output).
    pub tokens: &'a [u32],
    /// Its snapshot points, ascending.
    pub points: &'a [usize],
    /// Its tokens computed before the step being planned.
    pub computed: usize,
}

/// What admission does about the prefix a waiting sequence shares beyond
/// its hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Branch {
    /// Nothing worth a snapshot.
    None,
    /// A running sequence will publish a snapshot this one can use.
    Wait,
    /// The running sequence at index `running` of the sharers is to
    /// publish a new point `at` (its row of the step, if planned past the
    /// point, takes the snapshot inside the step or stops there); this one
    /// waits for it.
    Carry { running: usize, at: usize },
    /// This sequence's prefill stops at the point and publishes there.
    Own(usize),
}

/// The branch decision (see the module doc) for a waiting sequence of
/// `tokens` with a hit at `hit` and the cached KV matching its tokens up
/// to `kv_matched`, given the running sequences in admission order
/// (oldest first).
pub(crate) fn branch_point<'a>(
    tokens: &[u32],
    hit: usize,
    kv_matched: usize,
    page_size: usize,
    running: impl IntoIterator<Item = Sharer<'a>>,
) -> Branch {
    // The last prompt token is always computed (its logits sample).
    let limit = tokens.len() - 1;
    let worth = |q: usize| q <= limit && q >= hit + page_size;
    let mut deepest = kv_matched.min(limit);
    // Per running sequence: (tokens shared with it, computed before this step).
    let mut shares = Vec::new();
    for other in running {
        let shared = common_prefix(tokens, other.tokens).min(limit);
        let pending = other
            .points
            .iter()
            .any(|&q| q > other.computed && q <= shared && worth(q));
        if pending {
            return Branch::Wait;
        }
        shares.push((shared, other.computed));
        deepest = deepest.max(shared);
    }
    if !worth(deepest) {
        return Branch::None;
    }
    let carrier = shares
        .iter()
        .position(|&(shared, computed)| shared >= deepest && computed < deepest);
    match carrier {
        Some(running) => Branch::Carry {
            running,
            at: deepest,
        },
        None => Branch::Own(deepest),
    }
}
