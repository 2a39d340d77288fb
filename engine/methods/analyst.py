"""Shared by the methods: render a trace for an analyst, and ask for JSON with one retry.

An analyst reply that does not parse (or fails the caller's check) is sent back once with the
error and the raw reply; a second failure is dropped and counted, never fatal.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..backends.base import Backend
from ..errors import BackendError, WhetstoneError
from ..prompts import render_prompt
from ..types import RUNTIME_STEP_KINDS, Completion, Request, Trace

T = TypeVar("T")


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 20] + " …[cut]… " + text[-15:]


def _line(kind: str, /, **values: Any) -> str:
    # Positional-only: the "checked" line fills a $kind of its own.
    return render_prompt(f"analyst_trace.yaml#{kind}", **values)


def render_trace(trace: Trace, *, max_chars: int = 6000, step_chars: int = 700) -> str:
    """A compact, readable account of a run: thoughts, actions, observations, answer (the
    wording of each line is ``engine/prompts/analyst_trace.yaml``)."""
    lines = [_line("task", task=trace.task)]
    for step in trace.steps:
        if step.kind == "think" and isinstance(step.output, Mapping):
            text = (step.output.get("completion") or {}).get("text", "")
            calls = (step.output.get("completion") or {}).get("tool_calls") or []
            if text.strip():
                lines.append(_line("model", text=_clip(text, step_chars)))
            for c in calls:
                fn = c.get("function", c)
                lines.append(_line("call", name=fn.get("name"),
                                   arguments=_clip(str(fn.get("arguments")), 200)))
        elif step.kind == "think" and step.error:
            lines.append(_line("call_failed", error=step.error))
        elif step.kind == "act" and isinstance(step.output, Mapping):
            obs = step.output.get("observation")
            if obs is not None:
                lines.append(_line("tool", tool=step.input.get("tool"),
                                   observation=_clip(str(obs), 300)))
        elif step.kind == "observe":
            lines.append(_line("unparseable", error=step.error))
        elif step.kind not in RUNTIME_STEP_KINDS and step.output:  # a method's own step
            lines.append(_line("checked", kind=step.kind,
                               output=_clip(json.dumps(step.output), 300)))
    answer = trace.answer if trace.answer is not None else _line("no_answer")
    lines.append(_line("answer", answer=answer))
    lines.append(_line("outcome", outcome=trace.outcome) if trace.outcome == "answered" else
                 _line("outcome_reason", outcome=trace.outcome, reason=trace.meta.get("reason")))
    return _clip("\n".join(lines), max_chars)


@dataclass
class AnalystStats:
    """Costs and failures of a batch of analyst calls."""

    calls: int = 0
    retries: int = 0
    dropped: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    def add(self, other: AnalystStats) -> None:
        self.calls += other.calls
        self.retries += other.retries
        self.dropped += other.dropped
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.seconds += other.seconds
        self.errors += other.errors

    def to_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "retries": self.retries, "dropped": self.dropped,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "seconds": round(self.seconds, 3),
                "errors": self.errors[:20]}


@dataclass
class AnalystReply(Generic[T]):
    value: T | None
    stats: AnalystStats
    raw: str = ""
    error: str = ""  # why the last reply was dropped (``value`` is None)


class AskAgain(Exception):  # a request to the loop, not an error anyone sees
    """Raised by a ``parse`` function for a reply that parses but should be asked for again
    (a repair that returns the code unchanged): the model is told ``message``; when no retry
    is left, ``fallback`` (the parsed value) is the answer."""

    def __init__(self, message: str, fallback: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fallback = fallback


# What the model is told after a reply that did not parse: the error, shown by default with
# ``analyst_retry``; a method with its own wording passes ``retry_prompt``.
RetryPrompt = Callable[[WhetstoneError], str]


def _default_retry(exc: WhetstoneError) -> str:
    error = exc.message + (f" ({exc.hint})" if exc.hint else "")
    return render_prompt("analyst_retry", error=error).strip()


def _exchange(messages: Sequence[Mapping[str, Any]], parse: Callable[[str], T], *,
              temperature: float, max_tokens: int, seed: int | None, retries: int,
              stop: tuple[str, ...], retry_prompt: RetryPrompt | None = None
              ) -> Generator[Request, Completion, AnalystReply[T]]:
    """The ask-parse-retry loop, without I/O: yields each request, is sent its completion (or
    thrown the call's ``BackendError``) and returns the reply, so the async evolvers, the tool
    maker and the synchronous graph nodes (Co-ReAct) share one loop."""
    stats = AnalystStats()
    convo = [dict(m) for m in messages]
    raw = ""
    for attempt in range(retries + 1):
        start = time.perf_counter()
        stats.calls += 1
        try:
            completion = yield Request(
                messages=convo, max_tokens=max_tokens, temperature=temperature,  # type: ignore
                seed=None if seed is None else seed + attempt, stop=stop)
        except BackendError as exc:
            stats.seconds += time.perf_counter() - start
            stats.dropped += 1
            stats.errors.append(f"analyst call failed: {exc.message}")
            return AnalystReply(None, stats, raw)
        stats.seconds += time.perf_counter() - start
        stats.prompt_tokens += completion.prompt_tokens
        stats.completion_tokens += completion.completion_tokens
        raw = completion.text
        try:
            return AnalystReply(parse(raw), stats, raw)
        except AskAgain as again:
            if attempt == retries:
                return AnalystReply(again.fallback, stats, raw)
            stats.retries += 1
            convo += [{"role": "assistant", "content": raw},
                      {"role": "user", "content": again.message}]
        except WhetstoneError as exc:
            error = exc.message + (f" ({exc.hint})" if exc.hint else "")
            if attempt < retries:
                stats.retries += 1
                convo += [{"role": "assistant", "content": raw},
                          {"role": "user", "content": (retry_prompt or _default_retry)(exc)}]
            else:
                stats.dropped += 1
                stats.errors.append(f"{error} | raw reply: {_clip(raw, 300)}")
                return AnalystReply(None, stats, raw, error)
    return AnalystReply(None, stats, raw)


async def ask_parsed(
    analyst: Backend,
    messages: Sequence[Mapping[str, Any]],
    parse: Callable[[str], T],
    *,
    temperature: float = 0.3,
    max_tokens: int = 1024,
    seed: int | None = None,
    retries: int = 1,
    stop: tuple[str, ...] = (),
    retry_prompt: RetryPrompt | None = None,
) -> AnalystReply[T]:
    """Ask, parse with ``parse`` (which raises ``WhetstoneError`` on a bad reply, or
    ``AskAgain`` for one to ask again), retry once showing the error and the raw reply
    (``retry_prompt`` words it), then give up and count the drop. Never raises for a bad reply
    or a failed call."""
    loop = _exchange(messages, parse, temperature=temperature, max_tokens=max_tokens,
                     seed=seed, retries=retries, stop=stop, retry_prompt=retry_prompt)
    try:
        request = next(loop)
        while True:
            try:
                completion = await analyst.acomplete(request)
            except BackendError as exc:
                request = loop.throw(exc)
            else:
                request = loop.send(completion)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def ask_parsed_sync(
    analyst: Backend,
    messages: Sequence[Mapping[str, Any]],
    parse: Callable[[str], T],
    *,
    temperature: float = 0.3,
    max_tokens: int = 1024,
    seed: int | None = None,
    retries: int = 1,
    stop: tuple[str, ...] = (),
    retry_prompt: RetryPrompt | None = None,
) -> AnalystReply[T]:
    """``ask_parsed`` for a caller that cannot await (a graph node): the same loop, with
    ``analyst.complete``."""
    loop = _exchange(messages, parse, temperature=temperature, max_tokens=max_tokens,
                     seed=seed, retries=retries, stop=stop, retry_prompt=retry_prompt)
    try:
        request = next(loop)
        while True:
            try:
                completion = analyst.complete(request)
            except BackendError as exc:
                request = loop.throw(exc)
            else:
                request = loop.send(completion)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
