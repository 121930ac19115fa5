//! Command line, with vLLM's flag names where vLLM has the flag.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use engine::AdmissionPolicy;
use gdn_http::http::ConnectionLimits;
use gdn_http::serve::{PrefixCaching, ServeConfig};
use qwen35::StateDtypeRequest;

use crate::memory::{parse_state_budget, StateBudget};

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
    /// capped by what the executor can hold; above max_position_embeddings
    /// is refused, as vLLM does).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Requests running at once (state slots; vLLM's flag).
    #[arg(long, default_value_t = 128)]
    pub max_num_seqs: usize,
    /// Token budget of one engine step (prefill chunks + decodes).
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,
    /// Fraction of GPU memory the server may use (weights, state slots, KV pages).
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Requests waiting for admission at most, beyond the --max-num-seqs
    /// (capped by the state slots) that run: a burst that fits the free
    /// slots is always taken; past slots + queue a request gets 503 with
    /// Retry-After.
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
    /// Longest JSON schema, regex, grammar or choice list a request may
    /// constrain its output with (structured outputs; a forced tool
    /// call's grammar built from `tools` too); 400 above it.
    #[arg(long, default_value_t = gdn_http::openai::validate::DEFAULT_MAX_CONSTRAINT_BYTES)]
    pub max_constraint_bytes: usize,
    /// Open HTTP connections at most (uvicorn's flag); one more is answered
    /// 503 with Retry-After and closed. Lowered at start to what the
    /// file-descriptor limit leaves (raised to its hard limit first).
    #[arg(long, default_value_t = 4096)]
    pub limit_concurrency: usize,
    /// Seconds an idle connection (no request yet, or its last response
    /// sent) stays open (uvicorn's flag and default); 0 turns it off.
    #[arg(long, default_value = "5", value_parser = parse_seconds)]
    pub timeout_keep_alive: Duration,
    /// Seconds from a request's first byte to the end of its headers
    /// (hyper's header_read_timeout), and the longest a request body may
    /// go without bytes while it is read; past either the client gets 408
    /// and the connection closes (so trickling or stalled clients cannot
    /// hold connections); 0 turns it off.
    #[arg(long, default_value = "10", value_parser = parse_seconds)]
    pub header_read_timeout: Duration,
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    pub device: Device,
    /// A Jinja chat template file to use instead of the model's.
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// Seconds in-flight requests may take to finish after SIGTERM/SIGINT.
    #[arg(long, default_value_t = 30)]
    pub shutdown_timeout: u64,
    /// Positions per KV page: a multiple of 64 (the GDN chunk) by default,
    /// so that the prefix cache's shared full pages end on chunk boundaries.
    #[arg(long, default_value_t = 64)]
    pub block_size: usize,
    /// Seconds between SSE keep-alive comments (`:`) while a stream has
    /// nothing to send (queued, or in a long prefill): the write lets the
    /// server notice a client that went away before its first token. 0 turns
    /// them off: vLLM sends none, and naive SSE readers (sglang's
    /// bench_serving 0.4 parses every non-empty line as `data:`) fail on them.
    #[arg(long, default_value_t = 15)]
    pub sse_keepalive_secs: u64,
    /// Logs one `request_timeline` line per generation request when its
    /// first text goes out: where its time to first token went (body,
    /// tokenizer, queue, every engine step with the executor's host prep /
    /// device forward / sampling split, the response). Off by default; on,
    /// the GPU executor records CUDA events around each forward and reads
    /// them at the step's end, so a prefill chunk that samples nothing no
    /// longer overlaps the next step's host work (well under a millisecond).
    #[arg(long)]
    pub request_timeline: bool,
    /// KV pages (of --block-size positions) to allocate instead of as many
    /// as --gpu-memory-utilization allows (vLLM's flag). On the CPU executor
    /// too. A tiny pool makes the engine preempt (tests do this).
    #[arg(long)]
    pub num_gpu_blocks_override: Option<usize>,
    /// Map the slots' recurrent state and the KV pages on demand from one
    /// pool (the state arena) instead of reserving one state slot per
    /// --max-num-seqs up front, so that --max-num-seqs caps the slots
    /// instead of reserving them; with pages sized from memory (no
    /// --num-gpu-blocks-override). Off by default until its GPU gate has
    /// run on the device (docs/gpu-tests.md).
    #[arg(long)]
    pub state_arena: bool,
    /// Prefix caching (on by default): KV pages of earlier requests shared
    /// through a radix tree, resumed from recurrent-state snapshots taken
    /// at exact positions (docs/prefix-caching.md). Greedy outputs are the
    /// same with it on or off.
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Turns prefix caching off.
    #[arg(long, overrides_with = "enable_prefix_caching")]
    pub no_enable_prefix_caching: bool,
    /// Also snapshot each prompt's state before its last token, so that an
    /// exact repeat of a prompt hits on its first repeat. Off by default:
    /// it ends every prefill one token early, and under load the last token
    /// then waits a whole step (docs/prefix-caching.md); repeats hit from the
    /// second repeat on without it (a branch point).
    #[arg(long)]
    pub prefix_cache_snapshot_before_last_token: bool,
    /// Take prefix-cache snapshots at chunk boundaries instead of inside
    /// the step: each snapshot point then ends its request's prefill chunk
    /// and costs it a step of latency under load. By default (in-step) the
    /// executor runs a chunk up to each point, copies the state and runs
    /// on in a second, small forward of the same step
    /// (docs/prefix-caching.md). For comparisons.
    #[arg(long)]
    pub no_prefix_cache_in_step_snapshots: bool,
    /// Also snapshot each prompt every this many tokens (a multiple of
    /// --block-size; 0 turns it off), so that a long document shared from
    /// its start is resumed at most this many tokens before where its
    /// sharers part: a branch point alone makes the first sharer compute
    /// the whole shared prefix again. Sparse by default: on the 4B a
    /// snapshot (~51 MB) weighs a fifth of 8,192 tokens of KV, and prompts
    /// shorter than the interval take none (docs/prefix-caching.md).
    #[arg(long, default_value_t = 8192)]
    pub prefix_cache_snapshot_interval: usize,
    /// The prefix cache's recurrent-state snapshots: a count (`64`), a
    /// size (`4GiB`, `512MiB`, `2GB`; a 4B snapshot is ~51 MB) or a share
    /// of the cache memory the KV pages and the snapshots divide (`0.25`,
    /// `25%`). They are allocated up front, before the KV pages. Default:
    /// 2 x --max-num-seqs, at most half of that memory.
    #[arg(long, value_parser = parse_state_budget)]
    pub prefix_cache_state_budget: Option<StateBudget>,
    /// How the DeltaNet recurrent state is stored (vLLM's flag): `auto`
    /// takes config.json's `mamba_ssm_dtype` (float32 where it has none),
    /// `float32` keeps Hugging Face's f32, `bfloat16` stores it in bf16
    /// with f32 math: half the state memory and traffic (README: "Recurrent
    /// state dtype" gives the drift measured against f32).
    #[arg(long, default_value = "auto", value_parser = parse_state_dtype)]
    pub mamba_ssm_cache_dtype: StateDtypeRequest,
    /// How admission leaves KV room for the running requests' growth:
    /// `new-token-ratio` (SGLang's estimate of the outputs to come, which
    /// learns from preemptions), `reserve` (TGI: prompt + max_tokens, never
    /// preempts, holds room that early stops leave unused) or `watermark`
    /// (vLLM: one free page per running request, preempts under pressure).
    /// The server README's "Memory" compares them.
    #[arg(long, default_value = "new-token-ratio", value_parser = parse_admission)]
    pub admission_policy: AdmissionPolicy,
}

/// An `--admission-policy` that names no policy.
#[derive(Debug, thiserror::Error)]
#[error("expected one of {names}, got {0:?}", names = AdmissionPolicy::NAMES.join(", "))]
struct UnknownAdmissionPolicy(String);

/// `--admission-policy`'s value.
fn parse_admission(text: &str) -> Result<AdmissionPolicy, UnknownAdmissionPolicy> {
    AdmissionPolicy::from_name(text).ok_or_else(|| UnknownAdmissionPolicy(text.to_string()))
}

/// `--mamba-ssm-cache-dtype`'s value.
fn parse_state_dtype(text: &str) -> Result<StateDtypeRequest, qwen35::UnknownStateDtype> {
    text.parse()
}

/// A duration flag that is not a number of seconds.
#[derive(Debug, thiserror::Error)]
enum SecondsError {
    #[error("expected seconds, got '{0}'")]
    NotANumber(String),
    #[error("expected seconds (0 or more), got '{0}'")]
    OutOfRange(String),
}

/// Seconds, whole or not (`5`, `0.25`).
fn parse_seconds(text: &str) -> Result<Duration, SecondsError> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| SecondsError::NotANumber(text.to_string()))?;
    Duration::try_from_secs_f64(seconds).map_err(|_| SecondsError::OutOfRange(text.to_string()))
}

/// A flag value, or a combination of flags, that the program refuses.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FlagError {
    #[error("--block-size must be at least 1")]
    ZeroBlockSize,
    #[error("--gpu-memory-utilization is a fraction of the GPU's memory in (0, 1], got {0}")]
    GpuMemoryUtilization(f64),
    #[error("--prefix-cache-snapshot-interval {interval} is not a multiple of --block-size {block_size}: periodic snapshots end on page boundaries (0 turns them off)")]
    SnapshotIntervalOffPage { interval: usize, block_size: usize },
}

impl Args {
    /// Refuses flag combinations that no single flag's parser can see.
    pub fn check(&self) -> Result<(), FlagError> {
        if self.block_size == 0 {
            return Err(FlagError::ZeroBlockSize);
        }
        let share = self.gpu_memory_utilization;
        if !(share > 0.0 && share <= 1.0) {
            return Err(FlagError::GpuMemoryUtilization(share));
        }
        let interval = self.prefix_cache_snapshot_interval;
        if interval % self.block_size != 0 {
            return Err(FlagError::SnapshotIntervalOffPage {
                interval,
                block_size: self.block_size,
            });
        }
        Ok(())
    }

    /// Whether prefix caching is on (the later of the two flags wins).
    pub fn prefix_caching(&self) -> bool {
        !self.no_enable_prefix_caching
    }

    /// The snapshot budget in force.
    pub fn state_budget(&self) -> StateBudget {
        self.prefix_cache_state_budget
            .unwrap_or(StateBudget::AtMost(2 * self.max_num_seqs))
    }

    /// What gdn-http serves: `model_dir` (the --model directory or the
    /// unpacked demo) as --served-model-name, else as `default_name`.
    pub fn serve_config(&self, model_dir: PathBuf, default_name: String) -> ServeConfig {
        ServeConfig {
            model_dir,
            served_model_name: self.served_model_name.clone().unwrap_or(default_name),
            chat_template: self.chat_template.clone(),
            host: self.host.clone(),
            port: self.port,
            max_model_len: self.max_model_len,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            admission: self.admission_policy,
            max_num_queued_reqs: self.max_num_queued_reqs,
            max_num_queued_tokens: self.max_num_queued_tokens,
            prefix_cache: PrefixCaching {
                enabled: self.prefix_caching(),
                snapshot_interval: self.prefix_cache_snapshot_interval,
                snapshot_before_last_token: self.prefix_cache_snapshot_before_last_token,
                in_step_snapshots: !self.no_prefix_cache_in_step_snapshots,
            },
            max_request_bytes: self.max_request_bytes,
            max_constraint_bytes: self.max_constraint_bytes,
            connections: ConnectionLimits {
                max_connections: self.limit_concurrency,
                header_read_timeout: Some(self.header_read_timeout).filter(|t| !t.is_zero()),
                keep_alive_timeout: Some(self.timeout_keep_alive).filter(|t| !t.is_zero()),
            },
            sse_keepalive: (self.sse_keepalive_secs > 0)
                .then(|| Duration::from_secs(self.sse_keepalive_secs)),
            request_timeline: self.request_timeline,
            shutdown_timeout: Duration::from_secs(self.shutdown_timeout),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qwen35::engine_exec::CacheRoom;

    fn parse(args: &[&str]) -> Args {
        Args::try_parse_from([&["gdn-server"], args].concat()).unwrap()
    }

    #[test]
    fn the_flags_defaults_are_gdn_https_defaults() {
        let (dir, name) = (PathBuf::from("/m"), "m".to_string());
        assert_eq!(
            parse(&[]).serve_config(dir.clone(), name.clone()),
            ServeConfig::new(dir, name)
        );
    }

    #[test]
    fn the_state_arena_is_off_unless_turned_on() {
        assert!(!parse(&[]).state_arena);
        assert!(parse(&["--state-arena"]).state_arena);
    }

    #[test]
    fn the_admission_policy_follows_its_flag() {
        let policy = |args: &[&str]| {
            parse(args)
                .serve_config("/m".into(), "m".into())
                .engine_config(vec![], None)
                .admission
        };
        assert_eq!(policy(&[]), AdmissionPolicy::NewTokenRatio);
        for name in AdmissionPolicy::NAMES {
            assert_eq!(policy(&["--admission-policy", name]).name(), name);
        }
        let e = Args::try_parse_from(["gdn-server", "--admission-policy", "fifo"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("expected one of watermark, reserve, new-token-ratio"),
            "{e}"
        );
    }

    #[test]
    fn the_in_step_snapshot_follows_its_flag() {
        let config = |args: &[&str]| {
            parse(args)
                .serve_config("/m".into(), "m".into())
                .engine_config(vec![], None)
                .prefix_cache
        };
        assert!(config(&[]).in_step_snapshots);
        assert!(!config(&["--no-prefix-cache-in-step-snapshots"]).in_step_snapshots);
        assert!(config(&[]).enabled);
    }

    #[test]
    fn periodic_snapshots_follow_their_flag_on_page_boundaries() {
        let args = parse;
        let interval = |a: &Args| {
            a.serve_config("/m".into(), "m".into())
                .engine_config(vec![], None)
                .prefix_cache
                .snapshot_interval
        };
        assert_eq!(interval(&args(&[])), 8192);
        assert_eq!(
            interval(&args(&["--prefix-cache-snapshot-interval", "0"])),
            0
        );
        let custom = args(&["--prefix-cache-snapshot-interval", "4096"]);
        assert_eq!(interval(&custom), 4096);
        assert!(custom.check().is_ok());
        let off_page = args(&["--prefix-cache-snapshot-interval", "1000"]);
        let e = off_page.check().unwrap_err().to_string();
        assert!(e.contains("not a multiple of --block-size 64"), "{e}");
        let pages_of_16 = args(&[
            "--block-size",
            "16",
            "--prefix-cache-snapshot-interval",
            "1000",
        ]);
        assert!(pages_of_16
            .check()
            .unwrap_err()
            .to_string()
            .contains("--block-size 16"));
        assert!(args(&["--block-size", "0"]).check().is_err());
    }

    #[test]
    fn connection_limits_follow_their_flags() {
        let limits = |args: &[&str]| {
            parse(args)
                .serve_config("/m".into(), "m".into())
                .connections
        };
        let custom = limits(&[
            "--limit-concurrency",
            "64",
            "--timeout-keep-alive",
            "0.25",
            "--header-read-timeout",
            "3",
        ]);
        assert_eq!(
            custom,
            ConnectionLimits {
                max_connections: 64,
                header_read_timeout: Some(Duration::from_secs(3)),
                keep_alive_timeout: Some(Duration::from_millis(250)),
            }
        );
        let off = limits(&["--timeout-keep-alive", "0", "--header-read-timeout", "0"]);
        assert_eq!(
            (off.keep_alive_timeout, off.header_read_timeout),
            (None, None)
        );
        for bad in ["-1", "soon", "NaN"] {
            assert!(
                Args::try_parse_from(["gdn-server", "--timeout-keep-alive", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn mamba_ssm_cache_dtype_takes_vllms_values_and_refuses_others() {
        use qwen35::StateDtype;
        assert_eq!(parse(&[]).mamba_ssm_cache_dtype, StateDtypeRequest::Auto);
        for (value, want) in [
            ("auto", StateDtypeRequest::Auto),
            ("float32", StateDtypeRequest::Fixed(StateDtype::F32)),
            ("bfloat16", StateDtypeRequest::Fixed(StateDtype::Bf16)),
        ] {
            let args = parse(&["--mamba-ssm-cache-dtype", value]);
            assert_eq!(args.mamba_ssm_cache_dtype, want, "{value}");
        }
        for bad in ["float16", "bf16", "FLOAT32", ""] {
            let err = Args::try_parse_from(["gdn-server", "--mamba-ssm-cache-dtype", bad])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("--mamba-ssm-cache-dtype")
                    && err.contains("auto, float32 or bfloat16"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn gpu_memory_utilization_is_a_fraction() {
        let check = |v: &str| {
            Args::try_parse_from(["gdn-server", &format!("--gpu-memory-utilization={v}")])
                .unwrap()
                .check()
        };
        for good in ["0.9", "1", "0.05"] {
            assert!(check(good).is_ok(), "{good}");
        }
        for bad in ["1.5", "0", "-0.2", "NaN", "inf"] {
            let err = check(bad).unwrap_err().to_string();
            assert!(err.contains("(0, 1]"), "{bad}: {err}");
        }
    }

    #[test]
    fn prefix_caching_flags_and_state_budget() {
        let parse = |args: &[&str]| Args::try_parse_from([&["gdn-server"], args].concat());
        let a = parse(&[]).unwrap();
        assert!(a.prefix_caching());
        assert_eq!(a.state_budget(), StateBudget::AtMost(256));
        // The default's cap: half of what the pages and the snapshots
        // share. 10 GB holds 256 snapshots of 19 MB (4.9 GB) below half,
        // 98 of 51 MB at half; the 35B-A3B's 2,467 MiB on an 80 GB card,
        // 20 of 61 MiB instead of all of it and more.
        let ten = CacheRoom::Shared(10_000_000_000);
        assert_eq!(a.state_budget().snapshots(19_000_000, ten), 256);
        assert_eq!(a.state_budget().snapshots(51_000_000, ten), 98);
        assert_eq!(
            a.state_budget()
                .snapshots(61 << 20, CacheRoom::Shared(2_467 << 20)),
            20
        );
        // On top of a fixed KV, the share is of the sum: half means as
        // much as the KV.
        let kv = CacheRoom::FixedKv(1_000_000_000);
        assert_eq!(a.state_budget().snapshots(51_000_000, kv), 19);
        assert!(!parse(&["--no-enable-prefix-caching"])
            .unwrap()
            .prefix_caching());
        let last = ["--no-enable-prefix-caching", "--enable-prefix-caching"];
        assert!(parse(&last).unwrap().prefix_caching());
        // Snapshots inside the step unless turned off.
        assert!(!a.no_prefix_cache_in_step_snapshots);
        assert!(
            parse(&["--no-prefix-cache-in-step-snapshots"])
                .unwrap()
                .no_prefix_cache_in_step_snapshots
        );
        let b = |s: &str| {
            parse(&["--prefix-cache-state-budget", s])
                .unwrap()
                .state_budget()
        };
        assert_eq!(b("64"), StateBudget::Snapshots(64));
        assert_eq!(b("2GiB"), StateBudget::Bytes(2 << 30));
        assert_eq!(b("1.5 MB"), StateBudget::Bytes(1_500_000));
        let room = CacheRoom::Shared(10_000_000_000);
        assert_eq!(b("51MB").snapshots(51_000_000, room), 1);
        assert_eq!(b("64").snapshots(51_000_000, room), 64);
        // A share of what the pages and the snapshots divide: a quarter of
        // 10 GB is 49 snapshots of 51 MB; on top of 7.5 GB of fixed KV,
        // 2.5 GB too.
        assert_eq!(b("0.25"), StateBudget::Fraction(0.25));
        assert_eq!(b("25%"), StateBudget::Fraction(0.25));
        assert_eq!(b("25%").snapshots(51_000_000, room), 49);
        let fixed = CacheRoom::FixedKv(7_500_000_000);
        assert_eq!(b("0.25").snapshots(51_000_000, fixed), 49);
        assert_eq!(b("12.5 %").snapshots(1, CacheRoom::Shared(800)), 100);
        for bad in [
            "-3", "lots", "2TiB", "-1GB", "0.0", "1.0", "100%", "0%", "1.5", "-5%", "x%",
        ] {
            assert!(
                parse(&["--prefix-cache-state-budget", bad]).is_err(),
                "{bad}"
            );
        }
    }
}
