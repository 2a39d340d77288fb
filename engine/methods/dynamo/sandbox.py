"""Dynamo's tools on trial: each is called in the sandbox on the failing inputs it was written
for, judged (a tool that crashes or returns nothing useful is dropped with the reason), and a
kept one is written into the library beside its when-to-call skill, with its provenance.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whetstone.engine.errors import ToolError
from whetstone.engine.methods.base import LibraryPatch
from whetstone.engine.methods.dynamo import PROMPTS
from whetstone.engine.methods.dynamo.parts import (
    IMAGE_WORD,
    PROVENANCE,
    Attempt,
    DynamoState,
    Proposal,
    Round,
    ToolTest,
)
from whetstone.engine.prompts import render_prompt
from whetstone.engine.types import Skill
from whetstone.skills.format import render_skill_md
from whetstone.tools.learned import define_tool
from whetstone.tools.validate import ALLOWED_MODULES

if TYPE_CHECKING:
    from whetstone.tools.base import Tool

# -- testing tools in the sandbox -------------------------------------------------------------

def fill_images(args: Mapping[str, Any], image_params: Sequence[str], image: str | None
                ) -> dict[str, Any]:
    """The analyst's test arguments with ``"IMAGE"`` (or a missing image parameter) replaced by
    the task's image file."""
    out = {k: (image if v == IMAGE_WORD and image else v) for k, v in args.items()}
    for p in image_params:
        if image and (p not in out or not isinstance(out[p], str)
                      or not Path(out[p]).is_file()):
            out[p] = image
    return out


def run_tests(tests: list[ToolTest], call: Callable[[dict[str, Any]], Any],
              attempts: Mapping[str, Attempt], image_params: Sequence[str],
              score: Callable[[str, str], float]) -> None:
    """Call the tool once per test (``call(args) -> ToolResult``, sandboxed by the caller)
    and record what came back; ``score(output, task_id)`` says whether it holds the answer."""
    for t in tests:
        att = attempts.get(t.task_id)
        t.arguments = fill_images(t.arguments, image_params, att.image if att else None)
        try:
            res = call(t.arguments)
        except ToolError as exc:  # refused arguments
            t.ok, t.error = False, exc.message
            continue
        meta = dict(res.metadata)
        t.ok, t.output, t.error = res.ok, res.output[:2000], res.error
        t.seconds = round(res.duration_s, 3)
        t.sandbox = {k: v for k, v in (meta.get("sandbox") or {}).items()
                     if k in ("isolation", "warnings")}
        t.matched = bool(res.ok and score(res.output, t.task_id) >= 1.0)


def judge_tests(tests: Sequence[ToolTest], *, require_match: bool) -> str:
    """Why the tested tool is dropped ("" keeps it): it crashes, returns nothing useful, or
    (``require_match``) never reproduces an expected answer."""
    if not tests:
        return "no test input"
    crashed = [t for t in tests if not t.ok]
    useful = [t for t in tests if t.useful]
    if not useful:
        first = crashed[0].error if crashed else "an empty result"
        return (f"crashed on every failing input ({first})" if len(crashed) == len(tests)
                else f"returned nothing useful on the failing inputs ({first})")
    if len(crashed) * 2 > len(tests):
        return f"crashed on {len(crashed)} of {len(tests)} failing inputs ({crashed[0].error})"
    if require_match and not any(t.matched for t in tests):
        return "its results never held the expected answer"
    return ""


# -- writing the files ------------------------------------------------------------------------

def _title(name: str) -> str:
    return name.replace("-", " ").capitalize()


def _parameters(spec_params: Mapping[str, Any]) -> str:
    props = spec_params.get("properties") or {}
    parts = [f"`{k}` ({v.get('type', 'value')})" for k, v in props.items()]
    return ", ".join(parts) or "no arguments"


def _examples(p: Proposal, attempts: Mapping[str, Attempt]) -> str:
    items = []
    for t in [t for t in p.tests if t.matched][:2]:
        question = attempts[t.task_id].question if t.task_id in attempts else t.task_id
        items.append(PROMPTS.render(
            "parts.yaml#example", question=" ".join(question.split())[:300],
            tool=p.tool, arguments=json.dumps(t.arguments, ensure_ascii=False)[:400],
            result=t.output.strip()[:200]))
    return PROMPTS.render("parts.yaml#examples", items="\n".join(items)) if items else ""


def skill_files(p: Proposal, *, round_no: int, attempts: Mapping[str, Attempt],
                parameters: Mapping[str, Any] | None = None, tool_source: str | None = None
                ) -> dict[str, str]:
    """The library files of a kept proposal: SKILL.md (+ the tool's script), and its
    provenance in ``assets/provenance.json`` (kept in the version with the files it explains).
    ``tool_source``: where a given tool comes from (``mcp:<server>/<tool>``,
    ``python:module:function``), named in the skill's metadata."""
    if p.kind == "reasoning":
        body = PROMPTS.render("parts.yaml#reasoning_body", title=_title(p.skill),
                              diagnosis=p.cluster.diagnosis, steps="\n".join(
                                 PROMPTS.render("parts.yaml#step", number=i, text=s)
                                 for i, s in enumerate(p.steps, 1)))
    else:
        body = PROMPTS.render("parts.yaml#tool_body", title=_title(p.skill), when=p.when,
                              tool=p.tool, parameters=_parameters(parameters or {}),
                              diagnosis=p.cluster.diagnosis, examples=_examples(p, attempts))
    ran = sum(t.ok for t in p.tests)
    meta = {"source": "dynamo", "kind": p.kind, "round": str(round_no),
            "from-failures": " ".join(p.cluster.failures)[:400]}
    if p.tool:
        meta["tool"] = p.tool
        if tool_source:
            meta["tool-source"] = tool_source
        meta["sandbox-test"] = (f"{ran}/{len(p.tests)} ran, "
                                f"{sum(t.matched for t in p.tests)} held the expected answer")
    base = f"skills/{p.skill}"
    files = {f"{base}/SKILL.md": render_skill_md(Skill(
        name=p.skill, description=p.description, body=body.rstrip() + "\n", metadata=meta))}
    if p.kind == "tool":
        files[f"{base}/scripts/{p.tool}.py"] = p.source
    provenance = {"method": "dynamo", "round": round_no, "kind": p.kind,
                  "cluster": asdict(p.cluster), "tool": p.tool or None,
                  **({"tool_source": tool_source} if tool_source else {}),
                  # By task and trace id, not by label: a library never carries the answers.
                  "failures": [{"task_id": t, "trace_id": attempts[t].trace_id,
                                "answer": attempts[t].answer}
                               for t in p.cluster.failures if t in attempts],
                  "sandbox_tests": [asdict(t) for t in p.tests]}
    files[f"{base}/{PROVENANCE}"] = json.dumps(provenance, indent=1, ensure_ascii=False) + "\n"
    return files


def allowed_modules() -> str:
    """The modules a tool may import, for the tool prompt."""
    return ", ".join(sorted(ALLOWED_MODULES - {"__future__", "typing", "abc", "enum"}))


def image_params(tool: Tool) -> list[str]:
    """The parameters of a given tool that take an image file (the visual tools' ``image``)."""
    props = tool.spec.parameters.get("properties") or {}
    return [k for k, v in props.items() if v.get("type") == "string" and "image" in k]


def source_parameters(p: Proposal) -> dict[str, Any]:
    """The JSON schema of a proposed tool's parameters, read from its code."""
    definition, _ = define_tool(p.source, name=p.tool, skill=p.skill)
    return definition.spec.parameters if definition is not None else {}



# -- the patch --------------------------------------------------------------------------------

def call_rate(attempts: Mapping[str, Attempt], tool: str) -> float | None:
    """The share of ``attempts`` whose run called ``tool`` (None: no attempts)."""
    if not attempts:
        return None
    mark = render_prompt("analyst_trace.yaml#tool", tool=tool, observation="").rstrip()
    return sum(mark in a.text for a in attempts.values()) / len(attempts)


def build_patch(st: DynamoState, *, toolset: str, tasks: list[str], checkpoint: str
                ) -> LibraryPatch:
    """The run's patch: the kept files, a one-line summary, and the report of every round."""
    kept = [(r, p) for r in st.rounds if r.kept for p in r.proposals or [] if p.kept]
    pairs = [f"{p.skill} + {p.tool}" for _, p in kept if p.kind in ("tool", "task_tool")]
    whens = [f"{p.skill} -> {p.tool}" for _, p in kept if p.kind == "when"]
    lessons = [p.skill for _, p in kept if p.kind == "reasoning"]
    parts = ([f"skill + tool {', '.join(pairs)}"] if pairs else []) + \
        ([f"when to call {', '.join(whens)}"] if whens else []) + \
        ([f"reasoning skill {', '.join(lessons)}"] if lessons else [])
    score = " -> ".join(f"{s:.2f}" for s in st.scores)
    summary = (("; ".join(parts) or "no change") + f" (training accuracy {score}; "
               f"stopped: {st.stop})")
    a = st.analyst
    return LibraryPatch(
        method="dynamo", changes=dict(st.changes),
        message=PROMPTS.render("parts.yaml#message", summary=summary)[:500],
        details={"mode": "given-toolset" if toolset else "learn", "train_tasks": tasks,
                 "training_accuracy": st.scores, "stopped": st.stop,
                 "rounds": [r.to_dict() | {"trial": None} for r in st.rounds],
                 # How often the agent called each kept tool in its round's check run.
                 "pairs": [{"skill": p.skill, "tool": p.tool, "kind": p.kind,
                            "failures": p.cluster.failures,
                            "check_call_rate": call_rate(r.trial or {}, p.tool) if p.tool
                            else None} for r, p in kept],
                 "tool_maker": maker_report(st.rounds),
                 "repairs": st.repairs.counts, "dropped_replies": a.dropped,
                 "analyst": a.to_dict(), "checkpoint": checkpoint},
        costs={"analyst_calls": a.calls, "analyst_prompt_tokens": a.prompt_tokens,
               "analyst_completion_tokens": a.completion_tokens,
               "agent_runs": st.agent_runs, "seconds": {"fit": round(st.seconds, 3)}})


def maker_report(rounds: Sequence[Round]) -> dict[str, Any] | None:
    """What the tool maker did: its candidates (each admitted or dropped with the reason) and
    the tool it admitted, with its accuracy on the training tasks it was checked on."""
    made = [r.maker for r in rounds if r.maker is not None]
    if not made:
        return None
    p = made[-1]
    return {"candidates": p.candidates, "admitted": sum(c["admitted"] for c in p.candidates),
            "tool": p.tool if p.kept else None, "train_accuracy": p.accuracy,
            "train_checked": p.checked, "reason": p.reason}
