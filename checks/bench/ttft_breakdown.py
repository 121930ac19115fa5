#!/usr/bin/env python3
"""Reads what checks/bench/ttft_breakdown.sh wrote and prints where TTFT went.

  ttft_breakdown.py DIR            the breakdown (per set and cache mode)
  ttft_breakdown.py --lengths DIR  the prefill lengths for qwen35_bench: each
                                   set's nominal length and the median prompt
                                   length the server's tokenizer gave

DIR holds runs.tsv (mode, nominal length, server log, client jsonl; file
names relative to DIR), the
server logs (gdn-server --request-timeline: one `request_timeline {json}` line
per request, see crates/http/src/api/timeline.rs), bench_serving's
--output-details jsonl (per-request TTFTs, in request order) and
runtime_served.jsonl / runtime_random.jsonl (qwen35_bench prefill lines).

Each request's server time (handler entry to its first text) splits into
consecutive parts, so they add up to it exactly:
  request in     body read + JSON decode
  tokenize       the prompt's tokenizer (completions) or template + tokenizer
  to first step  submit, engine channel and wake-up, admission, planning
  steps          first step planned -> last step committed: every forward up
                 to the first token (executor calls, plus engine work and gaps
                 between steps, shown below)
  deliver        commit -> first token handed to the request's channel
  channel        -> the HTTP task has it
  to first text  -> the first non-empty text goes out (longer when the first
                 tokens decode to no text: tokens_before_text > 1)
The client's TTFT (bench_serving: first chunk with non-empty text) adds the
client side (connection, request send, response parse).
"""
import json
import statistics
import sys
from pathlib import Path

TAG = "request_timeline "
MODES = {
    "off": "prefix cache off",
    "on": "prefix cache on",
    "tok1": "prefix cache off, prompt tokenized on one thread",
}


def read_lines(log):
    out = []
    for line in Path(log).read_text(errors="replace").splitlines():
        at = line.find(TAG)
        if at >= 0:
            try:
                out.append(json.loads(line[at + len(TAG):]))
            except json.JSONDecodeError:
                pass
    return out


def read_client(path):
    p = Path(path)
    if not p.exists() or not p.read_text().strip():
        return []
    last = json.loads(p.read_text().strip().splitlines()[-1])
    return [t * 1e3 for t in last.get("ttfts", [])]


def runs(d):
    rows = []
    for line in (d / "runs.tsv").read_text().splitlines():
        if not line.strip():
            continue
        mode, length, log, client = line.split("\t")
        lines = read_lines(d / log)
        # The first request of each fresh server is bench_serving's warm-up.
        rows.append({
            "mode": mode,
            "len": int(length),
            "warmup": lines[:1],
            "requests": lines[1:],
            "client": read_client(d / client),
        })
    return rows


def parts(r):
    """One request's consecutive parts (ms) and its step details."""
    ms = {name: t for name, t in r["ms"]}
    steps = r["steps"]
    need = ["decoded", "tokenized", "first_token_sent", "first_token_received"]
    if not steps or any(k not in ms for k in need):
        return None
    text = ms.get("first_text", ms.get("finished_without_text"))
    p = {
        "request in": ms["decoded"],
        "tokenize": ms["tokenized"] - ms["decoded"],
        "to first step": steps[0]["planned"] - ms["tokenized"],
        "steps": steps[-1]["committed"] - steps[0]["planned"],
        "deliver": ms["first_token_sent"] - steps[-1]["committed"],
        "channel": ms["first_token_received"] - ms["first_token_sent"],
        "to first text": text - ms["first_token_received"],
        "server total": text,
    }
    execs = [s["exec_end"] - s["exec_start"] for s in steps]
    detail = {
        "executor calls": sum(execs),
        "engine work in steps": sum((s["exec_start"] - s["planned"]) + (s["committed"] - s["exec_end"])
                                    for s in steps),
        "gaps between steps": sum(b["planned"] - a["committed"] for a, b in zip(steps, steps[1:])),
    }
    for k in ("host_prep", "launch", "forward", "sample"):
        if all(k in s for s in steps):
            detail[f"  {k}"] = sum(s[k] for s in steps)
    shape = " + ".join(f"{s['len']}{'*' if s['sampled'] else ''}" for s in steps)
    return p, detail, shape, execs


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def runtime(d, name):
    """qwen35_bench prefill: {tokens: (best ms, median ms)}."""
    out = {}
    p = d / name
    if not p.exists():
        return out
    for line in p.read_text().splitlines():
        try:
            j = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "prefill_tokens" in j:
            out[j["prefill_tokens"]] = (j["ms"], j.get("median_ms", j["ms"]))
    return out


def prompt_median(requests):
    """The median prompt length of the requests without a cache hit (an
    actual length: the lower median)."""
    got = [r["prompt_tokens"] for r in requests if r.get("prompt_tokens") and not r["cached_tokens"]]
    return statistics.median_low(got) if got else None


def lengths(d):
    lens = []
    for run in runs(d):
        lens.append(run["len"])
        plen = prompt_median(run["requests"])
        if plen:
            lens.append(plen)
    seen = []
    for n in lens:
        if n not in seen:
            seen.append(n)
    return ",".join(str(n) for n in seen)


def report(d):
    served, random_w = runtime(d, "runtime_served.jsonl"), runtime(d, "runtime_random.jsonl")

    def rt(table, n):
        return table.get(n, (float("nan"), float("nan")))[1]

    for run in runs(d):
        reqs = run["requests"]
        client = run["client"]
        print(f"\n== {MODES.get(run['mode'], run['mode'])}, {run['len']}-token set: "
              f"{len(reqs)} requests (+1 warm-up), c = 1 ==")
        if not reqs:
            print("  no timeline lines (was --request-timeline on?)")
            continue
        rows = []
        for i, r in enumerate(reqs):
            got = parts(r)
            if got is None:
                continue
            p, detail, shape, _ = got
            c = client[i] if i < len(client) else float("nan")
            rows.append((r, p, detail, shape, c))
            print(f"  request {i}: prompt {r['prompt_tokens']} tokens, cached {r['cached_tokens']}, "
                  f"steps {shape} (* samples), tokens before text {r['tokens_before_text']}, "
                  f"client TTFT {c:.1f} ms, server {p['server total']:.1f} ms")
        cold = [x for x in rows if not x[0]["cached_tokens"]]
        if len(cold) < len(rows):
            print(f"  ({len(rows) - len(cold)} prefix-cache hit(s) left out of the medians)")
        if not cold:
            continue
        plen = prompt_median([x[0] for x in cold])
        client_ttft = median([x[4] for x in cold])
        server = median([x[1]["server total"] for x in cold])
        print(f"  medians over {len(cold)} requests (parts are medians: they need not add up exactly)")
        print(f"  {'client TTFT (bench_serving)':38s} {client_ttft:8.2f} ms")
        print(f"  {'  client side (client - server)':38s} {median([x[4] - x[1]['server total'] for x in cold]):8.2f}")
        print(f"  {'  server: received -> first text':38s} {server:8.2f}")
        for k in ["request in", "tokenize", "to first step", "steps", "deliver", "channel", "to first text"]:
            print(f"  {'    ' + k:38s} {median([x[1][k] for x in cold]):8.2f}")
        for k in cold[0][2]:
            print(f"  {'      ' + k:38s} {median([x[2].get(k, float('nan')) for x in cold]):8.2f}")
        nominal, at_len = rt(served, run["len"]), rt(served, plen)
        print(f"  runtime prefill, served weights (qwen35_bench median): {run['len']} tokens "
              f"{nominal:.2f} ms, {plen} tokens (the server's median prompt) {at_len:.2f} ms")
        print(f"  runtime prefill, random weights: {run['len']} tokens {rt(random_w, run['len']):.2f} ms, "
              f"{plen} tokens {rt(random_w, plen):.2f} ms")
        print(f"  TTFT - runtime prefill at the nominal length: {client_ttft - nominal:.2f} ms, of which")
        print(f"    the prompt is {plen - run['len']:+d} tokens longer: {at_len - nominal:.2f}")
        print(f"    tokenizer: {median([x[1]['tokenize'] for x in cold]):.2f}")
        print(f"    steps beyond one prefill of the prompt: "
              f"{median([x[1]['steps'] for x in cold]) - at_len:.2f}")
        rest = median([x[1]["request in"] + x[1]["to first step"] + x[1]["deliver"] + x[1]["channel"]
                       + x[1]["to first text"] for x in cold])
        print(f"    request in, queue, deliver, channel, first text: {rest:.2f}")
        print(f"    client side: {median([x[4] - x[1]['server total'] for x in cold]):.2f}")


def main():
    args = sys.argv[1:]
    if args[:1] == ["--lengths"]:
        print(lengths(Path(args[1])))
    else:
        report(Path(args[0]))
        state = Path(args[0]) / "gpu_state.log"
        if state.exists():
            print("\nGPU (sm clock, max sm clock, temperature, power) at each phase:")
            print(state.read_text().rstrip())


if __name__ == "__main__":
    main()
