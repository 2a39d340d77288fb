"""Regenerate docs/results.md: every method on the same tasks (see benchmarks/scoreboard_harness/runner.py).

    .venv/bin/python benchmarks/scoreboard.py                   # run what is missing, render
    .venv/bin/python benchmarks/scoreboard.py --only gsm8k      # one set (or set/row)
    .venv/bin/python benchmarks/scoreboard.py --only gsm8k/nlpg --rerun
    .venv/bin/python benchmarks/scoreboard.py --render          # from saved results only

Rows and sets live in benchmarks/scoreboard.yaml; results in benchmarks/results/ (committed,
so the page can be rebuilt and checked without rerunning anything).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scoreboard_harness.page import render
from scoreboard_harness.runner import Runner, load_plan, run_plan, run_sections

COMMAND = ".venv/bin/python benchmarks/scoreboard.py"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--plan", default=str(REPO / "benchmarks" / "scoreboard.yaml"))
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--out", default=str(REPO / "docs" / "results.md"))
    ap.add_argument("--work-dir", default=str(Path.home() / ".whetstone" / "scoreboard"),
                    help="row libraries and collected training traces (scratch)")
    ap.add_argument("--only", action="append", default=[],
                    help="a set, a set/row or a section name (repeatable)")
    ap.add_argument("--rerun", action="store_true", help="rerun selected rows even if fresh")
    ap.add_argument("--render", action="store_true", help="only rebuild the page")
    ap.add_argument("-j", "--concurrency", type=int, default=None,
                    help="tasks in flight (default: the plan's, 'auto' = what the backend batches)")
    args = ap.parse_args()

    plan = load_plan(args.plan)
    results = Path(args.results)
    if not args.render:
        from whetstone.engine.backends.registry import get_backend

        backend = get_backend(plan.model)
        analyst = backend if not plan.analyst or plan.analyst == plan.model \
            else get_backend(plan.analyst)
        j = args.concurrency or (plan.concurrency if isinstance(plan.concurrency, int)
                                 else max(1, backend.capabilities.max_concurrency))

        def progress(what: str, done: int, total: int) -> None:
            if done == total or done % 10 == 0:
                print(f"  {what}: {done}/{total}", flush=True)

        runner = Runner(plan, backend, analyst, Path(args.work_dir), concurrency=j,
                        on_progress=progress)
        run_plan(runner, results, only=args.only, rerun=args.rerun)
        run_sections(plan, REPO, only=args.only, rerun=args.rerun)
    from scoreboard_harness.runner import load_outcome

    outcomes = {r.id: o for r in plan.rows if (o := load_outcome(results, r)) is not None}
    Path(args.out).write_text(render(plan, outcomes, REPO, command=COMMAND), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
