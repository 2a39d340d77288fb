"""Issue 45 item 4, numbers that are true, each through the command line as a user runs it:
the progress bar's tasks/min, the ``length`` outcome, an evolver's summary, ``whetstone
models`` and ``eval report``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_eval_cli import ARITH, factory
from test_evolve import LESSON, agent_that_needs_the_lesson, collect

from whetstone.cli import cli
from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.evaluation.results import load_results
from whetstone.engine.evaluation.runner import Solver
from whetstone.engine.evaluation.tasks import TaskRecord
from whetstone.engine.types import Trace


@pytest.mark.trace2skill
def test_tasks_per_minute_is_tasks_done_over_the_wall_time() -> None:
    """A slow first task (a model warming up) then fast ones: 20 tasks in 119 s is 10.1 a
    minute. rich's own estimate counted the last 30 s, from the first task in them to the
    last, and printed tens of thousands."""
    now = [0.0]

    def slow_first(model: str, library: Path, version: str | None) -> Solver:
        solve = factory(model, library, version)

        def run(task: TaskRecord, seed: int) -> Trace:
            now[0] += 100.0 if now[0] == 0 else 1.0
            return solve(task, seed)
        return run

    res = CliRunner().invoke(cli, ["eval", "--tasks", str(ARITH), "-j", "1"],
                             obj={"solver_factory": slow_first, "clock": lambda: now[0]})
    assert res.exit_code == 0, res.output
    (rate,) = re.findall(r"([\d.]+) tasks/min", res.stderr)
    assert rate == "10.1", res.stderr
    assert "20/20" in res.stderr and "0:01:59" in res.stderr  # the elapsed time, whole


def _write(path: Path, value: Any) -> Path:
    path.write_text(json.dumps(value) if not isinstance(value, str) else value)
    return path


@pytest.mark.trace2skill
def test_a_reply_cut_at_the_length_limit_is_the_length_outcome(tmp_path: Path) -> None:
    """``run``: the text is shown as cut and the exit is 8 (it was "Answer: 391 because",
    exit 0, outcome answered); ``traces ls --outcome length`` finds it."""
    replies = _write(tmp_path / "r.json", [{"text": "Final Answer: 391 because 17 * 20 is",
                                            "finish_reason": "length"}])
    runner = CliRunner()
    res = runner.invoke(cli, ["run", "What is 17 * 23?", "--model", f"scripted:{replies}"])
    assert res.exit_code == 8, res.output
    assert "Answer, cut at the length limit (outcome length): 391 because" in res.stdout
    listed = json.loads(runner.invoke(cli, ["traces", "ls", "--outcome", "length",
                                            "--json"]).stdout)
    assert [t["outcome"] for t in listed] == ["length"]


@pytest.mark.trace2skill
@pytest.mark.memory
def test_eval_counts_cut_answers_and_memory_keeps_none_of_them(tmp_path: Path) -> None:
    """Two tasks answered right, one of them in a reply cut at the length limit: ``eval``
    scores both as written and says one was cut (the saved result and the report too); the
    memory evolver, which keeps verified runs as worked examples, keeps only the whole one."""
    tasks = _write(tmp_path / "t.jsonl", "".join(json.dumps(t) + "\n" for t in (
        {"id": "whole", "question": "What is 6 * 7?", "expected": "42", "scorer": "numeric"},
        {"id": "cut", "question": "What is 17 * 23?", "expected": "391", "scorer": "numeric"})))
    replies = _write(tmp_path / "r.json", [
        "The answer is 42.", {"text": "The answer is 391, since", "finish_reason": "length"}])
    runner = CliRunner()
    res = runner.invoke(cli, ["eval", "--tasks", str(tasks), "--solver", "direct",
                              "--model", f"scripted:{replies}"])
    assert res.exit_code == 0, res.output
    assert "accuracy 1.000" in res.stdout, res.stdout
    assert "1 answer(s) cut at the length limit (outcome length)" in res.stdout
    (saved,), _ = load_results(Path(os.environ["WHETSTONE_HOME"]) / "evals")
    assert {r.task_id: r.outcome for r in saved.results} == {"whole": "answered",
                                                             "cut": "length"}
    assert saved.summary()["cut_at_length"] == 1
    report = tmp_path / "report.html"
    assert runner.invoke(cli, ["eval", "report", "--out", str(report)]).exit_code == 0
    assert "1 cut at the length limit" in report.read_text()
    res = runner.invoke(cli, ["evolve", "memory", "--model", "scripted:", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "What is 6 * 7?" in res.stdout and "17 * 23" not in res.stdout, res.stdout


@pytest.mark.trace2skill
def test_an_evolve_summary_names_no_file_its_candidate_does_not_hold(tmp_path: Path) -> None:
    """The analyst's changelog says it added a script; its only edit is to SKILL.md. The
    summary ``evolve`` prints (and the candidate keeps) leaves that clause out."""
    engine = Engine(ScriptedBackend(responder=agent_that_needs_the_lesson),
                    library=tmp_path / "lib", create=True, checkpointing=False)
    collect(engine)
    engine.close()
    reply = json.dumps({
        "reasoning": "The agent forgot to add.",
        "changelog": "added scripts/check_units.py to check the units; appended an adding "
                     "pitfall to SKILL.md",
        "edits": [{"file": "SKILL.md", "op": "append_to_section", "target_section": "Pitfalls",
                   "content": LESSON}]})
    analyst = _write(tmp_path / "analyst.json", [reply] * 4)
    res = CliRunner().invoke(cli, [
        "evolve", "trace2skill", "--skill", "adding", "--create", "--model", "scripted:",
        "--analyst", f"scripted:{analyst}", "--library", str(tmp_path / "lib"), "--dry-run",
        "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["changed"] == ["skills/adding/SKILL.md"]
    assert "check_units.py" not in out["message"], out["message"]
    assert out["message"].endswith("appended an adding pitfall to SKILL.md"), out["message"]


@pytest.mark.trace2skill
def test_models_marks_an_example_path_as_an_example() -> None:
    """``hf:/models/qwen2.5-0.5b#qwen.gguf`` is no file here: it read "installed"."""
    runner = CliRunner()
    res = runner.invoke(cli, ["models"])
    assert res.exit_code == 0, res.output
    (hf,) = [x for x in res.stdout.splitlines()
             if x.startswith("  hf:/models/qwen2.5-0.5b#qwen.gguf ")]
    assert hf.split()[1:] == ["example", "spec"], hf
    (embedded,) = [x for x in res.stdout.splitlines() if x.startswith("  embedded ")]
    assert embedded.split()[1:] == ["installed"], embedded
    rows = {r["spec"]: r for r in json.loads(runner.invoke(cli, ["models", "--json"]).stdout)}
    assert rows["hf:/models/qwen2.5-0.5b#qwen.gguf"]["example"] is True
    assert rows["embedded"]["example"] is False


@pytest.mark.trace2skill
def test_eval_report_shows_the_solver_and_both_runs_of_agent_against_direct(
        tmp_path: Path) -> None:
    """The same library version through the agent and through one direct call: the report
    listed one run's accuracy (the two share a name) and paired neither with the other."""
    runner = CliRunner()
    for solver in ("agent", "direct"):
        res = runner.invoke(cli, ["eval", "--tasks", str(ARITH), "--solver", solver],
                            obj={"solver_factory": factory})
        assert res.exit_code == 0, res.output
    report = tmp_path / "report.html"
    res = runner.invoke(cli, ["eval", "report", "--out", str(report)])
    assert res.exit_code == 0 and "(2 runs)" in res.stdout, res.output
    page = report.read_text()
    assert "<th>solver</th>" in page
    rows = re.findall(r"<tr[^>]*><td class='l'>[^<]*</td><td class='l'>[^<]*</td>"
                      r"<td class='l'>([^<]*)</td><td class='l'>([^<]*)</td>", page)
    assert sorted(solver for _, solver in rows) == ["agent", "direct"], rows
    accuracy = page.split('id="plot-accuracy-rows"')[1].split("</svg>")[0]
    assert "[agent]" in accuracy and "[direct]" in accuracy  # both drawn
    assert re.search(r"\[direct\] vs \S+ \[agent\]|\[agent\] vs \S+ \[direct\]", page), page
