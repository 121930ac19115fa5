#!/usr/bin/env python3
"""Writes a Qwen3.5-4B-shaped checkpoint with random bf16 weights for the
serving benchmark (on the H200: torch + transformers 5.x there), so the real
loading path of `gdn-server --model DIR` runs at full size.

  python make_random_checkpoint.py CONFIG_JSON TOKENIZER_JSON CHAT_TEMPLATE OUT_DIR

CONFIG_JSON: the text config (crates/qwen35's QWEN35_4B_TEXT, written out by the
caller); TOKENIZER_JSON: checks/bench/make_qwen35_tokenizer.py's output;
CHAT_TEMPLATE: the demo checkpoint's chat_template.jinja. Weights: transformers'
own initialisation of Qwen3_5ForCausalLM under a fixed seed, so the outputs are
noise (benchmarks use ignore_eos with fixed lengths).
"""
import json, os, shutil, sys, time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main(config_json, tokenizer_json, chat_template, out):
    t0 = time.time()
    cfg = json.load(open(config_json))
    cfg.setdefault("architectures", ["Qwen3_5ForCausalLM"])
    cfg["eos_token_id"] = 248046  # <|im_end|>
    os.makedirs(out, exist_ok=True)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    config = AutoConfig.from_pretrained(out)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    json.dump({"eos_token_id": [248046, 248044], "temperature": 1.0, "top_p": 1.0},
              open(os.path.join(out, "generation_config.json"), "w"), indent=2)
    shutil.copyfile(tokenizer_json, os.path.join(out, "tokenizer.json"))
    shutil.copyfile(chat_template, os.path.join(out, "chat_template.jinja"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>", "model_max_length": 262144},
              open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {out}: {n / 1e9:.3f} B parameters in {time.time() - t0:.1f} s")
    print(sorted(os.listdir(out)))


if __name__ == "__main__":
    main(*sys.argv[1:5])
