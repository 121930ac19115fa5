//! Command line, with vLLM's flag names where vLLM has the flag.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// The GPU if one is usable, else the CPU.
    Auto,
    Gpu,
    Cpu,
}

#[derive(Clone, Debug, Parser)]
#[command(
    name = "gdn-server",
    version,
    about = "OpenAI-compatible server for Qwen3.5 (vLLM's routes and flags). Without --model it serves an embedded demo checkpoint with random weights."
)]
pub struct Args {
    /// A Hugging Face Qwen3.5 model directory (config.json, safetensors,
    /// tokenizer.json, chat template). Without it: the embedded demo.
    #[arg(long)]
    pub model: Option<PathBuf>,
    #[arg(long, default_value = "0.0.0.0")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The name clients use as `model` (default: the --model path, or
    /// "gdn-demo" for the demo).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Longest prompt + output (default: the model's max_position_embeddings,
    /// capped by what the executor can hold).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Requests running at once (state slots).
    #[arg(long, default_value_t = 128)]
    pub max_num_seqs: usize,
    /// Token budget of one engine step (prefill chunks + decodes).
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,
    /// Fraction of GPU memory the server may use (weights, state slots, KV pages).
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Waiting requests at most; beyond it requests get 503 with Retry-After.
    #[arg(long, default_value_t = 1024)]
    pub max_num_queued_reqs: usize,
    /// Prompt tokens of the waiting requests at most; a request that would
    /// go beyond gets 503 with Retry-After (an empty queue takes any
    /// prompt). Default: no limit.
    #[arg(long)]
    pub max_num_queued_tokens: Option<usize>,
    /// Largest request body accepted (413 above it).
    #[arg(long, default_value_t = 32 * 1024 * 1024)]
    pub max_request_bytes: usize,
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    pub device: Device,
    /// A Jinja chat template file to use instead of the model's.
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// Seconds in-flight requests may take to finish after SIGTERM/SIGINT.
    #[arg(long, default_value_t = 30)]
    pub shutdown_timeout: u64,
    /// Positions per KV page.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Seconds between SSE keep-alive comments (`:`) while a stream has
    /// nothing to send (queued, or in a long prefill): the write lets the
    /// server notice a client that went away before its first token. 0 turns
    /// them off: vLLM sends none, and naive SSE readers (sglang's
    /// bench_serving 0.4 parses every non-empty line as `data:`) fail on them.
    #[arg(long, default_value_t = 15)]
    pub sse_keepalive_secs: u64,
    /// KV pages (of --block-size positions) to allocate instead of as many
    /// as --gpu-memory-utilization allows (vLLM's flag). On the CPU executor
    /// too. A tiny pool makes the engine preempt (tests do this).
    #[arg(long)]
    pub num_gpu_blocks_override: Option<usize>,
}
