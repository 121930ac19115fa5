//! The embedded demo checkpoint (crates/server/demo): a tiny Qwen3.5 with
//! RANDOM weights, so that a fresh clone can start the server and serve
//! real requests without downloading anything. It is written to a private
//! temporary directory and then loaded like any model directory, so the
//! real loading path runs.

use std::path::Path;

const FILES: &[(&str, &[u8])] = &[
    ("config.json", include_bytes!("../demo/config.json")),
    (
        "generation_config.json",
        include_bytes!("../demo/generation_config.json"),
    ),
    (
        "model.safetensors",
        include_bytes!("../demo/model.safetensors"),
    ),
    ("tokenizer.json", include_bytes!("../demo/tokenizer.json")),
    (
        "tokenizer_config.json",
        include_bytes!("../demo/tokenizer_config.json"),
    ),
    (
        "chat_template.jinja",
        include_bytes!("../demo/chat_template.jinja"),
    ),
];

pub const DEMO_MODEL_NAME: &str = "gdn-demo";

pub const BANNER: &str = "\
==========================================================================
  gdn-server is serving its EMBEDDED DEMO model: a tiny Qwen3.5 whose
  weights are RANDOM. It answers every request, but the text is noise.
  For real answers start it with --model DIR (a Hugging Face Qwen3.5
  checkpoint directory).
==========================================================================";

/// Writes the demo files into a new temporary directory (removed when the
/// returned guard drops).
pub fn unpack() -> std::io::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new().prefix("gdn-demo-").tempdir()?;
    write_to(dir.path())?;
    Ok(dir)
}

fn write_to(dir: &Path) -> std::io::Result<()> {
    for (name, bytes) in FILES {
        std::fs::write(dir.join(name), bytes)?;
    }
    Ok(())
}
