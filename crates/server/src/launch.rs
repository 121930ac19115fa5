//! From flags to a served model: check the flags, unpack the embedded demo
//! when no --model is given, and hand gdn-http the serve configuration with
//! the executor picker.

use std::sync::Arc;

use gdn_http::api::AppState;
use gdn_http::serve::{ExecutorFactory, ExecutorSpec, ServeConfig, ServeError};
use gdn_http::startup::Startup;

use crate::cli::{Args, FlagError};
use crate::executor::ExecutorError;
use crate::{demo, fd_limit};

/// Why the program could not serve, or stopped serving on its own.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(transparent)]
    Flags(#[from] FlagError),
    #[error("unpacking the demo model: {0}")]
    DemoUnpack(std::io::Error),
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// Picks and builds the executor for the flags over a model directory
/// (recording its load phases in the spec's [`Startup`]):
/// [`crate::executor::pick`], or a fake one in tests and examples.
pub type ExecutorPicker = fn(&Args, ExecutorSpec<'_>) -> Result<ExecutorFactory, ExecutorError>;

/// A started server before it listens: the state the router serves and
/// the unpacked demo directory (removed on drop).
pub struct Prepared {
    pub state: Arc<AppState>,
    pub demo_dir: Option<tempfile::TempDir>,
}

/// What to serve: the --model directory, else the demo unpacked into a
/// temporary directory (kept in the returned guard).
fn serve_config(
    args: &Args,
    startup: &Startup,
) -> Result<(ServeConfig, Option<tempfile::TempDir>), LaunchError> {
    args.check()?;
    let (mut config, unpacked) = match &args.model {
        Some(dir) => (
            args.serve_config(dir.clone(), dir.display().to_string()),
            None,
        ),
        None => {
            eprintln!("{}", demo::BANNER);
            let unpacked = startup
                .time("demo_unpack", demo::unpack)
                .map_err(LaunchError::DemoUnpack)?;
            let config = args.serve_config(
                unpacked.path().to_path_buf(),
                demo::DEMO_MODEL_NAME.to_string(),
            );
            (config, Some(unpacked))
        }
    };
    config.connections.max_connections =
        fd_limit::connections_within_descriptor_limit(config.connections.max_connections);
    Ok((config, unpacked))
}

/// Loads the model files (the demo without --model) and starts the engine
/// with the picked executor; the model loads in the background.
pub fn prepare(args: &Args, pick_executor: ExecutorPicker) -> Result<Prepared, LaunchError> {
    let startup = Startup::new();
    let (config, demo_dir) = serve_config(args, &startup)?;
    let state = gdn_http::serve::prepare(&config, startup, |spec| Ok(pick_executor(args, spec)?))?;
    Ok(Prepared { state, demo_dir })
}

/// The whole program: serve until a signal (then drain), or until the
/// engine stops on its own (`Err` with the reason).
pub async fn run(args: Args, pick_executor: ExecutorPicker) -> Result<(), LaunchError> {
    let startup = Startup::new();
    let (config, demo_dir) = serve_config(&args, &startup)?;
    let served =
        gdn_http::serve::run(config, startup, |spec| Ok(pick_executor(&args, spec)?)).await;
    // The demo directory (if any) is removed once the server has closed.
    drop(demo_dir);
    Ok(served?)
}
