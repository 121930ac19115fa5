//! Per-token cost of a structured-output constraint with a real tokenizer:
//! mask time (the mask pool's work) and advance time (the engine thread's),
//! over random walks through the grammar.
//!
//! ```text
//! cargo run --release -p gdn-engine --example constraint_cost -- \
//!     --tokenizer tokenizer.json --eos 248046,248044 --schema schema.json \
//!     --threads 1,2 --lexer-copies 1,2,0
//! ```

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use engine::constraint::{ConstraintLimits, ConstraintSpec, StructuredOutputs};

#[derive(Parser)]
struct Args {
    /// A Hugging Face tokenizer.json.
    #[arg(long)]
    tokenizer: PathBuf,
    /// EOS ids, comma separated.
    #[arg(long, value_delimiter = ',')]
    eos: Vec<u32>,
    /// A JSON schema file (the constraint walked).
    #[arg(long)]
    schema: PathBuf,
    /// The logits' width (masks are built at it); default: the vocabulary.
    #[arg(long)]
    width: Option<usize>,
    #[arg(long, default_value_t = 16)]
    walks: usize,
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Threads walking at once, each walk's matcher from the grammar cache
    /// (as the mask pool's requests); comma separated for a sweep.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    threads: Vec<usize>,
    /// Lexer copies a cached grammar's requests share (ConstraintLimits::
    /// lexer_copies; 0: one per request); comma separated for a sweep.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    lexer_copies: Vec<usize>,
}

fn summary(row: &str, name: &str, mut v: Vec<Duration>) {
    v.sort();
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    let mean = v.iter().sum::<Duration>().as_secs_f64() * 1e6 / v.len() as f64;
    println!(
        "| {row} | {name} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {mean:.1} |",
        v.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0)
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let tokenizer = std::fs::read_to_string(&args.tokenizer)?;
    let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&args.schema)?)?;
    let spec = ConstraintSpec::JsonSchema(schema);
    println!(
        "| lexer copies | threads | per token | n | p50 us | p90 us | p99 us | max us | mean us |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for &lexer_copies in &args.lexer_copies {
        for &threads in &args.threads {
            // A compiler of its own: an empty grammar cache each time.
            let limits = ConstraintLimits {
                lexer_copies,
                ..ConstraintLimits::default()
            };
            let compiler = StructuredOutputs::from_tokenizer_json(&tokenizer, &args.eos, limits)?;
            let width = args.width.unwrap_or(compiler.vocab_size());
            let cost =
                compiler.walk_cost(&spec, args.walks, args.tokens, width, args.seed, threads)?;
            if cost.masks.is_empty() || cost.advances.is_empty() {
                return Err("the grammar allowed no token".into());
            }
            let row = format!("{lexer_copies} | {threads}");
            summary(&row, "mask", cost.masks);
            summary(&row, "advance", cost.advances);
            eprintln!(
                "{lexer_copies} lexer copies, {threads} threads: {} walks of at most {} tokens at width {width}, {} ended by the grammar",
                args.walks, args.tokens, cost.finished
            );
        }
    }
    Ok(())
}
