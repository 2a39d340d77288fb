"""The canary on every replica: which conversations it serves, and what ``/metrics`` says of
learning in production.

A learner (``whetstone learn``, docs/learning.md) writes the canary into the library
(``learning/canary.json``); every replica reads it on each request, a ``stat`` as for
``CURRENT``, so a canary reaches the replicas the way a new version does. While its base is
the current version, a request goes to the canary when a hash of its conversation (the
``X-Whetstone-Conversation`` header, the body's ``user`` and the first user message), salted
with the canary's id, falls under the canary's share: every turn of one conversation lands on
one version, and another canary draws another slice. The trace records the arm
(``meta["canary"]``) and the version served; the learner compares the arms' feedback.

The canary's adapter (its snapshot's skills and methods' guidance) is built on its first
request, in the retrieval threads, and closed when the canary ends.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import Counter as Tally
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...library_store.learning import STEPS, CanaryRecord, LearningState
from ...library_store.snapshot import Snapshot
from ...library_store.store import Library
from ..chat.adapter import ChatAdapter
from ..types import Message
from .metrics import Counter, Gauge, Metrics

log = logging.getLogger("whetstone.server")

CONVERSATION_HEADER = "X-Whetstone-Conversation"
MAX_KEY_CHARS = 4_000  # of the first user message: enough to tell conversations apart


def conversation_key(messages: Sequence[Message], user: object = None,
                     conversation: str | None = None) -> str:
    """What one conversation keeps through its turns: the client's conversation id (header),
    the body's ``user``, and its first user message."""
    first = next((m.text for m in messages if m.role == "user"), "")
    who = user if isinstance(user, str) else ""
    return f"{conversation or ''}\n{who}\n{first[:MAX_KEY_CHARS]}"


def bucket(canary_id: str, key: str) -> float:
    """A stable fraction in [0, 1) for a conversation under one canary."""
    digest = hashlib.sha256(f"{canary_id}\n{key}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64


@dataclass(frozen=True)
class Route:
    """Where one request goes while a canary runs."""

    record: CanaryRecord
    arm: str  # canary | current

    def meta(self) -> dict[str, str]:
        return {"id": self.record.id, "arm": self.arm}


class CanaryRouter:
    """Routes requests between the current version and the canary (see the module
    docstring). ``build(snapshot)`` makes the chat adapter of a canary (``Engine.chat_adapter
    (snapshot=...)``)."""

    def __init__(self, library: Library, build: Callable[[Snapshot], ChatAdapter]) -> None:
        self.library = library
        self.state = LearningState(library)
        self._build = build
        self.metrics = Metrics()  # the server's, once ``attach`` is called
        self._adapter: tuple[str, ChatAdapter] | None = None
        self._lock = threading.Lock()

    def attach(self, metrics: Metrics) -> None:
        """Count routes in the server's ``metrics`` and add the learning state to them."""
        self.metrics = metrics
        metrics.extra.append(self.metric_lines)

    def route(self, key: str) -> Route | None:
        """The route of a request with conversation ``key``; None when no canary runs (or
        its base is no longer current: it was measured against that version)."""
        record = self.state.canary()
        if record is None:
            self._drop()
            return None
        if self.library.current_id() != record.base:
            return None
        arm = "canary" if bucket(record.id, key) < record.share else "current"
        self.metrics.canary_requests.inc(arm=arm)
        return Route(record, arm)

    def adapter(self, record: CanaryRecord) -> ChatAdapter:
        """The canary's adapter, built on first use (call it off the event loop)."""
        with self._lock:
            if self._adapter is not None and self._adapter[0] == record.id:
                return self._adapter[1]
            old, self._adapter = self._adapter, None
            if old is not None:
                old[1].close()
            built = self._build(self.state.canary_snapshot(record))
            self._adapter = (record.id, built)
            return built

    def _drop(self) -> None:
        """Close the adapter of a canary that ended."""
        if self._adapter is None:
            return
        with self._lock:
            old, self._adapter = self._adapter, None
        if old is not None:
            old[1].close()

    def close(self) -> None:
        self._drop()

    def metric_lines(self) -> list[str]:
        """Learning in production as ``/metrics`` shows it: the steps logged in the library,
        the running canary, and the learner's last comparison."""
        try:
            steps = Tally(s.step for s in self.state.steps())
            record = self.state.canary()
            status = self.state.status()
        except OSError as exc:  # a scrape must answer; the log says why
            log.warning("could not read the library's learning state: %s", exc)
            return []
        counted = Counter("whetstone_learning_steps_total",
                          "Steps of learning in production logged in the library "
                          "(`whetstone library log`), by step.", ("step",))
        for name in STEPS:
            counted.inc(steps.get(name, 0), step=name)
        share = Gauge("whetstone_canary_share",
                      "Share of conversations the running canary serves (0: none).")
        share.set(record.share if record is not None else 0.0)
        lines = counted.render() + share.render()
        if record is not None:
            info = Counter("whetstone_canary_info", "The running canary and its base version.",
                           ("canary", "base"))
            info.inc(1, canary=record.id, base=record.base)
            lines += info.render()
            compared = status.get("comparison") if status.get("canary") == record.id else None
            if isinstance(compared, dict):
                lines += _comparison_lines(compared)
        return lines


def _comparison_lines(c: dict[str, object]) -> list[str]:
    """The learner's last comparison (``status.json``) as labelled gauges."""
    try:
        bounds = [(b, float(c[k])) for b, k in (("mean", "difference"), ("low", "ci_low"),  # type: ignore[arg-type]
                                                ("high", "ci_high"))]
        arms = [(a, float(c[f"n_{a}"])) for a in ("canary", "current")]  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError):
        return []
    return [("# HELP whetstone_canary_difference The learner's last comparison: canary minus "
             "current (mean) and its 95% interval (low, high)."),
            "# TYPE whetstone_canary_difference gauge",
            *(f'whetstone_canary_difference{{bound="{b}"}} {v!r}' for b, v in bounds),
            ("# HELP whetstone_canary_scored Weighted scores in the learner's last "
             "comparison, by arm."), "# TYPE whetstone_canary_scored gauge",
            *(f'whetstone_canary_scored{{arm="{a}"}} {v!r}' for a, v in arms)]


__all__ = ["CONVERSATION_HEADER", "CanaryRouter", "Route", "bucket", "conversation_key"]
