//! Checking a step's rows and planning its batch, all on the host: the
//! order of the rows (decode rows first, rows that want logits
//! contiguous), the batch layout with its page tables, and which logits
//! come back for which row.

use engine::{PageId, SlotId};
use gdn_kernels::{BatchLayout, DeviceBatch};

use crate::error::StepError;
use crate::row_logits::RowLogits;

/// One sequence's part of a step: `tokens` at positions `start..`, state in
/// `slot`, KV in `pages` (position order, covering at least
/// `start + tokens.len()` positions). `start == 0` starts from zero state
/// (the step zeroes the slot); otherwise the slot holds the state after
/// exactly `start` tokens of this sequence (the caller's bookkeeping).
#[derive(Clone, Copy, Debug)]
pub struct Row<'a> {
    pub slot: SlotId,
    pub start: usize,
    pub tokens: &'a [u32],
    pub pages: &'a [PageId],
    pub logits: RowLogits,
}

/// Which rows of the final hidden states get the lm_head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LogitsPlan {
    None,
    /// The last token of (ordered) sequences `lo..hi`.
    LastOf(usize, usize),
    /// Every token of the batch.
    AllTokens,
}

impl LogitsPlan {
    pub(crate) fn rows(self, num_tokens: usize) -> usize {
        match self {
            LogitsPlan::None => 0,
            LogitsPlan::LastOf(lo, hi) => hi - lo,
            LogitsPlan::AllTokens => num_tokens,
        }
    }
}

/// The batch of one step on the device: the whole batch, and for a step
/// with both decode and prefill rows, each part on its own (decode rows
/// first in the whole batch, `decode` of them).
pub(crate) struct Batches {
    pub full: DeviceBatch,
    pub parts: Option<(DeviceBatch, DeviceBatch)>,
}

/// A checked step: rows in batch order and what to bring back.
pub(crate) struct Plan {
    /// Caller's row index of each batch row.
    pub order: Vec<usize>,
    /// Leading batch rows with one token (the recurrent decode step).
    pub decode: usize,
    pub logits: LogitsPlan,
    pub layout: BatchLayout,
    /// Pages of the row with the most.
    pub max_pages: usize,
}

/// Rank of a row in the batch: decode rows first, and rows that want
/// logits in the middle so they are contiguous (decode without logits,
/// decode with, prefill with, prefill without).
fn rank(r: &Row) -> u8 {
    match (r.tokens.len() == 1, r.logits != RowLogits::None) {
        (true, false) => 0,
        (true, true) => 1,
        (false, true) => 2,
        (false, false) => 3,
    }
}

/// Lays out `rows` in `order` with page tables `width` wide.
pub(crate) fn layout_of(
    rows: &[Row],
    order: &[usize],
    width: usize,
    page_size: usize,
) -> BatchLayout {
    let mut layout = BatchLayout {
        cu_seqlens: vec![0],
        max_blocks: width,
        page_size,
        ..Default::default()
    };
    for &i in order {
        let r = &rows[i];
        let end = *layout.cu_seqlens.last().expect("starts with 0") + r.tokens.len() as i32;
        layout.cu_seqlens.push(end);
        layout.tokens.extend_from_slice(r.tokens);
        layout.start_positions.push(r.start as i32);
        layout.slots.push(r.slot.0 as i32);
        let used = (r.start + r.tokens.len()).div_ceil(page_size);
        layout.block_table.extend(
            r.pages[..used]
                .iter()
                .map(|p| p.0 as i32)
                .chain(std::iter::repeat(-1))
                .take(width),
        );
    }
    layout
}

/// What rows are checked against: the model's vocabulary and the cache.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    pub vocab: usize,
    pub num_slots: usize,
    pub num_pages: usize,
    pub page_size: usize,
    /// The decode graphs' padding slot and page (not for real rows).
    pub padding: Option<gdn_kernels::Padding>,
}

/// Checks `rows` (nothing on the device) and plans the batch; a row it
/// cannot run is a [`StepError::Refused`].
pub(crate) fn plan(rows: &[Row], b: Bounds) -> Result<Plan, StepError> {
    let refuse = |why: String| Err(StepError::Refused(why));
    if rows.is_empty() {
        return refuse("empty step".into());
    }
    let vocab = b.vocab;
    let padding = b.padding;
    // Bitmaps, not hash sets: a decode step of hundreds of long
    // sequences names tens of thousands of pages.
    let mut slots = vec![false; b.num_slots];
    let mut pages = vec![false; b.num_pages];
    let mut max_pages = 1;
    for (i, r) in rows.iter().enumerate() {
        let s = r.slot.0 as usize;
        if r.tokens.is_empty() {
            return refuse(format!("row {i} brings no tokens"));
        }
        if let Some(&bad) = r.tokens.iter().find(|&&t| t as usize >= vocab) {
            return refuse(format!("row {i}: token id {bad} >= vocab_size {vocab}"));
        }
        if s >= b.num_slots || padding.is_some_and(|p| p.slot == s as i32) {
            return refuse(format!("row {i}: slot {s} is not a slot of this cache"));
        }
        if std::mem::replace(&mut slots[s], true) {
            return refuse(format!("slot {s} appears twice in one step"));
        }
        let end = r.start + r.tokens.len();
        if end > i32::MAX as usize {
            return refuse(format!("row {i}: position {end} exceeds i32"));
        }
        let used = end.div_ceil(b.page_size);
        if r.pages.len() < used {
            return refuse(format!(
                "row {i} reaches position {} but has {} pages of {}",
                end - 1,
                r.pages.len(),
                b.page_size
            ));
        }
        for (k, p) in r.pages[..used].iter().enumerate() {
            let pi = p.0 as usize;
            if pi >= b.num_pages || padding.is_some_and(|x| x.page == pi as i32) {
                return refuse(format!("row {i}: page {pi} is not a page of this cache"));
            }
            // Pages wholly before `start` are only read (shared prefix-cache
            // pages may appear in several rows); a written page is the row's.
            let writes = k >= r.start / b.page_size;
            if writes && std::mem::replace(&mut pages[pi], true) {
                return refuse(format!("page {pi} is given twice in one step"));
            }
        }
        max_pages = max_pages.max(used);
    }
    for (i, r) in rows.iter().enumerate() {
        if let Some(p) = r.pages[..r.start / b.page_size]
            .iter()
            .find(|p| pages[p.0 as usize])
        {
            return refuse(format!(
                "row {i} reads page {} while the step writes it",
                p.0
            ));
        }
    }
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| rank(&rows[i]));
    let decode = order.iter().filter(|&&i| rows[i].tokens.len() == 1).count();
    let ranks: Vec<u8> = order.iter().map(|&i| rank(&rows[i])).collect();
    let logits = if rows
        .iter()
        .any(|r| r.logits == RowLogits::All && r.tokens.len() > 1)
    {
        LogitsPlan::AllTokens
    } else {
        let lo = ranks.iter().filter(|&&k| k == 0).count();
        let hi = lo + ranks.iter().filter(|&&k| k == 1 || k == 2).count();
        if hi > lo {
            LogitsPlan::LastOf(lo, hi)
        } else {
            LogitsPlan::None
        }
    };
    let layout = layout_of(rows, &order, max_pages, b.page_size);
    Ok(Plan {
        order,
        decode,
        logits,
        layout,
        max_pages,
    })
}

/// Which row of the step's host logits (rows as the plan laid them out)
/// each output row is, in the caller's row order: one per `Last` row, one
/// per token of an `All` row.
pub(crate) fn in_row_order(plan: &Plan, rows: &[Row]) -> Vec<usize> {
    let mut by_row: Vec<Vec<usize>> = vec![vec![]; rows.len()];
    let mut token_at = 0;
    for (b, &i) in plan.order.iter().enumerate() {
        let n = rows[i].tokens.len();
        match plan.logits {
            LogitsPlan::AllTokens => {
                by_row[i] = match rows[i].logits {
                    RowLogits::None => vec![],
                    RowLogits::Last => vec![token_at + n - 1],
                    RowLogits::All => (token_at..token_at + n).collect(),
                };
            }
            LogitsPlan::LastOf(lo, hi) if (lo..hi).contains(&b) => by_row[i] = vec![b - lo],
            _ => {}
        }
        token_at += n;
    }
    by_row.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row<'a>(slot: u32, tokens: &'a [u32], pages: &'a [PageId], logits: RowLogits) -> Row<'a> {
        Row {
            slot: SlotId(slot),
            start: 0,
            tokens,
            pages,
            logits,
        }
    }

    #[test]
    fn decode_rows_lead_and_logits_rows_are_contiguous() {
        let p = [PageId(0), PageId(1)];
        let rows = [
            row(0, &[1, 2], &p, RowLogits::None),
            row(1, &[3], &p, RowLogits::Last),
            row(2, &[4, 5], &p, RowLogits::Last),
            row(3, &[6], &p, RowLogits::None),
        ];
        let mut order: Vec<usize> = (0..4).collect();
        order.sort_by_key(|&i| rank(&rows[i]));
        assert_eq!(order, vec![3, 1, 2, 0]);
    }

    /// The reason of a refused plan.
    fn refusal(planned: Result<Plan, StepError>) -> String {
        match planned {
            Err(StepError::Refused(why)) => why,
            Err(e) => panic!("a refusal, got {e}"),
            Ok(_) => panic!("a refusal, got a plan"),
        }
    }

    fn bounds() -> Bounds {
        Bounds {
            vocab: 50,
            num_slots: 4,
            num_pages: 10,
            page_size: 4,
            padding: None,
        }
    }

    /// Logits rows whose every entry is `tag`, `vocab` 2.
    fn tagged(tags: &[f32]) -> Vec<f32> {
        tags.iter().flat_map(|&t| [t, t]).collect()
    }

    /// `host` (rows of vocab 2) in the caller's row order.
    fn logits_in_row_order(plan: &Plan, rows: &[Row], host: Vec<f32>) -> Vec<Vec<f32>> {
        in_row_order(plan, rows)
            .into_iter()
            .map(|r| host[2 * r..2 * r + 2].to_vec())
            .collect()
    }

    #[test]
    fn a_mixed_plan_orders_rows_and_returns_logits_in_row_order() {
        let (p0, p1, p2) = ([PageId(0), PageId(1)], [PageId(2)], [PageId(3), PageId(4)]);
        let rows = [
            Row {
                start: 2,
                ..row(0, &[1, 2, 3], &p0, RowLogits::Last)
            },
            Row {
                start: 3,
                ..row(1, &[4], &p1, RowLogits::Last)
            },
            row(2, &[5, 6], &p2, RowLogits::None),
            Row {
                start: 1,
                ..row(3, &[7], &p1, RowLogits::None)
            },
        ];
        // Row 3 reuses page 2 of row 1: refused.
        let err = refusal(plan(&rows, bounds()));
        assert!(err.contains("page 2 is given twice"), "{err}");
        let p3 = [PageId(9)];
        let rows = [
            rows[0],
            rows[1],
            rows[2],
            Row {
                pages: &p3,
                ..rows[3]
            },
        ];
        let pl = plan(&rows, bounds()).unwrap();
        // Decode rows first (without logits, with), then prefill (with, without).
        assert_eq!(pl.order, vec![3, 1, 0, 2]);
        assert_eq!(pl.decode, 2);
        assert_eq!(pl.logits, LogitsPlan::LastOf(1, 3));
        assert_eq!(pl.layout.slots, vec![3, 1, 0, 2]);
        assert_eq!(pl.layout.start_positions, vec![1, 3, 2, 0]);
        assert_eq!(pl.layout.cu_seqlens, vec![0, 1, 2, 5, 7]);
        assert_eq!(pl.layout.tokens, vec![7, 4, 1, 2, 3, 5, 6]);
        // Widest row: positions 2..5 on pages of 4, two pages.
        assert_eq!(pl.max_pages, 2);
        // Row 2 (two tokens from 0) uses only the first of its pages.
        assert_eq!(pl.layout.block_table, vec![9, -1, 2, -1, 0, 1, 3, -1]);
        // The eager buffer holds batch rows 1 (caller row 1) and 2 (row 0).
        let out = logits_in_row_order(&pl, &rows, tagged(&[11.0, 10.0]));
        assert_eq!(out, vec![vec![10.0, 10.0], vec![11.0, 11.0]]);
    }

    #[test]
    fn all_token_logits_come_back_per_row_and_token() {
        let (p0, p1) = ([PageId(0)], [PageId(1)]);
        let rows = [
            row(0, &[1, 2], &p0, RowLogits::All),
            row(1, &[3], &p1, RowLogits::Last),
        ];
        let pl = plan(&rows, bounds()).unwrap();
        assert_eq!(pl.order, vec![1, 0]);
        assert_eq!(pl.logits, LogitsPlan::AllTokens);
        // Batch tokens: row 1's token, then row 0's two.
        let out = logits_in_row_order(&pl, &rows, tagged(&[30.0, 1.0, 2.0]));
        assert_eq!(out, vec![vec![1.0, 1.0], vec![2.0, 2.0], vec![30.0, 30.0]]);
    }

    #[test]
    fn bad_rows_are_refused_with_the_reason() {
        let p = [PageId(0), PageId(1)];
        let err = |rows: &[Row], b: Bounds| refusal(plan(rows, b));
        assert!(err(&[], bounds()).contains("empty step"));
        assert!(err(&[row(0, &[], &p, RowLogits::Last)], bounds()).contains("no tokens"));
        assert!(err(&[row(0, &[50], &p, RowLogits::Last)], bounds()).contains("token id 50"));
        assert!(err(&[row(4, &[1], &p, RowLogits::Last)], bounds()).contains("slot 4 is not"));
        let q = [PageId(5)];
        let two = [
            row(1, &[1], &p, RowLogits::Last),
            row(1, &[1], &q, RowLogits::Last),
        ];
        assert!(err(&two, bounds()).contains("slot 1 appears twice"));
        let long = Row {
            start: 6,
            ..row(0, &[1, 2, 3], &p, RowLogits::Last)
        };
        assert!(err(&[long], bounds()).contains("has 2 pages of 4"));
        let far = [PageId(10)];
        assert!(err(&[row(0, &[1], &far, RowLogits::Last)], bounds()).contains("page 10 is not"));
        // The padding slot and page belong to the graphs.
        let padded = Bounds {
            padding: Some(gdn_kernels::Padding { slot: 3, page: 9 }),
            ..bounds()
        };
        assert!(err(&[row(3, &[1], &p, RowLogits::Last)], padded).contains("slot 3 is not"));
        let pad = [PageId(9)];
        assert!(err(&[row(0, &[1], &pad, RowLogits::Last)], padded).contains("page 9 is not"));
        // Pages beyond the ones in use are not looked at.
        let spare = [PageId(0), PageId(10)];
        assert!(plan(&[row(0, &[1], &spare, RowLogits::Last)], bounds()).is_ok());
    }

    #[test]
    fn the_layout_keeps_only_the_pages_in_use() {
        let p = [PageId(5), PageId(6), PageId(7)];
        let rows = [Row {
            slot: SlotId(2),
            start: 3,
            tokens: &[1, 2],
            pages: &p,
            logits: RowLogits::Last,
        }];
        // Positions 3..5 on pages of 4: the first two pages.
        let l = layout_of(&rows, &[0], 3, 4);
        assert_eq!(l.block_table, vec![5, 6, -1]);
        assert_eq!(l.cu_seqlens, vec![0, 2]);
        assert_eq!(l.start_positions, vec![3]);
        assert_eq!(l.slots, vec![2]);
    }
}
