"""The engine's overhead on the embedded model, measured side by side in one run.

- decode tokens/s through a whole ``whetstone run`` (the agent: graph, prompt building, parsing,
  trace writing; wall clock of the run) over tokens/s of a bare transformers ``generate`` on the
  same prompt (the exact messages the run sent), model and settings; interleaved, medians;
  target >= 0.95;
- cold load (assemble + verify + dequantize + save + load) vs cached load of the embedded model
  (``--no-cold`` skips the cold load, which takes a minute or two).

    .venv/bin/python benchmarks/bench_backend.py [--tokens 48] [--rounds 3] [--no-cold]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_embedded import PROMPT, bare_generate

from engine.api import Engine
from engine.backends.embedded import embedded_variant
from engine.backends.hf import HFBackend
from engine.backends.model_cache import dequantized_packaged
from engine.paths import cache_dir
from engine.runtime import RunConfig
from engine.types import Request


def load_times(name: str) -> None:
    model = embedded_variant(name)
    with tempfile.TemporaryDirectory(prefix="whetstone-bench-") as tmp:
        t0 = time.perf_counter()
        folder = dequantized_packaged(model, Path(tmp))
        HFBackend.from_folder(folder, name=f"embedded:{model.name}")
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        HFBackend.from_folder(dequantized_packaged(model, Path(tmp)),
                              name=f"embedded:{model.name}")
        cached = time.perf_counter() - t0
    print(f"load: cold {cold:.1f} s, cached {cached:.1f} s, cold/cached {cold / cached:.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="qwen-0.5b")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-cold", action="store_true")
    args = ap.parse_args()
    if not args.no_cold:
        load_times(args.variant)
    model = embedded_variant(args.variant)
    backend = HFBackend.from_folder(dequantized_packaged(model, cache_dir()),
                                    name=f"embedded:{model.name}")
    with tempfile.TemporaryDirectory(prefix="whetstone-bench-home-") as home:
        engine = Engine(backend, home=home, tools=(), skills=False, checkpointing=False,
                        config=RunConfig(max_steps=1, max_tokens_per_call=args.tokens))
        engine.run("warm-up")  # builds the graph, opens the library
        bare, ours = [], []
        for _ in range(args.rounds):
            start = time.perf_counter()
            trace = engine.run(PROMPT)
            wall = time.perf_counter() - start
            think = next(s for s in trace.steps if s.kind == "think")
            n_run = think.output["completion"]["completion_tokens"]
            ours.append(n_run / wall)
            request = Request(messages=think.input["messages"], max_tokens=args.tokens)
            n_bare, secs = bare_generate(backend, request)  # the same prompt the run sent
            bare.append(n_bare / secs)
            if n_bare != n_run:
                print(f"note: bare generate made {n_bare} tokens, the run {n_run}")
    b, o = statistics.median(bare), statistics.median(ours)
    print(f"decode, {args.tokens} tokens, median of {args.rounds} interleaved runs:")
    print(f"  bare model.generate   : {b:6.2f} tok/s  {[round(x, 2) for x in bare]}")
    print(f"  whetstone run (agent) : {o:6.2f} tok/s  {[round(x, 2) for x in ours]}")
    print(f"  ratio run/bare        : {o / b:6.3f}  (target >= 0.95)")


if __name__ == "__main__":
    main()
