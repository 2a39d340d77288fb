"""Does the 0.5B call a correct learned tool when the library holds one? (issue 28, item 3)

    .venv/bin/python benchmarks/bench_procedure_tools.py            # every row, 50 test tasks a set
    .venv/bin/python benchmarks/bench_procedure_tools.py --rows tools --limit 10
    .venv/bin/python benchmarks/bench_procedure_tools.py --render   # saved rows only

For each BIG-bench procedure family it scores the same test tasks four ways:
- ``tools``: the agent over a library holding the four hand-written tools of
  ``benchmarks/fixtures/procedure_tools`` with their when-to-call skills and verified calls
  (each tool is right on every item of its family when called: a fixture for the runtime, not
  a learned result). Reported: the share of tasks where the agent called the family's tool, and
  accuracy;
- ``agent``: the agent over an empty library;
- ``direct``: one call, the model's own chat template;
- ``direct-1.5b``: the packaged 1.5B answering directly (the reference a specialist must reach).
Rows are saved under ``benchmarks/results/procedure_tools/`` (reused unless ``--rerun``) and the
section JSON (``benchmarks/results/procedure_tools.json``, ``{"markdown": ...}``) is what the
scoreboard page shows. Needs the BIG-bench cache (``whetstone data fetch bigbench``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from whetstone.engine.evaluation.compare import compare
from whetstone.engine.evaluation.results import EvalResult

FIXTURE = REPO / "benchmarks" / "fixtures" / "procedure_tools"
RESULTS = REPO / "benchmarks" / "results" / "procedure_tools"
OUT = REPO / "benchmarks" / "results" / "procedure_tools.json"
SETS = {  # family -> the tool that solves it
    "bigbench:word_sorting": "sort_words",
    "bigbench:dyck_languages": "close_brackets",
    "bigbench:tracking_shuffled_objects/three_objects": "track_swaps",
    "bigbench:tracking_shuffled_objects/five_objects": "track_swaps",
    "bigbench:logical_deduction/three_objects": "order_objects",
    "bigbench:logical_deduction/five_objects": "order_objects",
}
ROWS = {"tools": ("embedded", "agent", True), "agent": ("embedded", "agent", False),
        "direct": ("embedded", "direct", False),
        "direct-1.5b": ("embedded:qwen-1.5b", "direct", False)}


def _file(spec: str, row: str) -> Path:
    return RESULTS / f"{spec.replace(':', '_').replace('/', '_').replace('@', '_')}__{row}.json"


def _called(trace: Any, tool: str) -> bool:
    return any(s.kind == "act" and s.input.get("tool") == tool and not s.error
               for s in trace.steps)


def run_row(spec: str, row: str, tool: str, work: Path) -> dict[str, Any]:
    from whetstone.engine.api import Engine
    from whetstone.engine.evaluation.benchmarks import load_tasks
    from whetstone.engine.evaluation.runner import evaluate
    from whetstone.skills.transfer import import_skills

    model, solver, with_tools = ROWS[row]
    lib = work / f"{row}-lib"
    engine = Engine(model, library=lib, checkpointing=False, solver=solver, create=True)
    if with_tools and not engine.library.snapshot().has("skills/"):
        import_skills(engine.library, FIXTURE)
    tasks = load_tasks(spec)
    start = time.time()
    try:
        result = evaluate(tasks, engine.solver(), concurrency=8, seed=0, task_set=spec,
                          model=model, store=engine.traces)
        calls = sum(_called(engine.traces.get(r.trace_id), tool) for r in result.results
                    if r.trace_id)
    finally:
        engine.close()
    out = {"result": result.to_dict(), "called": calls, "n": len(result.results),
           "wall_s": round(time.time() - start, 1)}
    _file(spec, row).parent.mkdir(parents=True, exist_ok=True)
    _file(spec, row).write_text(json.dumps(out))
    return out


def render(specs: list[str], rows: list[str]) -> str:
    head = ("| family (test tasks) | row | accuracy | vs agent, empty library (95% CI) | "
            "tool called | tokens/task |")
    lines = [head, "|---|---|---|---|---|---|"]
    for spec in specs:
        saved = {r: json.loads(_file(spec, r).read_text()) for r in rows if _file(spec, r).exists()}
        base = EvalResult.from_dict(saved["agent"]["result"]) if "agent" in saved else None
        for r, data in saved.items():
            res = EvalResult.from_dict(data["result"])
            s = res.summary()
            diff = ""
            if base is not None and r != "agent":
                c = compare(base, res)
                diff = f"{c.difference:+.2f} [{c.ci_low:+.2f}, {c.ci_high:+.2f}]"
            called = f"{data['called']}/{data['n']}" if r == "tools" else ""
            lines.append(f"| {spec.removeprefix('bigbench:')} ({data['n']}) | {r} | "
                         f"{s['accuracy']:.2f} | {diff} | {called} | {s['mean_tokens']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--limit", type=int, default=50, help="test tasks per family")
    ap.add_argument("--rerun", action="store_true")
    ap.add_argument("--render", action="store_true", help="only render the saved rows")
    args = ap.parse_args()
    rows = [r for r in args.rows.split(",") if r]
    specs = [f"{s}@test:0:{args.limit}" for s in SETS]
    if not args.render:
        with tempfile.TemporaryDirectory() as tmp:
            for spec, tool in zip(specs, SETS.values(), strict=False):
                for row in rows:
                    if _file(spec, row).exists() and not args.rerun:
                        continue
                    data = run_row(spec, row, tool, Path(tmp) / spec.replace("/", "_"))
                    print(f"{spec} {row}: {data['result']['summary']['accuracy']:.2f}, "
                          f"called {data['called']}/{data['n']}, {data['wall_s']} s", flush=True)
    markdown = render(specs, list(ROWS))
    OUT.write_text(json.dumps({"markdown": markdown}))
    print(markdown)


if __name__ == "__main__":
    main()
