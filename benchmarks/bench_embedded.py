"""The embedded model's load times and the transformers backend's decode overhead.

Prints, measured side by side in this one run:
- cold load (assemble + verify the GGUF, dequantize, save the cached copy, load it) into a
  fresh temporary cache, against a cached load of the same model;
- decode tokens/s of ``HFBackend.complete`` against a bare ``model.generate`` on the same prompt,
  model and settings (greedy, fixed length), interleaved runs, medians; ratio target >= 0.95.

Usage: python benchmarks/bench_embedded.py [--variant qwen-0.5b] [--tokens 48] [--rounds 3]
       [--no-cold]   (skip the cold load; use the shared cache as it is)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from whetstone.engine.backends.embedded import embedded_variant
from whetstone.engine.backends.hf import HFBackend
from whetstone.engine.backends.model_cache import dequantized_packaged
from whetstone.engine.paths import cache_dir
from whetstone.engine.types import Message, Request

PROMPT = "Write a detailed story about a lighthouse keeper who finds a message in a bottle."


def bare_generate(backend: HFBackend, request: Request) -> tuple[int, float]:
    """Tokens and seconds for plain transformers generate on the same chat prompt."""
    import torch

    enc = backend._encode(request)
    n_prompt = enc["input_ids"].shape[1]
    start = time.perf_counter()
    with torch.inference_mode():
        out = backend.model.generate(**enc, max_new_tokens=request.max_tokens, do_sample=False,
                                     pad_token_id=backend.tokenizer.pad_token_id)
    return out.shape[1] - n_prompt, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="qwen-0.5b")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-cold", action="store_true")
    args = ap.parse_args()
    model = embedded_variant(args.variant)

    with tempfile.TemporaryDirectory(prefix="whetstone-bench-") as tmp:
        print(f"model: {model.title}")
        cache = cache_dir() if args.no_cold else Path(tmp)
        if not args.no_cold:
            t0 = time.perf_counter()
            folder = dequantized_packaged(model, cache)
            t_build = time.perf_counter() - t0
            backend = HFBackend.from_folder(folder, name=f"embedded:{model.name}")
            t_cold = time.perf_counter() - t0
            del backend
            print(f"cold load   : {t_cold:7.1f} s  (assemble+verify+dequantize+save "
                  f"{t_build:.1f} s)")
        t0 = time.perf_counter()
        folder = dequantized_packaged(model, cache)  # complete entry: no rebuild
        backend = HFBackend.from_folder(folder, name=f"embedded:{model.name}")
        t_cached = time.perf_counter() - t0
        print(f"cached load : {t_cached:7.1f} s")
        if not args.no_cold:
            print(f"cold/cached : {t_cold / t_cached:7.1f}x")

        # A long-story prompt makes both runs decode the full length (greedy, same tokens).
        request = Request(messages=[Message("user", PROMPT)], max_tokens=args.tokens)
        bare_tps, ours_tps = [], []
        bare_generate(backend, request.with_(max_tokens=4))  # warm-up both paths
        backend.complete(request.with_(max_tokens=4))
        for _ in range(args.rounds):
            n, s = bare_generate(backend, request)
            if n != args.tokens:
                print(f"note: generate stopped after {n} tokens")
            bare_tps.append(n / s)
            c = backend.complete(request)
            if c.completion_tokens != args.tokens:
                print(f"note: complete() stopped after {c.completion_tokens} tokens")
            ours_tps.append(c.completion_tokens / c.latency_s)
        b, o = statistics.median(bare_tps), statistics.median(ours_tps)
        print(f"decode, {args.tokens} tokens, median of {args.rounds} interleaved runs:")
        print(f"  bare model.generate : {b:6.2f} tok/s  {[round(x, 2) for x in bare_tps]}")
        print(f"  HFBackend.complete  : {o:6.2f} tok/s  {[round(x, 2) for x in ours_tps]}")
        print(f"  ratio complete/bare : {o / b:6.3f}  (target >= 0.95)")


if __name__ == "__main__":
    main()
