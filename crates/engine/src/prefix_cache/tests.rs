use super::*;
use crate::allocator::Allocator;
use crate::executor::{CacheGeometry, SnapshotId};

const PS: usize = 4;

fn alloc(num_pages: usize) -> Allocator {
    Allocator::new(&CacheGeometry {
        num_slots: 4,
        num_pages,
        page_size: PS,
        vocab_size: 100,
        max_model_len: num_pages * PS,
    })
}

/// A sequence of `tokens` computed into fresh pages, published at its end.
fn publish(
    cache: &mut PrefixCache,
    alloc: &mut Allocator,
    tokens: &[u32],
    ops: &mut Vec<CacheOp>,
) -> crate::allocator::SeqCache {
    let seq = alloc.open(tokens.len()).expect("room");
    cache.insert(tokens, &seq.pages, seq.slot, alloc, ops);
    seq
}

#[test]
fn a_hit_is_the_longest_prefix_with_a_snapshot_exactly_there() {
    let mut a = alloc(16);
    let mut c = PrefixCache::new(PS, 8);
    let mut ops = vec![];
    let t: Vec<u32> = (1..=14).collect();
    // Snapshots after 6 and after 14 tokens (pages of 4).
    let s6 = publish(&mut c, &mut a, &t[..6], &mut ops);
    let s14 = publish(&mut c, &mut a, &t, &mut ops);
    assert_eq!(
        ops,
        vec![
            CacheOp::Take {
                slot: s6.slot,
                snapshot: SnapshotId(0)
            },
            CacheOp::Take {
                slot: s14.slot,
                snapshot: SnapshotId(1)
            }
        ]
    );
    // The full pages 0..3 came from the first sequence that reached them.
    let (hit, kv) = c.lookup(&t, 13);
    let hit = hit.unwrap();
    // 14 is beyond the limit: the hit is at 6, one full page and a tail.
    assert_eq!((hit.position, hit.snapshot, kv), (6, SnapshotId(0), 14));
    assert_eq!(hit.pages, vec![s6.pages[0]]);
    assert_eq!(hit.tail_page, Some(s6.pages[1]));
    let (hit, _) = c.lookup(&t, 14);
    assert_eq!(hit.unwrap().position, 14);
    // A divergence inside the tail: only what precedes it can be used.
    let mut other = t.clone();
    other[5] = 99;
    assert!(c.lookup(&other, 13).0.is_none());
    // Publishing the same prefix again takes no second snapshot.
    let before = ops.len();
    let again = publish(&mut c, &mut a, &t[..6], &mut ops);
    assert_eq!(ops.len(), before);
    assert_eq!(c.stats().snapshots, 2);
    for seq in [s6, s14, again] {
        a.close(seq);
    }
}

#[test]
fn the_snapshot_budget_evicts_the_least_recently_used() {
    let mut a = alloc(32);
    let mut c = PrefixCache::new(PS, 2);
    let mut ops = vec![];
    let p = |k: u32| -> Vec<u32> { (0..5).map(|i| k * 10 + i).collect() };
    let seqs: Vec<_> = [1, 2]
        .iter()
        .map(|&k| publish(&mut c, &mut a, &p(k), &mut ops))
        .collect();
    // Touch 1: 2 is now the least recently used.
    assert!(c.lookup(&p(1), 5).0.is_some());
    let third = publish(&mut c, &mut a, &p(3), &mut ops);
    assert!(ops.contains(&CacheOp::Drop(SnapshotId(1))), "{ops:?}");
    assert!(c.lookup(&p(2), 5).0.is_none());
    assert!(c.lookup(&p(1), 5).0.is_some());
    assert_eq!(c.stats().snapshot_evictions, 1);
    for seq in seqs.into_iter().chain([third]) {
        a.close(seq);
    }
}

#[test]
fn page_eviction_frees_cache_only_pages_and_never_a_running_one() {
    let mut a = alloc(6);
    let mut c = PrefixCache::new(PS, 8);
    let mut ops = vec![];
    let t: Vec<u32> = (1..=8).collect();
    let seq = publish(&mut c, &mut a, &t, &mut ops);
    // Still running: its two pages are shared with the cache.
    assert_eq!(a.pages_free(), 4);
    // Nothing the cache holds alone: it gives up its holds, frees nothing.
    assert!(!c.evict_pages(5, &mut a, &mut ops, None));
    assert_eq!(a.pages_free(), 4);
    assert_eq!(c.stats().pages, 0);
    for &page in &seq.pages {
        assert_eq!(a.page_refs(page), 1, "the running sequence keeps its pages");
    }
    // Publish again and finish the sequence: now the cache alone holds them.
    c.insert(&t, &seq.pages, seq.slot, &mut a, &mut ops);
    a.close(seq);
    assert_eq!(a.pages_free(), 4);
    assert!(c.evict_pages(6, &mut a, &mut ops, None));
    assert_eq!(a.pages_free(), 6);
    assert!(c.lookup(&t, 8).0.is_none());
}

#[test]
fn a_kept_hit_survives_page_eviction() {
    let mut a = alloc(4);
    let mut c = PrefixCache::new(PS, 8);
    let mut ops = vec![];
    let x: Vec<u32> = (1..=6).collect();
    let y: Vec<u32> = (11..=14).collect();
    let sx = publish(&mut c, &mut a, &x, &mut ops);
    let sy = publish(&mut c, &mut a, &y, &mut ops);
    a.close(sx);
    a.close(sy);
    let (hit, _) = c.lookup(&x, 6);
    let keep = hit.unwrap().snapshot;
    // y's page goes, x's (kept) stay even though 4 free pages were asked.
    assert!(!c.evict_pages(4, &mut a, &mut ops, Some(keep)));
    assert_eq!(a.pages_free(), 2);
    assert_eq!(c.lookup(&x, 6).0.unwrap().snapshot, keep);
    assert!(c.lookup(&y, 4).0.is_none());
}

/// [`publish`], then the sequence ends (the cache alone holds its pages).
fn publish_finished(
    cache: &mut PrefixCache,
    alloc: &mut Allocator,
    tokens: &[u32],
    ops: &mut Vec<CacheOp>,
) {
    let seq = publish(cache, alloc, tokens, ops);
    alloc.close(seq);
}

#[test]
fn a_full_pool_evicts_the_snapshot_saving_the_fewest_tokens_lru_among_equals() {
    let mut a = alloc(64);
    let mut c = PrefixCache::new(PS, 3);
    let mut ops = vec![];
    let long: Vec<u32> = (1..=12).collect();
    let chained: Vec<u32> = (1..=14).collect();
    let short = |k: u32, n: u32| -> Vec<u32> { (0..n).map(|i| 100 * k + i).collect() };
    // Oldest first: a 12-token prefix (saves 12), a 5-token one (saves 5),
    // then the 12-token prefix extended by 2 (saves 2 over the first).
    for t in [&long, &short(1, 5), &chained] {
        publish_finished(&mut c, &mut a, t, &mut ops);
    }
    assert_eq!(c.lookup(&chained, 14).0.unwrap().position, 14);
    ops.clear();
    // Plain LRU would drop the 12-token prefix; the chained one goes.
    publish_finished(&mut c, &mut a, &short(2, 5), &mut ops);
    assert_eq!(ops[0], CacheOp::Drop(SnapshotId(2)), "{ops:?}");
    assert_eq!(c.lookup(&chained, 14).0.unwrap().position, 12);
    // Now 12, 5 and 5 (the two 5s a tie): the older 5 goes, then the
    // newer; the 12-token prefix outlives both.
    ops.clear();
    publish_finished(&mut c, &mut a, &short(3, 6), &mut ops);
    assert_eq!(ops[0], CacheOp::Drop(SnapshotId(1)), "{ops:?}");
    // (a miss touches nothing: the second 5 stays older than the 6)
    assert!(c.lookup(&short(1, 5), 5).0.is_none());
    ops.clear();
    publish_finished(&mut c, &mut a, &short(4, 7), &mut ops);
    // (the ids are reused: the second 5-token prefix took id 2)
    assert_eq!(ops[0], CacheOp::Drop(SnapshotId(2)), "{ops:?}");
    assert!(c.lookup(&short(2, 5), 5).0.is_none());
    assert!(c.lookup(&short(3, 6), 6).0.is_some());
    assert_eq!(c.lookup(&long, 12).0.unwrap().snapshot, SnapshotId(0));
}

#[test]
fn page_pressure_takes_the_fewest_saved_tokens_per_page_first() {
    // A 14-token prefix whose snapshot saves 2 tokens over the 12-token
    // one below it (its tail page: 2 saved per page), and an unrelated
    // 8-token prefix (its leaf page: 8 saved per page). One page wanted:
    // the 2-token tail goes although it is the more recently used.
    let mut a = alloc(12);
    let mut c = PrefixCache::new(PS, 8);
    let mut ops = vec![];
    let other: Vec<u32> = (50..58).collect();
    let long: Vec<u32> = (1..=12).collect();
    let chained: Vec<u32> = (1..=14).collect();
    for t in [&other, &long, &chained] {
        publish_finished(&mut c, &mut a, t, &mut ops);
    }
    // Pages: other 2 full, long 3 full, chained's tail 1.
    assert_eq!(a.pages_free(), 6);
    ops.clear();
    assert!(c.evict_pages(7, &mut a, &mut ops, None));
    assert_eq!(ops, vec![CacheOp::Drop(SnapshotId(2))]);
    assert_eq!(c.lookup(&chained, 14).0.unwrap().position, 12);
    assert_eq!(c.lookup(&other, 8).0.unwrap().position, 8);
    // Running requests always win: the rest goes too when they need it.
    assert!(c.evict_pages(12, &mut a, &mut ops, None));
    assert_eq!(a.pages_free(), 12);
}
