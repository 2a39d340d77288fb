"""Generation engines on the embedded model, side by side in one run, printed as ratios.

- loads: first use after install (assemble + verify the GGUF, dequantize, convert to ONNX
  int4) into a fresh cache, and a later load, for the default engine; targets <= 3 min and
  <= 5 s (``--no-cold`` skips the first-use load, which takes minutes);
- decode: single-stream tok/s and aggregate tok/s at 1, 4 and 8 concurrent requests for the
  default engine (``embedded``: ONNX int4, continuous batching) against transformers fp32
  (``embedded@transformers``, one sequence at a time), and llama.cpp when it is installed;
  targets: single stream >= 2x transformers, aggregate at 8 >= 4x transformers single stream;
- agent overhead: tok/s of a whole ``whetstone run`` (graph, prompts, parsing, traces) over
  the bare backend call on the same prompt, per engine; target >= 0.95;
- eval: wall time of ``whetstone eval --tasks gsm8k@dev:0:50 --model embedded -j 8`` against
  the transformers engine at ``-j 1``, the latter projected from its first ``--old-slice``
  tasks (said so in the output); targets >= 4x faster and <= 15 min. ``--join-windows 0,0.2``
  adds the batch-join comparison (a smaller eval slice per window, in process).

    .venv/bin/python benchmarks/bench_backend.py [--tokens 64] [--rounds 2] [--no-cold]
        [--no-eval] [--old-slice 10] [--eval-tasks gsm8k@dev:0:50] [--join-windows 0,0.2]

Measured on the 2-core AMD EPYC (AVX2, no AVX-512) development machine, 2026-11-30, while
other jobs shared it (numbers from the report of issue 10; rerun for yours):
  engine choice (same prompts, interleaved): CTranslate2 4.8.5 int8 4.9 tok/s single, 8.2 and
  6.9 aggregate at 4 and 8; onnxruntime-genai 0.18.0 model-builder int4 11.9 single, 15.1 / 12.9
  static batches (its new continuous-batching ``Engine`` ran 4.2 tok/s on CPU); OpenVINO GenAI
  not tried: its converter (optimum-intel) pulls torch 2.14 and transformers 5.5. Chosen: the
  builder's int4 graph under our own continuous-batching scheduler on onnxruntime.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from whetstone.engine.backends import Backend, BackendOptions, get_backend
from whetstone.engine.paths import cache_dir
from whetstone.engine.types import Completion, Message, Request

REPO = Path(__file__).resolve().parent.parent
# Long-form prompts: greedy decoding runs the full length on every one of them.
PROMPTS = [
    "Write a detailed story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator works, step by step, in detail.",
    "Write a long poem about the sea and the stars.",
    "Describe the history of the Roman empire in detail.",
    "Write a detailed story about a dragon who learns to bake bread.",
    "Explain photosynthesis to a ten-year-old, at length.",
    "Write a detailed travel guide to Paris.",
    "Describe how to build a wooden chair, step by step.",
]


def request(i: int, tokens: int) -> Request:
    return Request(messages=[Message("user", PROMPTS[i % len(PROMPTS)])], max_tokens=tokens)


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


# -- loads ------------------------------------------------------------------------------------


def load_times(cold: bool) -> None:
    if cold:
        with tempfile.TemporaryDirectory(prefix="whetstone-bench-") as tmp:
            stages: list[str] = []

            def progress(message: str, fraction: float | None) -> None:
                if not stages or stages[-1] != message:
                    stages.append(message)

            backend, first = timed(get_backend, "embedded",
                                   BackendOptions(cache_dir=Path(tmp), progress=progress))
            backend.close()
            backend, later = timed(get_backend, "embedded", BackendOptions(cache_dir=Path(tmp)))
            backend.close()
        print(f"load, default engine: first use {first:6.1f} s (target <= 180)  "
              f"later {later:5.2f} s (target <= 5)")
        print(f"  first-use steps reported to the progress callback: {len(stages)}")
    backend, later = timed(get_backend, "embedded", BackendOptions())
    backend.close()
    print(f"load, default engine, cached in {cache_dir()}: {later:5.2f} s")


# -- decode -----------------------------------------------------------------------------------


def aggregate(backend: Backend, concurrency: int, tokens: int) -> tuple[float, int]:
    """Aggregate tok/s of ``concurrency`` requests sent at once (distinct prompts)."""
    reqs = [request(i, tokens) for i in range(concurrency)]
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        done: list[Completion] = list(pool.map(backend.complete, reqs))
    n = sum(c.completion_tokens for c in done)
    return n / (time.perf_counter() - start), n


def decode_rows(specs: list[str], tokens: int, rounds: int, levels: list[int]
                ) -> dict[str, dict[int, float]]:
    results: dict[str, dict[int, list[float]]] = {s: {k: [] for k in levels} for s in specs}
    backends = {s: get_backend(s) for s in specs}
    try:
        for b in backends.values():  # warm-up: first calls allocate buffers and caches
            b.complete(request(0, 4))
        for _ in range(rounds):  # interleaved, so a busy machine hurts every engine alike
            for level in levels:
                for spec, b in backends.items():
                    tps, n = aggregate(b, level, tokens)
                    results[spec][level].append(tps)
                    if n < level * tokens:
                        print(f"  note: {spec} at {level} made {n} of {level * tokens} tokens")
    finally:
        for b in backends.values():
            b.close()
    return {s: {k: statistics.median(v) for k, v in r.items()} for s, r in results.items()}


def print_decode(rows: dict[str, dict[int, float]], base: str, fast: str, tokens: int,
                 rounds: int) -> None:
    levels = sorted(next(iter(rows.values())))
    print(f"decode, {tokens} tokens per request, median of {rounds} interleaved rounds "
          "(aggregate tok/s):")
    print("  " + f"{'engine':<26}" + "".join(f"{f'at {k}':>10}" for k in levels))
    for spec, r in rows.items():
        print("  " + f"{spec:<26}" + "".join(f"{r[k]:10.2f}" for k in levels))
    single = rows[base][1]
    print(f"  single stream {fast} / {base}: {rows[fast][1] / single:5.2f}x  (target >= 2)")
    print(f"  aggregate at 8, {fast} / {base} single stream: {rows[fast][8] / single:5.2f}x  "
          "(target >= 4)")


# -- agent overhead ---------------------------------------------------------------------------


def overhead(spec: str, tokens: int, rounds: int) -> None:
    from whetstone.engine.api import Engine
    from whetstone.engine.runtime import RunConfig

    backend = get_backend(spec)
    with tempfile.TemporaryDirectory(prefix="whetstone-bench-home-") as home:
        engine = Engine(backend, library=Path(home) / "library", create=True, tools=(),
                        skills=False, checkpointing=False,
                        config=RunConfig(max_steps=1, max_tokens_per_call=tokens))
        engine.run("warm-up")
        bare, ours = [], []
        for _ in range(rounds):
            trace, wall = timed(engine.run, PROMPTS[0])
            think = next(s for s in trace.steps if s.kind == "think")
            ours.append(think.output["completion"]["completion_tokens"] / wall)
            same = Request(messages=think.input["messages"], max_tokens=tokens)
            c, secs = timed(backend.complete, same)
            bare.append(c.completion_tokens / secs)
    backend.close()
    b, o = statistics.median(bare), statistics.median(ours)
    print(f"agent overhead, {spec}: run {o:6.2f} tok/s, bare call {b:6.2f} tok/s, "
          f"ratio {o / b:5.3f} (target >= 0.95)")


# -- eval wall time ---------------------------------------------------------------------------


def cli_eval(spec: str, tasks: str, concurrency: int, home: Path) -> dict[str, Any]:
    env = {**os.environ, "WHETSTONE_HOME": str(home)}
    cmd = [sys.executable, "-m", "whetstone", "eval", "--tasks", tasks, "--model",
           spec, "-j", str(concurrency), "--json"]
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    result = json.loads(out.stdout)["results"][0]
    scores = [t["score"] for t in result["results"]]
    return {"wall": wall, "n": len(scores), "accuracy": sum(scores) / len(scores),
            "tokens": sum(t.get("tokens", 0) for t in result["results"])}


def eval_rows(tasks: str, old_slice: int, concurrency: int) -> None:
    base, _, span = tasks.partition(":")
    start, _, end = span.partition(":")
    n_tasks = int(end) - int(start or 0)
    with tempfile.TemporaryDirectory(prefix="whetstone-bench-eval-") as home:
        new = cli_eval("embedded", tasks, concurrency, Path(home) / "new")
        old_tasks = f"{base}:{start or 0}:{int(start or 0) + old_slice}"
        old = cli_eval("embedded@transformers", old_tasks, 1, Path(home) / "old")
    projected = old["wall"] * n_tasks / old["n"]
    print(f"eval {tasks}: default engine -j {concurrency}: {new['wall'] / 60:6.1f} min "
          f"({new['n'] / new['wall'] * 60:5.2f} tasks/min, accuracy {new['accuracy']:.3f}, "
          f"{new['tokens']} tokens)  target <= 15 min")
    print(f"  transformers -j 1 on {old_tasks}: {old['wall'] / 60:6.1f} min "
          f"({old['n'] / old['wall'] * 60:5.2f} tasks/min, accuracy {old['accuracy']:.3f}); "
          f"projected to {n_tasks} tasks: {projected / 60:6.1f} min")
    print(f"  speed-up (projected old / new): {projected / new['wall']:5.2f}x  (target >= 4)")


def join_windows(windows: list[float], tasks: str, concurrency: int) -> None:
    """Eval wall time per batch-join window, in process (same agent as `whetstone eval`)."""
    from whetstone.engine.api import Engine
    from whetstone.engine.evaluation.benchmarks import load_tasks
    from whetstone.engine.evaluation.runner import evaluate

    for window in windows:
        backend = get_backend("embedded", BackendOptions(extra={"join_window_s": window}))
        with tempfile.TemporaryDirectory(prefix="whetstone-bench-join-") as home:
            solver = Engine(backend, library=Path(home) / "lib", checkpointing=False,
                            create=True).solver()
            _, wall = timed(evaluate, load_tasks(tasks), solver, None, concurrency=concurrency)
        stats = backend.stats
        backend.close()
        print(f"join window {window:4.2f} s, {tasks} -j {concurrency}: {wall / 60:5.2f} min, "
              f"{stats['steps']} decode steps, {stats['tokens'] / max(1, stats['steps']):4.2f} "
              f"tokens/step, {stats['reused_tokens']} prompt tokens reused")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-cold", action="store_true", help="skip the first-use load")
    ap.add_argument("--no-decode", action="store_true")
    ap.add_argument("--no-overhead", action="store_true")
    ap.add_argument("--no-eval", action="store_true")
    ap.add_argument("--eval-tasks", default="gsm8k@dev:0:50")
    ap.add_argument("--old-slice", type=int, default=10)
    ap.add_argument("-j", "--concurrency", type=int, default=8)
    ap.add_argument("--join-windows", default="", help="e.g. 0,0.2 (in-process eval slices)")
    ap.add_argument("--join-tasks", default="gsm8k@dev:0:16")
    args = ap.parse_args()

    load_times(cold=not args.no_cold)
    if not args.no_decode:
        import importlib.util

        specs = ["embedded@transformers", "embedded"]
        if importlib.util.find_spec("llama_cpp") is not None:
            specs.append("llamacpp:embedded")
        else:
            print("llama.cpp: not installed (optional extra), not measured")
        rows = decode_rows(specs, args.tokens, args.rounds, [1, 4, 8])
        print_decode(rows, "embedded@transformers", "embedded", args.tokens, args.rounds)
    if not args.no_overhead:
        for spec in ("embedded", "embedded@transformers"):
            overhead(spec, args.tokens, args.rounds)
    if args.join_windows:
        join_windows([float(w) for w in args.join_windows.split(",")], args.join_tasks,
                     args.concurrency)
    if not args.no_eval:
        eval_rows(args.eval_tasks, args.old_slice, args.concurrency)


if __name__ == "__main__":
    main()
