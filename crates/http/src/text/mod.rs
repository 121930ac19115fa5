//! Text in and out of the model: the chat template as transformers renders
//! it ([`template`], with Python's `json.dumps` in [`pyjson`]), where a chat
//! prompt's shared preamble ends ([`preamble`]), long prompts tokenized in
//! parallel pieces ([`split_encode`]), token ids back to text with stop
//! strings ([`detok`]), and a chat output split into reasoning, content and
//! tool calls ([`outparse`]). Nothing here knows HTTP or the engine.

pub mod detok;
pub mod grammar;
pub mod outparse;
pub mod preamble;
pub mod pyjson;
pub mod split_encode;
pub mod template;
