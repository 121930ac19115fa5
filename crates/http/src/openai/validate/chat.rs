//! Chat requests: messages, roles, content parts, tool-call arguments,
//! logprobs flags, tools and tool_choice, template flags.

use super::{
    validate_generation, ForcedToolCall, SamplingDefaults, ValidChat, ValidationError,
    MAX_TOP_LOGPROBS,
};
use crate::openai::request::{ChatMessage, GenerationRequest, MessageContent, Tool, ToolChoice};

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

pub fn validate_chat(
    req: &GenerationRequest,
    defaults: &SamplingDefaults,
    vocab_size: usize,
) -> Result<ValidChat, ValidationError> {
    let messages = req
        .messages
        .as_ref()
        .ok_or(ValidationError::MissingField { field: "messages" })?;
    validate_messages(messages)?;
    let logprobs = match &req.logprobs {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Bool(b)) => *b,
        Some(other) => {
            return Err(ValidationError::LogprobsType {
                value: other.to_string(),
            })
        }
    };
    let top = match req.top_logprobs {
        Some(k) if !(0..=MAX_TOP_LOGPROBS).contains(&k) => {
            return Err(ValidationError::OutOfRange {
                field: "top_logprobs",
                range: "in [0, 20]",
                value: k.to_string(),
            })
        }
        Some(k) if k > 0 && !logprobs => return Err(ValidationError::TopLogprobsWithoutLogprobs),
        Some(k) => k as u32,
        None => 0,
    };
    // OpenAI's max_completion_tokens wins over max_tokens; both must be valid.
    if let Some(m) = req.max_completion_tokens {
        super::positive_count("max_completion_tokens", m, "at least 1", i64::MAX)?;
    }
    let max_tokens = req.max_completion_tokens.or(req.max_tokens);
    if let (Some(m), Some(_)) = (req.max_tokens, req.max_completion_tokens) {
        super::positive_count("max_tokens", m, "at least 1", i64::MAX)?;
    }
    let generation = validate_generation(
        req,
        logprobs.then_some(top),
        max_tokens,
        defaults,
        vocab_size,
    )?;
    let tools_given = match &req.tools {
        Some(tools) if tools.is_empty() => return Err(ValidationError::EmptyTools),
        Some(tools) => {
            validate_tool_types(tools)?;
            true
        }
        None => false,
    };
    let (tools_enabled, forced_tool_call) = match &req.tool_choice {
        None => (tools_given, None),
        Some(ToolChoice::Mode(m)) if m == "none" => (false, None),
        Some(ToolChoice::Mode(m)) if m == "auto" || m == "required" => {
            if !tools_given {
                return Err(ValidationError::ToolChoiceWithoutTools);
            }
            let forced = (m == "required").then_some(ForcedToolCall::Required {
                parallel: req.parallel_tool_calls.unwrap_or(true),
            });
            (true, forced)
        }
        Some(ToolChoice::Mode(m)) => {
            return Err(ValidationError::UnknownToolChoice {
                value: format!("'{m}'"),
            })
        }
        Some(ToolChoice::Named(named)) => {
            if named.kind != "function" {
                return Err(ValidationError::UnknownToolChoice {
                    value: format!("type '{}'", named.kind),
                });
            }
            let tools = req
                .tools
                .as_deref()
                .ok_or(ValidationError::ToolChoiceWithoutTools)?;
            let name = &named.function.name;
            if !tools.iter().any(|t| &t.function.name == name) {
                return Err(ValidationError::UnknownTool { name: name.clone() });
            }
            (true, Some(ForcedToolCall::Named(name.clone())))
        }
    };
    let add_generation_prompt = req.add_generation_prompt.unwrap_or(true);
    let continue_final_message = req.continue_final_message.unwrap_or(false);
    if add_generation_prompt && continue_final_message && req.add_generation_prompt.is_some() {
        return Err(ValidationError::ConflictingFlags {
            a: "add_generation_prompt",
            b: "continue_final_message",
        });
    }
    Ok(ValidChat {
        generation,
        tools_enabled,
        forced_tool_call,
        // continue_final_message implies no generation prompt.
        add_generation_prompt: add_generation_prompt && !continue_final_message,
        continue_final_message,
        include_reasoning: req.include_reasoning.unwrap_or(true),
    })
}

/// Every tool is a function (chat, and `/tokenize`'s chat form).
pub fn validate_tool_types(tools: &[Tool]) -> Result<(), ValidationError> {
    match tools.iter().enumerate().find(|(_, t)| t.kind != "function") {
        Some((index, t)) => Err(ValidationError::BadToolType {
            index,
            kind: t.kind.clone(),
        }),
        None => Ok(()),
    }
}

/// The rules every message follows (chat, and `/tokenize`'s chat form):
/// a known role, text content (optional only for an assistant turn), tool
/// call arguments that are a JSON object, a tool result's `tool_call_id`.
pub fn validate_messages(messages: &[ChatMessage]) -> Result<(), ValidationError> {
    if messages.is_empty() {
        return Err(ValidationError::EmptyMessages);
    }
    for (index, m) in messages.iter().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(ValidationError::BadRole {
                index,
                role: m.role.clone(),
            });
        }
        match &m.content {
            Some(MessageContent::Parts(parts)) => {
                for (part, p) in parts.iter().enumerate() {
                    if p.kind != "text" || p.text.is_none() {
                        return Err(ValidationError::BadContentPart {
                            index,
                            part,
                            kind: p.kind.clone(),
                        });
                    }
                }
            }
            Some(MessageContent::Text(_)) => {}
            // An assistant turn may carry only tool calls.
            None if m.role == "assistant" => {}
            None => {
                return Err(ValidationError::MissingContent {
                    index,
                    role: m.role.clone(),
                })
            }
        }
        // A tool result names the call it answers (OpenAI requires it).
        if m.role == "tool" && m.tool_call_id.is_none() {
            return Err(ValidationError::MissingToolCallId { index });
        }
        for call in m.tool_calls.iter().flatten() {
            let args = &call.function.arguments;
            let ok = match args {
                serde_json::Value::String(s) => {
                    matches!(
                        serde_json::from_str::<serde_json::Value>(s),
                        Ok(serde_json::Value::Object(_))
                    )
                }
                serde_json::Value::Object(_) => true,
                _ => false,
            };
            if !ok {
                return Err(ValidationError::BadToolCallArguments {
                    index,
                    reason: format!(
                        "arguments of '{}' must be a JSON object (as text)",
                        call.function.name
                    ),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::request::GenerationRequest;

    fn chat(extra: &str) -> Result<ValidChat, ValidationError> {
        let json = format!(
            r#"{{"messages": [{{"role": "user", "content": "hi"}}], "tools": [{{"type": "function", "function": {{"name": "f", "parameters": {{}}}}}}], {extra}}}"#
        );
        let req: GenerationRequest = serde_json::from_str(&json).unwrap();
        validate_chat(&req, &SamplingDefaults::default(), 1000)
    }

    #[test]
    fn tool_choice_modes() {
        let v = chat(r#""tool_choice": "required""#).unwrap();
        assert!(v.tools_enabled);
        assert_eq!(
            v.forced_tool_call,
            Some(ForcedToolCall::Required { parallel: true })
        );
        let v = chat(r#""tool_choice": "required", "parallel_tool_calls": false"#).unwrap();
        assert_eq!(
            v.forced_tool_call,
            Some(ForcedToolCall::Required { parallel: false })
        );
        let v = chat(r#""tool_choice": {"type": "function", "function": {"name": "f"}}"#).unwrap();
        assert!(v.tools_enabled);
        assert_eq!(v.forced_tool_call, Some(ForcedToolCall::Named("f".into())));
        let v = chat(r#""tool_choice": "auto""#).unwrap();
        assert!(v.tools_enabled && v.forced_tool_call.is_none());
        let v = chat(r#""tool_choice": "none""#).unwrap();
        assert!(!v.tools_enabled && v.forced_tool_call.is_none());
    }

    #[test]
    fn a_forcing_tool_choice_needs_the_tool() {
        let e =
            chat(r#""tool_choice": {"type": "function", "function": {"name": "g"}}"#).unwrap_err();
        assert_eq!(e, ValidationError::UnknownTool { name: "g".into() });
        assert_eq!(e.param().as_deref(), Some("tool_choice.function.name"));
        let e = chat(r#""tool_choice": "always""#).unwrap_err();
        assert_eq!(e.param().as_deref(), Some("tool_choice"));
        let e = chat(r#""tool_choice": {"type": "code", "function": {"name": "f"}}"#).unwrap_err();
        assert_eq!(e.param().as_deref(), Some("tool_choice"));
        let req: GenerationRequest = serde_json::from_str(
            r#"{"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}"#,
        )
        .unwrap();
        assert_eq!(
            validate_chat(&req, &SamplingDefaults::default(), 1000),
            Err(ValidationError::ToolChoiceWithoutTools)
        );
    }
}
