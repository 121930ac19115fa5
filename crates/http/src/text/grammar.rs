//! Lark grammars in llguidance's dialect (its docs/syntax.md) that the
//! server writes itself: a forced tool call in Qwen3.5's XML format with
//! arguments that follow each tool's JSON schema, and a client's
//! constraint placed after the reasoning block that a chat prompt opens.
//!
//! A tool call is what [`super::outparse`] parses and the chat template
//! renders:
//! `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n...</function>\n</tool_call>`.
//! A parameter the parser keeps as text ([`is_text_type`]) is raw text
//! that cannot end the block early (no `</parameter>`, `<parameter=` or
//! `</function>` inside, and not `null`, which the parser reads as null),
//! within the schema's `minLength`, `maxLength` and `pattern`; a string
//! enum is one of its values. Any other parameter is JSON that
//! follows the property's schema (`%json`). Required parameters appear,
//! optional ones may, in the order of `properties`.

use serde_json::Value as Json;

use super::outparse::{is_text_type, parameter_type};
use crate::openai::request::Tool;

/// The reasoning block a chat prompt opened with `<think>\n`: any text up
/// to the first `</think>` (lazy: it ends there).
const THINK_RULE: &str = "think[lazy]: /(.|\\n)*<\\/think>/\n";

/// Text of a text parameter.
const PARAM_TEXT: &str = "PARAM_TEXT: /(.|\\n)*/ & ~/(.|\\n)*(<\\/parameter>|<parameter=|<\\/function>)(.|\\n)*/ & ~/[nN][uU][lL][lL]/\n";
/// Text of a text parameter, then the end of the parameter (one lexeme:
/// the text cannot go on past the end).
const PARAM_TEXT_END: &str = "PARAM_TEXT_END: PARAM_TEXT \"\\n</parameter>\\n\"\n";

/// What one parameter's value may be.
#[derive(Clone, Debug, PartialEq)]
pub enum ValueShape {
    /// Raw text.
    Text(TextLimits),
    /// Exactly one of these texts (a string `enum` or `const`).
    Literals(Vec<String>),
    /// JSON following this schema.
    Json(Json),
}

/// A string schema's limits on a text parameter.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TextLimits {
    pub min_length: Option<u64>,
    pub max_length: Option<u64>,
    /// A regex the text contains (JSON schema's `pattern`).
    pub pattern: Option<String>,
}

impl TextLimits {
    fn of(schema: &Json) -> Self {
        let count = |key| schema.get(key).and_then(Json::as_u64);
        TextLimits {
            min_length: count("minLength"),
            max_length: count("maxLength"),
            pattern: schema
                .get("pattern")
                .and_then(Json::as_str)
                .map(str::to_string),
        }
    }

    /// Terminals the text must also match (none: any text).
    fn terminals(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.min_length.is_some() || self.max_length.is_some() {
            let min = self.min_length.unwrap_or(0);
            let max = self.max_length.map(|m| m.to_string()).unwrap_or_default();
            out.push(format!("/(.|\\n){{{min},{max}}}/"));
        }
        if let Some(pattern) = &self.pattern {
            // A JSON-schema pattern is searched for, not matched whole.
            let start = pattern.strip_prefix('^');
            let inner = start.unwrap_or(pattern);
            let end = inner.strip_suffix('$').filter(|i| !i.ends_with('\\'));
            let inner = end.unwrap_or(inner);
            let regex = format!(
                "{}({inner}){}",
                if start.is_some() { "" } else { "(.|\\n)*" },
                if end.is_some() { "" } else { "(.|\\n)*" }
            );
            out.push(regex_terminal(&regex));
        }
        out
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ParamShape {
    pub name: String,
    pub required: bool,
    pub value: ValueShape,
}

/// A function's call as the grammar allows it.
#[derive(Clone, Debug, PartialEq)]
pub struct CallShape {
    pub name: String,
    pub params: Vec<ParamShape>,
}

/// The call shape of a tool, from its `parameters` schema.
pub fn call_shape(tool: &Tool) -> CallShape {
    let schema = tool.function.parameters.as_ref();
    let properties = schema
        .and_then(|s| s.get("properties"))
        .and_then(Json::as_object);
    let required: Vec<&str> = schema
        .and_then(|s| s.get("required"))
        .and_then(Json::as_array)
        .map(|r| r.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    // `$ref`s inside a property point at the root's definitions: each
    // property's schema takes them along.
    let definitions: Vec<(&str, &Json)> = ["$defs", "definitions"]
        .into_iter()
        .filter_map(|key| Some((key, schema?.get(key)?)))
        .collect();
    let definitions = definitions.as_slice();
    let mut params: Vec<ParamShape> = properties
        .into_iter()
        .flatten()
        .map(|(name, schema)| ParamShape {
            name: name.clone(),
            required: required.contains(&name.as_str()),
            value: value_shape(schema, definitions),
        })
        .collect();
    // A required name without a property: text, as the parser reads it.
    for name in required {
        if !params.iter().any(|p| p.name == name) {
            params.push(ParamShape {
                name: name.to_string(),
                required: true,
                value: ValueShape::Text(TextLimits::default()),
            });
        }
    }
    CallShape {
        name: tool.function.name.clone(),
        params,
    }
}

fn value_shape(schema: &Json, definitions: &[(&str, &Json)]) -> ValueShape {
    if !is_text_type(parameter_type(schema)) {
        let mut schema = schema.clone();
        if let Json::Object(map) = &mut schema {
            for (key, defs) in definitions {
                map.entry(key.to_string())
                    .or_insert_with(|| (*defs).clone());
            }
        }
        return ValueShape::Json(schema);
    }
    let strings = |values: &[Json]| -> Option<Vec<String>> {
        values
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    let listed = match (schema.get("const"), schema.get("enum")) {
        (Some(c), _) => strings(std::slice::from_ref(c)),
        (None, Some(Json::Array(values))) if !values.is_empty() => strings(values),
        _ => None,
    };
    listed.map_or_else(
        || ValueShape::Text(TextLimits::of(schema)),
        ValueShape::Literals,
    )
}

/// A grammar whose every output is tool calls in Qwen3.5's format, each
/// a call of one of `calls`: one call, or one or more with `many`.
/// `opens_reasoning`: the prompt ends inside `<think>`, so the output
/// first closes the reasoning block.
pub fn tool_call_grammar(calls: &[CallShape], many: bool, opens_reasoning: bool) -> String {
    let mut g = String::new();
    if opens_reasoning {
        g.push_str("start: think \"\\n\\n\" calls\n");
        g.push_str(THINK_RULE);
    } else {
        g.push_str("start: calls\n");
    }
    let alternatives: Vec<String> = (0..calls.len()).map(|i| format!("fn_{i}")).collect();
    g.push_str(&format!("call: {}\n", alternatives.join(" | ")));
    if many {
        g.push_str("calls: call (\"\\n\" call)*\n");
    } else {
        g.push_str("calls: call\n");
    }
    let (mut uses_text, mut uses_text_end) = (false, false);
    for (i, call) in calls.iter().enumerate() {
        let mut body = vec![lark_string(&format!(
            "<tool_call>\n<function={}>\n",
            call.name
        ))];
        for (j, param) in call.params.iter().enumerate() {
            let rule = format!("fn_{i}_p{j}");
            let open = lark_string(&format!("<parameter={}>\n", param.name));
            let close = lark_string("\n</parameter>\n");
            let value = match &param.value {
                ValueShape::Text(limits) => {
                    let terminals = limits.terminals();
                    uses_text = true;
                    if terminals.is_empty() {
                        uses_text_end = true;
                        format!("{open} PARAM_TEXT_END")
                    } else {
                        let name = format!("FN_{i}_P{j}_TEXT");
                        g.push_str(&format!("{name}: PARAM_TEXT & {}\n", terminals.join(" & ")));
                        format!("{open} {name} {close}")
                    }
                }
                ValueShape::Literals(values) => {
                    let name = format!("FN_{i}_P{j}_VALUE");
                    g.push_str(&literal_terminal(&name, values));
                    format!("{open} {name} {close}")
                }
                ValueShape::Json(schema) => {
                    g.push_str(&format!("{rule}_value: {}\n", json_rule(schema)));
                    format!("{open} {rule}_value {close}")
                }
            };
            g.push_str(&format!("{rule}: {value}\n"));
            body.push(if param.required {
                rule
            } else {
                format!("{rule}?")
            });
        }
        body.push(lark_string("</function>\n</tool_call>"));
        g.push_str(&format!("fn_{i}: {}\n", body.join(" ")));
    }
    if uses_text {
        g.push_str(PARAM_TEXT);
    }
    if uses_text_end {
        g.push_str(PARAM_TEXT_END);
    }
    g
}

/// A grammar of the reasoning block the prompt opened, then `body` (a rule
/// body: [`json_rule`], [`regex_terminal`], or a terminal's name whose
/// definition follows, as [`after_reasoning_choice`] writes).
pub fn after_reasoning(body: &str) -> String {
    format!("start: think body\n{THINK_RULE}body: {body}\n")
}

/// [`after_reasoning`] of exactly one of `values`.
pub fn after_reasoning_choice(values: &[String]) -> String {
    after_reasoning("CHOICE") + &literal_terminal("CHOICE", values)
}

/// `%json` of a schema (a boolean schema as the object equivalent).
pub fn json_rule(schema: &Json) -> String {
    let schema = match schema {
        Json::Bool(true) => serde_json::json!({}),
        Json::Bool(false) => serde_json::json!({"not": {}}),
        other => other.clone(),
    };
    format!("%json {schema}")
}

/// A regex as a Lark `/.../` terminal: an unescaped `/` and a raw newline
/// are escaped (the regex itself is unchanged).
pub fn regex_terminal(regex: &str) -> String {
    let mut out = String::with_capacity(regex.len() + 2);
    out.push('/');
    let mut escaped = false;
    for c in regex.chars() {
        match c {
            '/' if !escaped => out.push_str("\\/"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            _ => out.push(c),
        }
        escaped = c == '\\' && !escaped;
    }
    out.push('/');
    out
}

/// The terminal `name`: exactly one of `values`, as Lark string literals.
/// A terminal is one lexeme, whose automaton takes the alternatives however
/// many; as alternatives of a rule, each would be an item of a parser row,
/// and llguidance fails a row over 2,000 items (a list that long failed
/// the request where it was reached).
fn literal_terminal(name: &str, values: &[String]) -> String {
    let values: Vec<String> = values.iter().map(|v| lark_string(v)).collect();
    format!("{name}: {}\n", values.join(" | "))
}

/// A Lark string literal (JSON's escapes). llguidance's Lark lexer also
/// refuses a raw DEL in a string, which JSON leaves unescaped.
fn lark_string(text: &str) -> String {
    Json::String(text.to_string())
        .to_string()
        .replace('\u{7f}', "\\u007f")
}

#[cfg(test)]
mod tests;
