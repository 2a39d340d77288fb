"""Retrieval memory: the baseline that keeps the model's own verified runs as demonstrations.

No analyst, no advice: the way ExpeL's insight-free memory and DSPy's bootstrapped few-shot
adapt a frozen model. Two halves under one name, like NLPG:

- the **evolver** ``memory``: ``fit`` keeps every training run the scorer verifies
  (``whetstone.engine.evaluation.verified_examples``) as a worked example in ``memory/<name>.md`` (the examples
  format of ``whetstone.skills.format``, each example under the id of the trace it came from), merged
  with the examples already there (one per task, the cheaper solution kept), at most
  ``max_examples``;
- the **runtime method** ``memory``: for each task, the ``k`` examples whose task embedding is
  nearest (``whetstone.skills.examples``, the query embedder) go in the system message as
  demonstrations, within the guidance token budget (or, with ``turns``, as earlier exchanges
  of the conversation: the task, then the model's first reply); the trace records which
  (``meta["memory"]``).

The evolver names the runtime method (``runtime_methods``), so the gate scores both libraries
with the demonstrations on.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ....skills.format import NAME_RE, Example, parse_examples, render_examples
from ...errors import ConfigError
from ...evaluation.verified_examples import ExampleStats, examples_from_traces
from ...runtime.plugins import Guidance, MethodEnv, Plugin
from ...types import Trace
from ..base import EvolveContext, LibraryPatch, knob, library_texts
from .files import MEMORY_DIR

if TYPE_CHECKING:
    from ....library_store.embeddings import Embedder
    from ....library_store.store import Library, Snapshot
    from ....skills.examples import ExampleRetriever
    from ...backends.base import Backend
    from ...runtime.state import AgentContext

_INTRO = ("Runs of this model that the scorer verified, kept as demonstrations by the memory "
          "method (each under the id of its trace).")


def memory_path(name: str) -> str:
    """``memory/<name>.md``; ``ConfigError`` for a name the library cannot hold."""
    if not NAME_RE.fullmatch(name):
        raise ConfigError(f"memory name {name!r} is not lower-case letters, digits and hyphens",
                          hint="e.g. --name gsm8k")
    return f"{MEMORY_DIR}/{name}.md"


@dataclass(frozen=True)
class MemoryConfig:
    """Knobs of the memory evolver."""

    name: str = knob("demonstrations", help="The memory file: memory/<name>.md.")
    max_examples: int = knob(200, help="Most examples the file keeps (oldest kept first).",
                             min=1)
    success_threshold: float = knob(1.0, help="A run scoring at least this is kept.")
    replace: bool = knob(False, help="Start the file over instead of adding to it.")
    form: str = knob("all", help="What of a verified run is kept: all (its output as written) "
                     "or program (only the program that printed the answer, and its output).",
                     choices=("all", "program"))
    seed: int = knob(0, cli=False)


class Memory:
    """Keep the scorer-verified training runs as demonstrations (no analyst)."""

    name = "memory"
    config_class = MemoryConfig
    runtime_methods = ("memory",)

    def __init__(self, config: MemoryConfig) -> None:
        self.config = config

    def fit(self, traces: Sequence[Trace], library: Snapshot | Mapping[str, str],
            analyst: Backend, labels: Mapping[str, str] | None = None, *,
            context: EvolveContext | None = None) -> LibraryPatch:
        """The memory file with every verified run of ``traces`` added (``analyst`` is not
        asked: the baseline learns nothing but the runs themselves)."""
        cfg = self.config
        path = memory_path(cfg.name)
        stats = ExampleStats()
        labelled = [t.with_(label=labels[t.id]) if labels and t.id in labels else t
                    for t in traces]
        fresh = examples_from_traces(labelled, cfg.success_threshold, stats, cfg.form)
        old_text = library_texts(library, path).get(path)
        old = [] if cfg.replace or old_text is None else parse_examples(old_text, path=path)[0]
        tasks = {ex.task for ex in old}
        merged = old + [ex for ex in fresh if ex.task not in tasks]
        kept = merged[:cfg.max_examples]
        text = render_examples(kept, title=f"Memory: {cfg.name}", intro=_INTRO)
        changes: dict[str, str | None] = {} if text == old_text or not kept else {path: text}
        added = [ex.trace_id for ex in kept if ex.task not in tasks]
        return LibraryPatch(
            method=self.name, changes=changes,
            message=f"memory {cfg.name}: {len(added)} demonstrations added "
                    f"({len(kept)} kept) from {len(traces)} runs",
            details={"file": path, "added": added, "kept": len(kept),
                     "dropped_over_cap": len(merged) - len(kept), "examples": stats.to_dict()},
            costs={"analyst_calls": 0})


@dataclass(frozen=True)
class MemoryRunConfig:
    """Knobs of the memory runtime method."""

    k: int = knob(3, help="Demonstrations shown per task (the nearest first).", min=1)
    name: str = knob("", help="Read only memory/<name>.md (empty: every memory file).")
    share: float = knob(1.0, help="Share of the guidance token budget it may use.", min=0.0)
    turns: bool = knob(False, help="Show the demonstrations as earlier chat turns (the task as "
                       "the user's turn, the model's first reply as the assistant's; DSPy's "
                       "ChatAdapter style) instead of text in the system message.")


class MemoryPlugin(Plugin):
    """Show the k nearest verified runs as demonstrations (retrieval-memory baseline)."""

    name = "memory"
    config_class = MemoryRunConfig

    @classmethod
    def build(cls, config: Any, env: MethodEnv) -> MemoryPlugin:
        return cls(env.require_library("memory"), config or MemoryRunConfig(),
                   snapshot=env.snapshot)

    def __init__(self, library: Library, config: MemoryRunConfig | None = None, *,
                 snapshot: Snapshot | None = None, embedder: Embedder | None = None) -> None:
        from ....skills.examples import ExampleRetriever  # lazy: loads numpy

        if embedder is None:
            from ....library_store.embeddings import query_embedder  # lazy: loads numpy

            embedder = query_embedder(threads=1)
        self.library = library
        self.pinned = snapshot
        self.config = config or MemoryRunConfig()
        self.retriever: ExampleRetriever = ExampleRetriever(embedder)
        self._cache: tuple[str, list[Example]] | None = None
        self._lock = threading.Lock()

    def examples(self) -> tuple[str, list[Example]]:
        """The version read and its demonstrations (parsed once per version)."""
        snap = self.pinned or self.library.snapshot()
        with self._lock:
            if self._cache is None or self._cache[0] != snap.id:
                prefix = memory_path(self.config.name) if self.config.name else f"{MEMORY_DIR}/"
                found: list[Example] = []
                for path, text in sorted(snap.texts(prefix).items()):
                    found += parse_examples(text, path=path)[0]
                self._cache = (snap.id, found)
            return self._cache

    def guidance(self, task: str, ctx: AgentContext, budget_tokens: int) -> Guidance | None:
        version, examples = self.examples()
        if not examples:
            return Guidance("", "", {"shown": [], "available": 0}, library_version=version)
        shown = self.retriever.nearest(
            task, examples, k=self.config.k, budget_tokens=int(budget_tokens * self.config.share),
            count_tokens=ctx.backend.count_tokens, heading="Worked examples",
            as_turns=self.config.turns)
        return Guidance("", shown.text, {"shown": list(shown.trace_ids),
                                         "scores": list(shown.scores),
                                         "available": len(examples), "tokens": shown.tokens},
                        library_version=version, turns=shown.turns)


__all__ = ["Memory", "MemoryConfig", "MemoryPlugin", "MemoryRunConfig", "memory_path"]
