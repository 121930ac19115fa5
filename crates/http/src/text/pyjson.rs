//! Python's `json.dumps` for template values, byte for byte.
//!
//! Chat templates call `tojson` on tools and tool-call arguments, and the
//! rendered bytes are the model's prompt: transformers renders `tojson` as
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)`, so any difference (key order, separators, escaping,
//! float spelling) changes the tokens the model sees. minijinja's own
//! `tojson` sorts keys and HTML-escapes `<>&'`; this one does neither.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// `json.dumps` options (Python's keyword arguments).
#[derive(Clone, Debug)]
pub struct DumpOptions {
    pub ensure_ascii: bool,
    /// `None`: one line. `Some(s)`: newline + `s` repeated per level.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl DumpOptions {
    /// transformers' `tojson` defaults (note `ensure_ascii=False`).
    pub fn transformers_default() -> Self {
        DumpOptions {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
        }
    }

    /// Reads `ensure_ascii`, `indent`, `separators`, `sort_keys` as Python does
    /// (with an indent, the default item separator loses its space).
    pub fn from_kwargs(kwargs: &Kwargs) -> Result<Self, Error> {
        let mut opts = DumpOptions::transformers_default();
        if let Some(v) = kwargs.get::<Option<bool>>("ensure_ascii")? {
            opts.ensure_ascii = v;
        }
        let indent: Option<Value> = kwargs.get("indent")?;
        if let Some(indent) = indent.filter(|v| !v.is_none() && !v.is_undefined()) {
            opts.indent = Some(match indent.kind() {
                ValueKind::Number => {
                    let n = i64::try_from(indent.clone()).map_err(|_| {
                        Error::new(
                            ErrorKind::InvalidOperation,
                            "tojson: indent must be an integer",
                        )
                    })?;
                    " ".repeat(n.max(0) as usize)
                }
                ValueKind::String => indent.as_str().unwrap_or_default().to_string(),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: indent must be an integer or a string",
                    ))
                }
            });
            opts.item_separator = ",".into();
        }
        let separators: Option<Value> = kwargs.get("separators")?;
        if let Some(seps) = separators.filter(|v| !v.is_none() && !v.is_undefined()) {
            let parts: Vec<Value> = seps.try_iter()?.collect();
            match parts.as_slice() {
                [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                    opts.item_separator = item.as_str().unwrap().to_string();
                    opts.key_separator = key.as_str().unwrap().to_string();
                }
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ))
                }
            }
        }
        if let Some(v) = kwargs.get::<Option<bool>>("sort_keys")? {
            opts.sort_keys = v;
        }
        kwargs.assert_all_used()?;
        Ok(opts)
    }
}

/// `json.dumps(value, **opts)`.
pub fn dumps(value: &Value, opts: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, opts, 0)?;
    Ok(out)
}

fn write_value(
    out: &mut String,
    value: &Value,
    opts: &DumpOptions,
    depth: usize,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Undefined => {
            return Err(Error::new(
                ErrorKind::UndefinedError,
                "tojson: Object of type Undefined is not JSON serializable",
            ))
        }
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number(value)),
        ValueKind::String => {
            write_string(out, value.as_str().unwrap_or_default(), opts.ensure_ascii)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_separator);
                }
                newline_indent(out, opts, depth + 1);
                write_value(out, item, opts, depth + 1)?;
            }
            newline_indent(out, opts, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key_string(&key)?, item));
            }
            if opts.sort_keys {
                // Python compares str keys by code point; Rust's str order is
                // the same (UTF-8 byte order preserves code point order).
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_separator);
                }
                newline_indent(out, opts, depth + 1);
                write_string(out, key, opts.ensure_ascii);
                out.push_str(&opts.key_separator);
                write_value(out, item, opts, depth + 1)?;
            }
            newline_indent(out, opts, depth);
            out.push('}');
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a value of kind {other} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

fn newline_indent(out: &mut String, opts: &DumpOptions, depth: usize) {
    if let Some(indent) = &opts.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

/// Python turns non-string keys into strings: numbers as `str`/`repr`,
/// `True` as "true", `None` as "null".
fn key_string(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::Number => number(key),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
        ValueKind::None => "null".to_string(),
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be str, int, float, bool or None, not {other}"),
            ))
        }
    })
}

fn number(value: &Value) -> String {
    if value.is_integer() {
        // Integers print exactly (minijinja keeps i64/u64/i128 precisely).
        return value.to_string();
    }
    match f64::try_from(value.clone()) {
        Ok(f) => python_float_repr(f),
        Err(_) => value.to_string(),
    }
}

/// `float.__repr__` as `json.dumps` writes it: the shortest digits that
/// round-trip, fixed notation for decimal exponents in [-4, 16), otherwise
/// `d.ddde+XX`; non-finite values as `NaN`, `Infinity`, `-Infinity`.
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    // Rust's `{:e}` is the shortest round-trip form: "-1.2345e-7", "5e0".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{body}")
    } else {
        let mant = if digits.len() == 1 {
            digits.clone()
        } else {
            format!("{}.{}", &digits[..1], &digits[1..])
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mant}e{esign}{:02}", exp.abs())
    }
}

/// A JSON string literal as Python's encoder writes it.
fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            // With ensure_ascii Python escapes everything outside ' '..='~'
            // (DEL included), as UTF-16 units.
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{:04x}", unit));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The `tojson` filter for templates.
pub fn tojson_filter(value: Value, kwargs: Kwargs) -> Result<String, Error> {
    let opts = DumpOptions::from_kwargs(&kwargs)?;
    dumps(&value, &opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Value {
        serde_json::from_str(json).unwrap()
    }

    // Expected strings below were produced by CPython 3.11's json.dumps.
    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (1.5e300, "1.5e+300"),
            (-2.5e-7, "-2.5e-07"),
            (123.456, "123.456"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (f64::INFINITY, "Infinity"),
        ];
        for (f, want) in cases {
            assert_eq!(python_float_repr(f), want, "repr({f})");
        }
    }

    #[test]
    fn default_dumps_keeps_order_and_unicode() {
        let v =
            parse(r#"{"z": 1, "a": [true, null, 2.0], "s": "é<>&'\n\u0001\"", "e": {}, "l": []}"#);
        let got = dumps(&v, &DumpOptions::transformers_default()).unwrap();
        assert_eq!(
            got,
            r#"{"z": 1, "a": [true, null, 2.0], "s": "é<>&'\n\u0001\"", "e": {}, "l": []}"#
        );
    }

    #[test]
    fn ensure_ascii_indent_sort_keys() {
        let v = parse(r#"{"b": "é😀\u007f", "a": [1, {"c": 2}]}"#);
        let opts = DumpOptions {
            ensure_ascii: true,
            indent: Some("  ".into()),
            item_separator: ",".into(),
            key_separator: ": ".into(),
            sort_keys: true,
        };
        let got = dumps(&v, &opts).unwrap();
        let want = "{\n  \"a\": [\n    1,\n    {\n      \"c\": 2\n    }\n  ],\n  \"b\": \"\\u00e9\\ud83d\\ude00\\u007f\"\n}";
        assert_eq!(got, want);
    }

    #[test]
    fn kwargs_from_a_template() {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson_filter);
        let out = env
            .render_str(
                "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(separators=(',', ':'), ensure_ascii=True) }}",
                minijinja::context! { x => parse(r#"{"k": ["é", 1]}"#) },
            )
            .unwrap();
        assert_eq!(
            out,
            "{\"k\": [\"é\", 1]}|{\n  \"k\": [\n    \"é\",\n    1\n  ]\n}|{\"k\":[\"\\u00e9\",1]}"
        );
    }
}
