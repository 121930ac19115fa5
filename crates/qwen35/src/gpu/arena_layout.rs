//! The arithmetic of a cache's arena (see [`crate::gpu::arena`]): how the
//! recurrent-state buffers and the KV buffers divide into groups of whole
//! physical chunks, which ids the engine gets, what stays mapped for good,
//! and how many chunks a budget of bytes holds. No device here: the unit
//! tests check it on the real models' shapes.
//!
//! A buffer whose ids (slots or pages) take `b` bytes each maps in groups
//! of `lcm(b, chunk)` bytes: the smallest run of whole ids that is also a
//! run of whole chunks, so that a group maps and unmaps without touching
//! its neighbours. Every buffer of a kind has the same `b` (all DeltaNet
//! layers one slot's recurrent state, all attention layers one page's keys
//! or values), so a group is the same ids in every buffer of its kind.

use engine::ArenaGeometry;

/// How the buffers of one kind (slots or pages) divide into groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GroupShape {
    /// Ids per group.
    pub ids: usize,
    /// Chunks a group takes in one buffer.
    pub chunks_per_buffer: usize,
    /// Buffers of the kind (a group maps in each).
    pub buffers: usize,
}

impl GroupShape {
    /// Groups of ids of `id_bytes` in `buffers` buffers mapped by chunks of
    /// `chunk` bytes (`None` where either size is 0).
    pub fn new(id_bytes: usize, buffers: usize, chunk: usize) -> Option<GroupShape> {
        if id_bytes == 0 || chunk == 0 {
            return None;
        }
        let lcm = id_bytes / gcd(id_bytes, chunk) * chunk;
        Some(GroupShape {
            ids: lcm / id_bytes,
            chunks_per_buffer: lcm / chunk,
            buffers,
        })
    }

    /// Chunks a mapped group holds in all.
    pub fn chunks(&self) -> usize {
        self.chunks_per_buffer * self.buffers
    }
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The sizes an arena is made of, from the model and the chunk size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ArenaShape {
    /// The device's mapping granularity.
    pub chunk_bytes: usize,
    /// One slot's recurrent state in one DeltaNet layer.
    pub slot_bytes_per_layer: usize,
    pub deltanet_layers: usize,
    /// One page's keys (or values) in one attention layer.
    pub page_bytes_per_buffer: usize,
    pub attention_layers: usize,
    /// One slot's conv state in every DeltaNet layer: ordinary memory for
    /// every slot id (small next to the recurrent state).
    pub conv_bytes_per_slot: usize,
}

impl ArenaShape {
    pub fn slots(&self) -> Option<GroupShape> {
        GroupShape::new(
            self.slot_bytes_per_layer,
            self.deltanet_layers,
            self.chunk_bytes,
        )
    }

    /// Keys and values of every attention layer: two buffers a layer.
    pub fn pages(&self) -> Option<GroupShape> {
        GroupShape::new(
            self.page_bytes_per_buffer,
            2 * self.attention_layers,
            self.chunk_bytes,
        )
    }

    /// Bytes outside the pool for `num_slots` engine slots (whole groups)
    /// and `snapshots` snapshots: the conv state of every slot id (the
    /// spare one too) and the chunks of the groups mapped for good.
    pub fn fixed_bytes(&self, num_slots: usize, snapshots: usize) -> Option<usize> {
        let (slots, pages) = (self.slots()?, self.pages()?);
        let chunks = fixed_slot_groups(slots, snapshots) * slots.chunks() + pages.chunks();
        Some(self.conv_bytes_per_slot * (num_slots + 1 + snapshots) + chunks * self.chunk_bytes)
    }
}

/// Slot groups mapped for good: the decode graphs' spare slot, then the
/// snapshots, after the engine's slots.
fn fixed_slot_groups(slots: GroupShape, snapshots: usize) -> usize {
    (1 + snapshots).div_ceil(slots.ids)
}

/// Why no arena can be laid out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ArenaSizeError {
    #[error("an arena needs state and KV bytes, DeltaNet and attention layers, a chunk size and a slot: {shape:?}, {slots} slots")]
    Shape { shape: ArenaShape, slots: usize },
    #[error("a pool of {chunks} chunks of {chunk_mib} MiB holds no sequence: one slot group takes {slot_chunks} chunks, one page group {page_chunks}")]
    NoSequence {
        chunks: usize,
        chunk_mib: usize,
        slot_chunks: usize,
        page_chunks: usize,
    },
}

/// One cache's arena: the engine's slot and page ids, mapped on demand from
/// `num_chunks` chunks, and after them the ids mapped for good (the spare
/// slot and page the decode graphs pad with, the snapshot slots).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ArenaLayout {
    pub shape: ArenaShape,
    pub slots: GroupShape,
    pub pages: GroupShape,
    /// The engine's slots: the request rounded up to whole groups.
    pub num_slots: usize,
    pub snapshots: usize,
    /// Chunks of the pool the engine maps from (the fixed groups' chunks
    /// are not among them).
    pub num_chunks: usize,
}

impl ArenaLayout {
    /// A pool of `num_chunks` chunks for at least `requested_slots` slots
    /// and `snapshots` snapshots; an error where the pool holds not even
    /// one slot group and one page group (no sequence could run).
    pub fn new(
        shape: ArenaShape,
        requested_slots: usize,
        snapshots: usize,
        num_chunks: usize,
    ) -> Result<ArenaLayout, ArenaSizeError> {
        let bad_shape = ArenaSizeError::Shape {
            shape,
            slots: requested_slots,
        };
        let (Some(slots), Some(pages)) = (shape.slots(), shape.pages()) else {
            return Err(bad_shape);
        };
        if slots.buffers == 0 || pages.buffers == 0 || requested_slots == 0 {
            return Err(bad_shape);
        }
        if num_chunks < slots.chunks() + pages.chunks() {
            return Err(ArenaSizeError::NoSequence {
                chunks: num_chunks,
                chunk_mib: shape.chunk_bytes >> 20,
                slot_chunks: slots.chunks(),
                page_chunks: pages.chunks(),
            });
        }
        Ok(ArenaLayout {
            shape,
            slots,
            pages,
            num_slots: requested_slots.div_ceil(slots.ids) * slots.ids,
            snapshots,
            num_chunks,
        })
    }

    /// The pool `room` bytes hold (what the fixed parts leave, in whole
    /// chunks; `room` being the allowed memory less what is in use and
    /// the activation reserve).
    pub fn in_room(
        shape: ArenaShape,
        room: usize,
        requested_slots: usize,
        snapshots: usize,
    ) -> Result<ArenaLayout, ArenaSizeError> {
        let slots = shape.slots().map_or(1, |s| s.ids);
        let num_slots = requested_slots.div_ceil(slots) * slots;
        let fixed = shape.fixed_bytes(num_slots, snapshots).unwrap_or(0);
        let chunks = room.saturating_sub(fixed) / shape.chunk_bytes.max(1);
        Self::new(shape, requested_slots, snapshots, chunks)
    }

    /// Engine slot groups (mapped on demand).
    pub fn slot_groups(&self) -> usize {
        self.num_slots / self.slots.ids
    }

    /// Slot groups mapped for good, after the engine's.
    pub fn fixed_slot_groups(&self) -> usize {
        fixed_slot_groups(self.slots, self.snapshots)
    }

    /// Engine page groups: as many as the pool holds with no slot mapped.
    pub fn page_groups(&self) -> usize {
        self.num_chunks / self.pages.chunks()
    }

    /// Engine pages (the padding page follows them).
    pub fn num_pages(&self) -> usize {
        self.page_groups() * self.pages.ids
    }

    /// Slot ids of the cache: the engine's, the spare, the snapshots.
    pub fn cache_slots(&self) -> usize {
        self.num_slots + 1 + self.snapshots
    }

    /// Page ids of the cache: the engine's and the padding page.
    pub fn cache_pages(&self) -> usize {
        self.num_pages() + 1
    }

    /// Chunks mapped for good (one page group for the padding page).
    pub fn fixed_chunks(&self) -> usize {
        self.fixed_slot_groups() * self.slots.chunks() + self.pages.chunks()
    }

    pub fn geometry(&self) -> ArenaGeometry {
        ArenaGeometry {
            num_chunks: self.num_chunks,
            chunk_bytes: self.shape.chunk_bytes,
            pages_per_group: self.pages.ids,
            chunks_per_page_group: self.pages.chunks(),
            slots_per_group: self.slots.ids,
            chunks_per_slot_group: self.slots.chunks(),
        }
    }

    /// The longest sequence one request can reach: its pages and one slot
    /// group in the pool.
    pub fn max_model_len(&self, page_size: usize) -> usize {
        let groups = (self.num_chunks - self.slots.chunks()) / self.pages.chunks();
        groups * self.pages.ids * page_size
    }

    /// Chunks one request of `len` positions holds: its page groups and a
    /// slot group (as if it had them to itself).
    pub fn chunks_per_request(&self, len: usize, page_size: usize) -> usize {
        let pages = len.div_ceil(page_size.max(1));
        pages.div_ceil(self.pages.ids) * self.pages.chunks() + self.slots.chunks()
    }

    /// Requests of `len` positions the pool holds at once, each counted
    /// with page groups and a slot group of its own (a lower bound: groups
    /// are shared by the requests whose ids they hold).
    pub fn requests_that_fit(&self, len: usize, page_size: usize) -> usize {
        self.num_chunks / self.chunks_per_request(len, page_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;
    const KIB: usize = 1 << 10;

    /// Qwen3.5-35B-A3B: 30 DeltaNet layers of 32 value heads, 10 attention
    /// layers of 2 kv heads of 256, pages of 64 positions, chunks of 2 MiB.
    fn a3b(state_bytes: usize) -> ArenaShape {
        ArenaShape {
            chunk_bytes: 2 * MIB,
            slot_bytes_per_layer: 32 * 128 * 128 * state_bytes,
            deltanet_layers: 30,
            page_bytes_per_buffer: 64 * 2 * 256 * 2,
            attention_layers: 10,
            // conv_dim 2 x 16 x 128 + 32 x 128 = 8192, kernel 4: 3 rows.
            conv_bytes_per_slot: 30 * 3 * 8192 * 2,
        }
    }

    #[test]
    fn groups_are_the_lcm_of_an_id_and_a_chunk() {
        // 35B-A3B, f32 state: a slot of a layer is one chunk.
        let s = a3b(4);
        assert_eq!(s.slot_bytes_per_layer, 2 * MIB);
        let slots = s.slots().unwrap();
        assert_eq!(
            (slots.ids, slots.chunks_per_buffer, slots.chunks()),
            (1, 1, 30)
        );
        // 64 KiB of keys a page and layer: 32 pages a chunk, 20 buffers.
        assert_eq!(s.page_bytes_per_buffer, 64 * KIB);
        let pages = s.pages().unwrap();
        assert_eq!(
            (pages.ids, pages.chunks_per_buffer, pages.chunks()),
            (32, 1, 20)
        );
        // A bf16 state halves a slot: two slots a group, the same chunks.
        let slots = a3b(2).slots().unwrap();
        assert_eq!((slots.ids, slots.chunks()), (2, 30));

        // Qwen3.5-4B: 24 DeltaNet layers of 32 value heads, 8 attention
        // layers of 4 kv heads of 256; pages of 64 and of 16 positions.
        let slots = GroupShape::new(32 * 128 * 128 * 4, 24, 2 * MIB).unwrap();
        assert_eq!((slots.ids, slots.chunks()), (1, 24));
        let pages = GroupShape::new(64 * 4 * 256 * 2, 16, 2 * MIB).unwrap();
        assert_eq!((pages.ids, pages.chunks()), (16, 16));
        let pages = GroupShape::new(16 * 4 * 256 * 2, 16, 2 * MIB).unwrap();
        assert_eq!((pages.ids, pages.chunks()), (64, 16));

        // The tiny fixtures (4 value heads, 2 kv heads of 32, pages of 16):
        // many ids a group.
        let slots = GroupShape::new(4 * 128 * 128 * 4, 6, 2 * MIB).unwrap();
        assert_eq!((slots.ids, slots.chunks()), (8, 6));
        let pages = GroupShape::new(16 * 2 * 32 * 2, 4, 2 * MIB).unwrap();
        assert_eq!((pages.ids, pages.chunks()), (1024, 4));

        // An id that neither divides nor is a multiple of the chunk: 3 MiB
        // ids make groups of 6 MiB, two ids in three chunks.
        let odd = GroupShape::new(3 * MIB, 1, 2 * MIB).unwrap();
        assert_eq!((odd.ids, odd.chunks_per_buffer), (2, 3));
        assert_eq!(GroupShape::new(0, 1, 2 * MIB), None);
    }

    #[test]
    fn the_layout_puts_the_fixed_groups_after_the_engines_ids() {
        // Tiny fixtures: 8 slots a group, so 10 requested slots are 16;
        // the spare and 8 snapshots are 9 slots, two fixed groups.
        let shape = ArenaShape {
            chunk_bytes: 2 * MIB,
            slot_bytes_per_layer: 256 * KIB,
            deltanet_layers: 6,
            page_bytes_per_buffer: 2 * KIB,
            attention_layers: 2,
            conv_bytes_per_slot: 6 * 3 * 1536 * 2,
        };
        let l = ArenaLayout::new(shape, 10, 8, 23).unwrap();
        assert_eq!(
            (l.num_slots, l.slot_groups(), l.fixed_slot_groups()),
            (16, 2, 2)
        );
        assert_eq!(l.cache_slots(), 16 + 1 + 8);
        // 23 chunks: five page groups of 4 chunks when no slot is mapped.
        assert_eq!(
            (l.page_groups(), l.num_pages(), l.cache_pages()),
            (5, 5120, 5121)
        );
        assert_eq!(l.fixed_chunks(), 2 * 6 + 4);
        let g = l.geometry();
        assert_eq!(g.max_pages(), l.num_pages());
        assert_eq!(
            (
                g.pages_per_group,
                g.chunks_per_page_group,
                g.slots_per_group,
                g.chunks_per_slot_group
            ),
            (1024, 4, 8, 6)
        );
        // One sequence: its slot group (6) leaves 17 chunks, 4 page groups.
        assert_eq!(l.max_model_len(16), 4 * 1024 * 16);
        // A request of 100 positions: 7 pages in one group and a slot group.
        assert_eq!(l.chunks_per_request(100, 16), 4 + 6);
        assert_eq!(l.requests_that_fit(100, 16), 2);
        // Fewer chunks than one slot group and one page group: refused.
        let e = ArenaLayout::new(shape, 10, 8, 9).unwrap_err();
        assert!(e.to_string().contains("holds no sequence"), "{e}");
        assert!(ArenaLayout::new(shape, 0, 0, 100).is_err());
    }

    #[test]
    fn the_35b_on_an_80_gb_card_serves_where_reserved_slots_left_no_pages() {
        // As in gpu_memory's tests: 0.9 of 81,079 MiB allowed, 66,740 in
        // use, 1,517 for activations. Reserving 129 slots of 61 MiB left no
        // room; the arena keeps only the conv state of every slot id and
        // the fixed groups out of the pool.
        let allowed = (81_079.0 * MIB as f64 * 0.9) as usize;
        let room = allowed - 66_740 * MIB - 1_517 * MIB;
        let shape = a3b(4);
        let l = ArenaLayout::in_room(shape, room, 128, 0).unwrap();
        let conv = 129 * shape.conv_bytes_per_slot;
        let fixed = conv + (30 + 20) * 2 * MIB;
        assert_eq!(l.num_chunks, (room - fixed) / (2 * MIB));
        assert_eq!(l.num_chunks, 2_216);
        // 9,216 positions: 144 pages, five groups (100 chunks) and a slot
        // (30 chunks): 17 such requests at once.
        assert_eq!(l.chunks_per_request(9216, 64), 130);
        assert_eq!(l.requests_that_fit(9216, 64), 17);
        // One request alone reaches (2,216 - 30) / 20 = 109 page groups.
        assert_eq!(l.max_model_len(64), 109 * 32 * 64);
        assert_eq!(l.num_pages(), 2_216 / 20 * 32);
        // With snapshots, their slots come out of the room first.
        let with = ArenaLayout::in_room(shape, room, 128, 16).unwrap();
        assert_eq!(with.fixed_slot_groups(), 17);
        let fixed = 145 * shape.conv_bytes_per_slot + (17 * 30 + 20) * 2 * MIB;
        assert_eq!(with.num_chunks, (room - fixed) / (2 * MIB));
        assert_eq!(with.num_chunks, 1_725);
    }
}
