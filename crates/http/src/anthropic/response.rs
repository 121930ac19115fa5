//! Response bodies of the Messages API (the `anthropic` SDK's `Message`,
//! content blocks and stream events) and [`Blocks`], which turns the chat
//! output parser's pieces (reasoning, text, tool calls) into content
//! blocks for both the whole body and the stream, so the two agree.

use serde::Serialize;
use serde_json::{json, Value as Json};

use crate::api::generate::Finish;
use crate::openai::response::{random_id, Usage};
use crate::text::outparse::ParsedDelta;

/// A content block of a response (the SDK's `ContentBlock`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentOut {
    Text {
        text: String,
    },
    /// `signature` is required by the SDK's type; this server signs
    /// nothing, so it is empty.
    Thinking {
        thinking: String,
        signature: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Json,
    },
}

/// A stream's `content_block_delta` payload.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DeltaOut {
    TextDelta { text: String },
    ThinkingDelta { thinking: String },
    InputJsonDelta { partial_json: String },
}

/// What happened to the response's content blocks.
#[derive(Clone, Debug, PartialEq)]
pub enum BlockEvent {
    /// A block opens (a tool_use block with its whole `input`; the stream
    /// sends `{}` and the input as one `input_json_delta`, as Anthropic
    /// does).
    Start {
        index: usize,
        block: ContentOut,
    },
    Delta {
        index: usize,
        delta: DeltaOut,
    },
    Stop {
        index: usize,
    },
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Text,
    Thinking,
}

/// Content blocks built from the parser's pieces as they come: one block
/// per run of reasoning or text, one per tool call.
#[derive(Default)]
pub struct Blocks {
    open: Option<(usize, Kind)>,
    count: usize,
    /// A thinking or tool_use block came before: the whitespace that
    /// separates a text block from it (`</think>\n\n`) is not text.
    after_other: bool,
}

impl Blocks {
    /// The events of one parsed piece of output.
    pub fn push(&mut self, delta: ParsedDelta) -> Vec<BlockEvent> {
        let mut out = Vec::new();
        if !delta.reasoning.is_empty() {
            let index = self.ensure(Kind::Thinking, &mut out);
            out.push(BlockEvent::Delta {
                index,
                delta: DeltaOut::ThinkingDelta {
                    thinking: delta.reasoning,
                },
            });
        }
        let mut text = delta.content.as_str();
        let follows_other = match self.open {
            Some((_, kind)) => kind == Kind::Thinking,
            None => self.after_other,
        };
        if follows_other {
            text = text.trim_start();
        }
        if !text.is_empty() {
            let index = self.ensure(Kind::Text, &mut out);
            out.push(BlockEvent::Delta {
                index,
                delta: DeltaOut::TextDelta { text: text.into() },
            });
        }
        for call in delta.tool_calls {
            self.close(&mut out);
            let index = self.next_index();
            let input = serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
            out.push(BlockEvent::Start {
                index,
                block: ContentOut::ToolUse {
                    id: random_id("toolu_"),
                    name: call.name,
                    input,
                },
            });
            out.push(BlockEvent::Delta {
                index,
                delta: DeltaOut::InputJsonDelta {
                    partial_json: call.arguments,
                },
            });
            out.push(BlockEvent::Stop { index });
            self.after_other = true;
        }
        out
    }

    /// Closes the open block (the output ended).
    pub fn finish(&mut self) -> Vec<BlockEvent> {
        let mut out = Vec::new();
        self.close(&mut out);
        out
    }

    fn next_index(&mut self) -> usize {
        self.count += 1;
        self.count - 1
    }

    fn ensure(&mut self, kind: Kind, out: &mut Vec<BlockEvent>) -> usize {
        if let Some((index, open)) = self.open {
            if open == kind {
                return index;
            }
        }
        self.close(out);
        let index = self.next_index();
        let block = match kind {
            Kind::Text => ContentOut::Text {
                text: String::new(),
            },
            Kind::Thinking => ContentOut::Thinking {
                thinking: String::new(),
                signature: String::new(),
            },
        };
        out.push(BlockEvent::Start { index, block });
        self.open = Some((index, kind));
        index
    }

    fn close(&mut self, out: &mut Vec<BlockEvent>) {
        if let Some((index, kind)) = self.open.take() {
            out.push(BlockEvent::Stop { index });
            if kind == Kind::Thinking {
                self.after_other = true;
            }
        }
    }
}

/// Applies block events to a whole body's content.
pub fn apply(content: &mut Vec<ContentOut>, events: Vec<BlockEvent>) {
    for event in events {
        match event {
            BlockEvent::Start { block, .. } => content.push(block),
            BlockEvent::Delta { index, delta } => match (&mut content[index], delta) {
                (ContentOut::Text { text }, DeltaOut::TextDelta { text: more }) => {
                    text.push_str(&more)
                }
                (
                    ContentOut::Thinking { thinking, .. },
                    DeltaOut::ThinkingDelta { thinking: more },
                ) => thinking.push_str(&more),
                // A tool_use block's input came whole with its start.
                _ => {}
            },
            BlockEvent::Stop { .. } => {}
        }
    }
}

/// Why the output stopped, and the stop sequence that stopped it.
pub fn stop_reason(finish: Option<&Finish>, called_tool: bool) -> (&'static str, Option<String>) {
    match finish {
        Some(Finish {
            reason: "length", ..
        }) => ("max_tokens", None),
        Some(Finish {
            stop_reason: Json::String(s),
            ..
        }) => ("stop_sequence", Some(s.clone())),
        _ if called_tool => ("tool_use", None),
        _ => ("end_turn", None),
    }
}

/// Anthropic's usage: `input_tokens` are the prompt tokens not read from
/// the prefix cache, `cache_read_input_tokens` those that were (their sum
/// is the prompt, as Anthropic counts).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UsageOut {
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub cache_creation_input_tokens: usize,
    pub cache_read_input_tokens: usize,
}

impl From<Usage> for UsageOut {
    fn from(u: Usage) -> Self {
        let cached = u.prompt_tokens_details.cached_tokens;
        UsageOut {
            input_tokens: u.prompt_tokens.saturating_sub(cached),
            output_tokens: u.completion_tokens,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: cached,
        }
    }
}

/// A whole response (the SDK's `Message`; also `message_start`'s message,
/// with no content yet).
#[derive(Clone, Debug, Serialize)]
pub struct MessageOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: String,
    pub content: Vec<ContentOut>,
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
    pub usage: UsageOut,
}

impl MessageOut {
    pub fn new(id: String, model: String, usage: UsageOut) -> Self {
        MessageOut {
            id,
            kind: "message",
            role: "assistant",
            model,
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::outparse::ParsedToolCall;

    fn piece(reasoning: &str, content: &str, calls: &[(&str, &str)]) -> ParsedDelta {
        ParsedDelta {
            reasoning: reasoning.into(),
            content: content.into(),
            tool_calls: calls
                .iter()
                .map(|(n, a)| ParsedToolCall {
                    name: n.to_string(),
                    arguments: a.to_string(),
                })
                .collect(),
        }
    }

    #[test]
    fn pieces_become_thinking_text_and_tool_use_blocks() {
        let mut blocks = Blocks::default();
        let mut content = Vec::new();
        apply(&mut content, blocks.push(piece("Let me ", "", &[])));
        apply(&mut content, blocks.push(piece("see.", "\n\nOK", &[])));
        apply(
            &mut content,
            blocks.push(piece("", " then", &[("f", r#"{"a": 1}"#)])),
        );
        apply(&mut content, blocks.push(piece("", "\n", &[])));
        apply(&mut content, blocks.finish());
        assert_eq!(content.len(), 3);
        assert_eq!(
            content[0],
            ContentOut::Thinking {
                thinking: "Let me see.".into(),
                signature: String::new()
            }
        );
        assert_eq!(
            content[1],
            ContentOut::Text {
                text: "OK then".into()
            }
        );
        let ContentOut::ToolUse { id, name, input } = &content[2] else {
            panic!("{content:?}");
        };
        assert!(id.starts_with("toolu_"));
        assert_eq!((name.as_str(), input), ("f", &json!({"a": 1})));
    }

    #[test]
    fn stream_events_open_and_close_each_block_once() {
        let mut blocks = Blocks::default();
        let mut events = blocks.push(piece("r", "t", &[]));
        events.extend(blocks.finish());
        let kinds: Vec<String> = events
            .iter()
            .map(|e| match e {
                BlockEvent::Start { index, .. } => format!("start{index}"),
                BlockEvent::Delta { index, .. } => format!("delta{index}"),
                BlockEvent::Stop { index } => format!("stop{index}"),
            })
            .collect();
        assert_eq!(
            kinds,
            ["start0", "delta0", "stop0", "start1", "delta1", "stop1"]
        );
    }
}
