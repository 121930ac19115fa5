//! What a row of a step asks for: shared by the CPU and GPU forwards.

/// Which logits a row of a step wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowLogits {
    /// None (a prefill chunk that is not the prompt's last).
    None,
    /// After the row's last token (a row that samples).
    Last,
    /// After every token of the row (teacher-forced evaluation).
    All,
}
