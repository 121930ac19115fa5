//! The admission policies (`--admission-policy`) and SGLang's constants
//! the ratio policy takes; what each policy holds back is `headroom.rs`.

/// The admission policy (`--admission-policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AdmissionPolicy {
    /// vLLM v1: admit while the first prefill chunk fits with one free page
    /// left per running sequence; pages are taken as positions need them.
    Watermark,
    /// TGI: admit only when the whole prompt and every sequence's remaining
    /// `max_tokens` (up to `max_model_len`) fit at once. Never preempts,
    /// and holds room for outputs that stop early.
    Reserve,
    /// SGLang: as `Reserve`, with the outputs still to come clipped to
    /// [`CLIP_MAX_NEW_TOKENS`] and weighted by a ratio that decays each
    /// step and rises again after a preemption to the share of their
    /// budgets the running sequences had used.
    #[default]
    NewTokenRatio,
}

impl AdmissionPolicy {
    /// The spellings `--admission-policy` takes.
    pub const NAMES: [&'static str; 3] = ["watermark", "reserve", "new-token-ratio"];

    pub fn name(self) -> &'static str {
        match self {
            AdmissionPolicy::Watermark => "watermark",
            AdmissionPolicy::Reserve => "reserve",
            AdmissionPolicy::NewTokenRatio => "new-token-ratio",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "watermark" => Some(AdmissionPolicy::Watermark),
            "reserve" => Some(AdmissionPolicy::Reserve),
            "new-token-ratio" => Some(AdmissionPolicy::NewTokenRatio),
            _ => None,
        }
    }
}

/// SGLang's estimate of a request's output never counts more than this
/// many tokens (`SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`): a client that
/// leaves `max_tokens` at the whole context would otherwise hold it.
pub const CLIP_MAX_NEW_TOKENS: usize = 4096;
/// SGLang's starting ratio (`init_new_token_ratio`).
pub const INIT_NEW_TOKEN_RATIO: f64 = 0.7;
/// SGLang's floor: `init_new_token_ratio` x `min_new_token_ratio_factor`.
pub const MIN_NEW_TOKEN_RATIO: f64 = INIT_NEW_TOKEN_RATIO * 0.14;
/// Steps over which the ratio decays from the start to the floor.
pub const NEW_TOKEN_RATIO_DECAY_STEPS: f64 = 600.0;
