"""FLA Triton chunk_gated_delta_rule timings for the benchmark matrix of
docs/results/h200-2026-11-29/README.md (same shapes as
crates/gdn-kernels/examples/gdn_bench.rs). Median of triton.testing.do_bench;
prints one JSON object per shape."""
import json

import torch
import torch.nn.functional as F
import triton
from fla.ops.gated_delta_rule import chunk_gated_delta_rule

SHAPES = [("4B 1x2048", 16, 32, [2048]), ("4B 1x8192", 16, 32, [8192]), ("4B 1x65536", 16, 32, [65536]),
          ("4B 4x2048", 16, 32, [2048] * 4), ("4B 8x8192", 16, 32, [8192] * 8), ("27B 1x8192", 16, 48, [8192])]

torch.manual_seed(0)
for label, hq, hv, lens in SHAPES:
    t = sum(lens)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.long, device="cuda")
    q = F.normalize(torch.randn(1, t, hq, 128, device="cuda"), dim=-1).bfloat16()
    k = F.normalize(torch.randn(1, t, hq, 128, device="cuda"), dim=-1).bfloat16()
    v = torch.randn(1, t, hv, 128, device="cuda").bfloat16()
    g = torch.log(torch.empty(1, t, hv, device="cuda").uniform_(0.6, 1.0))
    beta = torch.empty(1, t, hv, device="cuda").uniform_(0.05, 0.95)
    fn = lambda: chunk_gated_delta_rule(q, k, v, g=g, beta=beta, scale=128 ** -0.5, output_final_state=True,
                                        state_v_first=True, cu_seqlens=cu)
    with torch.no_grad():
        ms = triton.testing.do_bench(fn, warmup=100, rep=1000, return_mode="median")
    print(json.dumps({"shape": label, "backend": "fla-triton", "median_ms": round(ms, 4)}))
