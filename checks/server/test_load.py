"""Load on loopback, bounded in count and time: 64 concurrent streaming
clients (the official async openai client) with zero errors, then a
disconnect storm; after each, /metrics shows no used state slot, no used
KV page and nothing running or waiting, and resident memory stays flat
over repeated rounds."""

import asyncio
import time

import httpx2 as httpx
import pytest
from openai import AsyncOpenAI

from conftest import MODEL, Server

CLIENTS = 64
TOKENS = 24
USER = [{"role": "user", "content": "Write a short poem about the sea."}]


@pytest.fixture(scope="module")
def load_server():
    s = Server("--max-model-len", "1024", "--max-num-seqs", "64", log_name="load")
    yield s
    s.stop()


def wait_idle(s, timeout=30):
    deadline = time.time() + timeout
    while True:
        m = s.metrics()
        busy = {k: v for k, v in m.items() if k.split("{")[0] in (
            "gdn:state_slots_used", "vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting") and v != 0}
        if not busy:
            return m
        if time.time() > deadline:
            raise AssertionError(f"resources still in use after {timeout} s: {busy}")
        time.sleep(0.1)


async def one_stream(client, i):
    stream = await client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=TOKENS, temperature=1.0, seed=i, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    finish, usage = None, None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
        if chunk.usage:
            usage = chunk.usage
    return finish, usage.completion_tokens


async def concurrent_round(base):
    client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
    results = await asyncio.gather(*(one_stream(client, i) for i in range(CLIENTS)), return_exceptions=True)
    await client.close()
    return results


async def disconnect_storm(base):
    """Each client reads a few events of a long stream, then hangs up."""
    body = {"model": MODEL, "messages": USER, "max_tokens": 900, "stream": True, "ignore_eos": True}

    async def one(i):
        async with httpx.AsyncClient(timeout=120) as c:
            async with c.stream("POST", base + "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                seen = 0
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        seen += 1
                        if seen > i % 4:
                            break

    await asyncio.gather(*(one(i) for i in range(CLIENTS)))


def test_concurrent_clients_then_disconnect_storm_leave_nothing_behind(load_server):
    s = load_server
    rss = []
    disconnects_before = s.metrics().get("vllm:http_requests_client_disconnected_total", 0)
    for round_ in range(3):
        start = time.time()
        results = asyncio.run(concurrent_round(s.base))
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors[:3]
        assert all(r == ("length", TOKENS) for r in results), results[:5]
        print(f"round {round_}: {CLIENTS} streams x {TOKENS} tokens in {time.time() - start:.1f} s")
        wait_idle(s)
        asyncio.run(disconnect_storm(s.base))
        m = wait_idle(s)
        disconnects = m["vllm:http_requests_client_disconnected_total"] - disconnects_before
        assert disconnects == CLIENTS * (round_ + 1), disconnects
        rss.append(s.rss_kib())
        print(f"round {round_}: RSS {rss[-1]} KiB")
    # Flat: the third round does not hold noticeably more than the first.
    assert rss[2] <= rss[0] * 1.15 + 8 * 1024, rss
    assert httpx.get(s.base + "/health").status_code == 200
