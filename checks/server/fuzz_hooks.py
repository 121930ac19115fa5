"""Schemathesis hooks of the fuzz run (test_fuzz.py).

The OpenAPI document states some rules in words because no schema keyword
can: a prompt plus max_tokens must fit the context, prompts x n is at most
128, min_tokens is at most max_tokens, tool-call arguments given as text are
a JSON object, a request has at most one output constraint and it must
compile (and `structured_outputs` must name one) and comes without
min_tokens or ignore_eos, a tool_choice other than none needs tools (and a named one names
one of them), and the model's chat template decides which conversations it
renders (the demo's, Qwen3.5's, needs a user message, takes a system message
only first and knows no developer role). A case schemathesis generates as
valid is brought within those rules here, so that the server must accept it
(positive_data_acceptance); a case generated as invalid is left as it is
(negative_data_rejection), and so is every response check.

Valid cases also get at most 8 output tokens and 8 choices, and
conversations far beyond the context are cut to short texts: the demo runs
on the CPU with 4,096 positions.
"""

import json

import schemathesis

MAX_OUTPUT = 8
MAX_CHOICES = 8
# Bytes of messages and tools, well within the demo's context.
PROMPT_BYTES = 2000
GENERATION = ("/v1/chat/completions", "/v1/completions")


def _is_json_object_text(text):
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _text_of(content):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return None


def _is_user_query(message):
    """Qwen3.5's template looks for a user message that is not a wrapped tool result."""
    if message.get("role") != "user":
        return False
    text = (_text_of(message.get("content")) or "").strip()
    return not (text.startswith("<tool_response>") and text.endswith("</tool_response>"))


def _utf8_len(value):
    return len(json.dumps(value, ensure_ascii=False).encode())


def _short(text, limit=40):
    return text[:limit] if isinstance(text, str) else text


def _shrink_message(message):
    """The same turn with short texts and only the fields the template reads."""
    content = message.get("content")
    if isinstance(content, list):
        content = [{"type": "text", "text": _short(p.get("text"))} for p in content[:2]]
    kept = {"role": message.get("role"), "content": _short(content)}
    if "content" not in message:
        del kept["content"]
    if message.get("tool_call_id") is not None:
        kept["tool_call_id"] = _short(message["tool_call_id"])
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        kept["tool_calls"] = [
            {"function": {"name": _short(c["function"].get("name")), "arguments": "{}"}}
            for c in calls[:2]
        ]
    return kept


def _fit_context(body):
    """Random unicode costs a token a byte or more: a conversation and its
    tools well beyond the demo's 4,096 positions are cut to short texts."""
    if _utf8_len(body.get("messages")) + _utf8_len(body.get("tools")) <= PROMPT_BYTES:
        return
    body["messages"] = [_shrink_message(m) for m in body["messages"][:8]]
    tools = body.get("tools")
    if isinstance(tools, list):
        body["tools"] = [
            {"type": "function", "function": {"name": _short(t["function"].get("name"))}}
            for t in tools[:4]
        ]


def _conversation(body):
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return
    _fit_context(body)
    messages = body["messages"]
    for index, message in enumerate(messages):
        if message.get("role") in ("system", "developer"):
            message["role"] = "system" if index == 0 else "user"
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                arguments = function.get("arguments")
                if isinstance(arguments, str) and not _is_json_object_text(arguments):
                    function["arguments"] = "{}"
    if not any(_is_user_query(m) for m in messages):
        messages.append({"role": "user", "content": "hi"})
    # Continuing the final message needs its text.
    final_text = (_text_of(messages[-1].get("content")) or "").strip()
    if body.get("continue_final_message") and not final_text:
        body["continue_final_message"] = False


def _generation(body):
    for field in ("max_tokens", "max_completion_tokens"):
        value = body.get(field)
        if isinstance(value, int) and value > MAX_OUTPUT:
            body[field] = MAX_OUTPUT
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_OUTPUT
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    min_tokens = body.get("min_tokens")
    if isinstance(min_tokens, int) and min_tokens > limit:
        body["min_tokens"] = limit
    prompt = body.get("prompt")
    prompts = len(prompt) if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else 1
    n = body.get("n")
    if isinstance(n, int) and n > 0:
        body["n"] = max(1, min(n, MAX_CHOICES, 128 // prompts))


RESPONSES_FIELDS = {"input", "instructions", "model", "max_output_tokens", "temperature", "top_p", "stream", "store"}


def _responses(body):
    """/v1/responses: at most MAX_OUTPUT tokens, short texts, and a
    conversation the template renders (system/developer items only first,
    a user message). The fields the document leaves to the README (tools,
    text, previous_response_id, user, ...) are read and checked by the
    server, so a valid case carries only the documented ones."""
    for field in list(body):
        if field not in RESPONSES_FIELDS:
            del body[field]
    limit = body.get("max_output_tokens")
    if not isinstance(limit, int) or limit > MAX_OUTPUT:
        body["max_output_tokens"] = MAX_OUTPUT
    body["instructions"] = _short(body.get("instructions"))
    items = body.get("input")
    if isinstance(items, str):
        body["input"] = _short(items)
        return
    if not isinstance(items, list):
        return
    items = [i for i in items[:8] if isinstance(i, dict)]
    leading = True
    for item in items:
        content = item.get("content")
        if isinstance(content, list):
            item["content"] = [{"type": p.get("type"), "text": _short(p.get("text"))}
                               for p in content[:2] if isinstance(p, dict)]
        else:
            item["content"] = _short(content)
        if item.get("role") in ("system", "developer"):
            if not leading:
                item["role"] = "user"
        else:
            leading = False
    if not any(_is_user_query(i) for i in items):
        items.append({"role": "user", "content": "hi"})
    body["input"] = items


# Output constraints that compile, by the field schemathesis chose.
SAFE_SCHEMA = {"type": "object"}
SAFE_REGEX = "[a-z]{0,8}"
SAFE_CHOICE = ["yes", "no"]
SAFE_GRAMMAR = "start: /[a-z]{0,8}/"
SAFE_STRUCTURED = {"json": SAFE_SCHEMA, "regex": SAFE_REGEX, "choice": SAFE_CHOICE,
                   "grammar": SAFE_GRAMMAR, "json_object": True}
SAFE_GUIDED = {"guided_json": SAFE_SCHEMA, "guided_regex": SAFE_REGEX,
               "guided_choice": SAFE_CHOICE, "guided_grammar": SAFE_GRAMMAR}


def _forced_tool_call(body):
    """tool_choice needs tools (a named one names one of them); a forced
    call's tools get a small parameters schema, so its grammar compiles.
    True if the call is forced."""
    choice = body.get("tool_choice")
    tools = body.get("tools")
    if choice is None or choice == "none":
        return False
    if not isinstance(tools, list) or not tools:
        body["tool_choice"] = None
        return False
    if choice == "auto":
        return False
    for tool in tools:
        tool["function"]["parameters"] = {"type": "object", "properties": {"q": {"type": "string"}}}
    if isinstance(choice, dict):
        choice["function"]["name"] = tools[0]["function"]["name"]
    return True


def _constraints(body, chat):
    """At most one output constraint (a forced tool call counts), of the
    kind schemathesis chose, with a value that compiles; beside it no
    min_tokens above 0 and no ignore_eos (the constraint decides where the
    output ends)."""
    kept = chat and _forced_tool_call(body)
    format_ = body.get("response_format")
    if isinstance(format_, dict) and format_.get("type") in ("json_object", "json_schema"):
        if kept:
            body["response_format"] = None
        else:
            if format_["type"] == "json_schema":
                format_["json_schema"] = {"name": "fuzz", "schema": SAFE_SCHEMA}
            kept = True
    structured = body.get("structured_outputs")
    if isinstance(structured, dict):
        # `json_object: false` asks for nothing; `json: false` is a schema
        # (one nothing matches, which the server refuses as it should).
        given = [k for k in SAFE_STRUCTURED if structured.get(k) is not None
                 and not (k == "json_object" and structured.get(k) is False)]
        if kept and given:
            body["structured_outputs"] = None
        elif not given and structured.get("json_object") is not False:
            # Naming no constraint at all (`{}`, every field null) is a 400.
            body["structured_outputs"] = None
        elif given:
            body["structured_outputs"] = {given[0]: SAFE_STRUCTURED[given[0]]}
            kept = True
    for field, safe in SAFE_GUIDED.items():
        if body.get(field) is None:
            continue
        if kept:
            body[field] = None
        else:
            body[field] = safe
            kept = True
    if kept:
        if isinstance(body.get("min_tokens"), int) and body["min_tokens"] > 0:
            body["min_tokens"] = None
        if body.get("ignore_eos") is True:
            body["ignore_eos"] = None


@schemathesis.hook
def map_case(ctx, case):
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return case
    body = case.body
    path = ctx.operation.path
    if path in GENERATION:
        _generation(body)
    if path in ("/v1/chat/completions", "/tokenize"):
        _conversation(body)
    if path in GENERATION:
        _constraints(body, chat=path == "/v1/chat/completions")
    if path == "/v1/responses":
        _responses(body)
    case.body = body
    return case
