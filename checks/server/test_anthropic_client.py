"""A real gdn-server process (the embedded demo, CPU executor) driven by the
official anthropic client, as Claude Code-style clients use a local base
URL: messages.create plain, streamed (events and the stream helper) and
with a forced tool call, count_tokens, and the error shapes the SDK maps to
its exceptions.

The demo's weights are random: expectations compare the server with itself
(greedy is deterministic) or check shapes, never hard-coded text.
"""

import anthropic
import pytest

from conftest import MODEL

NO_THINKING = {"type": "disabled"}
USER = [{"role": "user", "content": "Say hello."}]
WEATHER = {
    "name": "get_weather",
    "description": "Weather of a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def client(server):
    # Any key: the server checks none, but the SDK sends it (x-api-key).
    return anthropic.Anthropic(base_url=server.base, api_key="sk-ant-local", max_retries=0, timeout=120)


def test_plain_message(client):
    m = client.messages.create(model=MODEL, max_tokens=8, messages=USER, system="Be brief.",
                               thinking=NO_THINKING, extra_body={"temperature": 0}, metadata={"user_id": "u"})
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert m.id.startswith("msg_")
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in m.content] == ["text"]
    assert 0 < m.usage.output_tokens <= 8
    count = client.messages.count_tokens(model=MODEL, messages=USER, system="Be brief.", thinking=NO_THINKING)
    assert count.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


def test_streamed_message_matches_the_whole_one(client):
    args = dict(model=MODEL, max_tokens=12, messages=USER, thinking=NO_THINKING, extra_body={"temperature": 0})
    whole = client.messages.create(**args)
    events = list(client.messages.create(stream=True, **args))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == whole.content[0].text
    assert events[-2].delta.stop_reason == whole.stop_reason
    assert events[-2].usage.output_tokens == whole.usage.output_tokens
    with client.messages.stream(**args) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason


def test_streamed_thinking(client):
    events = list(client.messages.create(model=MODEL, max_tokens=6, messages=USER, stream=True,
                                         thinking={"type": "enabled", "budget_tokens": 1024}))
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    # The template opens <think>: a random model's few tokens are reasoning.
    assert starts and starts[0] == "thinking"
    assert events[-2].delta.stop_reason == "max_tokens"


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_call(client, stream):
    args = dict(model=MODEL, max_tokens=200, messages=[{"role": "user", "content": "Weather in Rome?"}],
                tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}, thinking=NO_THINKING)
    if stream:
        with client.messages.stream(**args) as s:
            m = s.get_final_message()
    else:
        m = client.messages.create(**args)
    assert m.stop_reason == "tool_use"
    calls = [b for b in m.content if b.type == "tool_use"]
    assert len(calls) == 1
    call = calls[0]
    assert call.id.startswith("toolu_") and call.name == "get_weather"
    assert call.input["city"] in ("Paris", "Rome", "Oslo")
    # The result goes back and the conversation continues.
    follow = client.messages.create(model=MODEL, max_tokens=8, tools=[WEATHER], thinking=NO_THINKING, messages=[
        *args["messages"],
        {"role": "assistant", "content": m.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny"}]},
    ])
    def prompt(u):
        return u.input_tokens + (u.cache_read_input_tokens or 0)

    assert prompt(follow.usage) > prompt(m.usage)


def test_errors_are_the_sdks_exceptions(client):
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="claude-opus-4", max_tokens=4, messages=USER)
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=MODEL, max_tokens=4, messages=[])
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=100000, messages=USER)
