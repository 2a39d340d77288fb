"""One chat exchange as Whetstone keeps it: its trace, its feedback, and ``Engine.chat``.

``chat_trace`` turns one exchange into a ``Trace`` (one ``think`` step, module ``chat``) so
``whetstone evolve`` learns from production traffic as it does from agent runs;
``check_feedback`` validates a label for it. ``ChatRunner`` does the whole exchange (adapt,
complete, record) for ``Engine.chat``; the server and ``Engine.wrap``'s client use the adapter
and ``chat_trace`` around their own transport.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from ...library_store.trace_build import make_trace, new_trace_id
from ..errors import ConfigError, WhetstoneError
from ..types import CUT_REASON, Completion, Message, Outcome, Request, Step, Trace
from .adapter import (
    Adapted,
    ChatAdapter,
    ChatSwitches,
    chat_query,
    last_user_text,
)

if TYPE_CHECKING:
    from ...library_store.traces import TraceStore
    from ..backends.base import Backend

SOURCE = "chat"  # the trace kind (whetstone.library_store.trace_build.TRACE_KINDS)
DEFAULTS = ChatSwitches()  # library on, recorded


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
    """The ``chat`` trace of one exchange (``whetstone.library_store.trace_build.make_trace``): task =
    the last user text, one ``think`` step (module ``chat``; input the adapted messages, output
    the completion). ``outcome`` defaults to ``answered``, ``length`` when the reply was cut at
    the length limit, or ``error`` when ``error`` is given. ``trace_id`` is the one handed out before the reply (``new_trace_id``)."""
    ended = time.time() if ended is None else ended
    request = adapted.request
    if outcome is None:
        outcome = "error" if error is not None or completion is None else \
            "length" if completion.finish_reason == "length" else "answered"
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
    info: dict[str, Any] = {"library": adapted.applied, **adapted.meta}
    if request_id is not None:
        info["request_id"] = request_id
    if error is not None:
        info["reason"] = error
    elif outcome == "length":
        info["reason"] = CUT_REASON
    info.update(meta or {})
    return make_trace(
        SOURCE, trace_id=trace_id, task=last_user_text(request.messages), steps=(step,),
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


MAX_LABEL_CHARS = 4_000


def check_label(label: Any) -> str | None:
    """Validate the right answer a client may send with its feedback (``label``): a string
    or a number, kept as text; ``ConfigError`` otherwise."""
    if label is None:
        return None
    if isinstance(label, bool) or not isinstance(label, (str, int, float)) or (
            isinstance(label, float) and not math.isfinite(label)):
        raise ConfigError(f"'label' must be a string or a number, got {type(label).__name__}",
                          hint="send the right answer as text, e.g. \"label\": \"180.5\"")
    text = label if isinstance(label, str) else repr(label) if isinstance(label, float) \
        else str(label)
    if len(text) > MAX_LABEL_CHARS:
        raise ConfigError(f"'label' is {len(text)} characters; at most {MAX_LABEL_CHARS} are "
                          "kept", hint="send the answer itself, not the whole reply")
    return text


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
                ) -> tuple[ChatReply | None, Trace | None]:
        trace = None
        if trace_id is not None:
            trace = chat_trace(trace_id, adapted, model=self.backend.shown_spec, started=started,
                               completion=completion,
                               error=None if error is None else error.message)
        reply = None
        if completion is not None:
            reply = ChatReply(**{f.name: getattr(completion, f.name) for f in fields(Completion)},
                              trace_id=trace_id, library_version=adapted.library_version,
                              guidance=dict(adapted.meta))
        return reply, trace

    def _record(self, trace: Trace | None) -> bool:
        """Store the exchange's trace (through the store's one writer) when it is recorded;
        False when it could not be (logged: the reply is still returned)."""
        return trace is None or self.store is None or self.store.record(trace)

    def _trace_id(self, switches: ChatSwitches, started: float) -> str | None:
        return new_trace_id(started) if switches.record and self.store is not None else None

    def complete(self, request: Request, switches: ChatSwitches = DEFAULTS) -> ChatReply:
        """One adapted completion; the exchange is stored (also when the backend fails)."""
        started = time.time()
        adapted = self._adapt(request, switches)
        trace_id = self._trace_id(switches, started)
        try:
            completion = self.backend.complete(adapted.request)
        except WhetstoneError as exc:
            _, trace = self._finish(trace_id, adapted, started, None, exc)
            self._record(trace)
            raise
        reply, trace = self._finish(trace_id, adapted, started, completion, None)
        assert reply is not None
        return reply if self._record(trace) else replace(reply, trace_id=None)

    async def acomplete(self, request: Request, switches: ChatSwitches = DEFAULTS
                        ) -> ChatReply:
        """``complete`` for an event loop: retrieval and the trace write run in threads."""
        started = time.time()
        adapted = await asyncio.to_thread(self._adapt, request, switches)
        trace_id = self._trace_id(switches, started)
        try:
            completion = await self.backend.acomplete(adapted.request)
        except WhetstoneError as exc:
            _, trace = self._finish(trace_id, adapted, started, None, exc)
            if trace is not None:
                await asyncio.to_thread(self._record, trace)
            raise
        reply, trace = self._finish(trace_id, adapted, started, completion, None)
        assert reply is not None
        # no thread hop for an unrecorded exchange
        if trace is not None and not await asyncio.to_thread(self._record, trace):
            return replace(reply, trace_id=None)
        return reply
