"""The ``nlpg`` runtime method: each module's policy notes in that module's prompt, and nowhere
else.

``think`` reads its notes in the system message (``guidance``), grouped under one heading per
route (the edge the decision takes: a tool call, the final answer, a retried reply), each
within the method's token budget. The system message is built once per run, so every think
decision sees all of think's routes; the heading says when each rule applies. A plugin node
(a Co-ReAct rubric, a MARCH verifier) asks for its own notes with ``policy_notes(ctx, module,
route)`` and records the ids it showed in its step's ``meta["policy_notes"]``. A trace records
the notes each module was shown in ``meta["nlpg"]["shown"]``: the evolver's counters and
backward pass read it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError
from ...runtime.plugins import Guidance, MethodEnv, Plugin
from ..base import knob
from . import PROMPTS
from .notes import PolicyNote, load_policies

if TYPE_CHECKING:
    from ....library_store.store import Library, Snapshot
    from ...runtime.state import AgentContext, AgentState

ROUTE_ORDER = ("*", "act", "think", "finish")
THINK = "think"


@dataclass(frozen=True)
class NLPGRuntimeConfig:
    """How many tokens of notes one module's prompt may show."""

    budget_tokens: int = knob(400, help="Most tokens of notes in one module's prompt.", min=0)


@dataclass(frozen=True)
class ModuleNotes:
    """A module's notes as its prompt shows them, and their ids (for the trace)."""

    text: str = ""
    ids: tuple[str, ...] = ()


def _route_heading(route: str) -> str:
    key = {"*": "route_any", "act": "route_act", "finish": "route_finish",
           "think": "route_think"}.get(route)
    return PROMPTS.load(f"guidance.yaml#{key}") if key else PROMPTS.render(
        "guidance.yaml#route_other", route=route)


def _within(notes: Sequence[PolicyNote], budget: int, count: Callable[[str], int]
            ) -> list[PolicyNote]:
    """The notes that fit ``budget`` tokens, front first (the memory keeps priority order)."""
    kept, used = [], 0
    for n in notes:
        cost = count(n.text) + 2
        if used + cost > budget:
            continue
        kept.append(n)
        used += cost
    return kept


def render_notes(notes: Sequence[PolicyNote]) -> str:
    """Notes grouped under their route's heading (routes in a fixed order)."""
    routes = sorted({n.route for n in notes},
                    key=lambda r: (ROUTE_ORDER.index(r) if r in ROUTE_ORDER else 9, r))
    blocks = []
    for route in routes:
        lines = [PROMPTS.render("guidance.yaml#note", text=n.text)
                 for n in notes if n.route == route]
        blocks.append(_route_heading(route) + "\n" + "\n".join(lines))
    return "\n".join(blocks)


class NLPGPlugin(Plugin):
    """Natural-language policy notes per module, shown only in that module's prompt."""

    name = "nlpg"
    config_class = NLPGRuntimeConfig

    @classmethod
    def build(cls, config: Any, env: MethodEnv) -> NLPGPlugin:
        return cls(env.require_library("nlpg"), snapshot=env.snapshot, config=config)

    def __init__(self, library: Library | None = None, *, snapshot: Snapshot | None = None,
                 config: NLPGRuntimeConfig | None = None,
                 memory: Mapping[str, Sequence[PolicyNote]] | None = None) -> None:
        if library is None and snapshot is None and memory is None:
            raise ConfigError("NLPGPlugin needs a library, a snapshot or a memory")
        self.library, self.pinned = library, snapshot
        self.config = config or NLPGRuntimeConfig()
        self._fixed = {m: list(n) for m, n in memory.items()} if memory is not None else None
        self._lock = threading.Lock()
        self._cache: tuple[str, dict[str, list[PolicyNote]], int] | None = None

    def memory(self) -> tuple[str | None, dict[str, list[PolicyNote]], int]:
        """(version, notes per module, malformed lines skipped) the run reads."""
        if self._fixed is not None:
            return None, self._fixed, 0
        with self._lock:
            snap = self.pinned
            if snap is None:
                assert self.library is not None
                current = self.library.current_id()
                if self._cache is not None and self._cache[0] == current:
                    return self._cache
                snap = self.library.snapshot(current)
            elif self._cache is not None and self._cache[0] == snap.id:
                return self._cache
            memory, problems = load_policies(snap)
            self._cache = (snap.id, memory, len(problems))
            return self._cache

    def module_notes(self, module: str, route: str | None, count: Callable[[str], int],
                     budget_tokens: int | None = None) -> ModuleNotes:
        """``module``'s notes for ``route`` (None: every route) within the budget."""
        notes = [n for n in self.memory()[1].get(module, ())
                 if route is None or n.route in ("*", route)]
        budget = self.config.budget_tokens if budget_tokens is None else min(
            budget_tokens, self.config.budget_tokens)
        kept = _within(notes, budget, count)
        if not kept:
            return ModuleNotes()
        return ModuleNotes(render_notes(kept), tuple(n.id for n in kept))

    def guidance(self, task: str, ctx: AgentContext, budget_tokens: int) -> Guidance | None:
        version, _, malformed = self.memory()
        notes = self.module_notes(THINK, None, ctx.backend.count_tokens, budget_tokens)
        meta = {"version": version, "shown": {THINK: list(notes.ids)} if notes.ids else {},
                "malformed": malformed}
        text = PROMPTS.load("guidance.yaml#heading") + "\n" + notes.text if notes.text \
            else ""
        return Guidance("Policy notes", text, meta, library_version=version)

    def finish_meta(self, state: AgentState) -> Mapping[str, Any]:
        shown = dict(((state.get("meta") or {}).get(self.name) or {}).get("shown") or {})
        for s in state.get("steps") or []:
            ids = (s.get("meta") or {}).get("policy_notes")
            if isinstance(ids, list) and ids:
                seen = shown.setdefault(s["module"], [])
                seen += [i for i in ids if i not in seen]
        return {"shown": shown} if shown else {}


def policy_notes(ctx: AgentContext, module: str, route: str | None = None) -> ModuleNotes:
    """The notes for ``module`` (on ``route``) when the run uses the nlpg method, else none.
    For a plugin node's prompt: record ``ids`` in the node's step ``meta["policy_notes"]``."""
    for plugin in ctx.plugins:
        if isinstance(plugin, NLPGPlugin):
            return plugin.module_notes(module, route, ctx.backend.count_tokens)
    return ModuleNotes()
