#!/usr/bin/env python3
"""Where each turn's time to first token went in a multi-turn run (issue #11
(b); a benchmark reader, not a test).

    multiturn_timeline.py SERVER_LOG [SERVER_LOG ...]

Reads the `request_timeline {json}` lines of gdn-server --request-timeline
(crates/http/src/api/timeline.rs) from a checks/bench/multiturn_run.sh run,
whose requests carry the id `c<conversation>-t<turn>` (multiturn_bench.py
sends it as X-Request-Id). Per turn it prints the server-side TTFT, how
spread out the turn's requests arrived, how long they waited for their
first step, and every engine step they took part in before their first
token, put on one time axis by each line's `received_unix_ms`: its start
(ms after the turn's first arrival), duration, rows and tokens in the
whole step, how many of them were this turn's rows, and the most snapshot
points a row carried (each point is one more forward in the step).

Why: the integrated H200 run of 2026-12-01 had turns 2 and 5 at ~115 ms
for every request and turns 3-4 at 67-79 ms with the same uncached tail;
this shows whether they shared steps, waited for other work, or ran more
forwards.
"""
import json
import re
import statistics
import sys
from collections import defaultdict

TAG = "request_timeline "
ID = re.compile(r"^c(\d+)-t(\d+)$")


def read(paths):
    for path in paths:
        with open(path, errors="replace") as f:
            for line in f:
                at = line.find(TAG)
                if at < 0:
                    continue
                record = json.loads(line[at + len(TAG):])
                m = ID.match(str(record.get("request", "")))
                if m:
                    yield int(m.group(1)), int(m.group(2)), record


def stamp(record, name):
    for what, ms in record["ms"]:
        if what == name:
            return ms
    return None


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def summarize(records):
    """Per turn: a dict of figures and the list of shared steps."""
    by_turn = defaultdict(list)
    for conv, turn, record in records:
        by_turn[turn].append((conv, record))
    out = {}
    for turn in sorted(by_turn):
        rows = by_turn[turn]
        t0 = min(r["received_unix_ms"] for _, r in rows)
        ttft = [stamp(r, "first_text") or stamp(r, "first_token_received") for _, r in rows]
        ttft = [t for t in ttft if t is not None]
        waits, counts = [], []
        steps = {}
        for conv, r in rows:
            base = r["received_unix_ms"] - t0
            counts.append(len(r["steps"]))
            if r["steps"]:
                waits.append(r["steps"][0]["planned"])
            for s in r["steps"]:
                # The same engine step seen from several requests: same
                # absolute planning time (to 0.1 ms: stamps are rounded
                # to microseconds on each line's own axis).
                key = round(base + s["planned"], 1)
                step = steps.setdefault(key, {
                    "start": base + s["planned"],
                    "ms": s["committed"] - s["planned"],
                    "forward": s.get("forward"),
                    "rows": s["rows"], "tokens": s["tokens"],
                    "ours": 0, "our_tokens": 0, "points": 0,
                })
                step["ours"] += 1
                step["our_tokens"] += s["len"]
                step["points"] = max(step["points"], s.get("snapshots_in_row", 0))
        arrivals = [r["received_unix_ms"] - t0 for _, r in rows]
        out[turn] = {
            "requests": len(rows),
            "ttft_p50": statistics.median(ttft) if ttft else float("nan"),
            "ttft_max": max(ttft) if ttft else float("nan"),
            "arrival_spread": max(arrivals),
            "wait_p50": statistics.median(waits) if waits else float("nan"),
            "steps_p50": statistics.median(counts) if counts else 0,
            "steps": [steps[k] for k in sorted(steps)],
        }
    return out


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    turns = summarize(read(sys.argv[1:]))
    if not turns:
        raise SystemExit("no request_timeline lines with c<conv>-t<turn> ids "
                         "(run the server with --request-timeline)")
    for turn, t in turns.items():
        print(f"turn {turn}: {t['requests']} requests, server TTFT p50 {t['ttft_p50']:.1f} ms "
              f"(max {t['ttft_max']:.1f}), arrivals spread over {t['arrival_spread']:.1f} ms, "
              f"first step planned {t['wait_p50']:.1f} ms after arrival (p50), "
              f"{t['steps_p50']:g} steps to the first token (p50)")
        print("  step at (ms)  took (ms)  forward (ms)  rows  tokens  this turn's rows/tokens  points")
        for s in t["steps"]:
            fwd = f"{s['forward']:.1f}" if s["forward"] is not None else "-"
            print(f"  {s['start']:11.1f}  {s['ms']:9.1f}  {fwd:>12}  {s['rows']:4}  {s['tokens']:6}"
                  f"  {s['ours']:>10}/{s['our_tokens']:<12}  {s['points']:6}")


if __name__ == "__main__":
    main()
