"""``Engine.wrap(client)``: the library in front of an ``openai`` client, in-process.

For applications that keep their ``openai.OpenAI`` / ``openai.AsyncOpenAI`` client and do not
want a server::

    client = Engine("openai:qwen@http://127.0.0.1:8000/v1", library="lib").wrap(openai.OpenAI())
    r = client.chat.completions.create(model="qwen", messages=[...])
    r.whetstone_trace_id   # label it later: engine.feedback(r.whetstone_trace_id, 1.0)

``chat.completions.create`` takes what the client's does (it forwards everything); the
guidance is appended to the system message, ``extra_body={"whetstone": {...}}`` switches it
per call (and is removed before the request leaves), and each exchange is stored as a trace.
Streams are wrapped so the trace is written when the stream ends. ``with_raw_response.create``
is adapted too; ``with_streaming_response`` and every other attribute pass through untouched.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from ...library_store.trace_build import new_trace_id
from ..backends.openai_wire import StreamAccumulator, completion_from_openai
from ..errors import ConfigError
from ..types import Completion, Message, Request
from .adapter import (
    ADAPTED_HEADER,
    Adapted,
    ChatAdapter,
    ChatSwitches,
    chat_query,
    inject_guidance_dicts,
    inject_turns_dicts,
)
from .exchange import chat_trace

if TYPE_CHECKING:
    from ...library_store.traces import TraceStore

log = logging.getLogger("whetstone.client")

TRACE_ATTR = "whetstone_trace_id"
VERSION_ATTR = "whetstone_library_version"


def trace_id_of(obj: Any) -> str | None:
    """The trace id of a response (or stream) a wrapped client returned; None if unrecorded."""
    return getattr(obj, TRACE_ATTR, None)


def _plain(message: Any) -> Any:
    # Apps append the previous reply's message object (a pydantic model) to the history.
    return message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else message


def _tag(obj: Any, trace_id: str | None, version: str | None) -> None:
    # object.__setattr__: on an openai pydantic model the attribute stays out of to_dict().
    object.__setattr__(obj, TRACE_ATTR, trace_id)
    object.__setattr__(obj, VERSION_ATTR, version)


class _Exchange:
    """One call through a wrapped client: the adapted request and how to record it."""

    def __init__(self, core: _Core, kwargs: dict[str, Any]) -> None:
        self.core = core
        self.started = time.time()
        self.clock = time.perf_counter()
        self.model = str(kwargs.get("model") or "")
        extra = kwargs.get("extra_body")
        switches: Any = None
        if isinstance(extra, Mapping) and "whetstone" in extra:
            switches = extra["whetstone"]
            rest = {k: v for k, v in extra.items() if k != "whetstone"}
            kwargs["extra_body"] = rest or None  # never sent to the upstream
        self.switches = ChatSwitches.from_body(switches)
        if self.switches.endpoints:  # refused, not ignored: the app would think it was done
            raise ConfigError("'whetstone.endpoints' are answered by the Whetstone server, "
                              "not by a wrapped client",
                              hint='call them with engine.endpoint(name, question=..., '
                                   'answer=...)')
        self.kwargs = kwargs
        self.request: Request | None = None
        self.adapted: Adapted | None = None
        self.trace_id: str | None = None
        self._recorded = False
        messages = kwargs.get("messages")
        if isinstance(messages, Sequence) and not isinstance(messages, (str, bytes)):
            try:
                plain = [_plain(m) for m in messages]
                tools = kwargs.get("tools")
                self.request = Request(messages=tuple(Message.from_dict(m) for m in plain),
                                       tools=tuple(tools) if isinstance(tools, list) else ())
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                # Not messages we understand: let the client (and the server) judge them.
                log.warning("messages not in the chat format; passed on unadapted: %s", exc)

    def adapt(self) -> None:
        """Compute the guidance (blocking: it embeds the query) and put it in the kwargs."""
        if self.request is None:
            return
        core = self.core
        if core.adapter is None or not self.switches.library:
            self.adapted = Adapted(self.request, query=chat_query(self.request.messages))
        else:
            try:
                self.adapted = core.adapter.adapt(self.request, self.switches)
            except Exception as exc:  # noqa: BLE001 - the app's call matters more than guidance
                # As the server does: send the request unadapted, and say so in the trace.
                reason = getattr(exc, "message", None) or repr(exc)
                log.warning("library retrieval failed; sending the request without it: %s",
                            reason)
                self.adapted = Adapted(self.request, query=chat_query(self.request.messages),
                                       meta={"library_error": reason})
            if self.adapted.guidance or self.adapted.turns:
                self.kwargs["messages"] = inject_turns_dicts(inject_guidance_dicts(
                    [_plain(m) for m in self.kwargs["messages"]], self.adapted.guidance),
                    self.adapted.turns)
            if "library_error" not in self.adapted.meta:
                # A Whetstone server behind this client passes the request through unadapted.
                given = self.kwargs.get("extra_headers")
                self.kwargs["extra_headers"] = {
                    **(given if isinstance(given, Mapping) else {}),
                    ADAPTED_HEADER: self.adapted.library_version or "1"}
        if self.switches.record and core.store is not None:
            self.trace_id = new_trace_id(self.started)

    @property
    def version(self) -> str | None:
        return self.adapted.library_version if self.adapted is not None else None

    def trace(self, completion: Completion | None, failure: str | None,
              outcome: Any = None, **meta: Any) -> Any:
        """The trace to store, or None (not recorded, or already recorded)."""
        if self.trace_id is None or self.adapted is None or self._recorded:
            return None
        self._recorded = True
        return chat_trace(self.trace_id, self.adapted, model=self.core.model_spec(self.model),
                          started=self.started, completion=completion, error=failure,
                          outcome=outcome, meta={"client": "wrap", **meta})

    def completion_of(self, response: Any) -> Completion | None:
        try:
            return completion_from_openai(response.to_dict(), time.perf_counter() - self.clock)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("could not read the reply for the trace: %s", exc)
            return None


class _Core:
    """What every wrapper of one client shares: the adapter, the store and the client."""

    def __init__(self, client: Any, adapter: ChatAdapter | None, store: TraceStore | None
                 ) -> None:
        self.client = client
        self.adapter = adapter
        self.store = store

    def model_spec(self, model: str) -> str:
        base = str(getattr(self.client, "base_url", "") or "").rstrip("/")
        return f"openai:{model}@{base}" if base else f"openai:{model}"

    def write(self, trace: Any) -> bool:
        """Store a trace; False (logged) when the store cannot be written: the caller's
        response is returned all the same."""
        return trace is None or self.store is None or self.store.record(trace)

    def error_text(self, exc: BaseException) -> str:
        return f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"


class _Passthrough:
    """Every attribute not defined here comes from the wrapped object."""

    def __init__(self, inner: Any) -> None:
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"<whetstone-wrapped {self._inner!r}>"


# --- streams ---------------------------------------------------------------------------------

class RecordingStream(_Passthrough):
    """A client's ``Stream``, chunk for chunk, that stores the exchange when it ends."""

    def __init__(self, inner: Any, exchange: _Exchange) -> None:
        super().__init__(inner)
        object.__setattr__(self, "_exchange", exchange)
        object.__setattr__(self, "_acc", StreamAccumulator())
        object.__setattr__(self, "_iterator", self._chunks())
        _tag(self, exchange.trace_id, exchange.version)

    def _chunks(self) -> Any:
        failure: str | None = None
        done = False
        try:
            for chunk in self._inner:
                self._acc.feed(chunk.to_dict())
                yield chunk
            done = True
        except Exception as exc:
            failure = self._exchange.core.error_text(exc)
            raise
        finally:
            self._finish(done, failure)

    def _finish(self, done: bool, failure: str | None) -> None:
        ex = self._exchange
        completion = self._acc.completion(time.perf_counter() - ex.clock)
        if done:
            trace = ex.trace(completion, None, stream=True)
        elif failure is not None:
            trace = ex.trace(None, failure, stream=True, partial=completion.text)
        else:
            trace = ex.trace(None, "the stream was closed before it ended",
                             outcome="interrupted", stream=True, partial=completion.text)
        ex.core.write(trace)

    def __iter__(self) -> Any:
        yield from self._iterator

    def __next__(self) -> Any:
        return next(self._iterator)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._iterator.close()  # records an interrupted exchange if it had not ended
        self._inner.close()
        self._finish(False, None)  # closed before the first chunk: the generator never ran


class AsyncRecordingStream(_Passthrough):
    """An ``AsyncStream`` that stores the exchange when it ends (the write runs in a thread)."""

    def __init__(self, inner: Any, exchange: _Exchange) -> None:
        super().__init__(inner)
        object.__setattr__(self, "_exchange", exchange)
        object.__setattr__(self, "_acc", StreamAccumulator())
        object.__setattr__(self, "_iterator", self._chunks())
        _tag(self, exchange.trace_id, exchange.version)

    async def _chunks(self) -> Any:
        failure: str | None = None
        done = False
        try:
            async for chunk in self._inner:
                self._acc.feed(chunk.to_dict())
                yield chunk
            done = True
        except Exception as exc:
            failure = self._exchange.core.error_text(exc)
            raise
        finally:
            ex = self._exchange
            completion = self._acc.completion(time.perf_counter() - ex.clock)
            if done:
                trace = ex.trace(completion, None, stream=True)
            else:
                trace = ex.trace(None, failure or "the stream was closed before it ended",
                                 outcome=None if failure else "interrupted", stream=True,
                                 partial=completion.text)
            if trace is not None:
                await asyncio.to_thread(ex.core.write, trace)

    def __aiter__(self) -> Any:
        return self._iterator

    async def __anext__(self) -> Any:
        return await self._iterator.__anext__()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._iterator.aclose()
        await self._inner.close()
        ex = self._exchange
        trace = ex.trace(None, "the stream was closed before it ended", outcome="interrupted",
                         stream=True, partial=self._acc.text)
        if trace is not None:  # closed before the first chunk: the generator never ran
            await asyncio.to_thread(ex.core.write, trace)


# --- chat.completions ------------------------------------------------------------------------

def _install_create(owner: Any, inner: Callable[..., Any], impl: Callable[..., Any]) -> None:
    """Give ``owner`` a ``create`` that runs ``impl`` but reads as the client's own: its
    ``__wrapped__`` makes ``inspect.signature`` and ``help()`` show the client's parameters."""
    async def acreate(*args: Any, **kwargs: Any) -> Any:
        return await impl(*args, **kwargs)

    def create(*args: Any, **kwargs: Any) -> Any:
        return impl(*args, **kwargs)

    chosen: Callable[..., Any] = acreate if inspect.iscoroutinefunction(impl) else create
    functools.update_wrapper(chosen, inner)
    object.__setattr__(owner, "create", chosen)


class _RawResponse(_Passthrough):
    """``with_raw_response``'s response: ``parse()`` gives the recording stream or the tagged
    completion (recorded as soon as the response arrives, parsed or not)."""

    def __init__(self, inner: Any, parsed: Any) -> None:
        super().__init__(inner)
        object.__setattr__(self, "_parsed", parsed)

    def parse(self, *args: Any, **kwargs: Any) -> Any:
        return self._parsed if not args and not kwargs else self._inner.parse(*args, **kwargs)


class Completions(_Passthrough):
    """``client.chat.completions`` with the library applied by ``create``."""

    def __init__(self, inner: Any, core: _Core, raw: bool = False) -> None:
        super().__init__(inner)
        object.__setattr__(self, "_core", core)
        object.__setattr__(self, "_raw", raw)
        _install_create(self, inner.create, self._create)

    @property
    def with_raw_response(self) -> Completions:
        return Completions(self._inner.with_raw_response, self._core, raw=True)

    def _create(self, *args: Any, **kwargs: Any) -> Any:
        ex = _Exchange(self._core, kwargs)
        ex.adapt()
        try:
            response = self._inner.create(*args, **ex.kwargs)
        except Exception as exc:
            self._core.write(ex.trace(None, self._core.error_text(exc)))
            raise
        return self._finish(response, ex)

    def _finish(self, response: Any, ex: _Exchange) -> Any:
        parsed = response.parse() if self._raw else response
        if ex.kwargs.get("stream"):
            out: Any = RecordingStream(parsed, ex)
        else:
            out = parsed
            if not self._core.write(ex.trace(ex.completion_of(parsed), None)):
                ex.trace_id = None  # not stored: the response carries no trace id
            _tag(out, ex.trace_id, ex.version)
        if self._raw:
            _tag(response, ex.trace_id, ex.version)
            return _RawResponse(response, out)
        return out


class AsyncCompletions(_Passthrough):
    """``client.chat.completions`` of an ``AsyncOpenAI`` client, with the library applied."""

    def __init__(self, inner: Any, core: _Core, raw: bool = False) -> None:
        super().__init__(inner)
        object.__setattr__(self, "_core", core)
        object.__setattr__(self, "_raw", raw)
        _install_create(self, inner.create, self._create)

    @property
    def with_raw_response(self) -> AsyncCompletions:
        return AsyncCompletions(self._inner.with_raw_response, self._core, raw=True)

    async def _create(self, *args: Any, **kwargs: Any) -> Any:
        ex = _Exchange(self._core, kwargs)
        await asyncio.to_thread(ex.adapt)  # retrieval embeds the query: keep the loop free
        try:
            response = await self._inner.create(*args, **ex.kwargs)
        except Exception as exc:
            trace = ex.trace(None, self._core.error_text(exc))
            if trace is not None:
                await asyncio.to_thread(self._core.write, trace)
            raise
        parsed = await response.parse() if self._raw else response
        if ex.kwargs.get("stream"):
            out: Any = AsyncRecordingStream(parsed, ex)
        else:
            out = parsed
            trace = ex.trace(ex.completion_of(parsed), None)
            if trace is not None and not await asyncio.to_thread(self._core.write, trace):
                ex.trace_id = None  # not stored: the response carries no trace id
            _tag(out, ex.trace_id, ex.version)
        if self._raw:
            _tag(response, ex.trace_id, ex.version)
            return _AsyncRawResponse(response, out)
        return out


class _AsyncRawResponse(_Passthrough):
    def __init__(self, inner: Any, parsed: Any) -> None:
        super().__init__(inner)
        object.__setattr__(self, "_parsed", parsed)

    async def parse(self, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            return await self._inner.parse(*args, **kwargs)
        return self._parsed


class _Chat(_Passthrough):
    def __init__(self, inner: Any, completions: Any) -> None:
        super().__init__(inner)
        object.__setattr__(self, "completions", completions)


class WrappedClient(_Passthrough):
    """An ``openai`` client whose ``chat.completions.create`` applies the library.

    ``with_options(...)`` and ``copy(...)`` return wrapped clients too; the rest is the
    client's own (``models``, ``embeddings``, ``close`` ...).
    """

    def __init__(self, client: Any, adapter: ChatAdapter | None, store: TraceStore | None
                 ) -> None:
        super().__init__(client)
        core = _Core(client, adapter, store)
        # openai decorates create(); the function underneath says whether it is async.
        is_async = inspect.iscoroutinefunction(inspect.unwrap(client.chat.completions.create))
        completions = (AsyncCompletions if is_async else Completions)(
            client.chat.completions, core)
        object.__setattr__(self, "_core", core)
        object.__setattr__(self, "chat", _Chat(client.chat, completions))

    def with_options(self, **options: Any) -> WrappedClient:
        return WrappedClient(self._inner.with_options(**options), self._core.adapter,
                             self._core.store)

    def copy(self, **options: Any) -> WrappedClient:
        return WrappedClient(self._inner.copy(**options), self._core.adapter, self._core.store)

    def __enter__(self) -> Self:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.__exit__(*exc)

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._inner.__aexit__(*exc)


def wrap_client(client: Any, adapter: ChatAdapter | None, store: TraceStore | None
                ) -> WrappedClient:
    """Wrap an ``openai.OpenAI`` or ``openai.AsyncOpenAI`` client (see the module doc)."""
    chat = getattr(client, "chat", None)
    if chat is None or not callable(getattr(getattr(chat, "completions", None), "create", None)):
        raise ConfigError(f"cannot wrap {type(client).__name__}: it has no "
                          "chat.completions.create",
                          hint="pass an openai.OpenAI or openai.AsyncOpenAI client")
    return WrappedClient(client, adapter, store)
