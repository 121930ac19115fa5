//! STAND-IN for the engine side of structured outputs (built on another
//! branch): only the types and the pre-check the server codes against.
//! The real module compiles the constraint with llguidance.

use crate::EngineHandle;

/// What a request's output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    /// A JSON schema (an object or a bool).
    JsonSchema(serde_json::Value),
    /// Any JSON object.
    JsonObject,
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// An llguidance Lark grammar; may embed `%json { schema }` parts.
    Lark(String),
}

/// Why a constraint cannot be compiled (the compiler's message).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ConstraintError {
    pub message: String,
}

impl EngineHandle {
    /// Compiles `spec` without submitting anything, so that the server can
    /// answer a bad schema, regex or grammar with a 400 naming the field.
    /// STAND-IN: accepts everything; the real check compiles with llguidance.
    pub fn check_constraint(&self, _spec: &ConstraintSpec) -> Result<(), ConstraintError> {
        Ok(())
    }
}
