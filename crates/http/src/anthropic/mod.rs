//! Anthropic's Messages API as vLLM serves it (`POST /v1/messages`,
//! `POST /v1/messages/count_tokens`), for clients such as Claude Code
//! pointed at a local base URL. Built on the chat route: a request
//! becomes a chat request ([`convert`]) that goes through chat's
//! validation, template and engine submission ([`messages`]); the chat
//! output parser's reasoning, text and tool calls become content blocks
//! ([`response`]), sent whole or as Anthropic's event stream ([`stream`]);
//! errors take Anthropic's shape ([`error`]). Request bodies: [`request`].

pub mod convert;
pub mod error;
pub mod messages;
pub mod request;
pub mod response;
pub mod stream;

pub use messages::{count_tokens, messages};
