"""The one way a ``Trace`` is made: one id scheme, one ``kind`` for every host that records.

Every recorded run is built here, whatever made it: an agent run (``engine/runtime/nodes.py``),
one direct-solver call (``engine/evaluation/direct.py``), one chat exchange
(``engine/chat/exchange.py``), a verification (``whetstone verify``, ``Engine.endpoint("verify")``) or an
outside agent's run logged over MCP. Each host only says what it saw (task, steps, answer,
outcome); ``make_trace`` gives the trace its id (``new_trace_id``, sortable by time) and its
kind (``meta["source"]``), so ``whetstone traces ls --filter source=chat`` and the evolvers read
every kind the same way. Traces are written by ``TraceStore.append`` (``traces.py``), the one
writer.

Traces stored before this module keep loading: ``trace_kind`` reads their kind from what they
hold (a direct-solver trace had ``meta["solver"] == "direct"``; an agent trace had no source).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from ..engine.errors import ConfigError
from ..engine.types import Outcome, Step, Trace

# What made a trace, stored as ``meta["source"]``. "verify" is a verification's kind (its name
# on disk since the first verification traces, kept so old and new ones read alike).
TRACE_KINDS: dict[str, str] = {
    "agent": "a run of the agent graph (whetstone run, eval, the server's agent mode)",
    "direct": "one call in the model's chat template (eval --solver direct)",
    "chat": "one chat exchange (Engine.chat, the server, Engine.wrap, LangChain)",
    "verify": "a verification (whetstone verify, Engine.endpoint)",
    "mcp": "an outside agent's run logged over MCP (log_run)",
    "import": "a run recorded elsewhere, read by whetstone traces import",
}
SOURCE_KEY = "source"


def new_trace_id(now: float | None = None) -> str:
    """The id of a new trace, sortable by its start time and unique across processes:
    ``20261130-101500-3f9a1c2b`` (UTC)."""
    when = time.gmtime(time.time() if now is None else now)
    return time.strftime("%Y%m%d-%H%M%S", when) + "-" + uuid.uuid4().hex[:8]


def check_kind(kind: str) -> str:
    """``kind`` when it is one of ``TRACE_KINDS``; otherwise a ``ConfigError`` listing them."""
    if kind not in TRACE_KINDS:
        raise ConfigError(f"unknown trace kind {kind!r}",
                          hint="known kinds: " + ", ".join(TRACE_KINDS))
    return kind


def trace_kind(trace: Trace) -> str:
    """What made ``trace``: its ``meta["source"]``, or for a trace stored before kinds were
    recorded, ``direct`` when the direct solver made it and ``agent`` otherwise."""
    source = trace.meta.get(SOURCE_KEY)
    if isinstance(source, str) and source:
        return source
    return "direct" if trace.meta.get("solver") == "direct" else "agent"


def make_trace(kind: str, *, task: str, steps: Iterable[Step] = (), answer: str | None = None,
               outcome: Outcome = "answered", model: str = "", started: float,
               ended: float | None = None, library_version: str | None = None,
               total_tokens: int | None = None, label: str | None = None,
               score: float | None = None, meta: Mapping[str, Any] | None = None,
               trace_id: str | None = None) -> Trace:
    """A ``Trace`` of ``kind`` (one of ``TRACE_KINDS``).

    ``trace_id`` None gives a new id (``new_trace_id(started)``); a host passes its own when
    the id was handed out before the trace existed (a response header, a checkpoint thread).
    ``total_tokens`` None sums the steps' tokens. ``meta["source"]`` is set to ``kind``."""
    check_kind(kind)
    if not isinstance(task, str):
        raise ConfigError(f"a trace's task must be a string, got {type(task).__name__}")
    steps = tuple(steps)
    info = {SOURCE_KEY: kind, **{k: v for k, v in (meta or {}).items() if k != SOURCE_KEY}}
    return Trace(
        id=trace_id or new_trace_id(started), task=task, steps=steps, answer=answer,
        label=label, outcome=outcome, score=score, library_version=library_version,
        model=model, started=started, ended=ended,
        total_tokens=sum(s.tokens for s in steps) if total_tokens is None else total_tokens,
        meta=info,
    )


__all__ = ["SOURCE_KEY", "TRACE_KINDS", "check_kind", "make_trace", "new_trace_id",
           "trace_kind"]
