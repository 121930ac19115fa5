//! The model's chat template, rendered as transformers renders it.
//!
//! transformers uses a Jinja2 sandbox with `trim_blocks` and `lstrip_blocks`,
//! Python string methods on values, `raise_exception`, `strftime_now` and a
//! `tojson` that is `json.dumps(.., ensure_ascii=False)`. Messages and tools
//! keep the client's key order (minijinja's `preserve_order`), because
//! `tojson` of a tool schema is part of the prompt.

use minijinja::value::Value;
use minijinja::{Environment, Error, ErrorKind};

use super::pyjson;

const TEMPLATE_NAME: &str = "chat_template";

/// Why a render failed; every case is the client's (HTTP 400).
#[derive(Debug, Clone, PartialEq)]
pub enum TemplateError {
    /// The template called `raise_exception(message)`.
    Raised(String),
    /// Any other template failure (bad value shapes, undefined filters...).
    Render(String),
    /// `continue_final_message` with a final message the render lost.
    FinalMessageMissing,
}

impl std::fmt::Display for TemplateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TemplateError::Raised(m) => write!(f, "{m}"),
            TemplateError::Render(m) => write!(f, "chat template error: {m}"),
            TemplateError::FinalMessageMissing => write!(
                f,
                "continue_final_message is set but the final message does not appear in the chat after applying the chat template"
            ),
        }
    }
}

/// The template's source does not parse (found when the model loads).
#[derive(Debug, thiserror::Error)]
#[error("chat template does not parse: {0:#}")]
pub struct TemplateParseError(minijinja::Error);

/// Tool-call arguments of message `index` that are not a JSON object.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("messages[{index}].tool_calls: {reason}")]
pub struct BadToolCallArguments {
    pub index: usize,
    pub reason: String,
}

/// Everything a render needs besides the template.
pub struct RenderInput<'a> {
    /// The messages as the client sent them (tool-call arguments already
    /// decoded into mappings, as vLLM does before rendering).
    pub messages: &'a [Value],
    pub tools: Option<&'a Value>,
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    /// `chat_template_kwargs` (e.g. `enable_thinking`), passed as variables.
    pub kwargs: &'a [(String, Value)],
}

pub struct ChatTemplate {
    env: Environment<'static>,
    /// Special tokens from tokenizer_config.json (`bos_token`, `eos_token`, ...).
    special_tokens: Vec<(String, String)>,
}

/// Marks errors raised by `raise_exception` so they keep their own message.
const RAISED_PREFIX: &str = "\u{0}raise_exception\u{0}";

impl ChatTemplate {
    pub fn new(
        source: String,
        special_tokens: Vec<(String, String)>,
    ) -> Result<Self, TemplateParseError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", pyjson::tojson_filter);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("{RAISED_PREFIX}{message}"),
                ))
            },
        );
        env.add_function("strftime_now", |format: String| -> String {
            chrono::Local::now().format(&format).to_string()
        });
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(TemplateParseError)?;
        Ok(ChatTemplate {
            env,
            special_tokens,
        })
    }

    pub fn render(&self, input: &RenderInput<'_>) -> Result<String, TemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .expect("added at construction");
        let mut vars: Vec<(String, Value)> = self
            .special_tokens
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        vars.push(("messages".into(), Value::from(input.messages.to_vec())));
        vars.push((
            "tools".into(),
            input.tools.cloned().unwrap_or(Value::from(())),
        ));
        vars.push((
            "add_generation_prompt".into(),
            Value::from(input.add_generation_prompt),
        ));
        // Client kwargs come last so they can override, as in transformers.
        vars.extend(input.kwargs.iter().cloned());
        let ctx = Value::from_iter(vars);
        let rendered = template.render(ctx).map_err(template_error)?;
        if input.continue_final_message {
            return cut_after_final_message(rendered, input.messages);
        }
        Ok(rendered)
    }
}

fn template_error(e: Error) -> TemplateError {
    // The raised message may sit in the error or in one of its sources
    // (errors inside macros and includes are wrapped).
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(err) = cur {
        if let Some(m) = err
            .downcast_ref::<Error>()
            .and_then(|e| e.detail())
            .and_then(|d| d.strip_prefix(RAISED_PREFIX))
        {
            return TemplateError::Raised(m.to_string());
        }
        cur = err.source();
    }
    let detail = e
        .detail()
        .map(str::to_string)
        .unwrap_or_else(|| e.kind().to_string());
    TemplateError::Render(detail)
}

/// transformers' `continue_final_message`: keep the render up to the end of
/// the last message's (stripped) text so the model continues it.
fn cut_after_final_message(rendered: String, messages: &[Value]) -> Result<String, TemplateError> {
    let last = messages.last().ok_or(TemplateError::FinalMessageMissing)?;
    let content = last.get_attr("content").unwrap_or_default();
    let text = if let Some(s) = content.as_str() {
        s.to_string()
    } else {
        // List content: the last block that has text.
        let blocks: Vec<Value> = content
            .try_iter()
            .map(|it| it.collect())
            .unwrap_or_default();
        blocks
            .iter()
            .rev()
            .find_map(|b| {
                b.get_attr("text")
                    .ok()
                    .and_then(|t| t.as_str().map(str::to_string))
            })
            .ok_or(TemplateError::FinalMessageMissing)?
    };
    let needle = text.trim();
    match rendered.rfind(needle) {
        Some(at) => Ok(rendered[..at + needle.len()].to_string()),
        None => Err(TemplateError::FinalMessageMissing),
    }
}

/// vLLM decodes `tool_calls[].function.arguments` from JSON text into a
/// mapping before rendering (templates iterate them with `|items`). The
/// client's key order is kept. Fails on arguments that are not a JSON
/// object.
pub fn decode_tool_call_arguments(messages: &mut [Value]) -> Result<(), BadToolCallArguments> {
    for (i, message) in messages.iter_mut().enumerate() {
        let Ok(calls) = message.get_attr("tool_calls") else {
            continue;
        };
        if calls.is_undefined() || calls.is_none() {
            continue;
        }
        let Ok(iter) = calls.try_iter() else { continue };
        let mut new_calls = Vec::new();
        let mut changed = false;
        for call in iter {
            let function = call.get_attr("function").unwrap_or_default();
            let args = function.get_attr("arguments").unwrap_or_default();
            if let Some(text) = args.as_str() {
                let decoded: Value =
                    serde_json::from_str(text).map_err(|e| BadToolCallArguments {
                        index: i,
                        reason: format!("tool call arguments are not valid JSON: {e}"),
                    })?;
                if decoded.kind() != minijinja::value::ValueKind::Map {
                    return Err(BadToolCallArguments {
                        index: i,
                        reason: "tool call arguments must be a JSON object".into(),
                    });
                }
                let function = replace_key(&function, "arguments", decoded);
                new_calls.push(replace_key(&call, "function", function));
                changed = true;
            } else {
                new_calls.push(call);
            }
        }
        if changed {
            *message = replace_key(message, "tool_calls", Value::from(new_calls));
        }
    }
    Ok(())
}

/// A copy of a mapping with one key's value replaced (position kept).
fn replace_key(map: &Value, key: &str, new: Value) -> Value {
    let keys: Vec<Value> = map.try_iter().map(|it| it.collect()).unwrap_or_default();
    Value::from_iter(keys.into_iter().map(|k| {
        let v = if k.as_str() == Some(key) {
            new.clone()
        } else {
            map.get_item(&k).unwrap_or_default()
        };
        (k, v)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(src: &str) -> ChatTemplate {
        ChatTemplate::new(
            src.to_string(),
            vec![("eos_token".into(), "<|im_end|>".into())],
        )
        .unwrap()
    }

    fn messages(json: &str) -> Vec<Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn raise_exception_message_is_passed_through() {
        let t = template("{% if messages|length == 0 %}{{ raise_exception('No messages provided.') }}{% endif %}");
        let err = t
            .render(&RenderInput {
                messages: &[],
                tools: None,
                add_generation_prompt: true,
                continue_final_message: false,
                kwargs: &[],
            })
            .unwrap_err();
        assert_eq!(err, TemplateError::Raised("No messages provided.".into()));
    }

    #[test]
    fn python_methods_trim_blocks_and_kwargs() {
        let t = template(
            "{% for m in messages %}\n  {% if m.content.startswith('a') %}{{ m.content.upper() }}{% endif %}\n{% endfor %}\n{{ enable_thinking }}{{ eos_token }}",
        );
        let msgs =
            messages(r#"[{"role": "user", "content": "abc"}, {"role": "user", "content": "xyz"}]"#);
        let out = t
            .render(&RenderInput {
                messages: &msgs,
                tools: None,
                add_generation_prompt: true,
                continue_final_message: false,
                kwargs: &[("enable_thinking".into(), Value::from(false))],
            })
            .unwrap();
        // Jinja2 3.1 renders this template to the same string.
        assert_eq!(out, "ABCFalse<|im_end|>");
    }

    #[test]
    fn tool_call_arguments_are_decoded_in_order() {
        let mut msgs = messages(
            r#"[{"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": \"x\"}"}}]}]"#,
        );
        decode_tool_call_arguments(&mut msgs).unwrap();
        let t = template("{% for k, v in messages[0].tool_calls[0].function.arguments|items %}{{ k }}={{ v }};{% endfor %}");
        let out = t
            .render(&RenderInput {
                messages: &msgs,
                tools: None,
                add_generation_prompt: false,
                continue_final_message: false,
                kwargs: &[],
            })
            .unwrap();
        assert_eq!(out, "z=1;a=x;");
        let mut bad = messages(
            r#"[{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]"#,
        );
        assert!(decode_tool_call_arguments(&mut bad).is_err());
    }

    #[test]
    fn continue_final_message_cuts_after_the_text() {
        let t =
            template("{% for m in messages %}<{{ m.role }}>{{ m.content }}</end>\n{% endfor %}");
        let msgs = messages(
            r#"[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon "}]"#,
        );
        let out = t
            .render(&RenderInput {
                messages: &msgs,
                tools: None,
                add_generation_prompt: false,
                continue_final_message: true,
                kwargs: &[],
            })
            .unwrap();
        assert_eq!(out, "<user>hi</end>\n<assistant>Once upon");
    }
}
