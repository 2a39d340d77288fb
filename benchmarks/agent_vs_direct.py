"""The agent loop against the same model answering directly (issue 19), on the same tasks.

    .venv/bin/python benchmarks/agent_vs_direct.py                       # gsm8k + bfcl-simple
    .venv/bin/python benchmarks/agent_vs_direct.py --sets gsm8k@dev:0:20 \\
        --variants direct,agent,agent-native,agent-no-code -j 8
    .venv/bin/python benchmarks/agent_vs_direct.py --render              # saved runs only
    .venv/bin/python benchmarks/agent_vs_direct.py --sets gsm8k@dev:0:50 \
        --model embedded,openai:qwen@http://127.0.0.1:8081/v1   # and through llama.cpp's server

Each (set, variant) runs through ``whetstone.engine.api.solver_factory`` over an empty library, exactly
as ``whetstone eval --tasks SET --solver direct|agent`` does, with the same per-task seeds, and
is saved under ``benchmarks/results/agent_vs_direct/`` with a key of what it depends on (reused
while the key matches; ``--rerun`` runs again). ``--model`` takes several specs: each gets its
own tables (an ``openai:`` server of the same model shows what the loop does on another
engine). The section JSON (``--out``, a scoreboard
section: ``{"markdown": ...}``) holds, per set: accuracy, the paired difference from direct
with its 95% bootstrap interval and McNemar's p, tokens/task (prompt + completion over every
model call) and its ratio to direct, the share of tasks where a built-in tool ran, and model
calls per task. The findings below the tables are ``benchmarks/agent_vs_direct.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from whetstone.engine.evaluation.compare import compare
from whetstone.engine.evaluation.results import EvalResult
from whetstone.engine.types import Trace

SETS = ("gsm8k@dev:0:50", "bfcl-simple@dev:0:50")
RESULTS = REPO / "benchmarks" / "results" / "agent_vs_direct"
OUT = REPO / "benchmarks" / "results" / "agent_vs_direct.json"
NOTES = REPO / "benchmarks" / "agent_vs_direct.md"
COMMAND = ".venv/bin/python benchmarks/agent_vs_direct.py"


@dataclass(frozen=True)
class Variant:
    """A way of answering: a solver and the agent's run config (``RunConfig`` fields)."""

    name: str
    solver: str
    config: dict[str, Any] = field(default_factory=dict)
    what: str = ""


VARIANTS = {v.name: v for v in (
    Variant("direct", "direct", what="one call, the model's chat template (the baseline)"),
    Variant("agent", "agent", what="the agent loop as shipped"),
    Variant("agent-native", "agent", {"tool_format": "native"},
            "tools through the template's own tools block (~300 tokens of JSON schemas)"),
    Variant("agent-no-code", "agent", {"code_blocks": False},
            "python blocks are plain text: tools only through <tool_call>"),
    Variant("agent-restate", "agent", {"answer_with_program_output": False},
            "after a program runs, the model is asked again to state the answer"),
)}


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)


def run_key(model: str, task_set: str, variant: Variant, seed: int) -> str:
    data = json.dumps([model, task_set, variant.solver, variant.config, seed], sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def trace_stats(trace: Trace) -> dict[str, Any]:
    """What a run did: model calls, built-in tool calls (by form), answered by a program."""
    acts = [s for s in trace.steps if s.kind == "act"
            and not (s.output or {}).get("answer_call")
            and trace.meta.get("solver") != "direct"]
    return {"model_calls": sum(1 for s in trace.steps if s.kind == "think"),
            "tools": [s.input.get("tool") for s in acts],
            "forms": [(s.output or {}).get("form", "") for s in acts],
            "program_answer": any(s.route == "finish" and (s.output or {}).get("form") == "code"
                                  for s in acts)}


def run_one(model: str, backend: Any, task_set: str, variant: Variant, seed: int,
            concurrency: int, work: Path) -> dict[str, Any]:
    """Evaluate one variant on one set over a fresh empty library."""
    from whetstone.engine.api import Engine
    from whetstone.engine.evaluation.benchmarks import load_tasks
    from whetstone.engine.evaluation.runner import evaluate
    from whetstone.engine.runtime import RunConfig
    from whetstone.library_store.traces import TraceStore

    folder = work / _slug(task_set) / variant.name
    shutil.rmtree(folder, ignore_errors=True)
    engine = Engine(backend, library=folder / "library", checkpointing=False, create=True,
                    config=RunConfig(**variant.config), solver=variant.solver)
    store = TraceStore(folder / "traces")
    tasks = load_tasks(task_set)

    def progress(done: int, total: int, r: Any) -> None:
        if done == total or done % 5 == 0:
            print(f"  {task_set} {variant.name}: {done}/{total}", flush=True)

    result = evaluate(tasks, engine.solver(), concurrency=concurrency, seed=seed, store=store,
                      task_set=task_set, model=model, on_progress=progress)
    stats = {t.meta["task_id"]: trace_stats(t) for t in store.query()
             if t.outcome != "running"}
    return {"key": run_key(model, task_set, variant, seed), "variant": variant.name,
            "result": result.to_dict(), "stats": stats}


def _saved(task_set: str, variant: str, model: str = "embedded") -> Path:
    prefix = "" if model == "embedded" else f"{_slug(model)}__"  # embedded: the first runs' names
    return RESULTS / f"{prefix}{_slug(task_set)}__{variant}.json"


def _load(task_set: str, variant: str, model: str = "embedded") -> dict[str, Any] | None:
    path = _saved(task_set, variant, model)
    return json.loads(path.read_text()) if path.exists() else None


def _rates(run: dict[str, Any]) -> tuple[float, float, float]:
    """(share of tasks where a built-in tool ran, share answered by a program, model calls
    per task)."""
    stats = list(run["stats"].values()) or [{}]
    n = len(stats)
    tool = sum(bool(s.get("tools")) for s in stats) / n
    program = sum(bool(s.get("program_answer")) for s in stats) / n
    calls = sum(s.get("model_calls", 0) for s in stats) / n
    return tool, program, calls


def render_set(task_set: str, variants: list[str], model: str = "embedded") -> list[str]:
    runs = {v: r for v in variants if (r := _load(task_set, v, model)) is not None}
    if "direct" not in runs:
        return [f"#### `{task_set}`", "", "(not run yet)"]
    base = EvalResult.from_dict(runs["direct"]["result"])
    lines = [f"#### `{task_set}`", "",
             ("| solver | accuracy (n) | Δ vs direct [95% CI] | McNemar p | tokens/task "
             "| × direct | tool-call rate | answered by a program | model calls/task |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for name, run in runs.items():
        res = EvalResult.from_dict(run["result"])
        tool, program, calls = _rates(run)
        delta, p = "–", "–"
        if name != "direct":
            c = compare(base, res)
            delta = f"{c.difference:+.3f} [{c.ci_low:+.3f}, {c.ci_high:+.3f}]"
            p = "n/a" if c.p_value is None else f"{c.p_value:.3g}"
        ratio = res.mean_tokens / base.mean_tokens if base.mean_tokens else float("nan")
        lines.append(f"| {name} | {res.accuracy:.3f} ({res.tally()}) | {delta} | {p} | "
                     f"{res.mean_tokens:.0f} | {ratio:.2f} | {tool:.2f} | {program:.2f} | "
                     f"{calls:.2f} |")
    return lines


def render(sets: list[str], variants: list[str], models: list[str]) -> str:
    shown = [v for v in VARIANTS if v in variants
             or any(_saved(s, v, m).exists() for s in sets for m in models)]
    parts = [("Empty library, greedy, seed 0. Each row runs the same tasks with the same "
              "per-task seeds as `direct`; Δ is paired (bootstrap, 10,000 resamples). "
              "Tool-call rate: share of tasks where a built-in tool (calculator, python) ran; "
              "BFCL's own function calls are the answer and are not counted."), ""]
    parts += [f"- **{v}**: {VARIANTS[v].what}" for v in shown]
    parts += ["", "Commands (the script runs exactly these solvers):", "", "```bash",
              (f"{COMMAND} --model {','.join(models)} --sets {','.join(sets)} "
               f"--variants {','.join(shown)}")]
    for m in models:
        for s in sets:
            parts += [f"whetstone eval --model {m} --tasks {s} --solver {solver} "
                      "--library $(mktemp -d)" for solver in ("direct", "agent")]
    parts += ["```", ""]
    for m in models:
        parts += [f"### Model `{m}`", ""]
        for s in sets:
            parts += render_set(s, shown, m) + [""]
    if NOTES.exists():
        parts += [NOTES.read_text(encoding="utf-8").strip()]
    return "\n".join(parts).rstrip() + "\n"


def _run_model(model: str, sets: list[str], variants: list[str], args: Any) -> None:
    """Run what is not saved yet (or everything with ``--rerun``) for one model."""
    from whetstone.engine.backends.registry import get_backend

    backend = get_backend(model)
    j = args.concurrency or max(1, backend.capabilities.max_concurrency)
    RESULTS.mkdir(parents=True, exist_ok=True)
    for s in sets:
        for v in variants:
            saved = _load(s, v, model)
            if saved and saved["key"] == run_key(model, s, VARIANTS[v], args.seed) \
                    and not args.rerun:
                continue
            print(f"running {model} {s} {v}", flush=True)
            run = run_one(model, backend, s, VARIANTS[v], args.seed, j,
                          Path(args.work_dir) / _slug(model))
            _saved(s, v, model).write_text(json.dumps(run, indent=1), encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="embedded",
                    help="comma-separated specs, each with its own tables (e.g. "
                         "embedded,openai:qwen@http://127.0.0.1:8081/v1)")
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--variants", default="direct,agent",
                    help="comma-separated: " + ", ".join(VARIANTS))
    ap.add_argument("-j", "--concurrency", type=int, default=None,
                    help="tasks in flight (default: what the backend batches)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rerun", action="store_true")
    ap.add_argument("--render", action="store_true", help="only write --out from saved runs")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--work-dir", default=str(Path.home() / ".whetstone" / "agent_vs_direct"))
    args = ap.parse_args()
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    models = [m.strip() for m in args.model.split(",") if m.strip()]
    if not args.render:
        for model in models:
            _run_model(model, sets, variants, args)
    markdown = render(sets, variants, models)
    Path(args.out).write_text(json.dumps({"markdown": markdown}, indent=1), encoding="utf-8")
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
