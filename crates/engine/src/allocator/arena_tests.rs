//! The arena's allocator: what it maps and unmaps, what a slot costs in
//! pages, and that the chunks mapped never exceed the pool. A mirror
//! replays the memory ops as an executor would and checks each against
//! the holds.

use std::collections::HashSet;

use super::*;

/// 12 chunks; a page group is 4 pages for 2 chunks, a slot group 2 slots
/// for 3 chunks.
fn arena() -> ArenaGeometry {
    ArenaGeometry {
        num_chunks: 12,
        chunk_bytes: 1 << 21,
        pages_per_group: 4,
        chunks_per_page_group: 2,
        slots_per_group: 2,
        chunks_per_slot_group: 3,
    }
}

fn alloc() -> Allocator {
    let g = CacheGeometry {
        num_slots: 6,
        num_pages: usize::MAX,
        page_size: 4,
        vocab_size: 16,
        max_model_len: 1 << 20,
    };
    Allocator::with_arena(&g, arena())
}

/// What the executor has mapped, from the ops alone.
#[derive(Default)]
struct Mirror {
    pages: HashSet<u32>,
    slots: HashSet<u32>,
}

impl Mirror {
    /// Applies `alloc`'s pending ops, checking each against its holds, and
    /// that the chunks mapped fit the pool.
    fn apply(&mut self, alloc: &mut Allocator) {
        let a = arena();
        for op in alloc.take_memory_ops() {
            match op {
                MemoryOp::MapPages(g) => assert!(self.pages.insert(g), "{op:?} twice"),
                MemoryOp::MapSlots(g) => assert!(self.slots.insert(g), "{op:?} twice"),
                MemoryOp::UnmapPages(g) => {
                    assert!(self.pages.remove(&g), "{op:?} not mapped");
                    let ids = g as usize * a.pages_per_group..(g as usize + 1) * a.pages_per_group;
                    assert!(ids
                        .into_iter()
                        .all(|p| alloc.page_refs(PageId(p as u32)) == 0));
                }
                MemoryOp::UnmapSlots(g) => {
                    assert!(self.slots.remove(&g), "{op:?} not mapped");
                    let ids = g as usize * a.slots_per_group..(g as usize + 1) * a.slots_per_group;
                    assert!(ids.into_iter().all(|s| !alloc.slot_used[s]));
                }
            }
        }
        let chunks =
            self.pages.len() * a.chunks_per_page_group + self.slots.len() * a.chunks_per_slot_group;
        assert!(chunks <= a.num_chunks, "{chunks} chunks mapped");
    }

    /// Every page and the slot of `cache` lie in mapped groups.
    fn covers(&self, cache: &SeqCache) -> bool {
        let a = arena();
        self.slots
            .contains(&(cache.slot.0 / a.slots_per_group as u32))
            && cache
                .pages
                .iter()
                .all(|p| self.pages.contains(&(p.0 / a.pages_per_group as u32)))
    }
}

#[test]
fn nothing_is_mapped_until_a_sequence_opens() {
    let mut a = alloc();
    assert_eq!(a.take_memory_ops(), vec![]);
    // 12 chunks as pages: 6 groups of 4.
    assert_eq!(
        (a.pages_total(), a.pages_free(), a.slots_free()),
        (24, 24, 6)
    );
    // The first slot maps a slot group (3 chunks): 9 left, 4 page groups.
    assert_eq!(a.slot_cost_pages(), 8);
    let mut mirror = Mirror::default();
    let s = a.open(9).unwrap();
    mirror.apply(&mut a);
    assert!(mirror.covers(&s));
    assert_eq!((s.slot, s.pages.len()), (SlotId(0), 3));
    assert_eq!(mirror.slots, HashSet::from([0]));
    assert_eq!(mirror.pages, HashSet::from([0]));
    // 3 + 2 chunks mapped: 7 left, 3 page groups; 1 page free in group 0.
    assert_eq!(a.pages_free(), 1 + 3 * 4);
    // The second slot comes from the mapped group: it costs no page.
    assert_eq!(a.slot_cost_pages(), 0);
    assert_eq!(a.arena_mapped_bytes(), Some((2 << 21, 3 << 21)));
}

#[test]
fn slots_and_pages_trade_chunks_and_unmap_only_what_is_free() {
    let mut a = alloc();
    let mut mirror = Mirror::default();
    // One sequence takes all it can: 1 slot group (3 chunks), then 4 page
    // groups (8 chunks) = 16 pages; 1 chunk left.
    let mut long = a.open(4).unwrap();
    assert!(a.grow(&mut long, 64));
    mirror.apply(&mut a);
    assert!(mirror.covers(&long));
    assert_eq!(a.pages_free(), 0);
    // The mapped group's second slot is free; a third slot group is not.
    assert_eq!(a.slots_free(), 1);
    let short = a.open(0).unwrap();
    mirror.apply(&mut a);
    assert_eq!(a.slots_free(), 0);
    assert!(a.open(0).is_none(), "no chunks for a second slot group");
    // The long one ends: its page groups empty, stay mapped, and count as
    // free for both kinds: its slot, and 2 more slot groups (all the ids
    // left) from 1 free chunk and 8 reclaimable.
    a.close(long);
    mirror.apply(&mut a);
    assert_eq!(mirror.pages.len(), 4);
    assert_eq!(a.pages_free(), 16);
    assert_eq!(a.slots_free(), 1 + 2 * 2);
    // Slot 0 comes from its mapped group; then a new slot group takes 3
    // chunks: 1 free + 2 from the highest empty page group, which is
    // unmapped first.
    let reuse = a.open(0).unwrap();
    assert_eq!((reuse.slot, a.take_memory_ops()), (SlotId(0), vec![]));
    let third = a.open(0).unwrap();
    let ops = a.take_memory_ops();
    assert_eq!(ops, vec![MemoryOp::UnmapPages(3), MemoryOp::MapSlots(1)]);
    mirror.pages.remove(&3);
    mirror.slots.insert(1);
    assert!(mirror.covers(&third) && mirror.covers(&short));
    assert_eq!(a.pages_free(), 12);
    a.close(third);
    a.close(short);
    a.close(reuse);
    mirror.apply(&mut a);
    assert_eq!((a.pages_used(), a.slots_used()), (0, 0));
}

#[test]
fn random_opens_grows_and_closes_keep_the_mirror_and_the_pool() {
    let mut a = alloc();
    let mut mirror = Mirror::default();
    let mut live: Vec<SeqCache> = Vec::new();
    let mut x: u64 = 7;
    for _ in 0..2000 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        match (x >> 33) % 3 {
            0 => {
                let positions = ((x >> 40) % 20) as usize;
                let cost = a.slot_cost_pages();
                let fits = a.slots_free() > 0 && a.pages_for(positions) + cost <= a.pages_free();
                let opened = a.open(positions);
                assert_eq!(opened.is_some(), fits, "open({positions}) vs the counts");
                live.extend(opened);
            }
            1 if !live.is_empty() => {
                let i = (x >> 40) as usize % live.len();
                let want = live[i].pages.len() * 4 + ((x >> 50) % 9) as usize;
                let fits = a.pages_missing(&live[i], want) <= a.pages_free();
                assert_eq!(a.grow(&mut live[i], want), fits);
            }
            _ if !live.is_empty() => {
                let i = (x >> 40) as usize % live.len();
                a.close(live.swap_remove(i));
            }
            _ => {}
        }
        mirror.apply(&mut a);
        assert!(live.iter().all(|c| mirror.covers(c)));
        assert_eq!(a.slots_used(), live.len());
        assert_eq!(
            a.pages_used(),
            live.iter().map(|c| c.pages.len()).sum::<usize>()
        );
    }
}
