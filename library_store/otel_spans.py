"""A finished ``Trace`` as OpenTelemetry span data, with no OpenTelemetry import (issue 39).

One root span per trace (``whetstone.run`` for an agent run, ``whetstone.chat`` for a chat
exchange, ...), one child per model call (``chat <model>``) and one per tool call
(``execute_tool <name>``), every other step as a ``whetstone.<kind>`` child. Attributes follow
the OpenTelemetry GenAI conventions (``gen_ai.*``) and, where Arize Phoenix reads its own,
OpenInference (``openinference.span.kind``, ``llm.token_count.*``, ``input.value``).

Content (the task, the answer, messages, tool arguments and results) is written only with
``content=True``; without it a span holds names, ids, models, token counts, timings, versions
and outcomes. The OpenTelemetry trace id is derived from the Whetstone trace id, so feedback
sent later (``feedback_span``) joins the same trace. ``otel_export`` turns these records into
SDK spans.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine.types import Step, Trace
from .trace_build import trace_kind

AttrValue = str | bool | int | float | Sequence[str]
# A span attribute is capped: a long prompt must not become a multi-megabyte span.
MAX_CONTENT_CHARS = 16_000
ROOT_NAMES: dict[str, str] = {"agent": "whetstone.run", "chat": "whetstone.chat",
                              "direct": "whetstone.direct", "verify": "whetstone.verify",
                              "mcp": "whetstone.log_run"}
# Kinds that are an agent's run (GenAI's invoke_agent); the rest are one chain of calls.
AGENT_KINDS = frozenset({"agent", "mcp"})


@dataclass(frozen=True)
class SpanEvent:
    """A span event: its name, time (ns since the epoch) and attributes."""

    name: str
    time_ns: int
    attributes: Mapping[str, AttrValue] = field(default_factory=dict)


@dataclass(frozen=True)
class SpanRecord:
    """One span to export. ``kind`` is OpenTelemetry's (``internal`` or ``client``)."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    start_ns: int
    end_ns: int
    attributes: Mapping[str, AttrValue]
    kind: str = "internal"
    error: str | None = None  # the status description of a failed span
    events: tuple[SpanEvent, ...] = ()


def _digest(text: str, n: int) -> int:
    value = int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:n],
                           "big")
    return value or 1  # 0 is OpenTelemetry's invalid id


def otel_trace_id(trace_id: str) -> int:
    """The 128-bit OpenTelemetry trace id of a Whetstone trace: the same every time, so a
    later record of the trace (its feedback) lands in the same OpenTelemetry trace."""
    return _digest("whetstone-trace:" + trace_id, 16)


def otel_span_id(trace_id: str, part: str) -> int:
    """The 64-bit id of span ``part`` (``root``, ``step-3``) of a Whetstone trace."""
    return _digest(f"whetstone-span:{trace_id}:{part}", 8)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_CONTENT_CHARS else text[:MAX_CONTENT_CHARS] + " …[cut]"


def _json(value: Any) -> str:
    return _cut(json.dumps(value, ensure_ascii=False, default=str))


def _text_of(content: Any) -> str:
    """A message's content as text; image parts become ``[image]`` (no data URLs leave)."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                parts.append(str(part.get("text", "")) if part.get("type") == "text"
                             else "[image]")
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return "" if content is None else str(content)


def _messages(raw: Any) -> list[dict[str, Any]]:
    """Step messages as GenAI's ``gen_ai.input.messages`` shape (role and text parts)."""
    out: list[dict[str, Any]] = []
    for m in raw if isinstance(raw, Sequence) and not isinstance(raw, str) else ():
        if isinstance(m, Mapping):
            out.append({"role": str(m.get("role", "user")),
                        "parts": [{"type": "text", "content": _cut(_text_of(m.get("content")))}]})
    return out


def _error_type(error: str) -> str:
    """``"BackendError: the upstream ..."`` -> ``BackendError`` (GenAI's ``error.type``)."""
    head = error.split(":", 1)[0].strip()
    return head if head.isidentifier() else "error"


def _skills(trace: Trace) -> list[str]:
    info = trace.meta.get("skills")
    shown = info.get("shown") if isinstance(info, Mapping) else None
    return [str(s) for s in shown] if isinstance(shown, Sequence) and not isinstance(
        shown, str) else []


def _usage(step: Step) -> tuple[int, int]:
    meta = step.meta or {}
    prompt, completion = meta.get("prompt_tokens"), meta.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        return prompt, completion
    return 0, step.tokens


def _completion(step: Step) -> Mapping[str, Any]:
    out = step.output if isinstance(step.output, Mapping) else {}
    c = out.get("completion")
    return c if isinstance(c, Mapping) else {}


def _is_model_call(step: Step) -> bool:
    """A step that called the model: a ``think`` step with the messages it sent (the
    runtime's, a chat exchange's), or any method step that recorded its call's usage."""
    sent = isinstance(step.input, Mapping) and "messages" in step.input
    return step.kind == "think" and sent or "prompt_tokens" in (step.meta or {})


def _model_span(step: Step, trace: Trace, content: bool) -> tuple[str, dict[str, AttrValue]]:
    completion = _completion(step)
    model = str(completion.get("model") or trace.model or "model")
    prompt, output = _usage(step)
    attrs: dict[str, AttrValue] = {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": trace.model or model,
        "gen_ai.response.model": model, "gen_ai.usage.input_tokens": prompt,
        "gen_ai.usage.output_tokens": output,
        "openinference.span.kind": "LLM", "llm.model_name": model,
        "llm.token_count.prompt": prompt, "llm.token_count.completion": output,
        "llm.token_count.total": prompt + output,
    }
    if completion.get("finish_reason"):
        attrs["gen_ai.response.finish_reasons"] = [str(completion["finish_reason"])]
    if content:
        messages = _messages(step.input.get("messages") if isinstance(step.input, Mapping)
                             else None)
        reply = _cut(str(completion.get("text") or ""))
        attrs["gen_ai.input.messages"] = _json(messages)
        attrs["gen_ai.output.messages"] = _json(
            [{"role": "assistant", "parts": [{"type": "text", "content": reply}]}])
        attrs["input.value"] = _json(messages)
        attrs["input.mime_type"] = "application/json"
        attrs["output.value"] = reply
        for i, m in enumerate(messages):
            attrs[f"llm.input_messages.{i}.message.role"] = m["role"]
            attrs[f"llm.input_messages.{i}.message.content"] = m["parts"][0]["content"]
        attrs["llm.output_messages.0.message.role"] = "assistant"
        attrs["llm.output_messages.0.message.content"] = reply
    return f"chat {model}", attrs


def _tool_span(step: Step, content: bool) -> tuple[str, dict[str, AttrValue]]:
    data = step.input if isinstance(step.input, Mapping) else {}
    name = str(data.get("tool") or "tool")
    attrs: dict[str, AttrValue] = {"gen_ai.operation.name": "execute_tool",
                                   "gen_ai.tool.name": name, "tool.name": name,
                                   "openinference.span.kind": "TOOL"}
    out = step.output if isinstance(step.output, Mapping) else {}
    if out.get("timed_out"):
        attrs["whetstone.tool.timed_out"] = True
    if content:
        args = data.get("arguments")
        result = _cut(str(out.get("observation") or ""))
        attrs["gen_ai.tool.call.arguments"] = _json(args)
        attrs["gen_ai.tool.call.result"] = result
        attrs["input.value"] = _json(args)
        attrs["input.mime_type"] = "application/json"
        attrs["output.value"] = result
    return f"execute_tool {name}", attrs


def _step_span(step: Step, index: int, trace: Trace, root: int, content: bool,
               bounds: tuple[int, int]) -> SpanRecord:
    if step.kind == "act":
        name, attrs = _tool_span(step, content)
        kind = "internal"
    elif _is_model_call(step):
        name, attrs = _model_span(step, trace, content)
        kind = "client"  # a call to a model server (GenAI's span kind for inference)
    else:
        name, attrs = f"whetstone.{step.kind}", {"openinference.span.kind": "CHAIN"}
        kind = "internal"
        if step.tokens:
            attrs["whetstone.step.tokens"] = step.tokens
        if content:  # a step without an input or output has none (not "null", as
            # Phoenix showed a `finish` step's input)
            if step.input is not None:
                attrs["input.value"] = _json(step.input)
            if step.output is not None:
                attrs["output.value"] = _json(step.output)
    attrs.update({"whetstone.step.index": index, "whetstone.step.kind": step.kind,
                  "whetstone.step.module": step.module})
    start = min(max(_ns(step.started), bounds[0]), bounds[1])
    end = min(max(start, _ns(step.started + max(0.0, step.duration_s))), bounds[1])
    error = None
    if step.error:
        attrs["error.type"] = kind_of_error = _error_type(step.error)
        error = _cut(step.error) if content else kind_of_error
    return SpanRecord(name=name, trace_id=otel_trace_id(trace.id),
                      span_id=otel_span_id(trace.id, f"step-{index}"), parent_id=root,
                      start_ns=start, end_ns=end, attributes=attrs, kind=kind, error=error)


def _root_attributes(trace: Trace, kind: str, content: bool) -> dict[str, AttrValue]:
    attrs: dict[str, AttrValue] = {
        "openinference.span.kind": "AGENT" if kind in AGENT_KINDS else "CHAIN",
        "whetstone.trace.id": trace.id, "whetstone.trace.kind": kind,
        "whetstone.outcome": trace.outcome, "whetstone.total_tokens": trace.total_tokens,
        "whetstone.library.version": trace.library_version or "",
        "whetstone.skills": _skills(trace),
    }
    if kind in AGENT_KINDS:
        attrs["gen_ai.operation.name"] = "invoke_agent"
        attrs["gen_ai.agent.name"] = "whetstone"
    if trace.model:
        attrs["gen_ai.request.model"] = trace.model
        attrs["llm.model_name"] = trace.model
    if trace.score is not None:
        attrs["whetstone.score"] = float(trace.score)
    for key in ("task_set", "request_id", "run_id"):
        value = trace.meta.get(key)
        if isinstance(value, str) and value:
            attrs[f"whetstone.{key}"] = value
    canary = trace.meta.get("canary")
    if isinstance(canary, Mapping) and isinstance(canary.get("id"), str):
        attrs["whetstone.canary.id"] = canary["id"]
        attrs["whetstone.canary.arm"] = str(canary.get("arm", ""))
    conversation = trace.meta.get("thread_id") or trace.meta.get("session_id")
    if isinstance(conversation, str) and conversation:
        attrs["session.id"] = conversation
        attrs["gen_ai.conversation.id"] = conversation
    if content:
        attrs["whetstone.task"] = _cut(trace.task)
        attrs["input.value"] = _cut(trace.task)
        if trace.answer is not None:
            attrs["whetstone.answer"] = _cut(trace.answer)
            attrs["output.value"] = _cut(trace.answer)
        if trace.label is not None:
            attrs["whetstone.label"] = _cut(trace.label)
        feedback = trace.meta.get("feedback")
        if isinstance(feedback, str):
            attrs["whetstone.feedback.comment"] = _cut(feedback)
    return attrs


def trace_spans(trace: Trace, *, content: bool = False) -> list[SpanRecord]:
    """The spans of a finished ``trace``: its root first, then one child per step, each with
    the times the trace recorded. ``content``: also the task, answer, messages and tool data."""
    kind = trace_kind(trace)
    start = _ns(trace.started)
    ends = [_ns(s.started + max(0.0, s.duration_s)) for s in trace.steps]
    end = max([start, *ends, *([_ns(trace.ended)] if trace.ended is not None else [])])
    root = otel_span_id(trace.id, "root")
    error = None
    if trace.outcome == "error":
        why = trace.error or "the run failed"
        error = _cut(why) if content else _error_type(why)
    attrs = _root_attributes(trace, kind, content)
    if error is not None:
        attrs["error.type"] = _error_type(trace.error or "")
    spans = [SpanRecord(name=ROOT_NAMES.get(kind, f"whetstone.{kind}"),
                        trace_id=otel_trace_id(trace.id), span_id=root, parent_id=None,
                        start_ns=start, end_ns=end, attributes=attrs, error=error)]
    spans += [_step_span(s, i, trace, root, content, (start, end))
              for i, s in enumerate(trace.steps)]
    return spans


def feedback_span(trace: Trace, score: float, comment: str | None, *, content: bool = False,
                  now: float | None = None) -> SpanRecord:
    """A ``whetstone.feedback`` span in ``trace``'s OpenTelemetry trace, a child of its root,
    carrying the score (the comment only with ``content``) as attributes and as an event."""
    when = _ns(time.time() if now is None else now)
    attrs: dict[str, AttrValue] = {"openinference.span.kind": "EVALUATOR",
                                   "whetstone.trace.id": trace.id,
                                   "whetstone.feedback.score": float(score)}
    if content and comment is not None:
        attrs["whetstone.feedback.comment"] = _cut(comment)
    span_id = int.from_bytes(os.urandom(8), "big") or 1  # each label is its own span
    return SpanRecord(name="whetstone.feedback", trace_id=otel_trace_id(trace.id),
                      span_id=span_id, parent_id=otel_span_id(trace.id, "root"),
                      start_ns=when, end_ns=when, attributes=attrs,
                      events=(SpanEvent("whetstone.feedback", when, dict(attrs)),))


def learning_span(step: Mapping[str, Any]) -> SpanRecord:
    """A step of learning in production (``library_store.learning.Step.to_dict()``) as a
    ``whetstone.learning.<step>`` span; the steps of one canary share an OpenTelemetry trace
    (its id made from the canary's), so a backend shows a canary's life as one tree. Its
    figures are attributes (``whetstone.learning.<name>``, nested names joined with dots)."""
    when = _ns(float(step.get("time") or time.time()))
    canary = step.get("canary")
    key = f"canary:{canary}" if canary else f"step:{step.get('step')}:{step.get('time')}"
    attrs: dict[str, AttrValue] = {"whetstone.learning.step": str(step.get("step", "")),
                                   "whetstone.library.version": str(step.get("base", ""))}
    if canary:
        attrs["whetstone.canary.id"] = str(canary)
    if step.get("version"):
        attrs["whetstone.learning.version"] = str(step["version"])
    if step.get("holder"):
        attrs["whetstone.learning.holder"] = str(step["holder"])

    def flatten(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                flatten(f"{prefix}.{k}", v)
        elif isinstance(value, (bool, int, float, str)):
            attrs[prefix] = value

    flatten("whetstone.learning", dict(step.get("figures") or {}))
    span_id = int.from_bytes(os.urandom(8), "big") or 1
    return SpanRecord(name=f"whetstone.learning.{step.get('step')}",
                      trace_id=_digest("whetstone-learning:" + key, 16), span_id=span_id,
                      parent_id=None, start_ns=when, end_ns=when, attributes=attrs,
                      events=(SpanEvent(f"whetstone.learning.{step.get('step')}", when,
                                        {"whetstone.learning.step": str(step.get("step"))}),))


__all__ = ["MAX_CONTENT_CHARS", "ROOT_NAMES", "SpanEvent", "SpanRecord", "feedback_span",
           "learning_span", "otel_span_id", "otel_trace_id", "trace_spans"]
