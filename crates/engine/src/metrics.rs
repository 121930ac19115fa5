//! The engine's Prometheus series, under vLLM's names verbatim (so
//! dashboards, autoscalers and benchmark scrapers work unchanged) plus the
//! `gdn:` ones vLLM has no name for. Registered into the caller's registry;
//! a `model_name` label, as vLLM puts on every series, is the registry's
//! business (`Registry::new_custom` with constant labels).

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::executor::StateGeometry;

/// vLLM's request-latency buckets (`v1/metrics/loggers.py`).
const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// vLLM's time-to-first-token buckets.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's inter-token-latency buckets.
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// Mask times: tens of microseconds for most grammars, milliseconds for
/// a hard step of a large one.
const MASK_BUCKETS: &[f64] = &[
    0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0,
];
/// Step times: a GPU decode step is milliseconds, a long prefill chunk on
/// the CPU seconds.
const STEP_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.0, 4.0,
    8.0, 16.0,
];
const TOKENS_PER_STEP_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
    16384.0,
];

#[derive(Clone)]
pub struct Metrics {
    pub num_requests_running: IntGauge,
    pub num_requests_waiting: IntGauge,
    pub kv_cache_usage_perc: prometheus::Gauge,
    pub prompt_tokens: IntCounter,
    pub generation_tokens: IntCounter,
    pub num_preemptions: IntCounter,
    pub recomputed_tokens: IntCounter,
    /// Label `finished_reason`: stop, length, abort, error (vLLM's values).
    pub request_success: IntCounterVec,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub e2e_request_latency: Histogram,
    pub request_queue_time: Histogram,
    pub request_prefill_time: Histogram,
    pub request_decode_time: Histogram,
    pub state_slots_used: IntGauge,
    pub state_slots_total: IntGauge,
    /// Label `dtype` (`float32`, `bfloat16`): the recurrent state of every
    /// slot, and of one slot, in bytes (set once the executor is up).
    pub recurrent_state_bytes: IntGaugeVec,
    pub recurrent_state_slot_bytes: IntGaugeVec,
    pub cache_pool_bytes: IntGauge,
    pub max_concurrency: prometheus::Gauge,
    pub step_duration: Histogram,
    pub tokens_per_step: Histogram,
    pub requests_aborted: IntCounter,
    /// Prefix cache (vLLM's two counters, in tokens, then ours).
    pub prefix_cache_queries: IntCounter,
    pub prefix_cache_hits: IntCounter,
    pub snapshot_hits: IntCounter,
    pub snapshot_misses: IntCounter,
    pub snapshots_taken: IntCounter,
    pub snapshot_evictions: IntCounter,
    pub kv_only_unusable: IntCounter,
    pub kv_only_unusable_tokens: IntCounter,
    pub branch_points: IntCounter,
    pub snapshots: IntGauge,
    pub snapshot_bytes: IntGauge,
    pub prefix_cache_pages: IntGauge,
    /// Structured outputs: steps with a constrained sampling row, masks
    /// computed, masks a sampler had to wait for, steps that waited for
    /// at least one, and the time of each mask on the pool.
    pub structured_output_steps: IntCounter,
    pub structured_output_masks: IntCounter,
    pub structured_output_mask_waits: IntCounter,
    pub structured_output_steps_waited: IntCounter,
    pub structured_output_mask_seconds: Histogram,
    pub structured_output_steps_late: IntCounter,
    pub structured_output_wait_seconds: Histogram,
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
) -> prometheus::Result<Histogram> {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))?;
    registry.register(Box::new(h.clone()))?;
    Ok(h)
}

fn int_gauge(registry: &Registry, name: &str, help: &str) -> prometheus::Result<IntGauge> {
    let g = IntGauge::new(name, help)?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

fn int_gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntGaugeVec> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

fn int_counter(registry: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounter> {
    let c = IntCounter::new(name, help)?;
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}

impl Metrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Metrics> {
        let kv_cache_usage_perc = prometheus::Gauge::new(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
        )?;
        registry.register(Box::new(kv_cache_usage_perc.clone()))?;
        let max_concurrency = prometheus::Gauge::new(
            "gdn:max_concurrency",
            "Requests of max_model_len tokens the KV pages and state slots hold at once (vLLM logs it as 'Maximum concurrency').",
        )?;
        registry.register(Box::new(max_concurrency.clone()))?;
        let request_success = IntCounterVec::new(
            Opts::new(
                "vllm:request_success_total",
                "Count of finished requests by finish reason.",
            ),
            &["finished_reason"],
        )?;
        registry.register(Box::new(request_success.clone()))?;
        // Make every reason visible from the start, as vLLM does.
        for reason in ["stop", "length", "abort", "error"] {
            request_success.with_label_values(&[reason]);
        }
        Ok(Metrics {
            num_requests_running: int_gauge(
                registry,
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
            )?,
            num_requests_waiting: int_gauge(
                registry,
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
            )?,
            kv_cache_usage_perc,
            prompt_tokens: int_counter(
                registry,
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
            )?,
            generation_tokens: int_counter(
                registry,
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
            )?,
            num_preemptions: int_counter(
                registry,
                "vllm:num_preemptions_total",
                "Cumulative number of preemptions from the engine.",
            )?,
            recomputed_tokens: int_counter(
                registry,
                "gdn:recomputed_tokens_total",
                "Tokens computed a second time because their request was preempted (readmission past its prefix-cache hit).",
            )?,
            request_success,
            time_to_first_token: histogram(
                registry,
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                TTFT_BUCKETS,
            )?,
            inter_token_latency: histogram(
                registry,
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                ITL_BUCKETS,
            )?,
            e2e_request_latency: histogram(
                registry,
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                REQUEST_LATENCY_BUCKETS,
            )?,
            request_queue_time: histogram(
                registry,
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                REQUEST_LATENCY_BUCKETS,
            )?,
            request_prefill_time: histogram(
                registry,
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                REQUEST_LATENCY_BUCKETS,
            )?,
            request_decode_time: histogram(
                registry,
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                REQUEST_LATENCY_BUCKETS,
            )?,
            state_slots_used: int_gauge(
                registry,
                "gdn:state_slots_used",
                "Recurrent-state slots held by requests.",
            )?,
            state_slots_total: int_gauge(
                registry,
                "gdn:state_slots_total",
                "Recurrent-state slots of the executor.",
            )?,
            recurrent_state_bytes: int_gauge_vec(
                registry,
                "gdn:recurrent_state_bytes",
                "Bytes of the DeltaNet recurrent state of every slot, by storage dtype.",
                &["dtype"],
            )?,
            recurrent_state_slot_bytes: int_gauge_vec(
                registry,
                "gdn:recurrent_state_slot_bytes",
                "Bytes of one slot's DeltaNet recurrent state, by storage dtype.",
                &["dtype"],
            )?,
            cache_pool_bytes: int_gauge(
                registry,
                "gdn:cache_pool_bytes",
                "Device bytes of the KV pages and the state slots requests run in (prefix-cache snapshots not included).",
            )?,
            max_concurrency,
            step_duration: histogram(
                registry,
                "gdn:step_duration_seconds",
                "Duration of one engine step (one forward) in seconds.",
                STEP_BUCKETS,
            )?,
            tokens_per_step: histogram(
                registry,
                "gdn:tokens_per_step",
                "Tokens (prefill and decode) run in one engine step.",
                TOKENS_PER_STEP_BUCKETS,
            )?,
            requests_aborted: int_counter(
                registry,
                "gdn:requests_aborted_total",
                "Requests aborted because their stream was dropped (client gone).",
            )?,
            prefix_cache_queries: int_counter(
                registry,
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
            )?,
            prefix_cache_hits: int_counter(
                registry,
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
            )?,
            snapshot_hits: int_counter(
                registry,
                "gdn:prefix_cache_snapshot_hits_total",
                "First admissions that resumed from a state snapshot.",
            )?,
            snapshot_misses: int_counter(
                registry,
                "gdn:prefix_cache_snapshot_misses_total",
                "First admissions that found no usable state snapshot.",
            )?,
            snapshots_taken: int_counter(
                registry,
                "gdn:prefix_cache_snapshots_taken_total",
                "Recurrent-state snapshots taken into the snapshot pool.",
            )?,
            snapshot_evictions: int_counter(
                registry,
                "gdn:prefix_cache_snapshot_evictions_total",
                "Recurrent-state snapshots evicted (budget or page pressure).",
            )?,
            kv_only_unusable: int_counter(
                registry,
                "gdn:prefix_cache_kv_only_hits_unusable_total",
                "Lookups whose KV match ran at least a page past the last snapshot (the KV beyond it was recomputed).",
            )?,
            kv_only_unusable_tokens: int_counter(
                registry,
                "gdn:prefix_cache_kv_only_unusable_tokens_total",
                "Tokens of KV matched beyond the last usable snapshot (recomputed for want of a state).",
            )?,
            branch_points: int_counter(
                registry,
                "gdn:prefix_cache_branch_points_total",
                "Branch points set: shared prefixes without a snapshot where a prefill stops to take one.",
            )?,
            snapshots: int_gauge(
                registry,
                "gdn:prefix_cache_snapshots",
                "Recurrent-state snapshots held by the prefix cache.",
            )?,
            snapshot_bytes: int_gauge(
                registry,
                "gdn:prefix_cache_snapshot_bytes",
                "Bytes of the recurrent-state snapshots held by the prefix cache.",
            )?,
            prefix_cache_pages: int_gauge(
                registry,
                "gdn:prefix_cache_pages",
                "Holds of the prefix cache on KV pages (a page may also be held by running requests).",
            )?,
            structured_output_steps: int_counter(
                registry,
                "gdn:structured_output_steps_total",
                "Steps with at least one constrained (structured-output) row sampling.",
            )?,
            structured_output_masks: int_counter(
                registry,
                "gdn:structured_output_masks_total",
                "Token masks computed for constrained rows.",
            )?,
            structured_output_mask_waits: int_counter(
                registry,
                "gdn:structured_output_mask_waits_total",
                "Token masks not ready when the sampler asked for them (it blocked, perhaps while the device still ran the forward).",
            )?,
            structured_output_steps_waited: int_counter(
                registry,
                "gdn:structured_output_steps_waited_total",
                "Steps whose sampler blocked for at least one token mask.",
            )?,
            structured_output_steps_late: int_counter(
                registry,
                "gdn:structured_output_steps_late_total",
                "Steps delayed by a token mask: it arrived after the device had finished the forward.",
            )?,
            structured_output_wait_seconds: histogram(
                registry,
                "gdn:structured_output_wait_seconds",
                "Time a step's sampler blocked for its token masks (steps that blocked).",
                MASK_BUCKETS,
            )?,
            structured_output_mask_seconds: histogram(
                registry,
                "gdn:structured_output_mask_seconds",
                "Time to compute one token mask on the mask pool.",
                MASK_BUCKETS,
            )?,
        })
    }

    /// The recurrent state's bytes (every slot's and one slot's), under the
    /// executor's storage dtype; nothing where the executor does not say.
    pub fn set_state_geometry(&self, state: &StateGeometry, num_slots: usize) {
        if state.recurrent_dtype.is_empty() {
            return;
        }
        let dtype = [state.recurrent_dtype];
        let per_slot = state.recurrent_bytes_per_slot;
        self.recurrent_state_bytes
            .with_label_values(&dtype)
            .set((per_slot * num_slots) as i64);
        self.recurrent_state_slot_bytes
            .with_label_values(&dtype)
            .set(per_slot as i64);
    }
}
