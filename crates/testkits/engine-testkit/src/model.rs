//! The fake model: logits that are a hash of the whole history, and what a
//! request gets from it run alone, outside the engine (the reference every
//! engine test compares with).

use engine::sampler;
use engine::{GenerateRequest, SampleSeed, SampleSpec};

/// The fake model's logits after `history`: a hash of the whole history,
/// spread over the vocabulary (values in [-4, 4)).
pub fn fake_logits(history: &[u32], vocab_size: usize) -> Vec<f32> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in history {
        h = (h ^ t as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    (0..vocab_size as u64)
        .map(|i| {
            let mut z = h ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
        })
        .collect()
}

/// The tokens the fake model gives `request` run alone, one token at a
/// time, outside the engine (no batching, chunking or preemption): what the
/// engine must reproduce. Stops as the engine does (EOS unless
/// `ignore_eos`, stop ids, `max_tokens`; EOS and stop ids banned below
/// `min_tokens`); a seed must be set.
pub fn lone_run(request: &GenerateRequest, eos: &[u32], vocab_size: usize) -> Vec<u32> {
    let seed = request
        .sampling
        .seed
        .expect("lone_run needs a seeded request");
    let stop = &request.stop;
    let mut history = request.prompt.clone();
    let mut out = Vec::new();
    while out.len() < stop.max_tokens {
        let mut banned = Vec::new();
        if out.len() < stop.min_tokens {
            banned.extend_from_slice(&stop.stop_token_ids);
            if !stop.ignore_eos {
                banned.extend_from_slice(eos);
            }
        }
        let spec = SampleSpec {
            params: &request.sampling,
            history: &history,
            prompt_len: request.prompt.len(),
            seed: SampleSeed {
                seed,
                draw: out.len() as u64,
            },
            banned: &banned,
            allowed: None,
        };
        let token = sampler::sample(&fake_logits(&history, vocab_size), &spec).token;
        history.push(token);
        out.push(token);
        if (!stop.ignore_eos && eos.contains(&token)) || stop.stop_token_ids.contains(&token) {
            break;
        }
    }
    out
}
