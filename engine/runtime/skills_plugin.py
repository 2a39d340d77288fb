"""Skills in the runtime: retrieve them into the system prompt, give the agent ``read_skill``
and the library's learned tools (each beside the skill that says when to call it; they run
only in the sandbox, see ``whetstone.engine.runtime.library_tools``).

The plugin reads one library snapshot per run: a pinned version (``version=``, an eval of an
old version or of an uncommitted candidate) or the current version, re-resolved when the
library moves, so a long-lived server follows new versions. Each trace records the version, the
skills shown (and those shown with their body), the skills the agent opened and the learned
tools offered.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...tools.base import Tool
from ...tools.images import ImageFiles
from ..errors import NotFound
from ..types import ToolSpec
from .plugins import Guidance, MethodEnv, Plugin, ToolOffer

if TYPE_CHECKING:
    from ...library_store.embeddings import Embedder
    from ...library_store.store import Library, Snapshot
    from ...skills.examples import ExampleRetriever
    from ...skills.format import Example
    from ...skills.retrieval import SkillRetriever
    from ...tools.sandbox import Sandbox
    from .library_tools import LibraryTools
    from .state import AgentContext, AgentState

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


# The lowest cosine score a skill needs to be shown (see SkillsConfig).
DEFAULT_MIN_SCORE = 0.25


@dataclass(frozen=True)
class SkillsConfig:
    """How many skills a run is shown (``k``), how many with their whole body, the lowest
    retrieval score (cosine) a skill needs to be shown at all, and whether the library's
    learned tools are offered (with the skills that hold them).

    ``min_score`` 0.25 is measured (``benchmarks/bench_skill_threshold.py``, int8 MiniLM, the
    34-skill fixture library): the right skill stays in the top 3 for 0.886 of the labelled
    queries (1.000 with no floor), while 1 of 30 unrelated prompts ("say hello world",
    trivia, poems) gets a skill (every one of them with no floor; 0.20 lets in 6 of 30) and a
    question whose own skill is missing gets a neighbour's in 0.26 of cases (0.63 at 0.20).
    ``None`` keeps the top ``k`` whatever their score. A skill with worked examples is also
    matched through its examples' tasks (see ``whetstone.skills.index``), which a task of the same kind
    matches far above any floor. With an empty library, or nothing above the floor, nothing
    is injected and ``read_skill`` is not offered.

    ``examples``: a skill shown with its body that keeps worked examples
    (``references/examples.md``) also shows the ``examples`` whose task is nearest to this
    one, in what the skills left of the budget (``whetstone.skills.examples``); with ``turns`` they go
    before the task as earlier exchanges (the example's task, then the model's first reply:
    a verified tool call, say) instead of a text block, which a small model copies more
    readily.

    ``require_tool_at``: when a skill shown with its body has learned tools and the task is at
    least this close to one of the skill's verified examples (their tasks: the cosine of the
    nearest), the run's first decision must call one of those tools (OpenAI's
    ``tool_choice="required"``, by prefilling the reply on backends that can; elsewhere they
    are offered as usual). 0.6 is measured on the BIG-bench fixture skills
    (``benchmarks/bench_skill_threshold.py --examples``): a family's test tasks score
    0.64-0.98 against two of its train tasks, other families at most 0.53, GSM8K and chit-chat
    at most 0.34. Left to choose, the 0.5B called a fitting tool on 0 of 8 multiple-choice
    tasks (it answers the letter it is asked for) and on 8 of 8 when required; a forced call
    that does not fit fails as a tool error the model then sees. None: never required."""

    k: int = 5
    max_bodies: int = 2
    min_score: float | None = DEFAULT_MIN_SCORE
    learned_tools: bool = True
    examples: int = 2  # worked examples shown, nearest first, from the skills shown with a body
    turns: bool = False  # show them as earlier chat turns instead of a text block
    require_tool_at: float | None = 0.6


class SkillsPlugin(Plugin):
    """Progressive disclosure of the library's skills (see ``whetstone.skills.retrieval``).

    ``offers_tools``: whether the host offers the learned tools of the skills it shows. None
    (the default) reads it from the run's toolbox: the agent holds them, the one-call hosts
    (a chat completion, the direct solver) hold none. A tool the host cannot offer is not
    promised: the lines of a shown skill that name it, and the worked examples that call
    it, are left out of the guidance (a model told of a tool it was not given writes calls
    nobody runs, or tells the user to use it). The MCP server, which lists the learned tools
    as its own, sets True.
    """

    name = "skills"
    config_class = SkillsConfig
    offers_tools: bool | None = None
    # The one-call hosts (a chat completion, the direct solver) show the skills whole and run
    # no tools: ``read_skill`` and the learned tools are what this method does without there.
    optional = frozenset({"tools"})

    @classmethod
    def build(cls, config: Any, env: MethodEnv) -> SkillsPlugin:
        """The skills for ``env.host``: how every host (the agent, the direct solver, chat
        mode, MCP, LangChain) gets them, so ``--method-config skills.examples=3`` means the
        same in each."""
        return cls.for_host(env.require_library("skills"), env.snapshot, config,
                            host=env.host, offers_tools=env.offers_tools)

    @classmethod
    def for_host(cls, library: Library, snapshot: Snapshot | None = None,
                 config: SkillsConfig | None = None, *, host: str = "agent",
                 offers_tools: bool | None = None, embedder: Embedder | None = None,
                 cache_size: int = 1024, embed_threads: int | None = 1) -> SkillsPlugin:
        """The skill injection of one host, built here and nowhere else.

        The agent lists the skills and opens them with ``read_skill``. A one-call host has no
        ``read_skill``: its retriever renders ``skills_retrieved_chat`` (the skills shown
        whole) and embeds queries through a ``CachedEmbedder`` of ``cache_size`` texts (the
        skills index's int8 embedder, ``skill_embedder``, or ``embedder``: a loaded model to
        share). ``embed_threads`` defaults to one thread: on a busy 2-core machine two
        threads spin for ~100 ms a query where one takes a few ms (benchmarks/bench_library.py).
        The plugin closes the index and retriever it built (``close``).
        """
        # lazy: numpy, yaml and 16 more of our modules, only for a library's skills
        from ...library_store.embed_cache import CachedEmbedder
        from ...library_store.embeddings import skill_embedder
        from ...skills.index import LibraryIndex
        from ...skills.retrieval import SkillRetriever

        cfg = config or SkillsConfig()
        retriever = None
        if host != "agent":
            cached = CachedEmbedder(embedder or skill_embedder(threads=embed_threads),
                                    maxsize=cache_size)
            retriever = SkillRetriever(library, LibraryIndex(library, cached), k=cfg.k,
                                       max_bodies=cfg.max_bodies, min_score=cfg.min_score,
                                       template="skills_retrieved_chat")
        plugin = cls(library, snapshot=snapshot, retriever=retriever, k=cfg.k,
                     max_bodies=cfg.max_bodies, min_score=cfg.min_score,
                     learned_tools=cfg.learned_tools, examples=cfg.examples, turns=cfg.turns,
                     require_tool_at=cfg.require_tool_at)
        plugin._owned = retriever is not None
        plugin.offers_tools = offers_tools
        return plugin

    def __init__(self, library: Library, *, snapshot: Snapshot | None = None,
                 retriever: SkillRetriever | None = None, k: int = 5,
                 max_bodies: int = 2, min_score: float | None = DEFAULT_MIN_SCORE,
                 learned_tools: bool = True, images: ImageFiles | None = None,
                 sandbox: Sandbox | None = None, examples: int = 2,
                 turns: bool = False, require_tool_at: float | None = 0.6) -> None:
        # lazy: numpy, yaml
        from ...library_store.embeddings import skill_embedder
        from ...skills.index import LibraryIndex
        from ...skills.retrieval import SkillRetriever

        self.library = library
        self.pinned = snapshot
        self.config = SkillsConfig(k=k, max_bodies=max_bodies, min_score=min_score,
                                   learned_tools=learned_tools, examples=examples, turns=turns,
                                   require_tool_at=require_tool_at)
        # Learned tools read images from the run's folder and write theirs there.
        self.images = images
        self.sandbox = sandbox
        self._tools: tuple[str, list[Tool], LibraryTools] | None = None
        # One thread per query embedding: on a busy 2-core box two threads spin and a query
        # takes ~900 ms instead of ~25 ms (bench_library); int8 ONNX when available.
        self.retriever = retriever or SkillRetriever(
            library, LibraryIndex(library, skill_embedder(threads=1)), k=k,
            max_bodies=max_bodies, min_score=min_score)
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = snapshot
        self._examples: ExampleRetriever | None = None
        self._parsed: dict[tuple[str, str], list[Example]] = {}  # (version, skill) -> examples
        self._owned = False  # whether close() closes the retriever and its index

    def cache_key(self) -> str | None:
        """For one library tree (its root hash) the same task and budget retrieve the same
        skills: a host may keep the guidance (``ChatAdapter``'s cache)."""
        return self.snapshot().root

    def close(self) -> None:
        if self._owned:
            self._owned = False
            self.retriever.close()
            self.retriever.index.close()

    def snapshot(self) -> Snapshot:
        """The pinned snapshot, or the current version (re-read when the library moved)."""
        if self.pinned is not None:
            return self.pinned
        with self._lock:
            current = self.library.current_id()
            if self._snapshot is None or self._snapshot.id != current:
                self._snapshot = self.library.snapshot(current)
            return self._snapshot

    def tools(self) -> list[Tool]:
        """``read_skill``, and the learned tools of the version this run reads (loaded once
        per version; a tool that fails its checks is left out, see ``learned_tools_report``)."""
        out = [Tool(READ_SKILL_SPEC, self._read)]
        if self.config.learned_tools:
            out += self._learned()[0]
        return out

    def _learned(self) -> tuple[list[Tool], LibraryTools]:
        # lazy: loads yaml and 14 more of our modules
        from .library_tools import library_tools

        snap = self.snapshot()
        with self._lock:
            if self._tools is None or self._tools[0] != snap.id:
                if self.images is None:
                    self.images = ImageFiles(self.library.scratch("tool-images"))
                tools, report = library_tools(snap, images=self.images, sandbox=self.sandbox)
                self._tools = (snap.id, tools, report)
            return self._tools[1], self._tools[2]

    def learned_tools_report(self) -> LibraryTools:
        """The learned tools of the version this run reads and the problems of the others."""
        return self._learned()[1]

    def offer(self, shown: Mapping[str, Any]) -> ToolOffer:
        """``read_skill`` and the learned tools of the skills listed, only when a skill was
        listed: offered with nothing to open, the embedded model called ``read_skill`` instead
        of answering (issue 19), and a learned tool comes with the skill that says when to
        call it. Required: the learned tools of the skills the task strongly matched
        (``require_tool_at``)."""
        listed = set(shown.get("shown") or ())
        if not listed:
            return ToolOffer()
        defs = self._learned()[1].definitions if self.config.learned_tools else []
        strong = set(shown.get("strong") or ())
        return ToolOffer((READ_SKILL_SPEC.name, *(d.name for d in defs if d.skill in listed)),
                         tuple(d.name for d in defs if d.skill in strong))

    def _read(self, args: Mapping[str, Any]) -> str:
        # lazy: loads numpy, yaml and 18 more of our modules
        from ...skills.retrieval import read_skill

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
        unoffered = self._unoffered(ctx)
        r = self.retriever.retrieve(task, snapshot=snap, budget_tokens=budget_tokens,
                                    unoffered=unoffered)
        meta: dict[str, Any] = {"version": r.version, "shown": list(r.shown),
                                "with_body": list(r.with_body),
                                "matches": [[m.name, round(m.score, 4)] for m in r.matches]}
        at = self.config.require_tool_at
        strong = [m.name for m in r.matches if m.name in r.with_body and at is not None
                  and m.example is not None and m.example >= at]
        if strong:
            meta["strong"] = strong
        prompt = r.prompt
        turns: tuple[dict[str, str], ...] = ()
        if self.config.examples > 0 and r.with_body:
            left = budget_tokens - (ctx.backend.count_tokens(prompt) if prompt else 0)
            shown = self._nearest_examples(snap, r.with_body, task, left, ctx, unoffered)
            if shown is not None and (shown.text or shown.turns):
                if shown.text:
                    prompt = prompt.rstrip("\n") + "\n\n" + shown.text
                turns = shown.turns
                meta["examples"] = list(shown.trace_ids)
        # The retrieved prompt carries its own "# Skills" heading; drop ours.
        return Guidance("", prompt, meta, library_version=snap.id, turns=turns)

    def _unoffered(self, ctx: AgentContext) -> dict[str, list[str]]:
        """Skill -> its learned tools this host does not offer (``offers_tools``)."""
        if self.offers_tools and self.config.learned_tools:
            return {}
        offered: set[str] = set()  # learned_tools off: offered nowhere
        if self.config.learned_tools and self.offers_tools is None:
            offered = set(ctx.toolbox.tools)
        out: dict[str, list[str]] = {}
        for d in self._learned()[1].definitions:
            if d.name not in offered:
                out.setdefault(d.skill, []).append(d.name)
        return out

    def _nearest_examples(self, snap: Snapshot, skills: tuple[str, ...], task: str,
                          budget: int, ctx: AgentContext,
                          unoffered: Mapping[str, list[str]] | None = None) -> Any:
        """The nearest worked examples of ``skills`` within ``budget`` (None: none kept);
        an example that calls a tool of ``unoffered`` is not shown."""
        # lazy: numpy, yaml
        from ...skills.examples import ExampleRetriever
        from ...skills.format import EXAMPLES_FILE, parse_examples
        from ...skills.retrieval import names_any

        pool: list[Example] = []
        for name in skills:
            key = (snap.id, name)
            if key not in self._parsed:
                if len(self._parsed) > 256:  # a long-lived server moves through versions
                    self._parsed.clear()
                path = f"skills/{name}/{EXAMPLES_FILE}"
                self._parsed[key] = parse_examples(snap.read_text(path), path=path)[0] \
                    if snap.exists(path) else []
            hidden = (unoffered or {}).get(name, [])
            pool += [e for e in self._parsed[key] if not names_any(e.solution, hidden)]
        if not pool or budget <= 0:
            return None
        with self._lock:
            if self._examples is None:
                self._examples = ExampleRetriever(self.retriever.index.embedder)
        return self._examples.nearest(task, pool, k=self.config.examples, budget_tokens=budget,
                                      count_tokens=ctx.backend.count_tokens,
                                      heading="Worked examples", as_turns=self.config.turns)

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
        meta: dict[str, Any] = {"opened": opened}
        if self.config.learned_tools and self._tools is not None and self._tools[1]:
            meta["learned_tools"] = [t.name for t in self._tools[1]]
        return meta
