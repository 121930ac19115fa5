//! A snapshot budget given as a share of the cache memory (the server's
//! `--prefix-cache-state-budget 25%`) on the GPU executor (skipped without
//! a GPU; `GDN_REQUIRE_GPU=1` makes a missing GPU a failure). Its own test
//! binary: the executor takes a quarter of the GPU, and the device's memory
//! pool keeps what it frees (no release threshold), which would leave
//! gpu_executor.rs's page-pool test no room in the same process.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use engine::Executor;
use qwen35::engine_exec::{CacheRoom, GpuExecutor, GpuSizing, PagePool};
use qwen35::gpu::GpuOptions;
use qwen35_testkit::MODELS;

const PAGE: usize = 16;
const PAGES_PER_SLOT: usize = 16;

fn stream() -> Option<Arc<CudaStream>> {
    gdn_kernels_testkit::gpu_stream().map(|s| s.context().new_stream().unwrap())
}

/// The executor offers the snapshot budget the memory the KV pages and the
/// snapshots share (`CacheRoom::Shared`: what the utilization leaves after
/// the weights, the slots and the activation reserve); the budget takes a
/// quarter of it (as the server's `StateBudget::Fraction(0.25)` does), and
/// the pages must then fill the rest: snapshots + pages within the room and
/// short of it by less than a page (give or take the driver's rounding),
/// the snapshots' share 25% within one snapshot.
#[test]
fn a_snapshot_share_of_the_cache_memory_splits_it_with_the_pages() {
    let Some(s) = stream() else { return };
    let mut offered = None;
    let exec = GpuExecutor::load_with_snapshot_pool(
        &qwen35_testkit::dir(MODELS[0]),
        s.clone(),
        GpuOptions::default(),
        GpuSizing {
            num_slots: 4,
            pages: PagePool::FromMemory {
                gpu_memory_utilization: 0.25,
                activation_reserve: 1 << 30,
            },
            page_size: PAGE,
            max_model_len: PAGES_PER_SLOT * PAGE,
        },
        |slot_bytes, room| {
            offered = Some(room);
            match room {
                CacheRoom::Shared(total) => total / 4 / slot_bytes,
                CacheRoom::FixedKv(_) => panic!("pages from memory offered a fixed KV: {room:?}"),
            }
        },
    )
    .unwrap();
    let Some(CacheRoom::Shared(room)) = offered else {
        panic!("the budget was not asked: {offered:?}")
    };
    let (slot_bytes, page_bytes) = exec.model().slot_and_page_bytes(PAGE);
    let snapshots = exec.snapshot_geometry().num_snapshots * slot_bytes;
    let pages = exec.geometry().num_pages * page_bytes;
    println!(
        "room {room} bytes: {snapshots} in {} snapshots, {pages} in {} pages",
        exec.snapshot_geometry().num_snapshots,
        exec.geometry().num_pages
    );
    // The pages are sized from a second reading of free memory: allow the
    // driver's rounding (as gpu_executor.rs's page-pool test does).
    let slack = 64 << 20;
    assert!(snapshots > 0 && pages > 0);
    assert!(
        snapshots + pages <= room + slack,
        "{snapshots} + {pages} > {room}"
    );
    assert!(
        snapshots + pages + page_bytes + slack > room,
        "the pages left {} bytes of the room unused",
        room - snapshots - pages
    );
    assert!(
        (snapshots as f64 - room as f64 / 4.0).abs() <= slot_bytes as f64,
        "snapshots take {snapshots} of {room}"
    );
}
