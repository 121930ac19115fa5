//! The checks both executors make on a step's rows before touching any
//! state.

use engine::{CacheGeometry, ExecError, StepRow};

/// The checks both executors make before touching any state: ids within
/// the geometry, each slot at most once, tokens within the vocab, enough
/// pages for every position, nothing beyond `max_model_len`, and each page
/// a row writes (from the one holding its `start`) in no other row and
/// only once. Pages wholly before a row's `start` are only read: several
/// rows may share them (prefix-cache pages).
pub(crate) fn check_rows(rows: &[StepRow], g: &CacheGeometry) -> Result<(), ExecError> {
    let refuse = |m: String| Err(ExecError::Refused(m));
    if rows.is_empty() {
        return refuse("empty step".into());
    }
    // Bitmaps, not hash sets: a decode step of hundreds of long sequences
    // names tens of thousands of pages.
    let mut slots = vec![false; g.num_slots];
    let mut written = vec![false; g.num_pages];
    for (i, r) in rows.iter().enumerate() {
        if r.slot.0 as usize >= g.num_slots {
            return refuse(format!(
                "row {i}: slot {} beyond the {} slots",
                r.slot.0, g.num_slots
            ));
        }
        if std::mem::replace(&mut slots[r.slot.0 as usize], true) {
            return refuse(format!("slot {} appears twice in one step", r.slot.0));
        }
        if r.tokens.is_empty() {
            return refuse(format!("row {i} brings no tokens"));
        }
        if let Some(&t) = r.tokens.iter().find(|&&t| t as usize >= g.vocab_size) {
            return refuse(format!(
                "row {i}: token id {t} >= vocab size {}",
                g.vocab_size
            ));
        }
        let end = r.start.saturating_add(r.tokens.len());
        if end > g.max_model_len {
            return refuse(format!(
                "row {i} reaches {end} positions, beyond max_model_len {}",
                g.max_model_len
            ));
        }
        let used = end.div_ceil(g.page_size);
        if r.pages.len() < used {
            return refuse(format!(
                "row {i} needs {used} pages of {} for {end} positions, has {}",
                g.page_size,
                r.pages.len()
            ));
        }
        for (k, p) in r.pages[..used].iter().enumerate() {
            if p.0 as usize >= g.num_pages {
                return refuse(format!(
                    "row {i}: page {} beyond the {} pages",
                    p.0, g.num_pages
                ));
            }
            let writes = k >= r.start / g.page_size;
            if writes && std::mem::replace(&mut written[p.0 as usize], true) {
                return refuse(format!("page {} is given twice in one step", p.0));
            }
        }
    }
    for (i, r) in rows.iter().enumerate() {
        if let Some(p) = r.pages[..r.start / g.page_size]
            .iter()
            .find(|p| written[p.0 as usize])
        {
            return refuse(format!(
                "row {i} reads page {} while the step writes it",
                p.0
            ));
        }
    }
    Ok(())
}

/// A row continues its slot's sequence: `start` is 0 (a fresh sequence) or
/// the number of tokens the slot holds (`held`: `None` when the slot holds
/// no sequence's state, e.g. never used or lost in a failed step).
pub(crate) fn check_starts(
    rows: &[StepRow],
    held: impl Fn(usize) -> Option<usize>,
) -> Result<(), ExecError> {
    for (i, r) in rows.iter().enumerate() {
        let have = held(r.slot.0 as usize);
        if r.start != 0 && have != Some(r.start) {
            return Err(ExecError::Refused(format!(
                "row {i}: slot {} holds {} tokens, the row starts at {}",
                r.slot.0,
                have.map_or("no sequence's".into(), |n| n.to_string()),
                r.start
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::{PageId, SlotId};

    fn geometry() -> CacheGeometry {
        CacheGeometry {
            num_slots: 2,
            num_pages: 4,
            page_size: 4,
            vocab_size: 10,
            max_model_len: 12,
        }
    }

    fn refused(rows: &[StepRow]) -> String {
        match check_rows(rows, &geometry()) {
            Err(ExecError::Refused(m)) => m,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn rows_outside_the_geometry_are_refused_with_the_reason() {
        let p = [PageId(0), PageId(1), PageId(2)];
        let q = [PageId(1)];
        let row = |slot: u32, start: usize, tokens: &'static [u32], pages| StepRow {
            snapshots: &[],
            slot: SlotId(slot),
            start,
            tokens,
            pages,
            sample: None,
        };
        assert!(check_rows(&[row(0, 0, &[1, 2, 3, 4, 5], &p)], &geometry()).is_ok());
        assert!(refused(&[]).contains("empty step"));
        assert!(refused(&[row(2, 0, &[1], &p)]).contains("slot 2 beyond the 2 slots"));
        assert!(refused(&[row(0, 0, &[1], &p), row(0, 4, &[1], &q)]).contains("twice"));
        assert!(refused(&[row(0, 0, &[], &p)]).contains("no tokens"));
        assert!(refused(&[row(0, 0, &[10], &p)]).contains("token id 10"));
        assert!(refused(&[row(0, 10, &[1, 2, 3], &p)]).contains("max_model_len 12"));
        assert!(refused(&[row(0, 8, &[1], &p[..2])]).contains("needs 3 pages"));
        assert!(
            refused(&[row(0, 0, &[1], &p), row(1, 0, &[1], &p)]).contains("page 0 is given twice")
        );
        let bad = [PageId(4)];
        assert!(refused(&[row(0, 0, &[1], &bad)]).contains("page 4 beyond"));
        // A page wholly before both rows' starts is shared read-only...
        let a = [PageId(0), PageId(1)];
        let b = [PageId(0), PageId(2)];
        assert!(check_rows(&[row(0, 4, &[1], &a), row(1, 4, &[1], &b)], &geometry()).is_ok());
        // ...but not one that a row writes (its start lies inside it)...
        let c = [PageId(1), PageId(3)];
        assert!(refused(&[row(0, 4, &[1], &a), row(1, 4, &[1], &c)])
            .contains("reads page 1 while the step writes it"));
        // ...nor one two rows write.
        assert!(
            refused(&[row(0, 5, &[1], &a), row(1, 2, &[1], &c)]).contains("page 1 is given twice")
        );
    }
}
