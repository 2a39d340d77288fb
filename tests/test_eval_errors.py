"""A failed task is never a silent 0 (issue 27, items 2 and 8, and item 1's consequence).

A task whose solver or scorer raises is recorded with its error, left out of the accuracy and
of the pairing; the run goes on and is saved; ``eval`` exits 11 (``EXIT_PARTIAL``); a
comparison or a gate refuses to decide on such runs unless told to; the report neither draws
an aborted run as 0.000 nor labels two runs alike.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.commands.eval import eval_cmd
from whetstone.engine.errors import EXIT_PARTIAL, TasksFailed
from whetstone.engine.evaluation.compare import compare
from whetstone.engine.evaluation.direct import direct_solver
from whetstone.engine.evaluation.gate import gate, run_gate
from whetstone.engine.evaluation.report import charted, latest_per_name, render_report, run_label
from whetstone.engine.evaluation.results import EvalResult, TaskResult, load_result, load_results
from whetstone.engine.evaluation.runner import Solver, evaluate
from whetstone.engine.evaluation.tasks import TaskRecord, read_jsonl
from whetstone.engine.types import Request
from whetstone.library_store.traces import TraceStore

ARITH = Path(__file__).parent / "fixtures" / "tasks" / "arith.jsonl"


def right_solver(fail_on: frozenset[str] = frozenset()) -> Solver:
    """Answers every arithmetic task right; raises on the tasks in ``fail_on``."""
    tasks = {t.question: t for t in read_jsonl(ARITH)}

    def respond(req: Request) -> str:
        t = tasks[req.messages[-1].text]
        if t.id in fail_on:
            raise RuntimeError(f"upstream reset on {t.id}")
        return f"The answer is {t.expected}."

    return direct_solver(ScriptedBackend(responder=respond), model="scripted",
                         library_version="v")


def factory(fail_on: dict[str | None, frozenset[str]]) -> Any:
    def make(model: str, library: Path, version: str | None) -> Solver:
        return right_solver(fail_on.get(version, frozenset()))
    return make


# -- the runner -------------------------------------------------------------------------------

def test_a_scorer_that_raises_on_one_task_fails_that_task_and_the_run_is_kept(
        tmp_path: Path) -> None:
    """Issue 27 item 2: a user scorer's IndexError on 1 task of 20 used to stop the run."""
    def scorer(answer: Any, task: TaskRecord) -> float:
        fields = task.question.split()
        return 1.0 if task.id != "add-07" else float(fields[len(fields)])  # the user's bug

    store = TraceStore(tmp_path / "traces")
    result = evaluate(read_jsonl(ARITH), right_solver(), scorer, concurrency=4, store=store,
                      results_dir=tmp_path / "evals")
    assert not result.partial and result.n == 20 and result.n_scored == 19
    assert result.accuracy == 1.0
    (bad,) = result.failed
    assert bad.task_id == "add-07" and bad.error_type == "IndexError"
    assert bad.error.startswith("IndexError: list index out of range (in scorer")
    saved = load_result(result.meta["saved_to"])
    assert saved.n_errors == 1 and saved.summary()["failed_tasks"] == ["add-07"]
    # The model's work on the failed task is kept: its trace is stored, unscored.
    traces = {t.meta["task_id"]: t for t in store.query()}
    assert len(traces) == 20 and traces["add-07"].score is None
    assert "IndexError" in traces["add-07"].meta["eval_error"]


def test_eval_cli_scorer_error_saves_the_run_and_exits_partial(
        whetstone_home: Path, tmp_path: Path) -> None:
    scorer = tmp_path / "my_scorer.py"
    scorer.write_text("def score(answer, task):\n"
                      "    if task.id == 'add-03':\n"
                      "        raise IndexError('tuple index out of range')\n"
                      "    return 1.0\n")
    res = CliRunner().invoke(eval_cmd, ["--tasks", str(ARITH), "--scorer", f"{scorer}:score"],
                             obj={"solver_factory": factory({})}, catch_exceptions=False)
    assert res.exit_code == EXIT_PARTIAL == 11, res.output
    assert "accuracy 1.000" in res.stdout and "errors 1" in res.stdout
    assert "add-03 (IndexError: tuple index out of range" in res.stdout
    (saved,), _ = load_results(whetstone_home / "evals")
    assert saved.n == 20 and saved.n_scored == 19 and saved.failed[0].task_id == "add-03"


def test_json_summary_has_errors_beside_accuracy(whetstone_home: Path) -> None:
    res = CliRunner().invoke(eval_cmd, ["--tasks", str(ARITH), "--json"],
                             obj={"solver_factory": factory({None: frozenset({"add-01"})})},
                             catch_exceptions=False)
    assert res.exit_code == EXIT_PARTIAL
    summary = json.loads(res.stdout)["results"][0]["summary"]
    assert summary["accuracy"] == 1.0 and summary["errors"] == 1
    assert summary["n_scored"] == 19 and summary["failed_tasks"] == ["add-01"]


# -- comparison and the gate ------------------------------------------------------------------

def result(label: str, scores: dict[str, float | None]) -> EvalResult:
    """None: the task failed."""
    return EvalResult("s", "exact", tuple(
        TaskResult(t, 0.0, error="RuntimeError: boom", error_type="RuntimeError")
        if v is None else TaskResult(t, v) for t, v in scores.items()), label=label,
        n_planned=len(scores))


def test_compare_pairs_only_tasks_scored_in_both_and_says_how_many_were_left_out() -> None:
    a = result("a", {"t1": 1.0, "t2": 1.0, "t3": None, "t4": 0.0})
    b = result("b", {"t1": 1.0, "t2": None, "t3": 1.0, "t4": 1.0})
    c = compare(a, b)
    assert c.task_ids == ("t1", "t4") and c.difference == 0.5
    assert c.losses == () and c.wins == ("t4",)  # b's failure on t2 is not a loss
    assert c.failed_in_a == ("t3",) and c.failed_in_b == ("t2",) and c.left_out == 2
    assert c.to_dict()["left_out"] == 2


def test_the_gate_refuses_runs_with_failed_tasks_unless_allowed() -> None:
    current = result("current", {"t1": 1.0, "t2": 1.0, "t3": 0.0})
    candidate = result("candidate", {"t1": 1.0, "t2": None, "t3": 0.0})
    with pytest.raises(TasksFailed, match=r"candidate: 1 task\(s\) failed: t2") as info:
        gate(candidate, current)
    assert "--allow-errors" in (info.value.hint or "") and info.value.exit_code == 7
    with pytest.raises(TasksFailed, match=r"1 of 3 tasks failed \(33%, more than 10%\)"):
        gate(candidate, current, allow_errors=True)  # too many to decide on the rest
    d = gate(candidate, current, "mean_not_worse", allow_errors=True, max_failed=0.5)
    assert d.accepted and d.n_tasks == 2 and d.left_out == ("t2",)
    assert d.to_dict()["left_out"] == ["t2"]
    assert "1 task(s) failed and are left out, neither a win nor a loss" in d.reasons[-1]


def test_run_gate_saves_both_runs_then_refuses(tmp_path: Path) -> None:
    tasks = read_jsonl(ARITH)[:6]
    with pytest.raises(TasksFailed, match="add-02"):
        run_gate(tasks, right_solver(frozenset({"add-02"})), right_solver(),
                 results_dir=tmp_path, candidate_version="new", current_version="old")
    saved, _ = load_results(tmp_path)
    assert sorted((r.library_version, r.n_errors) for r in saved) == [("new", 1), ("old", 0)]
    d = run_gate(tasks, right_solver(frozenset({"add-02"})), right_solver(),
                 rule="mean_not_worse", allow_errors=True, max_failed=0.2)
    assert d.accepted and d.n_tasks == 5 and d.left_out == ("add-02",)


def test_eval_compare_refuses_with_errors_and_pairs_scored_tasks_when_allowed(
        whetstone_home: Path) -> None:
    obj = {"solver_factory": factory({"v2": frozenset({"add-04", "add-05"})})}
    args = ["--tasks", str(ARITH), "--compare", "v1", "v2"]
    res = CliRunner().invoke(eval_cmd, args, obj=obj, catch_exceptions=False)
    assert res.exit_code == 7, res.output
    assert "comparison refused" in res.stderr and "v2: 2 task(s) failed: add-04" in res.stderr
    assert "--allow-errors" in res.stderr and "paired tasks" not in res.stdout
    assert len(load_results(whetstone_home / "evals")[0]) == 2  # both runs saved anyway
    res = CliRunner().invoke(eval_cmd, [*args, "--allow-errors"], obj=obj,
                             catch_exceptions=False)
    assert res.exit_code == EXIT_PARTIAL, res.output
    assert "on 18 paired tasks: difference +0.000" in res.stdout
    assert "2 task(s) left out of the pairing (failed in v1: 0, in v2: 2" in res.stdout


# -- the report -------------------------------------------------------------------------------

def test_the_report_does_not_draw_an_aborted_run_as_zero() -> None:
    """Issue 27 item 8: a run stopped before its first score was a 0.000 row and dot."""
    good = result("v1", {"t1": 1.0, "t2": 1.0})
    aborted = EvalResult("s", "exact", (), label="v2", partial=True, n_planned=2,
                         started=good.started + 5,
                         meta={"stopped_by": "BackendUnavailable: connection refused"})
    all_failed = result("v3", {"t1": None, "t2": None})
    runs = [good, aborted, all_failed]
    assert charted(runs) == [good] and latest_per_name(runs) == [good]
    page = render_report(runs)
    svg = page[page.index("<svg"):page.index("</svg>")]
    assert ">v1<" in svg and "v2" not in svg and "v3" not in svg
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", page)
    v2 = next(r for r in rows if ">v2" in r)
    assert "0.000" not in v2 and "&mdash;" in v2 and "aborted: BackendUnavailable" in v2
    v3 = next(r for r in rows if ">v3" in r)
    assert "0.000" not in v3 and "2 task(s) failed" in v3


def test_a_run_with_failed_tasks_is_marked_in_the_chart() -> None:
    some = result("v1", {"t1": 1.0, "t2": None, "t3": 0.0})
    svg = render_report([some])
    assert "v1 (1 failed)" in svg and "over 2 scored of 3" in svg


def test_token_boxes_tell_two_runs_of_one_version_and_file_apart() -> None:
    a = result("v1", {"t1": 1.0})
    b = result("v1", {"t1": 1.0})
    a = EvalResult(**{**a.__dict__, "meta": {"run_id": "aaaa1111", "solver": "direct"}})
    b = EvalResult(**{**b.__dict__, "meta": {"run_id": "bbbb2222", "solver": "agent"},
                      "started": a.started + 60})
    la, lb = run_label(a), run_label(b)
    assert la != lb and "#aaaa1111" in la and "direct" in la and "agent" in lb
    assert "n=1" in la


@pytest.mark.trace2skill
def test_evolve_keeps_the_patch_as_a_candidate_when_gate_tasks_fail(tmp_path: Path) -> None:
    """The fit's work is not lost when the gate cannot decide; --allow-errors decides."""
    from whetstone.engine.evolution.pipeline import gate_and_apply
    from whetstone.engine.methods.base import LibraryPatch
    from whetstone.library_store.store import Library

    lib = Library.init(tmp_path / "lib")
    skill = ("---\nname: adding\ndescription: Word problems that add quantities.\n---\n\n"
             "# Adding\n\nAdd the numbers.\n")
    patch = LibraryPatch("trace2skill", {"skills/adding/SKILL.md": skill}, "add a skill")
    current_id = lib.snapshot().id

    def make_solver(snap: Any) -> Solver:  # the candidate's runs hit a flaky upstream
        return right_solver(frozenset({"add-01"}) if snap.id != current_id else frozenset())

    tasks = read_jsonl(ARITH)[:4]
    out = gate_and_apply(patch, lib, make_solver=make_solver, gate_tasks=tasks,
                         candidate_name="adding-try")
    assert out.decision is None and out.version is None and out.candidate == "adding-try"
    assert "add-01" in out.note and "--allow-errors" in out.note
    assert lib.snapshot().id == current_id  # nothing landed
    out = gate_and_apply(patch, lib, make_solver=make_solver, gate_tasks=tasks,
                         allow_errors=True)  # 1 of 4 failed: too many to decide on the rest
    assert out.decision is None and out.version is None and "1 of 4 tasks failed" in out.note
    out = gate_and_apply(patch, lib, make_solver=make_solver, gate_tasks=read_jsonl(ARITH),
                         rule="mean_not_worse", allow_errors=True)  # 1 of 20: decided
    assert out.decision is not None and out.decision.left_out == ("add-01",)
    assert out.version is not None


@pytest.mark.memory
def test_evolve_takes_allow_errors_from_the_command_line() -> None:
    from click.testing import CliRunner

    from whetstone.cli import cli

    res = CliRunner().invoke(cli, ["evolve", "memory", "--help"])
    assert res.exit_code == 0 and "--allow-errors" in res.output
