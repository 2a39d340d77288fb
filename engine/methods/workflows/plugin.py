"""``--methods workflows``: the library's verified workflows, offered as tools where they fit.

For each task, a workflow *fits* when one of its patterns reads the task (the question of a
kind it answered on train, its slots read from the question), or, failing that, when the task
is close to one of its patterns (the cosine of their embeddings, ``min_score``). Only fitting
workflows are offered, the best ``k``; when one fits by its pattern (or as close as
``require_at``), the run's first decision must call it (OpenAI's ``tool_choice="required"``:
the runtime prefills the call on backends that can). Left to choose, the 0.5B answered from
its prior or wrote the call as text (docs/results.md). Nothing is offered or shown when
nothing fits.

A workflow tool runs its calls through the host's own tools (``MethodEnv.tools``: the MCP
servers' tools with their allow-lists, the user's functions), so no model-written code runs,
and its answer ends the run (``returns_answer``). The slot values come from the pattern that
read the task, else from the model's arguments.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ....tools.base import Tool, Toolbox, ToolResult
from ...runtime.plugins import Guidance, MethodEnv, Plugin, ToolOffer
from ...types import ToolSpec
from ..base import knob
from . import PROMPTS
from .induce import read_slots
from .records import (
    WORKFLOWS_DIR,
    Workflow,
    fill,
    parse_workflows,
)
from .runner import run_workflow

if TYPE_CHECKING:
    from ....library_store.embeddings import Embedder
    from ....library_store.store import Library, Snapshot
    from ...runtime.state import AgentContext, AgentState

log = logging.getLogger("whetstone.methods.workflows")


@dataclass(frozen=True)
class WorkflowsRunConfig:
    """Knobs of the workflows runtime method."""

    name: str = knob("", help="Read only workflows/<name>.yaml (empty: every file).")
    k: int = knob(1, help="Workflows offered per task at most (the best fitting first).", min=1)
    min_score: float = knob(0.6, help="Cosine a task needs to a workflow's pattern to be "
                            "offered it when no pattern reads the task.", min=0.0)
    require_at: float = knob(0.8, help="Cosine at which the call is required even when no "
                             "pattern reads the task.", min=0.0)


@dataclass(frozen=True)
class Fit:
    """How a workflow fits a task: read by a pattern (``slots``) or only close (``score``)."""

    workflow: Workflow
    score: float
    slots: Mapping[str, str] | None = None

    @property
    def strong(self) -> bool:
        return self.slots is not None


def _precision(w: Workflow) -> float:
    return w.hits / w.tries if w.tries else 0.0


def workflow_spec(w: Workflow) -> ToolSpec:
    """The tool a workflow is offered as: its task slots are its parameters; the task text
    is injected (its patterns read the slots from it)."""
    first = w.patterns[0] if w.patterns else w.description
    example = first
    for s in w.task_slots:
        example = example.replace("{" + s.name + "}", s.example or s.name)
    tools = ", ".join(dict.fromkeys(s.tool for s in w.steps))
    return ToolSpec(
        name=w.name,
        description=(w.description or f"Answers questions like: {example}") +
        f" (verified calls of {tools})",
        parameters={"type": "object",
                    "properties": {s.name: {"type": "string",
                                            "description": f"e.g. {s.example}" if s.example
                                            else s.name} for s in w.task_slots},
                    # Not required: a pattern that reads the task fills them; the tool says
                    # which value it lacks when neither the pattern nor the model gives it.
                    "required": []},
        source=f"workflow:{w.name}", inject={"_task": "task"}, returns_answer=True)


def shown_calls(w: Workflow, values: Mapping[str, str]) -> str:
    """A workflow's calls filled in for a task, as text for a host that runs its own tools
    (``engine/methods/workflows/prompts/guidance.yaml`` words it)."""
    lines = [PROMPTS.render("guidance.yaml#head")]
    for i, step in enumerate(w.steps):
        args = {k: fill(v, {**values, **{s.name: PROMPTS.render(
            "guidance.yaml#from_step", slot=s.name, step=str((s.from_step or 0) + 1))
            for s in w.slots if s.from_step is not None}}) for k, v in step.arguments.items()}
        lines.append(PROMPTS.render("guidance.yaml#step", n=str(i + 1), tool=step.tool,
                                    arguments=json.dumps(args, ensure_ascii=False)))
    said = {"key": "answer_key", "sum": "answer_sum"}.get(w.answer.kind, "answer_whole")
    lines.append(PROMPTS.render(f"guidance.yaml#{said}", key=w.answer.key))
    if w.answer.convert:
        kind, _, arg = w.answer.convert.partition(":")
        if kind == "scale":
            k = int(arg)  # read back times 10**k: a price in cents is scale:-2
            lines.append(PROMPTS.render("guidance.yaml#convert_divide" if k < 0 else
                                        "guidance.yaml#convert_multiply",
                                        factor=f"{10 ** abs(k):g}"))
        else:
            lines.append(PROMPTS.render("guidance.yaml#convert_date", form=arg))
    return "\n".join(lines)


class WorkflowsPlugin(Plugin):
    """Offer the verified workflows that fit a task (see the module docstring)."""

    name = "workflows"
    config_class = WorkflowsRunConfig
    # Where the host offers no tools (chat mode: the caller runs its own), a fitting
    # workflow's calls are shown filled in for the task instead.
    optional = frozenset({"tools"})

    @classmethod
    def build(cls, config: Any, env: MethodEnv) -> WorkflowsPlugin:
        return cls(env.require_library("workflows"), config or WorkflowsRunConfig(),
                   snapshot=env.snapshot, host_tools=env.tools)

    def __init__(self, library: Library, config: WorkflowsRunConfig | None = None, *,
                 snapshot: Snapshot | None = None,
                 host_tools: Callable[[], Sequence[Tool]] | None = None,
                 embedder: Embedder | None = None) -> None:
        self.library = library
        self.pinned = snapshot
        self.config = config or WorkflowsRunConfig()
        self._host_tools = host_tools
        self._embedder = embedder
        self._toolbox: Toolbox | None = None
        self._cache: tuple[str, list[Workflow], Any] | None = None
        self._lock = threading.Lock()

    # -- the library ------------------------------------------------------------------------

    def workflows(self) -> tuple[str, list[Workflow]]:
        """The version read and its workflows (parsed once per version; a host tool's name
        is never taken by a workflow)."""
        version, found, _ = self._loaded()
        return version, found

    def _loaded(self) -> tuple[str, list[Workflow], Any]:
        snap = self.pinned or self.library.snapshot()
        with self._lock:
            if self._cache is None or self._cache[0] != snap.id:
                prefix = f"{WORKFLOWS_DIR}/{self.config.name}.yaml" if self.config.name \
                    else f"{WORKFLOWS_DIR}/"
                host = {t.name for t in self._host()}
                found: list[Workflow] = []
                for path, text in sorted(snap.texts(prefix).items()):
                    for w in parse_workflows(text, path=path)[0]:
                        if w.name in host:
                            log.warning("workflow %s in %s is not offered: the run has a tool "
                                        "of that name (the user's own wins)", w.name, path)
                            continue
                        found.append(w)
                self._cache = (snap.id, found, None)
            return self._cache

    def _vectors(self) -> Any:
        """The embeddings of each workflow's patterns (filled with their examples)."""
        version, found, vectors = self._loaded()
        if vectors is not None or not found:
            return vectors
        if self._embedder is None:
            # lazy: loads numpy and the embedding model
            from ....library_store.embeddings import query_embedder

            self._embedder = query_embedder(threads=1)
        texts, owners = [], []
        for i, w in enumerate(found):
            for p in w.patterns:
                for s in w.task_slots:
                    p = p.replace("{" + s.name + "}", s.example or s.name)
                texts.append(p)
                owners.append(i)
        matrix = self._embedder.embed(texts) if texts else None
        with self._lock:
            if self._cache is not None and self._cache[0] == version:
                self._cache = (version, found, (matrix, owners))
        return matrix, owners

    def _host(self) -> list[Tool]:
        return list(self._host_tools()) if self._host_tools is not None else []

    def _call(self, tool: str, args: Mapping[str, Any]) -> ToolResult:
        if self._toolbox is None:
            self._toolbox = Toolbox.of(self._host())
        return self._toolbox.call(tool, args)

    # -- fitting a task -------------------------------------------------------------------

    def fits(self, task: str) -> list[Fit]:
        """The workflows that fit ``task``, best first (see the module docstring)."""
        _, found = self.workflows()
        if not found:
            return []
        strong = [Fit(w, 1.0, slots) for w in found
                  if (slots := read_slots(w.patterns, task)) is not None]
        if strong:
            return sorted(strong, key=lambda f: (-_precision(f.workflow), -f.workflow.hits))
        matrix, owners = self._vectors()
        if matrix is None:
            return []
        # lazy: numpy, loaded with the embedder
        import numpy as np

        q = np.asarray(self._embedder.embed([task]))[0]  # type: ignore[union-attr]
        sims = np.asarray(matrix) @ q  # (n_patterns,): unit vectors, so cosines
        best: dict[int, float] = {}
        for j, score in enumerate(sims.tolist()):
            best[owners[j]] = max(best.get(owners[j], -1.0), float(score))
        return [Fit(found[i], s) for i, s in sorted(best.items(), key=lambda kv: -kv[1])
                if s >= self.config.min_score]

    def guidance(self, task: str, ctx: AgentContext, budget_tokens: int) -> Guidance | None:
        version, found = self.workflows()
        chosen = self.fits(task)[:self.config.k]
        meta: dict[str, Any] = {"available": len(found),
                                "offered": [f.workflow.name for f in chosen],
                                "scores": [round(f.score, 4) for f in chosen]}
        required = [f.workflow.name for f in chosen
                    if f.strong or f.score >= self.config.require_at]
        if required:
            meta["required"] = required
        text = ""
        if chosen and chosen[0].strong and chosen[0].workflow.name not in ctx.toolbox.tools:
            text = shown_calls(chosen[0].workflow, chosen[0].slots or {})
            meta["shown_calls"] = chosen[0].workflow.name
        return Guidance("", text, meta, library_version=version)

    # -- tools ----------------------------------------------------------------------------

    def tools(self) -> list[Tool]:
        return [Tool(workflow_spec(w), self._runner(w)) for w in self.workflows()[1]]

    def offer(self, shown: Mapping[str, Any]) -> ToolOffer:
        return ToolOffer(tuple(shown.get("offered") or ()), tuple(shown.get("required") or ()))

    def _runner(self, w: Workflow) -> Callable[[Mapping[str, Any]], ToolResult]:
        def run(args: Mapping[str, Any]) -> ToolResult:
            task = str(args.get("_task") or "")
            values = dict(read_slots(w.patterns, task) or {})
            for s in w.task_slots:
                given = args.get(s.name)
                if not values.get(s.name) and isinstance(given, (str, int, float)) \
                        and str(given).strip():
                    values[s.name] = str(given).strip()
            done = run_workflow(w, values, self._call)
            tried = [{"workflow": w.name, "slots": values, "calls": done.calls,
                      **({"error": done.error} if done.error else {})}]
            # Where this one gives no value (the item is kept another way), the other
            # workflows that read the same task are tried, the most precise first.
            for alt in (f for f in self.fits(task) if f.strong and f.workflow.name != w.name):
                if done.value is not None:
                    break
                done = run_workflow(alt.workflow, dict(alt.slots or {}), self._call)
                tried.append({"workflow": alt.workflow.name, "slots": dict(alt.slots or {}),
                              "calls": done.calls, **({"error": done.error} if done.error
                                                        else {})})
            meta = {"workflow": tried[-1]["workflow"], "tried": tried}
            if done.value is None:
                return ToolResult(error=f"workflow {w.name}: {tried[0].get('error')}",
                                  metadata=meta)
            return ToolResult(output=done.value, metadata=meta)
        return run

    def finish_meta(self, state: AgentState) -> Mapping[str, Any]:
        called = [s["input"].get("tool") for s in state.get("steps") or []
                  if s["kind"] == "act" and str(s["input"].get("tool", "")) in
                  {w.name for w in self.workflows()[1]}]
        return {"called": called}


__all__ = ["Fit", "WorkflowsPlugin", "WorkflowsRunConfig", "shown_calls", "workflow_spec"]
