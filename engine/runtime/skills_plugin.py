"""Skills in the runtime: retrieve them into the system prompt and give the agent ``read_skill``.

The plugin reads one library snapshot per run: a pinned version (``version=``, an eval of an
old version or of an uncommitted candidate) or the current version, re-resolved when the
library moves, so a long-lived server follows new versions. Each trace records the version, the
skills shown (and those shown with their body) and the skills the agent opened.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.errors import ConfigError, NotFound
from engine.runtime.plugins import Guidance, MethodEnv, Plugin
from engine.types import ToolSpec
from tools.base import Tool

if TYPE_CHECKING:
    from engine.runtime.state import AgentContext, AgentState
    from library_store.store import Library, Snapshot
    from skills.retrieval import SkillRetriever

READ_SKILL_SPEC = ToolSpec(
    name="read_skill",
    description="Open a skill listed under 'Skills': its full instructions, or one of its files "
                "(e.g. references/guide.md) when 'file' is given.",
    parameters={
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "The skill's name."},
            "file": {"type": "string", "description": "Optional file inside the skill."},
        },
        "required": ["name"],
    },
    source="builtin:read_skill",
)


@dataclass(frozen=True)
class SkillsConfig:
    """How many skills a run is shown (``k``), how many with their whole body, and the lowest
    retrieval score kept (None: keep the top ``k`` whatever their score).

    No floor by default: measured with all-MiniLM-L6-v2, GSM8K questions score 0.04-0.24
    against an evolved ``word-math`` skill's draft description and unrelated questions up to
    0.13 against any skill, so a floor that drops the unrelated ones also hides evolved skills
    from most of the tasks they were learned on. With an empty library nothing is injected
    and ``read_skill`` is not offered."""

    k: int = 5
    max_bodies: int = 2
    min_score: float | None = None


class SkillsPlugin(Plugin):
    """Progressive disclosure of the library's skills (see ``skills.retrieval``)."""

    name = "skills"
    config_class = SkillsConfig

    @classmethod
    def build(cls, config: Any, env: MethodEnv) -> SkillsPlugin:
        if env.library is None:
            raise ConfigError("the skills method needs a library",
                              hint="build it through Engine, which opens the library")
        cfg = config or SkillsConfig()
        return cls(env.library, snapshot=env.snapshot, k=cfg.k, max_bodies=cfg.max_bodies,
                   min_score=cfg.min_score)

    def __init__(self, library: Library, *, snapshot: Snapshot | None = None,
                 retriever: SkillRetriever | None = None, k: int = 5,
                 max_bodies: int = 2, min_score: float | None = None) -> None:
        from library_store.embeddings import skill_embedder
        from skills.index import LibraryIndex
        from skills.retrieval import SkillRetriever

        self.library = library
        self.pinned = snapshot
        self.config = SkillsConfig(k=k, max_bodies=max_bodies, min_score=min_score)
        # One thread per query embedding: on a busy 2-core box two threads spin and a query
        # takes ~900 ms instead of ~25 ms (bench_library); int8 ONNX when available.
        self.retriever = retriever or SkillRetriever(
            library, LibraryIndex(library, skill_embedder(threads=1)), k=k,
            max_bodies=max_bodies, min_score=min_score)
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = snapshot

    def snapshot(self) -> Snapshot:
        """The pinned snapshot, or the current version (re-read when the library moved)."""
        if self.pinned is not None:
            return self.pinned
        with self._lock:
            current = self.library.current_id()
            if self._snapshot is None or self._snapshot.id != current:
                self._snapshot = self.library.snapshot(current)
            return self._snapshot

    def has_skills(self) -> bool:
        return self.snapshot().has("skills/")

    def tools(self) -> list[Tool]:
        return [Tool(READ_SKILL_SPEC, self._read)]

    def run_tools(self, shown: Mapping[str, Any]) -> list[str]:
        """``read_skill`` only when a skill was listed: offered with nothing to open, the
        embedded model called it instead of answering (issue 19)."""
        return [READ_SKILL_SPEC.name] if shown.get("shown") else []

    def _read(self, args: Mapping[str, Any]) -> str:
        from skills.retrieval import read_skill

        name = str(args.get("name") or "").strip()
        if not name:
            raise NotFound("read_skill needs a skill 'name'",
                           hint="use a name listed under 'Skills' in the instructions")
        file = args.get("file")
        return read_skill(self.snapshot(), name, str(file) if file else None)

    def guidance(self, task: str, ctx: AgentContext, budget_tokens: int) -> Guidance | None:
        snap = self.snapshot()
        if not snap.has("skills/"):
            return Guidance("Skills", "", {"version": snap.id, "shown": [], "with_body": []},
                            library_version=snap.id)
        r = self.retriever.retrieve(task, snapshot=snap, budget_tokens=budget_tokens)
        meta = {"version": r.version, "shown": list(r.shown), "with_body": list(r.with_body),
                "matches": [[m.name, round(m.score, 4)] for m in r.matches]}
        # The retrieved prompt carries its own "# Skills" heading; drop ours.
        return Guidance("", r.prompt, meta, library_version=snap.id)

    def finish_meta(self, state: AgentState) -> Mapping[str, Any]:
        opened = []
        for s in state.get("steps") or []:
            if s["kind"] == "act" and s["input"].get("tool") == "read_skill" and not s.get("error"):
                args = s["input"].get("arguments")
                if isinstance(args, Mapping):
                    opened.append(str(args.get("name")) + (f"/{args['file']}"
                                                           if args.get("file") else ""))
                else:
                    opened.append(str(args))
        return {"opened": opened}
