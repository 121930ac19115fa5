"""POST /v1/responses through the official openai client's
`client.responses`: a plain response against chat's output for the same
conversation, reasoning as its own item, the typed event stream, a function
call and its output continuing the stored response, and the refusals.

The demo's weights are random: expectations come from the server's own
chat completions of the same conversation (greedy is deterministic), and a
function call is forced with a named tool_choice.
"""

import json

import openai
import pytest

from conftest import MODEL

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False},
    "strict": True,
}


def test_plain_response_matches_chat(client):
    question = "What is the capital of France?"
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                          max_tokens=8, temperature=0, extra_body=NO_THINKING)
    r = client.responses.create(model=MODEL, input=question, max_output_tokens=8, temperature=0,
                                extra_body=NO_THINKING)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    # ignore_eos: the output runs to the limit.
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == 8 and r.usage.total_tokens == r.usage.input_tokens + 8
    message = chat.choices[0].message
    content = message.content or ""
    if content.strip() and not message.tool_calls and (message.model_extra or {}).get("reasoning_content") is None:
        assert r.output_text == content.lstrip()
        assert r.output[-1].type == "message" and r.output[-1].content[0].type == "output_text"


def test_reasoning_is_an_item_before_the_message(client):
    r = client.responses.create(model=MODEL, input="Think first.", max_output_tokens=12, temperature=0,
                                extra_body={"ignore_eos": True})
    assert r.output, r
    # Thinking on: the output starts inside the think block.
    assert r.output[0].type == "reasoning"
    assert r.output[0].content[0].type == "reasoning_text"
    assert 0 < r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens


def test_streamed_events_build_the_same_response(client):
    kwargs = dict(model=MODEL, input="Tell me a story.", max_output_tokens=8, temperature=0, extra_body=NO_THINKING)
    whole = client.responses.create(**kwargs)
    events = list(client.responses.create(stream=True, **kwargs))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.status == whole.status
    assert [i.type for i in final.output] == [i.type for i in whole.output]
    assert final.output_text == whole.output_text
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text
    if final.output_text:
        added = types.index("response.output_item.added")
        assert types.index("response.content_part.added") > added
        assert types.index("response.output_text.done") > types.index("response.output_text.delta")
        assert "response.output_item.done" in types


def test_function_call_and_its_output_continue_the_response(client):
    first = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"},
                                    max_output_tokens=64, temperature=0,
                                    extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    calls = [i for i in first.output if i.type == "function_call"]
    assert calls, first.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert call.arguments in ('{"city": "Paris"}', '{"city": "Rome"}')
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=[WEATHER], max_output_tokens=8, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24 C"}])
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens
    # The same turn as items, without the stored response.
    third = client.responses.create(
        model=MODEL, tools=[WEATHER], max_output_tokens=8, temperature=0,
        input=[{"role": "user", "content": "Weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24 C"}])
    assert third.status in ("completed", "incomplete")


def test_json_schema_text_format(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = client.responses.create(model=MODEL, input="Answer as JSON.", max_output_tokens=32, temperature=0,
                                text={"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}},
                                extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.status == "completed", r
    # Random weights: any JSON the schema allows (whitespace included).
    assert json.loads(r.output_text) in ({"ok": True}, {"ok": False})


def test_refusals_are_typed_errors(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_unknown", max_output_tokens=4)
    assert e.value.body["code"] == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="hi", tools=[{"type": "web_search"}], max_output_tokens=4)
    assert e.value.body["param"] == "tools[0].type"
    unstored = client.responses.create(model=MODEL, input="hi", store=False, max_output_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="more", previous_response_id=unstored.id, max_output_tokens=4)
