"""Does the fast engine cost accuracy? The ONNX int4 engine against transformers fp32 on the
same tasks, answered the same way (the direct solver: one greedy call, the model's own chat
template), paired per task.

    .venv/bin/python benchmarks/engine_parity.py [--tasks gsm8k@dev:0:30] [--batch 8]

The ONNX side runs the direct solver as ``whetstone eval --solver direct`` does. The
transformers side renders exactly the same requests with the same chat template and decodes
them greedily in padded batches of ``--batch`` (the transformers backend decodes one sequence
at a time: about 3-6 tok/s here, too slow for 30 tasks), then both are scored by the set's
scorer through ``evaluate``. Printed: both accuracies, the paired difference with its 95%
bootstrap interval and McNemar's p, and how many answers are token-identical. The issue's
target: the difference's interval contains 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from whetstone.engine.backends import get_backend
from whetstone.engine.backends.local_text import prompt_text
from whetstone.engine.evaluation.benchmarks import load_tasks
from whetstone.engine.evaluation.compare import compare
from whetstone.engine.evaluation.direct import direct_solver, task_messages
from whetstone.engine.evaluation.runner import evaluate
from whetstone.engine.evaluation.tasks import TaskRecord
from whetstone.engine.types import Request, Step, Trace


def transformers_answers(tasks: list[TaskRecord], batch: int, max_tokens: int
                         ) -> dict[str, tuple[str, int]]:
    """task id -> (answer text, tokens) from transformers fp32, greedy, padded batches."""
    import torch

    backend: Any = get_backend("embedded@transformers")
    tok, model = backend.tokenizer, backend.model
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    out: dict[str, tuple[str, int]] = {}
    for i in range(0, len(tasks), batch):
        chunk = tasks[i:i + batch]
        texts = [prompt_text(tok, Request(messages=tuple(task_messages(t)),
                                          max_tokens=max_tokens), False) for t in chunk]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        t0 = time.time()
        with torch.inference_mode():
            gen = model.generate(**enc, max_new_tokens=max_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
        width = enc["input_ids"].shape[1]
        for t, row, mask in zip(chunk, gen, enc["attention_mask"], strict=False):
            new = row[width:].tolist()
            text = tok.decode(new, skip_special_tokens=True).strip()
            n_new = sum(1 for x in new if x != tok.pad_token_id)
            out[t.id] = (text, int(mask.sum()) + n_new)
        print(f"  transformers: {min(i + batch, len(tasks))}/{len(tasks)} "
              f"({time.time() - t0:.0f} s for this batch)", flush=True)
    backend.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="gsm8k@dev:0:30")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("-j", "--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=512, help="per answer (direct's default)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "engine_parity.json"),
                    help="the section JSON for docs/results.md ({'markdown': ...})")
    args = ap.parse_args()
    tasks = load_tasks(args.tasks)
    onnx = get_backend("embedded")
    t0 = time.time()
    fast = evaluate(tasks, direct_solver(onnx, max_tokens=args.max_tokens), concurrency=args.concurrency, label="onnx int4")
    fast_wall = time.time() - t0
    onnx.close()
    t0 = time.time()
    answers = transformers_answers(list(tasks), args.batch, args.max_tokens)
    slow_wall = time.time() - t0

    def replay(task: TaskRecord, seed: int) -> Trace:
        text, tokens = answers[task.id]
        now = time.time()
        return Trace(id=uuid.uuid4().hex, task=task.prompt, answer=text, outcome="answered",
                     steps=(Step(kind="think", module="think", output=text, tokens=tokens),),
                     model="embedded@transformers", started=now, ended=now,
                     total_tokens=tokens, meta={"solver": "direct"})

    slow = evaluate(tasks, replay, label="transformers fp32")
    c = compare(slow, fast)
    same = sum(1 for r in fast.results
               if (r.answer or "").strip() == answers[r.task_id][0])
    p = "n/a" if c.p_value is None else f"{c.p_value:.3f}"
    markdown = "\n".join([
        (f"`{args.tasks}`, direct solver (one greedy call, the model's chat template), "
        f"{len(tasks)} tasks, paired. Command: `.venv/bin/python benchmarks/engine_parity.py "
        f"--tasks {args.tasks}`."), "",
        "| engine | accuracy | wall |", "|---|---|---|",
        (f"| transformers fp32 (padded batches of {args.batch}) | {slow.accuracy:.3f} | "
        f"{slow_wall / 60:.1f} min |"),
        (f"| ONNX int4, continuous batching (-j {args.concurrency}) | {fast.accuracy:.3f} | "
        f"{fast_wall / 60:.1f} min |"), "",
        (f"ONNX - transformers: {c.difference:+.3f}, 95% CI [{c.ci_low:+.3f}, {c.ci_high:+.3f}] "
        f"(paired bootstrap), McNemar p {p}; identical answers {same}/{len(tasks)}.")])
    Path(args.out).write_text(json.dumps({"markdown": markdown}, indent=1), encoding="utf-8")
    print(f"\n{args.tasks}, direct solver, greedy, {len(tasks)} tasks")
    print(f"  transformers fp32: accuracy {slow.accuracy:.3f}  ({slow_wall / 60:.1f} min, "
          f"padded batches of {args.batch})")
    print(f"  onnx int4:         accuracy {fast.accuracy:.3f}  ({fast_wall / 60:.1f} min, "
          f"-j {args.concurrency})")
    p = "n/a" if c.p_value is None else f"{c.p_value:.3f}"
    print(f"  onnx - transformers: {c.difference:+.3f}  95% CI [{c.ci_low:+.3f}, "
          f"{c.ci_high:+.3f}] (paired bootstrap), McNemar p {p}; "
          f"wins {len(c.wins)} losses {len(c.losses)}")
    print(f"  identical answers: {same}/{len(tasks)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
