//! A request's output constraint: the client's (structured outputs) or a
//! forced tool call, placed after the reasoning block a chat prompt opens
//! and compiled once by the engine before anything is submitted, so that
//! a bad schema, regex or grammar, or one that compiles but no output can
//! follow, is a 400 naming its field (placed after reasoning, the client's
//! constraint is compiled alone as well: see [`chat_constraint`]).

use engine::ConstraintSpec;

use super::state::SharedState;
use crate::openai::request::GenerationRequest;
use crate::openai::validate::{
    check_length_controls, check_size, requested_constraint, ForcedToolCall, RequestedConstraint,
    ValidChat, ValidationError,
};
use crate::openai::ApiError;
use crate::text::grammar::{
    after_reasoning, after_reasoning_choice, call_shape, json_rule, regex_terminal,
    tool_call_grammar,
};

/// The constraint of a completions request, checked.
pub async fn completion_constraint(
    state: &SharedState,
    req: &GenerationRequest,
) -> Result<Option<ConstraintSpec>, ApiError> {
    match requested_constraint(req, state.max_constraint_bytes)? {
        Some(c) => checked(state, c).await.map(Some),
        None => Ok(None),
    }
}

/// The client's constraint of a chat request, before the prompt is
/// rendered (a request-shape error comes first): never together with a
/// forcing `tool_choice`.
pub fn chat_client_constraint(
    state: &SharedState,
    req: &GenerationRequest,
    valid: &ValidChat,
) -> Result<Option<RequestedConstraint>, ApiError> {
    let client = requested_constraint(req, state.max_constraint_bytes)?;
    match (&valid.forced_tool_call, client) {
        (Some(_), Some(c)) => Err(ValidationError::ConflictingConstraints {
            fields: vec!["tool_choice", c.field],
        }
        .into()),
        (Some(_), None) => {
            check_length_controls(req, "tool_choice")?;
            Ok(None)
        }
        (None, client) => Ok(client),
    }
}

/// The constraint of a chat request, checked: a forced tool call's
/// grammar, or the client's constraint (from [`chat_client_constraint`]).
/// `opens_reasoning`: the rendered prompt ends inside `<think>`; the
/// constraint then starts after the model's `</think>`, as vLLM's
/// reasoning parsers have it (a client's Lark grammar is taken as is: it
/// covers the whole output).
pub async fn chat_constraint(
    state: &SharedState,
    req: &GenerationRequest,
    valid: &ValidChat,
    client: Option<RequestedConstraint>,
    opens_reasoning: bool,
) -> Result<Option<ConstraintSpec>, ApiError> {
    let constraint = match (&valid.forced_tool_call, client) {
        (Some(forced), _) => {
            let tools = req.tools.as_deref().unwrap_or_default();
            let (shapes, many) = match forced {
                ForcedToolCall::Required { parallel } => {
                    (tools.iter().map(call_shape).collect::<Vec<_>>(), *parallel)
                }
                ForcedToolCall::Named(name) => (
                    tools
                        .iter()
                        .filter(|t| &t.function.name == name)
                        .take(1)
                        .map(call_shape)
                        .collect(),
                    false,
                ),
            };
            let grammar = tool_call_grammar(&shapes, many, opens_reasoning);
            // The tools' schemas make the grammar: compile errors name them.
            let spec = ConstraintSpec::Lark(grammar);
            check_size("tools", &spec, state.max_constraint_bytes)?;
            RequestedConstraint {
                field: "tools",
                spec,
            }
        }
        // After reasoning, the grammar starts with free text, so its first
        // step (where the engine finds a constraint that compiles but
        // cannot be followed) says nothing of the client's: that is
        // checked alone first.
        (None, Some(c)) if opens_reasoning => RequestedConstraint {
            field: c.field,
            spec: after_reasoning_spec(checked(state, c).await?),
        },
        (None, Some(c)) => c,
        (None, None) => return Ok(None),
    };
    checked(state, constraint).await.map(Some)
}

/// `spec` as a grammar that first closes the reasoning block.
fn after_reasoning_spec(spec: ConstraintSpec) -> ConstraintSpec {
    let body = match &spec {
        ConstraintSpec::JsonSchema(schema) => json_rule(schema),
        ConstraintSpec::JsonObject => json_rule(&serde_json::json!({"type": "object"})),
        ConstraintSpec::Regex(regex) => regex_terminal(regex),
        ConstraintSpec::Choice(values) => {
            return ConstraintSpec::Lark(after_reasoning_choice(values))
        }
        ConstraintSpec::Lark(_) => return spec,
    };
    ConstraintSpec::Lark(after_reasoning(&body))
}

/// Compiles the constraint in the engine, off the async workers (a
/// compile the engine has not cached may take a while): its error names
/// the field. The engine caches what it compiled, so submit does not
/// compile again.
async fn checked(state: &SharedState, c: RequestedConstraint) -> Result<ConstraintSpec, ApiError> {
    let engine_state = state.clone();
    let spec = c.spec.clone();
    let checked = tokio::task::spawn_blocking(move || engine_state.engine.check_constraint(&spec))
        .await
        .map_err(ApiError::internal)?;
    checked.map_err(|e| {
        ApiError::from(ValidationError::BadConstraint {
            field: c.field,
            message: e.to_string(),
        })
    })?;
    Ok(c.spec)
}
