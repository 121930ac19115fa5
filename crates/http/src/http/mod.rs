//! The HTTP stack: the route table ([`router`]), the request bodies
//! ([`extract`]: 415, 413, then the handler's decoding) and the id every
//! request carries ([`request_id`]). The routes' work is [`crate::api`]'s.

pub mod extract;
pub mod request_id;
mod router;

pub use router::router;
