#!/usr/bin/env python3
"""The side-by-side table of checks/bench/peer_vllm.sh: gdn-server and vLLM
per cell (input/output length, concurrency), from the JSON lines sglang's
bench_serving appends with --output-file (one line per client run; a cell run
twice keeps its last line).

  peer_vllm_table.py --ours OURS.jsonl --vllm VLLM.jsonl [--date D] [--commit C]
      [--machine M] [--state-dtype float32] [--prefix-cache off]
      [--model Qwen3.5-4B] [--max-num-seqs N] [--gpu-memory-utilization F]

Prints markdown: a header with the date, commit and settings, then one row per
cell with TTFT p50, ITL p50 and output tokens/s of both servers and the ratios
the goals are stated in (ITL and throughput, ours / vLLM). A missing side shows
as "-"; a run that completed fewer requests than it sent (max(c, 8)) is marked.
"""
import argparse
import json
import os


def load(path):
    """{(in, out, c): result} from a bench_serving jsonl; {} when absent."""
    cells = {}
    if not path or not os.path.exists(path):
        return cells
    for line in open(path):
        line = line.strip()
        if line:
            r = json.loads(line)
            cells[(r["random_input_len"], r["random_output_len"], r["max_concurrency"])] = r
    return cells


def ms(v):
    return f"{v:.1f}" if v < 100 else f"{v:.0f}"


def cell(r, key, fmt):
    if r is None:
        return "-"
    mark = "" if r["completed"] >= max(r["max_concurrency"], 8) else "*"
    return fmt(r[key]) + mark


def ratio(a, b, key):
    if a is None or b is None or not b[key]:
        return "-"
    return f"{a[key] / b[key]:.2f}x"


def table(ours, vllm, args):
    lines = [
        "## gdn-server and vLLM 0.26.0 side by side",
        "",
        f"- Date: {args.date}; commit: {args.commit}; machine: {args.machine}.",
        f"- Recurrent state: {args.state_dtype} on both; prefix caching {args.prefix_cache} on both;"
        f" `--max-num-seqs {args.max_num_seqs}` and `--gpu-memory-utilization {args.gpu_memory_utilization}`"
        " on both.",
        f"- Checkpoint: random-weight {args.model} in the VL layout, the same folder for both servers.",
        "- Client: sglang 0.4.10 `bench_serving`, `--backend vllm`, `random-ids`, fixed lengths,"
        " `ignore_eos`, seed 1, max(c, 8) prompts.",
        "- vLLM: `--language-model-only --gdn-prefill-backend triton`, CUDA graphs.",
        "",
        "| in/out | c | TTFT p50 ours / vLLM (ms) | ITL p50 ours / vLLM (ms) | out tok/s ours / vLLM "
        "| ITL ours/vLLM | out tok/s ours/vLLM |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in sorted(set(ours) | set(vllm)):
        a, b = ours.get(key), vllm.get(key)
        lines.append(
            f"| {key[0]}/{key[1]} | {key[2]} "
            f"| {cell(a, 'median_ttft_ms', ms)} / {cell(b, 'median_ttft_ms', ms)} "
            f"| {cell(a, 'median_itl_ms', '{:.2f}'.format)} / {cell(b, 'median_itl_ms', '{:.2f}'.format)} "
            f"| {cell(a, 'output_throughput', '{:.0f}'.format)} / {cell(b, 'output_throughput', '{:.0f}'.format)} "
            f"| {ratio(a, b, 'median_itl_ms')} | {ratio(a, b, 'output_throughput')} |"
        )
    lines += ["", "`*`: fewer requests completed than were sent; `-`: no result for that server."]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ours", required=True)
    ap.add_argument("--vllm", required=True)
    ap.add_argument("--date", default="unknown")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--machine", default="unknown")
    ap.add_argument("--state-dtype", default="float32")
    ap.add_argument("--prefix-cache", default="off")
    ap.add_argument("--model", default="Qwen3.5-4B", help="the model the checkpoint is shaped as")
    ap.add_argument("--max-num-seqs", default="128")
    ap.add_argument("--gpu-memory-utilization", default="0.9")
    args = ap.parse_args()
    print(table(load(args.ours), load(args.vllm), args))


if __name__ == "__main__":
    main()
