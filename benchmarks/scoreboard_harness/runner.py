"""The scoreboard: every method on the same tasks, one table in ``docs/results.md``.

A plan (``benchmarks/scoreboard.yaml``) names task sets with their ``train`` / ``dev`` /
``test`` slices, the rows to score on each set, and extra sections (tables of their own, e.g.
a hallucination detector's precision and recall). For each row::

    [evolve on train -> gate on dev -> commit or keep a candidate]  ->  evaluate on test

Every row of a set is paired task by task with the set's baseline row (the agent with an empty
library): the difference with its paired 95% bootstrap interval and McNemar's p. Each row's
result is saved under ``benchmarks/results/`` with a key of everything it depends on (plan
entry, slices, model, seed); a saved result whose key still matches is reused, so adding one
row reruns only that row, and ``--render`` rebuilds the page from the saved results alone.
``@test`` is only ever evaluated: nothing is evolved, gated or tuned on it.

    python benchmarks/scoreboard.py                      # run what is missing, then render
    python benchmarks/scoreboard.py --only gsm8k/nlpg --rerun
    python benchmarks/scoreboard.py --render
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

from whetstone.engine.errors import ConfigError
from whetstone.engine.evaluation.gate_rules import DEFAULT_RULE
from whetstone.engine.evaluation.results import EvalResult
from whetstone.engine.evaluation.runner import Solver, evaluate
from whetstone.engine.evaluation.tasks import TaskSet
from whetstone.engine.types import Trace

Progress = Callable[[str, int, int], None]  # (what, done, total)
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class EvolvePlan:
    """How a row's library is evolved: the evolver, its options, and who analyses."""

    method: str
    options: Mapping[str, Any] = field(default_factory=dict)
    analyst: str | None = None  # None: the plan's analyst
    rule: str | None = None  # None: the gate's default (DEFAULT_RULE)
    max_agent_runs: int | None = None
    train: str | None = None  # None: the set's slices; a row may evolve on more train runs
    dev: str | None = None    # or gate on a larger dev slice (the test slice is the set's)
    # Learn from the train runs as a team's logger wrote them (an OpenAI chat-completion
    # log, read back by `whetstone traces import`: team_log.py), not from native traces.
    from_log: bool = False


@dataclass(frozen=True)
class RowPlan:
    """One row: a solver and runtime methods over a library (empty, or evolved first)."""

    set: str
    name: str
    solver: str = "agent"
    methods: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    evolve: EvolvePlan | None = None
    tools: tuple[str, ...] = ("calculator", "python")
    candidate_on_test: bool = False  # also score a rejected candidate on test (marked)
    note: str = ""
    # Score the library another row evolved ("set/row") instead of an empty one: the same
    # library on another set's test slice (more held-out tasks), without evolving it again.
    library_of: str | None = None
    # MCP servers (an mcpServers file, relative to the repository) whose tools the row's
    # agent gets beside ``tools``; its outcome then counts how often runs called them.
    mcp: str | None = None
    model: str | None = None  # the row's agent on another model than the plan's (a spec)

    @property
    def id(self) -> str:
        return f"{self.set}/{self.name}"


@dataclass(frozen=True)
class SetPlan:
    """A task family: its three slices and the row every other row is paired with."""

    name: str
    train: str
    dev: str
    test: str
    baseline: str = "agent"
    title: str = ""


@dataclass(frozen=True)
class SectionPlan:
    """A table of its own, made by ``command``, which writes ``result``: a JSON object with a
    ``markdown`` field (and anything else it wants to keep)."""

    name: str
    title: str
    command: str
    result: str


@dataclass(frozen=True)
class PoolPlan:
    """A table over several sets' test slices together (rows of the same name in each),
    paired with the first set's baseline on the union of their tasks."""

    name: str
    sets: tuple[str, ...]
    rows: tuple[str, ...]
    title: str = ""


@dataclass(frozen=True)
class Plan:
    model: str
    analyst: str | None
    seed: int
    concurrency: int | str
    sets: tuple[SetPlan, ...]
    rows: tuple[RowPlan, ...]
    sections: tuple[SectionPlan, ...] = ()
    # Code changes rows depend on but no row key names (the agent loop): (UTC time, the ISO
    # text, what changed, the solver and the evolver it touches or None): earlier rows are marked
    code_changes: tuple[tuple[float, str, str, str | None, str | None], ...] = ()
    pools: tuple[PoolPlan, ...] = ()

    def row(self, row_id: str) -> RowPlan:
        for r in self.rows:
            if r.id == row_id:
                return r
        raise ConfigError(f"no row {row_id!r} in the plan", hint="name a row as set/row")

    def set(self, name: str) -> SetPlan:
        for s in self.sets:
            if s.name == name:
                return s
        raise ConfigError(f"no task set {name!r} in the plan",
                          hint="sets: " + ", ".join(s.name for s in self.sets))


def _only(d: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}",
                          hint="allowed: " + ", ".join(sorted(allowed)))


def _methods(raw: Any, where: str) -> tuple[tuple[str, Mapping[str, Any]], ...]:
    out = []
    for m in raw or ():
        if isinstance(m, str):
            out.append((m, {}))
        elif isinstance(m, Mapping) and len(m) == 1:
            name, opts = next(iter(m.items()))
            out.append((str(name), dict(opts or {})))
        else:
            raise ConfigError(f"{where}: a method is a name or {{name: {{option: value}}}}, "
                              f"got {m!r}")
    return tuple(out)


def parse_plan(data: Mapping[str, Any]) -> Plan:
    """A ``Plan`` from the YAML's data, with errors that name the bad entry."""
    _only(data, {"model", "analyst", "seed", "concurrency", "sets", "rows", "sections",
                 "code_changes", "pools"}, "plan")
    sets = []
    for name, s in (data.get("sets") or {}).items():
        _only(s, {"train", "dev", "test", "baseline", "title"}, f"set {name}")
        missing = [k for k in ("train", "dev", "test") if k not in s]
        if missing:
            raise ConfigError(f"set {name}: needs {', '.join(missing)}",
                              hint="give each set train, dev and test slices, e.g. "
                                   "gsm8k@test:0:120")
        sets.append(SetPlan(name=name, **s))
    known_sets = {s.name for s in sets}
    rows = []
    for i, r in enumerate(data.get("rows") or ()):
        where = f"row {i + 1} ({r.get('set')}/{r.get('name')})"
        _only(r, {"set", "name", "solver", "methods", "evolve", "tools", "candidate_on_test",
                  "note", "library_of", "mcp", "model"}, where)
        if r.get("set") not in known_sets or not r.get("name"):
            raise ConfigError(f"{where}: needs a known `set` and a `name`",
                              hint="sets: " + ", ".join(sorted(known_sets)))
        evolve = None
        if r.get("evolve"):
            e = dict(r["evolve"])
            _only(e, {"method", "options", "analyst", "rule", "max_agent_runs", "train", "dev",
                      "from_log"}, where + " evolve")
            evolve = EvolvePlan(method=e["method"], options=dict(e.get("options") or {}),
                                analyst=e.get("analyst"), rule=e.get("rule"),
                                max_agent_runs=e.get("max_agent_runs"), train=e.get("train"),
                                dev=e.get("dev"), from_log=bool(e.get("from_log", False)))
        if r.get("library_of") and r.get("evolve"):
            raise ConfigError(f"{where}: give `evolve` or `library_of`, not both",
                              hint="library_of scores the library another row evolved")
        kw = {k: r[k] for k in ("solver", "candidate_on_test", "note", "library_of", "mcp",
                                "model") if k in r}
        if "tools" in r:
            kw["tools"] = tuple(r["tools"] or ())
        rows.append(RowPlan(set=r["set"], name=str(r["name"]), evolve=evolve,
                            methods=_methods(r.get("methods"), where), **kw))
    ids = [r.id for r in rows]
    if len(set(ids)) != len(ids):
        raise ConfigError("two rows share a set/name", hint="give every row its own name")
    evolved = {r.id for r in rows if r.evolve is not None}
    for r in rows:
        if r.library_of is not None and r.library_of not in evolved:
            raise ConfigError(f"row {r.id}: library_of names {r.library_of!r}, which is not an "
                              "evolved row of the plan", hint="name one as set/row: "
                              + ", ".join(sorted(evolved)))
    for s in sets:
        if s.baseline not in {r.name for r in rows if r.set == s.name}:
            raise ConfigError(f"set {s.name}: its baseline row {s.baseline!r} is missing",
                              hint="add a row with that name (the agent, empty library)")
    sections = []
    for name, sec in (data.get("sections") or {}).items():
        _only(sec, {"title", "command", "result"}, f"section {name}")
        sections.append(SectionPlan(name=name, **sec))
    pools = []
    for name, pool in (data.get("pools") or {}).items():
        _only(pool, {"title", "sets", "rows"}, f"pool {name}")
        p = PoolPlan(name=name, sets=tuple(pool.get("sets") or ()),
                     rows=tuple(pool.get("rows") or ()), title=pool.get("title", ""))
        missing = [f"{s}/{r}" for s in p.sets for r in p.rows if f"{s}/{r}" not in ids]
        if len(p.sets) < 2 or not p.rows or missing:
            raise ConfigError(f"pool {name}: needs two or more sets and rows each of them has"
                              + (f" (missing: {', '.join(missing)})" if missing else ""),
                              hint="sets: [a, b], rows: [agent, ...]; the first row is the "
                                   "baseline")
        pools.append(p)
    return Plan(model=data.get("model", "embedded"), analyst=data.get("analyst"),
                seed=int(data.get("seed", 0)), concurrency=data.get("concurrency", "auto"),
                sets=tuple(sets), rows=tuple(rows), sections=tuple(sections),
                code_changes=_code_changes(data.get("code_changes")), pools=tuple(pools))


def _code_changes(raw: Any) -> tuple[tuple[float, str, str, str | None, str | None], ...]:
    from datetime import datetime

    out = []
    for i, c in enumerate(raw or ()):
        if not isinstance(c, Mapping) or not c.get("at") or not c.get("what"):
            raise ConfigError(f"code_changes entry {i + 1}: needs `at` (ISO UTC time) and `what`")
        try:
            when = datetime.fromisoformat(str(c["at"]))
        except ValueError as exc:
            raise ConfigError(f"code_changes entry {i + 1}: {exc}",
                              hint="write `at` as 2026-12-01T03:05:00Z") from exc
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        solver = c.get("solver")
        if solver not in (None, "agent", "direct"):
            raise ConfigError(f"code_changes entry {i + 1}: solver is agent or direct, "
                              f"got {solver!r}")
        method = c.get("method")  # only rows whose library this evolver made
        if method is not None and not isinstance(method, str):
            raise ConfigError(f"code_changes entry {i + 1}: method is an evolver's name, "
                              f"got {method!r}")
        out.append((when.timestamp(), str(c["at"]), str(c["what"]), solver, method))
    return tuple(sorted(out))


def load_plan(path: Path | str) -> Plan:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the scoreboard plan {path}: {exc}",
                          hint="see benchmarks/scoreboard.yaml for the format") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(f"the scoreboard plan {path} is not a mapping")
    return parse_plan(data)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "row"


def row_key(plan: Plan, row: RowPlan) -> str:
    """Everything a row's result depends on; a saved result with another key is stale."""
    s = plan.set(row.set)
    data = {"row": asdict(row), "test": s.test, "model": plan.model, "seed": plan.seed}
    if data["row"]["evolve"] is not None:  # fields added later hash only when set (old keys hold)
        for k in ("train", "dev"):
            if data["row"]["evolve"][k] is None:
                del data["row"]["evolve"][k]
        if not data["row"]["evolve"]["from_log"]:
            del data["row"]["evolve"]["from_log"]
        # The gate's default hashes as the name it had when these keys were made, so a change
        # of default does not rerun every evolved row: the page decides a row saved under the
        # old rule again from its figures and says so (page._gate).
        if data["row"]["evolve"]["rule"] is None:
            data["row"]["evolve"]["rule"] = "not_worse"
    if data["row"]["library_of"] is None:
        del data["row"]["library_of"]
    else:
        data["library_of_key"] = row_key(plan, plan.row(row.library_of))
    for k in ("mcp", "model"):  # fields added later hash only when set (old keys hold)
        if data["row"][k] is None:
            del data["row"][k]
    if row.mcp is not None:  # the servers' file is part of the row
        data["mcp_file"] = hashlib.sha256((REPO / row.mcp).read_bytes()).hexdigest()
    if row.evolve is not None:
        data.update(train=row.evolve.train or s.train, dev=row.evolve.dev or s.dev,
                    analyst=row.evolve.analyst or plan.analyst)
    blob = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class RowOutcome:
    """A row's saved result: the test evaluation and, for evolved rows, what the evolve did."""

    row: str
    key: str
    result: EvalResult
    evolve: dict[str, Any] | None = None
    candidate_result: EvalResult | None = None
    seconds: float = 0.0
    # Rows with MCP servers: the share of test tasks whose run called a server's tool, and
    # the calls per task (``tool_calls``), for the result and the candidate.
    tool_calls: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"row": self.row, "key": self.key, "result": self.result.to_dict(),
                "evolve": self.evolve, "seconds": self.seconds,
                "candidate_result": self.candidate_result.to_dict()
                if self.candidate_result else None,
                **({"tool_calls": self.tool_calls} if self.tool_calls is not None else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RowOutcome:
        cand = d.get("candidate_result")
        return cls(row=d["row"], key=d["key"], result=EvalResult.from_dict(d["result"]),
                   evolve=d.get("evolve"), seconds=float(d.get("seconds") or 0.0),
                   candidate_result=EvalResult.from_dict(cand) if cand else None,
                   tool_calls=d.get("tool_calls"))


def result_path(results_dir: Path, row: RowPlan) -> Path:
    return Path(results_dir) / slug(row.set) / f"{slug(row.name)}.json"


def load_outcome(results_dir: Path, row: RowPlan) -> RowOutcome | None:
    path = result_path(results_dir, row)
    try:
        return RowOutcome.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError):
        return None


def save_outcome(results_dir: Path, row: RowPlan, outcome: RowOutcome) -> Path:
    path = result_path(results_dir, row)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(outcome.to_dict(), indent=1, ensure_ascii=False, default=str),
                   encoding="utf-8")
    tmp.replace(path)
    return path


# -- running -------------------------------------------------------------------------------


@dataclass
class Runner:
    """Runs rows. ``backend``/``analyst`` are ready backends shared by every row (the model
    loads once); ``work_dir`` holds each row's library and the collected training traces."""

    plan: Plan
    backend: Any
    analyst: Any
    work_dir: Path
    concurrency: int = 1
    registry: Any = None
    on_progress: Progress = lambda what, done, total: None
    _train_traces: dict[str, list[Trace]] = field(default_factory=dict)
    _models: dict[str, Any] = field(default_factory=dict)  # other specs, loaded once each
    _toolsets: dict[str, Any] = field(default_factory=dict)  # MCP servers by their file

    def analyst_for(self, row: RowPlan) -> Any:
        """The row's own analyst (``evolve.analyst``, loaded once per spec), else the plan's."""
        spec = row.evolve.analyst if row.evolve is not None else None
        if not spec or spec == self.plan.analyst:
            return self.analyst
        return self._model(spec)

    def backend_for(self, row: RowPlan | None) -> Any:
        """The model the row's agent runs on: its own ``model``, else the plan's."""
        return self._model(row.model) if row is not None and row.model else self.backend

    def _model(self, spec: str) -> Any:
        if spec == getattr(self.backend, "spec", None):
            return self.backend  # the agent's own model: loaded already
        if spec not in self._models:
            from whetstone.engine.backends.registry import get_backend

            self._models[spec] = get_backend(spec)
        return self._models[spec]

    def engine(self, library: Path, row: RowPlan | None = None, version: str | None = None
               ) -> Any:
        from whetstone.engine.api import Engine

        tools = [*(row.tools if row else ("calculator", "python")),
                 *([self.mcp_tools(row)] if row and row.mcp else [])]
        # create: each row's library is made here, in the work folder (a missing path is
        # otherwise refused as a mistyped --library).
        return Engine(self.backend_for(row), library=library, version=version,
                      methods=row.methods if row else (), tools=tools, create=True,
                      checkpointing=False, registry=self.registry)

    def mcp_tools(self, row: RowPlan) -> Any:
        """The row's MCP servers as one ``ToolSet``: every engine of the row (its training
        runs' too) shares it, so each server starts once per row (``close_tools`` stops
        them)."""
        from whetstone.tools.mcp_config import load_mcp_config
        from whetstone.tools.toolset import ToolSet

        key = str(row.mcp)
        if key not in self._toolsets:
            self._toolsets[key] = ToolSet(load_mcp_config(REPO / key))
        return self._toolsets[key]

    def close_tools(self) -> None:
        for tools in self._toolsets.values():
            tools.close()
        self._toolsets.clear()

    def solver(self, engine: Any, row: RowPlan) -> Solver:
        """``Engine.solver``: the agent loop, or one direct call with the library's guidance."""
        if row.solver not in ("agent", "direct"):
            raise ConfigError(f"row {row.id}: unknown solver {row.solver!r}",
                              hint="solvers: agent, direct")
        return engine.solver(kind=row.solver)

    def tasks(self, spec: str) -> TaskSet:
        from whetstone.engine.evaluation.benchmarks import load_tasks

        return load_tasks(spec)

    def train_traces(self, s: SetPlan, spec: str | None = None) -> list[Trace]:
        """The agent's runs on the train slice (``spec``, default the set's) with an empty
        library, run once per slice and reused by every evolved row that names it (stored in
        ``work_dir/<set>/collect``, or ``collect-<slice>`` for a row's own slice)."""
        spec = spec or s.train
        if spec not in self._train_traces:
            from whetstone.engine.evolution.pipeline import training_traces

            sub = "collect" if spec == s.train else f"collect-{slug(spec)}"
            folder = self.work_dir / slug(s.name) / sub
            # As the set's baseline row runs: the agent with its tools, an empty library.
            base = self.plan.row(f"{s.name}/{s.baseline}")
            engine = self.engine(folder, base)
            tasks = self.tasks(spec)
            stored = [t for t in engine.traces.query() if t.meta.get("task_set") == tasks.name]
            done = {t.meta.get("task_id") for t in stored}
            if len(done & {task.id for task in tasks}) < len(tasks):
                # A run cut short resumes: only the tasks without a trace run (each task's
                # seed comes from its id, so the traces are those one whole run would give).
                missing = TaskSet(tasks.name, tuple(t for t in tasks if t.id not in done))
                self.on_progress(f"{spec} (resumed, {len(tasks) - len(missing)} collected "
                                 "before)", 0, len(missing))
                evaluate(missing, engine.solver(), concurrency=self.concurrency,
                         seed=self.plan.seed, store=engine.traces, model=self.backend.spec,
                         task_set=tasks.name,
                         on_progress=lambda d, n, r: self.on_progress(f"{spec}", d, n))
                stored = [t for t in engine.traces.query()
                          if t.meta.get("task_set") == tasks.name]
            self._train_traces[spec] = training_traces(stored)
        return self._train_traces[spec]

    def evaluate(self, engine: Any, row: RowPlan, spec: str, label: str) -> EvalResult:
        tasks = self.tasks(spec)
        return evaluate(tasks, self.solver(engine, row), concurrency=self.concurrency,
                        seed=self.plan.seed, store=engine.traces,
                        model=self.backend_for(row).spec, label=label, task_set=spec,
                        on_progress=lambda d, n, r: self.on_progress(label, d, n))

    def run(self, row: RowPlan) -> RowOutcome:
        try:
            return self._run(row)
        finally:
            self.close_tools()

    def _run(self, row: RowPlan) -> RowOutcome:
        start = time.time()
        s = self.plan.set(row.set)
        folder = self.work_dir / slug(row.set) / slug(row.name)
        shutil.rmtree(folder, ignore_errors=True)
        evolve_info, candidate = None, None
        if row.evolve is not None:
            evolve_info, candidate = self._evolve(row, s, folder)
        elif row.library_of is not None:
            self._copy_library(row.library_of, folder)
        engine = self.engine(folder, row)
        result = self.evaluate(engine, row, s.test, row.id)
        calls = {"result": tool_calls(engine, result)} if row.mcp else None
        cand_result = None
        if candidate and row.candidate_on_test:
            cand_engine = self.engine(folder, row, version=f"candidate:{candidate}")
            cand_result = self.evaluate(cand_engine, row, s.test, f"{row.id} (candidate)")
            if calls is not None:
                calls["candidate"] = tool_calls(cand_engine, cand_result)
        return RowOutcome(row=row.id, key=row_key(self.plan, row), result=result,
                          evolve=evolve_info, candidate_result=cand_result,
                          seconds=round(time.time() - start, 1), tool_calls=calls)

    def _copy_library(self, row_id: str, folder: Path) -> None:
        src = self.plan.row(row_id)
        source = self.work_dir / slug(src.set) / slug(src.name)
        if not (source / "CURRENT").is_file():
            raise ConfigError(f"the library of {row_id} is not in {source}",
                              hint=f"run that row first: benchmarks/scoreboard.py --only {row_id}")
        # Its gate runs stay behind: this row's trace store holds only its own runs.
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns("traces"))

    def _evolve(self, row: RowPlan, s: SetPlan, folder: Path
                ) -> tuple[dict[str, Any], str | None]:
        assert row.evolve is not None
        train, dev = row.evolve.train or s.train, row.evolve.dev or s.dev
        traces = self.train_traces(s, train)
        engine = self.engine(folder, row)
        t0 = time.time()
        tasks: TaskSet | None = self.tasks(train)
        imported: dict[str, Any] | None = None
        if row.evolve.from_log:
            # A team hands over its log and a labelled dev set, not a task set of its runs.
            traces, imported = self._from_log(traces, folder, self.tasks(train).scorer)
            tasks = None
        res = engine.evolve(
            row.evolve.method, traces=traces, tasks=tasks,
            gate_tasks=self.tasks(dev), analyst=self.analyst_for(row),
            rule=row.evolve.rule or DEFAULT_RULE,
            seed=self.plan.seed, concurrency=self.concurrency,
            max_agent_runs=row.evolve.max_agent_runs, solver=row.solver,
            on_progress=lambda phase, d, n: self.on_progress(f"{row.id} {phase}", d, n),
            **dict(row.evolve.options))
        info = {
            "method": row.evolve.method, "options": dict(row.evolve.options),
            "traces": res.traces, "seconds": round(time.time() - t0, 1),
            "costs": dict(res.patch.costs), "note": res.note,
            "decision": res.decision.to_dict() if res.decision else None,
            "accepted": bool(res.version), "version": res.version.id if res.version else None,
            "candidate": res.candidate, "changed": sorted(res.patch.changes),
            "details": _jsonable(dict(res.patch.details)),
        }
        if imported is not None:
            info["imported"] = imported
        return info, res.candidate

    def _from_log(self, traces: list[Trace], folder: Path, scorer: str
                  ) -> tuple[list[Trace], dict[str, Any]]:
        """The train runs written as a team's OpenAI chat log, imported into the row's
        library with `whetstone traces import`, and read back: what the evolver learns from."""
        from scoreboard_harness.team_log import import_log, write_log

        log = folder / "team-log.jsonl"
        lines = write_log(traces, log)
        report = import_log(log, folder, scorer)
        ids = set(report.get("ids") or ())
        # A fresh reader: the store the row's engine holds was opened before the import.
        got = [t for t in self.engine(folder).traces.query() if t.id in ids]
        return got, {"log_lines": lines, "imported": len(got),
                     "skipped": len(report.get("skipped") or ()),
                     "scorer": report.get("scorer")}


def tool_calls(engine: Any, result: EvalResult) -> dict[str, Any]:
    """How the runs of ``result`` used MCP tools: the share of tasks whose run called one
    (an act step with ``meta.tool.mcp``) and the calls per task."""
    counts = []
    for r in result.results:
        trace = engine.traces.get(r.trace_id) if r.trace_id else None
        steps = trace.steps if trace is not None else ()
        counts.append(sum(1 for st in steps if st.kind == "act"
                          and "mcp" in ((st.meta or {}).get("tool") or {})))
    n = max(1, len(counts))
    return {"rate": sum(c > 0 for c in counts) / n, "per_task": sum(counts) / n,
            "tasks": len(counts)}


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def run_plan(runner: Runner, results_dir: Path, *, only: Sequence[str] = (),
             rerun: bool = False, say: Callable[[str], None] = print) -> dict[str, RowOutcome]:
    """Run every selected row whose saved result is missing or stale (all with ``rerun``);
    returns the outcomes of every row that has one."""
    plan = runner.plan
    outcomes: dict[str, RowOutcome] = {}
    for row in plan.rows:
        chosen = not only or row.id in only or row.set in only
        saved = load_outcome(results_dir, row)
        fresh = saved is not None and saved.key == row_key(plan, row)
        if chosen and (rerun or not fresh):
            say(f"running {row.id}")
            outcome = runner.run(row)
            save_outcome(results_dir, row, outcome)
            res = outcome.result
            failed = f", {res.n_errors} failed (not scored)" if res.n_errors else ""
            say(f"  {row.id}: accuracy {res.accuracy:.3f} on {res.n_scored} scored of {res.n} "
                f"tasks{failed} ({outcome.seconds:.0f} s)")
            outcomes[row.id] = outcome
        elif saved is not None:
            outcomes[row.id] = saved
    return outcomes


def run_sections(plan: Plan, repo: Path, *, only: Sequence[str] = (), rerun: bool = False,
                 say: Callable[[str], None] = print) -> None:
    """Run each selected section's command whose result file is missing (all with
    ``rerun``); a failing command is reported, and the page says the section is missing."""
    for sec in plan.sections:
        if only and sec.name not in only:
            continue
        if (repo / sec.result).exists() and not rerun:
            continue
        say(f"running section {sec.name}: {sec.command}")
        done = subprocess.run(sec.command, shell=True, cwd=repo, check=False)
        if done.returncode != 0:
            say(f"  section {sec.name} failed with exit code {done.returncode}")


__all__ = ["EvolvePlan", "Plan", "PoolPlan", "RowOutcome", "RowPlan", "Runner", "SectionPlan",
           "SetPlan", "load_plan", "parse_plan", "row_key", "run_plan", "run_sections"]
