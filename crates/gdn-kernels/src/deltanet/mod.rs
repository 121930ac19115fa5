//! Gated DeltaNet (`cuda/gdn_*`, `cuda/model_deltanet*.cuh`): the chunked
//! prefill op with its backend rule and bindings ([`prefill`]), the
//! recurrent state's storage ([`state`]), the layer's shape ([`shape`]) and
//! its conv and decode [`crate::ModelOps`] methods ([`ops`]), and the CPU
//! oracle ([`oracle`]).

pub(crate) mod ops;
pub mod oracle;
pub(crate) mod prefill;
pub(crate) mod shape;
pub(crate) mod state;

pub use prefill::dispatch::{
    prefer_context_parallel, Backend, BackendRequest, DispatchDecision, UnknownBackend,
};
pub use prefill::dsl::flashinfer_would_use_cp;
pub use prefill::{GdnPrefill, PrefillBuffers};
pub use shape::{DeltaNetInputs, DeltaNetShape, DeltaNetWeights};
pub use state::{HostState, RecurrentState, StateDtype};
