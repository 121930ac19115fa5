//! The routed experts of a MoE layer (`cuda/model_moe*.cuh`): the shape and
//! the path rule ([`shape`]), the device scratch ([`scratch`]) and the
//! [`crate::ModelOps`] method that runs them ([`ops`]).

pub(crate) mod ops;
pub(crate) mod scratch;
pub(crate) mod shape;

pub use ops::{MoeExperts, SharedExpert};
pub use scratch::MoeScratch;
pub use shape::{
    moe_path, MoePath, MoeShape, MOE_DIRECT_MAX_TOKENS, MOE_MAX_EXPERTS, MOE_MAX_TOP_K,
};

#[cfg(test)]
mod tests {
    use super::MoeShape;

    /// Qwen3.5-35B-A3B's experts, the shape the rules were measured at.
    pub(crate) const QWEN35_35B_A3B: MoeShape = MoeShape {
        experts: 256,
        top_k: 8,
        hidden: 2048,
        inter: 512,
        shared_inter: 512,
    };
}
