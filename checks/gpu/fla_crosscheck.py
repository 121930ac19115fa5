"""Cross-check of our GDN prefill backends against FLA's Triton chunk_gated_delta_rule.

Reads the cases written by `cargo run --release -p gdn-kernels --example gdn_dump -- DIR`
(inputs, the f64 CPU oracle, and our FlashInfer and portable outputs), runs FLA
(fla-core) on the same inputs, and compares everything pairwise with the
tolerances of FlashInfer's own tests (output atol=rtol=1e-2; state atol 5e-3,
rtol 1e-3). Exits non-zero on any violation. Needs a GPU, torch, triton, fla-core.
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
from fla.ops.gated_delta_rule import chunk_gated_delta_rule

D = 128
TOL = {"out": (1e-2, 1e-2), "state": (5e-3, 1e-3)}


def load(d, name, suffix, shape):
    return np.fromfile(d / f"{name}.{suffix}.f32", dtype="<f4").reshape(shape)


def stats(got, want, kind):
    atol, rtol = TOL[kind]
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    viol = int((err > atol + rtol * np.abs(want)).sum()) + int((~np.isfinite(got)).sum())
    rel = float(np.linalg.norm(err) / max(np.linalg.norm(want), 1e-30))
    return viol, float(err.max()), rel


def main():
    d = Path(sys.argv[1])
    failures = 0
    for case in json.loads((d / "cases.json").read_text()):
        name, hq, hv, cu = case["name"], case["hq"], case["hv"], case["cu_seqlens"]
        t, n = cu[-1], len(cu) - 1
        q = load(d, name, "q", (t, hq, D))
        k = load(d, name, "k", (t, hq, D))
        v = load(d, name, "v", (t, hv, D))
        alpha = load(d, name, "alpha", (t, hv))
        beta = load(d, name, "beta", (t, hv))
        init = load(d, name, "init", (n, hv, D, D)) if case["init"] else None
        dev = lambda x, dt: torch.from_numpy(np.ascontiguousarray(x)).to("cuda", dt).unsqueeze(0)
        with torch.no_grad():
            o, s = chunk_gated_delta_rule(
                dev(q, torch.bfloat16), dev(k, torch.bfloat16), dev(v, torch.bfloat16),
                g=dev(np.log(alpha), torch.float32), beta=dev(beta, torch.float32),
                scale=case["scale"],
                initial_state=None if init is None else torch.from_numpy(init).cuda(),
                output_final_state=True, state_v_first=True,
                cu_seqlens=torch.tensor(cu, dtype=torch.long, device="cuda"),
            )
        fla = {"out": o[0].float().cpu().numpy(), "state": s.float().cpu().numpy()}
        ours = {
            b: {"out": load(d, name, f"{b}_out", (t, hv, D)), "state": load(d, name, f"{b}_state", (n, hv, D, D))}
            for b in ("flashinfer", "portable")
        }
        oracle = {"out": load(d, name, "oracle_out", (t, hv, D)), "state": load(d, name, "oracle_state", (n, hv, D, D))}
        pairs = [("fla", "oracle", fla, oracle)] + [(b, "fla", ours[b], fla) for b in ours]
        for a_name, b_name, a, b in pairs:
            for kind in ("out", "state"):
                viol, mx, rel = stats(a[kind], b[kind], kind)
                failures += viol > 0
                print(f"{name:<10} {a_name:>10} vs {b_name:<6} {kind:<5} max|e| {mx:.2e} rel {rel:.2e} violations {viol}")
    print(f"{'FAILED' if failures else 'OK'}: {failures} comparison(s) outside tolerance")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
