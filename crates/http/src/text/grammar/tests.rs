use serde_json::json;

use super::*;
use crate::text::outparse::{tool_schemas, ChatOutputParser, ParsedToolCall};

fn tools(json: Json) -> Vec<Tool> {
    serde_json::from_value(json).unwrap()
}

/// A weather tool: `city` (text, required), `days` (integer, optional),
/// `unit` (a string enum, required); names in alphabetical order so that
/// any map order lists them the same way.
fn weather() -> Vec<Tool> {
    tools(
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1},
                "unit": {"type": "string", "enum": ["C", "F"]}
            },
            "required": ["city", "unit"]
        }}}]),
    )
}

#[test]
fn a_tool_becomes_its_call_shape() {
    let shape = call_shape(&weather()[0]);
    assert_eq!(
        shape,
        CallShape {
            name: "get_weather".into(),
            params: vec![
                ParamShape {
                    name: "city".into(),
                    required: true,
                    value: ValueShape::Text(TextLimits::default())
                },
                ParamShape {
                    name: "days".into(),
                    required: false,
                    value: ValueShape::Json(json!({"type": "integer", "minimum": 1}))
                },
                ParamShape {
                    name: "unit".into(),
                    required: true,
                    value: ValueShape::Literals(vec!["C".into(), "F".into()])
                },
            ]
        }
    );
}

#[test]
fn one_named_call_without_reasoning() {
    let grammar = tool_call_grammar(&[call_shape(&weather()[0])], false, false);
    let want = [
        r#"start: calls"#,
        r#"call: fn_0"#,
        r#"calls: call"#,
        r#"fn_0_p0: "<parameter=city>\n" PARAM_TEXT_END"#,
        r#"fn_0_p1_value: %json {"minimum":1,"type":"integer"}"#,
        r#"fn_0_p1: "<parameter=days>\n" fn_0_p1_value "\n</parameter>\n""#,
        r#"FN_0_P2_VALUE: "C" | "F""#,
        r#"fn_0_p2: "<parameter=unit>\n" FN_0_P2_VALUE "\n</parameter>\n""#,
        r#"fn_0: "<tool_call>\n<function=get_weather>\n" fn_0_p0 fn_0_p1? fn_0_p2 "</function>\n</tool_call>""#,
        r#"PARAM_TEXT: /(.|\n)*/ & ~/(.|\n)*(<\/parameter>|<parameter=|<\/function>)(.|\n)*/ & ~/[nN][uU][lL][lL]/"#,
        r#"PARAM_TEXT_END: PARAM_TEXT "\n</parameter>\n""#,
    ];
    let lines: Vec<&str> = grammar.lines().collect();
    // The schema's key order is the map's; compare it parsed.
    assert_eq!(lines.len(), want.len(), "{grammar}");
    for (got, want) in lines.iter().zip(want) {
        if let Some(schema) = want.strip_prefix("fn_0_p1_value: %json ") {
            let got = got.strip_prefix("fn_0_p1_value: %json ").expect(got);
            let got: Json = serde_json::from_str(got).unwrap();
            assert_eq!(got, serde_json::from_str::<Json>(schema).unwrap());
        } else {
            assert_eq!(*got, want);
        }
    }
}

#[test]
fn several_tools_any_number_of_calls_after_reasoning() {
    let all = tools(json!([
        {"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {}}}},
        {"type": "function", "function": {"name": "b"}},
    ]));
    let shapes: Vec<CallShape> = all.iter().map(call_shape).collect();
    let grammar = tool_call_grammar(&shapes, true, true);
    assert_eq!(
        grammar,
        "start: think \"\\n\\n\" calls\n\
         think[lazy]: /(.|\\n)*<\\/think>/\n\
         call: fn_0 | fn_1\n\
         calls: call (\"\\n\" call)*\n\
         fn_0: \"<tool_call>\\n<function=a>\\n\" \"</function>\\n</tool_call>\"\n\
         fn_1: \"<tool_call>\\n<function=b>\\n\" \"</function>\\n</tool_call>\"\n"
    );
    // No text parameter: no text terminals.
    assert!(!grammar.contains("PARAM_TEXT"));
}

#[test]
fn definitions_travel_with_a_json_parameter() {
    let tool = tools(
        json!([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object",
            "$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}}},
            "properties": {"points": {"type": "array", "items": {"$ref": "#/$defs/P"}}},
            "required": ["points"]
        }}}]),
    );
    let shape = call_shape(&tool[0]);
    assert_eq!(
        shape.params[0].value,
        ValueShape::Json(json!({
            "type": "array",
            "items": {"$ref": "#/$defs/P"},
            "$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}}}
        }))
    );
}

#[test]
fn a_required_name_without_property_is_text() {
    let tool = tools(
        json!([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "required": ["q"]
        }}}]),
    );
    assert_eq!(
        call_shape(&tool[0]).params,
        vec![ParamShape {
            name: "q".into(),
            required: true,
            value: ValueShape::Text(TextLimits::default())
        }]
    );
}

/// Writes a call the way the grammar allows it: the opening, each given
/// parameter in the shape's order (every required one must be given, a
/// literal parameter one of its values), the closing.
fn walk(shape: &CallShape, values: &[(&str, &str)]) -> String {
    let mut out = format!("<tool_call>\n<function={}>\n", shape.name);
    for param in &shape.params {
        let Some((_, value)) = values.iter().find(|(k, _)| *k == param.name) else {
            assert!(!param.required, "{} is required", param.name);
            continue;
        };
        match &param.value {
            ValueShape::Literals(allowed) => assert!(allowed.iter().any(|a| a == value)),
            ValueShape::Text(_) => {
                for end in ["</parameter>", "<parameter=", "</function>"] {
                    assert!(!value.contains(end));
                }
            }
            ValueShape::Json(_) => {
                serde_json::from_str::<Json>(value).unwrap();
            }
        }
        out.push_str(&format!(
            "<parameter={}>\n{value}\n</parameter>\n",
            param.name
        ));
    }
    out.push_str("</function>\n</tool_call>");
    out
}

fn parse(tools: &[Tool], opens_reasoning: bool, output: &str) -> (String, Vec<ParsedToolCall>) {
    let mut parser = ChatOutputParser::new(opens_reasoning, true, Some(tool_schemas(tools)));
    let mut delta = parser.feed(output);
    let rest = parser.finish();
    delta.content.push_str(&rest.content);
    delta.tool_calls.extend(rest.tool_calls);
    assert!(parser.saw_tool_call());
    (delta.content, delta.tool_calls)
}

#[test]
fn the_parser_reads_back_what_the_grammar_allows() {
    let weather = weather();
    let shape = call_shape(&weather[0]);
    let cases = [
        (
            vec![("city", "Paris"), ("unit", "C")],
            json!({"city": "Paris", "unit": "C"}),
        ),
        (
            vec![("city", "New\nYork <b>"), ("days", "3"), ("unit", "F")],
            json!({"city": "New\nYork <b>", "days": 3, "unit": "F"}),
        ),
        // Text that looks like a number stays text.
        (
            vec![("city", "42"), ("unit", "C")],
            json!({"city": "42", "unit": "C"}),
        ),
    ];
    for (values, want) in cases {
        let call = walk(&shape, &values);
        let (content, calls) = parse(&weather, false, &call);
        assert_eq!(content, "");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_weather");
        let args: Json = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(args, want);
    }
}

#[test]
fn json_parameters_and_several_calls_after_reasoning_parse_back() {
    let all = tools(json!([
        {"type": "function", "function": {"name": "plot", "parameters": {"type": "object",
            "properties": {"flags": {"type": "object"}, "points": {"type": "array"}, "scale": {"type": "number"}, "show": {"type": "boolean"}},
            "required": ["points"]}}},
        {"type": "function", "function": {"name": "noop"}},
    ]));
    let shapes: Vec<CallShape> = all.iter().map(call_shape).collect();
    // start: think "\n\n" call ("\n" call)*
    let output = format!(
        "hmm\n</think>\n\n{}\n{}",
        walk(
            &shapes[0],
            &[
                ("flags", r#"{"a": [1, null]}"#),
                ("points", "[[1, 2], [3, 4]]"),
                ("scale", "0.5"),
                ("show", "true")
            ]
        ),
        walk(&shapes[1], &[])
    );
    let (content, calls) = parse(&all, true, &output);
    assert_eq!(content.trim(), "");
    let args: Vec<Json> = calls
        .iter()
        .map(|c| serde_json::from_str(&c.arguments).unwrap())
        .collect();
    assert_eq!(
        args,
        vec![
            json!({"flags": {"a": [1, null]}, "points": [[1, 2], [3, 4]], "scale": 0.5, "show": true}),
            json!({})
        ]
    );
    assert_eq!(calls[1].name, "noop");
}

#[test]
fn client_constraints_after_reasoning() {
    assert_eq!(
        after_reasoning(&json_rule(&json!({"type": "object"}))),
        "start: think body\nthink[lazy]: /(.|\\n)*<\\/think>/\nbody: %json {\"type\":\"object\"}\n"
    );
    assert_eq!(json_rule(&json!(true)), "%json {}");
    assert_eq!(json_rule(&json!(false)), "%json {\"not\":{}}");
    assert_eq!(regex_terminal("a/b"), "/a\\/b/");
    assert_eq!(regex_terminal("a\\/b"), "/a\\/b/", "already escaped");
    assert_eq!(
        regex_terminal("a\\\\/b"),
        "/a\\\\\\/b/",
        "an escaped backslash"
    );
    assert_eq!(regex_terminal("x\ny"), "/x\\ny/");
    assert_eq!(
        after_reasoning_choice(&["yes".into(), "say \"no\"\n".into()]),
        "start: think body\nthink[lazy]: /(.|\\n)*<\\/think>/\nbody: CHOICE\nCHOICE: \"yes\" | \"say \\\"no\\\"\\n\"\n"
    );
}

#[test]
fn string_limits_bound_a_text_parameter() {
    let tool = tools(
        json!([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "note": {"type": "string", "maxLength": 12},
                "word": {"type": "string", "minLength": 2, "pattern": "a/b"}
            },
            "required": ["code", "note", "word"]
        }}}]),
    );
    let grammar = tool_call_grammar(&[call_shape(&tool[0])], false, false);
    for line in [
        r#"FN_0_P0_TEXT: PARAM_TEXT & /([A-Z]{3})/"#,
        r#"fn_0_p0: "<parameter=code>\n" FN_0_P0_TEXT "\n</parameter>\n""#,
        r#"FN_0_P1_TEXT: PARAM_TEXT & /(.|\n){0,12}/"#,
        r#"FN_0_P2_TEXT: PARAM_TEXT & /(.|\n){2,}/ & /(.|\n)*(a\/b)(.|\n)*/"#,
    ] {
        assert!(grammar.lines().any(|l| l == line), "{line}\n{grammar}");
    }
    assert!(grammar.lines().any(|l| l.starts_with("PARAM_TEXT: ")));
    assert!(!grammar.contains("PARAM_TEXT_END"), "unused: {grammar}");
}

#[test]
fn string_literals_escape_what_the_lark_lexer_refuses_raw() {
    // llguidance's Lark strings take JSON's escapes and no raw control
    // character or DEL (a fuzzed tool name held both).
    let literal = lark_string("a\u{7f}b\u{1e}c\"d\\e");
    assert_eq!(literal, r#""a\u007fb\u001ec\"d\\e""#);
    assert!(!literal.chars().any(|c| c.is_control()), "{literal:?}");
}
