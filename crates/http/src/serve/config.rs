//! What to serve and how: a plain struct (the gdn-server binary fills it
//! from its flags), and the engine configuration it asks for.

use std::path::PathBuf;
use std::time::Duration;

use engine::prefix_cache::PrefixCacheConfig;
use engine::{AdmissionPolicy, ConstraintLimits, EngineConfig, StructuredOutputs};

use crate::http::ConnectionLimits;
use crate::model::ModelFiles;

#[derive(Clone, Debug, PartialEq)]
pub struct ServeConfig {
    /// A Hugging Face model directory (config.json, tokenizer.json, a chat
    /// template); the executor reads the weights from it.
    pub model_dir: PathBuf,
    /// The name clients use as `model`.
    pub served_model_name: String,
    /// A Jinja chat template file to use instead of the model's.
    pub chat_template: Option<PathBuf>,
    pub host: String,
    pub port: u16,
    /// Longest prompt + output (`None`: the model's
    /// max_position_embeddings; above it is refused).
    pub max_model_len: Option<usize>,
    /// Requests running at once.
    pub max_num_seqs: usize,
    /// Token budget of one engine step.
    pub max_num_batched_tokens: usize,
    /// How admission leaves room for the running requests' growth.
    pub admission: AdmissionPolicy,
    /// Waiting requests at most (503 beyond).
    pub max_num_queued_reqs: usize,
    /// Prompt tokens of the waiting requests at most (`None`: no limit).
    pub max_num_queued_tokens: Option<usize>,
    pub prefix_cache: PrefixCaching,
    /// Largest request body accepted (413 above it).
    pub max_request_bytes: usize,
    /// Longest schema, regex, grammar or choice list a request may
    /// constrain its output with (400 above it).
    pub max_constraint_bytes: usize,
    /// Open connections at most, and how long a connection may idle or
    /// take to send a request head.
    pub connections: ConnectionLimits,
    /// Interval of SSE keep-alive comments (`None`: none are sent).
    pub sse_keepalive: Option<Duration>,
    /// Log where each request's time to first token went.
    pub request_timeline: bool,
    /// How long in-flight requests may take to finish after SIGTERM/SIGINT.
    pub shutdown_timeout: Duration,
}

/// The prefix cache's switches (docs/prefix-caching.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixCaching {
    pub enabled: bool,
    /// Also snapshot each prompt every this many tokens (0: off).
    pub snapshot_interval: usize,
    /// Also snapshot each prompt's state before its last token.
    pub snapshot_before_last_token: bool,
    /// Take snapshots inside the step rather than at chunk boundaries.
    pub in_step_snapshots: bool,
}

impl ServeConfig {
    /// `model_dir` served as `served_model_name` with gdn-server's default
    /// flags (vLLM's defaults where vLLM has the flag).
    pub fn new(model_dir: PathBuf, served_model_name: String) -> Self {
        ServeConfig {
            model_dir,
            served_model_name,
            chat_template: None,
            host: "0.0.0.0".into(),
            port: 8000,
            max_model_len: None,
            max_num_seqs: 128,
            max_num_batched_tokens: 8192,
            admission: AdmissionPolicy::default(),
            max_num_queued_reqs: 1024,
            max_num_queued_tokens: None,
            prefix_cache: PrefixCaching {
                enabled: true,
                snapshot_interval: 8192,
                snapshot_before_last_token: false,
                in_step_snapshots: true,
            },
            max_request_bytes: 32 * 1024 * 1024,
            max_constraint_bytes: crate::openai::validate::DEFAULT_MAX_CONSTRAINT_BYTES,
            connections: ConnectionLimits::default(),
            sse_keepalive: Some(Duration::from_secs(15)),
            request_timeline: false,
            shutdown_timeout: Duration::from_secs(30),
        }
    }

    /// The engine limits this asks for, from the EOS ids alone (before the
    /// tokenizer loads) and the model's max_position_embeddings.
    pub fn engine_config(
        &self,
        eos_token_ids: Vec<u32>,
        model_max_len: Option<usize>,
    ) -> EngineConfig {
        let mut config = EngineConfig::new(eos_token_ids);
        config.max_num_batched_tokens = self.max_num_batched_tokens;
        config.max_num_seqs = self.max_num_seqs;
        config.admission = self.admission;
        config.max_num_queued_reqs = self.max_num_queued_reqs;
        config.max_num_queued_tokens = self.max_num_queued_tokens.unwrap_or(usize::MAX);
        config.request_timeline = self.request_timeline;
        if let Some(len) = self.max_model_len.or(model_max_len) {
            config.max_model_len = len;
        }
        config.prefix_cache = PrefixCacheConfig {
            enabled: self.prefix_cache.enabled,
            // The executor's pool, sized by the binary's state budget, caps it.
            max_snapshots: usize::MAX,
            // Set once the tokenizer has loaded (see `prepare`).
            snapshot_after: Vec::new(),
            snapshot_interval: self.prefix_cache.snapshot_interval,
            snapshot_before_last_token: self.prefix_cache.snapshot_before_last_token,
            in_step_snapshots: self.prefix_cache.in_step_snapshots,
        };
        config
    }
}

/// The engine limits `config` asks for, with the chat snapshot markers of
/// `model`'s tokenizer.
pub fn engine_config(
    config: &ServeConfig,
    model: &ModelFiles,
    model_max_len: Option<usize>,
) -> EngineConfig {
    let mut engine = config.engine_config(model.eos_token_ids.clone(), model_max_len);
    engine.prefix_cache.snapshot_after = chat_snapshot_markers(model);
    engine.structured_outputs = structured_outputs(&model.dir, &model.eos_token_ids);
    engine
}

/// The engine's compiler of structured-output constraints over the
/// model's tokenizer.json, read on a thread of its own (a 248k vocabulary
/// takes over a second: the server's start does not wait for it; the first
/// constrained request does). A vocabulary llguidance cannot read is
/// logged, and constrained requests then get a 400.
pub(super) fn structured_outputs(
    dir: &std::path::Path,
    eos_token_ids: &[u32],
) -> Option<StructuredOutputs> {
    Some(StructuredOutputs::spawn_from_tokenizer_file(
        dir.join("tokenizer.json"),
        eos_token_ids.to_vec(),
        ConstraintLimits::default(),
    ))
}

/// Where a chat prompt's state is worth keeping: right after the final
/// `<|im_start|>assistant\n`. The Qwen3.5 template re-renders earlier
/// assistant turns without their `<think>` block, so the next turn's
/// prompt leaves this one exactly there (docs/prefix-caching.md).
pub(super) fn chat_snapshot_markers(model: &ModelFiles) -> Vec<Vec<u32>> {
    match model.encode("<|im_start|>assistant\n", false) {
        Ok(ids) if !ids.is_empty() => vec![ids],
        _ => Vec::new(),
    }
}

/// `max_position_embeddings` of config.json (or its text_config).
pub(super) fn model_max_position_embeddings(dir: &std::path::Path) -> Option<usize> {
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).ok()?).ok()?;
    let text = config.get("text_config").unwrap_or(&config);
    text.get("max_position_embeddings")
        .or_else(|| config.get("max_position_embeddings"))
        .and_then(|v| v.as_u64())
        .map(|v| v as usize)
}
