"""One scoreboard row at a reduced scale: evolve from the train runs already collected, gate on
a dev slice, and score the empty and the evolved library on the same test tasks, paired.

    .venv/bin/python benchmarks/quick_evolve.py --row env-ledger/workflows \\
        --dev benchmarks/fixtures/env_ledger/tasks.jsonl@dev:0:60 \\
        --test benchmarks/fixtures/env_ledger/tasks.jsonl@test:0:100

A full evolved row on the 2-core machine (300 train runs, 150 dev tasks twice, 300 test tasks
twice) takes hours; this measures the same row on whatever part of the set's train
collection ``benchmarks/scoreboard.py`` has stored (a cut-short collection included), on
smaller dev and test slices, with the row's own options and the default gate. It writes
nothing to benchmarks/results/: the board shows full rows only. It prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from scoreboard_harness.runner import Runner, load_plan, slug


def _progress(what: str, done: int, total: int) -> None:
    if done == total or done % 10 == 0:
        print(f"  {what}: {done}/{total}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", required=True, help="an evolved row of scoreboard.yaml (set/name)")
    ap.add_argument("--dev", required=True, help="the gate's task slice")
    ap.add_argument("--test", required=True, help="the test slice both libraries answer")
    ap.add_argument("--plan", default=str(REPO / "benchmarks" / "scoreboard.yaml"))
    ap.add_argument("--work-dir", default=str(Path.home() / ".whetstone" / "scoreboard"))
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()

    from whetstone.engine.backends.registry import get_backend
    from whetstone.engine.evaluation.gate_rules import DEFAULT_RULE
    from whetstone.engine.evaluation.stats import paired_bootstrap
    from whetstone.engine.evolution.pipeline import training_traces

    plan = load_plan(args.plan)
    row = plan.row(args.row)
    if row.evolve is None:
        raise SystemExit(f"{args.row} evolves nothing: name an evolved row")
    s = plan.set(row.set)
    backend = get_backend(plan.model)
    work = Path(args.work_dir)
    runner = Runner(plan, backend, backend, work, concurrency=1,
                    on_progress=_progress)
    collect = runner.engine(work / slug(s.name) / "collect", plan.row(f"{s.name}/{s.baseline}"))
    train = runner.tasks(row.evolve.train or s.train)
    traces = training_traces(t for t in collect.traces.query()
                             if t.meta.get("task_set") == train.name)
    if not traces:
        raise SystemExit(f"no collected train runs in {work / slug(s.name) / 'collect'}: run "
                         f"benchmarks/scoreboard.py --only {args.row} until it collects some")
    folder = work / slug(s.name) / f"quick-{slug(row.name)}"
    shutil.rmtree(folder, ignore_errors=True)
    engine = runner.engine(folder, row)
    t0 = time.time()
    res = engine.evolve(row.evolve.method, traces=traces, tasks=train,
                        gate_tasks=runner.tasks(args.dev), analyst=runner.analyst_for(row),
                        rule=row.evolve.rule or DEFAULT_RULE, seed=plan.seed, concurrency=1,
                        max_agent_runs=row.evolve.max_agent_runs, solver=row.solver,
                        on_progress=lambda phase, d, n: print(f"  evolve {phase}: {d}/{n}",
                                                              flush=True),
                        **dict(row.evolve.options))
    seconds = time.time() - t0
    empty = runner.engine(work / slug(s.name) / "quick-empty", row)
    base = runner.evaluate(empty, row, args.test, "empty library")
    version = f"candidate:{res.candidate}" if res.candidate else None
    evolved = runner.engine(folder, row, version=version)
    got = runner.evaluate(evolved, row, args.test, "evolved library")
    a = {r.task_id: r.score for r in base.scored}
    b = {r.task_id: r.score for r in got.scored}
    both = sorted(set(a) & set(b))
    diff = paired_bootstrap([a[t] for t in both], [b[t] for t in both])
    tokens = (sum(r.tokens for r in got.scored) / max(1, len(got.scored)),
              sum(r.tokens for r in base.scored) / max(1, len(base.scored)))
    out: dict[str, Any] = {
        "row": args.row, "train_runs": len(traces), "dev": args.dev, "test": args.test,
        "evolve_seconds": round(seconds, 1), "accepted": bool(res.version),
        "decision": res.decision.to_dict() if res.decision else None,
        "costs": dict(res.patch.costs), "changed": sorted(res.patch.changes),
        "test_empty": base.accuracy, "test_evolved": got.accuracy, "tasks": len(both),
        "difference": [round(diff.difference, 3), round(diff.low, 3), round(diff.high, 3)],
        "better": sum(b[t] > a[t] for t in both), "worse": sum(b[t] < a[t] for t in both),
        "tokens_ratio": round(tokens[0] / tokens[1], 2) if tokens[1] else None,
        "scored_as": "the accepted version" if res.version else "the rejected candidate",
    }
    text = json.dumps(out, indent=2, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
