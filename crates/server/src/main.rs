//! gdn-server: serve a Qwen3.5 checkpoint (or the embedded demo) over an
//! OpenAI-compatible HTTP API.

use clap::Parser;
use gdn_server::cli::Args;
use gdn_server::{executor, logging};

fn main() {
    // Before the runtime starts: start-up times count from here.
    gdn_http::startup::mark_process_start();
    logging::init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("gdn-server: starting the async runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(gdn_server::run(Args::parse(), executor::pick)) {
        eprintln!("gdn-server: {e}");
        std::process::exit(1);
    }
}
