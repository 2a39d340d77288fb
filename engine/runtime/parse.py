"""Read the model's reply leniently: native tool calls, the call forms small models write as
text (``whetstone.engine.runtime.call_forms``: ``<tool_call>`` blocks, bare or fenced JSON call objects,
``Action: tool[input]``, python blocks), or an answer (``Final Answer:``, an answer cue, or the
plain reply). Never raises: an unusable reply is ``kind="invalid"`` with the reason, and the
runtime shows that reason to the model. A reply that holds a call is never taken as the answer:
the call runs, and the model answers once it has seen the result."""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Literal

from whetstone.engine.answer_text import has_answer
from whetstone.engine.runtime.call_forms import (
    Found,
    ParsedCall,
    bracket_end,
    code_blocks,
    json_calls,
    object_at,
    ordered,
    text_calls,
    tool_call_blocks,
    tool_in_code,
)
from whetstone.engine.types import Completion

# "Final Answer:" counts at the start of a line; mid-sentence ("to reach the final answer: I
# need 17*23") only when the reply has no Action at all.
_FINAL = re.compile(r"\bfinal\s+answer\s*\**\s*:\s*\**", re.IGNORECASE)
_FINAL_LINE = re.compile(r"(?:^|\n)[^\w\n]*final\s+answer\s*\**\s*:\s*\**", re.IGNORECASE)
_ACTION = re.compile(r"(?:^|\n)\W*action\s*\**\s*:\s*\**\s*", re.IGNORECASE)
_ACTION_INPUT = re.compile(r"\n\W*action\s+input\s*\**\s*:\s*", re.IGNORECASE)
_OBSERVATION = re.compile(r"\n\W*observation\s*:", re.IGNORECASE)
_NAME = re.compile(r"[A-Za-z_][\w.-]*")
# "Action: Final Answer" + "Action Input: 42" (LangChain's convention) is an answer.
_FINAL_TOOL = re.compile(r"final[\s_-]*answer\b", re.IGNORECASE)
FINAL_TOOL = "final_answer"
_CLOSERS = {"[": "]", "(": ")"}


@dataclass(frozen=True)
class Parsed:
    kind: Literal["action", "answer", "invalid"]
    calls: tuple[ParsedCall, ...] = ()
    answer: str | None = None
    thought: str = ""
    error: str | None = None
    raw: str = ""
    # The last call to run is a python block: whatever follows it was written before the
    # program ran (a guessed output, a guessed answer), so its real output answers
    # (RunConfig.answer_with_program_output).
    ends_with_program: bool = False
    # Where the usable reply ends: the end of the last call to run. Text after it was written
    # without the calls' results (what a stop sequence would have cut), so history drops it.
    used_end: int | None = None


def _bracketed(text: str, open_at: int) -> tuple[str, bool]:
    """The text inside the bracket opening at ``open_at``; False when it never closes.

    Brackets inside quoted strings do not count (``python[print("]")]``); when the quotes do
    not pair up (an apostrophe in ``search[what's up]``) the brackets are counted plainly.
    """
    for quotes in (True, False):
        inner = _scan_bracket(text, open_at, quotes)
        if inner is not None:
            return inner, True
    return text[open_at + 1:], False


def _scan_bracket(text: str, open_at: int, quotes: bool) -> str | None:
    end = bracket_end(text, open_at, quotes=quotes)
    return None if end is None else text[open_at + 1:end - 1]


def parse_action(text: str) -> ParsedCall | None | str:
    """Find ``Action: ...`` in ``text``. Returns a call, None (no action), or an error string."""
    m = _ACTION.search(text)
    if not m:
        return None
    rest = text[m.end():]
    obs = _OBSERVATION.search(rest)
    if obs:  # the model imagined the observation; ignore everything from there
        rest = rest[:obs.start()]
    rest = rest.strip()
    if rest[:1] == "`":  # Action: `calculator[2+3]`
        rest = rest.strip("`").strip()
    if rest.startswith("{"):
        read = object_at(rest, 0)  # the first object (JSON or a Python dict); text may follow
        obj = read[0] if read is not None else None
        if isinstance(obj, dict):
            name = obj.get("name") or obj.get("tool") or obj.get("action")
            args = obj.get("arguments", obj.get("input", obj.get("action_input", {})))
            if name:
                return ParsedCall(str(name), args if isinstance(args, str) else json.dumps(args))
        return "the Action is not valid JSON"
    name_m = _FINAL_TOOL.match(rest) or _NAME.match(rest)
    if not name_m:
        return "the Action does not start with a tool name"
    name = FINAL_TOOL if name_m.re is _FINAL_TOOL else name_m.group(0).rstrip(".")
    after = rest[name_m.end():]
    stripped = after.lstrip(" \t")
    if stripped[:1] == ":" and stripped[1:2] in (" ", "\t") and "\n" not in stripped.strip():
        return ParsedCall(name, stripped[1:].strip())  # Action: calculator: 2+3
    if stripped[:1] in _CLOSERS:
        inner, closed = _bracketed(stripped, 0)
        if not closed:
            return f"the input of Action {name} has no closing {_CLOSERS[stripped[0]]!r}"
        return ParsedCall(name, inner.strip())
    ai = _ACTION_INPUT.search("\n" + after)
    if ai:
        value = ("\n" + after)[ai.end():].strip()
        return ParsedCall(name, value.strip("`").strip())
    if not after.strip() or after.startswith("\n"):
        return ParsedCall(name, "")
    return f"could not read the input of Action {name}"


def _final_marks(text: str) -> list[re.Match[str]]:
    """Where "Final Answer:" markers are: at line starts, or anywhere when there is no Action."""
    marks = list(_FINAL_LINE.finditer(text))
    if not marks and not _ACTION.search(text):
        marks = list(_FINAL.finditer(text))
    return marks


def _final_answer(text: str, marks: list[re.Match[str]]) -> str | None:
    if not marks:
        return None
    rest = text[marks[-1].end():]  # the last one wins: small models sometimes restate it
    for stop in (_ACTION, _OBSERVATION):  # a call or an imagined observation after it
        m = stop.search(rest)
        if m:
            rest = rest[:m.start()]
    return rest.strip().strip("*").strip() or None


# What opens a call's block (a fence, a <tool_call> tag) on the line before the call, and
# the tags of a reasoning model's thinking: not the thought's text.
_OPENER = re.compile(r"(?:\n|^)[ \t]*(?:`{3,}[\w+-]*|<tool_call>)[ \t]*\Z")
_THINK_TAG = re.compile(r"</?think>", re.IGNORECASE)


def _thought(text: str, marks: list[re.Match[str]]) -> str:
    """The reply's text before its call or its final answer: what a run shows as the
    thought (never the fence or tag that opens the call)."""
    cut = len(text)
    if marks:
        cut = marks[0].start()
    m = _ACTION.search(text)
    if m:
        cut = min(cut, m.start())
    thought = _THINK_TAG.sub("", text[:cut]).strip()
    thought = _OPENER.sub("", thought).strip()
    return re.sub(r"^\W*thought\s*:\s*", "", thought, flags=re.IGNORECASE)




@dataclass(frozen=True)
class ReplyRules:
    """How a reply reads this turn.

    ``tool_names``: the tools offered (a JSON object naming one is a call). ``code_tool``: the
    tool a ```` ```python ```` block that prints something calls, with its code in
    ``code_parameter`` (None: code blocks are plain text). ``plain_is_answer``: a reply with no
    call and no marker is the answer (the model's own format); otherwise it needs a ``Final
    Answer:`` or an answer cue ("the answer is ...", ``\\boxed{}``), else it is retried.
    """

    tool_names: Collection[str] = ()
    code_tool: str | None = None
    code_parameter: str = "code"
    plain_is_answer: bool = True


def _action_found(text: str) -> Found | str | None:
    """The ``Action:`` call with its span (to an imagined Observation, else the end)."""
    action = parse_action(text)
    if not isinstance(action, ParsedCall):
        return action
    m = _ACTION.search(text)
    assert m is not None  # parse_action found it
    obs = _OBSERVATION.search(text, m.end())
    return Found(m.start(), obs.start() if obs else len(text), replace(action, form="action"))


def _masked(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with ``spans`` blanked (offsets kept)."""
    for a, b in spans:
        text = text[:a] + " " * (b - a) + text[b:]
    return text


def find_calls(text: str, rules: ReplyRules) -> tuple[list[Found], str | None]:
    """Every call written in ``text``, in order, and the first reason a meant call could not
    be read (None when there is none)."""
    groups: list[list[Found]] = []
    programs: list[tuple[int, int]] = []
    if rules.code_tool and rules.code_tool in rules.tool_names:
        code = code_blocks(text, rules.code_tool, rules.code_parameter, rules.tool_names)
        groups.append(code)
        # Objects inside a program are its data (what it builds and prints), not calls.
        programs = [p for f in code if f.call.form == "code" for p in f.parts or [(f.start, f.end)]]
    error: str | None = None
    for found in (tool_call_blocks(text), json_calls(_masked(text, programs), rules.tool_names)):
        if isinstance(found, str):
            error = error or found
        else:
            groups.append(found)
    groups.append(text_calls(_masked(text, programs), rules.tool_names))
    action = _action_found(text)
    if isinstance(action, Found) and not (action.call.name == FINAL_TOOL
                                          and FINAL_TOOL not in rules.tool_names):
        groups.append([action])
    elif isinstance(action, str):
        error = error or action
    return ordered(*groups), error


def _final_region(text: str, marks: list[re.Match[str]]) -> tuple[int, int]:
    """Where the text of the last "Final Answer:" runs (to a following Action/Observation)."""
    start = marks[-1].end()
    end = len(text)
    for stop in (_ACTION, _OBSERVATION):
        m = stop.search(text, start)
        if m:
            end = min(end, m.start())
    return start, end


def _calls_to_run(calls: list[Found], text: str, marks: list[re.Match[str]]) -> list[Found]:
    """The calls this reply asks to run. Calls before a "Final Answer:" are run (the answer
    waits for their results); a final answer that is itself a call is run; calls written
    after the final answer are not (the model has answered)."""
    if not marks:
        return calls
    before = [f for f in calls if f.start < marks[0].start()]
    if before:
        return before
    lo, hi = _final_region(text, marks)
    return [f for f in calls if lo <= f.start < hi]


def _action_tool_answer(text: str, thought: str) -> Parsed | None:
    """LangChain's convention: ``Action: Final Answer`` + ``Action Input: 42`` is an answer."""
    action = parse_action(text)
    if isinstance(action, ParsedCall) and action.name == FINAL_TOOL:
        if action.arguments.strip():
            return Parsed("answer", answer=action.arguments.strip(), thought=thought, raw=text)
        return Parsed("invalid", error="Action: Final Answer needs the answer as its input",
                      thought=thought, raw=text)
    return None


def parse_reply(completion: Completion, rules: ReplyRules | None = None) -> Parsed:
    """Decide what the model asked for: calls to run, an answer, or neither (with why)."""
    rules = rules or ReplyRules()
    text = completion.text or ""
    marks = _final_marks(text)
    thought = _thought(text, marks)
    if completion.tool_calls:
        calls = tuple(ParsedCall(c.name, c.arguments, c.id, native=True, form="native")
                      for c in completion.tool_calls)
        return Parsed("action", calls=calls, thought=text.strip(), raw=text)
    found, error = find_calls(text, rules)
    if error is not None:
        return Parsed("invalid", error=error, thought=thought, raw=text)
    to_run = _calls_to_run(found, text, marks)
    if to_run:
        cut, last = to_run[0].start, to_run[-1]
        return Parsed("action", calls=tuple(f.call for f in to_run),
                      thought=_thought(text[:cut], []), raw=text,
                      ends_with_program=last.call.form == "code",
                      used_end=last.end if text[last.end:].strip() else None)
    if FINAL_TOOL not in rules.tool_names and (named := _action_tool_answer(text, thought)):
        return named
    final = _final_answer(text, marks)
    if final is not None:
        return Parsed("answer", answer=final, thought=thought, raw=text)
    return _plain(completion, text, thought, rules)


def _plain(completion: Completion, text: str, thought: str, rules: ReplyRules) -> Parsed:
    """A reply with no call and no "Final Answer:" marker."""
    if not text.strip():
        why = "the reply was empty"
        if completion.finish_reason == "length":
            why = "the reply was cut off before it said anything"
        return Parsed("invalid", error=why, raw=text)
    if rules.plain_is_answer or has_answer(text):
        return Parsed("answer", answer=text.strip(), thought=thought, raw=text)
    if completion.finish_reason == "length":
        return Parsed("invalid", error="the reply was cut off before an Action or a Final Answer",
                      thought=thought, raw=text)
    return Parsed("invalid", error="the reply has neither an Action nor a Final Answer",
                  thought=thought, raw=text)


# What Python prints for a value that is no answer: None (a function that returns nothing),
# an object's or a function's default repr.
_NO_VALUE = re.compile(r"None|<[\w.]+(?: [\w.<>]+)* (?:object )?at 0x[0-9a-fA-F]+>")


def output_is_answer(output: str, tool_names: Collection[str]) -> bool:
    """Whether a program's printed output answers the task: it printed a value, not a call
    (an object naming a tool, as JSON or as Python printed it, a ``<tool_call>``, an
    ``Action:`` line, ``calculator(expression='17 * 23')``), nothing, or ``None`` / an
    object's repr. A program that printed a call asked for the call; the model is shown
    what it printed and goes on."""
    text = output.strip()
    if not text or _NO_VALUE.fullmatch(text):
        return False
    found, error = find_calls(text, ReplyRules(tool_names=tool_names))
    if found or error is not None:
        return False
    return not any(tool_in_code(line, tool_names) for line in text.splitlines()
                   if line.strip())
