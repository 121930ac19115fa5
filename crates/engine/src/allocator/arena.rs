//! The arena's book: which page and slot groups are mapped, how many of
//! their ids are held, and the chunks left. Pages and slots are handed out
//! lowest id first, so use packs into the low groups and the high ones
//! empty out; an empty group stays mapped (its ids count as free) until
//! the other kind needs its chunks, and is then unmapped, the highest
//! first. Every change is queued as a [`MemoryOp`] for the executor.

use crate::executor::{ArenaGeometry, MemoryOp};

#[derive(Clone, Copy, Default)]
struct Group {
    mapped: bool,
    /// Ids of the group in use.
    held: u32,
}

/// The two kinds an arena maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Pages,
    Slots,
}

#[derive(Debug)]
pub(super) struct ArenaBook {
    pub(super) geometry: ArenaGeometry,
    free_chunks: usize,
    page_groups: Vec<Group>,
    slot_groups: Vec<Group>,
    ops: Vec<MemoryOp>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", if self.mapped { "m" } else { "-" }, self.held)
    }
}

impl ArenaBook {
    /// A book with nothing mapped, for `num_slots` slot ids.
    pub(super) fn new(geometry: ArenaGeometry, num_slots: usize) -> Self {
        assert!(geometry.pages_per_group > 0 && geometry.slots_per_group > 0);
        assert!(geometry.chunks_per_page_group > 0 && geometry.chunks_per_slot_group > 0);
        ArenaBook {
            geometry,
            free_chunks: geometry.num_chunks,
            page_groups: vec![
                Group::default();
                geometry.num_chunks / geometry.chunks_per_page_group
            ],
            slot_groups: vec![Group::default(); num_slots.div_ceil(geometry.slots_per_group)],
            ops: Vec::new(),
        }
    }

    fn groups(&self, kind: Kind) -> &[Group] {
        match kind {
            Kind::Pages => &self.page_groups,
            Kind::Slots => &self.slot_groups,
        }
    }

    fn groups_mut(&mut self, kind: Kind) -> &mut Vec<Group> {
        match kind {
            Kind::Pages => &mut self.page_groups,
            Kind::Slots => &mut self.slot_groups,
        }
    }

    pub(super) fn per_group(&self, kind: Kind) -> usize {
        match kind {
            Kind::Pages => self.geometry.pages_per_group,
            Kind::Slots => self.geometry.slots_per_group,
        }
    }

    pub(super) fn chunks(&self, kind: Kind) -> usize {
        match kind {
            Kind::Pages => self.geometry.chunks_per_page_group,
            Kind::Slots => self.geometry.chunks_per_slot_group,
        }
    }

    fn other(kind: Kind) -> Kind {
        match kind {
            Kind::Pages => Kind::Slots,
            Kind::Slots => Kind::Pages,
        }
    }

    /// Chunks the other kind's empty mapped groups hold (reclaimable).
    fn reclaimable(&self, kind: Kind) -> usize {
        let other = Self::other(kind);
        let empty = self
            .groups(other)
            .iter()
            .filter(|g| g.mapped && g.held == 0)
            .count();
        empty * self.chunks(other)
    }

    /// Groups of `kind` that could still be mapped: by chunks (free and
    /// reclaimable from the other kind) and by ids.
    pub(super) fn mappable(&self, kind: Kind) -> usize {
        let unmapped = self.groups(kind).iter().filter(|g| !g.mapped).count();
        let chunks = self.free_chunks + self.reclaimable(kind);
        unmapped.min(chunks / self.chunks(kind))
    }

    /// Mappable groups of `kind` if one group of the other kind were mapped
    /// now, its chunks free first and then reclaimed from `kind`'s empty
    /// groups; `None` when that group cannot be mapped. Also returns how
    /// many of `kind`'s empty groups it would unmap.
    pub(super) fn mappable_after_other(&self, kind: Kind) -> Option<(usize, usize)> {
        let other = Self::other(kind);
        let need = self.chunks(other);
        let (per, empty) = (
            self.chunks(kind),
            self.groups(kind)
                .iter()
                .filter(|g| g.mapped && g.held == 0)
                .count(),
        );
        let short = need.saturating_sub(self.free_chunks);
        let unmapped_here = short.div_ceil(per);
        if unmapped_here > empty || !self.groups(other).iter().any(|g| !g.mapped) {
            return None;
        }
        let free = self.free_chunks + unmapped_here * per - need;
        let ids = self.groups(kind).iter().filter(|g| !g.mapped).count() + unmapped_here;
        Some((ids.min(free / per), unmapped_here))
    }

    /// Maps the lowest unmapped group of `kind`, unmapping the other
    /// kind's empty groups (highest first) for chunks. Returns the group,
    /// with the other kind's groups it unmapped; `None` (nothing changed)
    /// when the chunks are not there.
    pub(super) fn map(&mut self, kind: Kind) -> Option<(usize, Vec<usize>)> {
        let need = self.chunks(kind);
        if self.free_chunks + self.reclaimable(kind) < need {
            return None;
        }
        let g = self.groups(kind).iter().position(|g| !g.mapped)?;
        let other = Self::other(kind);
        let mut unmapped = Vec::new();
        while self.free_chunks < need {
            let victim = self
                .groups(other)
                .iter()
                .rposition(|g| g.mapped && g.held == 0)
                .expect("counted as reclaimable");
            self.groups_mut(other)[victim].mapped = false;
            self.free_chunks += self.chunks(other);
            self.ops.push(op(other, victim, false));
            unmapped.push(victim);
        }
        self.free_chunks -= need;
        self.groups_mut(kind)[g].mapped = true;
        self.ops.push(op(kind, g, true));
        Some((g, unmapped))
    }

    /// An id of group `group` of `kind` was taken (+1) or given back (-1).
    pub(super) fn hold(&mut self, kind: Kind, group: usize, delta: i32) {
        let g = &mut self.groups_mut(kind)[group];
        debug_assert!(g.mapped, "{kind:?} group {group} is not mapped");
        g.held = (g.held as i32 + delta) as u32;
    }

    pub(super) fn is_mapped(&self, kind: Kind, group: usize) -> bool {
        self.groups(kind)[group].mapped
    }

    pub(super) fn take_ops(&mut self) -> Vec<MemoryOp> {
        std::mem::take(&mut self.ops)
    }

    /// Chunks mapped for `kind`.
    pub(super) fn mapped_chunks(&self, kind: Kind) -> usize {
        self.groups(kind).iter().filter(|g| g.mapped).count() * self.chunks(kind)
    }
}

fn op(kind: Kind, group: usize, map: bool) -> MemoryOp {
    let g = group as u32;
    match (kind, map) {
        (Kind::Pages, true) => MemoryOp::MapPages(g),
        (Kind::Pages, false) => MemoryOp::UnmapPages(g),
        (Kind::Slots, true) => MemoryOp::MapSlots(g),
        (Kind::Slots, false) => MemoryOp::UnmapSlots(g),
    }
}
