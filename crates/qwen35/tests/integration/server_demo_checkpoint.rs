//! The demo checkpoint embedded in gdn-server (crates/server/demo, random
//! weights, made by checks/fixtures/make_demo_model.py) loads through this
//! crate's config, weights and tokenizer loaders and runs on the CPU forward.

use std::path::PathBuf;

use qwen35::{Config, CpuModel, LayerType, TextTokenizer, Weights};

fn demo_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../server/demo")
}

/// The id of a string that must encode to exactly one token.
fn single_token(tok: &TextTokenizer, text: &str) -> u32 {
    let ids = tok.encode(text).unwrap();
    assert_eq!(ids.len(), 1, "{text:?} should be one token, got {ids:?}");
    ids[0]
}

#[test]
fn demo_config_is_a_hybrid_qwen35_the_gpu_kernels_accept() {
    let c = Config::from_file(&demo_dir().join("config.json")).unwrap();
    assert!(!c.vision_language);
    assert!(c.layer_types.contains(&LayerType::Linear));
    assert!(c.layer_types.contains(&LayerType::Full));
    assert_eq!(c.layer_types.len(), c.num_hidden_layers);
    // The GDN kernels exist for head dim 128 only.
    assert_eq!((c.linear_key_head_dim, c.linear_value_head_dim), (128, 128));
    assert!(c.tie_word_embeddings);
}

#[test]
fn demo_tokenizer_has_qwen35_added_tokens_and_eos_ids() {
    let dir = demo_dir();
    let c = Config::from_file(&dir.join("config.json")).unwrap();
    let tok = TextTokenizer::from_dir(&dir).unwrap();
    let im_end = single_token(&tok, "<|im_end|>");
    let endoftext = single_token(&tok, "<|endoftext|>");
    // generation_config.json's EOS list, read by the loader, names the same
    // ids the tokenizer gives the two spellings.
    assert_eq!(tok.eos_token_ids, vec![im_end, endoftext]);
    let specials = [
        "<|im_start|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
    ];
    let mut ids: Vec<u32> = specials.iter().map(|s| single_token(&tok, s)).collect();
    ids.extend([im_end, endoftext]);
    assert!(ids.iter().all(|&i| (i as usize) < c.vocab_size));
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), specials.len() + 2, "added tokens share ids");

    let text = "<|im_start|>user\nGrüße, 東京! 👋 café<|im_end|>\n<|im_start|>assistant\n<think>\n";
    let encoded = tok.encode(text).unwrap();
    assert_eq!(encoded[0], single_token(&tok, "<|im_start|>"));
    assert_eq!(tok.decode(&encoded).unwrap(), text);
}

/// Token ids of Hugging Face's tokenizer (Python `tokenizers`, as used by
/// transformers) for the chat-template goldens of gdn-server, made by
/// checks/fixtures/make_chat_template_goldens.py from this tokenizer.json:
/// our loader must give the same ids for the same text (prompts with special
/// tokens, unicode, JSON, combining marks).
#[test]
fn demo_tokenizer_matches_hf_ids_on_chat_template_goldens() {
    let tok = TextTokenizer::from_dir(&demo_dir()).unwrap();
    let path = demo_dir().join("../tests/fixtures/chat_template/goldens.json");
    let goldens: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut checked = 0;
    for case in goldens["cases"].as_array().unwrap() {
        let Some(text) = case["rendered"].as_str() else {
            continue;
        };
        let want: Vec<u32> = case["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(tok.encode(text).unwrap(), want, "case {}", case["name"]);
        // The tokenizer normalises to NFC: the decomposed "e\u{301}" of one
        // case comes back composed.
        let nfc = text.replace("e\u{301}", "\u{e9}");
        assert_eq!(tok.decode(&want).unwrap(), nfc, "case {}", case["name"]);
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} rendered cases");
}

#[test]
fn demo_checkpoint_runs_on_the_cpu_forward() {
    let dir = demo_dir();
    let config = Config::from_file(&dir.join("config.json")).unwrap();
    let vocab = config.vocab_size;
    let weights = Weights::open(&dir).unwrap();
    let model = CpuModel::load(config, &weights).unwrap();
    let tok = TextTokenizer::from_dir(&dir).unwrap();
    let prompt = tok
        .encode("<|im_start|>user\nHello there!<|im_end|>\n<|im_start|>assistant\n")
        .unwrap();
    assert!(prompt.len() > 4);

    let mut state = model.new_state();
    let logits = model.forward(&prompt, &mut state).unwrap();
    assert_eq!(logits.len(), prompt.len());
    for row in &logits {
        assert_eq!(row.len(), vocab);
        assert!(row.iter().all(|x| x.is_finite()), "non-finite logit");
        // Random, non-zero weights: a row is not flat.
        let (lo, hi) = row
            .iter()
            .fold((f32::MAX, f32::MIN), |(l, h), &x| (l.min(x), h.max(x)));
        assert!(hi - lo > 0.1, "flat logits: range {}", hi - lo);
    }
    assert_ne!(logits[0], logits[1], "positions gave identical logits");

    // The same prompt split in two calls (state carried) ends on the same logits.
    let split = prompt.len() / 2;
    let mut carried = model.new_state();
    model.forward(&prompt[..split], &mut carried).unwrap();
    let tail = model.forward(&prompt[split..], &mut carried).unwrap();
    let (whole, parts) = (logits.last().unwrap(), tail.last().unwrap());
    let diff = whole
        .iter()
        .zip(parts)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(diff < 1e-4, "split prompt differs by {diff}");
}
