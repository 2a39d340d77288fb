"""``scripted:`` — the test double. Replays given completions in order and fails loudly when
it runs out, like DSPy's ``DummyLM``. It records every request so tests can assert on the
prompts that were built.

Replies may be strings, ``Completion`` objects, dicts (``{"text": ..., "tool_calls": [...]}``)
or, for a responder, a callable ``Request -> reply`` used for every call (load tests).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ScriptExhausted
from ..types import Completion, Request, ToolCall
from .base import Backend, Capabilities, StreamChunk
from .registry import BackendOptions

Reply = str | Completion | dict


def _as_completion(reply: Reply, request: Request, latency: float) -> Completion:
    if isinstance(reply, Completion):
        return reply
    if isinstance(reply, str):
        reply = {"text": reply}
    calls = tuple(
        ToolCall(
            name=c["name"],
            arguments=c["arguments"] if isinstance(c.get("arguments"), str)
            else json.dumps(c.get("arguments", {})),
            id=c.get("id") or f"call_{i}",
        )
        for i, c in enumerate(reply.get("tool_calls") or ())
    )
    text = reply.get("text", "")
    if request.prefix and not text.startswith(request.prefix):
        text = request.prefix + text  # a reply scripted as the model's continuation
    prompt_tokens = sum(len(m.text) // 4 + 1 for m in request.messages)
    return Completion(
        text=text,
        finish_reason=reply.get("finish_reason", "tool_calls" if calls else "stop"),
        prompt_tokens=prompt_tokens,
        completion_tokens=max(1, len(text) // 4) if text else len(calls),
        latency_s=latency,
        tool_calls=calls,
        model="scripted",
    )


class ScriptedBackend(Backend):
    """Replays ``replies`` in order; ``responder`` answers every request instead when given.

    ``delay_s`` sleeps per call (to make parallelism measurable); ``tool_calls`` says whether to
    advertise native tool calls, so the runtime's text-format path can be tested too.

    Replies are taken in call order, so with replies (no responder) the backend is
    ``ordered`` and decodes one call at a time (``max_concurrency`` 1): ``eval -j auto`` runs
    one task at a time and an explicit ``-j N`` is brought down to 1, so each task gets the
    replies written for it, in task order, at every ``-j``. A responder answers each request
    from its content, at any concurrency.
    """

    def __init__(
        self,
        replies: Sequence[Reply] = (),
        *,
        responder: Callable[[Request], Reply] | None = None,
        delay_s: float = 0.0,
        tool_calls: bool = False,
        vision: bool = False,
        max_concurrency: int = 64,
        prefill: bool = False,
    ) -> None:
        self._replies = list(replies)
        self._responder = responder
        self._delay_s = delay_s
        self._lock = threading.Lock()
        self.requests: list[Request] = []
        self.spec = "scripted:"
        ordered = responder is None
        self.capabilities = Capabilities(
            vision=vision, tool_calls=tool_calls, streaming=True,
            max_concurrency=1 if ordered else max_concurrency, prefill=prefill, ordered=ordered,
        )

    def __getstate__(self) -> dict[str, Any]:
        # Picklable (for Ray workers): the lock is recreated on the other side.
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def remaining(self) -> int:
        return len(self._replies)

    def _next(self, request: Request) -> Reply:
        with self._lock:
            self.requests.append(request)
            if self._responder is not None:
                return self._responder(request)
            if not self._replies:
                last = request.messages[-1].text[:300] if request.messages else ""
                raise ScriptExhausted(
                    f"scripted backend ran out of replies after {len(self.requests) - 1} "
                    f"call(s); the extra request ended with: {last!r}",
                    hint="give the ScriptedBackend one reply per expected model call",
                )
            return self._replies.pop(0)

    def complete(self, request: Request) -> Completion:
        start = time.perf_counter()
        reply = self._next(request)
        if self._delay_s:
            time.sleep(self._delay_s)
        return _as_completion(reply, request, time.perf_counter() - start)

    async def acomplete(self, request: Request) -> Completion:
        start = time.perf_counter()
        reply = self._next(request)
        if self._delay_s:
            await asyncio.sleep(self._delay_s)  # no thread per call: load tests use 200 at once
        return _as_completion(reply, request, time.perf_counter() - start)

    def stream(self, request: Request) -> Iterator[StreamChunk]:
        completion = self.complete(request)
        for i, word in enumerate(completion.text.split(" ")):
            yield StreamChunk(text=word if i == 0 else " " + word)
        yield StreamChunk(completion=completion)

    def count_tokens(self, text: str) -> int:
        return max(1, len(text) // 4) if text else 0


def make_scripted(arg: str, options: BackendOptions) -> ScriptedBackend:
    """``scripted:`` (no replies) or ``scripted:replies.json`` (a JSON list of replies)."""
    if not arg:
        return ScriptedBackend(tool_calls=bool(options.extra.get("tool_calls", False)))
    path = Path(arg)
    if not path.exists():
        raise ConfigError(
            f"scripted replies file {arg!r} does not exist",
            hint="pass scripted:<file.json> holding a JSON list of replies",
        )
    try:
        data: Any = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{arg}: not valid JSON ({exc})",
                          hint="the file must hold a JSON list of strings or objects") from exc
    if isinstance(data, dict):
        replies, tool_calls = data.get("replies", []), bool(data.get("tool_calls", False))
        delay = float(data.get("delay_s", 0.0))
    else:
        replies, tool_calls, delay = data, False, 0.0
    if not isinstance(replies, list):
        raise ConfigError(f"{arg}: expected a list of replies", hint="see engine/backends/scripted.py")
    return ScriptedBackend(replies, tool_calls=tool_calls, delay_s=delay)
