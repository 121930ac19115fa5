//! State slots and KV pages: who owns which executor buffer.
//!
//! Pages are reference-counted so that a later prefix cache can share a page
//! between sequences (a page returns to the free list when its last holder
//! releases it); slots are owned by exactly one sequence. The allocator only
//! counts; the executor holds the buffers these ids address.

use crate::executor::{CacheGeometry, PageId, SlotId};

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
    /// Free pages, popped from the end (LIFO keeps recently freed pages warm).
    free_pages: Vec<PageId>,
    slot_used: Vec<bool>,
    free_slots: Vec<SlotId>,
}

impl Allocator {
    pub fn new(geometry: &CacheGeometry) -> Self {
        assert!(geometry.page_size > 0, "page_size must be > 0");
        Allocator {
            page_size: geometry.page_size,
            page_refs: vec![0; geometry.num_pages],
            cache_refs: vec![0; geometry.num_pages],
            cache_only: 0,
            // Reversed so that the first pages handed out are 0, 1, 2, ...
            free_pages: (0..geometry.num_pages as u32).rev().map(PageId).collect(),
            slot_used: vec![false; geometry.num_slots],
            free_slots: (0..geometry.num_slots as u32).rev().map(SlotId).collect(),
        }
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    pub fn pages_total(&self) -> usize {
        self.page_refs.len()
    }

    pub fn pages_free(&self) -> usize {
        self.free_pages.len()
    }

    pub fn pages_used(&self) -> usize {
        self.pages_total() - self.pages_free()
    }

    pub fn slots_total(&self) -> usize {
        self.slot_used.len()
    }

    pub fn slots_free(&self) -> usize {
        self.free_slots.len()
    }

    pub fn slots_used(&self) -> usize {
        self.slots_total() - self.slots_free()
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
        if self.free_slots.is_empty() || self.pages_for(positions) > self.pages_free() {
            return None;
        }
        let slot = self.free_slots.pop()?;
        self.slot_used[slot.0 as usize] = true;
        let mut cache = SeqCache {
            slot,
            pages: Vec::new(),
        };
        let grown = self.grow(&mut cache, positions);
        debug_assert!(grown);
        Some(cache)
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
            let page = self.free_pages.pop().expect("counted above");
            debug_assert_eq!(self.page_refs[page.0 as usize], 0);
            self.page_refs[page.0 as usize] = 1;
            cache.pages.push(page);
        }
        true
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
            self.free_pages.push(page);
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
    /// a slot or the fresh pages are short.
    pub fn open_shared(&mut self, shared: &[PageId], positions: usize) -> Option<SeqCache> {
        let fresh = self.pages_for(positions).saturating_sub(shared.len());
        if self.free_slots.is_empty() || fresh > self.pages_free() {
            return None;
        }
        let slot = self.free_slots.pop()?;
        self.slot_used[slot.0 as usize] = true;
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
        let used = &mut self.slot_used[cache.slot.0 as usize];
        assert!(*used, "double release of slot {:?}", cache.slot);
        *used = false;
        self.free_slots.push(cache.slot);
    }
}

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
