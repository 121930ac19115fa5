//! The tokens a constrained row may sample (structured outputs): a bitmask
//! the engine's mask pool computes while the executor runs the forward, so
//! the executor reads it only when it samples and waits only if it is late.
//!
//! Waiting is not the same as being late: a GPU executor asks for the masks
//! with the forward queued, and a wait that ends while the device is still
//! busy costs nothing. A mask is *late* when the device had finished the
//! forward by the time the mask arrived, so the step waited for it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

/// The tokens a constrained row may sample: bit `t % 32` of word `t / 32`
/// set means token `t` is allowed. Rows narrower than the executor's logits
/// width disallow the tokens beyond it.
///
/// Samplers apply it before everything else (penalties, bans, temperature,
/// truncation): a disallowed token's logit is -inf. The `min_tokens` bans
/// of [`crate::SampleSpec::banned`] then apply among the allowed tokens;
/// when they would leave none, the bans are lifted (the grammar wins: it
/// must be able to end).
pub struct AllowedTokens {
    source: Source,
}

enum Source {
    Ready(Vec<u32>),
    Pending(Arc<PendingMask>),
}

impl AllowedTokens {
    /// A mask that is already computed.
    pub fn ready(words: Vec<u32>) -> Self {
        AllowedTokens {
            source: Source::Ready(words),
        }
    }

    /// A mask the engine's pool fills in later ([`PendingMask::fulfil`]).
    pub(crate) fn pending(mask: Arc<PendingMask>) -> Self {
        AllowedTokens {
            source: Source::Pending(mask),
        }
    }

    /// The mask words; blocks until the engine's mask pool has computed
    /// them. For a sampler whose forward has already finished (a host
    /// executor): any wait here delays the step, so it counts as late.
    pub fn words(&self) -> &[u32] {
        self.words_while(|| false)
    }

    /// The mask words, asked while the device may still be running the
    /// forward: `device_busy` is checked once a wait ends, and a mask that
    /// arrived after the device went idle counts as late.
    pub fn words_while(&self, device_busy: impl FnOnce() -> bool) -> &[u32] {
        match &self.source {
            Source::Ready(words) => words,
            Source::Pending(mask) => mask.wait(device_busy),
        }
    }

    pub fn is_allowed(&self, token: u32) -> bool {
        let words = self.words();
        words
            .get(token as usize / 32)
            .is_some_and(|w| w >> (token % 32) & 1 == 1)
    }
}

impl std::fmt::Debug for AllowedTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let computed = match &self.source {
            Source::Ready(words) => Some(words.len()),
            Source::Pending(mask) => mask.words.get().map(Vec::len),
        };
        match computed {
            Some(words) => write!(f, "AllowedTokens({words} words)"),
            None => write!(f, "AllowedTokens(pending)"),
        }
    }
}

/// A mask being computed: the pool fulfils it once, readers block until
/// then. Whether a reader had to wait is recorded (the engine counts the
/// steps that waited for a mask).
#[derive(Default)]
pub(crate) struct PendingMask {
    words: OnceLock<Vec<u32>>,
    lock: Mutex<()>,
    computed: Condvar,
    waited: AtomicBool,
    late: AtomicBool,
    /// How long readers blocked, in nanoseconds.
    wait_nanos: AtomicU64,
}

impl PendingMask {
    /// Sets the words and wakes the readers (only the first call counts).
    pub(crate) fn fulfil(&self, words: Vec<u32>) {
        let _ = self.words.set(words);
        // Taken after the set: a reader that found no words under the lock
        // is already waiting, so the notification cannot be lost.
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.computed.notify_all();
    }

    /// Whether a reader found the mask not yet computed.
    pub(crate) fn waited(&self) -> bool {
        self.waited.load(Ordering::Acquire)
    }

    /// Whether the mask arrived after the device had finished the forward
    /// (the step waited for it).
    pub(crate) fn late(&self) -> bool {
        self.late.load(Ordering::Acquire)
    }

    /// How long readers blocked on it.
    pub(crate) fn wait_seconds(&self) -> f64 {
        self.wait_nanos.load(Ordering::Acquire) as f64 * 1e-9
    }

    fn wait(&self, device_busy: impl FnOnce() -> bool) -> &[u32] {
        if let Some(words) = self.words.get() {
            return words;
        }
        self.waited.store(true, Ordering::Release);
        let started = Instant::now();
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let words = loop {
            if let Some(words) = self.words.get() {
                break words;
            }
            guard = self.computed.wait(guard).unwrap_or_else(|e| e.into_inner());
        };
        drop(guard);
        let nanos = started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.wait_nanos.fetch_add(nanos, Ordering::AcqRel);
        if !device_busy() {
            self.late.store(true, Ordering::Release);
        }
        words
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_name_tokens_and_tokens_beyond_the_words_are_disallowed() {
        let allowed = AllowedTokens::ready(vec![0b101, 1 << 31]);
        let set: Vec<u32> = (0..100).filter(|&t| allowed.is_allowed(t)).collect();
        assert_eq!(set, [0, 2, 63]);
    }

    #[test]
    fn a_pending_mask_blocks_until_fulfilled_and_records_the_wait() {
        let mask = Arc::new(PendingMask::default());
        let allowed = AllowedTokens::pending(mask.clone());
        let filler = std::thread::spawn({
            let mask = mask.clone();
            move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                mask.fulfil(vec![2]);
            }
        });
        assert_eq!(allowed.words(), [2]);
        assert!(mask.waited());
        // A host sampler's forward is done: its wait delayed the step.
        assert!(mask.late());
        assert!(mask.wait_seconds() >= 0.04, "{}", mask.wait_seconds());
        filler.join().unwrap();
        let early = Arc::new(PendingMask::default());
        early.fulfil(vec![4]);
        assert!(AllowedTokens::pending(early.clone()).is_allowed(2));
        assert!(!early.waited());
    }

    #[test]
    fn a_wait_is_late_only_if_the_device_went_idle_first() {
        for device_busy in [true, false] {
            let mask = Arc::new(PendingMask::default());
            let allowed = AllowedTokens::pending(mask.clone());
            let filler = std::thread::spawn({
                let mask = mask.clone();
                move || {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    mask.fulfil(vec![1]);
                }
            });
            assert_eq!(allowed.words_while(|| device_busy), [1]);
            filler.join().unwrap();
            assert!(mask.waited());
            assert_eq!(mask.late(), !device_busy);
        }
        // Computed before it was asked for: neither waited nor late, and
        // the device is not even asked.
        let early = Arc::new(PendingMask::default());
        early.fulfil(vec![1]);
        let allowed = AllowedTokens::pending(early.clone());
        assert_eq!(allowed.words_while(|| panic!("not asked")), [1]);
        assert!(!early.waited() && !early.late());
    }
}
