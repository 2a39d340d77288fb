"""One trace of spans as a ``Trace``: the root span is the run, its LLM and tool spans the
steps. Shared by the OTLP JSON reader and the Phoenix reader, which differ only in how spans
arrive.

Attributes are read as the OpenInference conventions (``openinference.span.kind``,
``input.value``/``output.value``, ``llm.model_name``, ``llm.token_count.*``,
``llm.input_messages.N.message.*``, ``llm.output_messages.N.message.*``, ``tool.name``) and the
OpenTelemetry GenAI conventions (``gen_ai.operation.name``, ``gen_ai.request.model``,
``gen_ai.usage.input_tokens``/``output_tokens``, ``gen_ai.input.messages``/``output.messages``,
the older ``gen_ai.prompt``/``gen_ai.completion``, ``gen_ai.tool.name``,
``gen_ai.tool.call.arguments``/``result``) write them, and Whetstone's own ``whetstone.*``
attributes (task, answer, label, score, outcome, and the score of a later
``whetstone.feedback`` span) win over both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from whetstone.engine.types import Step
from whetstone.library_store.trace_import.common import (
    BadRecord,
    Imported,
    build,
    feedback,
    number,
    origin_key,
    outcome_of,
    parse_json,
    text_of,
)

_TRACE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_LLM_OPS = ("chat", "text_completion", "generate_content", "completion")
_TOOL_OPS = ("execute_tool",)
_AGENT_OPS = ("invoke_agent", "create_agent")


@dataclass
class Span:
    """One span as both readers see it: ids in hex, times in seconds, attributes flat."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start: float
    end: float | None
    attrs: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # the status message of a span whose status is ERROR
    kind: str = ""  # the OpenInference span kind, when the source states it apart

    @property
    def span_kind(self) -> str:
        """LLM, TOOL, AGENT, CHAIN, ...: as stated, else read from the GenAI operation."""
        stated = self.kind or self.attrs.get("openinference.span.kind")
        if isinstance(stated, str) and stated:
            return stated.upper()
        op = self.attrs.get("gen_ai.operation.name")
        if op in _LLM_OPS:
            return "LLM"
        if op in _TOOL_OPS or "gen_ai.tool.name" in self.attrs:
            return "TOOL"
        if op in _AGENT_OPS:
            return "AGENT"
        if "llm.model_name" in self.attrs or "gen_ai.request.model" in self.attrs:
            return "LLM"
        return "CHAIN"


def _loads(value: Any) -> Any:
    """``value`` parsed when it is JSON text, else as it is."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return parse_json(value)
        except ValueError:
            return value
    return value


def indexed(attrs: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    """Flattened list attributes (``prefix.0.rest``, ``prefix.1.rest``) as a list of dicts of
    ``rest`` -> value, in index order."""
    items: dict[int, dict[str, Any]] = {}
    head = prefix + "."
    for key, value in attrs.items():
        if not key.startswith(head):
            continue
        index, _, rest = key[len(head):].partition(".")
        if index.isdigit():
            items.setdefault(int(index), {})[rest] = value
    return [items[i] for i in sorted(items)]


def _oi_message(flat: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenInference message (``message.role``, ``message.content``,
    ``message.contents.N.message_content.text``, ``message.tool_calls.N.tool_call.*``) as an
    OpenAI chat message."""
    content = flat.get("message.content")
    if content is None:
        parts = indexed(flat, "message.contents")
        content = "".join(str(p.get("message_content.text", "")) for p in parts)
    msg: dict[str, Any] = {"role": str(flat.get("message.role") or "user"),
                           "content": text_of(content)}
    calls = [{"id": str(c.get("tool_call.id") or ""), "type": "function",
              "function": {"name": str(c.get("tool_call.function.name") or ""),
                           "arguments": text_of(c.get("tool_call.function.arguments") or {})}}
             for c in indexed(flat, "message.tool_calls")]
    if calls:
        msg["tool_calls"] = calls
    for key, out in (("message.tool_call_id", "tool_call_id"), ("message.name", "name")):
        if flat.get(key) is not None:
            msg[out] = str(flat[key])
    return msg


def _genai_message(m: Any) -> dict[str, Any]:
    """A GenAI semconv message (``{"role", "parts": [{"type": "text", "content"}, {"type":
    "tool_call", ...}, {"type": "tool_call_response", ...}]}``) or an OpenAI-style one as an
    OpenAI chat message."""
    if not isinstance(m, Mapping):
        return {"role": "user", "content": text_of(m)}
    if "parts" not in m:
        return {"role": str(m.get("role") or "user"), "content": text_of(m.get("content")),
                **({"tool_calls": list(m["tool_calls"])} if m.get("tool_calls") else {})}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    out: dict[str, Any] = {"role": str(m.get("role") or "user")}
    for p in m.get("parts") or ():
        if not isinstance(p, Mapping):
            continue
        if p.get("type") == "tool_call":
            calls.append({"id": str(p.get("id") or ""), "type": "function",
                          "function": {"name": str(p.get("name") or ""),
                                       "arguments": text_of(p.get("arguments") or {})}})
        elif p.get("type") == "tool_call_response":
            out.update(role="tool", tool_call_id=str(p.get("id") or ""))
            texts.append(text_of(p.get("response")))
        else:
            texts.append(text_of(p.get("content", p.get("text"))))
    out["content"] = "".join(texts)
    if calls:
        out["tool_calls"] = calls
    return out


def _messages(attrs: Mapping[str, Any], side: str) -> list[dict[str, Any]]:
    """The input (``side`` "input") or output messages of an LLM span, from whichever
    convention wrote them."""
    oi = indexed(attrs, f"llm.{side}_messages")
    if oi:
        return [_oi_message(m) for m in oi]
    for key in (f"gen_ai.{side}.messages",
                "gen_ai.prompt" if side == "input" else "gen_ai.completion"):
        value = _loads(attrs.get(key))
        if isinstance(value, list):
            return [_genai_message(m) for m in value]
        if isinstance(value, str) and value:
            return [{"role": "user" if side == "input" else "assistant", "content": value}]
    old = indexed(attrs, "gen_ai.prompt" if side == "input" else "gen_ai.completion")
    if old:  # OpenLLMetry's indexed form: gen_ai.prompt.0.role, gen_ai.prompt.0.content
        return [{"role": str(m.get("role") or ("user" if side == "input" else "assistant")),
                 "content": text_of(m.get("content"))} for m in old]
    value = _loads(attrs.get(f"{side}.value"))
    if isinstance(value, Mapping) and isinstance(value.get("messages"), list):
        return [_genai_message(m) for m in value["messages"]]
    if isinstance(value, Mapping) and isinstance(value.get("choices"), list) and value["choices"]:
        first = value["choices"][0]
        return [_genai_message(first.get("message") if isinstance(first, Mapping) else first)]
    if value not in (None, ""):
        return [{"role": "user" if side == "input" else "assistant", "content": text_of(value)}]
    return []


def _tokens(attrs: Mapping[str, Any], where: str) -> tuple[int, int]:
    """(prompt, completion) tokens of an LLM span; 0 where not recorded."""
    def first(*keys: str) -> int:
        for k in keys:
            value = number(attrs.get(k), f"{where}: {k}")
            if value is not None:
                return max(0, int(value))
        return 0
    return (first("llm.token_count.prompt", "gen_ai.usage.input_tokens",
                  "gen_ai.usage.prompt_tokens"),
            first("llm.token_count.completion", "gen_ai.usage.output_tokens",
                  "gen_ai.usage.completion_tokens"))


def model_of(attrs: Mapping[str, Any]) -> str:
    for k in ("whetstone.model", "llm.model_name", "gen_ai.response.model",
              "gen_ai.request.model"):
        if isinstance(attrs.get(k), str) and attrs[k]:
            return str(attrs[k])
    return ""


def _think(span: Span, where: str) -> Step:
    """An LLM span as the runtime's ``think`` step (as ``chat_trace`` records one call)."""
    out = _messages(span.attrs, "output")
    reply = next((m for m in reversed(out) if m.get("role") == "assistant"), out[-1] if out
                 else {"content": ""})
    prompt, completion = _tokens(span.attrs, where)
    return Step(kind="think", module="think", route="think", started=span.start,
                duration_s=max(0.0, (span.end or span.start) - span.start),
                input={"messages": _messages(span.attrs, "input")},
                output={"completion": {"text": text_of(reply.get("content")),
                                       "tool_calls": list(reply.get("tool_calls") or ()),
                                       "prompt_tokens": prompt,
                                       "completion_tokens": completion,
                                       "model": model_of(span.attrs)}},
                tokens=prompt + completion, error=span.error,
                meta={"span": span.name, "prompt_tokens": prompt,
                      "completion_tokens": completion})


def _act(span: Span) -> Step:
    """A tool span as the runtime's ``act`` step: the call and what it returned."""
    a = span.attrs
    name = a.get("gen_ai.tool.name") or a.get("tool.name") or span.name
    args = _loads(a.get("gen_ai.tool.call.arguments", a.get("tool_call.function.arguments",
                                                          a.get("input.value"))))
    result = a.get("gen_ai.tool.call.result", a.get("output.value"))
    return Step(kind="act", module="act", route="think", started=span.start,
                duration_s=max(0.0, (span.end or span.start) - span.start),
                input={"tool": str(name), "arguments": args if args is not None else {}},
                output={"observation": text_of(result) if span.error is None
                        else f"Error: {span.error}"},
                error=span.error, meta={"span": span.name})


def _has_kind_below(span: Span, kind: str, children: Mapping[str, list[Span]]) -> bool:
    stack = list(children.get(span.span_id, ()))
    while stack:
        s = stack.pop()
        if s.span_kind == kind:
            return True
        stack.extend(children.get(s.span_id, ()))
    return False


def _io_text(value: Any, keys: Sequence[str]) -> str | None:
    """The text of a root's ``input.value``/``output.value``: plain text, or from a JSON
    object the first of ``keys`` (or its last user message)."""
    value = _loads(value)
    if value is None:
        return None
    if isinstance(value, Mapping):
        for k in keys:
            if k in value and value[k] is not None:
                return text_of(value[k]) if k != "messages" else _last_user(value[k])
    return text_of(value)


def _last_user(messages: Any) -> str | None:
    for m in reversed(messages if isinstance(messages, list) else []):
        if isinstance(m, Mapping) and m.get("role") in ("user", "human"):
            return text_of(m.get("content"))
    return None


def trace_of_spans(spans: Sequence[Span], fmt: str, source: str) -> Imported:
    """The spans of one trace id as one imported trace; ``BadRecord`` when they hold no run."""
    ids = {s.span_id for s in spans}
    roots = sorted((s for s in spans if not s.parent_id or s.parent_id not in ids),
                   key=lambda s: s.start)
    root = roots[0]
    where = f"trace {root.trace_id}"
    children: dict[str, list[Span]] = {}
    for s in spans:
        if s is not root and s.parent_id:
            children.setdefault(s.parent_id, []).append(s)
    steps: list[Step] = []
    for s in sorted(spans, key=lambda s: (s.start, s is not root)):
        kind = s.span_kind
        if kind in ("LLM", "TOOL") and not _has_kind_below(s, kind, children):
            steps.append(_think(s, where) if kind == "LLM" else _act(s))
    a = root.attrs
    task = a.get("whetstone.task")
    if not isinstance(task, str):
        task = _io_text(a.get("input.value"), ("task", "question", "input", "query",
                                                "messages", "prompt"))
    if task is None:
        first = next((st for st in steps if st.kind == "think"), None)
        task = _last_user(first.input.get("messages")) if first is not None else None
    if not task and "whetstone.trace.id" in a:
        # Whetstone's own spans carry the task only with --otel-content.
        raise BadRecord("exported without content; export with --otel-content to import it")
    answer = a.get("whetstone.answer")
    if answer is not None and not isinstance(answer, str):
        answer = text_of(answer)
    if answer is None and root.span_kind != "LLM":
        answer = _io_text(a.get("output.value"), ("answer", "output", "content", "result"))
    if answer is None:
        last = next((st for st in reversed(steps) if st.kind == "think"
                     and not st.output["completion"]["tool_calls"]), None)
        answer = last.output["completion"]["text"] if last is not None else None
    label = a.get("whetstone.label")
    score, verdict = a.get("whetstone.score"), a.get("whetstone.verdict")
    comment = a.get("whetstone.feedback.comment", a.get("whetstone.feedback"))
    # Feedback given after the run is a span of its own (``whetstone.feedback``): the latest
    # one says what the trace's score is now, as ``TraceStore.set_score`` would have.
    later = [s for s in spans if s.attrs.get("whetstone.feedback.score") is not None]
    if later:
        newest = max(later, key=lambda s: s.start).attrs
        score, verdict = newest["whetstone.feedback.score"], None
        comment = newest.get("whetstone.feedback.comment", comment)
    score, meta = feedback(score, verdict, comment)
    for key in ("task_id", "scorer", "task_set"):
        if isinstance(a.get(f"whetstone.{key}"), str):
            meta[key] = a[f"whetstone.{key}"]
    origin = {"trace_id": root.trace_id, "root_span": root.name}
    for key, out in (("whetstone.trace.id", "whetstone_trace_id"),
                     ("whetstone.trace.kind", "kind"),
                     ("whetstone.library.version", "library_version"),
                     ("service.name", "service")):
        if a.get(key) is not None:
            origin[out] = str(a[key])
    meta["origin"] = origin
    own = a.get("whetstone.trace.id")
    outcome = outcome_of(a.get("whetstone.outcome")) or ("error" if root.error else "answered")
    ended = max((s.end or s.start for s in spans), default=root.start)
    return build(fmt, source, where, origin_key("otlp", root.trace_id),
                 task=task or "", steps=steps, answer=answer, outcome=outcome,
                 model=model_of(a) or next((st.output["completion"]["model"] for st in steps
                                            if st.kind == "think"), ""),
                 started=root.start, ended=ended,
                 label=None if label is None else text_of(label), score=score, meta=meta,
                 trace_id=own if isinstance(own, str) and _TRACE_ID.fullmatch(own) else None,
                 error=root.error if outcome == "error" else None)


__all__ = ["Span", "indexed", "model_of", "trace_of_spans"]
