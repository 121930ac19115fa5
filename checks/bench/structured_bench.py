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
Standard library only (the GPU machine has no package index).
Requests pass `ignore_eos` and `min_tokens` where unconstrained (so both
modes stream about `--max-tokens` tokens); a constrained output ends where
its grammar does, so its ITL is over the tokens it streamed.
"""
import argparse
import http.client
import json
import statistics
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# A mid-size schema (nested objects, an array of objects, enums, bounded
# numbers, a string pattern, required and optional fields), shared with
# the engine's `constraint_cost` example.
SCHEMA = json.loads((Path(__file__).parent / "structured_schema.json").read_text())

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


def one(args, constrained, seed):
    """One streamed chat request: (TTFT, inter-token gaps, complete JSON)."""
    # No thinking block: the constraint applies to the answer, which a
    # random model would otherwise never reach.
    body = {
        "model": args.model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": args.max_tokens,
        "temperature": 1.0,
        "seed": seed,
        "stream": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    if constrained:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "account", "schema": SCHEMA, "strict": True},
        }
    else:
        body.update({"ignore_eos": True, "min_tokens": args.max_tokens})
    url = urllib.parse.urlparse(args.base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    stamps, text = [], []
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        choices = json.loads(line[6:]).get("choices") or [{}]
        delta = choices[0].get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content"):
            stamps.append(time.perf_counter())
            text.append(delta.get("content") or "")
    conn.close()
    ttft = stamps[0] - start if stamps else float("nan")
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    complete = None
    if constrained:
        try:
            json.loads("".join(text))
            complete = True
        except ValueError:
            complete = False
    return ttft, gaps, complete


def run(args, c, constrained):
    # Two waves at least: the first wave's start-up is not the steady state.
    n = max(args.requests, 2 * c)
    before = metrics(args.base)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=c) as pool:
        results = list(pool.map(lambda i: one(args, constrained, 1000 + i), range(n)))
    wall = time.perf_counter() - t0
    after = metrics(args.base)
    ttfts = [r[0] for r in results]
    itls = [x for r in results for x in r[1]]
    row = {
        "mode": "json_schema" if constrained else "unconstrained",
        "concurrency": c,
        "requests": n,
        "ttft_p50_ms": statistics.median(ttfts) * 1e3,
        "itl_p50_ms": statistics.median(itls) * 1e3 if itls else None,
        "itl_mean_ms": statistics.fmean(itls) * 1e3 if itls else None,
        "output_tok_per_s": sum(len(r[1]) + 1 for r in results) / wall,
        "output_tokens": sum(len(r[1]) + 1 for r in results),
        "wall_s": wall,
    }
    if constrained:
        # Outputs whose JSON is complete (the rest stopped at max_tokens: a
        # random model can fill a long string field before its grammar ends).
        row["complete_json"] = sum(1 for r in results if r[2])
        row["server"] = {
            k: after.get(k, 0) - before.get(k, 0) for k in after if "_bucket" not in k
        }
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
        free = run(args, c, False)
        bound = run(args, c, True)
        ratio = (
            bound["itl_p50_ms"] / free["itl_p50_ms"]
            if bound["itl_p50_ms"] and free["itl_p50_ms"]
            else None
        )
        server = bound["server"]
        steps = server.get("gdn:structured_output_steps_total", 0)
        per_step = lambda k: server.get(k, 0) / steps if steps else None  # noqa: E731
        print(json.dumps({
            "concurrency": c,
            "itl_constrained_over_free": ratio,
            # Steps whose sampler blocked for a mask, and those it delayed
            # (the mask came after the device had finished the forward).
            "steps_waited_frac": per_step("gdn:structured_output_steps_waited_total"),
            "steps_late_frac": per_step("gdn:structured_output_steps_late_total"),
            "mask_ms_per_step": (per_step("gdn:structured_output_mask_seconds_sum") or 0) * 1e3,
            "wait_ms_per_step": (per_step("gdn:structured_output_wait_seconds_sum") or 0) * 1e3,
        }), flush=True)


if __name__ == "__main__":
    main()
