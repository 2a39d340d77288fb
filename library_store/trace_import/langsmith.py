"""LangSmith run exports: a JSON list of runs (or ``{"runs": [...]}``, or one run per line).

Runs are grouped by ``trace_id`` (a run without one belongs to its root, found through
``parent_run_id``); the root run is the trace, its ``llm`` runs the ``think`` steps and its
``tool`` runs the ``act`` steps, in ``start_time`` order. Inputs and outputs are read as
LangChain writes them (serialized messages, ``generations``) or as plain OpenAI messages.
``feedback_stats`` gives the score (the key ``correctness``, ``score``, ``correct`` or
``accuracy``, else the only key); ``reference_outputs`` or ``extra.metadata.expected`` the
expected answer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from whetstone.engine.types import Step
from whetstone.library_store.trace_import.common import (
    BadRecord,
    Imported,
    build,
    feedback,
    iso_seconds,
    number,
    origin_key,
    parse_json,
    text_of,
)

FORMAT = "langsmith"
_ROLES = {"human": "user", "humanmessage": "user", "user": "user", "ai": "assistant",
          "aimessage": "assistant", "assistant": "assistant", "system": "system",
          "systemmessage": "system", "tool": "tool", "toolmessage": "tool"}
_SCORE_KEYS = ("correctness", "score", "correct", "accuracy")
_TASK_KEYS = ("question", "input", "query", "task", "prompt")
_ANSWER_KEYS = ("answer", "output", "result", "content", "text")


def _message(m: Any) -> dict[str, Any]:
    """A LangChain message (serialized ``{"lc", "id", "kwargs"}``, or ``{"type",
    "content"}``) or an OpenAI one as an OpenAI chat message."""
    if not isinstance(m, Mapping):
        return {"role": "user", "content": text_of(m)}
    inner = m.get("kwargs")
    kw: Mapping[str, Any] = inner if isinstance(inner, Mapping) else m
    kind = kw.get("role") or kw.get("type") or (m.get("id") or [""])[-1]
    out: dict[str, Any] = {"role": _ROLES.get(str(kind).lower(), "user"),
                           "content": text_of(kw.get("content"))}
    calls = kw.get("tool_calls") or (kw.get("additional_kwargs") or {}).get("tool_calls") or ()
    if calls:
        out["tool_calls"] = [
            c if "function" in c else
            {"id": str(c.get("id") or ""), "type": "function",
             "function": {"name": str(c.get("name") or ""),
                          "arguments": text_of(c.get("args") or {})}}
            for c in calls if isinstance(c, Mapping)]
    return out


def _messages(inputs: Mapping[str, Any]) -> list[dict[str, Any]]:
    raw = inputs.get("messages")
    if isinstance(raw, list) and raw and isinstance(raw[0], list):
        raw = raw[0]  # a chat model's inputs: one list per prompt of the batch
    if isinstance(raw, list):
        return [_message(m) for m in raw]
    prompts = inputs.get("prompts")
    if isinstance(prompts, list) and prompts:
        return [{"role": "user", "content": text_of(prompts[0])}]
    return []


def _reply(outputs: Mapping[str, Any]) -> dict[str, Any]:
    gens = outputs.get("generations")
    if isinstance(gens, list) and gens and isinstance(gens[0], list):
        gens = gens[0]
    if isinstance(gens, list) and gens and isinstance(gens[0], Mapping):
        g = gens[0]
        if isinstance(g.get("message"), Mapping):
            return _message(g["message"])
        return {"role": "assistant", "content": text_of(g.get("text"))}
    choices = outputs.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        return _message({"role": "assistant", **dict(choices[0].get("message") or {})})
    return {"role": "assistant", "content": _pick(outputs, _ANSWER_KEYS) or ""}


def _pick(values: Any, keys: tuple[str, ...]) -> str | None:
    """The text of the first of ``keys`` in ``values``, its only value, or its JSON."""
    if not isinstance(values, Mapping):
        return None if values is None else text_of(values)
    for k in keys:
        if values.get(k) is not None:
            return text_of(values[k])
    if isinstance(values.get("messages"), list):
        users = [m for m in _messages(values) if m["role"] == "user"]
        if users:
            return text_of(users[-1]["content"])
    if len(values) == 1:
        return text_of(next(iter(values.values())))
    return text_of(dict(values)) if values else None


def _model(run: Mapping[str, Any]) -> str:
    extra = run.get("extra") or {}
    meta = extra.get("metadata") or {}
    params = extra.get("invocation_params") or {}
    for v in (meta.get("ls_model_name"), params.get("model"), params.get("model_name")):
        if isinstance(v, str) and v:
            return v
    return ""


def _step(run: Mapping[str, Any], started: float) -> Step:
    inputs = run.get("inputs") or {}
    outputs = run.get("outputs") or {}
    error = run.get("error")
    if run.get("run_type") == "tool":
        args = inputs.get("input", inputs) if isinstance(inputs, Mapping) else inputs
        if isinstance(args, str):
            try:
                args = parse_json(args)
            except ValueError:
                pass
        result = outputs.get("output", outputs) if isinstance(outputs, Mapping) else outputs
        return Step(kind="act", module="act", route="think", started=started,
                    input={"tool": str(run.get("name") or "tool"), "arguments": args},
                    output={"observation": text_of(result) if not error
                            else f"Error: {error}"}, error=error or None)
    reply = _reply(outputs if isinstance(outputs, Mapping) else {})
    prompt = int(number(run.get("prompt_tokens"), "prompt_tokens") or 0)
    completion = int(number(run.get("completion_tokens"), "completion_tokens") or 0)
    return Step(kind="think", module="think", route="think", started=started,
                input={"messages": _messages(inputs if isinstance(inputs, Mapping) else {})},
                output={"completion": {"text": text_of(reply.get("content")),
                                       "tool_calls": list(reply.get("tool_calls") or ()),
                                       "prompt_tokens": prompt,
                                       "completion_tokens": completion,
                                       "model": _model(run)}},
                tokens=prompt + completion, error=error or None, meta={"run": run.get("name")})


def _score(root: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """(score, label, comment) from ``feedback_stats`` or a ``feedback`` list."""
    stats = root.get("feedback_stats")
    if isinstance(stats, Mapping) and stats:
        key = next((k for k in _SCORE_KEYS if k in stats), None) or \
            (next(iter(stats)) if len(stats) == 1 else None)
        if key is not None:
            value = stats[key]
            return (value.get("avg") if isinstance(value, Mapping) else value), None, None
    items = root.get("feedback")
    if isinstance(items, list):
        for f in items:
            if isinstance(f, Mapping) and (f.get("score") is not None or
                                           f.get("value") is not None):
                return f.get("score"), f.get("value"), f.get("comment")
    return None, None, None


def trace_of_runs(runs: list[Mapping[str, Any]], source: str) -> Imported:
    """The runs of one trace as one imported trace; ``BadRecord`` saying why not."""
    timed = [(iso_seconds(r.get("start_time"), f"run {r.get('id')}: start_time", numbers=True),
              r) for r in runs]
    timed.sort(key=lambda x: x[0])
    ids = {str(r.get("id")) for r in runs}
    roots = [(t, r) for t, r in timed if not r.get("parent_run_id")
             or str(r["parent_run_id"]) not in ids]
    started, root = roots[0]
    trace_id = str(root.get("trace_id") or root.get("id"))
    kids: dict[str, list[str]] = {}
    for r in runs:
        if r is not root and r.get("parent_run_id"):
            kids.setdefault(str(r["parent_run_id"]), []).append(str(r["id"]))
    by_id = {str(r.get("id")): r for r in runs}

    def inner(run_id: str, kind: str) -> bool:
        stack = list(kids.get(run_id, ()))
        while stack:
            rid = stack.pop()
            if by_id[rid].get("run_type") == kind:
                return True
            stack.extend(kids.get(rid, ()))
        return False

    steps = [_step(r, t) for t, r in timed if r.get("run_type") in ("llm", "tool")
             and not inner(str(r.get("id")), str(r.get("run_type")))]
    task = _pick(root.get("inputs"), _TASK_KEYS)
    answer = _pick(root.get("outputs"), _ANSWER_KEYS) if root.get("run_type") != "llm" \
        else None
    if answer is None and steps and steps[-1].kind == "think":
        answer = steps[-1].output["completion"]["text"]
    score, label, comment = _score(root)
    score_value, meta = feedback(score, label, comment)
    extra_meta = (root.get("extra") or {}).get("metadata") or {}
    expected = root.get("reference_outputs", extra_meta.get("expected", root.get("expected")))
    if isinstance(root.get("feedback_stats"), Mapping):
        meta["feedback_stats"] = dict(root["feedback_stats"])
    meta["origin"] = {"trace_id": trace_id, "root_run": root.get("name"),
                      "session_id": root.get("session_id")}
    error = root.get("error")
    ended = max(iso_seconds(r.get("end_time") or r.get("start_time"), "end_time", numbers=True)
                for r in runs)
    return build(FORMAT, source, f"trace {trace_id}", origin_key(FORMAT, trace_id),
                 task=task or "", steps=steps, answer=answer,
                 outcome="error" if error else "answered",
                 model=next((st.output["completion"]["model"] for st in steps
                             if st.kind == "think"), ""),
                 started=started, ended=ended,
                 label=None if expected is None else _pick(expected, _ANSWER_KEYS),
                 score=score_value, meta=meta, error=str(error) if error else None)


def _runs(text: str) -> list[Any]:
    try:
        data = parse_json(text)
    except ValueError:
        return [parse_json(line) if line.strip() else None for line in text.splitlines()]
    if isinstance(data, Mapping) and isinstance(data.get("runs"), list):
        return list(data["runs"])
    return data if isinstance(data, list) else [data]


def read_langsmith(text: str, source: str, skipped: list[str]) -> Iterator[Imported]:
    """The traces of a LangSmith export's ``text``; a run or trace that cannot be read goes
    to ``skipped`` (a trace with an unreadable run is skipped whole)."""
    try:
        runs = _runs(text)
    except ValueError as exc:
        skipped.append(f"{source}: not JSON or JSON lines ({exc})")
        return
    parent: dict[str, str] = {}
    good: list[Mapping[str, Any]] = []
    for i, r in enumerate(runs):
        if r is None:
            continue
        if not isinstance(r, Mapping) or r.get("id") is None:
            skipped.append(f"{source}: run {i}: not a run (no id)")
            continue
        good.append(r)
        if r.get("parent_run_id"):
            parent[str(r["id"])] = str(r["parent_run_id"])

    def trace_of(r: Mapping[str, Any]) -> str:
        if r.get("trace_id"):
            return str(r["trace_id"])
        rid = str(r["id"])
        seen = {rid}
        while rid in parent and parent[rid] not in seen:
            rid = parent[rid]
            seen.add(rid)
        return rid

    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in good:
        groups.setdefault(trace_of(r), []).append(r)
    for tid, group in groups.items():
        try:
            built = trace_of_runs(group, source)
        except BadRecord as exc:
            skipped.append(f"{source}: trace {tid}: {exc}")
            continue
        except (TypeError, AttributeError, ValueError) as exc:
            skipped.append(f"{source}: trace {tid}: unreadable run ({exc})")
            continue
        yield built


__all__ = ["read_langsmith", "trace_of_runs"]
