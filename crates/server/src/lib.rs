//! gdn-server: an OpenAI-compatible HTTP front end (vLLM's routes, fields,
//! streaming and errors) over the gdn engine's request API.

pub mod app;
pub mod chat;
pub mod cli;
pub mod completions;
pub mod demo;
pub mod detok;
pub mod error;
pub mod generate;
pub mod model;
pub mod openai;
pub mod outparse;
pub mod preamble;
pub mod pyjson;
pub mod responses;
pub mod routes;
pub mod serve;
pub mod split_encode;
pub mod sse;
pub mod startup;
pub mod template;
pub mod timeline;
pub mod validate;
