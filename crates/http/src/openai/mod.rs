//! The OpenAI API as vLLM speaks it: request bodies ([`request`]) and how
//! they are decoded ([`decode`]) and validated ([`validate`]), response
//! bodies and stream chunks ([`response`]), the Responses API's requests
//! ([`responses`]), and the one error shape
//! ([`error`]). Nothing here knows HTTP routing, the engine's streams or
//! the text pipeline: the layers above build on these types.

pub mod decode;
pub mod error;
pub mod request;
pub mod response;
pub mod responses;
pub mod validate;

pub use error::ApiError;
