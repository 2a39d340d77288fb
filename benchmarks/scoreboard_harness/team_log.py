"""A team's agent runs as its logger would write them: an OpenAI chat-completion log (JSONL).

The scoreboard's ``evolve: {from_log: true}`` rows learn from the set's train runs the way a
team would hand them over: not Whetstone's own traces, but the log a logging proxy or an
eval harness keeps, one conversation per line (the user's question, each assistant turn's
``tool_calls``, the ``tool`` messages answering them, the final answer), with the expected
answer a reviewer gave. ``whetstone traces import`` reads it back (docs/observability.md), and
the evolver learns from what the import built. Nothing Whetstone-only survives the trip: no
task ids, no scores, no plan of steps, no skills shown.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from whetstone.engine.errors import ConfigError
from whetstone.engine.types import Trace


def log_record(trace: Trace, n: int) -> dict[str, Any]:
    """One run as one chat-completion log line: the messages a team's logger saw."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": trace.task}]
    prompt = completion = 0
    for step in trace.steps:
        if step.kind == "think":
            got = (step.output or {}).get("completion") or {}
            prompt += int(got.get("prompt_tokens") or 0)
            completion += int(got.get("completion_tokens") or 0)
        if step.kind != "act":
            continue
        args = (step.input or {}).get("arguments") or {}
        call_id = f"call_{len(messages)}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": str((step.input or {}).get("tool") or ""),
                         "arguments": json.dumps(args, ensure_ascii=False)}}]})
        messages.append({"role": "tool", "tool_call_id": call_id,
                         "content": str((step.output or {}).get("observation") or "")})
    messages.append({"role": "assistant", "content": trace.answer or ""})
    record: dict[str, Any] = {"id": f"run-{n:05d}", "model": trace.model,
                              "created": int(trace.started), "messages": messages,
                              "usage": {"prompt_tokens": prompt,
                                        "completion_tokens": completion}}
    if trace.label is not None:
        record["expected"] = trace.label
    return record


def write_log(traces: Iterable[Trace], path: Path) -> int:
    """Write the runs that ended with an answer (a logger records replies) to ``path``;
    returns how many lines it wrote."""
    lines = [json.dumps(log_record(t, n), ensure_ascii=False)
             for n, t in enumerate(traces) if t.outcome == "answered" and t.answer]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return len(lines)


def import_log(log: Path, library: Path, scorer: str) -> dict[str, Any]:
    """Import ``log`` into ``library``'s trace store with the command a team would run,
    ``whetstone traces import --format openai --scorer SCORER``; its JSON report."""
    cmd = [sys.executable, "-m", "whetstone", "traces", "import", str(log), "--format",
           "openai", "--scorer", scorer, "--library", str(library), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 11):  # 11: some records were skipped, the rest stored
        raise ConfigError(f"`{' '.join(cmd[1:])}` failed ({done.returncode}):\n"
                          f"{done.stderr[-2000:]}", hint="run it by hand to see why")
    report: dict[str, Any] = json.loads(done.stdout)
    return report
