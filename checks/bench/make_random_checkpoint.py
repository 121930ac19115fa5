#!/usr/bin/env python3
"""Writes a Qwen3.5-shaped checkpoint (the 4B, or with --moe the 35B-A3B) with
random bf16 weights for the serving benchmark (on the H200: torch +
transformers 5.x there), so the real loading path of `gdn-server --model DIR`
(and of vLLM, in the VL layout) runs at full size.

  python make_random_checkpoint.py CONFIG_JSON TOKENIZER_JSON CHAT_TEMPLATE OUT_DIR
      [--vl [--moe]] [--mamba-ssm-dtype float32|bfloat16] [--device cuda|cpu]
      [--max-shard-size SIZE] [--vision-depth N]

CONFIG_JSON: the text config (crates/qwen35's QWEN35_4B_TEXT, or with --moe
QWEN35_35B_A3B_TEXT from crates/qwen35/src/config/moe.rs, written out by the
caller); TOKENIZER_JSON: checks/bench/make_qwen35_tokenizer.py's output;
CHAT_TEMPLATE: the demo checkpoint's chat_template.jinja. Weights: transformers'
own initialisation under a fixed seed, so the outputs are noise (benchmarks use
ignore_eos with fixed lengths). The model is built on --device (default cuda)
and saved from there.

--vl writes the layout released Qwen3.5 checkpoints have (model_type qwen3_5,
the text settings under text_config, a vision tower, weights under
`model.language_model.*` and `model.visual.*`), which vLLM needs: it has no
text-only Qwen3.5 entry, only Qwen3_5ForConditionalGeneration (served with
--language-model-only). gdn-server reads both layouts and skips the tower.
--mamba-ssm-dtype writes text_config.mamba_ssm_dtype, the recurrent state's
dtype (real configs say float32; without the field vLLM keeps the model dtype,
bf16: checks/bench/peer_vllm.sh).

--moe (with --vl) builds transformers' Qwen3_5MoeForConditionalGeneration
(model_type qwen3_5_moe, text_config of model_type qwen3_5_moe_text) with the
35B-A3B's vision tower. Expert layout of the files: what transformers'
save_pretrained writes. transformers 5.17 (the H200's) and 5.25 hold the
experts fused (mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]) and
save them per expert, reverting their qwen2_moe conversion mapping:
`model.language_model.layers.N.mlp.experts.E.{gate,up}_proj.weight` [I, H] and
`...experts.E.down_proj.weight` [H, I], beside mlp.gate.weight [E, H],
mlp.shared_expert.{gate,up,down}_proj.weight and mlp.shared_expert_gate.weight
[1, H] (checked on the CPU with a tiny config, both versions; the released
checkpoint stores them fused, by published listings of its index). gdn-server
reads both layouts (crates/qwen35/src/experts.rs); vLLM's Qwen3.5 loader maps
per-expert names through FusedMoE's expert mapping and has a branch for fused
ones.

Memory: save_pretrained (transformers 5.x, safe serialization) splits the
state dict into shards of at most --max-shard-size and writes them one at a
time: safetensors' save_file copies that shard's tensors to the host, writes
the file, and drops them, so host memory holds one shard (default 5GB with
--moe; without --moe transformers' own default, so the 4B stays one file as
before). Before sharding it reverts the expert fusion for the whole state dict
at once, on the model's device: the split gate/up halves are new tensors (the
down_proj split is a view), so the GPU holds the model plus 2/3 of its expert
bytes while saving, about 70 + 43 GB for the 35B-A3B, inside the H200's 141
but not an 80 GB card. --save-fused (with --moe) skips that split: it writes
the modules' own state dict, experts fused as the released files hold them,
so the device holds only the model (the 35B-A3B on an H100 80GB: 16 shards
in 65 s, docs/results/2026-12-07-s14); peer_vllm.sh uses it for the 35B-A3B.

The 35B-A3B on the H200 (64 GiB disk: the ~70 GB checkpoint goes to /dev/shm,
which is host RAM, 128 GiB; its tmpfs may be mounted smaller than the
checkpoint: the script stops before saving if OUT_DIR has too little room, then
`mount -o remount,size=100G /dev/shm`, as root there):

  python3 - > /tmp/q35b_config.json <<'PY'
  import json, re
  src = open("crates/qwen35/src/config/moe.rs").read()
  print(json.dumps(json.loads(re.search(r'QWEN35_35B_A3B_TEXT: &str = r#"(.*?)"#', src, re.S).group(1))))
  PY
  xz -dc .carry/tok/tokenizer.json.xz > /tmp/tokenizer.json   # as serve_bench.sh
  python3 checks/bench/make_random_checkpoint.py /tmp/q35b_config.json /tmp/tokenizer.json \\
      crates/server/demo/chat_template.jinja /dev/shm/q35b_vl --vl --moe --mamba-ssm-dtype float32 --save-fused

Expected: 35.1 B parameters (34.66 B text + 0.45 B tower), 70.2 GB (65.4 GiB)
of bf16 in shards of at most 5 GB plus model.safetensors.index.json (16 with
--save-fused, 15 through save_pretrained). The
released checkpoint also holds mtp.* weights, which neither server reads and
this one lacks.
"""
import argparse, json, os, shutil, sys, time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

# The tower's shape is the 4B's kind (a 24-block ViT whose merger outputs the
# text hidden size); neither server reads its weights, they only make the
# checkpoint's names and size those of a released one.
VISION_4B = dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                 patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                 num_position_embeddings=2304)
# The 35B-A3B's tower: the vision_config of the published Qwen3.6-35B-A3B
# config.json (the same architecture and model_type as Qwen3.5-35B-A3B), also
# transformers' Qwen3_5MoeVisionConfig defaults, documented against
# Qwen/Qwen3.5-35B-A3B; its merger outputs the text hidden size (2048).
VISION_35B_A3B = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                      patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                      num_position_embeddings=2304)
# Released Qwen3.5 text configs carry multimodal RoPE sections (11 + 11 + 10 =
# the 32 frequency pairs of a 64-wide rotary part); for text they equal 1-D RoPE.
MROPE = {"mrope_section": [11, 11, 10], "mrope_interleaved": True}


def text_model(cfg, out, device):
    cfg.setdefault("architectures", ["Qwen3_5ForCausalLM"])
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    config = AutoConfig.from_pretrained(out)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def vl_model(cfg, device, moe, vision_depth):
    """Qwen3_5ForConditionalGeneration, or with `moe` Qwen3_5MoeForConditionalGeneration."""
    text = dict(cfg)
    text["rope_parameters"] = {**text.get("rope_parameters", {}), **MROPE}
    vision = dict(VISION_35B_A3B if moe else VISION_4B, out_hidden_size=text["hidden_size"])
    if vision_depth is not None:
        vision["depth"] = vision_depth
    config_class, model_class = ((transformers.Qwen3_5MoeConfig, transformers.Qwen3_5MoeForConditionalGeneration)
                                 if moe else (transformers.Qwen3_5Config, transformers.Qwen3_5ForConditionalGeneration))
    config = config_class(text_config=text, vision_config=vision,
                          tie_word_embeddings=text.get("tie_word_embeddings", False))
    config.architectures = [model_class.__name__]
    with torch.device(device):
        return model_class._from_config(config, dtype=torch.bfloat16)


def check_room(model, out):
    """Stop before writing when OUT's filesystem (a tmpfs such as /dev/shm is
    often mounted at half the RAM) cannot hold the weights."""
    tensors = {t.data_ptr(): t.numel() * t.element_size() for t in model.state_dict().values()}  # tied once
    need = sum(tensors.values())
    free = shutil.disk_usage(out).free
    if need > free:
        sys.exit(f"{out}: {need / 1e9:.1f} GB of weights, {free / 1e9:.1f} GB free there "
                 f"(for /dev/shm, as root: mount -o remount,size=100G /dev/shm)")


def save_fused(model, out, shard_bytes):
    """The state dict as transformers' modules hold it (experts fused:
    mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I], the layout of
    the released 35B-A3B's files), written shard by shard with an index.
    Unlike save_pretrained it splits nothing, so the device holds only the
    model: the 35B-A3B fits an 80 GB card this way."""
    from safetensors.torch import save_file
    state = model.state_dict()
    shards, size = [[]], 0
    for name, t in state.items():
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    weight_map, total = {}, 0
    for i, names in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: state[k].contiguous() for k in names}, os.path.join(out, fname), metadata={"format": "pt"})
        for k in names:
            weight_map[k] = fname
            total += state[k].numel() * state[k].element_size()
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=2)
    model.config.save_pretrained(out)


def set_state_dtype(out, dtype):
    """The field goes where released configs have it (text_config for the VL
    layout), written after save_pretrained so no transformers version drops it."""
    path = os.path.join(out, "config.json")
    cfg = json.load(open(path))
    (cfg["text_config"] if "text_config" in cfg else cfg)["mamba_ssm_dtype"] = dtype
    json.dump(cfg, open(path, "w"), indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config_json")
    ap.add_argument("tokenizer_json")
    ap.add_argument("chat_template")
    ap.add_argument("out")
    ap.add_argument("--vl", action="store_true", help="the VL layout vLLM needs")
    ap.add_argument("--moe", action="store_true",
                    help="with --vl: the qwen3_5_moe model (CONFIG_JSON a qwen3_5_moe_text config)")
    ap.add_argument("--mamba-ssm-dtype", choices=["float32", "bfloat16"],
                    help="write (text_config.)mamba_ssm_dtype")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="where the model is built and saved from (cpu: small test configs)")
    ap.add_argument("--max-shard-size", default=None,
                    help="largest safetensors shard, e.g. 5GB: the most host memory the save holds "
                         "(default 5GB with --moe, else transformers' own)")
    ap.add_argument("--save-fused", action="store_true",
                    help="with --moe: write the modules' own state dict (experts fused, as the released "
                         "files) shard by shard instead of save_pretrained, which splits every expert "
                         "on the device first (about 43 GB more for the 35B-A3B)")
    ap.add_argument("--vision-depth", type=int, default=None,
                    help="blocks of the vision tower (default: the released model's); "
                         "neither server reads the tower, so a small test may make it shallow")
    a = ap.parse_args()
    if a.moe and not a.vl:
        ap.error("--moe writes the VL layout only: add --vl")
    t0 = time.time()
    cfg = json.load(open(a.config_json))
    if a.moe and "num_experts" not in cfg:
        ap.error(f"--moe: {a.config_json} is no MoE text config (no num_experts)")
    cfg["eos_token_id"] = 248046  # <|im_end|>
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    model = vl_model(cfg, a.device, a.moe, a.vision_depth) if a.vl else text_model(cfg, a.out, a.device)
    check_room(model, a.out)
    shard = a.max_shard_size or ("5GB" if a.moe else None)
    if a.save_fused:
        if not a.moe:
            ap.error("--save-fused: only with --moe (a dense model has no experts to fuse)")
        save_fused(model, a.out, int(float(shard.upper().removesuffix("GB")) * 1e9))
    else:
        model.save_pretrained(a.out, safe_serialization=True, **({"max_shard_size": shard} if shard else {}))
    if a.mamba_ssm_dtype:
        set_state_dtype(a.out, a.mamba_ssm_dtype)
    json.dump({"eos_token_id": [248046, 248044], "temperature": 1.0, "top_p": 1.0},
              open(os.path.join(a.out, "generation_config.json"), "w"), indent=2)
    shutil.copyfile(a.tokenizer_json, os.path.join(a.out, "tokenizer.json"))
    shutil.copyfile(a.chat_template, os.path.join(a.out, "chat_template.jinja"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>", "model_max_length": 262144},
              open(os.path.join(a.out, "tokenizer_config.json"), "w"), indent=2)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {a.out}: {n / 1e9:.3f} B parameters in {time.time() - t0:.1f} s")
    print(sorted(os.listdir(a.out)))


if __name__ == "__main__":
    main()
