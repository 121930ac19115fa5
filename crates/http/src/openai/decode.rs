//! Request bodies -> request types, with serde's refusals as OpenAI errors.

use serde::de::DeserializeOwned;

use super::error::ApiError;

/// 400 for anything serde refuses (malformed JSON, wrong types, NaN,
/// numbers out of range, invalid UTF-8), with the dotted path of the
/// offending field as `param`.
pub fn decode_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(refusal)?;
    de.end().map_err(|e| {
        ApiError::malformed_body(format!("The request body is not valid JSON: {e}"), None)
    })?;
    Ok(value)
}

/// [`decode_json`] of a body whose top-level `ignored` fields are not the
/// endpoint's: they are dropped unread, as unknown fields are (chat and
/// completions share one request type, and each ignores the other's
/// fields).
pub fn decode_json_ignoring<T: DeserializeOwned>(
    bytes: &[u8],
    ignored: &[&str],
) -> Result<T, ApiError> {
    let mut value: serde_json::Value = decode_json(bytes)?;
    if let Some(fields) = value.as_object_mut() {
        for field in ignored {
            fields.remove(*field);
        }
    }
    serde_path_to_error::deserialize(value).map_err(refusal)
}

fn refusal(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let param = (path != ".").then_some(path);
    let inner = e.into_inner();
    let message = match inner.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            format!("The request body is not valid JSON: {inner}")
        }
        _ => format!("Invalid request body: {inner}"),
    };
    ApiError::malformed_body(message, param)
}
