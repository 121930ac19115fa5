//! The engine over an executor arena (the fake's): KV pages and state
//! slots mapped on demand from one pool of chunks. Under pressure, with
//! and without the prefix cache, every request ends with the tokens the
//! fake model gives alone, the fake sees no map, unmap, row or cache op
//! break the arena's rules, and `max_num_seqs` is a cap: the engine starts
//! with far more slot ids than the pool could hold as reserved slots, and
//! short requests run more at once than long ones.

use crate::common;

use common::*;
use engine::prefix_cache::PrefixCacheConfig;
use engine::{ArenaGeometry, CacheGeometry, EngineConfig, GenerateRequest};
use engine_testkit::{collect, FakeExecutor};

const PAGE: usize = 8;

/// 48 chunks; a page group is 4 pages (32 positions) for 1 chunk, a slot
/// group one slot for 4 chunks: a state weighs 128 positions of KV.
fn arena() -> ArenaGeometry {
    ArenaGeometry {
        num_chunks: 48,
        chunk_bytes: 1 << 21,
        pages_per_group: 4,
        chunks_per_page_group: 1,
        slots_per_group: 1,
        chunks_per_slot_group: 4,
    }
}

/// 64 slot ids: reserved up front they would take 256 chunks.
fn arena_geometry() -> CacheGeometry {
    geometry(64, arena().max_pages(), PAGE)
}

fn start_arena(config: EngineConfig, snapshots: usize) -> Started {
    start_fake(config, |control| {
        FakeExecutor::factory_with_arena(arena_geometry(), arena(), snapshots, control)
    })
}

/// Runs `requests` all queued at once; the most rows of one step.
async fn run_all(s: &Started, requests: &[GenerateRequest]) -> usize {
    s.control.hold();
    let streams: Vec<_> = requests
        .iter()
        .map(|r| s.handle.submit(r.clone()).expect("accepted"))
        .collect();
    s.control.run_free();
    for (r, stream) in requests.iter().zip(streams) {
        let (tokens, _) = collect(stream).await;
        assert_eq!(tokens, reference_tokens(r, &[EOS]));
    }
    assert_clean(s);
    s.control.steps().iter().map(Vec::len).max().unwrap_or(0)
}

#[tokio::test]
async fn requests_end_as_alone_on_memory_mapped_on_demand() {
    // Prompts sharing a 40-token preamble, 24 to 100 tokens in all, and
    // outputs of 10 to 40: together far more than the pool.
    let preamble = prompt(1, 40);
    let requests: Vec<GenerateRequest> = (0..24u32)
        .map(|i| {
            let mut p = preamble.clone();
            p.extend(prompt(2 + i % 50, (i as usize * 13) % 60));
            request(p, 10 + (i as usize * 7) % 31, i as u64)
        })
        .collect();
    for cache in [false, true] {
        let mut config = config(256, 64);
        config.prefix_cache = PrefixCacheConfig {
            enabled: cache,
            max_snapshots: 8,
            ..PrefixCacheConfig::default()
        };
        let s = start_arena(config, if cache { 8 } else { 0 });
        run_all(&s, &requests).await;
        let stats = s.handle.stats();
        assert_eq!(stats.slots_total, 64);
        if cache {
            let hits = stats.prefix_cache.unwrap().hit_tokens;
            assert!(hits > 0, "the shared preamble was never hit");
        }
    }
}

#[tokio::test]
async fn max_num_seqs_caps_the_slots_instead_of_reserving_them() {
    // Short requests (16 + 8 positions: one page group and one slot group,
    // 5 chunks) run 9 at once; long ones (200 + 8: 7 page groups and a
    // slot group, 11 chunks) 4 at once.
    let short: Vec<_> = (0..16)
        .map(|i| request(prompt(i, 16), 8, i as u64))
        .collect();
    let long: Vec<_> = (0..8)
        .map(|i| request(prompt(i, 200), 8, i as u64))
        .collect();
    let s = start_arena(config(512, 64), 0);
    let most_short = run_all(&s, &short).await;
    assert!(most_short >= 9, "{most_short} short requests ran at once");
    let s = start_arena(config(512, 64), 0);
    let most_long = run_all(&s, &long).await;
    assert!(
        (2..=4).contains(&most_long),
        "{most_long} long requests ran at once"
    );
}
