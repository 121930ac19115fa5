//! gdn-server: an OpenAI-compatible HTTP front end (vLLM's routes, fields,
//! streaming and errors) over the gdn engine's request API.

pub mod detok;
pub mod error;
pub mod openai;
pub mod outparse;
pub mod pyjson;
pub mod template;
pub mod validate;
