#!/usr/bin/env python3
"""The side-by-side's checkpoint folders (checks/bench/peer_vllm.sh, setup).

  checkpoint.py variant BASE DIR DTYPE   DIR: BASE's files linked, but its own
                                         config.json with text_config.mamba_ssm_dtype = DTYPE
  checkpoint.py describe DIR...          what both servers will read: the
                                         architecture, the state dtype, tensors per prefix

One set of weights serves both state dtypes: the folders differ only in the
field that sets the recurrent state's dtype (vLLM reads it when
--mamba-ssm-cache-dtype is auto; gdn-server reads it too where it has the setting).
"""
import collections, json, os, struct, sys


def variant(base, out, dtype):
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(base):
        if name == "config.json":
            continue
        link = os.path.join(out, name)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.join(base, name), link)
    cfg = json.load(open(os.path.join(base, "config.json")))
    cfg["text_config"]["mamba_ssm_dtype"] = dtype
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)


def tensor_names(d):
    """From the shard index, or from the headers of the safetensors files
    (save_pretrained writes one file without an index below its shard size)."""
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        return list(json.load(open(index))["weight_map"])
    names = []
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with open(os.path.join(d, f), "rb") as fh:
                size = struct.unpack("<Q", fh.read(8))[0]
                names += [k for k in json.loads(fh.read(size)) if k != "__metadata__"]
    return names


def describe(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    names = tensor_names(d)
    prefixes = collections.Counter(".".join(k.split(".")[:2]) for k in names)
    print(d, cfg.get("architectures"), "mamba_ssm_dtype", cfg.get("text_config", cfg).get("mamba_ssm_dtype"),
          dict(sorted(prefixes.items())))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "variant":
        variant(*sys.argv[2:5])
    elif len(sys.argv) >= 3 and sys.argv[1] == "describe":
        for d in sys.argv[2:]:
            describe(d)
    else:
        sys.exit(__doc__)
