//! The Responses event stream: `response.created` and
//! `response.in_progress`, the output items' events as the output is read
//! ([`super::output`]), then `response.completed` with the whole response.
//! Each event goes as `event: <type>` with its JSON as `data:`, numbered by
//! `sequence_number` from 0; there is no `[DONE]` (OpenAI's stream has
//! none). An engine failure after the 200 ends the stream with an `error`
//! event.

use axum::response::sse::Event as SseEvent;
use axum::response::Response;
use futures_util::Stream;
use serde_json::{json, Value as Json};

use super::{keep, usage, Head, Reader};
use crate::api::generate::Generation;
use crate::api::sse::{sse_response, DisconnectGuard, SseItem};
use crate::api::state::SharedState;
use crate::openai::ApiError;

pub fn respond(
    state: SharedState,
    head: Head,
    reader: Reader,
    generation: Generation,
    guard: DisconnectGuard,
) -> Response {
    sse_response(
        &state.clone(),
        events(state, head, reader, generation, guard),
    )
}

/// Numbers the events of one stream.
struct Sequence(u64);

impl Sequence {
    fn event(&mut self, mut event: Json) -> SseItem {
        event["sequence_number"] = self.0.into();
        self.0 += 1;
        let kind = event["type"].as_str().unwrap_or("").to_string();
        Ok(SseEvent::default().event(kind).data(event.to_string()))
    }
}

fn events(
    state: SharedState,
    mut head: Head,
    mut reader: Reader,
    mut generation: Generation,
    mut guard: DisconnectGuard,
) -> impl Stream<Item = SseItem> {
    async_stream::stream! {
        let mut seq = Sequence(0);
        let opening = head.response("in_progress", &[], None);
        yield seq.event(json!({"type": "response.created", "response": opening}));
        yield seq.event(json!({"type": "response.in_progress", "response": opening}));
        let mut status = "completed";
        while let Some(next) = generation.next().await {
            let p = match next {
                Ok(p) => p,
                Err(failure) => {
                    log::warn!(
                        "response {}: failed after the stream started: {failure}",
                        head.id
                    );
                    guard.done();
                    let e = ApiError::from(failure);
                    yield seq.event(json!({
                        "type": "error", "code": e.code, "message": e.message, "param": e.param,
                    }));
                    return;
                }
            };
            let finish = p.finish.as_ref().map(|f| f.reason);
            if let Some(s) = reader.read(&p.text, finish) {
                status = s;
            }
            for event in std::mem::take(&mut reader.output.events) {
                yield seq.event(event);
            }
        }
        guard.done();
        let output = &reader.output.items;
        let usage = usage(&state, &generation, &reader.output.reasoning);
        keep(&state, &mut head, output);
        let response = head.response(status, output, Some(usage));
        yield seq.event(json!({"type": "response.completed", "response": response}));
    }
}
