"""Dynamo's DIAGNOSE phase: the analyst reads failures beside similar correct attempts and
groups them by cause."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from . import PROMPTS
from .parts import (
    Cluster,
    merge,
    parse_clusters,
    words,
)
from .run import RunCore


class DiagnosePhase(RunCore):
    """Cluster the failures by cause (see ``evolver.py``)."""

    def _contrast(self, failures: Sequence[str]) -> str:
        seen = set().union(*(words(self.state.attempts[f].question) for f in failures))
        correct = [a for a in self.state.attempts.values() if a.correct]
        correct.sort(key=lambda a: -len(words(a.question) & seen))
        blocks = [self._block(f"S{i}", a, failure=False)
                  for i, a in enumerate(correct[:self.cfg.contrast], 1)]
        return "\n\n".join(blocks) or PROMPTS.load("parts.yaml#no_successes")

    def _tool_names(self) -> str:
        names: dict[str, None] = {}
        for a in self.state.attempts.values():
            for line in a.text.splitlines():
                if line.startswith("Model calls "):
                    names.setdefault(line[len("Model calls "):].split("(")[0], None)
        given = list(self._given_tools()) if self.cfg.toolset else []
        return ", ".join(dict.fromkeys([*given, *names])) or "(none used)"

    async def _diagnose(self) -> list[Cluster]:
        failing = [i for i, a in self.state.attempts.items() if not a.correct]
        failing = failing[:self.cfg.max_failures]
        batches = [failing[i:i + self.cfg.batch_size]
                   for i in range(0, len(failing), self.cfg.batch_size)]
        sem = asyncio.Semaphore(self.cfg.workers)

        async def one(n: int, batch: list[str]) -> list[Cluster]:
            text, labels = self._failures(batch)
            user = PROMPTS.render("diagnose", failures=text,
                                  successes=self._contrast(batch), tools=self._tool_names())
            async with sem:
                reply = await self._call(self._messages(user), lambda raw: parse_clusters(
                    raw, labels, self.state.repairs), self.cfg.seed + n)
            self.context.on_progress("diagnose", n + 1, len(batches))
            return reply.value or []

        found = await asyncio.gather(*(one(n, b) for n, b in enumerate(batches)))
        return merge([c for cs in found for c in cs])[:self.cfg.max_proposals]

