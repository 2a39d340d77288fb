"""Decisions a person can act on (issue 45, item 3), through the command line: `evolve` shows
its progress off a terminal as plain lines and with --json as JSON events, prints the verdict
first, then the figures, the tasks that flipped with their trace ids, and the diff as one line a
file (--diff: whole); "could have missed" only on a tie; a tie it could not tell says how many
dev tasks would tell; a few tasks warn and never read as a gain; `library candidates show`
prints the gate's text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from test_evolve import HELD, LESSON, TASKS, analyst_reply

from whetstone.cli import cli
from whetstone.engine.commands.decisions import decision_lines
from whetstone.engine.evaluation.gate import gate
from whetstone.engine.evaluation.results import EvalResult, TaskResult
from whetstone.library_store.store import Library


def write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r.to_dict() if hasattr(r, "to_dict") else r) + "\n"
                            for r in rows))
    return path


def evolve(tmp_path: Path, gate_answers: tuple[list[str], list[str]], *args: str,
           held: list[Any] = HELD) -> Any:
    """trace2skill on the four apple tasks (collected wrong), the gate on ``held``: the
    current version's answers, then the candidate's."""
    current, candidate = gate_answers
    agent = [f"Final Answer: {i}" for i in range(1, 5)] + \
        [f"Final Answer: {a}" for a in current + candidate]
    (tmp_path / "agent.json").write_text(json.dumps(agent))
    (tmp_path / "analyst.json").write_text(json.dumps([analyst_reply(None)] * 4))  # type: ignore[arg-type]
    (tmp_path / "lib").mkdir(exist_ok=True)
    return CliRunner().invoke(cli, [
        "evolve", "trace2skill", "--tasks", str(write(tmp_path / "apples.jsonl", TASKS)),
        "--gate-tasks", str(write(tmp_path / "held.jsonl", held)), "--skill", "adding",
        "--create", "-j", "1", "--workers", "1", "--model", f"scripted:{tmp_path / 'agent.json'}",
        "--analyst", f"scripted:{tmp_path / 'analyst.json'}", "--library", str(tmp_path / "lib"),
        *args])


RIGHT = [str(2 * i) for i in range(11, 17)]
WRONG = [str(i) for i in range(11, 17)]


def test_evolve_shows_progress_then_the_verdict_figures_flips_and_a_diff_summary(
        tmp_path: Path) -> None:
    res = evolve(tmp_path, (WRONG, RIGHT))
    assert res.exit_code == 0, res.output
    # Progress off a terminal: plain lines on stderr, one per phase start and end at least.
    err = res.stderr.splitlines()
    for line in ("collect ", "traces read: 4/4", "traces: 4 read, 4 to learn from; the gate: 6",
                 "fit: trace2skill on 4 trace(s)", "analyst calls: 1", "analyst calls: 4",
                 "gate: the current version and the candidate on 6 task(s)",
                 "gate: current: 6/6", "gate: candidate: 6/6"):
        assert any(x.startswith(line) for x in err), (line, err)
    out = res.stdout.splitlines()
    # The verdict first, then the figures, every reason, the flipped tasks, where it went.
    assert out[0].startswith("gate accepted (cost_aware) on ") and ": a clear gain;" in out[0]
    assert out[1].strip().startswith("difference +1.000 [+1.000, +1.000] on 6 tasks")
    assert "could have missed" not in res.stdout
    flips = [x.strip() for x in out if x.strip().startswith("+ d")]
    assert [f.split(":")[0] for f in flips] == [f"+ {t.id}" for t in HELD]
    lib = Library.open(tmp_path / "lib")
    for flip in flips:  # each names both runs by trace id, whole
        before, after = flip.split("  ")[1].split(" -> ")
        assert lib.traces.get(before).meta["gate"] == "current"
        assert lib.traces.get(after).meta["gate"] == "candidate"
    first = {x: i for i, x in enumerate(out)}
    version = first["new library version v2"]
    assert max(i for i, x in enumerate(out) if x.strip().startswith("+ d")) < version
    # Then the change: one line a file, the whole diff only with --diff.
    assert out[-2] == "diff (`whetstone library diff v1 v2` shows it whole):"
    assert out[-1].strip().startswith("skills/adding/SKILL.md: +") and LESSON not in res.stdout


def test_evolve_json_gives_one_event_a_line_and_diff_prints_it_whole(tmp_path: Path) -> None:
    res = evolve(tmp_path, (WRONG, RIGHT), "--json")
    assert res.exit_code == 0, res.output
    events = [json.loads(x) for x in res.stderr.splitlines() if x.strip()]  # every line
    assert {e["event"] for e in events} == {"progress", "note", "log"}  # log: a warning
    phases = {e["phase"] for e in events if e["event"] == "progress"}
    assert {"traces read", "analyst calls", "gate: current", "gate: candidate"} <= phases
    out = json.loads(res.stdout)
    assert [f["task"] for f in out["decision"]["flipped"]] == [t.id for t in HELD]
    (tmp_path / "again").mkdir()
    again = evolve(tmp_path / "again", (WRONG, RIGHT), "--diff")
    assert again.exit_code == 0, again.output
    assert "+" + LESSON in again.stdout


def test_a_clear_loss_prints_no_could_have_missed_and_candidates_show_reads_as_text(
        tmp_path: Path) -> None:
    res = evolve(tmp_path, (RIGHT, WRONG))
    assert res.exit_code == 0, res.output
    assert ": a clear loss;" in res.stdout.splitlines()[0]
    assert "could have missed" not in res.stdout
    assert "- d11: 1 -> 0" in res.stdout
    name = Library.open(tmp_path / "lib").candidates.list()[0].name
    shown = CliRunner().invoke(cli, ["library", "candidates", "show", name, "--library",
                                     str(tmp_path / "lib")])
    assert shown.exit_code == 0, shown.output
    assert "gate rejected (cost_aware)" in shown.stdout and "a clear loss" in shown.stdout
    assert "{'" not in shown.stdout and "'accepted'" not in shown.stdout  # no Python dict
    assert "- d16: 1 -> 0" in shown.stdout


def test_a_few_tasks_that_could_not_tell_say_so_and_never_read_as_a_gain(tmp_path: Path) -> None:
    # 2 better of 6, 4 unchanged: +0.333 [+0.000, +0.667], McNemar p = 0.5.
    res = evolve(tmp_path, (WRONG[:2] + RIGHT[2:], RIGHT))
    assert res.exit_code == 0, res.output
    head, figures = res.stdout.splitlines()[:2]
    assert head.startswith("gate rejected") and "a tie it could not tell" in head
    assert "gain" not in head
    assert "+0.333 [+0.000, +0.667] on 6 tasks" in figures and "McNemar p = 0.5" in figures
    assert "fewer than 10 paired tasks: a rough interval" in figures
    text = " ".join(res.stdout.split())
    assert "dev tasks would tell at the spread seen" in text
    assert "only 6 paired tasks: an interval on fewer than 10 is rough" in text


def result(label: str, scores: list[float]) -> EvalResult:
    return EvalResult("dev", "exact", tuple(TaskResult(f"t{i}", s, tokens=100)
                                            for i, s in enumerate(scores)), label=label)


def test_two_wins_of_two_are_a_tie_not_a_gain() -> None:
    d = gate(result("cand", [1.0, 1.0]), result("cur", [0.0, 0.0]))
    assert (d.ci_low, d.ci_high, d.p_value) == (1.0, 1.0, 0.5)
    assert d.verdict == "tie" and not d.accepted
    assert any("too few tasks changed to call it a gain" in why for why in d.reasons)
    assert "a clear gain" not in decision_lines(d.to_dict())[0]
