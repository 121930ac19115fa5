//! The routed experts of a MoE layer (`cuda/model_moe*.cuh`): shapes, the
//! path rule, the scratch and the [`crate::ModelOps`] method ([`ops`]).

pub(crate) mod ops;

pub use ops::{
    moe_path, MoeExperts, MoePath, MoeScratch, MoeShape, SharedExpert, MOE_DIRECT_MAX_TOKENS,
    MOE_MAX_EXPERTS, MOE_MAX_TOP_K,
};
