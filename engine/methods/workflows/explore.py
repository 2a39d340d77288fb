"""Exploration: the analyst looks for the calls that answer a training question no run did.

A short dialogue per question. The analyst sees the host's tools, what calls made so far showed
of the environment, calls that answered other questions, and the question with its expected
answer (a training label: it says what to look for, as Dynamo's tool maker is shown how close
its tools came to the labels). It writes one call at a time; each runs through the host's own
tools and its result goes back, until a result holds the expected answer or the turns run out.
The calls that got there become a workflow only if, with the question's values changed, they
answer other training questions of the same kind (``evolver.py`` checks): a call that holds
its answer, or that only fits its own question, is never kept.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ....tools.base import Tool, ToolResult
from ...backends.base import Backend
from ...errors import BackendError
from ...runtime.call_forms import json_calls, tool_call_blocks
from ...types import Request
from . import PROMPTS
from .harvest import compact, useful
from .induce import CallRecord
from .values import (
    distinctive,
    holds,
    leaf_values,
    near_misses,
    supports,
)

RESULT_CHARS = 1500
CALL_START = '{"name": "'


@dataclass
class Exploration:
    """One question explored: the calls up to the one that showed the answer (``found``), or
    every call tried; the analyst calls it took and the replies that were not calls."""

    question: str
    found: bool = False
    calls: list[CallRecord] = field(default_factory=list)
    analyst_calls: int = 0
    bad_replies: int = 0
    transcript: list[dict[str, str]] = field(default_factory=list)


def call_key(tool: str, args: Mapping[str, Any]) -> str:
    """What makes two calls the same call."""
    return tool + json.dumps(args, sort_keys=True, default=str)


def tools_text(tools: Sequence[Tool]) -> str:
    """The host's tools as the analyst reads them: name, parameters, description."""
    lines = []
    for t in tools:
        props = t.spec.parameters.get("properties") or {}
        params = ", ".join(f"{k}: {v.get('type', 'any')}" if isinstance(v, Mapping) else k
                           for k, v in props.items())
        desc = " ".join(t.spec.description.split())[:300]
        lines.append(f"- {t.name}({params}): {desc}")
    return "\n".join(lines)


def examples_text(examples: Sequence[tuple[str, CallRecord]]) -> str:
    if not examples:
        return ""
    out = [PROMPTS.render("explore.yaml#examples_head")]
    for question, call in examples:
        text = json.dumps({"name": call.tool, "arguments": call.arguments}, ensure_ascii=False)
        out.append(PROMPTS.render("explore.yaml#example", question=question, call=text))
    return "\n".join(out) + "\n"


def parse_call(text: str, names: Collection[str]) -> tuple[str, dict[str, Any]] | str:
    """The first call of a host tool in ``text``, or why there is none."""
    found = tool_call_blocks(text)
    if isinstance(found, str) or not found:
        found = json_calls(text, names)
    if isinstance(found, str):
        return found
    for f in found:
        if f.call.name in names:
            try:
                args = json.loads(f.call.arguments) if f.call.arguments.strip() else {}
            except ValueError:
                return f"the arguments of {f.call.name} are not a JSON object"
            if isinstance(args, dict):
                return f.call.name, args
            return f"the arguments of {f.call.name} are not a JSON object"
    if found:
        return f"{found[0].call.name!r} is not one of the tools"
    return "no call found"


def _steer(names: Collection[str] | Mapping[str, str], used: Sequence[str], why: str) -> str:
    """The start of a call that is not the one repeated: of the tool called last that was
    not the repeated one, else of the first tool not repeated, up to its first argument's
    value when ``names`` maps each tool to it (begun at ``{`` alone, the 1.5B closed it)."""
    repeated = why.split(":", 1)[1] if why.startswith("repeated:") else ""
    order = [*reversed(used), *sorted(names)]
    tool = next((t for t in order if t != repeated and t in names), "")
    if not tool:
        return ""
    first = names.get(tool, "") if isinstance(names, Mapping) else ""
    return '{"name": "' + tool + '", "arguments": {' + (f'"{first}": "' if first else "")


def _answer_last(calls: Sequence[CallRecord], answer: Any,
                 general: Callable[[Sequence[CallRecord]], bool]) -> list[CallRecord] | None:
    """The calls in an order that answers in general: a call whose result holds the answer
    moved last, after the others (a code looked up where the answer is kept, then the record
    the question names that holds the code), when that order takes the question's values."""
    for c in reversed(calls):
        if holds(c.result, answer) is None:
            continue
        order = [x for x in calls if x is not c] + [c]
        if general(order):
            return order
    return None


def _clipped(result: str) -> str:
    text = compact(result)
    return text if len(text) <= RESULT_CHARS else text[:RESULT_CHARS] + " …"


def code_link(result: str, answer: Any, known: Sequence[CallRecord]
              ) -> tuple[str, str, str] | None:
    """A value of ``result`` (a code, an id) that an earlier result shows on the line of the
    answer ("GR | Garden"), with that line and the call that showed it: the record the
    question names leads to the answer through it. None when none does."""
    leaves = leaf_values(result) or []
    candidates = [str(v) for v in leaves if isinstance(v, (str, int)) and not isinstance(v, bool)
                  and 0 < len(str(v)) <= 40]
    for c in known:
        for line in compact(c.result).splitlines():
            if not supports(line, answer):
                continue
            for v in candidates:
                if supports(line, v) and not supports(str(answer), v):
                    what = f"{c.tool}({json.dumps(c.arguments, ensure_ascii=False)})"
                    return v, line.strip()[:200], what
    return None


def layout_of(tool: str, args: Mapping[str, Any], known: Sequence[CallRecord],
              limit: int = 2) -> list[str]:
    """Earlier results that describe what a call names: a look whose one text argument (a
    table, a folder) stands as a word in the call's arguments ("FROM staff", ".../services/x").
    Shown again when the call failed or came back empty, the layout is beside the mistake
    (a column the table does not have, a folder that is elsewhere) instead of pages above it."""
    text = json.dumps(args, ensure_ascii=False)
    out: list[str] = []
    for c in known:
        values = [v for v in c.arguments.values() if isinstance(v, str)]
        if len(c.arguments) != 1 or len(values) != 1 or len(values[0]) < 2 or \
                (c.tool == tool and dict(c.arguments) == dict(args)) or not useful(c.result):
            continue
        if re.search(r"(?<![\w-])" + re.escape(values[0]) + r"(?![\w-])", text) is None:
            continue
        what = f"{c.tool}({json.dumps(c.arguments, ensure_ascii=False)})"
        out.append(PROMPTS.render("explore.yaml#layout", call=what, result=_clipped(c.result)))
        if len(out) >= limit:
            break
    return out


def where_shown(known: Sequence[CallRecord], answer: Any, limit: int = 2) -> list[str]:
    """Lines saying which earlier results hold ``answer`` (as it is, or in another form:
    ``near_misses``), with the line it stands on: where to read it from."""
    out: list[str] = []
    if not distinctive(answer):  # a 3 or a "yes" stands somewhere in any listing
        return out
    for c in known:
        text = compact(c.result)
        line = next((ln.strip() for ln in text.splitlines() if supports(ln, answer)), None)
        misses = near_misses(c.result, answer) if line is None else []
        if line is None and not misses:
            continue
        what = f"{c.tool}({json.dumps(c.arguments, ensure_ascii=False)})"
        out.append(PROMPTS.render("explore.yaml#shown_in", call=what,
                                  line=line[:200] if line else "; ".join(misses)))
        if len(out) >= limit:
            break
    return out


async def explore(analyst: Backend, system: str, question: str, answer: Any,
                  call: Callable[[str, Mapping[str, Any]], ToolResult],
                  names: Collection[str] | Mapping[str, str], *, turns: int = 4, seed: int = 0,
                  temperature: float = 0.3, max_tokens: int = 300,
                  run_tool: Callable[..., Any] | None = None,
                  known: Sequence[CallRecord] = (), resamples: int = 2,
                  general: Callable[[Sequence[CallRecord]], bool] | None = None,
                  values: Sequence[str] = (), first_tool: str = "",
                  patience: int = 2) -> Exploration:
    """Look for the calls that answer ``question`` (see the module docstring). ``call``
    runs a host tool; ``run_tool`` (an awaitable runner such as ``asyncio.to_thread``) keeps
    the event loop free while it does; ``known``: calls whose results the analyst was shown
    (a repeat of one is not run; one that holds the answer is pointed at). A reply that
    repeats a call, or is no call, is sampled again, hotter and started as a call of the
    tool the analyst used last (or another), up to ``resamples`` times before it counts as
    the turn's. ``general(calls)``: whether the calls that reached the answer would answer
    other questions of the kind (they take the question's values); when not, the analyst is
    asked for calls that do, and the dialogue goes on.

    ``values``: what the question names (its rare spans). The dialogue starts from them: the
    first call asked for returns the whole record a value names (a small model writes that
    far more often than the one call that answers), which often holds the answer, kept as
    it is or another way; when it holds a value (a code) that an earlier result shows on the
    line of the answer, the analyst is asked for the call that reads the answer for it. That
    first call is begun as a call of ``first_tool`` (the tool that showed records when the
    learner looked around) on backends that can prefill; where an earlier result holds the
    answer is said only after it, so the analyst starts from the question's record.

    ``patience``: turns that may end with no new call run (every sample a repeat or no call)
    before the question is given up. A 1.5B that has repeated itself through its resamples
    twice has nothing left to try, and its turns are the exploration's cost (0 never gives
    up)."""
    out = Exploration(question)
    made: set[str] = {call_key(c.tool, c.arguments) for c in known}
    task = PROMPTS.render("explore.yaml#task", question=question, answer=str(answer))
    if values:
        task += "\n" + PROMPTS.render("explore.yaml#record", values=", ".join(
            f'"{v}"' for v in values))
    hints = where_shown(known, answer)
    if not values:  # nothing to start from: say at once where the answer shows
        task, hints = "\n".join([task, *hints]), []
    messages: list[dict[str, str]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": task}]
    used: list[str] = []  # the tools this dialogue called, in order
    idle = 0  # turns that ran no call
    for turn in range(turns):
        if patience and idle >= patience:
            break
        reply = ""
        parsed: tuple[str, dict[str, Any]] | str = "no reply"
        for attempt in range(resamples + 1):
            # A call is one line of JSON: what follows a blank line is the analyst explaining
            # it. A repeat is sampled again, hotter, and begun as a call of another tool (the
            # 0.5B and the 1.5B repeat a look they were shown, at any temperature).
            if not analyst.capabilities.prefill:
                prefix = ""
            elif attempt == 0:
                # Begun as a call: unbegun, the 1.5B often explains first, and the blank
                # line that ends a call ends the explanation, a turn spent on no call.
                prefix = _steer(names, [first_tool], "") if turn == 0 and values \
                    and first_tool in names else CALL_START
            else:
                prefix = _steer(names, used, parsed if isinstance(parsed, str) else "")
            request = Request(messages=tuple(messages),  # type: ignore[arg-type]
                              max_tokens=max_tokens, stop=("\n\n",), prefix=prefix,
                              temperature=min(1.0, temperature + 0.35 * attempt),
                              seed=seed + 100 * turn + attempt)
            out.analyst_calls += 1
            try:
                reply = (await analyst.acomplete(request)).text
            except BackendError:
                out.transcript = messages
                return out
            got = parse_call(reply, names)
            if not isinstance(got, str) and call_key(*got) in made:
                got = f"repeated:{got[0]}"
            parsed = got
            if not isinstance(got, str):
                break
            out.bad_replies += 1
        messages.append({"role": "assistant", "content": reply})
        idle += isinstance(parsed, str)
        if isinstance(parsed, str) and parsed.startswith("repeated:"):
            messages.append({"role": "user", "content": PROMPTS.render(
                "explore.yaml#repeated", answer=str(answer))})
            continue
        if isinstance(parsed, str):
            messages.append({"role": "user",
                             "content": PROMPTS.render("explore.yaml#bad_call", why=parsed)})
            continue
        tool, args = parsed
        made.add(call_key(tool, args))
        used.append(tool)
        result: ToolResult = await run_tool(call, tool, args) if run_tool is not None \
            else call(tool, args)
        if result.error is not None:
            messages.append({"role": "user", "content": PROMPTS.render(
                "explore.yaml#error", tool=tool, error=result.error[:RESULT_CHARS])})
            continue
        out.calls.append(CallRecord(tool, args, result.output))
        held = holds(result.output, answer) is not None  # a price in cents is found too
        if general is None and held:
            out.found = True
            break
        order = _answer_last(out.calls, answer, general) if general is not None else None
        if order is not None:
            out.calls, out.found = order, True
            break
        if held:
            messages.append({"role": "user", "content": PROMPTS.render(
                "explore.yaml#not_general", question=question)})
            continue
        link = code_link(result.output, answer, [*known, *out.calls[:-1]])
        if link is not None:
            value, line, where = link
            messages.append({"role": "user", "content": PROMPTS.render(
                "explore.yaml#link", tool=tool, result=_clipped(result.output), value=value,
                line=line, where=where, answer=str(answer))})
            continue
        misses = near_misses(result.output, answer)
        said = [PROMPTS.render("explore.yaml#near", misses="; ".join(misses))] if misses else []
        if not useful(result.output):  # a wrong name or value: the layout it missed
            said += layout_of(tool, args, [*known, *out.calls[:-1]])
        said += hints  # where an earlier result holds the answer: after the first call
        hints = []
        messages.append({"role": "user", "content": PROMPTS.render(
            "explore.yaml#result", tool=tool, result=_clipped(result.output), answer=str(answer),
            hint="\n".join(said) + "\n" if said else "")})
    out.transcript = messages
    return out


__all__ = ["Exploration", "call_key", "code_link", "examples_text", "explore", "layout_of", "parse_call", "tools_text", "where_shown"]
