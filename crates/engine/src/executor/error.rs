//! How a step (or a cache operation) can fail, and what the engine does
//! about each kind.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ExecError {
    /// The executor refused the step before touching any state (a bug in the
    /// engine or an unsupported shape); the rows' states are unchanged.
    #[error("step refused: {0}")]
    Refused(String),
    /// The device failed while running the step: the states of the step's
    /// slots are undefined (the engine fails or recomputes those requests),
    /// other slots are intact.
    #[error("step failed: {0}")]
    StepFailed(String),
    /// The executor is unusable (lost device): the engine stops.
    #[error("executor lost: {0}")]
    Fatal(String),
}

impl ExecError {
    /// A stable label for the kind of failure (a metric label, a log
    /// field): `"refused"`, `"step_failed"` or `"fatal"`.
    pub fn kind(&self) -> &'static str {
        match self {
            ExecError::Refused(_) => "refused",
            ExecError::StepFailed(_) => "step_failed",
            ExecError::Fatal(_) => "fatal",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_stable_labels_and_messages_name_the_kind() {
        let cases = [
            (
                ExecError::Refused("bad row".into()),
                "refused",
                "step refused: bad row",
            ),
            (
                ExecError::StepFailed("xid".into()),
                "step_failed",
                "step failed: xid",
            ),
            (
                ExecError::Fatal("gone".into()),
                "fatal",
                "executor lost: gone",
            ),
        ];
        for (error, kind, message) in cases {
            assert_eq!(error.kind(), kind);
            assert_eq!(error.to_string(), message);
        }
    }
}
