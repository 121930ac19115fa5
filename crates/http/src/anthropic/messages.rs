//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: the Messages
//! request becomes a chat request ([`super::convert`]), which is
//! validated, rendered and submitted as `/v1/chat/completions` would; its
//! output goes through the chat output parser into content blocks
//! ([`super::response::Blocks`]), answered whole or as Anthropic's event
//! stream ([`super::stream`]).

use axum::body::Bytes;
use axum::response::Response;
use serde_json::json;

use super::convert::{chat_body, Purpose};
use super::error::reject;
use super::request::MessagesRequest;
use super::response::{apply, stop_reason, Blocks, MessageOut};
use super::stream::events;
use crate::api::chat::{self, render_chat};
use crate::api::generate::Generation;
use crate::api::request_id::RequestId;
use crate::api::respond::json_response;
use crate::api::sse::{sse_response, DisconnectGuard};
use crate::api::state::SharedState;
use crate::api::timeline::Timeline;
use crate::openai::decode::decode_json;
use crate::openai::request::GenerationRequest;
use crate::openai::validate::validate_chat;
use crate::openai::ApiError;
use crate::text::outparse::ChatOutputParser;

/// Answers `POST /v1/messages` from its body (as the route read it: 415,
/// 413 and 408 come as errors); every error in Anthropic's shape.
pub async fn messages(
    state: SharedState,
    request_id: RequestId,
    body: Result<Bytes, ApiError>,
) -> Response {
    match answer(&state, request_id, body).await {
        Ok(response) => response,
        Err(e) => reject(&state, e),
    }
}

/// Answers `POST /v1/messages/count_tokens`: `{"input_tokens"}` of the
/// prompt the same request would render.
pub async fn count_tokens(state: SharedState, body: Result<Bytes, ApiError>) -> Response {
    let counted = async {
        let req: MessagesRequest = decode_json(&body?)?;
        state.check_model(Some(&req.model))?;
        let chat = chat_body(&req, Purpose::CountTokens)?;
        let (chat_req, bytes) = chat_request(&chat)?;
        let valid = validate_chat(&chat_req, &state.model.defaults, state.model.vocab_size)?;
        let rendered = render_chat(
            &state,
            &bytes,
            valid.add_generation_prompt,
            valid.continue_final_message,
            chat_req.chat_template_kwargs.as_ref(),
            false,
            &mut Timeline::off(),
        )?;
        Ok(json_response(&json!({"input_tokens": rendered.ids.len()})))
    };
    match counted.await {
        Ok(response) => response,
        Err(e) => reject(&state, e),
    }
}

/// The chat request of a converted body, and the body's bytes (what the
/// template renders from).
fn chat_request(chat: &serde_json::Value) -> Result<(GenerationRequest, Bytes), ApiError> {
    let bytes = Bytes::from(serde_json::to_vec(chat).map_err(ApiError::internal)?);
    Ok((decode_json(&bytes)?, bytes))
}

async fn answer(
    state: &SharedState,
    request_id: RequestId,
    body: Result<Bytes, ApiError>,
) -> Result<Response, ApiError> {
    let mut timeline = Timeline::start(state.request_timeline);
    let bytes = body?;
    timeline.mark("body_read");
    let req: MessagesRequest = decode_json(&bytes)?;
    state.check_model(Some(&req.model))?;
    timeline.mark("decoded");
    let chat = chat_body(&req, Purpose::Generate)?;
    let (chat_req, chat_bytes) = chat_request(&chat)?;
    let (generation, parser) = submit(state, &request_id, &chat_req, &chat_bytes, timeline).await?;
    let head = MessageOut::new(
        format!("msg_{request_id}"),
        state.served_model_name.clone(),
        generation.usage().into(),
    );
    let guard = DisconnectGuard::new(state.clone(), &request_id.0);
    if req.stream == Some(true) {
        Ok(sse_response(state, events(head, generation, parser, guard)))
    } else {
        collect(head, generation, parser, guard).await
    }
}

/// Submits the chat request through chat's own path; the parser reads
/// its output as chat's would.
async fn submit(
    state: &SharedState,
    request_id: &RequestId,
    req: &GenerationRequest,
    bytes: &[u8],
    timeline: Timeline,
) -> Result<(Generation, ChatOutputParser), ApiError> {
    let submitted = chat::submit(state, request_id, req, bytes, timeline).await?;
    let parser = ChatOutputParser::new(
        submitted.opens_reasoning,
        submitted.valid.include_reasoning,
        submitted.tools,
    );
    Ok((submitted.generation, parser))
}

/// The whole response, once the output finished.
async fn collect(
    mut message: MessageOut,
    mut generation: Generation,
    mut parser: ChatOutputParser,
    mut guard: DisconnectGuard,
) -> Result<Response, ApiError> {
    let mut blocks = Blocks::default();
    let mut finish = None;
    while let Some(next) = generation.next().await {
        let p = next?;
        let mut piece = parser.feed(&p.text);
        if p.finish.is_some() {
            let rest = parser.finish();
            piece.reasoning.push_str(&rest.reasoning);
            piece.content.push_str(&rest.content);
            piece.tool_calls.extend(rest.tool_calls);
            finish = p.finish;
        }
        apply(&mut message.content, blocks.push(piece));
    }
    apply(&mut message.content, blocks.finish());
    guard.done();
    // Clients read `content[0]`: an empty answer is one empty text block.
    if message.content.is_empty() {
        message.content.push(super::response::ContentOut::Text {
            text: String::new(),
        });
    }
    let (reason, sequence) = stop_reason(finish.as_ref(), parser.saw_tool_call());
    message.stop_reason = Some(reason);
    message.stop_sequence = sequence;
    message.usage = generation.usage().into();
    Ok(json_response(&message))
}
