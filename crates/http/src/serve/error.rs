//! Why serving could not start, or ended on its own.

use engine::EngineStartError;

use crate::model::ModelError;

/// `30 s`, `0.5 s`.
fn seconds(d: std::time::Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// An error of any source (what an executor factory or picker returns).
pub use engine::BoxError;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("--max-model-len {asked} is above the model's max_position_embeddings ({model}, its config.json): positions beyond it are not what the model was trained on")]
    MaxModelLenAboveModel { asked: usize, model: usize },
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The executor picker refused (its own message).
    #[error("{0}")]
    Executor(BoxError),
    #[error(transparent)]
    EngineStart(#[from] EngineStartError),
    #[error("registering server metrics: {0}")]
    ServerMetrics(prometheus::Error),
    #[error("registering start-up metrics: {0}")]
    StartupMetrics(prometheus::Error),
    #[error("binding {addr}: {error}")]
    Bind { addr: String, error: std::io::Error },
    /// The engine stopped on its own (the model failed to load, the
    /// executor lost its device, the engine thread panicked): the reason.
    #[error("the engine stopped: {0}")]
    EngineStopped(String),
    /// SIGTERM/SIGINT, and the drain deadline passed with requests still
    /// running: they got an error instead of their output.
    #[error("the drain deadline ({}, --shutdown-timeout) cut off {cut_off} requests", seconds(*.deadline))]
    DrainCutOff {
        cut_off: usize,
        deadline: std::time::Duration,
    },
}
