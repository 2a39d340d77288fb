"""``whetstone evolve workflows``: learn verified call workflows for the host's tools.

Agent Workflow Memory's loop (induce workflows from the runs that worked, abstracting their
values; keep them as memory the agent reuses), with two changes a frozen 0.5B needs: a workflow
reaches the agent as a tool it only has to call (``plugin.py``), and a workflow is kept only
when it answers training tasks it was not induced from. On the training runs and their labels:

    HARVEST   each run's host-tool calls up to the first result that holds its label (the
              run reached the answer through the tools, whatever it then answered): a call
              chain that worked; a run whose answer matched but no result held it was a guess
              and teaches nothing;
    INDUCE    each chain becomes a workflow: the question's values in its calls become slots,
              the question with its slots marked a pattern (``induce.py``);
    EXPLORE   kinds of training question (their wording, values masked) that no kept
              workflow answers go to the analyst, a few questions each, with their labels:
              it writes calls through the host's tools until a result shows the answer
              (``explore.py``); what got there is induced the same way;
    VERIFY    every workflow runs, through the host's tools, on every training task its
              patterns read; it is kept when it answers at least ``min_hits`` of them right
              (by the task's scorer) and ``min_precision`` of those it read.

The patch is ``workflows/<name>.yaml``; the gate then scores the library with the ``workflows``
runtime method on (``runtime_methods``). A workflow's calls never hold a training answer
(``induce`` refuses one that holds its own; ``details['refused_labels']`` counts the others).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ....skills.format import NAME_RE
from ....tools.base import Tool, Toolbox, ToolResult
from ...errors import BackendError, ConfigError
from ...evaluation.scorers import get_scorer
from ...evaluation.tasks import TaskRecord, tasks_from_traces
from ...types import Request, Trace
from ..base import EvolveContext, LibraryPatch, knob, library_texts
from . import PROMPTS
from .explore import (
    Exploration,
    call_key,
    examples_text,
    explore,
    parse_call,
    tools_text,
)
from .harvest import (
    Worked,
    digest,
    folders_in,
    looked_around,
    names_in,
    useful,
    worked_calls,
)
from .induce import (
    CallRecord,
    Wording,
    induce,
    name_for,
    read_slots,
)
from .records import (
    WORKFLOWS_DIR,
    Workflow,
    parse_workflows,
    render_workflows,
)
from .runner import run_workflow
from .values import as_number, distinctive, supports

if TYPE_CHECKING:
    from ....library_store.store import Snapshot
    from ...backends.base import Backend


log = logging.getLogger("whetstone.methods.workflows")
EXPLORED_KEPT = 80  # explorations recorded in an evolve's details


@dataclass(frozen=True)
class WorkflowsConfig:
    """Knobs of the workflows evolver."""

    name: str = knob("", help="The file: workflows/<name>.yaml (empty: the name of the MCP "
                     "server whose tools the workflows call, else 'workflows').")
    min_hits: int = knob(2, help="Training tasks a workflow must answer right to be kept.",
                         min=1)
    min_precision: float = knob(0.8, help="Share of the training tasks its patterns read "
                                "that a workflow must answer right.", min=0.0)
    explore: bool = knob(True, help="Ask the analyst for calls on kinds of training question "
                         "that no kept workflow answers.")
    explore_tasks: int = knob(2, help="Questions explored per kind.", min=1)
    explore_turns: int = knob(5, help="Calls the analyst may write per explored question.",
                              min=1)
    explore_patience: int = knob(2, help="Turns that may end with no new call (each sample "
                                 "a repeat or no call) before an explored question is given "
                                 "up; 0 never gives up.", min=0)
    max_analyst_calls: int = knob(120, help="Analyst calls the exploration may make in all "
                                  "(each turn samples again, up to twice, when a reply repeats "
                                  "a call): about 8 s each for the 1.5B on 2 cores.", min=0)
    replace: bool = knob(False, help="Start the file over instead of adding to it.")
    seed: int = knob(0, cli=False)
    concurrency: int = knob(2, cli=False)


def _host_tools(context: EvolveContext | None) -> list[Tool]:
    """The user's own tools the agent runs with (MCP servers' and functions'): what a
    workflow may call. Built-in and library tools are not the environment."""
    # lazy: the built-in tools' module loads the sandbox
    from ....tools.builtin import builtin_tools

    if context is None:
        return []
    builtin = {t.name for t in builtin_tools()}
    return [t for t in context.agent_tools() if t.name not in builtin and t.name != "read_skill"
            and not t.spec.source.startswith(("workflow:", "skills/", "builtin:"))]


def _file_name(tools: Sequence[Tool], workflows: Sequence[Workflow]) -> str:
    """``workflows/<server>.yaml`` for the MCP server the workflows call most."""
    servers = [t.spec.source.split(":", 1)[1].split("/", 1)[0] for t in tools
               if t.spec.source.startswith("mcp:")
               and any(s.tool == t.name for w in workflows for s in w.steps)]
    name = re.sub(r"[^a-z0-9]+", "-", (max(set(servers), key=servers.count) if servers
                                       else "workflows").lower()).strip("-")
    return name if NAME_RE.fullmatch(name) else "workflows"


def holds_label(argument: str, label: str) -> bool:
    """Whether a call's ``argument`` holds a training ``label`` as a value of its own. A label
    inside a name (a status "placed" in the column ``placed_day``) is the layout: an
    identifier's ``_`` joins it as a letter does."""
    if not supports(argument, label):
        return False
    if as_number(label) is not None:
        return True  # a number: ``supports`` already reads it whole
    words = r"\s+".join(re.escape(w) for w in label.split())
    return re.search(r"(?<![\w])" + words + r"(?![\w])", argument, re.IGNORECASE) is not None


def kinds(tasks: Sequence[TaskRecord], wording: Wording, threshold: float = 0.8
          ) -> list[list[TaskRecord]]:
    """The tasks grouped by kind of question: their wording embedded with the rare words
    masked (values), each joining the first group whose first question is as close as
    ``threshold`` (cosine). Biggest group first."""
    # lazy: loads numpy and the embedding model
    from ....library_store.embeddings import query_embedder

    masked = [" ".join(w if wording.count(w) >= wording.cut else "X"
                       for w in t.question.split()) for t in tasks]
    vectors = query_embedder(threads=1).embed(masked)  # (n, dim), unit rows
    heads: list[int] = []
    groups: list[list[TaskRecord]] = []
    for i, t in enumerate(tasks):
        for g, h in enumerate(heads):
            if float(vectors[i] @ vectors[h]) >= threshold:
                groups[g].append(t)
                break
        else:
            heads.append(i)
            groups.append([t])
    return sorted(groups, key=len, reverse=True)


class Workflows:
    """Learn verified call workflows for the tools of the agent's MCP servers and functions,
    offered as tools it only has to call (see the module docstring)."""

    name = "workflows"
    config_class = WorkflowsConfig
    runtime_methods = ("workflows",)

    def __init__(self, config: WorkflowsConfig) -> None:
        self.config = config

    def fit(self, traces: Sequence[Trace], library: Snapshot | Mapping[str, str],
            analyst: Backend, labels: Mapping[str, str] | None = None, *,
            context: EvolveContext | None = None) -> LibraryPatch:
        return asyncio.run(_Fit(self.config, traces, library, analyst, labels,
                                context).run())


class _Fit:
    """One ``fit``: its inputs, the host's tools and the results of their calls (cached: a
    workflow's calls repeat across the tasks it is checked on)."""

    def __init__(self, cfg: WorkflowsConfig, traces: Sequence[Trace],
                 library: Snapshot | Mapping[str, str], analyst: Backend,
                 labels: Mapping[str, str] | None, context: EvolveContext | None) -> None:
        self.cfg, self.library, self.analyst = cfg, library, analyst
        self.context = context or EvolveContext()
        self.traces = [t.with_(label=labels[t.id]) if labels and t.id in labels else t
                       for t in traces]
        self.tools = _host_tools(context)
        if not self.tools:
            raise ConfigError("workflows learn calls of the tools the agent is given, and "
                              "the agent has none of its own",
                              hint="give the environment's tools: --mcp-config FILE, --mcp, "
                                   "--mcp-url or --tools module:function")
        self.toolbox = Toolbox.of(self.tools)
        self.host = {t.name for t in self.tools}
        # Each tool's first required argument: where a steered call starts writing.
        self.first_args = {t.name: next(iter(t.spec.parameters.get("required") or []), "")
                           for t in self.tools}
        self.tasks = self._tasks()
        self.wording = Wording(t.question for t in self.tasks)
        self._results: dict[str, ToolResult] = {}
        self._peeked: list[CallRecord] = []
        self.details: dict[str, Any] = defaultdict(int)
        self.analyst_calls = 0

    def _tasks(self) -> list[TaskRecord]:
        by_q: dict[str, TaskRecord] = {}
        if self.context.tasks is not None:
            for t in self.context.tasks:
                if t.expected is not None and t.question:
                    by_q.setdefault(t.question, t)
        for t in tasks_from_traces(self.traces, scorer="normalised"):
            by_q.setdefault(t.question, t)
        if not by_q:
            raise ConfigError("workflows learn from labelled tasks, and none were given",
                              hint="evolve with --tasks SET@train (labelled), or import "
                                   "traces that carry labels")
        return list(by_q.values())

    def call(self, tool: str, args: Mapping[str, Any]) -> ToolResult:
        key = tool + repr(sorted(args.items()))
        if key not in self._results:
            self._results[key] = self.toolbox.call(tool, args)
        return self._results[key]

    # -- verify ---------------------------------------------------------------------------

    def score(self, workflow: Workflow) -> tuple[int, int, list[str]]:
        """(hits, tries, ids answered) of ``workflow`` over the training tasks its patterns
        read. A run that gives no value (a file that is not there, an empty result) abstains
        and is not a try: the runtime then tries the next workflow that reads the task, so
        workflows for the same question over differently kept items (a service's config in
        one of several formats) each count where they apply."""
        hits, tries, ids = 0, 0, []
        for task in self.tasks:
            values = read_slots(workflow.patterns, task.question)
            if values is None:
                continue
            done = run_workflow(workflow, values, self.call)
            if done.value is None:
                continue
            tries += 1
            try:
                ok = get_scorer(task.scorer)(done.value, task) >= 1.0
            except Exception:  # noqa: BLE001 -- a scorer that cannot read the value: a miss
                ok = False
            if ok:
                hits += 1
                ids.append(task.id)
        return hits, tries, ids

    def admit(self, candidates: Sequence[Workflow], kept: dict[str, Workflow],
              answered: dict[str, set[str]]) -> list[tuple[int, int]]:
        """Score ``candidates`` and keep those that pass (merged by their calls); (hits,
        tries) of each."""
        scores: list[tuple[int, int]] = []
        for w in candidates:
            key = w.key()
            if key in kept:  # the same calls from another wording: one more pattern
                old = kept[key]
                merged = replace(old, patterns=tuple(dict.fromkeys(old.patterns + w.patterns)))
                w = merged
            hits, tries, ids = self.score(w)
            if w.answer.kind == "key" and tries and hits / tries < self.cfg.min_precision:
                # Learned from a record that stood alone (one bill of a visit): where a
                # key has several records, the answer may be their sum.
                summed = replace(w, answer=replace(w.answer, kind="sum", index=0))
                got = self.score(summed)
                if got[0] > hits:
                    w, (hits, tries, ids) = summed, got
            scores.append((hits, tries))
            self.details["checked"] += 1
            if hits >= self.cfg.min_hits and tries and hits / tries >= self.cfg.min_precision:
                kept[key] = replace(w, hits=hits, tries=tries)
                answered[key] = set(ids)
        return scores

    # -- the whole fit --------------------------------------------------------------------

    async def run(self) -> LibraryPatch:
        start = time.time()
        report = self.context.on_progress
        label_of = {t.question: t.expected for t in self.tasks}
        worked: list[Worked] = []
        for t in self.traces:
            label = label_of.get(t.task, t.label)
            if label is None:
                continue
            w = worked_calls(t, label, self.host)
            if w is not None:
                worked.append(w)
        self.details["runs"] = len(self.traces)
        self.details["runs_that_reached_the_answer"] = len(worked)
        candidates = [w for w in (induce(x.question, x.calls, x.label, self.wording)
                                  for x in worked) if w is not None]
        kept: dict[str, Workflow] = {}
        answered: dict[str, set[str]] = {}
        report("workflows verify", 0, len(candidates))
        self.admit(candidates, kept, answered)
        self.details["induced_from_runs"] = len(candidates)
        if self.cfg.explore and self.cfg.max_analyst_calls > 0:
            await self.explore(worked, kept, answered)
        return self.patch(list(kept.values()), answered, time.time() - start)

    async def explore(self, worked: Sequence[Worked], kept: dict[str, Workflow],
                      answered: dict[str, set[str]]) -> None:
        """EXPLORE (module docstring): the kinds no kept workflow answers, biggest first."""
        covered = set().union(*answered.values()) if answered else set()
        order = kinds([t for t in self.tasks if t.id not in covered], self.wording)
        # The learner's own look first (what there is, what its records look like), then
        # what the runs' own looks showed that answered with something.
        looked = self._look()
        looked += await self._peek(looked)
        seen = {call_key(c.tool, c.arguments) for c, _ in looked}
        looked += [(c, n) for c, n in looked_around(self.traces, self.host, self.wording)
                   if call_key(c.tool, c.arguments) not in seen and useful(c.result)]
        known = digest(looked)
        shown = [c for c, _ in looked]
        # Calls that answered other kinds, newest first: what is found teaches what is next.
        examples = [(x.question, x.calls[-1]) for x in worked][:3]

        def system() -> str:
            return PROMPTS.render("explore_system", tools=tools_text(self.tools),
                                  known=known or "(nothing yet)",
                                  examples=examples_text(examples[-3:][::-1]))
        sem = asyncio.Semaphore(max(1, self.cfg.concurrency))
        lock = asyncio.Lock()
        done = 0

        async def one_kind(group: list[TaskRecord]) -> None:
            nonlocal done
            for task in group[:self.cfg.explore_tasks]:
                async with sem:
                    async with lock:  # checked once a slot is free: the budget is spent then
                        if any(task.id in ids for ids in answered.values()) or \
                                self.analyst_calls >= self.cfg.max_analyst_calls:
                            return
                        self.analyst_calls += self.cfg.explore_turns  # reserved
                    found = await explore(
                        self.analyst, system(), task.question, task.expected, self.call,
                        self.first_args, turns=self.cfg.explore_turns,
                        seed=self.cfg.seed + zlib.crc32(task.id.encode()) % 10_000,
                        run_tool=asyncio.to_thread, known=shown,
                        general=self._general(task), values=self._values(task.question),
                        first_tool=self.record_tool, patience=self.cfg.explore_patience)
                async with lock:
                    self.analyst_calls += found.analyst_calls - self.cfg.explore_turns
                    self.details["explored"] += 1
                    self.details["bad_replies"] += found.bad_replies
                    log.info("explored %r: %s after %d analyst calls (%d in all)",
                             task.question, "found" if found.found else "not found",
                             found.analyst_calls, self.analyst_calls)
                    self.context.on_progress("workflows explored", self.details["explored"], 0)
                    record = self._explored_record(task, found)
                    if not found.found:
                        continue
                    self.details["explored_found"] += 1
                    w = induce(task.question, found.calls, task.expected, self.wording)
                    if w is None:
                        self.details["explored_not_general"] += 1
                        continue
                    before = len(kept)
                    [(hits, tries)] = await asyncio.to_thread(self.admit, [w], kept, answered)
                    record.update(pattern=w.patterns[0], hits=hits, tries=tries)
                    if len(kept) > before or any(task.id in ids for ids in answered.values()):
                        self.details["explored_kept"] += 1
                        log.info("kept a workflow for %r: %s", task.question,
                                 [(c.tool, c.arguments) for c in found.calls])
                        examples.append((task.question, found.calls[-1]))
                        return
            done += 1
            self.context.on_progress("workflows explore", done, len(order))

        await asyncio.gather(*(one_kind(g) for g in order))

    def _explored_record(self, task: TaskRecord, found: Exploration) -> dict[str, Any]:
        """What one exploration did, kept in the evolve's details (the first
        ``EXPLORED_KEPT``): why a kind was not learned can be read from them."""
        record: dict[str, Any] = {
            "task": task.id, "found": found.found, "analyst_calls": found.analyst_calls,
            "bad_replies": found.bad_replies,
            "calls": [{"tool": c.tool, "arguments": dict(c.arguments),
                       "result": c.result[:200]} for c in found.calls],
            # what the analyst wrote each turn, and what it was told back (an error, a
            # repeat, not a call): the calls above are only those that ran
            "turns": [f"{m['role']}: {m['content'][:160]}" for m in found.transcript[2:]][:24]}
        log_ = self.details.setdefault("explorations", [])
        if len(log_) < EXPLORED_KEPT:
            log_.append(record)
        return record

    def _values(self, question: str) -> list[str]:
        """What ``question`` names (``Wording.values_in``)."""
        return self.wording.values_in(question)

    def _general(self, task: TaskRecord) -> Callable[[Sequence[CallRecord]], bool]:
        """Whether calls that reached ``task``'s answer make a workflow (they take the
        question's values, and not the answer itself)."""
        def check(calls: Sequence[CallRecord]) -> bool:
            return induce(task.question, calls, task.expected, self.wording) is not None
        return check

    def _look(self, budget: int = 40) -> list[tuple[CallRecord, int]]:
        """The learner's own look around, at most ``budget`` calls: each host tool that needs
        no argument (a list of tables, the allowed folders), then each tool that takes one
        text argument with each name those results listed (a table's columns, a folder's
        listing), then, breadth first, the folders a listing marks as folders (``[DIR] x``,
        ``x/``) with the tool that listed them: a tree's answers sit folders deep. Only what
        answered is kept."""
        out: list[tuple[CallRecord, int]] = []
        listed: list[str] = []
        for t in self.tools:
            if t.spec.parameters.get("required"):
                continue
            res = self.call(t.name, {})
            if res.error is None and useful(res.output):
                out.append((CallRecord(t.name, {}, res.output), 1))
                listed += names_in(res.output)
        walk: list[tuple[str, str, str]] = []  # (tool, argument, folder) still to list
        for t in self.tools:
            required = list(t.spec.parameters.get("required") or [])
            props = t.spec.parameters.get("properties") or {}
            if len(required) != 1 or (props.get(required[0]) or {}).get("type") != "string":
                continue
            for name in dict.fromkeys(listed):
                if len(out) >= budget:
                    return out
                res = self.call(t.name, {required[0]: name})
                if res.error is None and useful(res.output):
                    out.append((CallRecord(t.name, {required[0]: name}, res.output), 1))
                    walk += [(t.name, required[0], f"{name.rstrip('/')}/{sub}")
                             for sub in folders_in(res.output)]
        while walk and len(out) < budget:
            tool, arg, path = walk.pop(0)
            res = self.call(tool, {arg: path})
            if res.error is None and useful(res.output):
                out.append((CallRecord(tool, {arg: path}, res.output), 1))
                walk += [(tool, arg, f"{path}/{sub}") for sub in folders_in(res.output)]
        return out

    @property
    def record_tool(self) -> str:
        """The tool the analyst's look inside showed records with (the most used)."""
        tools = [c.tool for c in self._peeked]
        return max(set(tools), key=tools.count) if tools else ""

    async def _peek(self, looked: Sequence[tuple[CallRecord, int]], most: int = 12
                    ) -> list[tuple[CallRecord, int]]:
        """The analyst's look inside what the look around listed: for each name listed (a
        table, a folder), one call that shows a few of its records or its contents, as a
        person opens a table before querying it. The conventions (codes, units, how dates
        are kept) show in records, not in a schema."""
        listed: list[str] = []
        for c, _ in looked:
            if not c.arguments:
                listed += names_in(c.result)
        listed = list(dict.fromkeys(listed))[:most]
        if not listed or self.analyst_calls >= self.cfg.max_analyst_calls:
            return []
        system = PROMPTS.render("explore_system", tools=tools_text(self.tools),
                                known=digest(looked) or "(nothing yet)", examples="")
        made = {call_key(c.tool, c.arguments) for c, _ in looked}
        out: list[tuple[CallRecord, int]] = []
        for name in listed:
            if self.analyst_calls >= self.cfg.max_analyst_calls:
                break
            self.analyst_calls += 1
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": PROMPTS.render("explore.yaml#peek",
                                                                   name=name)}]
            try:
                reply = (await self.analyst.acomplete(Request(
                    messages=tuple(messages), max_tokens=200,  # type: ignore[arg-type]
                    temperature=0.0, stop=("\n\n",)))).text
            except BackendError:
                break
            got = parse_call(reply, self.host)
            if isinstance(got, str) or call_key(*got) in made:
                continue
            made.add(call_key(*got))
            res = await asyncio.to_thread(self.call, *got)
            if res.error is None and res.output.strip():
                out.append((CallRecord(got[0], got[1], res.output), 1))
        self.details["peeked"] = len(out)
        self._peeked = [c for c, _ in out]
        return out

    def patch(self, workflows: list[Workflow], answered: Mapping[str, set[str]],
              seconds: float) -> LibraryPatch:
        file = self.cfg.name or _file_name(self.tools, workflows)
        if not NAME_RE.fullmatch(file):
            raise ConfigError(f"workflows name {file!r} is not lower-case letters, digits and "
                              "hyphens", hint="e.g. --name shop")
        path = f"{WORKFLOWS_DIR}/{file}.yaml"
        old_text = library_texts(self.library, path).get(path)
        old = [] if self.cfg.replace or old_text is None else \
            parse_workflows(old_text, path=path)[0]
        keys = {w.key() for w in old}
        taken = {w.name for w in old} | self.host
        fresh = []
        others = [p for w in workflows for p in w.patterns]
        for w in sorted(workflows, key=lambda w: (-w.hits, w.patterns)):
            if w.key() in keys:
                continue
            name = name_for(w, taken, others)
            fresh.append(replace(w, name=name, description=""))
        labels = {str(t.expected) for t in self.tasks if distinctive(t.expected)}
        clean = [w for w in fresh if not any(
            isinstance(v, str) and any(holds_label(v, lab) for lab in labels
                                       if lab.casefold() in v.casefold())
            for s in w.steps for v in s.arguments.values())]
        self.details["refused_labels"] = len(fresh) - len(clean)
        merged = old + clean
        text = render_workflows(merged) if merged else None
        changes: dict[str, str | None] = {} if text is None or text == old_text else {path: text}
        return LibraryPatch(
            method="workflows", changes=changes,
            message=f"workflows {file}: {len(clean)} added ({len(merged)} kept) from "
                    f"{len(self.traces)} runs",
            details={**dict(self.details), "file": path,
                     "added": [{"name": w.name, "hits": w.hits, "tries": w.tries,
                                "patterns": list(w.patterns)} for w in clean],
                     "tasks_answered": len(set().union(*answered.values())) if answered else 0,
                     "train_tasks": len(self.tasks), "seconds": round(seconds, 1)},
            costs={"analyst_calls": self.analyst_calls})


__all__ = ["Workflows", "WorkflowsConfig"]
