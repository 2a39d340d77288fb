"""OpenAI chat-completion logs as JSONL: one exchange per line.

Two shapes are read (docs/observability.md has an example of each):

* the conversation shape of fine-tuning files and eval logs: ``{"messages": [...]}`` whose
  last assistant message is the answer; assistant messages with ``tool_calls`` and the
  ``tool`` messages answering them before it are the run's steps;
* the request and response shape of a logging proxy: ``{"request": {"messages", "model",
  "tools"}, "response": <a chat.completion>}`` (also ``{"messages": [...], "response": ...}``
  or ``{"messages": [...], "choices": [...]}``): the response's first choice is the answer.

Optional on every line: ``id`` (the record's own id: re-importing it is recognised), ``score``
(0 to 1), ``label`` (a verdict such as ``correct``/``incorrect`` or a boolean, read as a score;
any other text is kept as the feedback's comment), ``comment``, ``expected`` (or ``ideal``:
the expected answer, which makes the trace a gate task), ``model``, ``created``/``timestamp``
and ``metadata`` (an object, kept).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from whetstone.engine.types import Step
from whetstone.library_store.trace_import.common import (
    BadRecord,
    Imported,
    build,
    content_key,
    feedback,
    number,
    origin_key,
    parse_json,
    text_of,
)

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
FORMAT = "openai"


def _message(m: Any, i: int) -> dict[str, Any]:
    if not isinstance(m, Mapping):
        raise BadRecord(f"messages[{i}] is not an object")
    role = m.get("role")
    if role not in ROLES:
        raise BadRecord(f"messages[{i}] has role {role!r}; roles: {', '.join(ROLES)}")
    calls = m.get("tool_calls") or ()
    if not isinstance(calls, Sequence) or isinstance(calls, str) \
            or not all(isinstance(c, Mapping) for c in calls):
        raise BadRecord(f"messages[{i}].tool_calls must be a list of objects")
    return dict(m)


def _when(record: Mapping[str, Any], response: Mapping[str, Any]) -> float | None:
    for value in (record.get("created"), record.get("timestamp"), response.get("created")):
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value).timestamp()
            except ValueError:
                raise BadRecord(f"time {value!r} is not ISO 8601 or unix seconds") from None
        seconds = number(value, "created")
        if seconds is not None:
            return seconds
    return None


def _split(record: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    """(request messages, the request, the response) of either shape."""
    inner = record.get("request")
    request: Mapping[str, Any] = inner if isinstance(inner, Mapping) else record
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRecord("no 'messages' list (or 'request.messages')")
    response = record.get("response")
    if response is None and isinstance(record.get("choices"), list):
        response = {k: record[k] for k in ("choices", "usage", "model", "created")
                    if k in record}
    if response is not None and not isinstance(response, Mapping):
        raise BadRecord("'response' is not an object")
    return messages, dict(request), dict(response or {})


def _reply(response: Mapping[str, Any]) -> dict[str, Any] | None:
    choices = response.get("choices")
    if not response:
        return None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping) \
            or not isinstance(choices[0].get("message"), Mapping):
        raise BadRecord("'response' has no choices[0].message")
    return {"role": "assistant", **dict(choices[0]["message"])}


def _steps(messages: list[dict[str, Any]], start: int, usage: Mapping[str, Any],
           model: str, started: float) -> tuple[list[Step], str | None]:
    """The think and act steps of the messages after the task, and the answer."""
    steps: list[Step] = []
    calls: dict[str, tuple[str, Any]] = {}
    answer: str | None = None
    thinks = [i for i in range(start, len(messages)) if messages[i]["role"] == "assistant"]
    for i in range(start, len(messages)):
        m = messages[i]
        if m["role"] == "assistant":
            tool_calls = [dict(c) for c in m.get("tool_calls") or ()]
            for c in tool_calls:
                given = c.get("function")
                fn: Mapping[str, Any] = given if isinstance(given, Mapping) else c
                calls[str(c.get("id") or "")] = (str(fn.get("name") or ""),
                                                 fn.get("arguments"))
            last = i == thinks[-1]
            prompt = int(number(usage.get("prompt_tokens"), "usage.prompt_tokens") or 0) \
                if last else 0
            completion = int(number(usage.get("completion_tokens"),
                                    "usage.completion_tokens") or 0) if last else 0
            text = text_of(m.get("content"))
            steps.append(Step(
                kind="think", module="think", route="think", started=started,
                input={"messages": messages[:i]} if i == thinks[0] else None,
                output={"completion": {"text": text, "tool_calls": tool_calls,
                                       "prompt_tokens": prompt,
                                       "completion_tokens": completion, "model": model}},
                tokens=prompt + completion))
            answer = None if tool_calls else text
        elif m["role"] in ("tool", "function"):
            name, args = calls.get(str(m.get("tool_call_id") or ""),
                                   (str(m.get("name") or "tool"), None))
            if isinstance(args, str):
                try:
                    args = parse_json(args)
                except ValueError:
                    pass
            steps.append(Step(kind="act", module="act", route="think", started=started,
                              input={"tool": name, "arguments": args if args is not None
                                     else {}},
                              output={"observation": text_of(m.get("content"))}))
    return steps, answer


def trace_of_record(record: Any, source: str, line: int) -> Imported:
    """One JSONL record as one imported trace; ``BadRecord`` saying why it cannot be."""
    if not isinstance(record, Mapping):
        raise BadRecord("the line is not a JSON object")
    raw_messages, request, response = _split(record)
    messages = [_message(m, i) for i, m in enumerate(raw_messages)]
    reply = _reply(response)
    if reply is not None:
        messages.append(_message(reply, len(messages)))
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise BadRecord("no user message: nothing says what the task was")
    # The task is the last user turn that an assistant answered (or the last one).
    answered = [i for i in users if any(m["role"] == "assistant" for m in messages[i + 1:])]
    task_at = answered[-1] if answered else users[-1]
    model = str(record.get("model") or request.get("model") or response.get("model") or "")
    started = _when(record, response)
    usage = response.get("usage") or record.get("usage") or {}
    if not isinstance(usage, Mapping):
        raise BadRecord("'usage' is not an object")
    when = started if started is not None else time.time()
    steps, answer = _steps(messages, task_at + 1, usage, model, when)
    score, meta = feedback(record.get("score"), record.get("label"),
                           record.get("comment", record.get("feedback")))
    expected = record.get("expected", record.get("ideal"))
    metadata = record.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise BadRecord("'metadata' is not an object")
    if metadata:
        meta["metadata"] = dict(metadata)
        for key in ("task_id", "task_set", "scorer"):
            if isinstance(metadata.get(key), str):
                meta[key] = metadata[key]
    own = record.get("id")
    if own is not None and not isinstance(own, (str, int)):
        raise BadRecord("'id' is not text or a number")
    key = origin_key(FORMAT, str(own)) if own is not None else content_key(FORMAT, record)
    where = f"line {line}" + (f" (id {own})" if own is not None else "")
    if request.get("tools"):
        meta["tools"] = [t.get("function", t).get("name") for t in request["tools"]
                         if isinstance(t, Mapping)]
    return build(FORMAT, source, where, key, task=text_of(messages[task_at].get("content")),
                 steps=steps, answer=answer, model=model, started=when, ended=when,
                 label=None if expected is None else text_of(expected), score=score,
                 meta=meta)


def read_openai(text: str, source: str, skipped: list[str]) -> Iterator[Imported]:
    """The traces of a JSONL log's ``text``; a line that cannot be read goes to ``skipped``
    as ``source:line: why``."""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = parse_json(line)
        except ValueError as exc:
            skipped.append(f"{source}:{n}: not JSON ({exc})")
            continue
        try:
            built = trace_of_record(record, source, n)
        except BadRecord as exc:
            skipped.append(f"{source}:{n}: {exc}")
            continue
        yield built


__all__ = ["read_openai", "trace_of_record"]
