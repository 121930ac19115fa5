//! What the startup log and `/metrics` say of the memory requests run in.

use crate::executor::{ArenaGeometry, CacheGeometry, StateGeometry};

/// The memory requests run in: the KV pages and the state slots, and how
/// many requests of `max_model_len` tokens they hold at once (vLLM's
/// "Maximum concurrency").
#[derive(Clone, Copy, Debug)]
pub(crate) struct RequestMemory {
    geometry: CacheGeometry,
    state: StateGeometry,
    arena: Option<ArenaGeometry>,
    max_model_len: usize,
}

impl RequestMemory {
    pub(crate) fn new(
        geometry: CacheGeometry,
        state: StateGeometry,
        arena: Option<ArenaGeometry>,
        max_model_len: usize,
    ) -> Self {
        RequestMemory {
            geometry,
            state,
            arena,
            max_model_len,
        }
    }

    /// Bytes of the pages and the slots, or of the arena (0 for a term the
    /// executor does not give).
    pub(crate) fn bytes(&self) -> usize {
        match self.arena {
            Some(a) => a.num_chunks * a.chunk_bytes,
            None => {
                self.geometry.num_pages * self.state.page_bytes
                    + self.geometry.num_slots * self.state.slot_bytes
            }
        }
    }

    /// Requests of `max_model_len` tokens that fit: the pages' share (with
    /// an arena: the chunks' share of a request's pages and slot), capped
    /// by the slots.
    pub(crate) fn max_concurrency(&self) -> f64 {
        let g = &self.geometry;
        let pages_each = self.max_model_len.div_ceil(g.page_size.max(1)).max(1) as f64;
        let fit = match self.arena {
            None => g.num_pages as f64 / pages_each,
            Some(a) => {
                let chunks_each = pages_each * a.chunks_per_page_group as f64
                    / a.pages_per_group as f64
                    + a.chunks_per_slot_group as f64 / a.slots_per_group as f64;
                a.num_chunks as f64 / chunks_each
            }
        };
        fit.min(g.num_slots as f64)
    }
}

impl std::fmt::Display for RequestMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = &self.geometry;
        let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
        if let Some(a) = self.arena {
            return write!(
                f,
                "request memory: an arena of {} chunks of {:.0} MiB ({:.0} MiB) mapped as requests \
                 take them: KV pages of {} positions in groups of {} for {} chunks, up to {} state \
                 slots in groups of {} for {} chunks; maximum concurrency for {} tokens per \
                 request: {:.2}x",
                a.num_chunks,
                mib(a.chunk_bytes),
                mib(self.bytes()),
                g.page_size,
                a.pages_per_group,
                a.chunks_per_page_group,
                g.num_slots,
                a.slots_per_group,
                a.chunks_per_slot_group,
                self.max_model_len,
                self.max_concurrency()
            );
        }
        let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
        write!(
            f,
            "request memory: {} KV pages of {} positions ({:.0} MiB, {} tokens) and {} state slots \
             ({:.0} MiB), {:.0} MiB in all; maximum concurrency for {} tokens per request: {:.2}x",
            g.num_pages,
            g.page_size,
            mib(g.num_pages * self.state.page_bytes),
            g.num_pages * g.page_size,
            g.num_slots,
            mib(g.num_slots * self.state.slot_bytes),
            mib(self.bytes()),
            self.max_model_len,
            self.max_concurrency()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maximum_concurrency_is_the_pages_share_capped_by_the_slots() {
        // The 35B-A3B on an H100 at 0.95 with 64 slots: 3,871 pages of 64,
        // 9,216 tokens a request (144 pages).
        let geometry = CacheGeometry {
            num_slots: 64,
            num_pages: 3871,
            page_size: 64,
            vocab_size: 1,
            max_model_len: 9216,
        };
        let state = StateGeometry {
            recurrent_dtype: "float32",
            recurrent_bytes_per_slot: 60 << 20,
            slot_bytes: 61 << 20,
            page_bytes: 1280 << 10,
        };
        let pool = RequestMemory::new(geometry, state, None, 9216);
        assert!((pool.max_concurrency() - 3871.0 / 144.0).abs() < 1e-9);
        assert_eq!(pool.bytes(), 3871 * (1280 << 10) + 64 * (61 << 20));
        let text = pool.to_string();
        assert!(
            text.contains("3871 KV pages of 64 positions (4839 MiB, 247744 tokens)"),
            "{text}"
        );
        assert!(
            text.contains("maximum concurrency for 9216 tokens per request: 26.88x"),
            "{text}"
        );
        // Few slots: they cap it.
        let few = CacheGeometry {
            num_slots: 8,
            ..geometry
        };
        assert_eq!(
            RequestMemory::new(few, state, None, 9216).max_concurrency(),
            8.0
        );
    }

    #[test]
    fn with_an_arena_the_chunks_decide_and_the_slots_only_cap() {
        // The same memory as one arena of 2 MiB chunks: a page group of 32
        // pages for 20 chunks, a slot for 30; 144 pages (90 chunks) and a
        // slot a request.
        let geometry = CacheGeometry {
            num_slots: 64,
            num_pages: 4326 / 20 * 32,
            page_size: 64,
            vocab_size: 1,
            max_model_len: 9216,
        };
        let arena = ArenaGeometry {
            num_chunks: 4326,
            chunk_bytes: 2 << 20,
            pages_per_group: 32,
            chunks_per_page_group: 20,
            slots_per_group: 1,
            chunks_per_slot_group: 30,
        };
        let state = StateGeometry::default();
        let pool = RequestMemory::new(geometry, state, Some(arena), 9216);
        assert!((pool.max_concurrency() - 4326.0 / 120.0).abs() < 1e-9);
        assert_eq!(pool.bytes(), 4326 << 21);
        let text = pool.to_string();
        assert!(
            text.contains("an arena of 4326 chunks of 2 MiB (8652 MiB)"),
            "{text}"
        );
        assert!(
            text.contains("maximum concurrency for 9216 tokens per request: 36.05x"),
            "{text}"
        );
        let few = CacheGeometry {
            num_slots: 8,
            ..geometry
        };
        assert_eq!(
            RequestMemory::new(few, state, Some(arena), 9216).max_concurrency(),
            8.0
        );
    }
}
