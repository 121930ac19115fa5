//! Structured outputs: the request fields that constrain the output's shape
//! (OpenAI's `response_format`, vLLM's `structured_outputs` and its older
//! `guided_*` fields) -> at most one engine [`ConstraintSpec`], with the
//! field it came from so that a compile error can name it.

use engine::ConstraintSpec;
use serde_json::Value as Json;

use super::ValidationError;
use crate::openai::request::{GenerationRequest, ResponseFormat};

/// Default of `--max-constraint-bytes`: the longest schema, regex, grammar
/// or choice list a request may give (compile time grows with it).
pub const DEFAULT_MAX_CONSTRAINT_BYTES: usize = 64 * 1024;

/// A constraint and the request field it came from (an error's `param`).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestedConstraint {
    pub field: &'static str,
    pub spec: ConstraintSpec,
}

impl RequestedConstraint {
    fn new(field: &'static str, spec: ConstraintSpec) -> Self {
        RequestedConstraint { field, spec }
    }
}

/// The one constraint the request asks for, if any. More than one (say
/// `response_format` and `guided_regex`) is refused, naming them all; so
/// is a constraint text longer than `max_bytes`.
pub fn requested_constraint(
    req: &GenerationRequest,
    max_bytes: usize,
) -> Result<Option<RequestedConstraint>, ValidationError> {
    let mut found = Vec::new();
    if let Some(format) = &req.response_format {
        found.extend(response_format(format)?);
    }
    if let Some(so) = &req.structured_outputs {
        let before = found.len();
        if let Some(schema) = &so.json {
            found.push(json_schema("structured_outputs.json", schema)?);
        }
        if let Some(regex) = &so.regex {
            let spec = ConstraintSpec::Regex(regex.clone());
            found.push(RequestedConstraint::new("structured_outputs.regex", spec));
        }
        if let Some(choice) = &so.choice {
            found.push(choices("structured_outputs.choice", choice)?);
        }
        if let Some(grammar) = &so.grammar {
            let spec = ConstraintSpec::Lark(grammar.clone());
            found.push(RequestedConstraint::new("structured_outputs.grammar", spec));
        }
        if so.json_object == Some(true) {
            let spec = ConstraintSpec::JsonObject;
            found.push(RequestedConstraint::new(
                "structured_outputs.json_object",
                spec,
            ));
        }
        // `json_object: false` asks for no constraint in so many words;
        // nothing at all is more likely a misspelling.
        if found.len() == before && so.json_object.is_none() {
            return Err(ValidationError::EmptyConstraint {
                field: "structured_outputs",
            });
        }
    }
    if let Some(schema) = &req.guided_json {
        found.push(json_schema("guided_json", schema)?);
    }
    if let Some(regex) = &req.guided_regex {
        let spec = ConstraintSpec::Regex(regex.clone());
        found.push(RequestedConstraint::new("guided_regex", spec));
    }
    if let Some(choice) = &req.guided_choice {
        found.push(choices("guided_choice", choice)?);
    }
    if let Some(grammar) = &req.guided_grammar {
        let spec = ConstraintSpec::Lark(grammar.clone());
        found.push(RequestedConstraint::new("guided_grammar", spec));
    }
    if found.len() > 1 {
        return Err(ValidationError::ConflictingConstraints {
            fields: found.iter().map(|c| c.field).collect(),
        });
    }
    let Some(constraint) = found.pop() else {
        return Ok(None);
    };
    check_size(constraint.field, &constraint.spec, max_bytes)?;
    check_length_controls(req, constraint.field)?;
    Ok(Some(constraint))
}

/// Refuses `min_tokens` (above 0) and `ignore_eos: true` beside a
/// constraint (`constraint` names where it came from). A constrained
/// output ends where the constraint does: once it has ended only EOS is
/// allowed, so neither can be honoured there, and the engine would
/// otherwise let the constraint win without a word. Whether a grammar's
/// outputs can all reach `min_tokens` is not computable in general (token
/// counts depend on how the model spells the text), so a `min_tokens`
/// some grammars could meet is refused as well; vLLM instead lets a
/// finished grammar end the output below `min_tokens`.
pub fn check_length_controls(
    req: &GenerationRequest,
    constraint: &'static str,
) -> Result<(), ValidationError> {
    if req.min_tokens.is_some_and(|n| n > 0) {
        return Err(ValidationError::LengthControlWithConstraint {
            field: "min_tokens",
            constraint,
        });
    }
    if req.ignore_eos == Some(true) {
        return Err(ValidationError::LengthControlWithConstraint {
            field: "ignore_eos",
            constraint,
        });
    }
    Ok(())
}

/// Refuses a constraint whose text is longer than `max_bytes`.
pub fn check_size(
    field: &'static str,
    spec: &ConstraintSpec,
    max_bytes: usize,
) -> Result<(), ValidationError> {
    let bytes = match spec {
        ConstraintSpec::JsonSchema(schema) => schema.to_string().len(),
        ConstraintSpec::JsonObject => 0,
        ConstraintSpec::Regex(text) | ConstraintSpec::Lark(text) => text.len(),
        ConstraintSpec::Choice(list) => list.iter().map(String::len).sum(),
    };
    if bytes > max_bytes {
        return Err(ValidationError::ConstraintTooLarge {
            field,
            bytes,
            max: max_bytes,
        });
    }
    Ok(())
}

fn response_format(
    format: &ResponseFormat,
) -> Result<Option<RequestedConstraint>, ValidationError> {
    match format.kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some(RequestedConstraint::new(
            "response_format",
            ConstraintSpec::JsonObject,
        ))),
        "json_schema" => {
            let schema = format
                .json_schema
                .as_ref()
                .ok_or(ValidationError::MissingField {
                    field: "response_format.json_schema",
                })?
                .schema
                .as_ref()
                .ok_or(ValidationError::MissingField {
                    field: "response_format.json_schema.schema",
                })?;
            json_schema("response_format.json_schema.schema", schema).map(Some)
        }
        other => Err(ValidationError::OutOfRange {
            field: "response_format.type",
            range: "one of 'text', 'json_object', 'json_schema'",
            value: format!("'{other}'"),
        }),
    }
}

/// A schema is an object or a boolean; vLLM also takes JSON text of one.
fn json_schema(field: &'static str, value: &Json) -> Result<RequestedConstraint, ValidationError> {
    let bad = |value: String| ValidationError::OutOfRange {
        field,
        range: "a JSON schema (an object or a boolean, or JSON text of one)",
        value,
    };
    let schema = match value {
        Json::Object(_) | Json::Bool(_) => value.clone(),
        Json::String(text) => match serde_json::from_str::<Json>(text) {
            Ok(parsed @ (Json::Object(_) | Json::Bool(_))) => parsed,
            Ok(other) => return Err(bad(format!("text of {}", kind_of(&other)))),
            Err(e) => return Err(bad(format!("text that is not JSON ({e})"))),
        },
        other => return Err(bad(kind_of(other).into())),
    };
    Ok(RequestedConstraint::new(
        field,
        ConstraintSpec::JsonSchema(schema),
    ))
}

fn choices(field: &'static str, list: &[String]) -> Result<RequestedConstraint, ValidationError> {
    if list.is_empty() {
        return Err(ValidationError::OutOfRange {
            field,
            range: "a non-empty list of strings",
            value: "[]".into(),
        });
    }
    Ok(RequestedConstraint::new(
        field,
        ConstraintSpec::Choice(list.to_vec()),
    ))
}

fn kind_of(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn constraint(fields: &str) -> Result<Option<RequestedConstraint>, ValidationError> {
        let req: GenerationRequest = serde_json::from_str(&format!("{{{fields}}}")).unwrap();
        requested_constraint(&req, 1000)
    }

    fn spec(fields: &str) -> (&'static str, ConstraintSpec) {
        let c = constraint(fields).unwrap().expect("a constraint");
        (c.field, c.spec)
    }

    #[test]
    fn structured_outputs_naming_no_constraint_is_refused() {
        for fields in [
            r#""structured_outputs": {}"#,
            r#""structured_outputs": {"regex": null}"#,
        ] {
            let err = constraint(fields).unwrap_err();
            assert_eq!(
                err,
                ValidationError::EmptyConstraint {
                    field: "structured_outputs"
                },
                "{fields}"
            );
            assert_eq!(err.param().as_deref(), Some("structured_outputs"));
        }
        // Absent, null or `json_object: false`: no constraint asked, none
        // refused.
        assert!(constraint(r#""structured_outputs": null"#)
            .unwrap()
            .is_none());
        assert!(constraint(r#""max_tokens": 4"#).unwrap().is_none());
    }

    #[test]
    fn structured_outputs_with_an_unknown_key_does_not_parse() {
        for body in [
            r#"{"structured_outputs": {"yaml": "a: 1"}}"#,
            r#"{"structured_outputs": {"regex": "[a-z]+", "rgex": "[0-9]+"}}"#,
        ] {
            let err = serde_json::from_str::<GenerationRequest>(body).unwrap_err();
            let message = err.to_string();
            assert!(message.contains("unknown field"), "{body}: {message}");
        }
    }

    #[test]
    fn every_field_form_gives_its_constraint() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let cases = [
            (
                r#""response_format": {"type": "json_object"}"#,
                ("response_format", ConstraintSpec::JsonObject),
            ),
            (
                r#""response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}"#,
                (
                    "response_format.json_schema.schema",
                    ConstraintSpec::JsonSchema(schema.clone()),
                ),
            ),
            (
                r#""structured_outputs": {"json": {"type": "object", "properties": {"a": {"type": "integer"}}}}"#,
                (
                    "structured_outputs.json",
                    ConstraintSpec::JsonSchema(schema.clone()),
                ),
            ),
            (
                r#""structured_outputs": {"json": "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}"}"#,
                (
                    "structured_outputs.json",
                    ConstraintSpec::JsonSchema(schema.clone()),
                ),
            ),
            (
                r#""structured_outputs": {"regex": "[0-9]+"}"#,
                (
                    "structured_outputs.regex",
                    ConstraintSpec::Regex("[0-9]+".into()),
                ),
            ),
            (
                r#""structured_outputs": {"choice": ["yes", "no"]}"#,
                (
                    "structured_outputs.choice",
                    ConstraintSpec::Choice(vec!["yes".into(), "no".into()]),
                ),
            ),
            (
                r#""structured_outputs": {"grammar": "start: \"a\""}"#,
                (
                    "structured_outputs.grammar",
                    ConstraintSpec::Lark("start: \"a\"".into()),
                ),
            ),
            (
                r#""structured_outputs": {"json_object": true}"#,
                ("structured_outputs.json_object", ConstraintSpec::JsonObject),
            ),
            (
                r#""guided_json": true"#,
                ("guided_json", ConstraintSpec::JsonSchema(json!(true))),
            ),
            (
                r#""guided_regex": "a|b""#,
                ("guided_regex", ConstraintSpec::Regex("a|b".into())),
            ),
            (
                r#""guided_choice": ["x"]"#,
                ("guided_choice", ConstraintSpec::Choice(vec!["x".into()])),
            ),
            (
                r#""guided_grammar": "start: /[a-z]+/""#,
                (
                    "guided_grammar",
                    ConstraintSpec::Lark("start: /[a-z]+/".into()),
                ),
            ),
        ];
        for (fields, want) in cases {
            assert_eq!(spec(fields), want, "{fields}");
        }
    }

    #[test]
    fn no_constraint_where_none_is_asked_for() {
        assert_eq!(constraint(r#""model": "m""#), Ok(None));
        assert_eq!(
            constraint(r#""response_format": {"type": "text"}"#),
            Ok(None)
        );
        assert_eq!(
            constraint(r#""structured_outputs": {"json_object": false}"#),
            Ok(None)
        );
    }

    #[test]
    fn two_constraints_are_refused_naming_both() {
        let e = constraint(r#""response_format": {"type": "json_object"}, "guided_regex": "a""#)
            .unwrap_err();
        assert_eq!(
            e,
            ValidationError::ConflictingConstraints {
                fields: vec!["response_format", "guided_regex"]
            }
        );
        let message = e.to_string();
        assert!(
            message.contains("response_format") && message.contains("guided_regex"),
            "{message}"
        );
        assert_eq!(e.param().as_deref(), Some("guided_regex"));
        let e = constraint(r#""structured_outputs": {"regex": "a", "choice": ["a"]}"#).unwrap_err();
        assert_eq!(
            e,
            ValidationError::ConflictingConstraints {
                fields: vec!["structured_outputs.regex", "structured_outputs.choice"]
            }
        );
    }

    #[test]
    fn bad_shapes_name_the_field() {
        for (fields, param) in [
            (
                r#""response_format": {"type": "xml"}"#,
                "response_format.type",
            ),
            (
                r#""response_format": {"type": "json_schema"}"#,
                "response_format.json_schema",
            ),
            (
                r#""response_format": {"type": "json_schema", "json_schema": {"name": "x"}}"#,
                "response_format.json_schema.schema",
            ),
            (r#""guided_json": "[1]""#, "guided_json"),
            (r#""guided_json": "{not json""#, "guided_json"),
            (r#""guided_choice": []"#, "guided_choice"),
            (
                r#""structured_outputs": {"choice": []}"#,
                "structured_outputs.choice",
            ),
        ] {
            let e = constraint(fields).unwrap_err();
            assert_eq!(e.param().as_deref(), Some(param), "{fields}: {e}");
            assert_eq!(e.code(), "invalid_value", "{fields}");
        }
    }

    #[test]
    fn a_schema_of_the_wrong_type_is_refused_as_the_body_is_read() {
        for (fields, param) in [
            (
                r#""response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}"#,
                "response_format.json_schema.schema",
            ),
            // Even where the type does not use it.
            (
                r#""response_format": {"type": "text", "json_schema": {"schema": [1]}}"#,
                "response_format.json_schema.schema",
            ),
            (r#""guided_json": [1]"#, "guided_json"),
            (
                r#""structured_outputs": {"json": 2}"#,
                "structured_outputs.json",
            ),
        ] {
            let e = crate::openai::decode::decode_json::<GenerationRequest>(
                format!("{{{fields}}}").as_bytes(),
            )
            .unwrap_err();
            let body = e.body();
            assert_eq!(body["error"]["param"], param, "{fields}");
            let message = body["error"]["message"].as_str().unwrap();
            assert!(message.contains("a JSON schema must be"), "{message}");
        }
        // null is absent.
        assert_eq!(constraint(r#""guided_json": null"#), Ok(None));
    }

    #[test]
    fn a_constraint_over_the_limit_is_refused_before_the_engine() {
        let long = "a".repeat(1001);
        let e = constraint(&format!(r#""guided_regex": "{long}""#)).unwrap_err();
        assert_eq!(
            e,
            ValidationError::ConstraintTooLarge {
                field: "guided_regex",
                bytes: 1001,
                max: 1000
            }
        );
        assert!(e.to_string().contains("--max-constraint-bytes"), "{e}");
        let e = constraint(&format!(
            r#""guided_json": {{"type": "string", "description": "{long}"}}"#
        ))
        .unwrap_err();
        assert_eq!(e.param().as_deref(), Some("guided_json"));
        let e = constraint(&format!(r#""guided_choice": ["{long}"]"#)).unwrap_err();
        assert_eq!(e.param().as_deref(), Some("guided_choice"));
        let at_limit = "a".repeat(1000);
        assert!(constraint(&format!(r#""guided_grammar": "{at_limit}""#)).is_ok());
    }

    #[test]
    fn min_tokens_and_ignore_eos_beside_a_constraint_are_refused() {
        for (fields, param) in [
            (r#""guided_regex": "a+", "min_tokens": 3"#, "min_tokens"),
            (r#""guided_regex": "a+", "ignore_eos": true"#, "ignore_eos"),
        ] {
            let e = constraint(fields).unwrap_err();
            assert_eq!(e.param().as_deref(), Some(param), "{fields}");
            let message = e.to_string();
            assert!(message.contains("with guided_regex"), "{message}");
        }
        // Their defaults written out are fine, and alone they are.
        let fine = r#""guided_regex": "a+", "min_tokens": 0, "ignore_eos": false"#;
        assert!(constraint(fine).unwrap().is_some());
        assert_eq!(
            constraint(r#""min_tokens": 3, "ignore_eos": true"#),
            Ok(None)
        );
    }
}
