"""A workflow: a verified sequence of calls of the host's tools, with slots, kept as data.

A workflow is what Agent Workflow Memory induces from a successful trajectory (the calls that
worked, with the task's own values abstracted into slots), made callable: the runtime offers
it as one named tool whose parameters are its slots, and running it replays the calls through
the user's own tools (an MCP server with its allow-list, a function), never model-written
code. The file ``workflows/<name>.yaml`` holds a library's workflows for one environment::

    workflows:
    - name: price_of
      description: 'Answers questions like: How much does the {item} cost?'
      slots:
      - {name: item, example: Amber Kettle}
      steps:
      - tool: shop_read_query
        arguments: {query: "SELECT price_cents / 100.0 FROM products WHERE title = '{item}'"}
      answer: {kind: cell}
      patterns: ['How much does the {item} cost?', 'What is the price of the {item}?']
      verified: {hits: 14, tries: 15}

``{slot}`` in a string argument is replaced by the slot's value; inside single quotes the
value's own single quotes are doubled (the SQL convention), so a value never ends the string
it stands in. A slot comes from the task (``patterns`` read it from the question; the model
may also pass it) or from an earlier step's result (``from_step`` with a ``select``or). The
answer is read from the last step's result by ``answer``: ``whole`` (the result is the value),
``cell`` (a table or JSON value holding exactly one value), ``key`` (the value written after
``key`` in ``key: value``, ``key = value`` or ``"key": "value"`` form, its ``index``-th
occurrence) or ``segment`` (a result that is one path: its ``index``-th part, counted from the
end when negative: the folder a search found a service in) or ``sum`` (``key``'s numbers added
over the records of a result: a visit billed in several bills), then converted when the
environment keeps it another way (``convert``: money in
cents read as ``scale:-2``, a date kept as days since 1970 as ``date:days``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import ValidationError

WORKFLOWS_DIR = "workflows"
TOOL_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,47}")
SLOT_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
SELECTOR_KINDS = ("whole", "cell", "key", "segment", "sum")
# How a value may be kept in a result when not as asked for: a number scaled by a power of ten
# (scale:-2: money kept in cents, read back divided by 100), a date kept as a number (the
# digits YYYYMMDD, days or seconds since 1970-01-01).
CONVERSIONS = ("", "scale:-1", "scale:-2", "scale:-3", "scale:-4", "scale:-6", "scale:1",
               "scale:2", "scale:3", "date:yyyymmdd", "date:days", "date:seconds")
MAX_WORKFLOWS = 200
MAX_STEPS = 4
MAX_PATTERNS = 12


@dataclass(frozen=True)
class Selector:
    """Where a value sits in a tool's result (see the module docstring), and how it is kept
    there when not as the answer reads it (``convert``, one of ``CONVERSIONS``)."""

    kind: str = "whole"
    key: str = ""
    index: int = 0
    convert: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind in ("key", "sum"):
            out["key"] = self.key
            if self.index and self.kind == "key":
                out["index"] = self.index
        if self.kind == "segment":
            out["index"] = self.index
        if self.convert:
            out["convert"] = self.convert
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Selector:
        return cls(str(d.get("kind", "whole")), str(d.get("key", "")), int(d.get("index", 0)),
                   str(d.get("convert", "")))


@dataclass(frozen=True)
class Slot:
    """A value a workflow's calls need: from the task (``from_step`` None) or read from the
    result of an earlier step (``from_step``, by ``select``)."""

    name: str
    example: str = ""
    from_step: int | None = None
    select: Selector | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.example:
            out["example"] = self.example
        if self.from_step is not None:
            out["from_step"] = self.from_step
            out["select"] = (self.select or Selector()).to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Slot:
        step = d.get("from_step")
        sel = d.get("select")
        return cls(str(d["name"]), str(d.get("example", "")),
                   int(step) if step is not None else None,
                   Selector.from_dict(sel) if isinstance(sel, Mapping) else None)


@dataclass(frozen=True)
class CallStep:
    """One call of a host tool; string arguments may hold ``{slot}`` placeholders."""

    tool: str
    arguments: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "arguments": dict(self.arguments)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CallStep:
        args = d.get("arguments") or {}
        return cls(str(d["tool"]), dict(args) if isinstance(args, Mapping) else {})


@dataclass(frozen=True)
class Workflow:
    """A verified workflow (see the module docstring). ``hits``/``tries``: how many training
    tasks its patterns matched (``tries``) and it answered right (``hits``) when it was
    admitted."""

    name: str
    description: str
    slots: tuple[Slot, ...]
    steps: tuple[CallStep, ...]
    answer: Selector = Selector()
    patterns: tuple[str, ...] = ()
    hits: int = 0
    tries: int = 0

    @property
    def task_slots(self) -> tuple[Slot, ...]:
        """The slots the task fills (the tool's parameters)."""
        return tuple(s for s in self.slots if s.from_step is None)

    def key(self) -> str:
        """What makes two workflows the same: their calls, slots named in order of use."""
        return repr([(s.tool, sorted(s.arguments.items())) for s in self.steps]) + \
            repr(self.answer.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "slots": [s.to_dict() for s in self.slots],
                "steps": [s.to_dict() for s in self.steps], "answer": self.answer.to_dict(),
                "patterns": list(self.patterns),
                "verified": {"hits": self.hits, "tries": self.tries}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Workflow:
        verified = d.get("verified") or {}
        return cls(str(d["name"]), str(d.get("description", "")),
                   tuple(Slot.from_dict(s) for s in d.get("slots") or ()),
                   tuple(CallStep.from_dict(s) for s in d.get("steps") or ()),
                   Selector.from_dict(d.get("answer") or {}),
                   tuple(str(p) for p in d.get("patterns") or ()),
                   int(verified.get("hits", 0)), int(verified.get("tries", 0)))


_HEADER = ("# Verified call workflows, learned by `whetstone evolve workflows` from runs whose\n"
           "# answers the tools' results supported. Each is offered to the agent as one tool;\n"
           "# its steps call the host's own tools. docs/workflows.md describes the format.\n")


def render_workflows(workflows: Sequence[Workflow]) -> str:
    """The YAML text of a workflows file."""
    import yaml  # lazy: yaml, only when a workflows file is written

    body = yaml.safe_dump({"workflows": [w.to_dict() for w in workflows]}, sort_keys=False,
                          allow_unicode=True, width=100, default_flow_style=None)
    return _HEADER + body


def parse_workflows(text: str, *, path: str = "workflows/x.yaml"
                    ) -> tuple[list[Workflow], list[ValidationError]]:
    """The workflows of a file and the problems found; a malformed entry is a problem, the
    others are still read."""
    import yaml  # lazy: yaml, only when a workflows file is read

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return [], [ValidationError(path, "yaml", f"not valid YAML: {exc}")]
    if not isinstance(data, Mapping) or not isinstance(data.get("workflows"), list):
        return [], [ValidationError(path, "layout", "a workflows file is a mapping with a "
                                    "'workflows' list")]
    out: list[Workflow] = []
    problems: list[ValidationError] = []
    seen: set[str] = set()
    for i, raw in enumerate(data["workflows"][:MAX_WORKFLOWS + 1]):
        if i == MAX_WORKFLOWS:
            problems.append(ValidationError(path, "size", f"more than {MAX_WORKFLOWS} "
                                            "workflows in one file"))
            break
        try:
            wf = Workflow.from_dict(raw)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            problems.append(ValidationError(path, f"workflows[{i}]",
                                            f"not a workflow ({type(exc).__name__}: {exc})"))
            continue
        found = check_workflow(wf)
        if wf.name in seen:
            found.append(f"the name {wf.name!r} is used twice")
        seen.add(wf.name)
        if found:
            problems += [ValidationError(path, f"workflows[{i}] {wf.name}", p) for p in found]
            continue
        out.append(wf)
    return out, problems


def placeholders(text: str) -> list[str]:
    """The ``{slot}`` names in ``text`` (slot-shaped names only: other braces are text)."""
    return re.findall(r"\{(" + SLOT_RE.pattern + r")\}", text)


def check_workflow(wf: Workflow) -> list[str]:
    """What is wrong with ``wf`` (empty when nothing)."""
    problems: list[str] = []
    if not TOOL_NAME_RE.fullmatch(wf.name):
        problems.append("a name is lower-case letters, digits and underscores, at most 48")
    if not wf.steps or len(wf.steps) > MAX_STEPS:
        problems.append(f"a workflow has 1 to {MAX_STEPS} steps")
    if wf.answer.kind not in SELECTOR_KINDS:
        problems.append(f"answer kind {wf.answer.kind!r} is not one of {SELECTOR_KINDS}")
    for sel in (wf.answer, *(s.select for s in wf.slots if s.select is not None)):
        if sel.kind in ("key", "sum") and not sel.key:
            problems.append(f"a {sel.kind!r} selector names the key it reads")
        if sel.convert not in CONVERSIONS:
            problems.append(f"convert {sel.convert!r} is not one of {CONVERSIONS[1:]}")
    names = [s.name for s in wf.slots]
    if len(set(names)) != len(names) or not all(SLOT_RE.fullmatch(n) for n in names):
        problems.append("slot names are distinct lower-case identifiers")
    for s in wf.slots:
        if s.from_step is not None and not 0 <= s.from_step < len(wf.steps) - 1:
            problems.append(f"slot {s.name!r} reads a step that does not come before the last")
    used: set[str] = set()
    for i, step in enumerate(wf.steps):
        for value in step.arguments.values():
            for name in placeholders(value) if isinstance(value, str) else ():
                slot = next((s for s in wf.slots if s.name == name), None)
                if slot is None:
                    problems.append(f"step {i} uses {{{name}}}, which is not a slot")
                elif slot.from_step is not None and slot.from_step >= i:
                    problems.append(f"step {i} uses {{{name}}} before step {slot.from_step} "
                                    "reads it")
                used.add(name)
    problems += [f"slot {n!r} is never used" for n in names if n not in used]
    for p in wf.patterns[:MAX_PATTERNS]:
        if set(placeholders(p)) - {s.name for s in wf.task_slots}:
            problems.append(f"pattern {p!r} names a slot the task does not fill")
    if len(wf.patterns) > MAX_PATTERNS:
        problems.append(f"at most {MAX_PATTERNS} patterns")
    return problems


def fill(template: Any, values: Mapping[str, str]) -> Any:
    """``template`` with each ``{slot}`` replaced by its value (single quotes doubled inside
    a single-quoted string); non-string values are kept as they are."""
    if not isinstance(template, str):
        return template

    def sub(m: re.Match[str]) -> str:
        value = values[m.group(2)]
        quoted = m.group(1) == "'" and m.group(3) == "'"
        return m.group(1) + (value.replace("'", "''") if quoted else value) + m.group(3)

    pattern = r"('?)\{(" + "|".join(re.escape(n) for n in values) + r")\}('?)"
    return re.sub(pattern, sub, template) if values else template


__all__ = ["CONVERSIONS", "MAX_STEPS", "SELECTOR_KINDS", "WORKFLOWS_DIR", "CallStep", "Selector", "Slot",
           "Workflow", "check_workflow", "fill", "parse_workflows", "placeholders",
           "render_workflows"]
