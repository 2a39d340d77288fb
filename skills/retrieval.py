"""Retrieval with progressive disclosure: the skills that fit a task, packed into a token budget.

Level 1: the names and descriptions of the top-k matches go into the system prompt.
Level 2: the bodies of the best few that still fit the budget.
Level 3: anything else on demand: ``read_skill(name[, file])`` (the runtime's tool) opens any
skill's body or one of its files, from the same library version the prompt came from.
The token counter is injected, so the runtime passes its backend's ``count_tokens``.
"""

from __future__ import annotations

import difflib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..engine.errors import NotFound
from ..engine.prompts import render_prompt
from ..library_store.store import Library, Snapshot
from .examples import ExampleRetriever
from .format import (
    EXAMPLES_FILE,
    SKILL_FILE,
    Example,
    parse_examples,
    parse_skill_md,
)
from .index import Hit, LibraryIndex, SkillSource
from .loader import SKILLS_DIR, skill_names

TokenCounter = Callable[[str], int]


def approx_tokens(text: str) -> int:
    """A tokenizer-free estimate (4 characters a token), for callers without a backend."""
    return (len(text) + 3) // 4


@dataclass(frozen=True)
class SkillMatch:
    """A retrieved skill and its cosine similarity to the task."""

    name: str
    description: str
    score: float
    # The cosine similarity of the task to the nearest task of the skill's worked examples
    # (None: the skill keeps none); ``score`` is the higher of it and the description's.
    example: float | None = None


@dataclass(frozen=True)
class Retrieval:
    """What ``SkillRetriever.retrieve`` put in front of the model, for the prompt and the trace.

    ``shown``: skills listed by name and description; ``with_body``: those whose full body was
    included too; ``matches``: everything retrieved, in rank order, shown or not.
    """

    prompt: str
    version: str
    matches: tuple[SkillMatch, ...] = ()
    shown: tuple[str, ...] = ()
    with_body: tuple[str, ...] = ()
    tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["matches"] = [asdict(m) for m in self.matches]
        d["shown"], d["with_body"] = list(self.shown), list(self.with_body)
        return d


def skill_body(snapshot: Snapshot, name: str) -> str:
    """A skill's instructions (``SKILL.md`` without front matter)."""
    path = f"{SKILLS_DIR}/{name}/{SKILL_FILE}"
    text = snapshot.read_text(path)
    parsed = parse_skill_md(text, path=path, folder=name)
    return parsed.skill.body if parsed.skill is not None else text


def names_any(text: str, names: Sequence[str]) -> bool:
    """Whether ``text`` names one of ``names`` as a whole word (``convert_units``, not
    ``convert_units_v2``)."""
    return any(re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text) for n in names if n)


def without_lines_naming(body: str, names: Sequence[str]) -> str:
    """``body`` without the lines that name one of ``names``: what a skill says about tools a
    host cannot offer (a chat completion runs none), so the model is not told to call them."""
    if not names:
        return body
    return "\n".join(line for line in body.split("\n") if not names_any(line, names))


def read_skill(snapshot: Snapshot, name: str, file: str | None = None) -> str:
    """What the ``read_skill`` tool returns: a skill's body and its file list, or one file.

    A wrong name or file raises ``NotFound`` whose hint lists what exists.
    """
    unit = snapshot.unit(f"{SKILLS_DIR}/{name}")
    if not unit:
        known = skill_names(snapshot)
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = (f"did you mean {', '.join(close)}? " if close else "") + \
            f"available skills: {', '.join(known) if known else 'none'}"
        raise NotFound(f"no skill named {name!r}", hint=hint)
    prefix = f"{SKILLS_DIR}/{name}/"
    rel_files = sorted(p[len(prefix):] for p in unit if p != prefix + SKILL_FILE)
    if file is None or file in ("", SKILL_FILE):
        body = skill_body(snapshot, name)
        if rel_files:
            body = body.rstrip("\n") + "\n\nFiles in this skill: " + ", ".join(rel_files) + "\n"
        return body
    rel = file.removeprefix(prefix).lstrip("/")
    if rel not in rel_files:
        raise NotFound(f"skill {name!r} has no file {file!r}",
                       hint=f"its files: {', '.join(rel_files) if rel_files else 'none'}")
    data = snapshot.read_bytes(prefix + rel)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return f"({rel} is a binary file of {len(data)} bytes and cannot be shown as text)"


class SkillRetriever:
    """Top-k skills for a task, packed into ``budget_tokens`` with progressive disclosure.

    ``min_score`` drops matches whose cosine similarity is below it (None keeps all k).
    ``template`` is the prompt the list is rendered with (``engine/prompts/<template>.md``, with
    ``$skills`` and ``$bodies``): ``skills_retrieved_chat`` for a plain chat completion, where
    there is no ``read_skill`` tool to point at.
    """

    def __init__(self, library: Library, index: LibraryIndex | None = None, *,
                 count_tokens: TokenCounter | None = None, k: int = 5,
                 budget_tokens: int = 1500, max_bodies: int = 2,
                 min_score: float | None = None, template: str = "skills_retrieved") -> None:
        self.library = library
        self.template = template
        self.index = index or LibraryIndex(library)
        self.count_tokens = count_tokens or approx_tokens
        self.k = k
        self.budget_tokens = budget_tokens
        self.max_bodies = max_bodies
        self.min_score = min_score
        self.max_pinned = 4
        self._pinned: dict[str, LibraryIndex] = {}
        self._bodies: OrderedDict[str, str] = OrderedDict()  # SKILL.md hash -> body
        self._lock = threading.Lock()
        self._examples: ExampleRetriever | None = None  # built on first use
        self._example_files: dict[str, list[Example]] = {}  # examples.md hash -> examples

    def search(self, task: str | None, *, snapshot: Snapshot | None = None, k: int | None = None,
               query_vector: np.ndarray | None = None,
               floor: bool = True) -> list[SkillMatch]:
        """The ``k`` skills nearest to ``task`` in ``snapshot`` (current version by default),
        those under ``min_score`` left out unless ``floor=False``."""
        snap = snapshot or self.library.snapshot()
        index = self._index_for(snap)
        index.ensure(snap)
        vector = query_vector if query_vector is not None else index.embed_query(task or "")
        hits = index.query(vector, kind="skill", k=k or self.k)
        matches = [m for m in (self._match(snap, h) for h in hits) if m is not None]
        if task:
            matches = self._through_examples(snap, task, matches)
        return [m for m in matches
                if not floor or self.min_score is None or m.score >= self.min_score]

    def _through_examples(self, snap: Snapshot, task: str, matches: list[SkillMatch]
                          ) -> list[SkillMatch]:
        """A skill that keeps worked examples also scores as its nearest example's task: a
        generic description ("word problems that add quantities") sits far from any one task,
        while a task of the same kind as one the skill was verified on sits close to it
        (measured: 0.64-0.98 for a BIG-bench family's tasks against two of its train tasks,
        at most 0.53 across families and 0.34 for GSM8K or chit-chat; see
        benchmarks/bench_skill_threshold.py). Re-ranked by the new scores."""
        out = []
        for m in matches:
            path = f"{SKILLS_DIR}/{m.name}/{EXAMPLES_FILE}"
            if snap.exists(path):
                best = self._example_score(snap, path, task)
                m = SkillMatch(m.name, m.description, max(m.score, best), best)
            out.append(m)
        return sorted(out, key=lambda m: -m.score)

    def _example_score(self, snap: Snapshot, path: str, task: str) -> float:
        digest = snap.hash_of(path) or path
        with self._lock:
            if self._examples is None:
                self._examples = ExampleRetriever(self.index.embedder)
            examples = self._example_files.get(digest)
        if examples is None:
            examples = parse_examples(snap.read_text(path), path=path)[0]
            with self._lock:
                if len(self._example_files) > 256:
                    self._example_files.clear()
                self._example_files[digest] = examples
        ranked = self._examples.rank(task, examples)
        return ranked[0][1] if ranked else 0.0

    def _index_for(self, snap: Snapshot) -> LibraryIndex:
        """The shared index follows the current version; any other version (pinned for an
        eval, or a candidate's preview) gets a pinned index of its own, kept for reuse."""
        if snap.root == self.library.snapshot().root:
            return self.index
        with self._lock:
            index = self._pinned.pop(snap.root, None) or self.index.pinned(snap)
            self._pinned[snap.root] = index  # most recently used last
            while len(self._pinned) > self.max_pinned:
                self._pinned.pop(next(iter(self._pinned))).close()
        return index

    def close(self) -> None:
        """Close the pinned indexes this retriever opened (the shared index is the caller's)."""
        with self._lock:
            for index in self._pinned.values():
                index.close()
            self._pinned.clear()

    def _match(self, snap: Snapshot, hit: Hit) -> SkillMatch | None:
        # Trust the index only for the version it was built from: check the content hash.
        path = f"{SKILLS_DIR}/{hit.key}/{SKILL_FILE}"
        digest = snap.hash_of(path)
        if digest is None:
            return None
        if digest == hit.hash and "description" in hit.metadata:
            return SkillMatch(hit.key, str(hit.metadata["description"]), hit.score)
        doc = SkillSource().document(snap, hit.key)
        return None if doc is None else SkillMatch(hit.key, doc.metadata["description"],
                                                   hit.score)

    def retrieve(self, task: str, *, snapshot: Snapshot | None = None, k: int | None = None,
                 budget_tokens: int | None = None, max_bodies: int | None = None,
                 query_vector: np.ndarray | None = None,
                 unoffered: Mapping[str, Sequence[str]] | None = None) -> Retrieval:
        """The skills prompt for ``task``. Pass ``query_vector`` to skip embedding the task.
        ``unoffered``: skill -> names (its tools) this host cannot offer; the lines of its
        body that name one are left out (``without_lines_naming``)."""
        snap = snapshot or self.library.snapshot()
        budget = self.budget_tokens if budget_tokens is None else budget_tokens
        bodies_max = self.max_bodies if max_bodies is None else max_bodies
        ranked = self.search(task, snapshot=snap, k=k, query_vector=query_vector, floor=False)
        # Under the floor a skill is not shown, but the trace still records its score: it
        # says why nothing was injected.
        matches = [m for m in ranked if self.min_score is None or m.score >= self.min_score]
        entries = [render_prompt("skills_entry.yaml#entry", name=m.name,
                                 description=" ".join(m.description.split())) for m in matches]

        def render(n: int, bodies: Sequence[str]) -> str:
            return render_prompt(self.template, skills="\n".join(entries[:n]),
                                 bodies="\n".join(bodies)).rstrip() + "\n"

        n = len(entries)
        while n > 0 and self.count_tokens(render(n, [])) > budget:
            n -= 1  # the weakest matches go first
        if n == 0:
            return Retrieval(prompt="", version=snap.id, matches=tuple(ranked))
        bodies: list[str] = []
        with_body: list[str] = []
        for m in matches[:n]:
            if len(with_body) >= bodies_max:
                break
            body = without_lines_naming(self._body(snap, m.name),
                                        (unoffered or {}).get(m.name, ()))
            section = render_prompt("skills_entry.yaml#body", name=m.name, body=body)
            if self.count_tokens(render(n, bodies + [section])) <= budget:
                bodies.append(section)
                with_body.append(m.name)
        prompt = render(n, bodies)
        return Retrieval(prompt=prompt, version=snap.id, matches=tuple(ranked),
                         shown=tuple(m.name for m in matches[:n]), with_body=tuple(with_body),
                         tokens=self.count_tokens(prompt))

    def _body(self, snap: Snapshot, name: str) -> str:
        """A skill's stripped body, parsed once per file content (keyed by its hash): parsing
        the front matter was a tenth of a chat request's retrieval time."""
        digest = snap.hash_of(f"{SKILLS_DIR}/{name}/{SKILL_FILE}")
        with self._lock:
            body = self._bodies.get(digest) if digest else None
            if body is not None and digest:
                self._bodies.move_to_end(digest)
                return body
        body = skill_body(snap, name).strip()
        if digest:
            with self._lock:
                self._bodies[digest] = body
                while len(self._bodies) > 256:
                    self._bodies.popitem(last=False)
        return body

    def read(self, name: str, file: str | None = None, *, version: str | None = None) -> str:
        """``read_skill`` against ``version`` (use ``Retrieval.version`` for consistency)."""
        return read_skill(self.library.snapshot(version), name, file)
