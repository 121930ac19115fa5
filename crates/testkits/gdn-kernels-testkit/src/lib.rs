//! The test kit of `gdn-kernels`: deterministic random GDN problems
//! ([`Problem`]), the CPU oracle on them and GPU runs of them, the oracle
//! checks every backend must pass, error statistics, and the GPU probe
//! ([`gpu_stream`]) that lets GPU tests skip on machines without one.
//!
//! A dev-dependency only (gdn-kernels' own tests and examples, qwen35's and
//! gdn-server's GPU tests): no shipped binary links it. It uses only the
//! public API of `gdn_kernels`.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

mod check;
mod problem;

pub use check::{
    assert_results_agree, check_against_oracle, check_continuation, compare, geometry, Comparison,
    ORACLE_LENGTHS, OUTPUT_TOLERANCE, QWEN35_GDN_HEADS, STATE_TOLERANCE,
};
pub use problem::{DeviceProblem, Problem};

/// SplitMix64: tiny, deterministic, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// The GPU's stream, or `None` (and a note on stderr) where there is no CUDA
/// driver or device. With `GDN_REQUIRE_GPU=1` a missing GPU is a failure, so
/// the documented GPU command cannot pass by skipping.
pub fn gpu_stream() -> Option<Arc<CudaStream>> {
    let required = std::env::var("GDN_REQUIRE_GPU").is_ok_and(|v| v == "1");
    // SAFETY: only probes whether libcuda can be loaded.
    let present = unsafe { cudarc::driver::sys::is_culib_present() };
    let ctx = if present {
        CudaContext::new(0).map_err(|e| e.to_string())
    } else {
        Err("no CUDA driver library".into())
    };
    match ctx {
        Ok(ctx) => Some(ctx.default_stream()),
        Err(why) if required => panic!("GDN_REQUIRE_GPU=1 but no GPU is usable: {why}"),
        Err(why) => {
            eprintln!("skipped: no usable GPU ({why})");
            None
        }
    }
}

/// The device's copy bandwidth in bytes moved per second (a copy reads and
/// writes every byte): the rate the benchmarks' memory floors divide by.
pub fn copy_bandwidth(stream: &Arc<CudaStream>) -> Result<f64, cudarc::driver::DriverError> {
    let bytes = 4usize << 30;
    let src = stream.alloc_zeros::<u8>(bytes)?;
    let mut dst = stream.alloc_zeros::<u8>(bytes)?;
    stream.memcpy_dtod(&src, &mut dst)?;
    stream.synchronize()?;
    let t0 = std::time::Instant::now();
    for _ in 0..5 {
        stream.memcpy_dtod(&src, &mut dst)?;
    }
    stream.synchronize()?;
    Ok(5.0 * 2.0 * bytes as f64 / t0.elapsed().as_secs_f64())
}

/// What a timed graph's body may fail with.
pub type BoxError = Box<dyn std::error::Error>;

/// Median milliseconds of one `body` call: `body(i)` for i in 0..calls
/// captured in one CUDA graph on `stream` (a created stream, not the
/// legacy default one), the graph launched once to warm up and then timed
/// with events over `launches` launches.
pub fn time_graph(
    stream: &Arc<CudaStream>,
    calls: usize,
    launches: usize,
    body: &mut dyn FnMut(usize) -> Result<(), BoxError>,
) -> Result<f32, BoxError> {
    use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = (0..calls).try_for_each(&mut *body);
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    captured?;
    let graph = graph?.ok_or("stream capture produced no graph")?;
    graph.launch()?;
    stream.synchronize()?;
    let ctx = stream.context();
    let mut times = Vec::new();
    for _ in 0..launches {
        let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let (a, b) = (ctx.new_event(flags)?, ctx.new_event(flags)?);
        a.record(stream)?;
        graph.launch()?;
        b.record(stream)?;
        b.synchronize()?;
        times.push(a.elapsed_ms(&b)? / calls as f32);
    }
    times.sort_by(f32::total_cmp);
    Ok(times[times.len() / 2])
}
