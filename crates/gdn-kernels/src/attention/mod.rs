//! Paged attention (`cuda/model_attention*.cuh`, FlashInfer's FA3 through
//! `gdn_attention_abi.h`): the layer's shape and launch geometry
//! ([`shape`]), the kernel rule ([`select`]), the FA3 binding ([`ffi`]) and
//! the attention layer's [`crate::ModelOps`] methods: q/k prep and the
//! knobs ([`ops`]), attention itself ([`run`]).

pub(crate) mod ffi;
pub(crate) mod ops;
pub(crate) mod run;
pub(crate) mod select;
pub(crate) mod shape;

pub use select::{AttentionKernel, AttentionRequest};
pub use shape::AttentionShape;
