//! Serving a model: [`prepare`] loads its text side (tokenizer, chat
//! template) and starts the engine over the executor the caller builds;
//! [`run`] binds, serves, and drains on a signal ([`serve`]). When the
//! engine stops on its own (the model failed to load, the executor lost its
//! device, or the engine thread panicked) the server closes too and [`run`]
//! returns the reason: nothing could be served any more, and a supervisor
//! should restart the program. (A step that fails without losing the device
//! fails only its requests; the engine goes on.)

mod config;
mod error;
mod lifecycle;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use engine::{Engine, EngineConfig, EngineHandle, Executor};
use tokio::net::TcpListener;

use crate::api::state::{AppState, ServerMetrics};
use crate::model::{configured_eos_ids, ModelFiles};
use crate::openai::response::unix_now;
use crate::startup::Startup;
use config::{chat_snapshot_markers, model_max_position_embeddings};
use lifecycle::report_startup;

pub use config::{engine_config, PrefixCaching, ServeConfig};
pub use error::{BoxError, ServeError};
pub use lifecycle::{serve, ServeEnd};

/// Builds the engine's executor on the engine thread (CUDA contexts are
/// created there).
pub type ExecutorFactory =
    Box<dyn FnOnce() -> Result<Box<dyn Executor>, BoxError> + Send + 'static>;

/// What the executor is built for: known once the model's config is read.
pub struct ExecutorSpec<'a> {
    pub model_dir: &'a Path,
    /// The engine's context length (`usize::MAX`: neither the config nor
    /// the model sets one).
    pub max_model_len: usize,
    /// Where the executor records its load phases.
    pub startup: Arc<Startup>,
}

/// Starts the engine over `make_executor` and builds the shared state (the
/// engine loads the model in the background; `/health` is 503 until it is
/// ready).
pub fn start(
    config: &ServeConfig,
    model: ModelFiles,
    engine_config: EngineConfig,
    make_executor: ExecutorFactory,
) -> Result<Arc<AppState>, ServeError> {
    let registry = prometheus::Registry::new();
    let engine = start_engine(engine_config, make_executor, &registry)?;
    state_of(config, model, engine, registry, Startup::new())
}

/// The engine over the executor `make_executor` builds (whose failure the
/// engine reports as the reason it stopped).
fn start_engine(
    engine_config: EngineConfig,
    make_executor: ExecutorFactory,
    registry: &prometheus::Registry,
) -> Result<EngineHandle, ServeError> {
    Ok(Engine::start(engine_config, make_executor, registry)?)
}

/// The shared state over a started engine.
fn state_of(
    config: &ServeConfig,
    model: ModelFiles,
    engine: EngineHandle,
    registry: prometheus::Registry,
    startup: Arc<Startup>,
) -> Result<Arc<AppState>, ServeError> {
    let metrics = ServerMetrics::register(&registry).map_err(ServeError::ServerMetrics)?;
    startup
        .register(&registry)
        .map_err(ServeError::StartupMetrics)?;
    Ok(Arc::new(AppState {
        engine,
        model,
        served_model_name: config.served_model_name.clone(),
        max_request_bytes: config.max_request_bytes,
        max_constraint_bytes: config.max_constraint_bytes,
        sse_keepalive: config.sse_keepalive,
        request_timeline: config.request_timeline,
        prefix_caching: config.prefix_cache.enabled,
        registry,
        metrics,
        draining: Default::default(),
        created: unix_now(),
        startup,
        responses: Default::default(),
    }))
}

/// Loads the model's text side and starts the engine with the executor
/// `pick_executor` builds; the model loads in the background. Where the
/// configs name the EOS ids, the tokenizer and chat template load on this
/// thread while the engine thread loads the weights (otherwise the EOS id
/// comes from the tokenizer, which then loads first).
pub fn prepare<P>(
    config: &ServeConfig,
    startup: Arc<Startup>,
    pick_executor: P,
) -> Result<Arc<AppState>, ServeError>
where
    P: FnOnce(ExecutorSpec<'_>) -> Result<ExecutorFactory, BoxError>,
{
    let dir = &config.model_dir;
    let template = config.chat_template.as_deref();
    let model_max_len = model_max_position_embeddings(dir);
    if let (Some(asked), Some(model)) = (config.max_model_len, model_max_len) {
        if asked > model {
            return Err(ServeError::MaxModelLenAboveModel { asked, model });
        }
    }
    let eos = startup.time("model_config", || configured_eos_ids(dir))?;
    let mut model = None;
    if eos.is_empty() {
        model = Some(ModelFiles::load_timed(dir, template, &startup)?);
    }
    let eos = model.as_ref().map_or(eos, |m| m.eos_token_ids.clone());
    let mut engine_config = config.engine_config(eos, model_max_len);
    engine_config.structured_outputs = startup.time("structured_outputs", || {
        config::structured_outputs(dir, &engine_config.eos_token_ids)
    });
    // At most the model's max_position_embeddings (refused above).
    let make_executor = pick_executor(ExecutorSpec {
        model_dir: dir,
        max_model_len: engine_config.max_model_len,
        startup: startup.clone(),
    })
    .map_err(ServeError::Executor)?;
    let registry = prometheus::Registry::new();
    let engine = start_engine(engine_config, make_executor, &registry)?;
    let model = match model {
        Some(model) => model,
        None => ModelFiles::load_timed(dir, template, &startup)?,
    };
    // Before any request can reach the engine (the app state is built below).
    engine.set_snapshot_markers(chat_snapshot_markers(&model));
    state_of(config, model, engine, registry, startup)
}

/// [`prepare`], bind, serve, drain on a signal. `Err` when the server could
/// not start or the engine stopped on its own.
pub async fn run<P>(
    config: ServeConfig,
    startup: Arc<Startup>,
    pick_executor: P,
) -> Result<(), ServeError>
where
    P: FnOnce(ExecutorSpec<'_>) -> Result<ExecutorFactory, BoxError>,
{
    let state = prepare(&config, startup, pick_executor)?;
    let name = &config.served_model_name;
    let addr = format!("{}:{}", config.host, config.port);
    let bind_start = Instant::now();
    let listener = TcpListener::bind(&addr)
        .await
        .map_err(|error| ServeError::Bind {
            addr: addr.clone(),
            error,
        })?;
    state.startup.record("bind", bind_start.elapsed());
    tokio::spawn(report_startup(state.clone()));
    log::info!(
        "serving `{name}` on http://{} (loading the model; /health turns 200 when ready)",
        listener.local_addr().map(|a| a.to_string()).unwrap_or(addr)
    );
    match serve(listener, state, config.connections, config.shutdown_timeout).await {
        ServeEnd::Signal { cut_off: 0 } => Ok(()),
        ServeEnd::Signal { cut_off } => Err(ServeError::DrainCutOff {
            cut_off,
            deadline: config.shutdown_timeout,
        }),
        ServeEnd::EngineStopped(why) => Err(ServeError::EngineStopped(why)),
    }
}
