//! gdn-server: serve a Qwen3.5 checkpoint (or the embedded demo) over an
//! OpenAI-compatible HTTP API.

mod executor;

use clap::Parser;
use gdn_server::cli::Args;
use gdn_server::serve::{init_logging, run_main};

#[tokio::main]
async fn main() {
    init_logging();
    if let Err(e) = run_main(Args::parse(), executor::pick).await {
        eprintln!("gdn-server: {e}");
        std::process::exit(1);
    }
}
