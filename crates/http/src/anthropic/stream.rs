//! Anthropic's event stream: `message_start`, a `ping`, per content block
//! `content_block_start` / `content_block_delta`s / `content_block_stop`,
//! then `message_delta` (stop reason, usage) and `message_stop`. Each event
//! is an `event:` line naming its type and a `data:` line of JSON; an
//! engine failure after the start is an `error` event, which the SDKs
//! raise.

use axum::response::sse::Event as SseEvent;
use futures_util::Stream;
use serde::Serialize;
use serde_json::json;

use super::error;
use super::response::{stop_reason, BlockEvent, Blocks, ContentOut, MessageOut, UsageOut};
use crate::api::generate::Generation;
use crate::api::sse::{DisconnectGuard, SseItem};
use crate::openai::ApiError;
use crate::text::outparse::ChatOutputParser;

fn event<T: Serialize>(name: &'static str, data: &T) -> SseItem {
    let text = serde_json::to_string(data).expect("serializable");
    Ok(SseEvent::default().event(name).data(text))
}

fn block_event(e: BlockEvent) -> SseItem {
    match e {
        BlockEvent::Start { index, mut block } => {
            // The input follows as an input_json_delta (Anthropic's order).
            if let ContentOut::ToolUse { input, .. } = &mut block {
                *input = json!({});
            }
            event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": index, "content_block": block}),
            )
        }
        BlockEvent::Delta { index, delta } => event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ),
        BlockEvent::Stop { index } => event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        ),
    }
}

/// The events of one response; `head` is the message as `message_start`
/// shows it (no content, the prompt's usage).
pub fn events(
    head: MessageOut,
    mut generation: Generation,
    mut parser: ChatOutputParser,
    mut guard: DisconnectGuard,
) -> impl Stream<Item = SseItem> {
    async_stream::stream! {
        yield event("message_start", &json!({"type": "message_start", "message": head}));
        yield event("ping", &json!({"type": "ping"}));
        let mut blocks = Blocks::default();
        let mut finish = None;
        while let Some(next) = generation.next().await {
            let p = match next {
                Ok(p) => p,
                Err(failure) => {
                    log::warn!(
                        "request {}: failed after the stream started: {failure}",
                        head.id
                    );
                    guard.done();
                    yield event("error", &error::body(&ApiError::from(failure)));
                    return;
                }
            };
            let mut piece = parser.feed(&p.text);
            if p.finish.is_some() {
                let rest = parser.finish();
                piece.reasoning.push_str(&rest.reasoning);
                piece.content.push_str(&rest.content);
                piece.tool_calls.extend(rest.tool_calls);
                finish = p.finish;
            }
            for e in blocks.push(piece) {
                yield block_event(e);
            }
        }
        for e in blocks.finish() {
            yield block_event(e);
        }
        let (reason, sequence) = stop_reason(finish.as_ref(), parser.saw_tool_call());
        let usage = UsageOut::from(generation.usage());
        yield event(
            "message_delta",
            &json!({"type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": usage}),
        );
        guard.done();
        yield event("message_stop", &json!({"type": "message_stop"}));
    }
}
