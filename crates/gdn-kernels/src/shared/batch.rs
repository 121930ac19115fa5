//! The packed varlen batch every model op works on: which sequence each token
//! belongs to, where it sits, which state slot and KV pages the sequence owns.
//! Built on the host, checked once, copied to the device once per step (or
//! rewritten in place, for a captured CUDA graph that replays with new data).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::shared::error::{invalid, During, GdnError, Op};

const OP: Op = Op::Batch;

/// Host description of one step's batch. Sequence `s` contributes tokens
/// `cu_seqlens[s]..cu_seqlens[s + 1]`, at absolute positions
/// `start_positions[s]..`, with state slot `slots[s]`; its KV pages are
/// `block_table[s * max_blocks..][..]` (page `p` holds positions
/// `p * page_size..(p + 1) * page_size`). `tokens` are the step's token ids
/// in batch order.
#[derive(Clone, Debug, Default)]
pub struct BatchLayout {
    pub tokens: Vec<u32>,
    pub cu_seqlens: Vec<i32>,
    pub start_positions: Vec<i32>,
    pub slots: Vec<i32>,
    pub block_table: Vec<i32>,
    pub max_blocks: usize,
    pub page_size: usize,
    /// Rows that only fill a fixed batch shape (a CUDA graph captured for
    /// a padded batch size), see [`Padding`].
    pub padding: Option<Padding>,
}

/// A scratch state slot and KV page that padding rows share. A row with
/// `slot` is a padding row: it must be one token at position 0 whose only
/// page is `page`; padding rows may repeat the slot and page (they race on
/// them, which is harmless: nothing reads a padding row's results), and no
/// other row may use either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Padding {
    pub slot: i32,
    pub page: i32,
}

/// A checked [`BatchLayout`] on the device, with the per-token tables the
/// kernels index by.
pub struct DeviceBatch {
    // Private: the ops size grids and index tables by these, so they must
    // stay what `upload` checked.
    pub(crate) num_tokens: usize,
    pub(crate) num_seqs: usize,
    pub(crate) max_blocks: usize,
    pub(crate) page_size: usize,
    /// Bounds on the slot ids, page ids, positions and token ids the batch
    /// holds (each op checks them against its pools; a graph captured with
    /// a batch stays valid for any update within the same bounds).
    pub(crate) max_slot: usize,
    pub(crate) max_page: usize,
    pub(crate) max_position: usize,
    pub(crate) max_token: usize,
    pub(crate) host_cu_seqlens: Vec<i64>,
    /// Keys each sequence attends over (its start position plus its
    /// tokens), on the host: FlashInfer's attention plans its schedule from
    /// them.
    pub(crate) host_kv_lens: Vec<i32>,
    pub(crate) last_token_rows: Vec<i32>,
    pub(crate) tokens: CudaSlice<i32>,
    pub(crate) last_rows: CudaSlice<i32>,
    pub(crate) tok_seq: CudaSlice<i32>,
    pub(crate) cu_seqlens: CudaSlice<i32>,
    pub(crate) seq_slot: CudaSlice<i32>,
    pub(crate) positions: CudaSlice<i32>,
    pub(crate) block_table: CudaSlice<i32>,
    /// Query tiles of the prefill attention: (first token row, rows <= 16)
    /// pairs, tiles never crossing a sequence boundary.
    pub(crate) tiles: CudaSlice<i32>,
    pub(crate) num_tiles: usize,
}

/// Tokens per query tile of the prefill attention kernel (kQTile).
pub(crate) const QUERY_TILE: i32 = 16;

/// The per-token tables of a checked layout, on the host.
#[derive(Debug, PartialEq)]
struct HostTables {
    tokens: Vec<i32>,
    max_token: usize,
    tok_seq: Vec<i32>,
    positions: Vec<i32>,
    last_rows: Vec<i32>,
    tiles: Vec<i32>,
    max_page: usize,
}

/// Checks `layout` (monotone offsets, no empty sequence, pages cover every
/// position, non-negative ids) and derives the per-token tables.
fn host_tables(layout: &BatchLayout) -> Result<HostTables, GdnError> {
    let l = layout;
    // 1. The sizes agree: N slots, N + 1 offsets from 0, N start
    //    positions, a [N, max_blocks] block table, pages of > 0 positions.
    let n = check_sizes(l)?;
    // 2. Two sequences in one slot would race on its state (padding rows
    //    excepted: their results are garbage by design).
    check_slots(l)?;
    // 3. Each sequence: tokens, position, pages; then its rows of the
    //    per-token tables.
    let mut pages = PageOwners::default();
    let mut tables = HostTables {
        tokens: vec![],
        max_token: 0,
        tok_seq: vec![],
        positions: vec![],
        last_rows: vec![],
        tiles: vec![],
        max_page: 0,
    };
    for s in 0..n {
        add_sequence(l, s, &mut pages, &mut tables)?;
    }
    // 4. One token id per token, each within i32.
    let t = tables.tok_seq.len();
    if l.tokens.len() != t || l.tokens.iter().any(|&x| x > i32::MAX as u32) {
        return Err(invalid(
            OP,
            "layout",
            format!(
                "{} token ids for {t} tokens (or an id beyond i32)",
                l.tokens.len()
            ),
        ));
    }
    tables.tokens = l.tokens.iter().map(|&x| x as i32).collect();
    tables.max_token = l.tokens.iter().copied().max().unwrap_or(0) as usize;
    Ok(tables)
}

/// Step 1 of [`host_tables`]: the layout's sizes; returns N.
fn check_sizes(l: &BatchLayout) -> Result<usize, GdnError> {
    let n = l.slots.len();
    if n == 0 || l.cu_seqlens.len() != n + 1 || l.start_positions.len() != n {
        return Err(invalid(
            OP,
            "layout",
            format!(
                "{} slots, {} offsets, {} start positions: need N >= 1, N + 1, N",
                n,
                l.cu_seqlens.len(),
                l.start_positions.len()
            ),
        ));
    }
    if l.cu_seqlens[0] != 0 || l.page_size == 0 || l.block_table.len() != n * l.max_blocks {
        return Err(invalid(
                OP,
                "layout",
                format!(
                    "offsets must start at 0 (got {}), page size > 0 (got {}), block table [N, {}] (got {} entries)",
                    l.cu_seqlens[0], l.page_size, l.max_blocks, l.block_table.len()
                ),
            ));
    }
    Ok(n)
}

/// Whether sequence `s` is a padding row (its slot is the padding slot).
fn is_padding(l: &BatchLayout, s: usize) -> bool {
    l.padding.is_some_and(|p| p.slot == l.slots[s])
}

/// Step 2 of [`host_tables`]: no slot is given to two sequences.
fn check_slots(l: &BatchLayout) -> Result<(), GdnError> {
    let mut seen_slots = std::collections::HashSet::new();
    if let Some(&dup) = l
        .slots
        .iter()
        .enumerate()
        .filter(|&(s, _)| !is_padding(l, s))
        .map(|(_, x)| x)
        .find(|&&x| !seen_slots.insert(x))
    {
        return Err(invalid(
            OP,
            "layout",
            format!("slot {dup} is given to two sequences"),
        ));
    }
    Ok(())
}

/// The pages the sequences checked so far write and read. A page a
/// sequence writes (at or after its start position) belongs to it alone;
/// pages wholly before its start are only read and may be shared read-only
/// between sequences (prefix-cache pages), never with a sequence that
/// writes them: two on one written page would overwrite each other's keys
/// and values.
#[derive(Default)]
struct PageOwners {
    written: std::collections::HashSet<i32>,
    read: std::collections::HashSet<i32>,
}

/// Step 3 of [`host_tables`] for sequence `s`: its tokens, start and slot,
/// its padding rules, its pages ([`claim_pages`]), then its rows of
/// `tables`.
fn add_sequence(
    l: &BatchLayout,
    s: usize,
    pages: &mut PageOwners,
    tables: &mut HostTables,
) -> Result<(), GdnError> {
    let (a, b) = (l.cu_seqlens[s], l.cu_seqlens[s + 1]);
    if b <= a {
        return Err(invalid(
            OP,
            "layout",
            format!("sequence {s} has no tokens ({a}..{b})"),
        ));
    }
    let p0 = l.start_positions[s];
    if p0 < 0 || l.slots[s] < 0 {
        return Err(invalid(
            OP,
            "layout",
            format!("sequence {s}: negative position or slot"),
        ));
    }
    let last = p0 as usize + (b - a) as usize - 1;
    let pages_needed = last / l.page_size + 1;
    check_padding(l, s, b - a, p0)?;
    if pages_needed > l.max_blocks {
        return Err(invalid(
            OP,
            "layout",
            format!(
                "sequence {s} reaches position {last}, beyond its {} pages of {}",
                l.max_blocks, l.page_size
            ),
        ));
    }
    claim_pages(l, s, pages_needed, pages, &mut tables.max_page)?;
    for t in 0..(b - a) {
        tables.tok_seq.push(s as i32);
        tables.positions.push(p0 + t);
    }
    tables.last_rows.push(b - 1);
    for t0 in (a..b).step_by(QUERY_TILE as usize) {
        tables.tiles.extend([t0, (b - t0).min(QUERY_TILE)]);
    }
    Ok(())
}

/// A padding row (sequence `s`, `tokens` tokens from position `p0`) is one
/// token at position 0 on the padding page; no other row uses that page.
fn check_padding(l: &BatchLayout, s: usize, tokens: i32, p0: i32) -> Result<(), GdnError> {
    if let (true, Some(pad)) = (is_padding(l, s), l.padding) {
        if tokens != 1
            || p0 != 0
            || l.max_blocks == 0
            || l.block_table[s * l.max_blocks] != pad.page
        {
            return Err(invalid(
                OP,
                "layout",
                format!(
                    "padding row {s} must be one token at position 0 on padding page {}",
                    pad.page
                ),
            ));
        }
    } else if let Some(pad) = l.padding {
        let pages = &l.block_table[s * l.max_blocks..(s + 1) * l.max_blocks];
        if pages.contains(&pad.page) {
            return Err(invalid(
                OP,
                "layout",
                format!("sequence {s} uses the padding page {}", pad.page),
            ));
        }
    }
    Ok(())
}

/// The first `pages_needed` pages of sequence `s`: each one present, and
/// written by no other sequence (see [`PageOwners`]); raises `max_page`.
fn claim_pages(
    l: &BatchLayout,
    s: usize,
    pages_needed: usize,
    owners: &mut PageOwners,
    max_page: &mut usize,
) -> Result<(), GdnError> {
    let first_written = l.start_positions[s] as usize / l.page_size;
    let row_pages = &l.block_table[s * l.max_blocks..s * l.max_blocks + pages_needed];
    for (k, &p) in row_pages.iter().enumerate() {
        if p >= 0 && !is_padding(l, s) {
            let clash = if k >= first_written {
                !owners.written.insert(p) || owners.read.contains(&p)
            } else {
                let twice_in_row = row_pages[..k].contains(&p);
                owners.read.insert(p);
                twice_in_row || owners.written.contains(&p)
            };
            if clash {
                return Err(invalid(
                    OP,
                    "layout",
                    format!(
                        "page {p} is given to two sequences (or twice to one) and one of them writes it"
                    ),
                ));
            }
        }
        if p < 0 {
            return Err(invalid(
                OP,
                "layout",
                format!("sequence {s} has no page for a position it uses"),
            ));
        }
        *max_page = (*max_page).max(p as usize);
    }
    Ok(())
}

/// Keys of each sequence of a checked layout: start position plus tokens.
fn kv_lens(l: &BatchLayout) -> Vec<i32> {
    (0..l.slots.len())
        .map(|s| l.start_positions[s] + l.cu_seqlens[s + 1] - l.cu_seqlens[s])
        .collect()
}

impl DeviceBatch {
    /// Checks `layout` (see [`BatchLayout`]) and uploads it.
    pub fn upload(stream: &Arc<CudaStream>, layout: &BatchLayout) -> Result<Self, GdnError> {
        let l = layout;
        let h = host_tables(layout)?;
        let upload = |v: &[i32]| stream.clone_htod(v).during(OP);
        Ok(DeviceBatch {
            num_tokens: h.tok_seq.len(),
            num_seqs: l.slots.len(),
            max_blocks: l.max_blocks,
            page_size: l.page_size,
            max_slot: l.slots.iter().copied().max().unwrap_or(0) as usize,
            max_page: h.max_page,
            max_position: h.positions.iter().copied().max().unwrap_or(0) as usize,
            max_token: h.max_token,
            host_cu_seqlens: l.cu_seqlens.iter().map(|&x| x as i64).collect(),
            host_kv_lens: kv_lens(l),
            tokens: upload(&h.tokens)?,
            last_rows: upload(&h.last_rows)?,
            tok_seq: upload(&h.tok_seq)?,
            cu_seqlens: upload(&l.cu_seqlens)?,
            seq_slot: upload(&l.slots)?,
            positions: upload(&h.positions)?,
            block_table: upload(if l.block_table.is_empty() {
                &[0]
            } else {
                &l.block_table
            })?,
            last_token_rows: h.last_rows,
            num_tiles: h.tiles.len() / 2,
            tiles: upload(&h.tiles)?,
        })
    }

    /// Raises the bounds to pool capacities (slots, pages, positions, vocab)
    /// so that [`DeviceBatch::update`] may later bring any ids within them.
    pub fn widen_bounds(
        &mut self,
        max_slot: usize,
        max_page: usize,
        max_position: usize,
        max_token: usize,
    ) {
        self.max_slot = self.max_slot.max(max_slot);
        self.max_page = self.max_page.max(max_page);
        self.max_position = self.max_position.max(max_position);
        self.max_token = self.max_token.max(max_token);
    }

    /// Rewrites the batch in place (same buffers, so a graph captured with
    /// it sees the new data). The new layout must have the same shape
    /// (sequences, tokens per sequence, page-table width, page size) and
    /// stay within the bounds.
    pub fn update(
        &mut self,
        stream: &Arc<CudaStream>,
        layout: &BatchLayout,
    ) -> Result<(), GdnError> {
        let l = layout;
        let h = host_tables(layout)?;
        let max_slot = l.slots.iter().copied().max().unwrap_or(0) as usize;
        let max_position = h.positions.iter().copied().max().unwrap_or(0) as usize;
        let same_shape = l.slots.len() == self.num_seqs
            && l.cu_seqlens
                .iter()
                .map(|&x| x as i64)
                .eq(self.host_cu_seqlens.iter().copied())
            && l.max_blocks == self.max_blocks
            && l.page_size == self.page_size;
        let within = max_slot <= self.max_slot
            && h.max_page <= self.max_page
            && max_position <= self.max_position
            && h.max_token <= self.max_token;
        if !same_shape || !within {
            return Err(invalid(
                OP,
                "layout",
                format!("update does not fit the batch (same shape: {same_shape}, within bounds: {within})"),
            ));
        }
        stream.memcpy_htod(&h.tokens, &mut self.tokens).during(OP)?;
        self.host_kv_lens = kv_lens(l);
        stream
            .memcpy_htod(&l.slots, &mut self.seq_slot)
            .during(OP)?;
        stream
            .memcpy_htod(&h.positions, &mut self.positions)
            .during(OP)?;
        if !l.block_table.is_empty() {
            stream
                .memcpy_htod(&l.block_table, &mut self.block_table)
                .during(OP)?;
        }
        Ok(())
    }

    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    pub fn num_seqs(&self) -> usize {
        self.num_seqs
    }

    /// Token offsets of the sequences, as the GDN prefill op takes them.
    pub fn cu_seqlens(&self) -> &[i64] {
        &self.host_cu_seqlens
    }

    /// Row of each sequence's last token in the packed batch.
    pub fn last_token_rows(&self) -> &[i32] {
        &self.last_token_rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sequences: 3 tokens from position 5 (page 16: pages 0 only) and
    /// 20 tokens from 0 (pages 0, 1).
    fn layout() -> BatchLayout {
        BatchLayout {
            tokens: (0..23).collect(),
            cu_seqlens: vec![0, 3, 23],
            start_positions: vec![5, 0],
            slots: vec![4, 1],
            block_table: vec![7, -1, 2, 3],
            max_blocks: 2,
            page_size: 16,
            padding: None,
        }
    }

    /// Two sequences resuming at position 32 on the same two read-only
    /// prefix pages (5, 6... as pages 0 and 1), each writing its own third.
    fn shared_prefix() -> BatchLayout {
        BatchLayout {
            tokens: (0..6).collect(),
            cu_seqlens: vec![0, 3, 6],
            start_positions: vec![32, 32],
            slots: vec![0, 1],
            block_table: vec![5, 6, 7, 5, 6, 8],
            max_blocks: 3,
            page_size: 16,
            padding: None,
        }
    }

    #[test]
    fn read_only_prefix_pages_may_be_shared_written_pages_may_not() {
        let t = host_tables(&shared_prefix()).unwrap();
        assert_eq!(t.max_page, 8);
        let mut l = shared_prefix();
        l.block_table = vec![5, 6, 7, 5, 6, 7];
        let e = host_tables(&l).unwrap_err().to_string();
        assert!(e.contains("page 7 is given to two"), "{e}");
    }

    #[test]
    fn tables_follow_the_layout() {
        let t = host_tables(&layout()).unwrap();
        assert_eq!(&t.tok_seq[..4], &[0, 0, 0, 1]);
        assert_eq!(&t.positions[..4], &[5, 6, 7, 0]);
        assert_eq!(t.positions[22], 19);
        assert_eq!(t.last_rows, vec![2, 22]);
        // Tiles of <= 16 rows never cross a sequence boundary.
        assert_eq!(t.tiles, vec![0, 3, 3, 16, 19, 4]);
        assert_eq!(t.max_page, 7);
    }

    #[test]
    fn bad_layouts_are_refused_with_the_reason() {
        let err = |l: BatchLayout| host_tables(&l).unwrap_err().to_string();
        let mut l = layout();
        l.cu_seqlens = vec![0, 3, 3];
        assert!(err(l).contains("sequence 1 has no tokens"));
        let mut l = layout();
        l.block_table = vec![7, -1, 2, -1];
        assert!(err(l).contains("sequence 1 has no page"));
        let mut l = layout();
        l.start_positions = vec![30, 0];
        assert!(err(l).contains("beyond its 2 pages"));
        let mut l = layout();
        l.slots = vec![4, -1];
        assert!(err(l).contains("negative"));
        let mut l = layout();
        l.cu_seqlens = vec![1, 3, 23];
        assert!(err(l).contains("start at 0"));
        let mut l = layout();
        l.block_table.pop();
        assert!(err(l).contains("block table"));
        let mut l = layout();
        l.slots = vec![1, 1];
        assert!(err(l).contains("slot 1 is given to two sequences"));
        let mut l = layout();
        l.block_table = vec![7, -1, 2, 7];
        assert!(err(l).contains("page 7 is given to two"));
        // Sequence 0 writes page 7 (its start, 5, is inside it); sequence 1
        // reading it as a shared prefix page is refused too.
        let mut l = layout();
        l.start_positions = vec![5, 16];
        l.cu_seqlens = vec![0, 3, 7];
        l.tokens.truncate(7);
        l.block_table = vec![7, -1, 7, 3];
        assert!(err(l).contains("page 7 is given to two"));
        // One sequence listing a read-only page twice.
        let mut l = shared_prefix();
        l.block_table = vec![5, 5, 6, 5, 5, 7];
        assert!(err(l).contains("page 5 is given to two"));
        let mut l = layout();
        l.tokens.pop();
        assert!(err(l).contains("22 token ids for 23 tokens"));
    }

    /// One real decode row (slot 4, page 7) and two padding rows sharing
    /// slot 9 and page 8.
    fn padded() -> BatchLayout {
        BatchLayout {
            tokens: vec![5, 0, 0],
            cu_seqlens: vec![0, 1, 2, 3],
            start_positions: vec![3, 0, 0],
            slots: vec![4, 9, 9],
            block_table: vec![7, -1, 8, -1, 8, -1],
            max_blocks: 2,
            page_size: 16,
            padding: Some(Padding { slot: 9, page: 8 }),
        }
    }

    #[test]
    fn padding_rows_share_their_slot_and_page_and_nothing_else() {
        let t = host_tables(&padded()).unwrap();
        assert_eq!(t.positions, vec![3, 0, 0]);
        assert_eq!(t.max_page, 8);
        let err = |l: BatchLayout| host_tables(&l).unwrap_err().to_string();
        // Without the padding declaration the shared slot is refused.
        let mut l = padded();
        l.padding = None;
        assert!(err(l).contains("slot 9 is given to two sequences"));
        // A real row may not use the padding page.
        let mut l = padded();
        l.block_table[0] = 8;
        assert!(err(l).contains("sequence 0 uses the padding page 8"));
        // Padding rows are one token at position 0 on the padding page.
        let mut l = padded();
        l.start_positions[2] = 1;
        assert!(err(l).contains("padding row 2 must be one token"));
        let mut l = padded();
        l.block_table[4] = 6;
        assert!(err(l).contains("padding row 2 must be one token"));
        // Real rows still may not share a slot.
        let mut l = padded();
        l.slots = vec![9, 4, 4];
        l.block_table = vec![8, -1, 7, -1, 6, -1];
        l.start_positions = vec![0, 3, 3];
        assert!(err(l).contains("slot 4 is given to two sequences"));
    }
}
