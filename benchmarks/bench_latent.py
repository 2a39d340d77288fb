"""Latent test-time scaling: what one refinement step costs, and what refinement buys.

Two measurements, side by side in one run:

``step`` (default): one refinement step of ``LatentRefiner`` against one forward+backward of
the same model at the same length (the verification sequence: prompt + answer + verify turn,
backward to the input embeddings, weights frozen, as the refiner does). Reported: forward
alone, forward+backward (the unit), a step's gradient part (reward forward+backward, Adam, the
window's LM head), and a whole step including the greedy re-decode when a window token changed,
each as seconds and as a ratio to the unit. Medians over ``--rounds``.

``--tasks SPEC`` (e.g. ``gsm8k@dev:0:20``): initial (plain greedy) vs refined accuracy on a task
set, scored with the set's scorer, and the cost per task: forwards, backwards, decoded tokens,
seconds. ``--out FILE`` writes one JSON line per task (the full ``RefineRecord``).

``--summarise FILE`` prints the summary of such a file (a run still going, or cut short).

Usage: python benchmarks/bench_latent.py [--device cpu|cuda] [--tokens 96] [--steps 3]
       [--rounds 3] [--tasks gsm8k@dev:0:20 [--max-tokens 320] [--out latent.jsonl]]
       [--lr 0.03 --fraction 0.1 --prefix 0.25 --max-steps 10 --threshold -0.2]
       python benchmarks/bench_latent.py --summarise latent.jsonl
The model is the embedded Qwen2.5-Coder-0.5B on the transformers path (fp32 on CPU, bf16 on a
GPU), from the Whetstone cache (``WHETSTONE_CACHE``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from whetstone.engine.backends.hf import HFBackend
from whetstone.engine.backends.model_cache import dequantized_packaged
from whetstone.engine.evaluation.benchmarks import load_tasks
from whetstone.engine.evaluation.direct import task_messages
from whetstone.engine.evaluation.scorers import get_scorer
from whetstone.engine.methods.latent.tts import LatentConfig, LatentRefiner, SelfReward
from whetstone.engine.paths import cache_dir
from whetstone.engine.types import Message, Request

_T0 = time.perf_counter()
QUESTION = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many "
            "clips in May. How many clips did Natalia sell altogether in April and May?")


def forward_backward(model: Any, ids: Any) -> tuple[float, float]:
    """Seconds for one forward, and for one forward+backward to the input embeddings."""
    import torch

    emb = model.get_input_embeddings()
    start = time.perf_counter()
    with torch.no_grad():
        model(input_ids=ids, logits_to_keep=1)
    fwd = time.perf_counter() - start
    start = time.perf_counter()
    x = emb(ids).detach().requires_grad_(True)  # (1, T, d)
    out = model(inputs_embeds=x, logits_to_keep=1)
    torch.logsumexp(out.logits[0, -1].float(), dim=-1).backward()
    return fwd, time.perf_counter() - start


def step_costs(refiner: LatentRefiner, request: Request) -> dict[str, float]:
    """Mean seconds per update of one refinement (its threshold out of reach: every step runs)."""
    _, rec = _refine(refiner, request)
    n = max(rec.steps, 1)
    return {"gradient": statistics.mean(rec.step_seconds or [0.0]),
            "step": (sum(rec.step_seconds) + sum(rec.redecode_seconds)) / n,
            "redecoded": sum(1 for c in rec.changed if c) / n,
            "decode_tokens": rec.redecode_tokens / n}


def _refine(refiner: LatentRefiner, request: Request) -> tuple[Any, Any]:
    result = refiner.refine(request)
    return result.completion, result.record


def load_model(device: str | None) -> HFBackend:
    folder = dequantized_packaged("qwen-0.5b", cache_dir())
    return HFBackend.from_folder(folder, name="embedded@transformers", device=device)


def bench_step(backend: HFBackend, args: argparse.Namespace) -> None:
    import torch

    request = Request(messages=[Message("user", QUESTION)], max_tokens=args.tokens)
    cfg = LatentConfig(max_steps=args.steps, threshold=1.0, lr=args.lr, fraction=args.fraction,
                       prefix=args.prefix)  # threshold 1.0: every step runs
    refiner = LatentRefiner.from_backend(backend, cfg)
    _, rec = _refine(refiner, request)
    tok = backend.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": QUESTION}],
                                     add_generation_prompt=True, return_tensors="pt",
                                     return_dict=True)["input_ids"]
    answer = tok(rec.initial_text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    suffix = torch.tensor([SelfReward(tok).suffix])
    ids = torch.cat([prompt, answer, suffix], dim=1).to(backend.device)
    print(f"model: {backend.name}  device: {backend.device}  dtype: {backend.model.dtype}")
    print(f"prompt {prompt.shape[1]} + answer {answer.shape[1]} + verify turn "
          f"{suffix.shape[1]} = {ids.shape[1]} tokens; window {rec.window}, "
          f"{rec.steps} steps per refinement, {args.rounds} rounds")
    fwd, fb, grad, step, red, dec = [], [], [], [], [], []
    for _ in range(args.rounds):
        f, b = forward_backward(backend.model, ids)
        fwd.append(f)
        fb.append(b)
        c = step_costs(refiner, request)
        grad.append(c["gradient"])
        step.append(c["step"])
        red.append(c["redecoded"])
        dec.append(c["decode_tokens"])
    unit = statistics.median(fb)
    rows = [("forward", statistics.median(fwd)), ("forward+backward (unit)", unit),
            ("refine step: gradient part", statistics.median(grad)),
            ("refine step: with re-decode", statistics.median(step))]
    print(f"{'':32s}{'seconds':>10s}{'x unit':>10s}")
    for name, sec in rows:
        print(f"{name:32s}{sec:10.3f}{sec / unit:10.2f}")
    print(f"re-decoded in {statistics.mean(red):.0%} of steps, "
          f"{statistics.mean(dec):.0f} tokens decoded per step on average")


def bench_tasks(backend: HFBackend, args: argparse.Namespace) -> None:
    tasks = load_tasks(args.tasks).tasks
    cfg = LatentConfig(lr=args.lr, fraction=args.fraction, prefix=args.prefix,
                       max_steps=args.max_steps, threshold=args.threshold)
    refiner = LatentRefiner.from_backend(backend, cfg, on_step=_progress)
    print(f"model: {backend.name}  device: {backend.device}  tasks: {args.tasks} "
          f"({len(tasks)})  config: {cfg}")
    out = open(args.out, "w", encoding="utf-8") if args.out else None  # noqa: SIM115
    rows = []
    try:
        for task in tasks:
            scorer = get_scorer(task.scorer or "numeric")
            request = Request(messages=tuple(task_messages(task)), max_tokens=args.max_tokens)
            completion, rec = _refine(refiner, request)
            row = {"id": task.id, "initial": scorer(rec.initial_text, task),
                   "refined": scorer(completion.text, task), **rec.to_dict()}
            rows.append(row)
            print(f"{task.id:12s} initial {row['initial']:.0f} refined {row['refined']:.0f}  "
                  f"rewards {[round(r, 2) for r in rec.rewards]}  best step {rec.best_step}  "
                  f"fwd {rec.forward} bwd {rec.backward} re-decoded {rec.redecode_tokens}  "
                  f"{rec.seconds:.0f}s", flush=True)
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
    finally:
        if out:
            out.close()
    summarise(rows)


def _progress(rec: Any) -> None:
    """One line per reward evaluation, on stderr (refinements take minutes on a CPU)."""
    changed = rec.changed[-1] if rec.changed else []
    print(f"  step {len(rec.rewards) - 1}: reward {rec.rewards[-1]:.3f}, window tokens changed "
          f"{changed}, {time.perf_counter() - _T0:.0f}s", file=sys.stderr, flush=True)


def summarise(rows: list[dict[str, Any]]) -> None:
    n = len(rows)
    if not n:
        return
    init = sum(r["initial"] for r in rows)
    ref = sum(r["refined"] for r in rows)
    gained = sum(1 for r in rows if r["refined"] > r["initial"])
    lost = sum(1 for r in rows if r["refined"] < r["initial"])
    changed = sum(1 for r in rows if r["best_step"] > 0)
    print(f"\naccuracy: initial {init:.0f}/{n} = {init / n:.0%}, refined {ref:.0f}/{n} = "
          f"{ref / n:.0%}  (wrong->right {gained}, right->wrong {lost}; "
          f"answer replaced in {changed} tasks)")
    stopped = {k: sum(1 for r in rows if r["stopped"] == k) for k in ("threshold", "max_steps")}
    print(f"stopped: {stopped}; initial reward >= threshold in "
          f"{sum(1 for r in rows if not r['updated'])} tasks")
    for key in ("forward", "backward", "redecodes", "redecode_tokens", "seconds",
                "seconds_initial"):
        vals = [r[key] for r in rows]
        print(f"per task {key:18s} mean {statistics.mean(vals):8.1f}  max {max(vals):8.1f}")
    base = statistics.mean(r["answer_tokens"] + 1 for r in rows)
    plain_s = statistics.mean(r["seconds_initial"] for r in rows)
    print(f"plain greedy decodes {base:.0f} tokens per task; refinement re-decodes "
          f"{statistics.mean(r['redecode_tokens'] for r in rows) / base:.1f}x that; wall time "
          f"{statistics.mean(r['seconds'] for r in rows) / plain_s:.1f}x the plain answer's")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--tokens", type=int, default=96, help="answer length for the step bench")
    ap.add_argument("--steps", type=int, default=3, help="updates per refinement (step bench)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tasks", default=None, help="a task-set spec: measure accuracy instead")
    ap.add_argument("--max-tokens", type=int, default=320)
    ap.add_argument("--out", default=None)
    ap.add_argument("--lr", type=float, default=0.03)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--prefix", type=float, default=0.25)
    ap.add_argument("--max-steps", type=int, default=10)
    ap.add_argument("--threshold", type=float, default=-0.2)
    ap.add_argument("--summarise", default=None, help="summarise a --out file and exit")
    args = ap.parse_args()
    if args.summarise:
        lines = Path(args.summarise).read_text(encoding="utf-8").splitlines()
        summarise([json.loads(line) for line in lines if line.strip()])
        return
    backend = load_model(args.device)
    try:
        if args.tasks:
            bench_tasks(backend, args)
        else:
            bench_step(backend, args)
    finally:
        backend.close()


if __name__ == "__main__":
    main()
