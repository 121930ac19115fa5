//! State slots and KV pages: who owns which executor buffer.
//!
//! Pages are reference-counted so that the prefix cache can share a page
//! between sequences (a page returns to the free list when its last holder
//! releases it); slots are owned by exactly one sequence. Free ids go out
//! lowest first. The allocator only counts; the executor holds the buffers
//! these ids address. With an arena ([`ArenaGeometry`], `arena.rs`) pages
//! and slots are mapped by group from one pool of chunks as they are
//! taken, so a slot costs pages only while a request holds it; the
//! allocator queues the maps and unmaps ([`Allocator::take_memory_ops`]).

mod arena;

use std::collections::BTreeSet;

use arena::{ArenaBook, Kind};

use crate::executor::{ArenaGeometry, CacheGeometry, MemoryOp, PageId, SlotId};

/// One sequence's cache: its state slot and its KV pages in position order.
#[derive(Debug)]
pub struct SeqCache {
    pub slot: SlotId,
    pub pages: Vec<PageId>,
}

#[derive(Debug)]
pub struct Allocator {
    page_size: usize,
    /// Holders of each page (0: free), the prefix cache included.
    page_refs: Vec<u32>,
    /// Of those, the prefix cache's holds.
    cache_refs: Vec<u32>,
    /// Pages only the prefix cache holds (evictable: vLLM counts such
    /// blocks as free in `kv_cache_usage_perc`).
    cache_only: usize,
    /// Pages with a holder.
    held_pages: usize,
    /// Free pages that are there to take (with an arena: in mapped
    /// groups), lowest first: with an arena that packs use into the low
    /// groups so that the high ones empty out for slots.
    free_pages: BTreeSet<u32>,
    slot_used: Vec<bool>,
    held_slots: usize,
    free_slots: BTreeSet<u32>,
    /// The executor's arena (`None`: every page and slot is there).
    arena: Option<ArenaBook>,
}

impl Allocator {
    pub fn new(geometry: &CacheGeometry) -> Self {
        assert!(geometry.page_size > 0, "page_size must be > 0");
        Allocator {
            page_size: geometry.page_size,
            page_refs: vec![0; geometry.num_pages],
            cache_refs: vec![0; geometry.num_pages],
            cache_only: 0,
            held_pages: 0,
            free_pages: (0..geometry.num_pages as u32).collect(),
            slot_used: vec![false; geometry.num_slots],
            held_slots: 0,
            free_slots: (0..geometry.num_slots as u32).collect(),
            arena: None,
        }
    }

    /// An allocator over an arena: nothing mapped at first, page ids up to
    /// what the whole pool holds as pages, `geometry.num_slots` slot ids.
    pub fn with_arena(geometry: &CacheGeometry, arena: ArenaGeometry) -> Self {
        let num_pages = arena.max_pages().min(geometry.num_pages);
        let mut alloc = Allocator::new(&CacheGeometry {
            num_pages,
            ..*geometry
        });
        alloc.free_pages.clear();
        alloc.free_slots.clear();
        alloc.arena = Some(ArenaBook::new(arena, geometry.num_slots));
        alloc
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Page ids (with an arena: the pages the pool holds when it holds no
    /// slot).
    pub fn pages_total(&self) -> usize {
        self.page_refs.len()
    }

    /// Pages that can be taken now (with an arena: free in mapped groups,
    /// and in the groups the free and reclaimable chunks would map).
    pub fn pages_free(&self) -> usize {
        let mappable = self
            .arena
            .as_ref()
            .map_or(0, |a| a.mappable(Kind::Pages) * a.per_group(Kind::Pages));
        (self.free_pages.len() + mappable).min(self.pages_total() - self.held_pages)
    }

    pub fn pages_used(&self) -> usize {
        self.held_pages
    }

    pub fn slots_total(&self) -> usize {
        self.slot_used.len()
    }

    /// Slots that can be taken now (with an arena: as for pages).
    pub fn slots_free(&self) -> usize {
        let mappable = self
            .arena
            .as_ref()
            .map_or(0, |a| a.mappable(Kind::Slots) * a.per_group(Kind::Slots));
        (self.free_slots.len() + mappable).min(self.slots_total() - self.held_slots)
    }

    pub fn slots_used(&self) -> usize {
        self.held_slots
    }

    /// Pages that taking a slot now would cost: 0 without an arena; with
    /// one, the pages its chunks would otherwise map (0 when it comes from
    /// a group that holds other slots already).
    pub fn slot_cost_pages(&mut self) -> usize {
        let Some(arena) = self.arena.as_mut() else {
            return 0;
        };
        let before =
            self.free_pages.len() + arena.mappable(Kind::Pages) * arena.per_group(Kind::Pages);
        let ppg = arena.per_group(Kind::Pages);
        let after = match self.free_slots.first() {
            Some(&slot) => {
                let g = slot as usize / arena.per_group(Kind::Slots);
                arena.hold(Kind::Slots, g, 1);
                let mappable = arena.mappable(Kind::Pages);
                arena.hold(Kind::Slots, g, -1);
                self.free_pages.len() + mappable * ppg
            }
            None => match arena.mappable_after_other(Kind::Pages) {
                Some((mappable, unmapped)) => {
                    self.free_pages.len() - unmapped * ppg + mappable * ppg
                }
                None => return 0,
            },
        };
        before.saturating_sub(after)
    }

    /// Memory work the allocator decided since the last call (with an
    /// arena): run it, in order, before the step.
    pub fn take_memory_ops(&mut self) -> Vec<MemoryOp> {
        self.arena
            .as_mut()
            .map(ArenaBook::take_ops)
            .unwrap_or_default()
    }

    /// The arena's bytes mapped for pages and for slots (`None`: no arena).
    pub fn arena_mapped_bytes(&self) -> Option<(usize, usize)> {
        self.arena.as_ref().map(|a| {
            let chunk = a.geometry.chunk_bytes;
            (
                a.mapped_chunks(Kind::Pages) * chunk,
                a.mapped_chunks(Kind::Slots) * chunk,
            )
        })
    }

    /// The share of the memory requests hold (vLLM's
    /// `kv_cache_usage_perc`): their pages of all pages, or with an arena
    /// their pages' and slots' chunks of all chunks. Pages the prefix
    /// cache alone holds count as free, as vLLM counts them.
    pub fn usage(&self) -> f64 {
        let pages = self.pages_in_sequences();
        match self.arena.as_ref() {
            None => pages as f64 / self.pages_total().max(1) as f64,
            Some(a) => {
                let g = &a.geometry;
                let page_chunks =
                    pages as f64 * g.chunks_per_page_group as f64 / g.pages_per_group as f64;
                let slot_chunks = self.held_slots as f64 * g.chunks_per_slot_group as f64
                    / g.slots_per_group as f64;
                (page_chunks + slot_chunks) / g.num_chunks.max(1) as f64
            }
        }
    }

    /// Pages needed to hold `positions` positions.
    pub fn pages_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.page_size)
    }

    /// Pages `cache` still lacks to hold `positions` positions.
    pub fn pages_missing(&self, cache: &SeqCache, positions: usize) -> usize {
        self.pages_for(positions).saturating_sub(cache.pages.len())
    }

    /// A slot and pages for `positions` positions, or `None` (nothing
    /// taken) when either is short.
    pub fn open(&mut self, positions: usize) -> Option<SeqCache> {
        self.open_shared(&[], positions)
    }

    /// Growth policy: pages are added only as positions need them (no
    /// look-ahead reservation), so memory follows actual length and running
    /// short is handled by the scheduler's preemption. All or nothing:
    /// returns false, taking nothing, when the free pages do not suffice.
    pub fn grow(&mut self, cache: &mut SeqCache, positions: usize) -> bool {
        let missing = self.pages_missing(cache, positions);
        if missing > self.pages_free() {
            return false;
        }
        for _ in 0..missing {
            let page = self.take_page();
            debug_assert_eq!(self.page_refs[page.0 as usize], 0);
            self.page_refs[page.0 as usize] = 1;
            self.held_pages += 1;
            cache.pages.push(page);
        }
        true
    }

    /// The lowest free page, mapping a group for it when none is free (the
    /// caller counted it in [`Self::pages_free`]).
    fn take_page(&mut self) -> PageId {
        if self.free_pages.is_empty() {
            let arena = self.arena.as_mut().expect("counted as free");
            let (g, unmapped) = arena.map(Kind::Pages).expect("counted as free");
            let spg = arena.per_group(Kind::Slots);
            for s in unmapped {
                for slot in s * spg..(s + 1) * spg {
                    self.free_slots.remove(&(slot as u32));
                }
            }
            let ppg = arena.per_group(Kind::Pages);
            let ids = (g * ppg..(g + 1) * ppg).filter(|&p| p < self.page_refs.len());
            self.free_pages.extend(ids.map(|p| p as u32));
        }
        let page = self.free_pages.pop_first().expect("a free page");
        self.hold_group(Kind::Pages, page as usize, 1);
        PageId(page)
    }

    /// The lowest free slot, mapping a group as [`Self::take_page`] does.
    fn take_slot(&mut self) -> SlotId {
        if self.free_slots.is_empty() {
            let arena = self.arena.as_mut().expect("counted as free");
            let (g, unmapped) = arena.map(Kind::Slots).expect("counted as free");
            let ppg = arena.per_group(Kind::Pages);
            for p in unmapped {
                for page in p * ppg..(p + 1) * ppg {
                    self.free_pages.remove(&(page as u32));
                }
            }
            let spg = arena.per_group(Kind::Slots);
            let ids = (g * spg..(g + 1) * spg).filter(|&s| s < self.slot_used.len());
            self.free_slots.extend(ids.map(|s| s as u32));
        }
        let slot = self.free_slots.pop_first().expect("a free slot");
        self.hold_group(Kind::Slots, slot as usize, 1);
        self.slot_used[slot as usize] = true;
        self.held_slots += 1;
        SlotId(slot)
    }

    /// Counts an id of `kind` taken (+1) or given back (-1) in its group.
    fn hold_group(&mut self, kind: Kind, id: usize, delta: i32) {
        if let Some(arena) = self.arena.as_mut() {
            let g = id / arena.per_group(kind);
            arena.hold(kind, g, delta);
        }
    }

    /// Whether `page`'s memory is there (always, without an arena).
    pub fn page_mapped(&self, page: PageId) -> bool {
        self.arena
            .as_ref()
            .is_none_or(|a| a.is_mapped(Kind::Pages, page.0 as usize / a.per_group(Kind::Pages)))
    }

    /// Holders of `page` (0: free).
    pub fn page_refs(&self, page: PageId) -> u32 {
        self.page_refs[page.0 as usize]
    }

    /// Pages held by the prefix cache alone.
    pub fn pages_cache_only(&self) -> usize {
        self.cache_only
    }

    /// Pages held by sequences (shared ones once).
    pub fn pages_in_sequences(&self) -> usize {
        self.pages_used() - self.cache_only
    }

    fn is_cache_only(&self, page: PageId) -> bool {
        let p = page.0 as usize;
        self.page_refs[p] > 0 && self.page_refs[p] == self.cache_refs[p]
    }

    /// Changes `page`'s holds by `request` and `cache` (+1 or -1 each),
    /// keeping the cache-only count.
    fn change_holds(&mut self, page: PageId, request: i32, cache: i32) {
        let was = self.is_cache_only(page);
        let p = page.0 as usize;
        self.page_refs[p] = (self.page_refs[p] as i32 + request + cache) as u32;
        self.cache_refs[p] = (self.cache_refs[p] as i32 + cache) as u32;
        match (was, self.is_cache_only(page)) {
            (false, true) => self.cache_only += 1,
            (true, false) => self.cache_only -= 1,
            _ => {}
        }
        if self.page_refs[p] == 0 {
            self.free_pages.insert(page.0);
            self.held_pages -= 1;
            self.hold_group(Kind::Pages, p, -1);
        }
    }

    /// The prefix cache's hold on `page` (which must be in use).
    pub fn cache_retain(&mut self, page: PageId) {
        assert!(
            self.page_refs[page.0 as usize] > 0,
            "cache retain of free page {page:?}"
        );
        self.change_holds(page, 0, 1);
    }

    /// Drops a prefix-cache hold on `page`; free when none is left.
    pub fn cache_release(&mut self, page: PageId) {
        assert!(
            self.cache_refs[page.0 as usize] > 0,
            "double cache release of page {page:?}"
        );
        self.change_holds(page, 0, -1);
    }

    /// A slot and, first, a hold on each of `shared` (pages of a prefix-cache
    /// hit), then fresh pages up to `positions`; `None` (nothing taken) when
    /// a slot or the fresh pages are short (with an arena: the pages left
    /// once the slot took its chunks).
    pub fn open_shared(&mut self, shared: &[PageId], positions: usize) -> Option<SeqCache> {
        let fresh = self.pages_for(positions).saturating_sub(shared.len());
        if self.slots_free() == 0 || fresh + self.slot_cost_pages() > self.pages_free() {
            return None;
        }
        let slot = self.take_slot();
        for &page in shared {
            self.retain_page(page);
        }
        let mut cache = SeqCache {
            slot,
            pages: shared.to_vec(),
        };
        let grown = self.grow(&mut cache, positions);
        debug_assert!(grown);
        Some(cache)
    }

    /// Another holder of `page` (a prefix-cache share). The page must be in use.
    pub fn retain_page(&mut self, page: PageId) {
        assert!(
            self.page_refs[page.0 as usize] > 0,
            "retain of free page {page:?}"
        );
        self.change_holds(page, 1, 0);
    }

    /// Drops one holder of `page`; the page is free when none is left.
    pub fn release_page(&mut self, page: PageId) {
        let p = page.0 as usize;
        assert!(
            self.page_refs[p] > self.cache_refs[p],
            "double release of page {page:?}"
        );
        self.change_holds(page, -1, 0);
    }

    /// Gives back a sequence's slot and its holds on its pages.
    pub fn close(&mut self, cache: SeqCache) {
        for page in cache.pages {
            self.release_page(page);
        }
        let s = cache.slot.0 as usize;
        assert!(self.slot_used[s], "double release of slot {:?}", cache.slot);
        self.slot_used[s] = false;
        self.held_slots -= 1;
        self.free_slots.insert(cache.slot.0);
        self.hold_group(Kind::Slots, s, -1);
    }
}

#[cfg(test)]
mod arena_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(num_slots: usize, num_pages: usize, page_size: usize) -> CacheGeometry {
        CacheGeometry {
            num_slots,
            num_pages,
            page_size,
            vocab_size: 16,
            max_model_len: num_pages * page_size,
        }
    }

    #[test]
    fn open_grow_close_counts_and_exclusivity() {
        let mut alloc = Allocator::new(&geometry(2, 5, 4));
        // 5 positions need 2 pages of 4.
        let mut a = alloc.open(5).unwrap();
        assert_eq!(a.pages.len(), 2);
        assert_eq!((alloc.slots_used(), alloc.pages_used()), (1, 2));
        // 8 positions still fit in 2 pages; 9 need a third.
        assert!(alloc.grow(&mut a, 8));
        assert_eq!(a.pages.len(), 2);
        assert!(alloc.grow(&mut a, 9));
        assert_eq!(a.pages.len(), 3);
        // 2 pages left: a second sequence of 12 positions (3 pages) is refused
        // and takes nothing.
        assert!(alloc.open(12).is_none());
        assert_eq!((alloc.slots_used(), alloc.pages_used()), (1, 3));
        let b = alloc.open(8).unwrap();
        assert_ne!(a.slot, b.slot);
        for page in &b.pages {
            assert!(!a.pages.contains(page), "page {page:?} handed out twice");
        }
        // No page left: growth fails without taking anything.
        assert!(!alloc.grow(&mut a, 13));
        assert_eq!(a.pages.len(), 3);
        // No slot left either.
        alloc.close(b);
        alloc.close(a);
        assert_eq!((alloc.slots_used(), alloc.pages_used()), (0, 0));
        assert_eq!((alloc.slots_free(), alloc.pages_free()), (2, 5));
    }

    #[test]
    fn slots_run_out_before_pages() {
        let mut alloc = Allocator::new(&geometry(1, 10, 4));
        let a = alloc.open(1).unwrap();
        assert!(alloc.open(1).is_none());
        alloc.close(a);
        assert!(alloc.open(1).is_some());
    }

    #[test]
    fn shared_page_is_freed_by_its_last_holder() {
        let mut alloc = Allocator::new(&geometry(2, 2, 4));
        let a = alloc.open(4).unwrap();
        let shared = a.pages[0];
        alloc.retain_page(shared);
        alloc.close(a);
        // Still held by the second holder.
        assert_eq!(alloc.pages_used(), 1);
        alloc.release_page(shared);
        assert_eq!(alloc.pages_used(), 0);
    }

    #[test]
    fn pages_held_by_the_cache_alone_are_counted_apart() {
        let mut alloc = Allocator::new(&geometry(2, 4, 4));
        let a = alloc.open(8).unwrap();
        let (p0, p1) = (a.pages[0], a.pages[1]);
        alloc.cache_retain(p0);
        alloc.cache_retain(p1);
        assert_eq!(
            (alloc.pages_in_sequences(), alloc.pages_cache_only()),
            (2, 0)
        );
        // A second sequence shares p0.
        let b = alloc.open_shared(&[p0], 5).unwrap();
        assert_eq!(alloc.page_refs(p0), 3);
        alloc.close(a);
        // p1 is the cache's alone now; p0 is still b's.
        assert_eq!(
            (alloc.pages_in_sequences(), alloc.pages_cache_only()),
            (2, 1)
        );
        alloc.close(b);
        assert_eq!(
            (alloc.pages_in_sequences(), alloc.pages_cache_only()),
            (0, 2)
        );
        alloc.cache_release(p0);
        alloc.cache_release(p1);
        assert_eq!((alloc.pages_used(), alloc.pages_cache_only()), (0, 0));
        assert_eq!(alloc.pages_free(), 4);
    }

    #[test]
    #[should_panic(expected = "double release")]
    fn double_release_is_caught() {
        let mut alloc = Allocator::new(&geometry(1, 2, 4));
        let a = alloc.open(4).unwrap();
        let page = a.pages[0];
        alloc.close(a);
        alloc.release_page(page);
    }
}
