//! gdn-server over the engine's fake executor (engine_testkit): the real
//! HTTP stack, tokenizer and template, with a model that needs no weights.
//! For developing and testing the HTTP layer only; not shipped.

use clap::Parser;
use engine::CacheGeometry;
use engine_testkit::{FakeControl, FakeExecutor};
use gdn_http::serve::{ExecutorFactory, ExecutorSpec};
use gdn_server::cli::Args;
use gdn_server::executor::ExecutorError;
use gdn_server::logging::init_logging;

fn pick(_args: &Args, spec: ExecutorSpec<'_>) -> Result<ExecutorFactory, ExecutorError> {
    let geometry = CacheGeometry {
        num_slots: 64,
        num_pages: 4096,
        page_size: 16,
        vocab_size: 640,
        max_model_len: spec.max_model_len.min(4096),
    };
    Ok(Box::new(move || {
        Ok(Box::new(FakeExecutor::new(geometry, FakeControl::new())) as Box<dyn engine::Executor>)
    }))
}

#[tokio::main]
async fn main() {
    init_logging();
    if let Err(e) = gdn_server::run(Args::parse(), pick).await {
        eprintln!("gdn-server: {e}");
        std::process::exit(1);
    }
}
