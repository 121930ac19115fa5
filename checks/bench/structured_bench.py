#!/usr/bin/env python3
"""Constrained decoding's cost in serving (a benchmark, not a test): the same
streamed chat requests at each concurrency, once unconstrained and once
with a mid-size JSON schema as `response_format`, against a running
gdn-server; TTFT and inter-token latency (ITL) p50 per mode, their ratio,
and the server's mask counters (masks computed, steps that waited for one,
mask time) read from /metrics around each constrained run.

  structured_bench.py --base http://127.0.0.1:8000 --model q4b \
      --concurrency 1,8,32,64 --requests 64 --max-tokens 256

The goal (the structured-outputs issue): constrained ITL at most 1.05x of
unconstrained at c = 1-64 on the H200's random 4B checkpoint. Prints one
JSON object per (mode, concurrency) and a summary line per concurrency.
Needs the `openai` package (checks/server/requirements.txt installs it).
Requests pass `ignore_eos` and `min_tokens` where unconstrained (so both
modes stream about `--max-tokens` tokens); a constrained output ends where
its grammar does, so its ITL is over the tokens it streamed.
"""
import argparse
import asyncio
import json
import statistics
import time
import urllib.request

from openai import AsyncOpenAI

# A mid-size schema: nested objects, an array of objects, enums, bounded
# numbers, a string pattern, required and optional fields.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "status": {"enum": ["active", "suspended", "closed"]},
        "score": {"type": "number", "minimum": 0, "maximum": 100},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string", "maxLength": 60},
                "city": {"type": "string", "maxLength": 40},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "city"],
        },
        "orders": {
            "type": "array",
            "maxItems": 8,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "maxLength": 12},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                    "gift": {"type": "boolean"},
                },
                "required": ["sku", "qty"],
            },
        },
        "notes": {"type": "string", "maxLength": 200},
    },
    "required": ["name", "id", "status", "score", "address", "orders"],
}

PROMPT = "Describe a customer account as JSON."


def metrics(base):
    """The server's structured-output counters (name -> value)."""
    text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("gdn:structured_output") and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


async def one(client, model, max_tokens, constrained, seed):
    # No thinking block: the constraint applies to the answer, which a
    # random model would otherwise never reach.
    extra = {"seed": seed, "chat_template_kwargs": {"enable_thinking": False}}
    kwargs = {}
    if constrained:
        kwargs["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "account", "schema": SCHEMA, "strict": True},
        }
    else:
        extra.update({"ignore_eos": True, "min_tokens": max_tokens})
    start = time.perf_counter()
    stamps = []
    text = []
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=max_tokens,
        temperature=1.0,
        stream=True,
        extra_body=extra,
        **kwargs,
    )
    async for chunk in stream:
        delta = chunk.choices[0].delta if chunk.choices else None
        piece = delta and (delta.content or getattr(delta, "reasoning_content", None))
        if piece:
            stamps.append(time.perf_counter())
            if delta.content:
                text.append(delta.content)
    ttft = stamps[0] - start if stamps else float("nan")
    itls = [b - a for a, b in zip(stamps, stamps[1:])]
    valid = None
    if constrained:
        try:
            json.loads("".join(text))
            valid = True
        except ValueError:
            valid = False
    return ttft, itls, valid


async def run(args, c, constrained):
    client = AsyncOpenAI(base_url=f"{args.base}/v1", api_key="none", max_retries=0)
    sem = asyncio.Semaphore(c)
    n = max(args.requests, c)

    async def bounded(i):
        async with sem:
            return await one(client, args.model, args.max_tokens, constrained, 1000 + i)

    before = metrics(args.base)
    t0 = time.perf_counter()
    results = await asyncio.gather(*(bounded(i) for i in range(n)))
    wall = time.perf_counter() - t0
    after = metrics(args.base)
    await client.close()
    ttfts = [r[0] for r in results]
    itls = [x for r in results for x in r[1]]
    row = {
        "mode": "json_schema" if constrained else "unconstrained",
        "concurrency": c,
        "requests": n,
        "ttft_p50_ms": statistics.median(ttfts) * 1e3,
        "itl_p50_ms": statistics.median(itls) * 1e3 if itls else None,
        "output_tokens": sum(len(r[1]) + 1 for r in results),
        "wall_s": wall,
    }
    if constrained:
        # Outputs whose JSON is complete (the rest stopped at max_tokens: a
        # random model can fill a long string field before its grammar ends).
        row["complete_json"] = sum(1 for r in results if r[2])
        row["server"] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    print(json.dumps(row), flush=True)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="q4b")
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=256)
    args = p.parse_args()
    for c in [int(x) for x in args.concurrency.split(",")]:
        free = asyncio.run(run(args, c, False))
        bound = asyncio.run(run(args, c, True))
        ratio = (
            bound["itl_p50_ms"] / free["itl_p50_ms"]
            if bound["itl_p50_ms"] and free["itl_p50_ms"]
            else None
        )
        print(json.dumps({"concurrency": c, "itl_constrained_over_free": ratio}), flush=True)


if __name__ == "__main__":
    main()
