//! The scheduler over an arena: every row runs on mapped memory, the pool
//! is never overdrawn, every request finishes (with and without a prefix
//! cache, whose pages may hold the chunks a slot needs), and the slots
//! are a cap: short requests run more at once than long ones.

use std::collections::HashSet;

use super::*;
use crate::executor::{ArenaGeometry, MemoryOp};

/// 40 chunks; a page group is 2 pages of 4 for 1 chunk, a slot group one
/// slot for 3 chunks (a state weighs 6 pages, 24 positions).
fn arena() -> ArenaGeometry {
    ArenaGeometry {
        num_chunks: 40,
        chunk_bytes: 1 << 21,
        pages_per_group: 2,
        chunks_per_page_group: 1,
        slots_per_group: 1,
        chunks_per_slot_group: 3,
    }
}

fn arena_scheduler(max_num_seqs: usize, cache: bool) -> Scheduler {
    let a = arena();
    let g = CacheGeometry {
        num_slots: max_num_seqs,
        num_pages: a.max_pages(),
        page_size: 4,
        vocab_size: 64,
        max_model_len: (a.num_chunks - 3) * 2 * 4,
    };
    let config = SchedulerConfig {
        max_num_batched_tokens: 64,
        max_num_seqs,
        max_model_len: g.max_model_len,
        long_prefill_token_threshold: 0,
        eos_token_ids: vec![EOS],
        prefix_cache: PrefixCacheConfig {
            enabled: cache,
            max_snapshots: 8,
            ..PrefixCacheConfig::default()
        },
        row_snapshots: 0,
        admission: AdmissionPolicy::default(),
    };
    Scheduler::with_arena(config, &g, Some(a))
}

/// What the executor has mapped, replayed from the plans' memory ops.
#[derive(Default)]
struct Mapped {
    pages: HashSet<u32>,
    slots: HashSet<u32>,
    most_running: usize,
}

impl Mapped {
    fn check(&mut self, s: &Scheduler, plan: &Plan) {
        let a = arena();
        for &op in &plan.memory_ops {
            let fresh = match op {
                MemoryOp::MapPages(g) => self.pages.insert(g),
                MemoryOp::MapSlots(g) => self.slots.insert(g),
                MemoryOp::UnmapPages(g) => self.pages.remove(&g),
                MemoryOp::UnmapSlots(g) => self.slots.remove(&g),
            };
            assert!(fresh, "{op:?} against what is mapped");
        }
        let chunks =
            self.pages.len() * a.chunks_per_page_group + self.slots.len() * a.chunks_per_slot_group;
        assert!(chunks <= a.num_chunks, "{chunks} chunks mapped");
        for row in &plan.rows {
            let cache = s.seqs[&row.id].cache.as_ref().unwrap();
            assert!(
                self.slots.contains(&cache.slot.0),
                "{:?} unmapped",
                cache.slot
            );
            for p in &cache.pages {
                assert!(self.pages.contains(&(p.0 / 2)), "{p:?} unmapped");
            }
        }
        self.most_running = self.most_running.max(s.running.len());
    }
}

fn run(s: &mut Scheduler, requests: &[(usize, usize)]) -> Mapped {
    for (id, &(prompt, max_tokens)) in requests.iter().enumerate() {
        add(s, id as u64, prompt, max_tokens);
    }
    let mut mapped = Mapped::default();
    let mut run = Run::default();
    while !s.is_idle() {
        assert!(run.steps < 20_000, "no progress");
        step_checked(s, &mut run, &mut |s: &Scheduler, plan: &Plan, _| {
            mapped.check(s, plan)
        });
    }
    for (id, &(_, max_tokens)) in requests.iter().enumerate() {
        assert_eq!(run.finished[&RequestId(id as u64)].0, max_tokens);
    }
    assert_eq!((s.alloc.slots_used(), s.alloc.pages_in_sequences()), (0, 0));
    mapped
}

#[test]
fn every_row_runs_on_mapped_memory_and_every_request_finishes() {
    let requests: Vec<(usize, usize)> = (0..40)
        .map(|i| (1 + (i * 37) % 70, 1 + (i * 53) % 40))
        .collect();
    for cache in [false, true] {
        let mut s = arena_scheduler(16, cache);
        run(&mut s, &requests);
    }
}

#[test]
fn max_num_seqs_caps_the_slots_instead_of_reserving_them() {
    // Short requests (3 pages + a slot of 3 chunks: about 4.5 chunks) run
    // 8 at once in 40 chunks; long ones (18 pages, 9 + 3 chunks) 3 at
    // once. A reservation of 16 slots (48 chunks) would not even fit.
    let short = run(&mut arena_scheduler(16, false), &[(8, 4); 16]);
    assert!(
        short.most_running >= 8,
        "{} short ran at once",
        short.most_running
    );
    let long = run(&mut arena_scheduler(16, false), &[(60, 12); 6]);
    assert!(
        long.most_running <= 3,
        "{} long ran at once",
        long.most_running
    );
    assert!(long.most_running >= 2);
}
