#!/usr/bin/env python3
"""Kernel time by family per forward, from Nsight Compute's CSV (issue #12's
profiling; a benchmark reader, not a test).

    ncu --clock-control none --metrics gpu__time_duration.sum --csv \
        --print-units base qwen35_bench prefill --prefill-lens 1024 > ncu.csv
    ncu_by_family.py ncu.csv [--skip 1]

A forward starts at each embedding kernel; everything before the first one
(random weights, warm-up set-up) is dropped, and so are the first `--skip`
forwards (warm-up). For the forwards that remain it prints the kernels and
microseconds of one forward (their median) and the share of each kernel
family, the family being the kernel's name without template arguments and
parameters, with cuBLAS's many GEMM kernels under one name. ncu runs one
kernel at a time with its caches flushed, so the sum is an upper bound on a
forward's GPU time; compare shares, not totals, with CUDA-event timings.
"""
import csv
import re
import statistics
import sys
from collections import defaultdict


def family(name):
    base = re.split(r"[<(]", name.removeprefix("void "), maxsplit=1)[0].strip().split("::")[-1]
    low = name.lower()
    if "splitkreduce" in low:
        return "cuBLAS splitK reduce"
    # cuBLAS names its SM90 GEMMs nvjet_* or *xmma_gemm*.
    if low.startswith("nvjet") or "xmma" in low:
        return "cuBLAS GEMM"
    return base


def main():
    path = sys.argv[1]
    skip = int(sys.argv[sys.argv.index("--skip") + 1]) if "--skip" in sys.argv else 1
    rows = []
    with open(path, newline="", errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") == "gpu__time_duration.sum":
            rows.append((r["Kernel Name"], float(r["Metric Value"].replace(",", "")) / 1e3))
    forwards, current = [], None
    for name, us in rows:
        if "embedding" in name:
            current = []
            forwards.append(current)
        if current is not None:
            current.append((name, us))
    # The last forward may be cut off by ncu's launch count.
    if len(forwards) > 1 and len(forwards[-1]) < len(forwards[-2]):
        forwards.pop()
    forwards = forwards[skip:]
    if not forwards:
        sys.exit(f"no complete forward after skipping {skip} ({len(rows)} kernels read)")
    totals = [sum(us for _, us in fw) for fw in forwards]
    median = statistics.median(totals)
    fw = forwards[totals.index(sorted(totals)[len(totals) // 2])]
    by = defaultdict(lambda: [0, 0.0])
    for name, us in fw:
        by[family(name)][0] += 1
        by[family(name)][1] += us
    print(f"forwards seen {len(forwards)}, kernels in a forward {len(fw)}, sum {median:.0f} us (median)")
    for fam, (n, us) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"{fam[:60]:60s} {n:5d} {us:10.1f} {100 * us / sum(v[1] for v in by.values()):5.1f}%")


if __name__ == "__main__":
    main()
