//! Which executor runs the model: `--device cpu` the f32 CPU reference
//! forward, `gpu` the bf16 GPU runtime, `auto` the GPU when one is usable
//! and the CPU otherwise. The choice runs on the engine thread (CUDA
//! contexts are created there).

use std::path::PathBuf;
use std::sync::Arc;

use engine::Executor;
use gdn_http::serve::{ExecutorFactory, ExecutorSpec};
use gdn_http::startup::Startup;
use qwen35::engine_exec::{
    ArenaPool, CacheRoom, CpuExecutor, CpuSizing, GpuExecutor, GpuSizing, PagePool,
};
use qwen35::gpu::{CudaStream, GpuModel, GpuOptions};
use qwen35::StateDtypeRequest;

use crate::cli::{Args, Device};
use crate::memory::{activation_reserve, kv_page_bytes, StateBudget};

/// Context length when neither the flag nor the model sets one.
const FALLBACK_MAX_MODEL_LEN: usize = 32768;

/// Why no executor could be built.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    #[error("--num-gpu-blocks-override must be at least 1")]
    NoPages,
    #[error("no usable GPU: {0}")]
    NoGpu(#[source] qwen35::DeviceError),
    #[error("CPU executor: {0}")]
    Cpu(#[source] qwen35::LoadError),
    #[error("GPU executor: {0}")]
    Gpu(#[source] qwen35::LoadError),
    #[error("capturing decode graphs: {0}")]
    DecodeGraphs(#[source] qwen35::RunError),
}

#[derive(Clone, Debug)]
struct Plan {
    dir: PathBuf,
    device: Device,
    num_slots: usize,
    page_size: usize,
    max_model_len: usize,
    /// `--num-gpu-blocks-override`: this many KV pages.
    num_pages: Option<usize>,
    gpu_memory_utilization: f64,
    /// GPU bytes kept free for a step's activations ([`activation_reserve`]).
    activation_reserve: usize,
    /// `--max-num-batched-tokens`: the most tokens of one step.
    max_step_tokens: usize,
    /// The prefix cache's snapshot pool (`None`: prefix caching off).
    snapshots: Option<StateBudget>,
    /// `--mamba-ssm-cache-dtype`.
    state_dtype: StateDtypeRequest,
    /// Pages sized from memory share one pool with the slots' state
    /// (`--state-arena`).
    state_arena: bool,
}

/// The executor `--device` asks for, over `spec`'s model directory (built
/// later, on the engine thread).
pub fn pick(args: &Args, spec: ExecutorSpec<'_>) -> Result<ExecutorFactory, ExecutorError> {
    let ExecutorSpec {
        model_dir,
        max_model_len,
        startup,
    } = spec;
    let max_model_len = if max_model_len == usize::MAX {
        FALLBACK_MAX_MODEL_LEN
    } else {
        max_model_len
    };
    if args.num_gpu_blocks_override == Some(0) {
        return Err(ExecutorError::NoPages);
    }
    let plan = Plan {
        dir: model_dir.to_path_buf(),
        device: args.device,
        num_slots: args.max_num_seqs,
        page_size: args.block_size,
        max_model_len,
        num_pages: args.num_gpu_blocks_override,
        gpu_memory_utilization: args.gpu_memory_utilization,
        activation_reserve: activation_reserve(args.max_num_batched_tokens, args.max_num_seqs),
        max_step_tokens: args.max_num_batched_tokens,
        snapshots: args.prefix_caching().then(|| args.state_budget()),
        state_dtype: args.mamba_ssm_cache_dtype,
        state_arena: args.state_arena,
    };
    Ok(Box::new(move || Ok(build(&plan, &startup)?)))
}

/// The loaded model's architecture in the startup log (dense, or MoE with
/// its experts and top-k).
fn log_model(config: &qwen35::Config) {
    log::info!(
        "model: {} Qwen3.5, {} layers, hidden {}, vocab {}",
        config.architecture(),
        config.num_hidden_layers,
        config.hidden_size,
        config.vocab_size
    );
}

fn build(plan: &Plan, startup: &Startup) -> Result<Box<dyn Executor>, ExecutorError> {
    let stream = || startup.time("cuda_context", GpuModel::default_stream);
    match plan.device {
        Device::Cpu => cpu(plan, startup),
        Device::Gpu => {
            let stream = stream().map_err(ExecutorError::NoGpu)?;
            gpu(plan, stream, startup)
        }
        // The probe's stream serves: a second context creation would cost
        // as much again.
        Device::Auto => match stream() {
            Ok(stream) => gpu(plan, stream, startup),
            Err(e) => {
                log::info!("no usable GPU ({e}): serving on the CPU executor");
                cpu(plan, startup)
            }
        },
    }
}

fn cpu(plan: &Plan, startup: &Startup) -> Result<Box<dyn Executor>, ExecutorError> {
    // The CPU forward keeps keys per sequence; pages only bound the total,
    // so every slot may reach the full context.
    let pages_per_seq = plan.max_model_len.div_ceil(plan.page_size);
    let sizing = CpuSizing {
        num_slots: plan.num_slots,
        num_pages: plan.num_pages.unwrap_or(plan.num_slots * pages_per_seq),
        page_size: plan.page_size,
        max_model_len: plan.max_model_len,
    };
    log::info!(
        "loading {} on the CPU executor ({sizing:?})",
        plan.dir.display()
    );
    let executor = startup
        .time("cpu_model_load", || {
            CpuExecutor::load_with_state_dtype(&plan.dir, sizing, plan.state_dtype)
        })
        .map_err(ExecutorError::Cpu)?;
    log_model(&executor.model().config);
    let snapshots = plan.snapshots.map_or(0, |budget| {
        // A CPU snapshot also holds the sequence's keys and values (they
        // live in its state here): a byte budget counts the state only, and
        // a share divides the state and the KV the page pool stands for.
        let room = CacheRoom::FixedKv(
            sizing.num_pages * kv_page_bytes(&executor.model().config, plan.page_size),
        );
        budget.snapshots(executor.model().new_state().recurrent_bytes(), room)
    });
    let executor = executor.with_snapshot_pool(snapshots);
    // As on the GPU: the pages and the slots in one arena when the flag
    // asks and no fixed page count does.
    let executor = match plan.num_pages {
        None if plan.state_arena => executor.with_arena(),
        _ => executor,
    };
    Ok(Box::new(executor))
}

fn gpu(
    plan: &Plan,
    stream: Arc<CudaStream>,
    startup: &Startup,
) -> Result<Box<dyn Executor>, ExecutorError> {
    // A MoE model's step also holds its routed experts' rows.
    let activation_reserve = plan.activation_reserve
        + qwen35::Config::from_file(&plan.dir.join("config.json"))
            .map_or(0, |c| qwen35::gpu::moe_step_bytes(&c, plan.max_step_tokens));
    let gpu_memory_utilization = plan.gpu_memory_utilization;
    let sizing = GpuSizing {
        num_slots: plan.num_slots,
        pages: match plan.num_pages {
            Some(pages) => PagePool::Fixed(pages),
            // Slots mapped on demand from the pages' pool: --max-num-seqs
            // caps them instead of reserving them.
            None if plan.state_arena => PagePool::Arena(ArenaPool::FromMemory {
                gpu_memory_utilization,
                activation_reserve,
            }),
            None => PagePool::FromMemory {
                gpu_memory_utilization,
                activation_reserve,
            },
        },
        page_size: plan.page_size,
        max_model_len: plan.max_model_len,
    };
    log::info!(
        "loading {} on the GPU executor ({sizing:?})",
        plan.dir.display()
    );
    let snapshots = plan.snapshots;
    let mut executor = GpuExecutor::load_with_snapshot_pool(
        &plan.dir,
        stream,
        GpuOptions {
            state_dtype: plan.state_dtype,
            ..GpuOptions::default()
        },
        sizing,
        |slot_bytes, room| snapshots.map_or(0, |budget| budget.snapshots(slot_bytes, room)),
    )
    .map_err(ExecutorError::Gpu)?;
    log_model(&executor.model().config);
    let buckets = executor
        .capture_decode_graphs(plan.num_slots)
        .map_err(ExecutorError::DecodeGraphs)?;
    log::info!("decode graphs captured for batch sizes {buckets:?}");
    for (phase, took) in executor.startup_phases().iter() {
        startup.record(phase, took);
    }
    Ok(Box::new(executor))
}
