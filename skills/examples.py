"""The worked examples nearest to a task, packed into a token budget.

Small models copy a worked example far more reliably than they follow advice, so a skill may
carry examples (``references/examples.md``) and a library may keep a memory of demonstrations
(``memory/<name>.md``); both use the format of ``whetstone.skills.format`` (``parse_examples``). For a
task, ``ExampleRetriever.nearest`` ranks examples by the cosine similarity of their task to
the task (the query embedder, vectors cached by text) and keeps the best ``k`` that fit the
budget, nearest first. The rendering is ``engine/prompts/examples.yaml``.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..engine.prompts import render_prompt
from ..library_store.embeddings import Embedder
from .format import Example

TokenCounter = Callable[[str], int]
MAX_CACHED = 20_000  # task vectors kept (384 floats each: ~30 MB at most)


@dataclass(frozen=True)
class Shown:
    """What ``nearest`` put in front of the model: the text and the examples' trace ids with
    their similarity to the task, nearest first."""

    text: str
    trace_ids: tuple[str, ...] = ()
    scores: tuple[float, ...] = ()
    tokens: int = 0
    turns: tuple[dict[str, str], ...] = ()  # with ``as_turns``: the examples as exchanges


def render_shown(examples: Sequence[Example], *, heading: str) -> str:
    """The demonstrations block: a heading, then each example as task and solution."""
    if not examples:
        return ""
    parts = [render_prompt("examples.yaml#heading", heading=heading)]
    parts += [render_prompt("examples.yaml#example", task=ex.task, solution=ex.solution.strip())
              for ex in examples]
    return "\n\n".join(p.strip("\n") for p in parts) + "\n"


# Where the runtime's part of a solution begins: a program's output, a tool's result.
_RUNTIME_BLOCK = re.compile(r"^(?:```output\b|<tool_response>)", re.MULTILINE)


def first_reply(solution: str) -> str:
    """What the model wrote in its first reply of ``solution``: everything before the first
    block the runtime gave back. A demonstration shown as a chat turn ends there, so the
    model is not taught to write an output it has not seen (it would guess one)."""
    m = _RUNTIME_BLOCK.search(solution)
    return (solution[:m.start()] if m else solution).strip()


def demo_turns(examples: Sequence[Example]) -> tuple[dict[str, str], ...]:
    """``examples`` as earlier exchanges, nearest last (closest to the task it precedes):
    the example's task as the user's turn, the model's first reply as the assistant's."""
    turns: list[dict[str, str]] = []
    for ex in reversed(examples):
        turns += [{"role": "user", "content": ex.task.strip()},
                  {"role": "assistant", "content": first_reply(ex.solution)}]
    return tuple(turns)


class ExampleRetriever:
    """Nearest examples by task embedding. Thread-safe; one per plugin, shared by its runs."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self._vectors: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        keys = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
        with self._lock:
            missing = sorted({k: t for k, t in zip(keys, texts, strict=False) if k not in self._vectors}.items())
        if missing:
            vectors = self.embedder.embed([t for _, t in missing])
            with self._lock:
                if len(self._vectors) + len(missing) > MAX_CACHED:
                    self._vectors.clear()  # a rare, long-lived server: start over
                for (k, _), v in zip(missing, vectors, strict=False):
                    self._vectors[k] = np.asarray(v, dtype=np.float32)
        with self._lock:
            return np.stack([self._vectors[k] for k in keys])

    def rank(self, task: str, examples: Sequence[Example]) -> list[tuple[Example, float]]:
        """Every example with its cosine similarity to ``task``, nearest first (ties keep the
        file's order)."""
        if not examples:
            return []
        vectors = self._embed([task, *(ex.task for ex in examples)])
        scores = vectors[1:] @ vectors[0]
        order = sorted(range(len(examples)), key=lambda i: (-float(scores[i]), i))
        return [(examples[i], float(scores[i])) for i in order]

    def nearest(self, task: str, examples: Sequence[Example], *, k: int, budget_tokens: int,
                count_tokens: TokenCounter, heading: str = "Worked examples",
                exclude_task: bool = True, as_turns: bool = False) -> Shown:
        """The ``k`` nearest examples whose block fits ``budget_tokens``: nearest first, an
        example that would overflow is skipped for a shorter one further down. With
        ``exclude_task``, an example of this very task is left out (no answer leaks when a
        library is scored on the tasks it was learned from). With ``as_turns`` they come back
        as chat turns (``demo_turns``; ``text`` is empty) instead of a text block; an example
        whose solution starts with the runtime's part (no reply of its own) is skipped."""
        ranked = [(ex, s) for ex, s in self.rank(task, examples)
                  if not (exclude_task and " ".join(ex.task.split()) == " ".join(task.split()))
                  and not (as_turns and not first_reply(ex.solution))]

        def cost(chosen: Sequence[Example]) -> int:
            if as_turns:
                return sum(count_tokens(t["content"]) for t in demo_turns(chosen))
            return count_tokens(render_shown(chosen, heading=heading))

        chosen: list[tuple[Example, float]] = []
        for ex, score in ranked:
            if len(chosen) >= k:
                break
            if cost([e for e, _ in chosen] + [ex]) <= budget_tokens:
                chosen.append((ex, score))
        picked = [e for e, _ in chosen]
        ids = tuple(e.trace_id for e in picked)
        scores = tuple(round(s, 4) for _, s in chosen)
        if as_turns:
            return Shown("", ids, scores, cost(picked) if picked else 0, demo_turns(picked))
        text = render_shown(picked, heading=heading)
        return Shown(text, ids, scores, count_tokens(text) if text else 0)


__all__ = ["ExampleRetriever", "Shown", "demo_turns", "first_reply", "render_shown"]
