"""Issue 45 item 6, readable when piped: nothing a user copies (a trace id, a candidate's
name, a command) is cut or wrapped at 80 columns when the output is not a terminal, and a
streamed thought shows its text. Through the command line with no COLUMNS set, as
``whetstone ... | less`` sees it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from whetstone.cli import cli
from whetstone.engine.api import open_library

PIPED = {"COLUMNS": None}  # no terminal, no width given: what a pipe gets


def invoke(*args: str) -> tuple[int, str]:
    res = CliRunner(env=PIPED).invoke(cli, list(args))
    return res.exit_code, res.stdout


def script(tmp_path: Path, *replies: str) -> str:
    path = tmp_path / "replies.json"
    path.write_text(json.dumps(list(replies)))
    return f"scripted:{path}"


def test_the_trace_line_of_a_run_keeps_its_command_on_one_line(tmp_path: Path) -> None:
    code, out = invoke("run", "What is 17 * 23? Say it with all the working shown, please.",
                       "--model", script(tmp_path, "Final Answer: 391"))
    assert code == 0, out
    (line,) = [x for x in out.splitlines() if x.startswith("trace ")]
    trace_id = line.split()[1]
    assert line.endswith(f"`whetstone traces show {trace_id}`"), out


def test_traces_ls_ids_prints_whole_ids_one_a_line(tmp_path: Path) -> None:
    for task in ("What is 17 * 23?", "What is 2 + 2?"):
        assert invoke("run", task, "--model", script(tmp_path, "Final Answer: 4"))[0] == 0
    code, out = invoke("traces", "ls", "--ids")
    assert code == 0, out
    ids = out.splitlines()
    assert len(ids) == 2 and all(len(i) == 24 and " " not in i for i in ids), out
    assert [json.loads(invoke("traces", "show", i, "--json")[1])["id"] for i in ids] == ids
    code, table = invoke("traces", "ls")
    assert all(i in table for i in ids) and "…" not in table, table


@pytest.mark.trace2skill
def test_candidates_ls_prints_whole_names_and_a_short_verdict(tmp_path: Path) -> None:
    lib = open_library(tmp_path / "lib", create=True)
    name = "trace2skill-arithmetic-word-problems-with-units-20261207-101500-second-try"
    decision = {"accepted": False, "rule": "strict", "candidate_score": 0.5,
                "current_score": 0.8333, "reasons": ["the candidate loses"] * 5,
                "task_set": "tasks.jsonl", "wins": 0, "losses": 2}
    lib.candidates.save(name, {"skills/units/SKILL.md": "---\nname: units\n---\n"},
                        method="trace2skill", message="convert units before adding",
                        scores={"gate": decision})
    code, out = invoke("library", "candidates", "ls", "--library", str(tmp_path / "lib"))
    assert code == 0, out
    (row,) = [x for x in out.splitlines() if name in x]  # whole, on one line
    assert "gate rejected 0.500 vs 0.833" in row and "reasons" not in out, out


CALL = '{"name": "calculator", "arguments": {"expression": "17*23"}}'


def test_a_streamed_thought_shows_its_text_not_the_fence_that_opens_the_call(
        tmp_path: Path) -> None:
    """A reply that reasons, then writes its call in a ```json fence (or a <think> block and
    a <tool_call>), printed the fence line as the thought, or the tags around it; a reply
    that is only a fenced call printed "Thought: ```json"."""
    said = "I need to multiply 17 by 23, so I will use the calculator."
    replies = {
        "fenced": (f"{said}\n```json\n{CALL}\n```", said),
        "tags": (f"<think>\n{said}\n</think>\n<tool_call>\n{CALL}\n</tool_call>", said),
        "bare": (f"```json\n{CALL}\n```", None),
    }
    for name, (reply, thought) in replies.items():
        code, out = invoke("run", "What is 17 * 23?", "--model",
                           script(tmp_path, reply, "Final Answer: 391"))
        assert code == 0, out
        shown = [x for x in out.splitlines() if x.startswith("Thought:")]
        assert shown == ([f"Thought: {thought}"] if thought else []), (name, out)
        assert "```" not in out and "<think>" not in out and "Answer: 391" in out, (name, out)
