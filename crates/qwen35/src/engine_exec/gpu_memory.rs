//! How the GPU executor divides device memory when its KV pages are sized
//! from `gpu_memory_utilization`: what is allowed, what the weights already
//! use, what the state slots and the activation reserve take, and what is
//! left for the KV pages and the prefix cache's snapshots. When nothing (or
//! too little for one sequence) is left, [`CacheMemory::no_room`] says which
//! term took the memory and what would fit, in numbers, instead of a bare
//! refusal: a large model on a smaller card meets it first (the 35B-A3B on
//! an 80 GB card, docs/results/2026-12-07-s14).

/// The terms of the division, in bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct CacheMemory {
    /// The device's memory.
    pub total: usize,
    /// In use before the cache (the weights, the context, the workspaces).
    pub used: usize,
    /// The utilization the bytes below were computed for.
    pub utilization: f64,
    /// `utilization` of `total`.
    pub allowed: usize,
    /// Engine slots; the cache holds one more (the decode graphs' spare).
    pub num_slots: usize,
    /// One state slot (= one snapshot).
    pub slot_bytes: usize,
    /// Kept free for the activations of the largest step.
    pub activation_reserve: usize,
}

impl CacheMemory {
    /// What the slots (with the spare), the reserve and the weights take.
    fn fixed(&self) -> usize {
        self.used + (self.num_slots + 1) * self.slot_bytes + self.activation_reserve
    }

    /// The bytes the KV pages and the snapshots share.
    pub fn room(&self) -> usize {
        self.allowed.saturating_sub(self.fixed())
    }

    /// Why `snapshots` snapshots leave no KV page for a sequence of
    /// `max_model_len` positions (pages of `page_bytes` holding `page_size`
    /// positions), with the slot count and the utilization that would fit
    /// and the snapshots' share when they are what took the room.
    pub fn no_room(
        &self,
        snapshots: usize,
        page_bytes: usize,
        page_size: usize,
        max_model_len: usize,
    ) -> String {
        let mib = |b: usize| b >> 20;
        // One sequence at max_model_len, plus the padding page.
        let one_sequence = (max_model_len.div_ceil(page_size.max(1)) + 1) * page_bytes;
        let snapshot_bytes = snapshots * self.slot_bytes;
        let need = self.fixed() + snapshot_bytes + one_sequence;
        let utilization = need as f64 / self.total.max(1) as f64;
        let slots_fit = self
            .allowed
            .saturating_sub(self.used + self.activation_reserve + snapshot_bytes + one_sequence)
            / self.slot_bytes.max(1);
        let mut advice = vec![format!(
            "at most {} slots fit with the rest as it is",
            slots_fit.saturating_sub(1)
        )];
        if utilization <= 1.0 {
            advice.push(format!(
                "a gpu_memory_utilization of {:.2} fits these slots",
                (utilization * 100.0).ceil() / 100.0
            ));
        }
        if snapshots > 0 {
            advice.push(format!(
                "or fewer prefix-cache snapshots ({snapshots} take {} MiB)",
                mib(snapshot_bytes)
            ));
        }
        format!(
            "no room for KV pages: {} MiB allowed ({} of {} MiB); the weights use {} MiB, \
             {} state slots (with the spare) of {} MiB take {} MiB, the activation reserve \
             {} MiB, snapshots {} MiB; one sequence of {max_model_len} positions needs {} MiB \
             of pages. {}",
            mib(self.allowed),
            self.utilization,
            mib(self.total),
            mib(self.used),
            self.num_slots + 1,
            mib(self.slot_bytes),
            mib((self.num_slots + 1) * self.slot_bytes),
            mib(self.activation_reserve),
            mib(snapshot_bytes),
            mib(one_sequence),
            advice.join("; ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    /// The 35B-A3B on an 80 GB card at the default utilization, as logged
    /// there (docs/results/2026-12-07-s14): weights 66,740 MiB, 128 slots
    /// of 61 MiB, 1,517 MiB of activations.
    fn h100_35b(utilization: f64) -> CacheMemory {
        let total = 81_079 * MIB;
        CacheMemory {
            total,
            used: 66_740 * MIB,
            utilization,
            allowed: (total as f64 * utilization) as usize,
            num_slots: 128,
            slot_bytes: 61 * MIB,
            activation_reserve: 1_517 * MIB,
        }
    }

    #[test]
    fn room_is_what_the_utilization_leaves_after_the_fixed_terms() {
        let m = h100_35b(0.97);
        // 78,646 allowed - 66,740 - 129 x 61 - 1,517 = 2,520 MiB (the
        // device logged 2,467 after rounding its own figures to MiB).
        assert_eq!(m.room() / MIB, 78_646 - 66_740 - 129 * 61 - 1_517);
        assert_eq!(
            h100_35b(0.9).room(),
            0,
            "no room at 0.9: {:?}",
            h100_35b(0.9)
        );
    }

    #[test]
    fn no_room_names_the_terms_and_what_would_fit() {
        let m = h100_35b(0.9);
        let text = m.no_room(256, MIB, 64, 9216);
        // The slots that fit: (72,971 - 66,740 - 1,517 - 256 x 61 - 145)
        // is negative with the snapshots, so none; the utilization that
        // fits 128 slots, the snapshots and one 9,216-position sequence
        // (145 pages of 1 MiB): (66,740 + 7,869 + 1,517 + 15,616 + 145) /
        // 81,079 = 1.13, above 1, so not offered.
        assert!(
            text.starts_with("no room for KV pages: 72971 MiB allowed (0.9 of 81079 MiB)"),
            "{text}"
        );
        assert!(
            text.contains("129 state slots (with the spare) of 61 MiB take 7869 MiB"),
            "{text}"
        );
        assert!(
            text.contains("one sequence of 9216 positions needs 145 MiB"),
            "{text}"
        );
        assert!(text.contains("at most 0 slots fit"), "{text}");
        assert!(!text.contains("gpu_memory_utilization of"), "{text}");
        assert!(
            text.contains("fewer prefix-cache snapshots (256 take 15616 MiB)"),
            "{text}"
        );

        // Without snapshots: (72,971 - 66,740 - 1,517 - 145) / 61 = 74
        // slots, less the spare; (76,126 + 145) / 81,079 = 0.9407 of the
        // card fits all 128, rounded up to 0.95.
        let text = m.no_room(0, MIB, 64, 9216);
        assert!(text.contains("at most 73 slots fit"), "{text}");
        assert!(
            text.contains("a gpu_memory_utilization of 0.95 fits these slots"),
            "{text}"
        );
        assert!(!text.contains("snapshots ("), "{text}");
    }
}
