#!/usr/bin/env python3
"""Writes a Qwen3.5-4B-shaped checkpoint with random bf16 weights for the
serving benchmark (on the H200: torch + transformers 5.x there), so the real
loading path of `gdn-server --model DIR` runs at full size.

  python make_random_checkpoint.py CONFIG_JSON TOKENIZER_JSON CHAT_TEMPLATE OUT_DIR
      [--vl] [--mamba-ssm-dtype float32|bfloat16]

CONFIG_JSON: the text config (crates/qwen35's QWEN35_4B_TEXT, written out by the
caller); TOKENIZER_JSON: checks/bench/make_qwen35_tokenizer.py's output;
CHAT_TEMPLATE: the demo checkpoint's chat_template.jinja. Weights: transformers'
own initialisation under a fixed seed, so the outputs are noise (benchmarks use
ignore_eos with fixed lengths).

--vl writes the layout released Qwen3.5 checkpoints have (model_type qwen3_5,
the text settings under text_config, a vision tower, weights under
`model.language_model.*` and `model.visual.*`), which vLLM needs: it has no
text-only Qwen3.5 entry, only Qwen3_5ForConditionalGeneration (served with
--language-model-only). gdn-server reads both layouts and skips the tower.
--mamba-ssm-dtype writes text_config.mamba_ssm_dtype, the recurrent state's
dtype (real configs say float32; without the field vLLM keeps the model dtype,
bf16: checks/bench/peer_vllm.sh).
"""
import argparse, json, os, shutil, time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

# The tower's shape is the 4B's kind (a 24-block ViT whose merger outputs the
# text hidden size); neither server reads its weights, they only make the
# checkpoint's names and size those of a released one.
VISION_4B = dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                 patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                 num_position_embeddings=2304)
# Released Qwen3.5 text configs carry multimodal RoPE sections (11 + 11 + 10 =
# the 32 frequency pairs of a 64-wide rotary part); for text they equal 1-D RoPE.
MROPE = {"mrope_section": [11, 11, 10], "mrope_interleaved": True}


def text_model(cfg, out):
    cfg.setdefault("architectures", ["Qwen3_5ForCausalLM"])
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    config = AutoConfig.from_pretrained(out)
    with torch.device("cuda"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def vl_model(cfg):
    text = dict(cfg)
    text["rope_parameters"] = {**text.get("rope_parameters", {}), **MROPE}
    vision = dict(VISION_4B, out_hidden_size=text["hidden_size"])
    config = transformers.Qwen3_5Config(text_config=text, vision_config=vision,
                                        tie_word_embeddings=text.get("tie_word_embeddings", False))
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    with torch.device("cuda"):
        return transformers.Qwen3_5ForConditionalGeneration._from_config(config, dtype=torch.bfloat16)


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
    ap.add_argument("--mamba-ssm-dtype", choices=["float32", "bfloat16"],
                    help="write (text_config.)mamba_ssm_dtype")
    a = ap.parse_args()
    t0 = time.time()
    cfg = json.load(open(a.config_json))
    cfg["eos_token_id"] = 248046  # <|im_end|>
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    model = vl_model(cfg) if a.vl else text_model(cfg, a.out)
    model.save_pretrained(a.out, safe_serialization=True)
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
