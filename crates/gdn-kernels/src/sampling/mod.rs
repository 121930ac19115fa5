//! Sampling on the device (`cuda/sampling.cu`): [`sampler`] draws one token
//! per row of logits, [`token_masks`] holds the rows' allowed-token masks.

pub(crate) mod sampler;
pub(crate) mod token_masks;

pub use sampler::{DeviceSampler, RowSampling, SampledRow, TokenAdjustment, MAX_TOP_LOGPROBS};
pub use token_masks::{mask_words, MaskUpload, TokenMasks};
