//! Splits a chat completion's text into reasoning, content and tool calls,
//! incrementally (the same code serves streaming and non-streaming).
//!
//! Reasoning follows vLLM's `qwen3` parser: text up to `</think>` is
//! `reasoning_content`. Qwen3.5's template ends the prompt with `<think>\n`
//! when thinking is on, so the output starts inside reasoning then.
//! Tool calls follow vLLM's `qwen3_coder` parser: XML blocks
//! `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>`;
//! parameter values are converted by the tool's JSON-schema type and the
//! arguments are `json.dumps(.., ensure_ascii=False)` of them.

use std::collections::HashMap;

use minijinja::value::Value;

use super::pyjson;

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";
const TOOL_START: &str = "<tool_call>";
const TOOL_END: &str = "</tool_call>";

#[derive(Clone, Debug, PartialEq)]
pub struct ParsedToolCall {
    pub name: String,
    /// JSON text of the arguments object.
    pub arguments: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParsedDelta {
    pub reasoning: String,
    pub content: String,
    pub tool_calls: Vec<ParsedToolCall>,
}

impl ParsedDelta {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty() && self.tool_calls.is_empty()
    }
}

/// Function name -> parameter name -> JSON-schema type.
pub type ToolSchemas = HashMap<String, HashMap<String, String>>;

/// Reads parameter types out of the request's `tools`.
pub fn tool_schemas(tools: &[crate::openai::request::Tool]) -> ToolSchemas {
    tools
        .iter()
        .map(|t| {
            let props = t
                .function
                .parameters
                .as_ref()
                .and_then(|p| p.get("properties"))
                .and_then(|p| p.as_object())
                .map(|props| {
                    props
                        .iter()
                        .map(|(k, v)| (k.clone(), parameter_type(v).to_string()))
                        .collect()
                })
                .unwrap_or_default();
            (t.function.name.clone(), props)
        })
        .collect()
}

/// The type a parameter's text is converted by: its schema's `type` when
/// that is one name, else `string` (vLLM's `qwen3_coder`).
pub fn parameter_type(schema: &serde_json::Value) -> &str {
    schema
        .get("type")
        .and_then(|t| t.as_str())
        .unwrap_or("string")
}

/// Whether a parameter of this type keeps its text as is (other types
/// are read as numbers, booleans or JSON).
pub fn is_text_type(ty: &str) -> bool {
    matches!(ty, "string" | "str" | "text" | "varchar" | "char" | "enum")
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Reasoning,
    Content,
    ToolCall,
}

pub struct ChatOutputParser {
    mode: Mode,
    buffer: String,
    parse_reasoning: bool,
    tools: Option<ToolSchemas>,
    /// Nothing was emitted yet (a `<think>` may still open reasoning).
    at_start: bool,
    seen_tool_call: bool,
}

impl ChatOutputParser {
    /// `prompt_opens_reasoning`: the rendered prompt ends inside `<think>`.
    /// `tools`: `Some` when tool calls are to be parsed.
    pub fn new(
        prompt_opens_reasoning: bool,
        parse_reasoning: bool,
        tools: Option<ToolSchemas>,
    ) -> Self {
        ChatOutputParser {
            mode: if prompt_opens_reasoning && parse_reasoning {
                Mode::Reasoning
            } else {
                Mode::Content
            },
            buffer: String::new(),
            parse_reasoning,
            tools,
            at_start: true,
            seen_tool_call: false,
        }
    }

    pub fn saw_tool_call(&self) -> bool {
        self.seen_tool_call
    }

    pub fn feed(&mut self, text: &str) -> ParsedDelta {
        self.buffer.push_str(text);
        let mut out = ParsedDelta::default();
        self.drain(&mut out, false);
        out
    }

    /// End of output: whatever is held back is emitted as what it is.
    pub fn finish(&mut self) -> ParsedDelta {
        let mut out = ParsedDelta::default();
        self.drain(&mut out, true);
        let rest = std::mem::take(&mut self.buffer);
        match self.mode {
            Mode::Reasoning => out.reasoning.push_str(&rest),
            Mode::Content => self.push_content(&mut out, &rest),
            // An unterminated tool call: parse what there is, else keep the text.
            Mode::ToolCall => match self.parse_block(&rest) {
                Some(call) => {
                    self.seen_tool_call = true;
                    out.tool_calls.push(call);
                }
                None => out.content.push_str(&format!("{TOOL_START}{rest}")),
            },
        }
        out
    }

    fn push_content(&mut self, out: &mut ParsedDelta, text: &str) {
        // After a tool call, only whitespace separates calls: drop it.
        if self.seen_tool_call && text.trim().is_empty() {
            return;
        }
        if !text.is_empty() {
            self.at_start = false;
        }
        out.content.push_str(text);
    }

    fn drain(&mut self, out: &mut ParsedDelta, at_end: bool) {
        loop {
            match self.mode {
                Mode::Reasoning => {
                    if let Some(at) = self.buffer.find(THINK_END) {
                        out.reasoning.push_str(&self.buffer[..at]);
                        self.buffer.drain(..at + THINK_END.len());
                        self.mode = Mode::Content;
                        self.at_start = false;
                        continue;
                    }
                    let keep = if at_end {
                        0
                    } else {
                        partial_suffix(&self.buffer, &[THINK_END])
                    };
                    let emit = self.buffer.len() - keep;
                    out.reasoning.push_str(&self.buffer[..emit]);
                    self.buffer.drain(..emit);
                    return;
                }
                Mode::ToolCall => {
                    let Some(at) = self.buffer.find(TOOL_END) else {
                        return;
                    };
                    let block = self.buffer[..at].to_string();
                    self.buffer.drain(..at + TOOL_END.len());
                    match self.parse_block(&block) {
                        Some(call) => {
                            self.seen_tool_call = true;
                            out.tool_calls.push(call);
                        }
                        None => {
                            let text = format!("{TOOL_START}{block}{TOOL_END}");
                            self.push_content(out, &text);
                        }
                    }
                    self.mode = Mode::Content;
                }
                Mode::Content => {
                    if self.at_start && self.parse_reasoning {
                        let trimmed = self.buffer.trim_start();
                        if trimmed.starts_with(THINK_START) {
                            let skip = self.buffer.len() - trimmed.len() + THINK_START.len();
                            self.buffer.drain(..skip);
                            self.mode = Mode::Reasoning;
                            continue;
                        }
                        if !at_end && !trimmed.is_empty() && THINK_START.starts_with(trimmed) {
                            return; // may still become <think>
                        }
                    }
                    if self.tools.is_some() {
                        if let Some(at) = self.buffer.find(TOOL_START) {
                            let before = self.buffer[..at].to_string();
                            self.push_content(out, &before);
                            self.buffer.drain(..at + TOOL_START.len());
                            self.mode = Mode::ToolCall;
                            continue;
                        }
                    }
                    let keep = if at_end || self.tools.is_none() {
                        0
                    } else {
                        partial_suffix(&self.buffer, &[TOOL_START])
                    };
                    // Whitespace after a tool call may precede another one.
                    let emit = self.buffer.len() - keep;
                    if self.seen_tool_call && !at_end && self.buffer[..emit].trim().is_empty() {
                        return;
                    }
                    let text = self.buffer[..emit].to_string();
                    self.push_content(out, &text);
                    self.buffer.drain(..emit);
                    return;
                }
            }
        }
    }

    /// Parses the inside of a `<tool_call>` block; `None` if it has no function.
    fn parse_block(&self, block: &str) -> Option<ParsedToolCall> {
        let start = block.find("<function=")? + "<function=".len();
        let name_end = start + block[start..].find('>')?;
        let name = block[start..name_end].trim().to_string();
        let body = &block[name_end + 1..];
        let body = &body[..body.find("</function>").unwrap_or(body.len())];
        let types = self.tools.as_ref().and_then(|t| t.get(&name));
        let mut args: Vec<(Value, Value)> = Vec::new();
        let mut rest = body;
        while let Some(p) = rest.find("<parameter=") {
            let key_start = p + "<parameter=".len();
            let Some(key_len) = rest[key_start..].find('>') else {
                break;
            };
            let key = rest[key_start..key_start + key_len].trim().to_string();
            let value_start = key_start + key_len + 1;
            let after = &rest[value_start..];
            let value_len = ["</parameter>", "<parameter=", "</function>"]
                .iter()
                .filter_map(|end| after.find(end))
                .min()
                .unwrap_or(after.len());
            let mut value = &after[..value_len];
            value = value.strip_prefix('\n').unwrap_or(value);
            value = value.strip_suffix('\n').unwrap_or(value);
            let ty = types.and_then(|t| t.get(&key)).map(String::as_str);
            args.push((Value::from(key), convert_param(value, ty)));
            rest = &after[value_len..];
            rest = rest.strip_prefix("</parameter>").unwrap_or(rest);
        }
        let arguments = pyjson::dumps(
            &Value::from_iter(args),
            &pyjson::DumpOptions::transformers_default(),
        )
        .ok()?;
        Some(ParsedToolCall { name, arguments })
    }
}

/// vLLM `qwen3_coder`'s conversion of a parameter's text by schema type.
fn convert_param(text: &str, ty: Option<&str>) -> Value {
    let Some(ty) = ty else {
        return Value::from(text);
    };
    if text.to_lowercase() == "null" {
        return Value::from(());
    }
    match ty {
        t if is_text_type(t) => Value::from(text),
        t if t.starts_with("int") || t.starts_with("uint") || t == "long" || t == "short" => text
            .trim()
            .parse::<i64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::from(text)),
        t if t.starts_with("num") || t.starts_with("float") || t == "double" => {
            let s = text.trim();
            if s.contains(['.', 'e', 'E']) {
                s.parse::<f64>()
                    .map(Value::from)
                    .unwrap_or_else(|_| Value::from(text))
            } else {
                s.parse::<i64>()
                    .map(Value::from)
                    .unwrap_or_else(|_| Value::from(text))
            }
        }
        "boolean" | "bool" | "binary" => match text.trim().to_lowercase().as_str() {
            "true" => Value::from(true),
            "false" => Value::from(false),
            _ => Value::from(text),
        },
        _ => serde_json::from_str::<Value>(text).unwrap_or_else(|_| Value::from(text)),
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of a tag.
fn partial_suffix(text: &str, tags: &[&str]) -> usize {
    let mut best = 0;
    for tag in tags {
        for k in (1..tag.len()).rev() {
            if k > best && text.ends_with(&tag[..k]) {
                best = k;
                break;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schemas() -> ToolSchemas {
        let tools: Vec<crate::openai::request::Tool> = serde_json::from_str(
            r#"[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "opts": {"type": "object"}}}}}]"#,
        )
        .unwrap();
        tool_schemas(&tools)
    }

    const OUTPUT: &str = "Let me check.\n</think>\n\nSure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"unit\": \"C\"}\n</parameter>\n</function>\n</tool_call>";

    fn collect(parser: &mut ChatOutputParser, pieces: &[&str]) -> ParsedDelta {
        let mut all = ParsedDelta::default();
        let mut deltas: Vec<ParsedDelta> = pieces.iter().map(|p| parser.feed(p)).collect();
        deltas.push(parser.finish());
        for piece in deltas {
            all.reasoning.push_str(&piece.reasoning);
            all.content.push_str(&piece.content);
            all.tool_calls.extend(piece.tool_calls);
        }
        all
    }

    #[test]
    fn whole_output_splits_reasoning_content_and_tool_call() {
        let mut parser = ChatOutputParser::new(true, true, Some(schemas()));
        let all = collect(&mut parser, &[OUTPUT]);
        assert_eq!(all.reasoning, "Let me check.\n");
        assert_eq!(all.content, "\n\nSure.\n");
        assert_eq!(
            all.tool_calls,
            vec![ParsedToolCall {
                name: "get_weather".into(),
                arguments: r#"{"city": "Paris", "days": 3, "opts": {"unit": "C"}}"#.into()
            }]
        );
        assert!(parser.saw_tool_call());
    }

    #[test]
    fn one_character_at_a_time_gives_the_same_result() {
        let mut whole = ChatOutputParser::new(true, true, Some(schemas()));
        let expected = collect(&mut whole, &[OUTPUT]);
        let chars: Vec<String> = OUTPUT.chars().map(|c| c.to_string()).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        let mut streamed = ChatOutputParser::new(true, true, Some(schemas()));
        assert_eq!(collect(&mut streamed, &pieces), expected);
    }

    #[test]
    fn without_tools_or_reasoning_everything_is_content() {
        let mut parser = ChatOutputParser::new(false, true, None);
        let all = collect(&mut parser, &["Hello <tool_call> world"]);
        assert_eq!(all.content, "Hello <tool_call> world");
        assert!(all.reasoning.is_empty());
        let mut parser = ChatOutputParser::new(false, true, None);
        let all = collect(&mut parser, &["<thi", "nk>why</think>answer"]);
        assert_eq!(
            (all.reasoning.as_str(), all.content.as_str()),
            ("why", "answer")
        );
    }

    #[test]
    fn unterminated_reasoning_stays_reasoning() {
        let mut parser = ChatOutputParser::new(true, true, None);
        let all = collect(&mut parser, &["thinking </thi"]);
        assert_eq!(all.reasoning, "thinking </thi");
        assert_eq!(all.content, "");
    }
}
