//! The HTTP stack: the connections ([`connections`]: accept loop,
//! connection cap, timeouts, answers below the router; [`limits`]: the
//! numbers they hold to; `body_timeout`: a body's bytes must keep coming),
//! the route table ([`router`]), the request bodies ([`extract`]: 415, 413,
//! 408, then the handler's decoding) and the id every request carries
//! ([`request_id`]). The routes' work is [`crate::api`]'s.

mod body_timeout;
pub mod connections;
pub mod extract;
pub mod limits;
pub mod request_id;
mod router;
mod watchdog;

pub use connections::{serve_connections, ConnectionMetrics};
pub use limits::ConnectionLimits;
pub use router::router;
