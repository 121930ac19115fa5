"""Structured outputs and forced tool calls on a real gdn-server (the
embedded demo, CPU executor), driven by the official openai client, raw
HTTP and langchain.

The demo's weights are random, so whatever shape an output has is the
constraint's doing: every output must parse, validate against its schema
(jsonschema_rs, the validator schemathesis already brings) and end by the
grammar (finish_reason stop / tool_calls), never by length. Every schema
here bounds its strings (maxLength, enum or pattern): a random model in a
free string would only stop at max_tokens. Thinking is off
(enable_thinking false): a random model seldom writes </think>, after
which the constraint would begin. Requests are seeded so that a run is
reproducible.
"""

import json
import re

import httpx2 as httpx  # the HTTP client the openai package itself uses
import jsonschema_rs
import openai
import pydantic
import pytest

from conftest import MODEL, Server

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
MSG = [{"role": "user", "content": "Describe a person."}]
MAX_TOKENS = 400
# The tools below take about 670 of the 1,024 positions.
TOOL_MAX_TOKENS = 320

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "city": {"enum": ["Paris", "Rome"]}},
            "required": ["zip"],
            "additionalProperties": False,
        },
        "score": {"anyOf": [{"type": "number", "minimum": -1, "maximum": 1}, {"type": "null"}]},
    },
    "required": ["name", "age", "address"],
    "additionalProperties": False,
}

WEATHER_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "detail": {"type": "object", "properties": {"hourly": {"type": "boolean"}}, "required": ["hourly"],
                       "additionalProperties": False},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    }}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object",
        "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"],
        "additionalProperties": False,
    }}},
]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in WEATHER_TOOLS}


def post(server, path, body):
    return httpx.post(server.base + path, json=body, timeout=300)


def chat_body(**fields):
    return {"model": MODEL, "messages": MSG, "max_tokens": MAX_TOKENS, "seed": 11, **NO_THINKING, **fields}


def completion_body(**fields):
    return {"model": MODEL, "prompt": "A person as JSON:", "max_tokens": MAX_TOKENS, "seed": 11, **fields}


def ok(r):
    assert r.status_code == 200, r.text
    return r.json()


# ------------------------------------------------------- needs the engine's constraints


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_chat_completions_parse_with_a_pydantic_model(client, seed):
    class Address(pydantic.BaseModel):
        zip: str = pydantic.Field(pattern=r"^[0-9]{5}$")

    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=12)
        age: int = pydantic.Field(ge=0, le=120)
        address: Address

    r = client.chat.completions.parse(model=MODEL, messages=MSG, response_format=Person, max_tokens=MAX_TOKENS,
                                      seed=seed, extra_body=NO_THINKING)
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)
    assert Person.model_validate_json(choice.message.content) == choice.message.parsed


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_response_format_json_schema(server, path):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    make = chat_body if path == "/v1/chat/completions" else completion_body
    r = ok(post(server, path, make(response_format=fmt, n=4, temperature=1.0)))
    validator = jsonschema_rs.validator_for(PERSON)
    for choice in r["choices"]:
        assert choice["finish_reason"] == "stop", choice
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        value = json.loads(text)
        assert validator.is_valid(value), (text, list(validator.iter_errors(value)))


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_each_field_form_constrains_the_output(server, path):
    choices = ["yes", "no", "maybe later"]
    regex = r"[0-9]{3}-[a-z]{2,4}"
    checks = [
        ({"guided_choice": choices}, lambda t: t in choices),
        ({"structured_outputs": {"choice": choices}}, lambda t: t in choices),
        ({"guided_regex": regex}, lambda t: re.fullmatch(regex, t) is not None),
        ({"structured_outputs": {"regex": regex}}, lambda t: re.fullmatch(regex, t) is not None),
        ({"guided_json": PERSON}, lambda t: jsonschema_rs.is_valid(PERSON, json.loads(t))),
        ({"structured_outputs": {"json": json.dumps(PERSON)}}, lambda t: jsonschema_rs.is_valid(PERSON, json.loads(t))),
        ({"guided_grammar": 'start: "x=" NUM ";"\nNUM: /[0-9]{1,4}/'}, lambda t: re.fullmatch(r"x=[0-9]{1,4};", t) is not None),
        ({"structured_outputs": {"grammar": 'start: ("ab" | "cd")+ "."'}}, lambda t: re.fullmatch(r"(ab|cd)+\.", t) is not None),
    ]
    make = chat_body if path == "/v1/chat/completions" else completion_body
    for fields, check in checks:
        r = ok(post(server, path, make(n=3, temperature=1.0, **fields)))
        for choice in r["choices"]:
            assert choice["finish_reason"] == "stop", (fields, choice)
            text = choice["message"]["content"] if "message" in choice else choice["text"]
            assert check(text), (fields, text)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_tool_calls_validate(client, tool_choice, stream):
    for seed in range(3):
        args = dict(model=MODEL, messages=MSG, tools=WEATHER_TOOLS, tool_choice=tool_choice, max_tokens=TOOL_MAX_TOKENS,
                    seed=seed, extra_body=NO_THINKING)
        if stream:
            calls, finish = {}, None
            for chunk in client.chat.completions.create(stream=True, **args):
                for c in chunk.choices:
                    finish = c.finish_reason or finish
                    for call in c.delta.tool_calls or []:
                        calls.setdefault(call.index, call.function)
            calls = [calls[i] for i in sorted(calls)]
        else:
            choice = client.chat.completions.create(**args).choices[0]
            finish, calls = choice.finish_reason, [c.function for c in choice.message.tool_calls or []]
        assert finish == "tool_calls"
        assert calls
        if isinstance(tool_choice, dict):
            assert len(calls) == 1 and calls[0].name == "get_time"
        for call in calls:
            arguments = json.loads(call.arguments)
            assert jsonschema_rs.is_valid(PARAMETERS[call.name], arguments), (call.name, arguments)


def test_required_without_parallel_calls_is_one_call(client):
    r = client.chat.completions.create(model=MODEL, messages=MSG, tools=WEATHER_TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=TOOL_MAX_TOKENS, seed=5, extra_body=NO_THINKING)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_langchain_with_structured_output(server, method):
    langchain_openai = pytest.importorskip("langchain_openai")

    class Answer(pydantic.BaseModel):
        """An answer and how sure it is."""

        answer: str = pydantic.Field(max_length=12)
        confidence: int = pydantic.Field(ge=0, le=10)

    llm = langchain_openai.ChatOpenAI(base_url=server.base + "/v1", api_key="unused", model=MODEL, max_tokens=MAX_TOKENS,
                                      seed=3, max_retries=0, timeout=300, extra_body=NO_THINKING)
    if method == "json_mode":
        # json_mode only asks for a JSON object: the schema cannot be forced,
        # so the reply is parsed as JSON, not as the model.
        structured = llm.with_structured_output(method="json_mode")
        result = structured.invoke("Reply with a JSON object.")
        assert isinstance(result, dict)
    else:
        structured = llm.with_structured_output(Answer, method=method)
        result = structured.invoke("What is 2 + 2?")
        assert isinstance(result, Answer)


# ------------------------------------------------------- 400s (the request side alone)


BAD = [
    # (name, path, fields, param, words in the message)
    ("two constraints", "/v1/chat/completions", {"response_format": {"type": "json_object"}, "guided_regex": "a"},
     "guided_regex", "response_format, guided_regex"),
    ("two structured_outputs keys", "/v1/completions", {"structured_outputs": {"regex": "a", "choice": ["a"]}},
     "structured_outputs.choice", "structured_outputs.regex, structured_outputs.choice"),
    ("tool_choice and a format", "/v1/chat/completions",
     {"tools": WEATHER_TOOLS, "tool_choice": "required", "guided_json": PERSON}, "guided_json", "tool_choice, guided_json"),
    ("unknown format type", "/v1/completions", {"response_format": {"type": "yaml"}}, "response_format.type", "'yaml'"),
    ("json_schema without schema", "/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema", "required"),
    ("schema not an object", "/v1/completions", {"guided_json": [1, 2]}, "guided_json", "a JSON schema must be"),
    ("schema text not an object", "/v1/completions", {"guided_json": "[1, 2]"}, "guided_json", "an array"),
    ("schema text not JSON", "/v1/completions", {"structured_outputs": {"json": "{oops"}}, "structured_outputs.json", "not JSON"),
    ("empty choice", "/v1/chat/completions", {"guided_choice": []}, "guided_choice", "non-empty"),
    ("choice not a list", "/v1/completions", {"guided_choice": "yes"}, "guided_choice", ""),
    ("unknown tool", "/v1/chat/completions", {"tools": WEATHER_TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name", "'nope'"),
    ("required without tools", "/v1/chat/completions", {"tool_choice": "required"}, "tool_choice", "no tools"),
]


@pytest.mark.parametrize("name,path,fields,param,words", BAD, ids=[b[0] for b in BAD])
def test_bad_constraints_are_400s_naming_the_field(server, name, path, fields, param, words):
    make = chat_body if path == "/v1/chat/completions" else completion_body
    r = post(server, path, make(**fields))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert words in error["message"], error
    assert httpx.get(server.base + "/health").status_code == 200


def test_constraints_over_the_limit_are_400s():
    s = Server("--max-constraint-bytes", "1000", log_name="constraint-limit")
    try:
        for path, fields, param in [
            ("/v1/completions", {"guided_regex": "a" * 1001}, "guided_regex"),
            ("/v1/chat/completions", {"guided_json": {"type": "string", "description": "x" * 1000}}, "guided_json"),
            ("/v1/chat/completions", {"guided_grammar": "start: " + " | ".join(f'"w{i}"' for i in range(200))}, "guided_grammar"),
            # A forced call's grammar is built from the tools: it counts too.
            ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": f"tool_{i}"}} for i in range(40)],
                                      "tool_choice": "required"}, "tools"),
        ]:
            make = chat_body if path == "/v1/chat/completions" else completion_body
            r = post(s, path, make(**fields))
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["param"] == param and "--max-constraint-bytes" in error["message"], error
        assert httpx.get(s.base + "/health").status_code == 200
    finally:
        s.stop()


# Needs the engine's compiler (check_constraint): its message comes back.
INVALID = [
    ("bad regex", "/v1/completions", {"guided_regex": "(unclosed"}, "guided_regex"),
    ("bad grammar", "/v1/chat/completions", {"guided_grammar": "start: missing_rule"}, "guided_grammar"),
    ("bad schema type", "/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}}},
     "response_format.json_schema.schema"),
    ("bad structured_outputs schema", "/v1/completions", {"structured_outputs": {"json": {"type": 5}}}, "structured_outputs.json"),
]


@pytest.mark.parametrize("name,path,fields,param", INVALID, ids=[i[0] for i in INVALID])
def test_invalid_schema_regex_or_grammar_is_a_400_with_the_compilers_message(server, client, name, path, fields, param):
    make = chat_body if path == "/v1/chat/completions" else completion_body
    r = post(server, path, make(**fields))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert error["message"].startswith(f"Invalid {param}: ") and len(error["message"]) > len(f"Invalid {param}: ") + 3
    # The server goes on serving.
    r = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=2)
    assert r.choices[0].finish_reason in ("length", "stop")
