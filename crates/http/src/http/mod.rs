//! The HTTP stack: the connections ([`connections`]: accept loop,
//! connection cap, timeouts, answers below the router; [`limits`]: the
//! numbers they hold to), the route table
//! ([`router`]), the request bodies ([`extract`]: 415, 413, then the
//! handler's decoding) and the id every request carries ([`request_id`]).
//! The routes' work is [`crate::api`]'s.

pub mod connections;
pub mod extract;
pub mod limits;
pub mod request_id;
mod router;
mod watchdog;

pub use connections::{serve_connections, ConnectionMetrics};
pub use limits::ConnectionLimits;
pub use router::router;
