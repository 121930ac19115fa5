//! The in-step snapshot for executors: checking a step's
//! [`StepRow::snapshots`] and cutting its rows into passes.
//!
//! A row with k points runs in k + 1 pieces. Pass j is one forward over
//! piece j of every row that has one: the first pass holds every row (rows
//! without points whole), the later passes only the rows with points left,
//! each continuing its own slot where the previous pass left it. After pass
//! j the executor copies the state of each row whose point j it reached
//! into that point's snapshot. A row samples in the pass of its last piece,
//! so it samples once, after its last token. The pieces of one row run in
//! order in separate forwards, so a later piece reads the KV an earlier one
//! wrote, as a next step's chunk would.

use thiserror::Error;

use super::error::ExecError;
use super::geometry::SlotId;
use super::rows::{RowSnapshot, StepRow};

/// One forward of a step whose rows carry snapshots.
#[derive(Debug)]
pub struct Pass<'a> {
    /// The pieces of this pass (no snapshots of their own; `sample` only
    /// on a row's last piece), in the step's row order.
    pub rows: Vec<StepRow<'a>>,
    /// The step's row index of each piece.
    pub of: Vec<usize>,
    /// The snapshots to take once this pass has run: the slot's state is
    /// then the one after `at` tokens.
    pub snapshots_after: Vec<(SlotId, RowSnapshot)>,
}

/// Why a step's [`StepRow::snapshots`] are refused ([`check_row_snapshots`]).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum RowSnapshotError {
    /// Row `row` carries more snapshots than the executor takes in a row.
    #[error("row {row} carries {count} snapshots, at most {max} taken")]
    TooMany {
        row: usize,
        count: usize,
        max: usize,
    },
    /// Row `row` has a snapshot at `at`, not after its previous one or not
    /// strictly inside its positions `start..end`.
    #[error("row {row}: snapshot at {at} not ascending strictly inside {start}..{end}")]
    NotInside {
        row: usize,
        at: usize,
        start: usize,
        end: usize,
    },
    /// Row `row` names a snapshot id beyond the executor's pool of `pool`.
    #[error("row {row}: snapshot {snapshot} beyond the pool of {pool}")]
    BeyondPool {
        row: usize,
        snapshot: usize,
        pool: usize,
    },
    /// One snapshot id named twice in the step.
    #[error("snapshot {snapshot} named twice in one step")]
    NamedTwice { snapshot: usize },
}

/// A refused snapshot list refuses the step (states untouched).
impl From<RowSnapshotError> for ExecError {
    fn from(error: RowSnapshotError) -> Self {
        ExecError::Refused(error.to_string())
    }
}

/// The message alone, for an executor that wraps it itself (as in
/// `.map_err(ExecError::Refused)`).
impl From<RowSnapshotError> for String {
    fn from(error: RowSnapshotError) -> Self {
        error.to_string()
    }
}

/// Checks the rows' snapshots: at most `max_per_row` per row, ascending
/// and strictly inside the row, each snapshot below `num_snapshots` and
/// named once in the step. `Err`: why (the step must be refused), as any
/// error type a [`RowSnapshotError`] converts into (an [`ExecError`], so
/// that an executor can `?` it; or its message).
pub fn check_row_snapshots<E: From<RowSnapshotError>>(
    rows: &[StepRow<'_>],
    max_per_row: usize,
    num_snapshots: usize,
) -> Result<(), E> {
    let mut named = vec![false; num_snapshots];
    for (i, row) in rows.iter().enumerate() {
        if row.snapshots.len() > max_per_row {
            return Err(RowSnapshotError::TooMany {
                row: i,
                count: row.snapshots.len(),
                max: max_per_row,
            }
            .into());
        }
        let end = row.start + row.tokens.len();
        let mut after = row.start;
        for s in row.snapshots {
            if s.at <= after || s.at >= end {
                return Err(RowSnapshotError::NotInside {
                    row: i,
                    at: s.at,
                    start: row.start,
                    end,
                }
                .into());
            }
            after = s.at;
            let k = s.snapshot.0 as usize;
            if k >= num_snapshots {
                return Err(RowSnapshotError::BeyondPool {
                    row: i,
                    snapshot: k,
                    pool: num_snapshots,
                }
                .into());
            }
            if std::mem::replace(&mut named[k], true) {
                return Err(RowSnapshotError::NamedTwice { snapshot: k }.into());
            }
        }
    }
    Ok(())
}

/// The passes of a step (one when no row carries a snapshot; see the
/// module doc). The rows must have passed [`check_row_snapshots`].
pub fn split_rows<'a>(rows: &[StepRow<'a>]) -> Vec<Pass<'a>> {
    let passes = 1 + rows.iter().map(|r| r.snapshots.len()).max().unwrap_or(0);
    (0..passes)
        .map(|j| {
            let mut pass = Pass {
                rows: Vec::new(),
                of: Vec::new(),
                snapshots_after: Vec::new(),
            };
            for (i, row) in rows.iter().enumerate() {
                let points = row.snapshots;
                if j > points.len() {
                    continue;
                }
                let end = row.start + row.tokens.len();
                let from = if j == 0 { row.start } else { points[j - 1].at };
                let to = points.get(j).map_or(end, |s| s.at);
                pass.rows.push(StepRow {
                    slot: row.slot,
                    start: from,
                    tokens: &row.tokens[from - row.start..to - row.start],
                    pages: row.pages,
                    sample: if to == end { row.sample } else { None },
                    snapshots: &[],
                });
                pass.of.push(i);
                if let Some(&s) = points.get(j) {
                    pass.snapshots_after.push((row.slot, s));
                }
            }
            pass
        })
        .collect()
}

/// The sampled results of every pass (`per_pass[j]`: one per sampling
/// piece of pass j, in its order) in the step's row order.
pub fn in_row_order<T>(passes: &[Pass<'_>], per_pass: Vec<Vec<T>>) -> Vec<T> {
    let mut tagged: Vec<(usize, T)> = Vec::new();
    for (pass, sampled) in passes.iter().zip(per_pass) {
        let sampling = pass
            .rows
            .iter()
            .zip(&pass.of)
            .filter(|(r, _)| r.sample.is_some())
            .map(|(_, &i)| i);
        tagged.extend(sampling.zip(sampled));
    }
    tagged.sort_by_key(|&(i, _)| i);
    tagged.into_iter().map(|(_, t)| t).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::geometry::{PageId, SnapshotId};
    use crate::executor::rows::{SampleSeed, SampleSpec};
    use crate::request::SamplingParams;

    fn check(rows: &[StepRow<'_>], max: usize, pool: usize) -> Result<(), RowSnapshotError> {
        check_row_snapshots(rows, max, pool)
    }

    #[test]
    fn rows_are_cut_at_their_points_and_sample_once_in_row_order() {
        let params = SamplingParams::default();
        let spec = SampleSpec {
            params: &params,
            history: &[],
            prompt_len: 1,
            seed: SampleSeed { seed: 0, draw: 0 },
            banned: &[],
            allowed: None,
        };
        let tokens: Vec<u32> = (0..10).collect();
        let pages = [PageId(0), PageId(1), PageId(2)];
        let two = [
            RowSnapshot {
                at: 4,
                snapshot: SnapshotId(1),
            },
            RowSnapshot {
                at: 7,
                snapshot: SnapshotId(0),
            },
        ];
        let one = [RowSnapshot {
            at: 12,
            snapshot: SnapshotId(2),
        }];
        let rows = [
            StepRow {
                slot: SlotId(0),
                start: 2,
                tokens: &tokens[..8],
                pages: &pages,
                sample: Some(spec),
                snapshots: &two,
            },
            StepRow {
                slot: SlotId(1),
                start: 0,
                tokens: &tokens[..1],
                pages: &pages,
                sample: Some(spec),
                snapshots: &[],
            },
            StepRow {
                slot: SlotId(2),
                start: 10,
                tokens: &tokens[..5],
                pages: &pages,
                sample: None,
                snapshots: &one,
            },
        ];
        assert_eq!(check(&rows, 2, 3), Ok(()));
        assert_eq!(
            check(&rows, 1, 3),
            Err(RowSnapshotError::TooMany {
                row: 0,
                count: 2,
                max: 1
            })
        );
        assert_eq!(
            check(&rows, 2, 2),
            Err(RowSnapshotError::BeyondPool {
                row: 2,
                snapshot: 2,
                pool: 2
            })
        );
        let passes = split_rows(&rows);
        let shape: Vec<Vec<(usize, usize, usize, bool)>> = passes
            .iter()
            .map(|p| {
                p.rows
                    .iter()
                    .zip(&p.of)
                    .map(|(r, &i)| (i, r.start, r.tokens.len(), r.sample.is_some()))
                    .collect()
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                vec![(0, 2, 2, false), (1, 0, 1, true), (2, 10, 2, false)],
                vec![(0, 4, 3, false), (2, 12, 3, false)],
                vec![(0, 7, 3, true)],
            ]
        );
        assert_eq!(passes[1].rows[0].tokens, &tokens[2..5]);
        let after: Vec<Vec<(u32, usize)>> = passes
            .iter()
            .map(|p| {
                p.snapshots_after
                    .iter()
                    .map(|(slot, s)| (slot.0, s.at))
                    .collect()
            })
            .collect();
        assert_eq!(after, vec![vec![(0, 4), (2, 12)], vec![(0, 7)], vec![]]);
        // Row 1 samples in pass 0, row 0 in pass 2: row order is restored.
        assert_eq!(
            in_row_order(&passes, vec![vec!["row 1"], vec![], vec!["row 0"]]),
            vec!["row 0", "row 1"]
        );
    }

    #[test]
    fn points_out_of_order_outside_the_row_or_named_twice_are_refused() {
        fn row(snapshots: &[RowSnapshot]) -> StepRow<'_> {
            StepRow {
                slot: SlotId(0),
                start: 4,
                tokens: &[1; 6],
                pages: &[PageId(0)],
                sample: None,
                snapshots,
            }
        }
        let at = |at, k| RowSnapshot {
            at,
            snapshot: SnapshotId(k),
        };
        for bad in [
            vec![at(4, 0)],
            vec![at(10, 0)],
            vec![at(7, 0), at(6, 1)],
            vec![at(6, 0), at(6, 1)],
        ] {
            let err = check(&[row(&bad)], 4, 4).unwrap_err();
            assert!(
                matches!(err, RowSnapshotError::NotInside { row: 0, .. }),
                "{bad:?}: {err}"
            );
        }
        let twice = [at(6, 1), at(8, 1)];
        assert_eq!(
            check(&[row(&twice)], 4, 4),
            Err(RowSnapshotError::NamedTwice { snapshot: 1 })
        );
    }
}
