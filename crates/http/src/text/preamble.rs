//! Where the preamble of a chat prompt ends: the part the template renders
//! from the system message and the tool definitions, which every
//! conversation with the same system prompt and tools shares. The engine
//! snapshots its state there (`GenerateRequest::snapshot_points`), so a
//! new conversation resumes after the preamble from its first turn on,
//! and agents that send long tool lists do not prefill them every time.
//!
//! The position comes from the template, not from searching the text for
//! `<|im_end|>` or a role header: the template decides what the preamble
//! is (Qwen3.5 folds the tools and the system message into one system
//! block, trims the content, and renders no system block without either;
//! other templates differ). The preamble is the part of the render that
//! does not depend on the conversation after the system message, so two
//! renders that differ only there (the system message, then a user message
//! `a` or `b`) agree on it and on nothing after: their common prefix,
//! also common with the request's own render, is it. For Qwen3.5 that is
//! the system block and the first user turn's `<|im_start|>user\n`. In
//! tokens, the point is the longest common prefix of that text's encoding
//! and the prompt's (a token that merges across the end is left out).
//!
//! Cost: two more renders of the system part and one encoding of it per
//! chat request that has a system message or tools, paid only with prefix
//! caching on (`AppState::prefix_caching`).

use minijinja::value::Value;

use super::template::{ChatTemplate, RenderInput};

/// The end of the preamble in `prompt_ids` (the tokens of `rendered`, the
/// request's own render of `messages` and `tools`), or `None` when there
/// is no system message nor tools, or the template does not render them
/// apart from what follows.
pub fn preamble_end<E>(
    template: &ChatTemplate,
    encode: impl Fn(&str) -> Result<Vec<u32>, E>,
    messages: &[Value],
    tools: Option<&Value>,
    kwargs: &[(String, Value)],
    rendered: &str,
    prompt_ids: &[u32],
) -> Option<usize> {
    let starts_with_system = messages
        .first()
        .and_then(|m| m.get_attr("role").ok())
        .is_some_and(|role| role.as_str() == Some("system"));
    if !starts_with_system && tools.is_none_or(|t| t.is_none()) {
        return None;
    }
    let kept = usize::from(starts_with_system);
    let probe = |content: &str| {
        let mut probe_messages = messages[..kept].to_vec();
        probe_messages.push(Value::from_iter([
            ("role", Value::from("user")),
            ("content", Value::from(content)),
        ]));
        template
            .render(&RenderInput {
                messages: &probe_messages,
                tools,
                add_generation_prompt: false,
                continue_final_message: false,
                kwargs,
            })
            .ok()
    };
    let (a, b) = (probe("a")?, probe("b")?);
    let common = common_text(common_text(&a, &b), rendered).to_string();
    if common.is_empty() {
        return None;
    }
    let ids = encode(&common).ok()?;
    let end = ids
        .iter()
        .zip(prompt_ids)
        .take_while(|(x, y)| x == y)
        .count();
    (end > 0 && end < prompt_ids.len()).then_some(end)
}

/// The longest common prefix of `a` and `b`, on a character boundary.
fn common_text<'a>(a: &'a str, b: &str) -> &'a str {
    let end = a
        .char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or(a.len().min(b.len()), |((i, _), _)| i);
    &a[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_text_stops_on_a_character_boundary() {
        assert_eq!(common_text("système a", "système b"), "système ");
        assert_eq!(common_text("é", "è"), "");
        assert_eq!(common_text("abc", "ab"), "ab");
        assert_eq!(common_text("ab", "abc"), "ab");
    }
}
