"""Dynamo's pieces: its records and the saved state of a run, and reading the analyst's
replies (repaired where a small slip can be undone, with a count; refused with the reason
otherwise, so the analyst can try once more). The method is ``whetstone.engine.methods.dynamo.evolver``; tools
are tried and written by ``whetstone.engine.methods.dynamo.sandbox``.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ....skills.format import MAX_DESCRIPTION, NAME_RE
from ....tools.base import Tool
from ....tools.learned import PROVENANCE_FILE, TOOL_NAME, ToolDefinition, define_tool
from ...errors import ConfigError, ParseError, ValidationError
from ...replies import extract_json_object, salvage_truncated_json
from ..analyst import AnalystStats

KINDS = ("cognitive", "computational", "perceptual")
# Words small analysts use for a kind; mapped (and counted as a repair).
KIND_WORDS = {"reasoning": "cognitive", "logic": "cognitive", "misread": "cognitive",
              "arithmetic": "computational", "calculation": "computational",
              "computation": "computational", "counting": "computational",
              "visual": "perceptual", "vision": "perceptual", "perception": "perceptual"}
PROVENANCE = PROVENANCE_FILE  # assets/provenance.json, what `whetstone tools show` reads
IMAGE_WORD = "IMAGE"  # what the analyst writes for "the task's image" in test arguments
NOTHING = ("", "null", "none", "[]", "{}", '""', "0.0j")


@dataclass
class Attempt:
    """One run of the agent on a labelled training task, as the analyst sees it."""

    task_id: str
    trace_id: str
    score: float
    question: str
    expected: str
    answer: str | None
    text: str  # the trace rendered for the analyst
    image: str | None = None

    @property
    def correct(self) -> bool:
        return self.score >= 1.0


@dataclass
class Cluster:
    """Failures that share one cause, and the kind of fix it needs."""

    kind: str
    failures: list[str]  # task ids
    diagnosis: str
    fix: str = ""


@dataclass
class ToolTest:
    """One sandboxed call of a tool on one failing task's input."""

    task_id: str
    arguments: dict[str, Any]
    ok: bool = False
    output: str = ""
    error: str | None = None
    matched: bool = False  # the output holds the task's expected answer
    seconds: float = 0.0
    sandbox: dict[str, Any] = field(default_factory=dict)

    @property
    def useful(self) -> bool:
        return self.ok and self.output.strip().lower() not in NOTHING


@dataclass
class Proposal:
    """What one cluster became: a reasoning skill, a new tool with its when-to-call skill, or
    a when-to-call skill for a tool the agent has already; kept or dropped with the reason."""

    kind: str  # reasoning | tool | when | task_tool (reads the task, answers it)
    cluster: Cluster
    skill: str = ""
    description: str = ""
    steps: list[str] = field(default_factory=list)
    when: str = ""
    tool: str = ""
    source: str = ""  # a new tool's code
    tests: list[ToolTest] = field(default_factory=list)
    kept: bool = False
    reason: str = ""
    files: dict[str, str] = field(default_factory=dict)
    # A task tool's verification on held-in training tasks (whetstone.engine.methods.dynamo.maker).
    accuracy: float | None = None
    checked: int = 0
    analyst: str = ""
    date: str = ""
    candidates: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Proposal:
        d = dict(d)
        d["cluster"] = Cluster(**d["cluster"])
        d["tests"] = [ToolTest(**t) for t in d.get("tests") or []]
        return cls(**d)


class Repairs:
    """Counts of what was repaired in the analyst's replies, by kind."""

    def __init__(self, counts: Mapping[str, int] | None = None) -> None:
        self.counts: dict[str, int] = dict(counts or {})

    def add(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n


# -- reading replies ---------------------------------------------------------------------------

def _text(value: Any) -> str:
    return " ".join(str(value).split()) if value is not None else ""


def parse_clusters(raw: str, labels: Mapping[str, str], repairs: Repairs) -> list[Cluster]:
    """Clusters from a diagnosis reply; ``labels`` maps F1.. (or task ids) to task ids.
    Unknown failure labels and unknown kinds are repaired or the cluster is dropped; a reply
    with no usable cluster is a ``ParseError`` (the analyst is asked again once)."""
    try:
        data = extract_json_object(raw, what="a JSON object with clusters")
    except ParseError:
        # The 0.5B analyst often runs out of tokens mid-list: keep the clusters it finished.
        data = salvage_truncated_json(raw)
        if data is None:
            raise
        repairs.add("truncated-reply")
    items = data.get("clusters") if isinstance(data, dict) else None
    if isinstance(items, dict):
        items = [items]
        repairs.add("cluster-object")
    if not isinstance(items, list):
        raise ParseError('the reply has no "clusters" list', raw,
                         hint='reply {"clusters": [{"failures": [...], "kind": ..., ...}]}')
    by_id = {**{v: v for v in labels.values()}, **labels}
    out: list[Cluster] = []
    for item in items:
        if not isinstance(item, dict):
            repairs.add("cluster-dropped")
            continue
        failures = item.get("failures") or []
        failures = [failures] if isinstance(failures, str) else failures
        known = [by_id[str(f).strip()] for f in failures if str(f).strip() in by_id]
        if len(known) != len(failures):
            repairs.add("unknown-failure-label", len(failures) - len(known))
        kind = _text(item.get("kind")).lower()
        if kind not in KINDS:
            mapped = next((k for w, k in KIND_WORDS.items() if w in kind), None)
            if mapped is None:
                repairs.add("cluster-dropped")
                continue
            kind = mapped
            repairs.add("kind-word")
        diagnosis = _text(item.get("diagnosis") or item.get("cause"))
        if not known or not diagnosis:
            repairs.add("cluster-dropped")
            continue
        out.append(Cluster(kind, list(dict.fromkeys(known)), diagnosis,
                           _text(item.get("fix")) or diagnosis))
    if not out:
        raise ParseError("no cluster names a known failure with a kind and a diagnosis", raw,
                         hint=f"failures are named {', '.join(list(labels)[:6])}; kinds: "
                              + ", ".join(KINDS))
    return out


def skill_name(raw: Any, fallback: str, repairs: Repairs) -> str:
    """A valid skill name from what the analyst wrote (lowercased, hyphenated, clipped)."""
    text = str(raw or "").strip()
    name = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:64].strip("-")
    if name != text:
        repairs.add("skill-name")
    return name if name and NAME_RE.fullmatch(name) else fallback


def _steps(value: Any, repairs: Repairs) -> list[str]:
    if isinstance(value, str):
        repairs.add("steps-text")
        value = [s for s in re.split(r"\n+|(?<=\.)\s+(?=\d+\.)", value) if s.strip()]
    if not isinstance(value, list):
        return []
    return [re.sub(r"^\s*(\d+[.)]|[-*])\s*", "", _text(s)) for s in value if _text(s)][:8]


def parse_reasoning(raw: str, cluster: Cluster, repairs: Repairs) -> Proposal:
    """A reasoning-skill proposal from a skill reply (``ParseError`` when it has no steps)."""
    data = extract_json_object(raw, what="a JSON object with name, description and steps")
    if not isinstance(data, dict):
        raise ParseError("the reply is not a JSON object", raw)
    steps = _steps(data.get("steps") or data.get("instructions"), repairs)
    if not steps:
        raise ParseError('the reply has no "steps" (a list of short instructions)', raw)
    description = _text(data.get("description")) or f"{cluster.fix} Use when: {cluster.diagnosis}"
    return Proposal("reasoning", cluster, skill=skill_name(data.get("name"), "", repairs),
                    description=description[:MAX_DESCRIPTION], steps=steps)


def _tests(value: Any, labels: Mapping[str, str], repairs: Repairs) -> list[ToolTest]:
    by_id = {**{v: v for v in labels.values()}, **labels}
    order = list(labels.values())
    out: list[ToolTest] = []
    for i, item in enumerate(value if isinstance(value, list) else []):
        if not isinstance(item, dict):
            repairs.add("test-dropped")
            continue
        args = item.get("arguments", item.get("args"))
        if isinstance(args, str):
            try:
                args = json.loads(args)
                repairs.add("test-arguments-text")
            except json.JSONDecodeError:
                args = None
        task = by_id.get(str(item.get("failure", "")).strip())
        if task is None and i < len(order):
            task = order[i]
            repairs.add("test-failure-label")
        if task is None or not isinstance(args, dict):
            repairs.add("test-dropped")
            continue
        out.append(ToolTest(task, args))
    return out


def code_block(raw: str) -> str:
    """The first fenced block that defines a function (or, with no fence, the code from the
    first import or def on)."""
    blocks = re.findall(r"```(?:python|py)?[ \t]*\n(.*?)```", raw, re.DOTALL)
    code = next((b for b in blocks if "def " in b), "")
    if not code and "def " in raw:  # no fence: from the first def (or import) to the JSON
        start = min(i for i in (raw.find("import "), raw.find("from "), raw.find("def "))
                    if i >= 0)
        end = raw.find("{", raw.find("return", start))
        code = raw[start:end if end > 0 else len(raw)]
    return code.strip() + "\n"


def parse_tool(raw: str, cluster: Cluster, labels: Mapping[str, str], taken: set[str],
               repairs: Repairs) -> tuple[Proposal, ToolDefinition]:
    """A new-tool proposal: the function must pass the admission check (``ValidationError``
    with every rule it breaks, so the analyst can fix it) and come with test arguments."""
    code = code_block(raw)
    fn = re.search(r"^def\s+([A-Za-z_]\w*)\s*\(", code, re.MULTILINE)
    if fn is None:
        raise ParseError("the reply has no ```python block defining a function", raw)
    name = fn.group(1).lower()
    if not TOOL_NAME.match(name):
        raise ParseError(f"{fn.group(1)!r} is not a tool name (a-z, 0-9, _)", raw)
    if name in taken:  # a built-in or an existing tool has the name: rename the definition
        new = next(f"{name}_{i}" for i in range(2, 99) if f"{name}_{i}" not in taken)
        code = re.sub(rf"^def\s+{fn.group(1)}\s*\(", f"def {new}(", code, flags=re.MULTILINE)
        name = new
        repairs.add("tool-renamed")
    elif name != fn.group(1):
        code = re.sub(rf"^def\s+{fn.group(1)}\s*\(", f"def {name}(", code, flags=re.MULTILINE)
    definition, problems = define_tool(code, name=name, skill="dynamo-draft")
    if definition is None:
        raise ValidationError(f"scripts/{name}.py", problems[0].rule, "; ".join(
            f"line {p.line}: {p.detail}" if p.line else p.detail for p in problems[:6]),
            hint="fix the function and reply again with the code block and the JSON")
    tail = raw[raw.rfind("```") + 3:] if raw.count("```") >= 2 else raw
    data = extract_json_object(tail, what="a JSON object with skill, description and tests")
    tests = _tests(data.get("tests") if isinstance(data, dict) else None, labels, repairs)
    if not tests:
        raise ParseError('the JSON has no "tests": arguments for the failures', raw,
                         hint='add "tests": [{"failure": "F1", "arguments": {...}}]')
    proposal = Proposal(
        "tool", cluster, skill=skill_name(data.get("skill"), name.replace("_", "-"), repairs),
        description=(_text(data.get("description")) or definition.spec.description)[
            :MAX_DESCRIPTION],
        when=_text(data.get("when")) or cluster.fix, tool=name, source=code, tests=tests)
    return proposal, definition


def parse_when(raw: str, cluster: Cluster, labels: Mapping[str, str], tools: Sequence[str],
               repairs: Repairs) -> Proposal | None:
    """A when-to-call proposal for one of ``tools`` (None: the analyst says none fits)."""
    data = extract_json_object(raw, what="a JSON object with tool, skill and tests")
    if not isinstance(data, dict):
        raise ParseError("the reply is not a JSON object", raw)
    tool = _text(data.get("tool")).strip("`'\" ")
    if tool.lower() == "none":
        return None
    if tool not in tools:
        close = [t for t in tools if t.lower() == tool.lower()]
        if not close:
            raise ParseError(f"{tool!r} is not one of the tools: {', '.join(tools)}", raw)
        tool = close[0]
        repairs.add("tool-name-case")
    tests = _tests(data.get("tests"), labels, repairs)
    if not tests:
        raise ParseError('the JSON has no "tests": arguments for the failures', raw)
    return Proposal("when", cluster, skill=skill_name(data.get("skill"), tool.replace("_", "-")
                                                      + "-when", repairs),
                    description=(_text(data.get("description")) or cluster.fix)[
                        :MAX_DESCRIPTION],
                    when=_text(data.get("when")) or cluster.fix, tool=tool, tests=tests)


# -- the state of a run ----------------------------------------------------------------------

@dataclass
class Round:
    """One round's work, saved as it is done (``None``: that phase has not run yet)."""

    number: int
    clusters: list[Cluster] | None = None
    proposals: list[Proposal] | None = None
    trial: dict[str, Attempt] | None = None  # attempts over the preview with this round's files
    kept: bool | None = None
    note: str = ""
    maker: Proposal | None = None  # the tool maker's proposal, when it ran this round

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, "note": self.note, "kept": self.kept,
                "maker": None if self.maker is None else self.maker.to_dict(),
                "clusters": None if self.clusters is None else [asdict(c) for c in self.clusters],
                "proposals": None if self.proposals is None else
                [p.to_dict() for p in self.proposals],
                "trial": None if self.trial is None else
                {k: asdict(a) for k, a in self.trial.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Round:
        return cls(d["number"],
                   None if d.get("clusters") is None else [Cluster(**c) for c in d["clusters"]],
                   None if d.get("proposals") is None else
                   [Proposal.from_dict(p) for p in d["proposals"]],
                   None if d.get("trial") is None else
                   {k: Attempt(**a) for k, a in d["trial"].items()},
                   d.get("kept"), d.get("note", ""),
                   None if d.get("maker") is None else Proposal.from_dict(d["maker"]))


@dataclass
class DynamoState:
    """Everything a run has done so far; saved after every phase so it can resume."""

    key: str
    attempts: dict[str, Attempt] = field(default_factory=dict)  # the kept library's attempts
    pending: dict[str, Attempt] = field(default_factory=dict)  # of an interrupted agent run
    rounds: list[Round] = field(default_factory=list)
    changes: dict[str, str] = field(default_factory=dict)
    scores: list[float] = field(default_factory=list)  # training accuracy after each kept round
    stop: str = ""
    analyst: AnalystStats = field(default_factory=AnalystStats)
    repairs: Repairs = field(default_factory=Repairs)
    agent_runs: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "attempts": {k: asdict(a) for k, a in self.attempts.items()},
                "pending": {k: asdict(a) for k, a in self.pending.items()},
                "rounds": [r.to_dict() for r in self.rounds], "changes": self.changes,
                "scores": self.scores, "stop": self.stop, "analyst": asdict(self.analyst),
                "repairs": self.repairs.counts, "agent_runs": self.agent_runs,
                "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DynamoState:
        return cls(d["key"], {k: Attempt(**a) for k, a in d["attempts"].items()},
                   {k: Attempt(**a) for k, a in d.get("pending", {}).items()},
                   [Round.from_dict(r) for r in d["rounds"]], dict(d["changes"]),
                   list(d["scores"]), d["stop"], AnalystStats(**d["analyst"]),
                   Repairs(d["repairs"]), d["agent_runs"], d.get("seconds", 0.0))


def accuracy(attempts: Mapping[str, Attempt], ids: Sequence[str] | None = None) -> float:
    chosen = [attempts[i] for i in (ids if ids is not None else attempts) if i in attempts]
    return sum(a.score for a in chosen) / len(chosen) if chosen else 0.0


def words(text: str) -> set[str]:
    return {w for w in "".join(c.lower() if c.isalnum() else " " for c in text).split()
            if len(w) > 2}


def similar(a: str, b: str) -> bool:
    wa, wb = words(a), words(b)
    return bool(wa and wb) and len(wa & wb) / len(wa | wb) >= 0.5


def dropped(kind: str, cluster: Cluster, reply: Any) -> Proposal:
    why = reply.stats.errors[-1] if reply.stats.errors else "the analyst gave no usable reply"
    return Proposal(kind, cluster, reason=f"dropped: {why}"[:600])


def merge(clusters: list[Cluster]) -> list[Cluster]:
    """Clusters of the same kind with a similar diagnosis become one; largest first."""
    out: list[Cluster] = []
    for c in clusters:
        same = next((o for o in out if o.kind == c.kind and similar(o.diagnosis, c.diagnosis)),
                    None)
        if same is None:
            out.append(Cluster(c.kind, list(c.failures), c.diagnosis, c.fix))
        else:
            same.failures = list(dict.fromkeys(same.failures + c.failures))
    return sorted(out, key=lambda c: -len(c.failures))


def expand_toolset(toolset: str, known: dict[str, Tool],
                   agent_tools: Callable[[], Sequence[Tool]]) -> dict[str, Tool]:
    """The tools a ``toolset`` names, by name: built-in, visual and learned ones (``known``),
    else the agent's own (functions, MCP servers' tools). An entry may be a pattern naming
    the agent's own tools it matches (``*``: all of them), so one command fits any
    environment's servers. ``ConfigError`` naming what matched nothing."""
    asked = [n.strip() for n in toolset.split(",") if n.strip()]
    tools = dict(known)
    if any(n not in known for n in asked):
        tools.update({t.name: t for t in agent_tools() if t.name not in known})
    own = [n for n in tools if n not in known]
    names: list[str] = []
    unknown: list[str] = []
    for n in asked:
        pattern = any(c in n for c in "*?[")
        matched = [t for t in own if fnmatch.fnmatchcase(t, n)] if pattern else \
            ([n] if n in tools else [])
        names += matched
        unknown += [] if matched else [n]
    if unknown:
        raise ConfigError(f"unknown tool(s) in toolset: {', '.join(unknown)}",
                          hint="tools: " + ", ".join(tools))
    return {n: tools[n] for n in dict.fromkeys(names)}
