"""Chat mode: put the library in front of one chat completion, with no agent loop.

``ChatAdapter`` takes a ``Request`` in the OpenAI chat format, asks the run-time plugins (skills
now, policy notes later) for guidance on the conversation and injects it into the system message
within a token budget: appended to the first system message, or as a new one at the front.
``chat_trace`` turns one exchange into a ``Trace`` (one ``think`` step, module ``chat``) so
``whetstone evolve`` learns from production traffic as it does from agent runs.
``ChatRunner`` does the whole exchange for ``Engine.chat``; the server and ``Engine.wrap`` use
the adapter and ``chat_trace`` around their own transport.
"""

from __future__ import annotations

import asyncio
import functools
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from engine.errors import ConfigError, WhetstoneError
from engine.runtime.embed_cache import CachedEmbedder
from engine.runtime.plugins import Plugin
from engine.runtime.state import AgentContext, RunConfig
from engine.types import Completion, Message, Outcome, Request, Step, Trace
from tools.base import Toolbox

if TYPE_CHECKING:
    from engine.backends.base import Backend
    from engine.runtime.skills_plugin import SkillsPlugin
    from library_store.embeddings import Embedder
    from library_store.store import Library, Snapshot
    from library_store.traces import TraceStore

SOURCE = "chat"
_SYSTEM_ROLES = ("system", "developer")
MAX_BUDGET_TOKENS = 32_000


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
    ``budget_tokens``: the guidance budget for this request (default: the adapter's).
    """

    library: bool = True
    record: bool = True
    budget_tokens: int | None = None

    @classmethod
    def from_body(cls, value: Any) -> ChatSwitches:
        """Parse the ``whetstone`` object of a request body (None: the defaults).

        Raises ``ConfigError`` naming the bad key, so a typo is not silently ignored.
        """
        if value is None:
            return cls()
        known = "library (bool), record (bool), budget_tokens (int)"
        if not isinstance(value, Mapping):
            raise ConfigError(f"'whetstone' must be an object, got {type(value).__name__}",
                              hint=f'e.g. {{"whetstone": {{"library": false}}}}; keys: {known}')
        unknown = sorted(set(value) - {"library", "record", "budget_tokens"})
        if unknown:
            raise ConfigError(f"unknown 'whetstone' option(s): {', '.join(map(repr, unknown))}",
                              hint=f"known: {known}")
        for key in ("library", "record"):
            if key in value and not isinstance(value[key], bool):
                raise ConfigError(f"'whetstone.{key}' must be true or false, "
                                  f"got {value[key]!r}")
        budget = value.get("budget_tokens")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)
                                   or not 0 <= budget <= MAX_BUDGET_TOKENS):
            raise ConfigError(f"'whetstone.budget_tokens' must be an integer from 0 to "
                              f"{MAX_BUDGET_TOKENS}, got {budget!r}")
        return cls(library=value.get("library", True), record=value.get("record", True),
                   budget_tokens=budget)


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

    @property
    def skills_shown(self) -> list[str]:
        return list((self.meta.get("skills") or {}).get("shown") or [])


class ChatAdapter:
    """Injects run-time guidance into chat requests. Thread-safe (the server calls it from a
    thread pool, since retrieval embeds the query).

    ``plugins`` give the guidance (``Plugin.guidance``); ``budget_tokens`` bounds it all,
    counted with the backend's tokenizer; ``version_of`` says which library version is current
    (for ``/health``); ``resources`` are closed by ``close``.

    When every plugin is ``CacheKeyed``, the last ``cache_size`` results are kept, keyed by the
    plugins' keys (library tree hashes), the query and the budget: a repeated question against
    an unchanged library gets the very guidance it got before, without embedding or searching
    (``cached`` serves it without leaving the event loop). A new library version changes the
    key, so nothing stale is served.
    """

    def __init__(self, plugins: Sequence[Plugin], backend: Backend, *,
                 budget_tokens: int = 1_200, query_turns: int = 1,
                 version_of: Callable[[], str | None] | None = None,
                 resources: Sequence[Closeable] = (), cache_size: int = 256) -> None:
        self.plugins = tuple(plugins)
        self.backend = backend
        self.budget_tokens = budget_tokens
        self.query_turns = query_turns
        self.cache_size = cache_size
        self.cache_hits = 0
        self._version_of = version_of
        self._resources = tuple(resources)
        self._cache: OrderedDict[tuple[Any, ...], tuple[str, dict[str, Any], str | None]] = (
            OrderedDict())
        self._cache_lock = threading.Lock()
        # Plugins are written for the agent and take its context; chat mode has no tools.
        self._ctx = AgentContext(backend=backend, toolbox=Toolbox(),
                                 config=RunConfig(guidance_budget_tokens=budget_tokens),
                                 plugins=self.plugins)

    def library_version(self) -> str | None:
        """The version requests are adapted with now (a pinned one, or the current one)."""
        return self._version_of() if self._version_of is not None else None

    def _key(self, query: str, budget: int) -> tuple[Any, ...] | None:
        if self.cache_size <= 0 or not self.plugins:
            return None
        keys = []
        for plugin in self.plugins:
            key = plugin.cache_key() if isinstance(plugin, CacheKeyed) else None
            if key is None:
                return None
            keys.append(key)
        return (tuple(keys), query, budget)

    def _finish(self, request: Request, query: str, guidance: str, meta: dict[str, Any],
                version: str | None, start: float) -> Adapted:
        adapted = request.with_(messages=inject_guidance(request.messages, guidance))
        return Adapted(adapted, query=query, guidance=guidance,
                       meta={k: dict(v) if isinstance(v, dict) else v for k, v in meta.items()},
                       library_version=version, applied=True,
                       duration_s=time.perf_counter() - start)

    def cached(self, request: Request, switches: ChatSwitches = ChatSwitches()
               ) -> Adapted | None:
        """The adapted request when its guidance is in the cache, else None. Cheap (a small
        file read for the library version): the server calls it on the event loop."""
        start = time.perf_counter()
        if not switches.library:
            return None
        query = chat_query(request.messages, self.query_turns)
        budget = self.budget_tokens if switches.budget_tokens is None else switches.budget_tokens
        key = self._key(query, budget) if query else None
        if key is None:
            return None
        with self._cache_lock:
            hit = self._cache.get(key)
            if hit is None:
                return None
            self._cache.move_to_end(key)
            self.cache_hits += 1
        return self._finish(request, query, *hit, start)

    def adapt(self, request: Request, switches: ChatSwitches = ChatSwitches()) -> Adapted:
        """``request`` with guidance for its conversation in the system message."""
        start = time.perf_counter()
        query = chat_query(request.messages, self.query_turns)
        if not switches.library:
            return Adapted(request, query=query, duration_s=time.perf_counter() - start)
        budget = self.budget_tokens if switches.budget_tokens is None else switches.budget_tokens
        key = self._key(query, budget) if query else None
        if key is not None:
            hit = self.cached(request, switches)
            if hit is not None:
                return hit
        parts: list[str] = []
        meta: dict[str, Any] = {}
        version: str | None = None
        for plugin in self.plugins:
            if not query:
                break  # nothing to retrieve for (an image-only or empty conversation)
            g = plugin.guidance(query, self._ctx, max(0, budget))
            if g is None:
                continue
            meta[plugin.name] = dict(g.meta)
            version = g.library_version or version
            text = g.text.strip()
            if not text:
                continue
            parts.append(text if text.startswith("#") else f"# {g.title}\n{text}")
            budget -= self.backend.count_tokens(text)
        guidance = "\n\n".join(parts)
        if version is None:
            version = self.library_version()
        if key is not None:
            with self._cache_lock:
                self._cache[key] = (guidance, meta, version)
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return self._finish(request, query, guidance, meta, version, start)

    def warm_up(self) -> Adapted:
        """Adapt one request now, so loading the embedder and syncing the index happen at
        start-up (seconds), not in the first user's request; errors surface here too."""
        return self.adapt(Request(messages=(Message(role="user", content="warm up"),)))

    def close(self) -> None:
        for r in self._resources:
            r.close()


@functools.lru_cache(maxsize=1)
def _chat_skills_class() -> type:
    # Defined on first use: skills_plugin imports the tools layer's built-ins lazily too.
    from engine.runtime.skills_plugin import SkillsPlugin

    class ChatSkillsPlugin(SkillsPlugin):
        """``SkillsPlugin`` whose guidance can be cached: for one library tree (its root hash)
        the same task and budget retrieve the same skills."""

        def cache_key(self) -> str | None:
            return self.snapshot().root

    return ChatSkillsPlugin


def chat_skills_plugin(library: Library, snapshot: Snapshot | None = None, *,
                       k: int = 5, max_bodies: int = 2, min_score: float | None = None,
                       cache_size: int = 1024, embed_threads: int | None = 1,
                       embedder: Embedder | None = None
                       ) -> tuple[SkillsPlugin, list[Closeable]]:
    """A ``SkillsPlugin`` for chat mode, and what to close when done.

    It renders ``skills_retrieved_chat`` (no ``read_skill`` tool exists in a plain completion)
    and embeds queries through a ``CachedEmbedder``. ``embed_threads`` defaults to one torch
    thread: on a busy 2-core machine two threads spin for ~100 ms a query where one takes ~20 ms
    (measured; see benchmarks/bench_library.py). ``embedder``: a loaded model to share (it is
    wrapped in the cache all the same).
    """
    from library_store.embeddings import query_embedder
    from skills.index import LibraryIndex
    from skills.retrieval import SkillRetriever

    cached = CachedEmbedder(embedder or query_embedder(threads=embed_threads), maxsize=cache_size)
    index = LibraryIndex(library, cached)
    retriever = SkillRetriever(library, index, k=k, max_bodies=max_bodies, min_score=min_score,
                               template="skills_retrieved_chat")
    plugin = _chat_skills_class()(library, snapshot=snapshot, retriever=retriever)
    return plugin, [retriever, index]


# --- the trace of one exchange ---------------------------------------------------------------

def _answer_of(completion: Completion) -> str:
    if completion.text or not completion.tool_calls:
        return completion.text
    # A pure tool-call reply: what the model decided is the calls it made.
    return "; ".join(f"{c.name}({c.arguments})" for c in completion.tool_calls)


def chat_trace(trace_id: str, adapted: Adapted, *, model: str, started: float,
               completion: Completion | None = None, error: str | None = None,
               outcome: Outcome | None = None, request_id: str | None = None,
               ended: float | None = None, meta: Mapping[str, Any] | None = None) -> Trace:
    """The ``Trace`` of one chat exchange: task = the last user text, one ``think`` step
    (module ``chat``; input the adapted messages, output the completion), ``meta.source``
    ``"chat"``. ``outcome`` defaults to ``answered``, or ``error`` when ``error`` is given."""
    ended = time.time() if ended is None else ended
    request = adapted.request
    outcome = outcome or ("error" if error is not None or completion is None else "answered")
    step = Step(
        kind="think", module="chat",
        input={"messages": [m.to_dict() for m in request.messages],
               "tools": [t.get("function", t).get("name") for t in request.tools]},
        output={"completion": completion.to_dict()} if completion is not None else None,
        tokens=completion.total_tokens if completion is not None else 0,
        started=started, duration_s=max(0.0, ended - started), error=error, route="end",
        meta={"latency_s": completion.latency_s, "prompt_tokens": completion.prompt_tokens,
              "completion_tokens": completion.completion_tokens,
              "retrieval_s": round(adapted.duration_s, 6)} if completion is not None
        else {"retrieval_s": round(adapted.duration_s, 6)},
    )
    info: dict[str, Any] = {"source": SOURCE, "library": adapted.applied,
                            **{k: v for k, v in adapted.meta.items()}}
    if request_id is not None:
        info["request_id"] = request_id
    if error is not None:
        info["reason"] = error
    info.update(meta or {})
    return Trace(
        id=trace_id, task=last_user_text(request.messages), steps=(step,),
        answer=_answer_of(completion) if completion is not None else None,
        outcome=outcome, library_version=adapted.library_version, model=model,
        started=started, ended=ended,
        total_tokens=completion.total_tokens if completion is not None else 0, meta=info,
    )


# --- feedback ---------------------------------------------------------------------------------

MAX_COMMENT_CHARS = 4_000


def check_feedback(score: Any, comment: Any = None) -> tuple[float, str | None]:
    """Validate a label for a trace: ``score`` a number from 0 (bad) to 1 (good), ``comment``
    an optional string. Raises ``ConfigError`` saying what is wrong."""
    if isinstance(score, bool) or not isinstance(score, (int, float)) \
            or not math.isfinite(score) or not 0.0 <= score <= 1.0:
        raise ConfigError(f"'score' must be a number from 0 to 1, got {score!r}",
                          hint="send 1 for a good answer, 0 for a bad one, or anything between")
    if comment is not None and not isinstance(comment, str):
        raise ConfigError(f"'comment' must be a string, got {type(comment).__name__}")
    if comment is not None and len(comment) > MAX_COMMENT_CHARS:
        raise ConfigError(f"'comment' is {len(comment)} characters; at most "
                          f"{MAX_COMMENT_CHARS} are kept", hint="shorten the comment")
    return float(score), comment


# --- one adapted completion (Engine.chat) ----------------------------------------------------

@dataclass(frozen=True)
class ChatReply(Completion):
    """A ``Completion`` plus where it came from: ``trace_id`` (None when not recorded) for
    feedback (``Engine.feedback``), the library version and the guidance facts."""

    trace_id: str | None = None
    library_version: str | None = None
    guidance: Mapping[str, Any] = field(default_factory=dict)


_REQUEST_PARAMS = ("max_tokens", "temperature", "top_p", "stop", "seed", "tools", "logprobs",
                   "timeout")


def chat_request(messages: str | Sequence[Message | Mapping[str, Any]], **params: Any
                 ) -> Request:
    """A ``Request`` from a prompt or OpenAI-style messages and sampling parameters."""
    unknown = sorted(set(params) - set(_REQUEST_PARAMS))
    if unknown:
        raise ConfigError(f"unknown chat parameter(s): {', '.join(unknown)}",
                          hint="known: " + ", ".join(_REQUEST_PARAMS))
    if isinstance(messages, str):
        messages = [Message(role="user", content=messages)]
    if not messages:
        raise ConfigError("chat needs at least one message",
                          hint='engine.chat("question") or engine.chat([{"role": "user", ...}])')
    if "stop" in params and isinstance(params["stop"], str):
        params["stop"] = (params["stop"],)
    for key in ("temperature", "top_p"):
        if key in params and not (isinstance(params[key], (int, float))
                                  and math.isfinite(params[key])):
            raise ConfigError(f"'{key}' must be a number, got {params[key]!r}")
    try:
        return Request(messages=tuple(messages), **params)  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"bad chat message: {exc}",
                          hint='messages are {"role": "user"|"system"|"assistant"|"tool", '
                               '"content": "..."}') from exc


class ChatRunner:
    """Adapt, complete, record: one exchange with the backend. ``adapter`` None: no library."""

    def __init__(self, backend: Backend, adapter: ChatAdapter | None,
                 store: TraceStore | None) -> None:
        self.backend = backend
        self.adapter = adapter
        self.store = store

    def _adapt(self, request: Request, switches: ChatSwitches) -> Adapted:
        if self.adapter is None:
            return Adapted(request, query=chat_query(request.messages))
        return self.adapter.adapt(request, switches)

    def _finish(self, trace_id: str | None, adapted: Adapted, started: float,
                completion: Completion | None, error: WhetstoneError | None
                ) -> tuple[ChatReply | None, Any]:
        trace = None
        if trace_id is not None:
            trace = chat_trace(trace_id, adapted, model=self.backend.spec, started=started,
                               completion=completion,
                               error=None if error is None else error.message)
        reply = None
        if completion is not None:
            reply = ChatReply(**{f.name: getattr(completion, f.name) for f in fields(Completion)},
                              trace_id=trace_id, library_version=adapted.library_version,
                              guidance=dict(adapted.meta))
        return reply, trace

    def _trace_id(self, switches: ChatSwitches) -> str | None:
        from engine.runtime.agent import new_trace_id

        return new_trace_id() if switches.record and self.store is not None else None

    def complete(self, request: Request, switches: ChatSwitches = ChatSwitches()) -> ChatReply:
        """One adapted completion; the exchange is stored (also when the backend fails)."""
        started = time.time()
        adapted = self._adapt(request, switches)
        trace_id = self._trace_id(switches)
        try:
            completion = self.backend.complete(adapted.request)
        except WhetstoneError as exc:
            _, trace = self._finish(trace_id, adapted, started, None, exc)
            if trace is not None and self.store is not None:
                self.store.append(trace)
            raise
        reply, trace = self._finish(trace_id, adapted, started, completion, None)
        if trace is not None and self.store is not None:
            self.store.append(trace)
        assert reply is not None
        return reply

    async def acomplete(self, request: Request, switches: ChatSwitches = ChatSwitches()
                        ) -> ChatReply:
        """``complete`` for an event loop: retrieval and the trace write run in threads."""
        started = time.time()
        adapted = await asyncio.to_thread(self._adapt, request, switches)
        trace_id = self._trace_id(switches)
        try:
            completion = await self.backend.acomplete(adapted.request)
        except WhetstoneError as exc:
            _, trace = self._finish(trace_id, adapted, started, None, exc)
            if trace is not None and self.store is not None:
                await asyncio.to_thread(self.store.append, trace)
            raise
        reply, trace = self._finish(trace_id, adapted, started, completion, None)
        if trace is not None and self.store is not None:
            await asyncio.to_thread(self.store.append, trace)
        assert reply is not None
        return reply
