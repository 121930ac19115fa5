//! An executor's side of an arena: which page and slot groups the engine
//! has mapped, the rules checked as the ops come (no group mapped twice or
//! unmapped while not mapped, never more chunks than the pool), and
//! whether a row or a cache op touches only mapped groups. Executors
//! (and the tests' fake) keep one and refuse what breaks it.

use std::collections::HashSet;

use super::geometry::{ArenaGeometry, MemoryOp, PageId, SlotId};

#[derive(Debug)]
pub struct ArenaMap {
    pub geometry: ArenaGeometry,
    pages: HashSet<u32>,
    slots: HashSet<u32>,
}

/// An op that breaks the arena's rules.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArenaMapError {
    #[error("{0:?}: the group is mapped already, or not mapped")]
    State(MemoryOp),
    #[error("{op:?}: {chunks} chunks mapped of {num_chunks}")]
    Overdrawn {
        op: MemoryOp,
        chunks: usize,
        num_chunks: usize,
    },
}

/// The ids a changed group covers, for the fake to forget what they held.
pub enum Changed {
    Pages(std::ops::Range<usize>),
    Slots(std::ops::Range<usize>),
}

impl ArenaMap {
    pub fn new(geometry: ArenaGeometry) -> Self {
        ArenaMap {
            geometry,
            pages: HashSet::new(),
            slots: HashSet::new(),
        }
    }

    /// Applies `op`, or says which rule it breaks.
    pub fn apply(&mut self, op: MemoryOp) -> Result<Changed, ArenaMapError> {
        let g = &self.geometry;
        let (ppg, spg) = (g.pages_per_group, g.slots_per_group);
        let (ok, changed) = match op {
            MemoryOp::MapPages(n) => (self.pages.insert(n), pages(n, ppg)),
            MemoryOp::UnmapPages(n) => (self.pages.remove(&n), pages(n, ppg)),
            MemoryOp::MapSlots(n) => (self.slots.insert(n), slots(n, spg)),
            MemoryOp::UnmapSlots(n) => (self.slots.remove(&n), slots(n, spg)),
        };
        if !ok {
            return Err(ArenaMapError::State(op));
        }
        let chunks =
            self.pages.len() * g.chunks_per_page_group + self.slots.len() * g.chunks_per_slot_group;
        if chunks > g.num_chunks {
            return Err(ArenaMapError::Overdrawn {
                op,
                chunks,
                num_chunks: g.num_chunks,
            });
        }
        Ok(changed)
    }

    /// Whether `slot` (if any) and every one of `pages` are mapped.
    pub fn covers(&self, slot: Option<SlotId>, pages: &[PageId]) -> bool {
        slot.is_none_or(|s| self.slot_mapped(s)) && pages.iter().all(|&p| self.page_mapped(p))
    }

    pub fn page_mapped(&self, page: PageId) -> bool {
        self.pages
            .contains(&(page.0 / self.geometry.pages_per_group as u32))
    }

    pub fn slot_mapped(&self, slot: SlotId) -> bool {
        self.slots
            .contains(&(slot.0 / self.geometry.slots_per_group as u32))
    }
}

fn pages(group: u32, per: usize) -> Changed {
    let g = group as usize;
    Changed::Pages(g * per..(g + 1) * per)
}

fn slots(group: u32, per: usize) -> Changed {
    let g = group as usize;
    Changed::Slots(g * per..(g + 1) * per)
}
