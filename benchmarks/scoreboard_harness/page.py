"""The scoreboard's page (docs/results.md): a table per task set, every row paired with the
set's baseline on the same test tasks, pools of several sets' test slices, and the sections
other benchmarks write. Rendering only: ``scoreboard_harness.runner`` runs the rows."""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scoreboard_harness.runner import (
    Plan,
    PoolPlan,
    RowOutcome,
    RowPlan,
    SectionPlan,
    SetPlan,
)
from whetstone.engine.evaluation.compare import compare
from whetstone.engine.evaluation.gate import DEFAULT_RULE, decide_again, summary
from whetstone.engine.evaluation.results import EvalResult


def _cost(evolve: Mapping[str, Any] | None) -> str:
    if not evolve:
        return "–"
    costs = evolve.get("costs") or {}
    calls = costs.get("analyst_calls")
    runs = evolve.get("traces")
    parts = [f"{calls} analyst calls" if calls is not None else None,
             f"{runs} train runs" if runs is not None else None,
             f"{evolve.get('seconds', 0) / 60:.0f} min"]
    return ", ".join(p for p in parts if p)


def _gate(evolve: Mapping[str, Any] | None, default_dev: str = "") -> str:
    """The gate column: the verdict with its figures (difference and interval, token ratio,
    what the dev set could have missed). A decision saved before the gate weighed cost and
    power is shown as made, then decided again under today's default from its figures."""
    if not evolve:
        return "–"
    d = evolve.get("decision")
    if not d:
        return evolve.get("note") or "no gate"
    verdict = "accepted" if evolve.get("accepted") else "rejected"
    # a row gated on its own dev slice says which (the set's header names the usual one)
    where = f" on `{d['task_set']}`" if d.get("task_set") != default_dev else ""
    if "verdict" in d:
        return f"{verdict}{where}: {summary(d)}"
    old = (f"{verdict} ({d.get('candidate_score', 0):.2f} vs {d.get('current_score', 0):.2f})"
           f"{where} under the old rule")
    again, _ = decide_again(d)
    now = {True: "accepted", False: "rejected",
           None: "undecided (its dev tokens were not saved: rerun its gate)"}[again]
    return f"{old}; now {now}: {summary(d)}"


_HEADER = ("| row | solver | methods | accuracy (n) | Δ vs baseline [95% CI] | McNemar p "
           "| tokens/task | evolve cost | gate (dev) |")
_EXPLAIN = ("Evolved on `train`, gated on `dev`, reported on `test` (never tuned on it). "
            "Δ: paired difference with the set's baseline on the same test tasks, 95% paired "
            "bootstrap interval; McNemar's exact p on the discordant pairs; tokens/task: "
            "prompt + completion tokens over every model call of a task; evolve cost: the "
            "analyst's calls, the agent's train runs it learnt from, and the minutes from those "
            "runs to the gate's decision (running them is not counted: every row on the same "
            "train slice shares them); gate (dev): the decision with its difference and "
            "interval on the dev tasks, the candidate's tokens per task over the current's and "
            "the largest regression the dev set could have missed (docs/gate.md). A decision "
            "made before the default rule weighed cost and power is shown as made, then as "
            f"`{DEFAULT_RULE}` decides it now from its saved figures; the row still reports "
            "the library accepted then.")


def _calls(counted: Mapping[str, Any] | None) -> str:
    """A row's use of the MCP servers' tools on test: share of tasks, and calls per task."""
    if not counted:
        return "–"
    return f"{counted['rate']:.0%} ({counted['per_task']:.1f}/task)"


DEFAULT_TOOLS = ("calculator", "python")


def evolve_command(plan: Plan, s: SetPlan, row: RowPlan) -> str:
    """The `whetstone evolve` command that makes a row's library as the row does: the same
    evolver and options, the train slice's runs, the gate on the dev slice, the same model,
    analyst, tools and MCP servers. A row learning from a team's log imports it first."""
    e = row.evolve
    assert e is not None
    train, dev = e.train or s.train, e.dev or s.dev
    args = ["whetstone", "evolve", e.method, "--model", row.model or plan.model]
    if not e.from_log:
        args += ["--tasks", train]
    args += ["--gate-tasks", dev]
    analyst = e.analyst or plan.analyst
    if analyst and analyst != (row.model or plan.model):
        args += ["--analyst", analyst]
    if e.rule and e.rule != DEFAULT_RULE:
        args += ["--gate-rule", e.rule]
    if row.solver != "agent":
        args += ["--solver", row.solver]
    if tuple(row.tools) != DEFAULT_TOOLS:
        args += ["--tools", ",".join(row.tools)]
    if row.mcp:
        args += ["--mcp-config", row.mcp]
    for key, value in e.options.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            args += [flag, str(value)]
    command = shlex.join(args)
    if e.from_log:
        command = (f"whetstone traces import team-log.jsonl --format openai --scorer "
                   f"{shlex.quote(_scorer_of(train))} && {command}")
    return command


def _scorer_of(spec: str) -> str:
    from whetstone.engine.evaluation.benchmarks import load_tasks  # lazy: reads the set

    return load_tasks(spec).scorer


def render_set(plan: Plan, s: SetPlan, outcomes: Mapping[str, RowOutcome]) -> str:
    rows = [r for r in plan.rows if r.set == s.name]
    base = outcomes.get(f"{s.name}/{s.baseline}")
    # A set whose rows use MCP servers gets a column of how often their tools were called.
    mcp = any(r.mcp for r in rows)
    header = _HEADER.replace(" | tokens/task |", " | MCP tool calls (tasks) | tokens/task |") \
        if mcp else _HEADER
    lines = [f"### {s.title or s.name}", "",
             f"train `{s.train}` · dev `{s.dev}` · test `{s.test}` · baseline: `{s.baseline}`",
             "", header, "|---" * header.count(" | ") + "|---|"]
    stale: set[int] = set()
    for r in rows:
        o = outcomes.get(r.id)
        methods = ", ".join(m for m, _ in r.methods) or "–"
        if o is None:
            lines.append(f"| {r.name} | {r.solver} | {methods} | not run |"
                         + " |" * (header.count(" | ") - 3))
            continue
        calls = o.tool_calls or {}
        used = f" {_calls(calls.get('result'))} |" if mcp else ""
        res = o.result
        before = [i for i, (ts, _, _, solver, method) in enumerate(plan.code_changes)
                  if res.started < ts and solver in (None, r.solver) and method in (
                      None, r.evolve.method if r.evolve is not None else "")]
        stale.update(before)
        name = r.name + "".join(" †" + str(i + 1) for i in before)
        delta, p = "–", "–"
        if base is not None and r.name != s.baseline:
            c = compare(base.result, res)
            delta = f"{c.difference:+.3f} [{c.ci_low:+.3f}, {c.ci_high:+.3f}]"
            p = "n/a" if c.p_value is None else f"{c.p_value:.3g}"
        gate = _gate(o.evolve, s.dev) if r.library_of is None else f"library of `{r.library_of}`"
        lines.append(f"| {name} | {r.solver} | {methods} | {res.accuracy:.3f} "
                     f"({res.tally()}) | {delta} | {p} |{used} "
                     f"{res.mean_tokens:.0f} | "
                     f"{_cost(o.evolve)} | {gate} |")
        if o.candidate_result is not None and base is not None:
            c = compare(base.result, o.candidate_result)
            cr = o.candidate_result
            lines.append(f"| {r.name} (rejected candidate) | {r.solver} | {methods} | "
                         f"{cr.accuracy:.3f} ({cr.tally()}) | "
                         f"{c.difference:+.3f} [{c.ci_low:+.3f}, {c.ci_high:+.3f}] | "
                         f"{'n/a' if c.p_value is None else f'{c.p_value:.3g}'} |"
                         + (f" {_calls(calls.get('candidate'))} |" if mcp else "")
                         + f" {cr.mean_tokens:.0f} | | not committed |")
    notes = [f"- **{r.name}**: {r.note}" for r in rows if r.note]
    evolved = [r for r in rows if r.evolve is not None]
    if evolved:
        notes += ["", ("Each evolved row's library, made by hand (the row's evolve, as a "
                       "command; run it from the repository's root):"), ""]
        notes += [f"- **{r.name}**: `{evolve_command(plan, s, r)}`" for r in evolved]
    notes += [f"- †{i + 1}: run before {plan.code_changes[i][1]}: {plan.code_changes[i][2]}"
              for i in sorted(stale)]
    return "\n".join(lines + ([""] + notes if notes else []))


def _pooled(results: list[EvalResult]) -> EvalResult:
    return dataclasses.replace(results[0], task_set=" + ".join(r.task_set for r in results),
                               results=tuple(t for r in results for t in r.results))


def render_pool(plan: Plan, pool: PoolPlan, outcomes: Mapping[str, RowOutcome]) -> str:
    """One table of the rows over the pool's sets' test tasks together."""
    tests = " + ".join(f"`{plan.set(s).test}`" for s in pool.sets)
    lines = [f"### {pool.title or pool.name}", "",
             f"test {tests} · baseline: `{pool.rows[0]}` · every row as run in those sets", "",
             "| row | accuracy (n) | Δ vs baseline [95% CI] | McNemar p | tokens/task |",
             "|---|---|---|---|---|"]
    base: EvalResult | None = None
    for name in pool.rows:
        got = [outcomes.get(f"{s}/{name}") for s in pool.sets]
        if any(o is None for o in got):
            lines.append(f"| {name} | not run in every set | | | |")
            continue
        res = _pooled([o.result for o in got if o is not None])
        delta, p = "–", "–"
        if base is None:
            base = res if name == pool.rows[0] else None
        else:
            c = compare(base, res)
            delta = f"{c.difference:+.3f} [{c.ci_low:+.3f}, {c.ci_high:+.3f}]"
            p = "n/a" if c.p_value is None else f"{c.p_value:.3g}"
        lines.append(f"| {name} | {res.accuracy:.3f} ({res.tally()}) | {delta} | {p} | "
                     f"{res.mean_tokens:.0f} |")
    return "\n".join(lines)


def render_section(sec: SectionPlan, repo: Path) -> str:
    path = repo / sec.result
    head = [f"### {sec.title}", "", f"`{sec.command}`", ""]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        body = str(data["markdown"]).strip()
    except (OSError, ValueError, KeyError):
        body = f"(not run yet: `{sec.command}` writes `{sec.result}`)"
    return "\n".join(head + [body])


def render(plan: Plan, outcomes: Mapping[str, RowOutcome], repo: Path, *, command: str,
           preamble: str = "") -> str:
    """The whole results page."""
    parts = ["# Results", "",
             "Generated by one command; do not edit by hand:", "", "```bash", command, "```", ""]
    if preamble:
        parts += [preamble.strip(), ""]
    parts += [(f"Model `{plan.model}`, analyst `{plan.analyst or plan.model}`, seed "
              f"{plan.seed}. {_EXPLAIN}"), ""]
    for s in plan.sets:
        parts += [render_set(plan, s, outcomes), ""]
    for pool in plan.pools:
        parts += [render_pool(plan, pool, outcomes), ""]
    for sec in plan.sections:
        parts += [render_section(sec, repo), ""]
    return "\n".join(parts).rstrip() + "\n"


__all__ = ["render", "render_pool", "render_section", "render_set"]
