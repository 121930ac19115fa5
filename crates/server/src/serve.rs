//! Starting the engine, serving HTTP, and the graceful shutdown: on
//! SIGTERM/SIGINT new work gets 503, the engine drains its requests within
//! `--shutdown-timeout`, then the listener closes. When the engine stops on
//! its own (the model failed to load, the executor lost its device, or the
//! engine thread panicked) the server closes too and the program exits with
//! the reason and status 1: nothing could be served any more, and a
//! supervisor should restart it. (A step that fails without losing the
//! device fails only its requests; the engine goes on.)

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use engine::prefix_cache::PrefixCacheConfig;
use engine::{Engine, EngineConfig, Executor};
use tokio::net::TcpListener;

use crate::app::{router, unix_now, AppState, ServerMetrics};
use crate::cli::Args;
use crate::model::{configured_eos_ids, ModelFiles};
use crate::startup::Startup;

/// Builds the engine's executor on the engine thread.
pub type ExecutorFactory = Box<dyn FnOnce() -> Result<Box<dyn Executor>, String> + Send + 'static>;

/// The engine limits the flags ask for.
pub fn engine_config(
    args: &Args,
    model: &ModelFiles,
    model_max_len: Option<usize>,
) -> EngineConfig {
    let mut config = engine_config_for(args, model.eos_token_ids.clone(), model_max_len);
    config.prefix_cache.snapshot_after = chat_snapshot_markers(model);
    config
}

/// [`engine_config`] from the EOS ids alone (before the tokenizer loads).
fn engine_config_for(
    args: &Args,
    eos_token_ids: Vec<u32>,
    model_max_len: Option<usize>,
) -> EngineConfig {
    let mut config = EngineConfig::new(eos_token_ids);
    config.max_num_batched_tokens = args.max_num_batched_tokens;
    config.max_num_seqs = args.max_num_seqs;
    config.max_num_queued_reqs = args.max_num_queued_reqs;
    config.max_num_queued_tokens = args.max_num_queued_tokens.unwrap_or(usize::MAX);
    config.request_timeline = args.request_timeline;
    if let Some(len) = args.max_model_len.or(model_max_len) {
        config.max_model_len = len;
    }
    config.prefix_cache = PrefixCacheConfig {
        enabled: args.prefix_caching(),
        // The executor's pool, sized from --prefix-cache-state-budget, caps it.
        max_snapshots: usize::MAX,
        // Set once the tokenizer has loaded (see `prepare`).
        snapshot_after: Vec::new(),
        snapshot_interval: args.prefix_cache_snapshot_interval,
        snapshot_before_last_token: args.prefix_cache_snapshot_before_last_token,
        in_step_snapshots: !args.no_prefix_cache_in_step_snapshots,
    };
    config
}

/// Where a chat prompt's state is worth keeping: right after the final
/// `<|im_start|>assistant\n`. The Qwen3.5 template re-renders earlier
/// assistant turns without their `<think>` block, so the next turn's
/// prompt leaves this one exactly there (docs/prefix-caching.md).
fn chat_snapshot_markers(model: &ModelFiles) -> Vec<Vec<u32>> {
    match model.encode("<|im_start|>assistant\n", false) {
        Ok(ids) if !ids.is_empty() => vec![ids],
        _ => Vec::new(),
    }
}

/// Starts the engine and builds the shared state (the engine loads the
/// model in the background; `/health` is 503 until it is ready).
pub fn start(
    args: &Args,
    model: ModelFiles,
    served_model_name: String,
    config: EngineConfig,
    make_executor: ExecutorFactory,
) -> Result<Arc<AppState>, String> {
    let registry = prometheus::Registry::new();
    let engine = Engine::start(config, make_executor, &registry).map_err(|e| e.to_string())?;
    state_of(
        args,
        model,
        served_model_name,
        engine,
        registry,
        Startup::new(),
    )
}

/// The shared state over a started engine.
fn state_of(
    args: &Args,
    model: ModelFiles,
    served_model_name: String,
    engine: engine::EngineHandle,
    registry: prometheus::Registry,
    startup: Arc<Startup>,
) -> Result<Arc<AppState>, String> {
    let metrics = ServerMetrics::register(&registry)
        .map_err(|e| format!("registering server metrics: {e}"))?;
    startup
        .register(&registry)
        .map_err(|e| format!("registering start-up metrics: {e}"))?;
    Ok(Arc::new(AppState {
        engine,
        model,
        served_model_name,
        max_request_bytes: args.max_request_bytes,
        sse_keepalive: (args.sse_keepalive_secs > 0)
            .then(|| std::time::Duration::from_secs(args.sse_keepalive_secs)),
        request_timeline: args.request_timeline,
        prefix_caching: args.prefix_caching(),
        registry,
        metrics,
        draining: Default::default(),
        created: unix_now(),
        startup,
    }))
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
}

/// Why [`serve`] returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServeEnd {
    /// SIGTERM/SIGINT: drained and stopped as asked.
    Signal,
    /// The engine stopped on its own; the reason.
    EngineStopped(String),
}

/// Serves until a shutdown signal, then drains; or until the engine stops
/// on its own. The listener stays open while draining so new requests get
/// a clear 503 rather than a refused connection. Either way the responses
/// in flight finish first (after an engine stop, with their error events).
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    drain_deadline: Duration,
) -> std::io::Result<ServeEnd> {
    let app = router(state.clone());
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    let drain_state = state.clone();
    let ended = tokio::spawn(async move {
        let signalled = tokio::select! {
            _ = shutdown_signal() => true,
            _ = drain_state.engine.stopped() => false,
        };
        drain_state.draining.store(true, Ordering::SeqCst);
        let end = if signalled {
            log::info!("shutdown: refusing new work, draining for up to {drain_deadline:?}");
            drain_state.engine.shutdown(drain_deadline).await;
            log::info!("shutdown: engine stopped");
            ServeEnd::Signal
        } else {
            let why = match drain_state.engine.state() {
                engine::EngineState::Dead(why) => why,
                other => format!("the engine thread ended ({other:?})"),
            };
            log::error!("the engine stopped ({why}); closing the server");
            ServeEnd::EngineStopped(why)
        };
        let _ = closed_tx.send(());
        end
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = closed_rx.await;
        })
        .await?;
    Ok(ended
        .await
        .unwrap_or_else(|e| ServeEnd::EngineStopped(format!("the shutdown task failed: {e}"))))
}

/// Picks and builds the executor for `--device` over a model directory
/// (recording its load phases in the [`Startup`]).
pub type ExecutorPicker =
    fn(&Args, &std::path::Path, usize, Arc<Startup>) -> Result<ExecutorFactory, String>;

/// A started server before it listens: the state the router serves, the
/// served name, and the unpacked demo directory (removed on drop).
pub struct Prepared {
    pub state: Arc<AppState>,
    pub name: String,
    pub demo_dir: Option<tempfile::TempDir>,
}

/// Loads the model files (the demo without --model) and starts the engine
/// with the picked executor; the model loads in the background. Where the
/// configs name the EOS ids, the tokenizer and chat template load on this
/// thread while the engine thread loads the weights (otherwise the EOS id
/// comes from the tokenizer, which then loads first).
pub fn prepare(args: &Args, pick_executor: ExecutorPicker) -> Result<Prepared, String> {
    args.check()?;
    let startup = Startup::new();
    let mut demo_dir = None;
    let (dir, default_name) = match &args.model {
        Some(dir) => (dir.clone(), dir.display().to_string()),
        None => {
            eprintln!("{}", crate::demo::BANNER);
            let unpacked = startup
                .time("demo_unpack", crate::demo::unpack)
                .map_err(|e| format!("unpacking the demo model: {e}"))?;
            let dir = unpacked.path().to_path_buf();
            demo_dir = Some(unpacked);
            (dir, crate::demo::DEMO_MODEL_NAME.to_string())
        }
    };
    let template = args.chat_template.as_deref();
    let model_max_len = model_max_position_embeddings(&dir);
    if let (Some(asked), Some(model)) = (args.max_model_len, model_max_len) {
        if asked > model {
            return Err(format!(
                "--max-model-len {asked} is above the model's max_position_embeddings ({model}, its config.json): positions beyond it are not what the model was trained on"
            ));
        }
    }
    let eos = startup.time("model_config", || configured_eos_ids(&dir))?;
    let mut model = None;
    if eos.is_empty() {
        model = Some(ModelFiles::load_timed(&dir, template, &startup)?);
    }
    let eos = model.as_ref().map_or(eos, |m| m.eos_token_ids.clone());
    let config = engine_config_for(args, eos, model_max_len);
    // At most the model's max_position_embeddings (refused above).
    let make_executor = pick_executor(args, &dir, config.max_model_len, startup.clone())?;
    let name = args.served_model_name.clone().unwrap_or(default_name);
    let registry = prometheus::Registry::new();
    let engine = Engine::start(config, make_executor, &registry).map_err(|e| e.to_string())?;
    let model = match model {
        Some(model) => model,
        None => ModelFiles::load_timed(&dir, template, &startup)?,
    };
    // Before any request can reach the engine (the app state is built below).
    engine.set_snapshot_markers(chat_snapshot_markers(&model));
    let state = state_of(args, model, name.clone(), engine, registry, startup)?;
    Ok(Prepared {
        state,
        name,
        demo_dir,
    })
}

/// Logs the start-up summary line once the engine is ready (nothing if it
/// fails to load: the engine logs why).
async fn report_startup(state: Arc<AppState>) {
    loop {
        match state.engine.state() {
            engine::EngineState::Loading => {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            engine::EngineState::Ready => {
                log::info!("{}", state.startup.ready());
                return;
            }
            _ => return,
        }
    }
}

/// The whole program: [`prepare`], serve, drain on a signal.
pub async fn run_main(args: Args, pick_executor: ExecutorPicker) -> Result<(), String> {
    let prepared = prepare(&args, pick_executor)?;
    let name = &prepared.name;
    let addr = format!("{}:{}", args.host, args.port);
    let bind_start = std::time::Instant::now();
    let listener = TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("binding {addr}: {e}"))?;
    prepared.state.startup.record("bind", bind_start.elapsed());
    tokio::spawn(report_startup(prepared.state.clone()));
    log::info!(
        "serving `{name}` on http://{} (loading the model; /health turns 200 when ready)",
        listener.local_addr().map(|a| a.to_string()).unwrap_or(addr)
    );
    let end = serve(
        listener,
        prepared.state.clone(),
        Duration::from_secs(args.shutdown_timeout),
    )
    .await
    .map_err(|e| format!("server error: {e}"))?;
    // The demo directory (if any) is removed when `prepared` drops here.
    drop(prepared);
    match end {
        ServeEnd::Signal => Ok(()),
        ServeEnd::EngineStopped(why) => Err(format!("the engine stopped: {why}")),
    }
}

/// `max_position_embeddings` of config.json (or its text_config).
fn model_max_position_embeddings(dir: &std::path::Path) -> Option<usize> {
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).ok()?).ok()?;
    let text = config.get("text_config").unwrap_or(&config);
    text.get("max_position_embeddings")
        .or_else(|| config.get("max_position_embeddings"))
        .and_then(|v| v.as_u64())
        .map(|v| v as usize)
}

/// A minimal stderr logger (info and above; `GDN_LOG=debug` for more).
pub fn init_logging() {
    struct StderrLogger;
    impl log::Log for StderrLogger {
        fn enabled(&self, metadata: &log::Metadata) -> bool {
            metadata.level() <= log::max_level()
        }
        fn log(&self, record: &log::Record) {
            if self.enabled(record.metadata()) {
                eprintln!("[{} {}] {}", record.level(), record.target(), record.args());
            }
        }
        fn flush(&self) {}
    }
    static LOGGER: StderrLogger = StderrLogger;
    let level = match std::env::var("GDN_LOG").as_deref() {
        Ok("debug") => log::LevelFilter::Debug,
        Ok("warn") => log::LevelFilter::Warn,
        _ => log::LevelFilter::Info,
    };
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn the_in_step_snapshot_follows_its_flag() {
        let config = |args: &[&str]| {
            let args = Args::try_parse_from([&["gdn-server"], args].concat()).unwrap();
            engine_config_for(&args, vec![], None).prefix_cache
        };
        assert!(config(&[]).in_step_snapshots);
        assert!(!config(&["--no-prefix-cache-in-step-snapshots"]).in_step_snapshots);
        assert!(config(&[]).enabled);
    }

    #[test]
    fn periodic_snapshots_follow_their_flag_on_page_boundaries() {
        let args =
            |extra: &[&str]| Args::try_parse_from([&["gdn-server"], extra].concat()).unwrap();
        let interval = |a: &Args| {
            engine_config_for(a, vec![], None)
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
        let e = off_page.check().unwrap_err();
        assert!(e.contains("not a multiple of --block-size 64"), "{e}");
        let pages_of_16 = args(&[
            "--block-size",
            "16",
            "--prefix-cache-snapshot-interval",
            "1000",
        ]);
        assert!(pages_of_16.check().unwrap_err().contains("--block-size 16"));
        assert!(args(&["--block-size", "0"]).check().is_err());
    }
}
