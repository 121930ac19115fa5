//! What the routes do once a request is decoded: chat ([`chat`]) and
//! completions ([`completions`]) submit engine requests ([`generate`]), with
//! the output constraint a request asks for ([`constraint`]), and
//! answer through one response path ([`respond`], streamed with [`sse`]);
//! `/v1/responses` ([`responses`]) submits through chat and keeps its
//! conversations ([`response_store`]);
//! the small routes ([`info`], [`tokenize`]) answer from the shared state
//! ([`state`]). The HTTP stack (routing, bodies, request ids) is
//! [`crate::http`]'s.

pub mod chat;
pub mod completions;
pub mod constraint;
pub mod generate;
pub mod info;
pub mod logprobs;
pub mod request_id;
pub mod respond;
pub mod response_store;
pub mod responses;
pub mod sse;
pub mod state;
pub mod timeline;
pub mod tokenize;

pub use request_id::{RequestId, MAX_REQUEST_ID_LEN, REQUEST_ID_HEADER};
pub use state::{AppState, ServerMetrics, SharedState};
