"""The tool maker's SKILL phase: an admitted tool as a skill folder (SKILL.md with when to call it
and its measured accuracy, the script, verified calls, the provenance with every candidate)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict

from ....skills.format import Example, render_examples, render_skill_md
from ....tools.learned import answer_text
from ...prompts import render_prompt
from ...types import Skill
from . import PROMPTS
from .parts import (
    PROVENANCE,
    Proposal,
)


def tool_call_text(tool: str) -> str:
    return render_prompt("examples.yaml#tool_call", call=json.dumps(
        {"name": tool, "arguments": {}}))


def task_tool_files(p: Proposal, *, round_no: int, questions: Mapping[str, str]
                    ) -> dict[str, str]:
    """SKILL.md (when to call, the verified call, the measured accuracy in ``metadata``), the
    script, two verified calls on training tasks, and the provenance with every candidate."""
    correct = sum(t.matched for t in p.tests)
    body = PROMPTS.render("parts.yaml#task_tool_body", title=p.skill.replace(
        "-", " ").capitalize(), when=p.when, tool=p.tool, checked=p.checked, correct=correct)
    meta = {"source": "dynamo", "kind": "task-tool", "round": str(round_no), "tool": p.tool,
            "train-accuracy": f"{p.accuracy or 0.0:.3f}", "train-checked": str(p.checked),
            "analyst": p.analyst, "verified": p.date}
    base = f"skills/{p.skill}"
    files = {f"{base}/SKILL.md": render_skill_md(Skill(
        name=p.skill, description=p.description, body=body.rstrip() + "\n", metadata=meta)),
        f"{base}/scripts/{p.tool}.py": p.source}
    shown = [t for t in p.tests if t.matched and t.task_id in questions][:2]
    if shown:
        files[f"{base}/references/examples.md"] = render_examples(
            [Example(t.task_id, questions[t.task_id], "\n".join([
                tool_call_text(p.tool),
                render_prompt("examples.yaml#tool_response", output=t.output.strip()),
                answer_text(t.output)])) for t in shown],
            title=PROMPTS.load("parts.yaml#task_tool_examples_title"),
            intro=PROMPTS.render("parts.yaml#task_tool_examples_intro", tool=p.tool))
    provenance = {"method": "dynamo", "round": round_no, "kind": "task_tool", "tool": p.tool,
                  "train_accuracy": p.accuracy, "train_checked": p.checked,
                  "analyst": p.analyst, "verified": p.date, "cluster": asdict(p.cluster),
                  "candidates": p.candidates,
                  "checks": [asdict(t) for t in p.tests]}
    files[f"{base}/{PROVENANCE}"] = json.dumps(provenance, indent=1, ensure_ascii=False) + "\n"
    return files

