//! gdn-http: an OpenAI-compatible HTTP front end (vLLM's routes, fields,
//! streaming and errors) over the gdn engine's request API. The caller
//! (the gdn-server binary) brings the executor; this crate knows no model
//! runtime.
//!
//! Layers, each using only those before it:
//! - [`openai`]: request and response types, validation, the error shape;
//! - [`text`]: chat template, tokenization, detokenization, output parsing;
//! - [`startup`], [`model`]: start-up timing, the model directory's text side;
//! - [`api`]: what each route does, and the one response path of chat and
//!   completions;
//! - [`anthropic`]: Anthropic's Messages API, on top of chat's path;
//! - [`http`]: the connections (cap, timeouts, answers below the routes),
//!   the route table, request bodies and ids;
//! - [`serve`]: start the engine, bind, serve, drain, shut down.

pub mod anthropic;
pub mod api;
pub mod http;
pub mod model;
pub mod openai;
pub mod serve;
pub mod startup;
pub mod text;
