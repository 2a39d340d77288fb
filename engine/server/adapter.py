"""The chat adapter: put the library in front of one chat completion, with no agent loop.

``ChatAdapter`` takes a ``Request`` in the OpenAI chat format, asks the runtime methods (skills
now, policy notes later) for guidance on the conversation and injects it into the system message
within a token budget: appended to the first system message, or as a new one at the front.
The server, ``Engine.chat`` and ``Engine.wrap``'s client all adapt through it; what an exchange
becomes afterwards (its trace, feedback) is ``exchange.py``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from whetstone.engine.errors import ConfigError
from whetstone.engine.methods.base import make_config
from whetstone.engine.runtime.plugins import Collected, Plugin, collect_guidance
from whetstone.engine.runtime.skills_plugin import SkillsConfig, SkillsPlugin
from whetstone.engine.runtime.state import AgentContext, RunConfig
from whetstone.engine.server.embed_cache import CachedEmbedder, normalise
from whetstone.engine.types import Message, Request
from whetstone.library_store.embeddings import skill_embedder
from whetstone.tools.base import Toolbox

if TYPE_CHECKING:
    from whetstone.engine.backends.base import Backend
    from whetstone.library_store.embeddings import Embedder
    from whetstone.library_store.store import Library, Snapshot

_SYSTEM_ROLES = ("system", "developer")
MAX_BUDGET_TOKENS = 32_000
# Sent by a wrapped client (``Engine.wrap``) that applied its library to the request: a
# Whetstone server that gets it passes the request through unadapted, so a client wrapped
# around a server's URL never has guidance put in twice. Other servers ignore the header.
ADAPTED_HEADER = "X-Whetstone-Adapted"


class Closeable(Protocol):
    def close(self) -> None: ...


@runtime_checkable
class CacheKeyed(Protocol):
    """A plugin whose guidance is a pure function of (its state, task, budget): ``cache_key``
    names that state (a library tree hash), or None when it must not be cached now."""

    def cache_key(self) -> str | None: ...


# --- per-request switches --------------------------------------------------------------------

@dataclass(frozen=True)
class ChatSwitches:
    """What one request asks of Whetstone (``extra_body={"whetstone": {...}}``).

    ``library``: inject guidance (default on); ``record``: store the exchange as a trace;
    ``budget_tokens``: the guidance budget for this request (default: the adapter's);
    ``verify``: check the reply for hallucination with the installed verifier and return
    the report.
    """

    library: bool = True
    record: bool = True
    budget_tokens: int | None = None
    verify: bool = False

    @classmethod
    def from_body(cls, value: Any) -> ChatSwitches:
        """Parse the ``whetstone`` object of a request body (None: the defaults).

        Raises ``ConfigError`` naming the bad key, so a typo is not silently ignored.
        """
        if value is None:
            return cls()
        known = "library (bool), record (bool), budget_tokens (int), verify (bool)"
        if not isinstance(value, Mapping):
            raise ConfigError(f"'whetstone' must be an object, got {type(value).__name__}",
                              hint=f'e.g. {{"whetstone": {{"library": false}}}}; keys: {known}')
        unknown = sorted(set(value) - {"library", "record", "budget_tokens", "verify"})
        if unknown:
            raise ConfigError(f"unknown 'whetstone' option(s): {', '.join(map(repr, unknown))}",
                              hint=f"known: {known}")
        for key in ("library", "record", "verify"):
            if key in value and not isinstance(value[key], bool):
                raise ConfigError(f"'whetstone.{key}' must be true or false, "
                                  f"got {value[key]!r}")
        budget = value.get("budget_tokens")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)
                                   or not 0 <= budget <= MAX_BUDGET_TOKENS):
            raise ConfigError(f"'whetstone.budget_tokens' must be an integer from 0 to "
                              f"{MAX_BUDGET_TOKENS}, got {budget!r}")
        return cls(library=value.get("library", True), record=value.get("record", True),
                   budget_tokens=budget, verify=value.get("verify", False))


# --- the conversation ------------------------------------------------------------------------

def last_user_text(messages: Sequence[Message]) -> str:
    """The text of the last user message ('' when there is none)."""
    for m in reversed(messages):
        if m.role == "user":
            return m.text
    return ""


def chat_query(messages: Sequence[Message], turns: int = 1, max_chars: int = 2000) -> str:
    """What guidance is retrieved for: the last ``turns`` user messages, newest last.

    The last user message stays the query through a tool-calling exchange (assistant tool calls
    and tool results come after it), so every turn of one task sees the same guidance.
    """
    texts = [m.text.strip() for m in messages if m.role == "user" and m.text.strip()]
    query = "\n".join(texts[-max(1, turns):])
    return query[-max_chars:] if len(query) > max_chars else query


def inject_guidance(messages: Sequence[Message], text: str) -> tuple[Message, ...]:
    """``messages`` with ``text`` appended to the first system message (or a new one first)."""
    if not text:
        return tuple(messages)
    out = list(messages)
    for i, m in enumerate(out):
        if m.role == "system":
            if isinstance(m.content, str):
                content: Any = (m.content.rstrip() + "\n\n" + text) if m.content.strip() else text
            else:
                content = (*m.content, {"type": "text", "text": "\n\n" + text})
            out[i] = Message(role="system", content=content, name=m.name)
            return tuple(out)
    return (Message(role="system", content=text), *out)


def inject_guidance_dicts(messages: Sequence[Mapping[str, Any]], text: str
                          ) -> list[Mapping[str, Any]]:
    """The same on OpenAI message dicts (``Engine.wrap``): only the system message is copied
    and changed; every other message is passed on as the caller built it."""
    out = list(messages)
    if not text:
        return out
    for i, m in enumerate(out):
        if m.get("role") in _SYSTEM_ROLES:
            content = m.get("content")
            if isinstance(content, str) or content is None:
                content = (content.rstrip() + "\n\n" + text) if content and content.strip() \
                    else text
            else:
                content = [*content, {"type": "text", "text": "\n\n" + text}]
            out[i] = {**m, "content": content}
            return out
    return [{"role": "system", "content": text}, *out]


def inject_turns(messages: Sequence[Message], turns: Sequence[Mapping[str, str]]
                 ) -> tuple[Message, ...]:
    """``messages`` with demonstration ``turns`` after the leading system messages."""
    if not turns:
        return tuple(messages)
    at = next((i for i, m in enumerate(messages) if m.role != "system"), len(messages))
    demos = [Message(role=t["role"], content=t["content"]) for t in turns]  # type: ignore[arg-type]
    return (*messages[:at], *demos, *messages[at:])


def inject_turns_dicts(messages: Sequence[Mapping[str, Any]], turns: Sequence[Mapping[str, str]]
                       ) -> list[Mapping[str, Any]]:
    """The same on OpenAI message dicts (``Engine.wrap``)."""
    out = list(messages)
    at = next((i for i, m in enumerate(out) if m.get("role") not in _SYSTEM_ROLES), len(out))
    return [*out[:at], *({"role": t["role"], "content": t["content"]} for t in turns), *out[at:]]


@dataclass(frozen=True)
class Adapted:
    """A request after adaptation, with what was injected and where it came from.

    ``meta`` holds each plugin's facts under its name (``skills``: version, shown, with_body);
    ``applied`` is False when the library was switched off for this request.
    """

    request: Request
    query: str = ""
    guidance: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    library_version: str | None = None
    applied: bool = False
    duration_s: float = 0.0
    turns: tuple[Mapping[str, str], ...] = ()  # demonstrations put before the conversation

    @property
    def skills_shown(self) -> list[str]:
        return list((self.meta.get("skills") or {}).get("shown") or [])


# What one retrieval gave: guidance text, each plugin's meta, library version, demo turns.
_Guided = tuple[str, dict[str, Any], "str | None", tuple[Mapping[str, str], ...]]


class ChatAdapter:
    """Injects run-time guidance into chat requests. Thread-safe (the server calls it from a
    thread pool, since retrieval embeds the query).

    ``plugins`` give the guidance (``Plugin.guidance``); ``budget_tokens`` bounds it all,
    counted with the backend's tokenizer; ``version_of`` says which library version is current
    and ``version_info`` how that version came to be (its gate record; both for ``/health``);
    ``resources`` are closed by ``close``.

    When every plugin is ``CacheKeyed``, the last ``cache_size`` results are kept, keyed by the
    plugins' keys (library tree hashes), the query and the budget: a repeated question against
    an unchanged library gets the very guidance it got before, without embedding or searching
    (``cached`` serves it without leaving the event loop). A new library version changes the
    key, so nothing stale is served.
    """

    def __init__(self, plugins: Sequence[Plugin], backend: Backend, *,
                 budget_tokens: int = 1_200, query_turns: int = 1,
                 version_of: Callable[[], str | None] | None = None,
                 version_info: Callable[[str], Mapping[str, Any] | None] | None = None,
                 resources: Sequence[Closeable] = (), cache_size: int = 256) -> None:
        self.plugins = tuple(plugins)
        self.backend = backend
        self.budget_tokens = budget_tokens
        self.query_turns = query_turns
        self.cache_size = cache_size
        self.cache_hits = 0
        self._version_of = version_of
        self.version_info = version_info
        self._resources = tuple(resources)
        self._cache: OrderedDict[tuple[Any, ...], _Guided] = OrderedDict()
        self._cache_lock = threading.Lock()
        # Plugins are written for the agent and take its context; chat mode has no tools.
        self._ctx = AgentContext(backend=backend, toolbox=Toolbox(),
                                 config=RunConfig(guidance_budget_tokens=budget_tokens),
                                 plugins=self.plugins)

    def library_version(self) -> str | None:
        """The version requests are adapted with now (a pinned one, or the current one)."""
        return self._version_of() if self._version_of is not None else None

    def library_gate(self) -> Mapping[str, Any] | None:
        """How the version requests are adapted with came to be (``version_info``)."""
        version = self.library_version()
        if version is None or self.version_info is None:
            return None
        return self.version_info(version)

    def _key(self, query: str, budget: int) -> tuple[Any, ...] | None:
        if self.cache_size <= 0 or not self.plugins:
            return None
        keys = []
        for plugin in self.plugins:
            key = plugin.cache_key() if isinstance(plugin, CacheKeyed) else None
            if key is None:
                return None
            keys.append(key)
        return (tuple(keys), normalise(query), budget)  # whitespace never changes guidance

    def _finish(self, request: Request, query: str, guided: _Guided, start: float) -> Adapted:
        guidance, meta, version, turns = guided
        messages = inject_turns(inject_guidance(request.messages, guidance), turns)
        return Adapted(request.with_(messages=messages), query=query, guidance=guidance,
                       meta={k: dict(v) if isinstance(v, dict) else v for k, v in meta.items()},
                       library_version=version, applied=True,
                       duration_s=time.perf_counter() - start, turns=turns)

    def cached(self, request: Request, switches: ChatSwitches = ChatSwitches()
               ) -> Adapted | None:
        """The adapted request when its guidance is in the cache, else None. Cheap (a stat
        of the library's CURRENT): the server calls it on the event loop."""
        start = time.perf_counter()
        if not switches.library:
            return None
        query = chat_query(request.messages, self.query_turns)
        budget = self.budget_tokens if switches.budget_tokens is None else switches.budget_tokens
        key = self._key(query, budget) if query else None
        return self._hit(key, request, query, start)

    def _hit(self, key: tuple[Any, ...] | None, request: Request, query: str, start: float
             ) -> Adapted | None:
        if key is None:
            return None
        with self._cache_lock:
            hit = self._cache.get(key)
            if hit is None:
                return None
            self._cache.move_to_end(key)
            self.cache_hits += 1
        return self._finish(request, query, hit, start)

    def adapt(self, request: Request, switches: ChatSwitches = ChatSwitches()) -> Adapted:
        """``request`` with guidance for its conversation in the system message."""
        start = time.perf_counter()
        query = chat_query(request.messages, self.query_turns)
        if not switches.library:
            return Adapted(request, query=query, duration_s=time.perf_counter() - start)
        budget = self.budget_tokens if switches.budget_tokens is None else switches.budget_tokens
        key = self._key(query, budget) if query else None
        hit = self._hit(key, request, query, start)
        if hit is not None:
            return hit
        # Nothing to retrieve for an image-only or empty conversation.
        found = collect_guidance(self.plugins, self._ctx, query, budget) if query else \
            Collected("", {}, [])
        version = found.meta.pop("library_version", None) or self.library_version()
        guided: _Guided = (found.text, found.meta, version, tuple(found.turns))
        if key is not None:
            with self._cache_lock:
                self._cache[key] = guided
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return self._finish(request, query, guided, start)

    def warm_up(self) -> Adapted:
        """Adapt one request now, so loading the embedder and syncing the index happen at
        start-up (seconds), not in the first user's request; errors surface here too."""
        return self.adapt(Request(messages=(Message(role="user", content="warm up"),)))

    def close(self) -> None:
        for r in self._resources:
            r.close()


class ChatSkillsPlugin(SkillsPlugin):
    """``SkillsPlugin`` whose guidance can be cached: for one library tree (its root hash)
    the same task and budget retrieve the same skills."""

    def cache_key(self) -> str | None:
        return self.snapshot().root


def chat_skills_plugin(library: Library, snapshot: Snapshot | None = None, *,
                       cache_size: int = 1024, embed_threads: int | None = 1,
                       embedder: Embedder | None = None, **options: Any
                       ) -> tuple[SkillsPlugin, list[Closeable]]:
    """A ``SkillsPlugin`` for chat mode, and what to close when done.

    ``options`` are the skills method's (``SkillsConfig``: ``k``, ``max_bodies``,
    ``min_score``, ``learned_tools``, ``examples``; left out, its defaults), so
    ``--method-config whetstone.skills.examples=3`` means the same in the agent, the direct solver and
    chat mode; an unknown one is a ``ConfigError``.

    It renders ``skills_retrieved_chat`` (no ``read_skill`` tool exists in a plain completion)
    and embeds queries through a ``CachedEmbedder`` (the skills index's int8 embedder,
    ``skill_embedder``). ``embed_threads`` defaults to one thread: on a busy 2-core machine two
    threads spin for ~100 ms a query where one takes a few ms (measured; see
    benchmarks/bench_library.py). ``embedder``: a loaded model to share (it is
    wrapped in the cache all the same).
    """
    # lazy: the skills index loads yaml and 16 more of our modules, only for a library's skills
    from whetstone.skills.index import LibraryIndex
    from whetstone.skills.retrieval import SkillRetriever

    cfg: SkillsConfig = make_config(SkillsConfig, options, method="skills")
    cached = CachedEmbedder(embedder or skill_embedder(threads=embed_threads), maxsize=cache_size)
    index = LibraryIndex(library, cached)
    retriever = SkillRetriever(library, index, k=cfg.k, max_bodies=cfg.max_bodies,
                               min_score=cfg.min_score, template="skills_retrieved_chat")
    plugin = ChatSkillsPlugin(library, snapshot=snapshot, retriever=retriever, k=cfg.k,
                                  max_bodies=cfg.max_bodies, min_score=cfg.min_score,
                                  learned_tools=cfg.learned_tools, examples=cfg.examples,
                                  turns=cfg.turns, require_tool_at=cfg.require_tool_at)
    return plugin, [retriever, index]
