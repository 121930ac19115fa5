#!/usr/bin/env python3
"""Multi-turn chat benchmark (issue #11 (b); not a test): CONVS conversations
run at once, each TURNS turns, against an OpenAI-compatible server; every
turn re-sends the whole history (system prompt, earlier questions and the
server's own answers) as a chat client does. Streams each answer and reports,
per turn, TTFT p50/p99 and the share of prompt tokens the server says it
served from its cache (`usage.prompt_tokens_details.cached_tokens`).

    multiturn_bench.py URL MODEL [--convs 16] [--turns 5] [--system-words 1500]
                       [--question-words 80] [--answer-tokens 128] [--label on]

Prints one JSON line per turn. Standard library only (runs on the GPU
machine without network). The words are random, so the prompts share nothing
across conversations but their own history.
"""
import argparse
import http.client
import json
import random
import statistics
import threading
import time
import urllib.parse

WORDS = ("alpha beta gamma delta river stone cloud paper engine garden signal "
         "orange window number silver market forest planet letter bridge").split()


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def stream_chat(url, body, request_id):
    """POSTs a streamed chat request; returns (ttft_s, answer_text, usage)."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json", "X-Request-Id": request_id})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    ttft, text, usage = None, [], None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if "error" in event:
            raise RuntimeError(event["error"])
        if event.get("usage"):
            usage = event["usage"]
        for choice in event.get("choices", []):
            piece = choice.get("delta", {}).get("content")
            if piece:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(piece)
    conn.close()
    return ttft, "".join(text), usage


def conversation(args, index, results):
    rng = random.Random(1000 + index)
    messages = [{"role": "system", "content": words(rng, args.system_words)}]
    for turn in range(args.turns):
        messages.append({"role": "user", "content": words(rng, args.question_words)})
        body = {
            "model": args.model, "messages": messages, "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": args.answer_tokens, "ignore_eos": True, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        # The id names conversation and turn in the server's request
        # timeline (checks/bench/multiturn_timeline.py groups by turn).
        ttft, answer, usage = stream_chat(args.url, body, f"c{index}-t{turn + 1}")
        cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        results.append((turn, ttft, usage["prompt_tokens"], cached))
        messages.append({"role": "assistant", "content": answer})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("model")
    p.add_argument("--convs", type=int, default=16)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--system-words", type=int, default=1500)
    p.add_argument("--question-words", type=int, default=80)
    p.add_argument("--answer-tokens", type=int, default=128)
    p.add_argument("--label", default="")
    args = p.parse_args()
    results, errors = [], []

    def run(i):
        try:
            conversation(args, i, results)
        except Exception as e:  # reported, not hidden: the run fails below
            errors.append(f"conversation {i}: {e}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.convs)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for turn in range(args.turns):
        rows = [r for r in results if r[0] == turn]
        if not rows:
            continue
        ttfts = sorted(r[1] * 1e3 for r in rows if r[1] is not None)
        prompt, cached = sum(r[2] for r in rows), sum(r[3] for r in rows)
        print(json.dumps({
            "label": args.label, "turn": turn + 1, "requests": len(rows),
            "ttft_p50_ms": round(statistics.median(ttfts), 1),
            "ttft_p99_ms": round(ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 1),
            "prompt_tokens": prompt, "cached_tokens": cached,
            "cached_share": round(cached / prompt, 3),
        }))
    print(json.dumps({"label": args.label, "wall_s": round(wall, 1),
                      "requests": len(results), "errors": errors[:5]}))
    if errors:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
