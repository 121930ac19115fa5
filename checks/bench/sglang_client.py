#!/usr/bin/env python3
"""Runs sglang's bench_serving.py (the script, as __main__) with the
tokenizer's get_vocab() memoized; every argument goes to bench_serving.

    sglang_client.py BENCH_SERVING_PY [bench_serving arguments]

Why: bench_serving 0.4.10's generated-shared-prefix dataset calls
tokenizer.get_vocab() once per prompt it generates (gen_prompt), and for
Qwen3.5's 248k-token vocabulary one call builds a 248k-entry dict (0.3 s on
the 2-core CI machine): the issue's 32 x 32 workload spent over 260 s of the
client's time limit generating prompts on the H200, and no request was sent
(docs/results/h200-2026-12-01-s2/prefix_bench-gsp32x32-timeout.log). The
vocabulary does not change during a run, so the first call's dict serves
them all. The prompts keep their distribution (tokens drawn uniformly from
the vocabulary); they were never reproducible by seed anyway: the Rust
tokenizer's get_vocab returns its entries in a new order on every call
(checked with transformers 5.17), so the same seed draws other tokens.
Both cache modes of one script run share one generated dataset
(bench_serving caches it under ~/.cache/sglang/benchmark, keyed by sizes).
"""
import functools
import runpy
import sys

from transformers import tokenization_utils_base


def memoize_get_vocab():
    """Wraps get_vocab on every tokenizer class loaded so far (AutoTokenizer
    loads no new base classes later; model classes inherit the wrapper)."""
    seen, todo = set(), [tokenization_utils_base.PreTrainedTokenizerBase]
    # The backends define get_vocab; import them so they are subclasses now.
    for name in ("tokenization_utils_tokenizers", "tokenization_utils_fast",
                 "tokenization_utils", "tokenization_python"):
        try:
            __import__(f"transformers.{name}")
        except ImportError:
            pass
    wrapped = 0
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo.extend(cls.__subclasses__())
        original = cls.__dict__.get("get_vocab")
        if original is None:
            continue

        @functools.wraps(original)
        def get_vocab(self, _original=original):
            memo = self.__dict__.setdefault("_gdn_vocab_memo", {})
            if _original not in memo:
                memo[_original] = _original(self)
            return memo[_original]

        setattr(cls, "get_vocab", get_vocab)
        wrapped += 1
    if wrapped == 0:
        raise SystemExit("sglang_client.py: found no get_vocab to memoize")


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    script = sys.argv[1]
    memoize_get_vocab()
    sys.argv = [script] + sys.argv[2:]
    # run_name="__main__": bench_serving pickles its DatasetRow objects into
    # its dataset cache, and run_path makes the script's module __main__
    # while it runs, as when it runs as a script.
    sys.path.insert(0, str(__import__("pathlib").Path(script).parent))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
