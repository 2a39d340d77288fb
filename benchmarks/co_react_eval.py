"""Co-ReAct and Elastic Horizon on the scoreboard's tasks: a section of docs/results.md.

    .venv/bin/python benchmarks/co_react_eval.py                  # run what is missing, write
    .venv/bin/python benchmarks/co_react_eval.py --sets gsm8k -j 8
    .venv/bin/python benchmarks/co_react_eval.py --render         # from saved results only

Per set, on its test slice: the agent (ReAct, empty library), Co-ReAct, Co-ReAct + verify:
accuracy with the paired 95% interval against ReAct, tool calls, model calls and tokens per
task (rubrics and checks included), checks failed and retried. Then Elastic Horizon: the step
budget learnt from the agent's runs on the set's *train* slice (``horizon.splits=train``: the
test runs never learn from test labels), on the same test tasks: tokens per task saved at
(paired) accuracy.

GSM8K and BFCL rows are the scoreboard's own (benchmarks/scoreboard.yaml), run through its
``Runner`` and reused while their saved result is fresh. ``halueval-search`` (HaluEval questions
without their passage) is defined here: its ``search`` tool reads one shared corpus of every
item's knowledge passage (built on first use, as ``whetstone corpus add --tasks halueval``
does). Results of the rows defined here go to benchmarks/results/co_react/; the section's table
to benchmarks/results/co_react.json (``{"markdown": ...}``), which the scoreboard renders.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scoreboard_harness.runner import (
    Plan,
    RowOutcome,
    RowPlan,
    Runner,
    SetPlan,
    load_outcome,
    load_plan,
    run_plan,
)

from whetstone.engine.evaluation.compare import compare

SEARCH_SET = SetPlan(name="halueval-search", train="halueval-search@train:0:40",
                     dev="halueval-search@dev:0:40", test="halueval-search@test:0:30",
                     title="HaluEval QA, questions only: evidence through the search tool")
CORPUS = "halueval"
CONFIGS: tuple[tuple[str, tuple[tuple[str, Mapping[str, Any]], ...]], ...] = (
    ("agent", ()),
    ("co-react", (("co_react", {}),)),
    ("co-react-verify", (("co_react", {"rubric_verify": True}),)),
)
HORIZON = (("horizon", {"splits": "train"}),)


def rows_for(plan: Plan, set_name: str) -> list[RowPlan]:
    """The set's ReAct / Co-ReAct / Co-ReAct+verify rows (the plan's own when it has them)
    and its horizon row."""
    own = {r.name: r for r in plan.rows if r.set == set_name}
    tools = ("search",) if set_name == SEARCH_SET.name else ("calculator", "python")
    rows = [own.get(name) or RowPlan(set=set_name, name=name, methods=methods, tools=tools)
            for name, methods in CONFIGS]
    rows.append(RowPlan(set=set_name, name="horizon", methods=HORIZON, tools=tools,
                        note="budget from the agent's train runs"))
    return rows


class SectionRunner(Runner):
    """The scoreboard's runner, plus: ``search`` reads the shared corpus, and a horizon row's
    library starts with the set's train traces."""

    corpus_root: Path = Path()
    collect_tools: tuple[str, ...] = ("calculator", "python")

    def engine(self, library: Path, row: RowPlan | None = None, version: str | None = None
               ) -> Any:
        from whetstone.engine.api import Engine
        from whetstone.tools.builtin import builtin_tools

        names = row.tools if row else self.collect_tools
        tools = builtin_tools(tuple(n for n in names if n != "search"))
        if "search" in names:
            from whetstone.tools.search import make_search_tool

            tools.append(make_search_tool(self.corpus()))
        return Engine(self.backend, library=library, version=version,
                      methods=row.methods if row else (), tools=tools, checkpointing=False,
                      registry=self.registry, create=True)

    def corpus(self) -> Any:
        if "_corpus" not in self.__dict__:
            self.__dict__["_corpus"] = open_corpus(self.corpus_root)
        return self.__dict__["_corpus"]

    def train_traces(self, s: SetPlan) -> list[Any]:
        self.collect_tools = ("search",) if s.name == SEARCH_SET.name else ("calculator",
                                                                             "python")
        return super().train_traces(s)

    def run(self, row: RowPlan) -> RowOutcome:
        if row.name != "horizon":
            return super().run(row)
        import time

        from scoreboard_harness.runner import row_key, slug

        start = time.time()
        s = self.plan.set(row.set)
        traces = self.train_traces(s)
        folder = self.work_dir / slug(row.set) / slug(row.name)
        shutil.rmtree(folder, ignore_errors=True)
        engine = self.engine(folder, row)
        engine.traces.append_many(traces)  # what the horizon learns from: train runs only
        result = self.evaluate(engine, row, s.test, row.id)
        return RowOutcome(row=row.id, key=row_key(self.plan, row), result=result,
                          evolve={"train_traces": len(traces)},
                          seconds=round(time.time() - start, 1))


def open_corpus(root: Path) -> Any:
    """The shared HaluEval corpus, built from every item's passage if it is not there yet."""
    from whetstone.engine.evaluation.benchmarks import load_benchmark
    from whetstone.engine.evaluation.tasks import evidence_documents
    from whetstone.library_store.corpus import Corpus
    from whetstone.library_store.embeddings import query_embedder

    corpus = Corpus.of_library(root, CORPUS, query_embedder(threads=1))
    if not corpus.exists() or not corpus.stats().get("chunks"):
        print(f"building the {CORPUS} corpus in {root} (every HaluEval passage) …", flush=True)
        corpus.add(evidence_documents(load_benchmark("halueval").tasks))
    return corpus


# -- the table -------------------------------------------------------------------------------


def trace_stats(work_dir: Path, row: RowPlan, outcome: RowOutcome) -> dict[str, float] | None:
    """Per-task means read from the row's stored traces (None when they are not on disk)."""
    from scoreboard_harness.runner import slug

    from whetstone.library_store.traces import TraceStore

    store = TraceStore(work_dir / slug(row.set) / slug(row.name) / "traces")
    by_id = {t.id: t for t in store.query()} if store.root.exists() else {}
    traces = [by_id[r.trace_id] for r in outcome.result.results if r.trace_id in by_id]
    if not traces or len(traces) < outcome.result.n:
        return None
    n = len(traces)

    def mean(values: Sequence[float]) -> float:
        return sum(values) / n

    co = [t.meta.get("co_react") or {} for t in traces]
    checks = [c.get("checks") or {} for c in co]
    hz = [t.meta.get("horizon") or {} for t in traces]
    return {
        "tool_calls": mean([sum(1 for s in t.steps if s.kind == "act" and not (
            isinstance(s.output, Mapping) and s.output.get("answer_call"))) for t in traces]),
        "model_calls": mean([sum(1 for s in t.steps if s.kind == "think") for t in traces]),
        "rubric_tokens": mean([c.get("rubric_tokens", 0) for c in co]),
        "rubrics_dropped": sum(c.get("dropped", 0) for c in co) / max(
            1, sum(c.get("rubrics", 0) for c in co)),
        "checks_failed": sum(c.get("failed", 0) for c in checks) / max(
            1, sum(c.get("checked", 0) for c in checks)),
        "retries": mean([c.get("retried", 0) for c in checks]),
        "horizon_steps": mean([h.get("max_steps") or 0 for h in hz]),
        "horizon_cut": sum(1 for t in traces if t.outcome == "horizon") / n,
    }


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def render_set(set_title: str, rows: list[RowPlan], outcomes: Mapping[str, RowOutcome],
               stats: Mapping[str, dict[str, float] | None]) -> list[str]:
    base = outcomes.get(f"{rows[0].set}/agent")
    lines = [f"**{set_title}** (`{rows[0].set}`)", "",
             ("| row | accuracy (n) | Δ vs ReAct [95% CI] | McNemar p | tool calls/task | "
             "model calls/task | tokens/task | rubric tokens/task | checks failed | "
             "retries/task | horizon (cut off) |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        o = outcomes.get(r.id)
        if o is None:
            lines.append(f"| {r.name} | not run |" + " |" * 9)
            continue
        res, st = o.result, stats.get(r.id)
        delta, p = "–", "–"
        if base is not None and r.name != "agent":
            c = compare(base.result, res)
            delta = f"{c.difference:+.3f} [{c.ci_low:+.3f}, {c.ci_high:+.3f}]"
            p = "n/a" if c.p_value is None else f"{c.p_value:.3g}"
            tokens = f"{res.mean_tokens:.0f} ({res.mean_tokens - base.result.mean_tokens:+.0f})"
        else:
            tokens = f"{res.mean_tokens:.0f}"
        co = any(m == "co_react" for m, _ in r.methods)
        verify = any(m == "co_react" and o_.get("rubric_verify") for m, o_ in r.methods)
        horizon = any(m == "horizon" for m, _ in r.methods)
        lines.append(
            f"| {r.name} | {res.accuracy:.3f} ({res.tally()}) | {delta} | {p} | "
            f"{_fmt(st and st['tool_calls'])} | {_fmt(st and st['model_calls'])} | {tokens} | "
            f"{_fmt(st and st['rubric_tokens'], '.0f') if co else '–'} | "
            f"{_fmt(st and st['checks_failed'], '.0%') if verify else '–'} | "
            f"{_fmt(st and st['retries']) if verify else '–'} | "
            + (f"{_fmt(st and st['horizon_steps'], '.1f')} steps "
               f"({_fmt(st and st['horizon_cut'], '.0%')}) |" if horizon else "– |"))
    return lines + [""]


EXPLAIN = (
    "ReAct is the agent with an empty library; Co-ReAct writes a weighted rubric before each "
    "decision (generator: the agent's own model); + verify checks each proposed step against "
    "it and retries a failing one once. Horizon: the step budget is the p90 of successful "
    "lengths of the agent's train runs (min 2, max 16; ReAct has 8). Δ: paired difference on "
    "the same test tasks with its 95% bootstrap interval; tokens/task: every model call of a "
    "task (rubrics and checks included), with the difference to ReAct; checks failed: share of "
    "checked steps below 0.6.")


def limit_sets(plan: Plan, sets: list[str], n: int) -> tuple[list[str], list[SetPlan]]:
    """Each scoreboard set cut to the first ``n`` tasks of its test slice, under a name of its
    own so that its rows (the agent's too) are run and saved here, never mixed with the
    scoreboard's full-slice rows."""
    names, limited = [], []
    for name in sets:
        if name == SEARCH_SET.name:
            names.append(name)
            continue
        s = plan.set(name)
        family, _, rest = s.test.partition("@")
        split = rest.split(":")[0]
        new = dataclasses.replace(s, name=f"{name}-first{n}", test=f"{family}@{split}:0:{n}",
                                  title=f"{s.title or name}, first {n} test tasks")
        names.append(new.name)
        limited.append(new)
    return names, limited


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--plan", default=str(REPO / "benchmarks" / "scoreboard.yaml"))
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--work-dir", default=str(Path.home() / ".whetstone" / "scoreboard"))
    ap.add_argument("--sets", default="halueval-search,gsm8k,bfcl-simple")
    ap.add_argument("--rows", default="", help="only these rows (names), e.g. agent,horizon")
    ap.add_argument("--rerun", action="store_true")
    ap.add_argument("--render", action="store_true", help="only rebuild the table")
    ap.add_argument("-j", "--concurrency", type=int, default=None)
    ap.add_argument("--test-limit", type=int, default=None, metavar="N",
                    help="only the first N tasks of each scoreboard set's test slice (a set of "
                         "its own, SET-firstN, with every row saved here, not reused)")
    args = ap.parse_args()

    base_plan = load_plan(args.plan)
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    extra = [SEARCH_SET]
    if args.test_limit:
        sets, limited = limit_sets(base_plan, sets, args.test_limit)
        extra += limited
    plan = dataclasses.replace(base_plan, sets=(*base_plan.sets, *extra))
    rows = {s: rows_for(plan, s) for s in sets}
    plan = dataclasses.replace(plan, rows=tuple(
        r for s in sets for r in rows[s] if r not in plan.rows) + plan.rows)
    results, own = Path(args.results), Path(args.results) / "co_react"
    work = Path(args.work_dir)

    def where(row: RowPlan) -> Path:
        return results if row in base_plan.rows else own

    if not args.render:
        from whetstone.engine.backends.registry import get_backend

        backend = get_backend(plan.model)
        j = args.concurrency or (plan.concurrency if isinstance(plan.concurrency, int)
                                 else max(1, backend.capabilities.max_concurrency))
        runner = SectionRunner(plan, backend, backend, work, concurrency=j,
                               on_progress=lambda w, d, n: print(f"  {w}: {d}/{n}", flush=True)
                               if d == n or d % 10 == 0 else None)
        runner.corpus_root = work / "corpus"
        wanted = {r.strip() for r in args.rows.split(",") if r.strip()}
        for s in sets:
            for r in rows[s]:
                if not wanted or r.name in wanted:
                    run_plan(runner, where(r), only=[r.id], rerun=args.rerun)
    outcomes = {r.id: o for s in sets for r in rows[s]
                if (o := load_outcome(where(r), r)) is not None}
    stats = {r.id: trace_stats(work, r, outcomes[r.id]) for s in sets for r in rows[s]
             if r.id in outcomes}
    lines = [EXPLAIN, ""]
    for s in sets:
        lines += render_set(plan.set(s).title or s, rows[s], outcomes, stats)
    out = results / "co_react.json"
    out.write_text(json.dumps({"markdown": "\n".join(lines).rstrip(), "stats": stats},
                              indent=1), encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
