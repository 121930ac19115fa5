//! The HTTP stack: the connections ([`connections`]: accept loop,
//! connection cap, timeouts, answers below the router), the route table
//! ([`router`]), the request bodies ([`extract`]: 415, 413, then the
//! handler's decoding) and the id every request carries ([`request_id`]).
//! The routes' work is [`crate::api`]'s.

pub mod connections;
pub mod extract;
pub mod request_id;
mod router;
mod watchdog;

pub use connections::{serve_connections, ConnectionLimits, ConnectionMetrics};
pub use router::router;
