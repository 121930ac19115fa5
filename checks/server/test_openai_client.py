"""A real gdn-server process (the embedded demo, CPU executor) driven by the
official openai client and raw HTTP: chat and completions, streaming with
usage, stop strings, length, logprobs, seeds, n, tools, reasoning, the
small routes, and every error case with its status, type and param.

The demo's weights are random, so expectations are re-derived from the
server's own raw completions of the same prompt (greedy is deterministic)
or from transformers' goldens, never hard-coded outputs.
"""

import json
import unicodedata
import threading
import time
from pathlib import Path

import httpx2 as httpx  # the HTTP client the openai package itself uses
import openai
import pytest

from conftest import MODEL, ROOT, Server

GOLDENS = json.loads((ROOT / "crates/server/tests/fixtures/chat_template/goldens.json").read_text())["cases"]
GOLDEN = {c["name"]: c for c in GOLDENS}
USER = GOLDEN["user_only"]["request"]["messages"]
USER_PROMPT_TOKENS = len(GOLDEN["user_only"]["token_ids"])
NO_EOS = {"ignore_eos": True}


def extra(obj, key):
    """A vLLM extra field (stop_reason, reasoning_content) of a client object."""
    return (obj.model_extra or {}).get(key)


def raw_completion(server, prompt_ids, max_tokens, **fields):
    body = {"model": MODEL, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **fields}
    r = httpx.post(server.base + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def chat_prompt_ids(server, messages, **fields):
    r = httpx.post(server.base + "/tokenize", json={"model": MODEL, "messages": messages, **fields}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


# ---------------------------------------------------------------- small routes


def test_models_health_metrics(server):
    models = httpx.get(server.base + "/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == 1024
    health = httpx.get(server.base + "/health")
    assert health.status_code == 200 and health.content == b""
    metrics = server.metrics()
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "gdn:state_slots_used"]:
        assert any(k.startswith(name) for k in metrics), name


def test_tokenize_matches_transformers_and_detokenize_round_trips(server):
    # The chat form renders with the template: transformers' token ids.
    for name in ["user_only", "tools_unicode_descriptions", "tool_call_string_arguments", "thinking_off"]:
        case = GOLDEN[name]
        req = case["request"]
        body = {"messages": req["messages"], "add_generation_prompt": req["add_generation_prompt"],
                "chat_template_kwargs": req["chat_template_kwargs"]}
        if req["tools"] is not None:
            body["tools"] = req["tools"]
        r = httpx.post(server.base + "/tokenize", json=body).json()
        assert r["tokens"] == case["token_ids"], name
        assert r["count"] == len(case["token_ids"]) and r["max_model_len"] == 1024
    text = GOLDEN["unicode_user"]["rendered"]
    ids = httpx.post(server.base + "/tokenize", json={"prompt": text, "add_special_tokens": False}).json()["tokens"]
    assert ids == GOLDEN["unicode_user"]["token_ids"]
    # The tokenizer normalizes to NFC (as Qwen3.5's does), so that is what comes back.
    assert httpx.post(server.base + "/detokenize", json={"tokens": ids}).json()["prompt"] == unicodedata.normalize("NFC", text)


# ---------------------------------------------------------------- chat


def test_chat_non_streaming_shape_and_usage(client):
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, temperature=0, extra_body=NO_EOS)
    assert r.object == "chat.completion" and r.model == MODEL and r.id.startswith("chatcmpl-")
    (choice,) = r.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert r.usage.prompt_tokens == USER_PROMPT_TOKENS
    assert r.usage.completion_tokens == 8
    assert r.usage.total_tokens == USER_PROMPT_TOKENS + 8


def test_chat_reasoning_split_matches_raw_completion(server, client):
    # Thinking on (the template's default): the prompt ends with "<think>\n",
    # so the output starts inside reasoning, up to "</think>".
    ids = chat_prompt_ids(server, USER)
    raw = raw_completion(server, ids, 24, skip_special_tokens=True)
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=24, temperature=0, extra_body=NO_EOS)
    msg = r.choices[0].message
    if "</think>" in raw:
        reasoning, content = raw.split("</think>", 1)
    else:
        reasoning, content = raw, ""
    assert (extra(msg, "reasoning_content") or "") == reasoning
    assert (msg.content or "") == content
    # Thinking off: the template closes the think block; all is content.
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    ids_off = chat_prompt_ids(server, USER, **kwargs)
    assert chat_prompt_ids(server, GOLDEN["thinking_off"]["request"]["messages"], **kwargs) == GOLDEN["thinking_off"]["token_ids"]
    raw_off = raw_completion(server, ids_off, 24)
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=24, temperature=0, extra_body={**NO_EOS, **kwargs})
    if "<think>" not in raw_off and "<tool_call>" not in raw_off:
        assert r.choices[0].message.content == raw_off
        assert extra(r.choices[0].message, "reasoning_content") is None


def test_chat_streaming_with_usage_equals_non_streaming(client):
    args = dict(model=MODEL, messages=USER, max_tokens=16, temperature=0, extra_body=NO_EOS)
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    first = chunks[0]
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert all(c.object == "chat.completion.chunk" and c.id == first.id for c in chunks)
    choice_chunks = [c for c in chunks if c.choices]
    assert [c.choices[0].finish_reason for c in choice_chunks[:-1]] == [None] * (len(choice_chunks) - 1)
    assert choice_chunks[-1].choices[0].finish_reason == "length"
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 16
    assert usage_chunk.usage.prompt_tokens == USER_PROMPT_TOKENS
    text = "".join((c.choices[0].delta.content or "") for c in choice_chunks)
    reasoning = "".join((extra(c.choices[0].delta, "reasoning_content") or "") for c in choice_chunks)
    assert text == (whole.choices[0].message.content or "")
    assert reasoning == (extra(whole.choices[0].message, "reasoning_content") or "")


def test_sse_bytes_are_data_lines_ending_in_done(server):
    body = {"model": MODEL, "messages": USER, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.base + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") or e.startswith(":") for e in events), raw
    data = [e[len("data: "):] for e in events if e.startswith("data: ")]
    assert data[-1] == "[DONE]" and raw.endswith("data: [DONE]\n\n")
    parsed = [json.loads(d) for d in data[:-1]]
    assert parsed[-1]["choices"] == [] and "usage" in parsed[-1]
    assert parsed[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_length_finish_and_max_completion_tokens_wins(client):
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=9, max_completion_tokens=3, extra_body=NO_EOS)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3


def test_unset_max_tokens_fills_the_context(server):
    ids = list(range(10, 10 + 500)) * 2  # 1000 prompt tokens of a 1024 context
    r = httpx.post(server.base + "/v1/completions", json={"prompt": ids, "ignore_eos": True}, timeout=120).json()
    assert r["usage"]["completion_tokens"] == 24 and r["choices"][0]["finish_reason"] == "length"


# ---------------------------------------------------------------- completions, stop strings


def pick_stop(text):
    """A 3-character stop string from the middle of `text` (no U+FFFD)."""
    for i in range(4, len(text) - 3):
        s = text[i:i + 3]
        if "\ufffd" not in s and s.strip():
            return s
    raise AssertionError(f"the seeded output has no usable stop string: {text!r}")


@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings(server, client, include, stream):
    # Seeded sampling: reproducible, and unlike greedy on random weights it
    # does not collapse into one repeated byte token.
    prompt = "Once upon a time"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=48, temperature=1.0, seed=7, extra_body=NO_EOS).choices[0].text
    stop = pick_stop(full)
    cut = full.index(stop) + (len(stop) if include else 0)
    args = dict(model=MODEL, prompt=prompt, max_tokens=48, temperature=1.0, seed=7, stop=[stop],
                extra_body={**NO_EOS, "include_stop_str_in_output": include})
    if stream:
        chunks = list(client.completions.create(stream=True, **args))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        last = [c for c in chunks if c.choices][-1].choices[0]
    else:
        last = client.completions.create(**args).choices[0]
        text = last.text
    assert text == full[:cut]
    assert last.finish_reason == "stop" and extra(last, "stop_reason") == stop


def test_chat_stop_string(server, client):
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    base = dict(model=MODEL, messages=USER, max_tokens=48, temperature=1.0, seed=7)
    full = client.chat.completions.create(**base, extra_body={**NO_EOS, **kwargs}).choices[0].message.content or ""
    assert "<think>" not in full and "<tool_call>" not in full, "pick another seed: the output opens a block"
    stop = pick_stop(full)
    r = client.chat.completions.create(**base, stop=stop, extra_body={**NO_EOS, **kwargs})
    assert (r.choices[0].message.content or "") == full[:full.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_completion_token_prompt_and_echo(server, client):
    ids = GOLDEN["user_only"]["token_ids"]
    text_prompt = GOLDEN["user_only"]["rendered"]
    a = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0, extra_body=NO_EOS)
    b = client.completions.create(model=MODEL, prompt=text_prompt, max_tokens=6, temperature=0, extra_body=NO_EOS)
    assert a.choices[0].text == b.choices[0].text
    assert a.usage.prompt_tokens == len(ids) == b.usage.prompt_tokens
    e = client.completions.create(model=MODEL, prompt=text_prompt, max_tokens=6, temperature=0, echo=True, extra_body=NO_EOS)
    assert e.choices[0].text == text_prompt + a.choices[0].text


# ---------------------------------------------------------------- logprobs, seeds, n


def test_chat_logprobs_greedy(client):
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=6, temperature=0, logprobs=True,
                                       top_logprobs=3, extra_body=NO_EOS)
    entries = r.choices[0].logprobs.content
    assert len(entries) == 6
    for e in entries:
        assert len(e.top_logprobs) == 3
        assert e.logprob <= 0
        # Greedy takes the most likely token: it heads the alternatives.
        assert e.top_logprobs[0].token == e.token
        assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
        assert e.bytes == list(e.token.encode())


def test_completion_logprobs(client):
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=5, temperature=0, logprobs=2, extra_body=NO_EOS)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(v <= 0 for v in lp.token_logprobs)
    assert lp.text_offset == sorted(lp.text_offset)


def test_return_token_ids(server, client):
    """vLLM's return_token_ids: completions put prompt_token_ids and token_ids on
    the choice (streamed: the prompt's on the first chunk, each chunk's own
    tokens); chat puts prompt_token_ids on the response (streamed: the first
    chunk) and token_ids on the choice."""
    ids = GOLDEN["user_only"]["token_ids"]
    base = dict(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    whole = client.completions.create(**base, extra_body={**NO_EOS, "return_token_ids": True})
    c = whole.choices[0]
    assert extra(c, "prompt_token_ids") == ids
    out = extra(c, "token_ids")
    assert len(out) == whole.usage.completion_tokens == 8
    plain = client.completions.create(**base, extra_body=NO_EOS).choices[0]
    assert extra(plain, "token_ids") is None and extra(plain, "prompt_token_ids") is None
    streamed, prompts = [], []
    for chunk in client.completions.create(**base, stream=True, extra_body={**NO_EOS, "return_token_ids": True}):
        ch = chunk.choices[0]
        if extra(ch, "prompt_token_ids") is not None:
            prompts.append(extra(ch, "prompt_token_ids"))
        streamed += extra(ch, "token_ids") or []
    assert prompts == [ids] and streamed == out

    chat = dict(model=MODEL, messages=USER, max_tokens=8, temperature=0)
    r = client.chat.completions.create(**chat, extra_body={**NO_EOS, "return_token_ids": True})
    assert extra(r, "prompt_token_ids") == chat_prompt_ids(server, USER)
    assert len(extra(r, "prompt_token_ids")) == r.usage.prompt_tokens
    out = extra(r.choices[0], "token_ids")
    assert len(out) == r.usage.completion_tokens == 8
    streamed, prompts = [], []
    for chunk in client.chat.completions.create(**chat, stream=True, extra_body={**NO_EOS, "return_token_ids": True}):
        if extra(chunk, "prompt_token_ids") is not None:
            prompts.append(extra(chunk, "prompt_token_ids"))
        if chunk.choices:
            streamed += extra(chunk.choices[0], "token_ids") or []
    assert prompts == [extra(r, "prompt_token_ids")] and streamed == out


def test_seed_reproducible_and_n(client):
    args = dict(model=MODEL, messages=USER, max_tokens=16, temperature=1.0, extra_body=NO_EOS)
    a = client.chat.completions.create(seed=1234, **args)
    b = client.chat.completions.create(seed=1234, **args)
    c = client.chat.completions.create(seed=98765, **args)
    text = lambda r: (extra(r.choices[0].message, "reasoning_content") or "") + (r.choices[0].message.content or "")
    assert text(a) == text(b)
    assert text(a) != text(c)
    n = client.chat.completions.create(seed=1234, n=3, **args)
    assert [ch.index for ch in n.choices] == [0, 1, 2]
    assert n.usage.completion_tokens == 48 and n.usage.prompt_tokens == USER_PROMPT_TOKENS
    # Choice i is seeded seed + i: choice 0 repeats the n=1 request.
    assert text(n) == text(a)


# ---------------------------------------------------------------- tools


def test_tool_conversation_renders_and_answers(server, client):
    case = GOLDEN["tool_call_string_arguments"]["request"]
    r = client.chat.completions.create(model=MODEL, messages=case["messages"], tools=case["tools"], tool_choice="auto",
                                       max_tokens=8, temperature=0, extra_body=NO_EOS)
    assert r.usage.prompt_tokens == len(GOLDEN["tool_call_string_arguments"]["token_ids"])
    choice = r.choices[0]
    assert choice.finish_reason in ("length", "tool_calls")
    assert isinstance(choice.message.tool_calls, list)
    # Bad arguments JSON in a tool call is the client's error.
    bad = json.loads(json.dumps(case["messages"]))
    bad[1]["tool_calls"][0]["function"]["arguments"] = "{not json"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=bad, tools=case["tools"], max_tokens=4)
    assert e.value.body["param"] == "messages[1].tool_calls"


# ---------------------------------------------------------------- errors


def post(server, path, body=None, content=None, headers=None):
    if content is None:
        content = json.dumps(body).encode()
    h = {"content-type": "application/json", **(headers or {})}
    return httpx.post(server.base + path, content=content, headers=h, timeout=60)


MSG = [{"role": "user", "content": "hi"}]
LONG = "word " * 2000

ERRORS = [
    # (name, path, body or raw bytes, status, type, param, code)
    ("unknown model", "/v1/chat/completions", {"model": "nope", "messages": MSG}, 404, "invalid_request_error", "model", "model_not_found"),
    ("temperature range", "/v1/chat/completions", {"messages": MSG, "temperature": 3}, 400, "invalid_request_error", "temperature", "invalid_value"),
    ("top_p zero", "/v1/chat/completions", {"messages": MSG, "top_p": 0}, 400, "invalid_request_error", "top_p", "invalid_value"),
    ("n zero", "/v1/chat/completions", {"messages": MSG, "n": 0}, 400, "invalid_request_error", "n", "invalid_value"),
    ("n huge", "/v1/chat/completions", {"messages": MSG, "n": 100000}, 400, "invalid_request_error", "n", "invalid_value"),
    ("max_tokens zero", "/v1/chat/completions", {"messages": MSG, "max_tokens": 0}, 400, "invalid_request_error", "max_tokens", "invalid_value"),
    ("max_tokens too large", "/v1/chat/completions", {"messages": MSG, "max_tokens": 100000}, 400, "invalid_request_error", "max_tokens", "context_length_exceeded"),
    ("prompt too long", "/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, 400, "invalid_request_error", "messages", "context_length_exceeded"),
    ("completion prompt too long", "/v1/completions", {"prompt": LONG}, 400, "invalid_request_error", "prompt", "context_length_exceeded"),
    ("empty messages", "/v1/chat/completions", {"messages": []}, 400, "invalid_request_error", "messages", "invalid_value"),
    ("missing messages", "/v1/chat/completions", {"model": MODEL}, 400, "invalid_request_error", "messages", "invalid_value"),
    ("bad role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_request_error", "messages[0].role", "invalid_value"),
    ("image part", "/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "invalid_request_error", "messages[0].content[0]", "invalid_value"),
    ("content wrong type", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "invalid_request_error", "messages[0].content", "invalid_request_body"),
    ("temperature wrong type", "/v1/chat/completions", {"messages": MSG, "temperature": "hot"}, 400, "invalid_request_error", "temperature", "invalid_request_body"),
    ("stream_options without stream", "/v1/chat/completions", {"messages": MSG, "stream_options": {"include_usage": True}}, 400, "invalid_request_error", "stream_options", "invalid_value"),
    ("top_logprobs without logprobs", "/v1/chat/completions", {"messages": MSG, "top_logprobs": 2}, 400, "invalid_request_error", "top_logprobs", "invalid_value"),
    ("top_logprobs over 20", "/v1/chat/completions", {"messages": MSG, "logprobs": True, "top_logprobs": 21}, 400, "invalid_request_error", "top_logprobs", "invalid_value"),
    ("empty tools", "/v1/chat/completions", {"messages": MSG, "tools": []}, 400, "invalid_request_error", "tools", "invalid_value"),
    ("stop token out of vocab", "/v1/chat/completions", {"messages": MSG, "stop_token_ids": [10**6]}, 400, "invalid_request_error", "stop_token_ids", "invalid_value"),
    ("empty stop", "/v1/chat/completions", {"messages": MSG, "stop": ["ok", ""]}, 400, "invalid_request_error", "stop[1]", "invalid_value"),
    ("template raise_exception", "/v1/chat/completions", {"messages": [{"role": "system", "content": "s"}]}, 400, "invalid_request_error", "messages", "invalid_chat_template_input"),
    ("prompt token out of vocab", "/v1/completions", {"prompt": [1, 2, 99999]}, 400, "invalid_request_error", "prompt", "invalid_value"),
    ("prompts x n over 128", "/v1/completions", {"prompt": ["a", "b"], "n": 100}, 400, "invalid_request_error", "n", "invalid_value"),
    ("completion logprobs over 20", "/v1/completions", {"prompt": "x", "logprobs": 50}, 400, "invalid_request_error", "logprobs", "invalid_value"),
    ("malformed json", "/v1/chat/completions", b'{"messages": [', 400, "invalid_request_error", None, "invalid_request_body"),
    ("nan", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400, "invalid_request_error", None, "invalid_request_body"),
    ("huge number", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}', 400, "invalid_request_error", None, "invalid_request_body"),
    ("huge integer", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 99999999999999999999999}', 400, "invalid_request_error", None, "invalid_request_body"),
    ("invalid utf-8", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, "invalid_request_error", None, "invalid_request_body"),
    ("not an object", "/v1/chat/completions", b'[1, 2]', 400, "invalid_request_error", None, "invalid_request_body"),
    ("detokenize negative id", "/detokenize", {"tokens": [-1]}, 400, "invalid_request_error", "tokens", "invalid_value"),
    ("tokenize empty messages", "/tokenize", {"messages": []}, 400, "invalid_request_error", "messages", "invalid_value"),
]


@pytest.mark.parametrize("name,path,body,status,etype,param,code", ERRORS, ids=[e[0] for e in ERRORS])
def test_error_cases(server, name, path, body, status, etype, param, code):
    r = post(server, path, content=body) if isinstance(body, bytes) else post(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == etype and err["code"] == code, err
    if param is not None:
        assert err["param"] == param, err
    assert err["message"] and "/src/" not in err["message"] and "/work/" not in err["message"]


def test_error_messages_carry_the_numbers(server):
    r = post(server, "/v1/chat/completions", {"messages": MSG, "max_tokens": 100000}).json()["error"]
    assert "100000" in r["message"] and "1024" in r["message"]
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "system", "content": "s"}]}).json()["error"]
    assert r["message"] == "No user query found in messages."


def test_content_type_and_size_limits(server):
    r = httpx.post(server.base + "/v1/chat/completions", content=b'{"messages": []}', headers={"content-type": "text/plain"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    big = {"messages": [{"role": "user", "content": "x" * 70000}]}
    r = post(server, "/v1/chat/completions", big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.get(server.base + "/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"


def test_client_sees_typed_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=MSG)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MSG, temperature=-1)
    assert e.value.body["param"] == "temperature"


def test_unknown_fields_are_ignored(client):
    r = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=2, user="u",
                                       extra_body={"some_vendor_field": {"x": 1}, "stop": None})
    assert r.choices[0].message.role == "assistant"


# ---------------------------------------------------------------- overload and shutdown


def test_overload_gives_503_with_retry_after():
    # One running slot and one queue place: of 8 long requests sent at once,
    # at most 2 are taken; the others are shed with 503 + Retry-After.
    s = Server("--max-model-len", "4096", "--max-num-seqs", "1", "--max-num-queued-reqs", "1", log_name="overload")
    try:
        long = {"model": MODEL, "prompt": "a", "max_tokens": 4000, "ignore_eos": True}
        results = [None] * 8

        def send(i):
            results[i] = httpx.post(s.base + "/v1/completions", json=long, timeout=300)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        shed = [r for r in results if r.status_code == 503]
        served = [r for r in results if r.status_code == 200]
        assert len(shed) + len(served) == 8, [r.status_code for r in results]
        assert len(shed) >= 1 and len(served) >= 1
        for r in shed:
            assert r.headers["retry-after"] == "1" and r.headers["x-should-retry"] == "true"
            assert r.json()["error"]["code"] == "server_overloaded"
        m = s.metrics()
        assert m['gdn:http_rejections_total{reason="server_overloaded"}'] == len(shed)
    finally:
        s.stop()


def test_sigterm_drains_then_exits():
    s = Server("--max-model-len", "4096", "--shutdown-timeout", "2", log_name="shutdown")
    body = {"model": MODEL, "prompt": "a", "max_tokens": 4000, "ignore_eos": True, "stream": True}
    out = {}

    def stream():
        with httpx.stream("POST", s.base + "/v1/completions", json=body, timeout=60) as r:
            out["raw"] = r.read().decode()

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(0.5)
    s.proc.send_signal(15)
    time.sleep(0.2)
    try:
        r = httpx.post(s.base + "/v1/completions", json={"prompt": "a", "max_tokens": 2}, timeout=10)
        assert r.status_code == 503
    except httpx.ConnectError:
        pass  # the listener may already be closed
    t.join(30)
    code = s.stop()
    raw = out["raw"]
    assert raw.endswith("data: [DONE]\n\n"), raw[-300:]
    if '"error"' in raw:
        # Cut at the deadline: the event says the server shut down, and the
        # exit status says a request was cut off.
        assert '"code":"server_shutdown"' in raw, raw[-300:]
        assert code == 1
    else:
        assert '"finish_reason":"length"' in raw
        assert code == 0
