"""One Dynamo fit in progress: its state (saved after every phase), the analyst it asks and
the tools its proposals are tested with; each phase (``attempts.py``, ``diagnosis.py``,
``writing.py``) builds on it and ``evolver.py`` runs them round by round."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ....tools.builtin import builtin_tools
from ....tools.images import ImageFiles
from ....tools.learned_run import run_learned
from ....tools.visual import visual_tools
from ...backends.base import Backend
from ..analyst import ask_parsed
from ..base import EvolveContext, library_texts
from . import PROMPTS
from .parts import (
    Attempt,
    DynamoState,
    expand_toolset,
)

if TYPE_CHECKING:
    from ....library_store.store import Snapshot
    from ....tools.base import Tool
    from ...evaluation.tasks import TaskRecord
    from .evolver import Dynamo


class RunCore:
    """The state, saving, the analyst and the tools every phase of one fit shares."""

    def __init__(self, method: Dynamo, context: EvolveContext, analyst: Backend,
                 tasks: list[TaskRecord], library: Snapshot | Mapping[str, str],
                 base_id: str) -> None:
        self.cfg = method.config
        self.method = method
        self.context = context
        self.analyst = analyst
        self.tasks = {t.id: t for t in tasks}
        self.library = library
        self.texts = library_texts(library, "skills/")
        key = hashlib.sha256(json.dumps({
            "config": {k: v for k, v in asdict(self.cfg).items() if k != "fresh"},
            "tasks": list(self.tasks), "base": base_id, "model": context.model,
            "analyst": analyst.spec}, sort_keys=True).encode()).hexdigest()[:20]
        # Libraries from before the state/ layout kept this under work/dynamo/.
        self.saved = (context.library.state("dynamo", legacy=("work/dynamo",))
                      if context.library is not None else None)
        self.path = self.saved.path(key) if self.saved is not None else None
        self.state = self._load(key)
        self.images = self._images()
        self._given: dict[str, Tool] | None = None

    def _load(self, key: str) -> DynamoState:
        data = self.saved.load(key) if self.saved is not None and not self.cfg.fresh else None
        if data is not None:
            try:
                state = DynamoState.from_dict(data)
                if state.key == key:
                    return state
            except (KeyError, TypeError, ValueError):
                pass  # a damaged save: start over rather than fail
        return DynamoState(key)

    def save(self) -> None:
        if self.saved is not None:
            self.saved.save(self.state.key, self.state.to_dict())

    def _ask(self, coro: Any) -> Any:
        return asyncio.run(coro)

    async def _call(self, messages: list[dict[str, str]], parse: Any, seed: int) -> Any:
        reply = await ask_parsed(self.analyst, messages, parse,
                                 temperature=self.cfg.temperature,
                                 max_tokens=self.cfg.max_tokens, seed=seed)
        self.state.analyst.add(reply.stats)
        return reply

    def _messages(self, user: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": PROMPTS.load("system")},
                {"role": "user", "content": user}]

    def _block(self, label: str, a: Attempt, *, failure: bool) -> str:
        image = PROMPTS.render("parts.yaml#image", path=a.image) if a.image else ""
        if failure:
            return PROMPTS.render("parts.yaml#failure", label=label, task_id=a.task_id,
                                  image=image, trace=a.text, expected=a.expected)
        return PROMPTS.render("parts.yaml#success", label=label, task_id=a.task_id,
                              image=image, trace=a.text)

    def _failures(self, ids: Sequence[str]) -> tuple[str, dict[str, str]]:
        labels = {f"F{i}": t for i, t in enumerate(ids, 1)}
        text = "\n\n".join(self._block(label, self.state.attempts[t], failure=True)
                           for label, t in labels.items())
        return text, labels

    def _images(self) -> ImageFiles:
        roots = {str(Path(t.image).resolve().parent) for t in self.tasks.values() if t.image}
        out = (self.saved.folder / "tool-images" if self.saved is not None
               else Path(ImageFiles.temporary().out_dir))
        return ImageFiles(out, tuple(Path(r) for r in sorted(roots)))

    def _run_learned(self, definition: Any, args: dict[str, Any]) -> Any:
        return run_learned(definition, args, images=self.images, sandbox=self.method.sandbox,
                           timeout_s=self.cfg.test_timeout_s)

    def _skill_names(self) -> list[str]:
        names = {p.split("/")[1] for p in self.texts if p.count("/") >= 2}
        return sorted(names | {p.split("/")[1] for p in self.state.changes})

    def _tool_taken(self) -> set[str]:
        # lazy: loads filelock and 38 more of our modules
        from ...library.checks import reserved_tool_names, script_tool_name

        paths = [*self.texts, *self.state.changes]
        return set(reserved_tool_names()) | {f[1] for p in paths
                                             if (f := script_tool_name(p)) is not None}

    def _given_tools(self) -> dict[str, Tool]:
        """The ``toolset`` tools by name: built-in, visual, learned, or the agent's own."""
        if self._given is None:
            # lazy: loads filelock and 38 more of our modules
            from ...runtime.library_tools import library_tools

            known: dict[str, Tool] = {t.name: t for t in builtin_tools()}
            known.update({t.name: t for t in visual_tools(self.images)})
            if not isinstance(self.library, Mapping):
                known.update({t.name: t for t in library_tools(
                    self.library, images=self.images, sandbox=self.method.sandbox)[0]})
            self._given = expand_toolset(self.cfg.toolset, known, self.context.agent_tools)
        return self._given

