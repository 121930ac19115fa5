//! Why a request is invalid: one variant per rule, each naming the field,
//! the limit and the value; its message, OpenAI `param` and `code`.

#[derive(Debug, Clone, PartialEq)]
pub enum ValidationError {
    NotFinite {
        field: &'static str,
    },
    OutOfRange {
        field: &'static str,
        range: &'static str,
        value: String,
    },
    MissingField {
        field: &'static str,
    },
    EmptyMessages,
    BadRole {
        index: usize,
        role: String,
    },
    BadContentPart {
        index: usize,
        part: usize,
        kind: String,
    },
    MissingContent {
        index: usize,
        role: String,
    },
    BadToolCallArguments {
        index: usize,
        reason: String,
    },
    MissingToolCallId {
        index: usize,
    },
    StreamOptionsWithoutStream,
    TopLogprobsWithoutLogprobs,
    LogprobsType {
        value: String,
    },
    TooManyStops {
        max: usize,
        got: usize,
    },
    EmptyStop {
        index: usize,
    },
    TokenOutOfVocab {
        field: &'static str,
        value: i64,
        vocab_size: usize,
    },
    MinTokensOverMax {
        min_tokens: usize,
        max_tokens: usize,
    },
    Unsupported {
        field: &'static str,
        value: String,
    },
    /// More than one output constraint (the fields that gave them).
    ConflictingConstraints {
        fields: Vec<&'static str>,
    },
    /// A schema, regex, grammar or choice list over `--max-constraint-bytes`.
    ConstraintTooLarge {
        field: &'static str,
        bytes: usize,
        max: usize,
    },
    /// `structured_outputs` given with every field absent or null (`{}`):
    /// most likely a constraint under a name it does not know.
    EmptyConstraint {
        field: &'static str,
    },
    /// `min_tokens` or `ignore_eos` (`field`) beside a constraint (from
    /// `constraint`): the constraint decides where the output ends.
    LengthControlWithConstraint {
        field: &'static str,
        constraint: &'static str,
    },
    /// The constraint compiler refused it (its message).
    BadConstraint {
        field: &'static str,
        message: String,
    },
    EmptyTools,
    BadToolType {
        index: usize,
        kind: String,
    },
    UnknownToolChoice {
        value: String,
    },
    /// A named tool_choice names no function of `tools`.
    UnknownTool {
        name: String,
    },
    ToolChoiceWithoutTools,
    ConflictingFlags {
        a: &'static str,
        b: &'static str,
    },
    EmptyPrompt,
    TooManyChoices {
        prompts: usize,
        n: usize,
        max: usize,
    },
    PromptTooLong {
        prompt_tokens: usize,
        max_model_len: usize,
    },
    MaxTokensTooLarge {
        max_tokens: usize,
        prompt_tokens: usize,
        max_model_len: usize,
    },
    Template {
        message: String,
    },
}

impl std::fmt::Display for ValidationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use ValidationError::*;
        match self {
            NotFinite { field } => write!(f, "{field} must be a finite number."),
            OutOfRange { field, range, value } => write!(f, "{field} must be {range}, got {value}."),
            MissingField { field } => write!(f, "'{field}' is a required property."),
            EmptyMessages => write!(f, "messages must contain at least one message."),
            BadRole { index, role } => write!(
                f,
                "messages[{index}].role must be one of 'system', 'developer', 'user', 'assistant', 'tool', got '{role}'."
            ),
            BadContentPart { index, part, kind } => write!(
                f,
                "messages[{index}].content[{part}] has type '{kind}': only 'text' parts with a 'text' string are supported by this text-only model."
            ),
            MissingContent { index, role } => {
                write!(f, "messages[{index}] (role '{role}') needs 'content'.")
            }
            BadToolCallArguments { index, reason } => {
                write!(f, "messages[{index}].tool_calls: {reason}")
            }
            MissingToolCallId { index } => write!(
                f,
                "Missing required parameter: 'messages[{index}].tool_call_id' (a 'tool' message names the tool call it answers)."
            ),
            StreamOptionsWithoutStream => {
                write!(f, "Stream options can only be defined when `stream=True`.")
            }
            TopLogprobsWithoutLogprobs => {
                write!(f, "top_logprobs can only be set when logprobs is true.")
            }
            LogprobsType { value } => write!(f, "logprobs must be a boolean, got {value}."),
            TooManyStops { max, got } => write!(f, "stop may hold at most {max} strings, got {got}."),
            EmptyStop { index } => write!(f, "stop[{index}] must not be empty."),
            TokenOutOfVocab { field, value, vocab_size } => write!(
                f,
                "{field} contains token id {value}, outside the vocabulary [0, {vocab_size})."
            ),
            MinTokensOverMax { min_tokens, max_tokens } => write!(
                f,
                "min_tokens ({min_tokens}) must be less than or equal to max_tokens ({max_tokens})."
            ),
            Unsupported { field, value } => {
                write!(f, "{field}={value} is not supported by this server.")
            }
            ConflictingConstraints { fields } => write!(
                f,
                "Only one output constraint may be given, got {}: keep one of them.",
                fields.join(", ")
            ),
            ConstraintTooLarge { field, bytes, max } => write!(
                f,
                "{field} is {bytes} bytes long, over the server's limit of {max} bytes (--max-constraint-bytes)."
            ),
            EmptyConstraint { field } => write!(
                f,
                "{field} names no constraint: give one of json, regex, choice, grammar or json_object (or leave {field} out)."
            ),
            LengthControlWithConstraint { field, constraint } => {
                let (why, leave) = if *field == "ignore_eos" {
                    ("with EOS, the only token allowed there", "false")
                } else {
                    ("which may come before min_tokens (only EOS is allowed there)", "0")
                };
                write!(
                    f,
                    "{field} cannot be used with {constraint}: a constrained output ends where its constraint ends, {why}; leave {field} out or {leave}."
                )
            }
            BadConstraint { field, message } => write!(f, "Invalid {field}: {message}"),
            EmptyTools => write!(f, "tools must not be an empty list (leave it out instead)."),
            BadToolType { index, kind } => {
                write!(f, "tools[{index}].type must be 'function', got '{kind}'.")
            }
            UnknownToolChoice { value } => write!(
                f,
                "tool_choice must be 'none', 'auto', 'required' or a named function, got {value}."
            ),
            UnknownTool { name } => write!(
                f,
                "tool_choice names the function '{name}', which is not among the given tools."
            ),
            ToolChoiceWithoutTools => write!(f, "tool_choice is set but no tools are given."),
            ConflictingFlags { a, b } => write!(f, "{a} and {b} cannot both be true."),
            EmptyPrompt => write!(f, "The prompt must not be empty."),
            TooManyChoices { prompts, n, max } => write!(
                f,
                "{prompts} prompts x n={n} asks for {} completions; at most {max} per request.",
                prompts * n
            ),
            PromptTooLong { prompt_tokens, max_model_len } => write!(
                f,
                "This model's maximum context length is {max_model_len} tokens. However, your request has {prompt_tokens} input tokens. Please reduce the length of the input."
            ),
            MaxTokensTooLarge { max_tokens, prompt_tokens, max_model_len } => write!(
                f,
                "'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context length is {max_model_len} tokens and your request has {prompt_tokens} input tokens ({max_tokens} > {max_model_len} - {prompt_tokens})."
            ),
            Template { message } => write!(f, "{message}"),
        }
    }
}

impl ValidationError {
    /// The request field at fault, as OpenAI's `param`.
    pub fn param(&self) -> Option<String> {
        use ValidationError::*;
        Some(match self {
            NotFinite { field } | OutOfRange { field, .. } | MissingField { field } => {
                field.to_string()
            }
            Unsupported { field, .. }
            | LengthControlWithConstraint { field, .. }
            | ConstraintTooLarge { field, .. }
            | BadConstraint { field, .. }
            | EmptyConstraint { field }
            | TokenOutOfVocab { field, .. } => field.to_string(),
            // The later field: the one to drop.
            ConflictingConstraints { fields } => fields.last().unwrap_or(&"").to_string(),
            EmptyMessages | Template { .. } => "messages".into(),
            BadRole { index, .. } => format!("messages[{index}].role"),
            BadContentPart { index, part, .. } => format!("messages[{index}].content[{part}]"),
            MissingContent { index, .. } => format!("messages[{index}].content"),
            BadToolCallArguments { index, .. } => format!("messages[{index}].tool_calls"),
            MissingToolCallId { index } => format!("messages[{index}].tool_call_id"),
            StreamOptionsWithoutStream => "stream_options".into(),
            TopLogprobsWithoutLogprobs => "top_logprobs".into(),
            LogprobsType { .. } => "logprobs".into(),
            TooManyStops { .. } => "stop".into(),
            EmptyStop { index } => format!("stop[{index}]"),
            MinTokensOverMax { .. } => "min_tokens".into(),
            EmptyTools | BadToolType { .. } => "tools".into(),
            UnknownToolChoice { .. } | ToolChoiceWithoutTools => "tool_choice".into(),
            UnknownTool { .. } => "tool_choice.function.name".into(),
            ConflictingFlags { b, .. } => b.to_string(),
            EmptyPrompt => "prompt".into(),
            TooManyChoices { .. } => "n".into(),
            PromptTooLong { .. } => "messages".into(),
            MaxTokensTooLarge { .. } => "max_tokens".into(),
        })
    }

    pub fn code(&self) -> &'static str {
        match self {
            ValidationError::PromptTooLong { .. } | ValidationError::MaxTokensTooLarge { .. } => {
                "context_length_exceeded"
            }
            ValidationError::Unsupported { .. } => "unsupported_value",
            ValidationError::Template { .. } => "invalid_chat_template_input",
            ValidationError::MissingToolCallId { .. } => "missing_required_parameter",
            _ => "invalid_value",
        }
    }
}
