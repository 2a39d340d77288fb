"""A dead model is not a wrong model (issue 37, items 1 and 2).

A run that ended in the ``error`` outcome (the agent records a failed model call in its trace
and stops) is a failed task: left out of the accuracy, listed with its error, and ``eval``
exits 7 when every task failed (11 when some did), on every solver. The evolvers' own check
runs and the scoreboard read it the same way. ``scripted:`` replays its replies in task order
at any ``-j``.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from whetstone import open_library
from whetstone.cli import cli
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import BackendUnavailable
from whetstone.engine.evaluation.agent_solver import agent_solver
from whetstone.engine.evaluation.direct import direct_solver
from whetstone.engine.evaluation.results import EvalResult, TaskResult, load_results
from whetstone.engine.evaluation.runner import evaluate
from whetstone.engine.evaluation.tasks import read_jsonl
from whetstone.engine.runtime.agent import Agent
from whetstone.engine.types import Request, Step, Trace
from whetstone.library_store.store import Library
from whetstone.library_store.traces import TraceStore

ARITH = Path(__file__).parent / "fixtures" / "tasks" / "arith.jsonl"


def free_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tasks_file(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(line for line in ARITH.read_text().splitlines(True)[:n]))
    return path


# -- 37.1: eval ------------------------------------------------------------------------------

def test_eval_against_a_port_where_nothing_listens_lists_every_task_failed_and_exits_7(
        tmp_path: Path, whetstone_home: Path) -> None:
    """The issue's command: accuracy 0.000, errors 0, exit 0, and "error": null saved."""
    model = f"openai:qwen@http://127.0.0.1:{free_port()}/v1"
    res = CliRunner().invoke(cli, ["eval", "--tasks", str(tasks_file(tmp_path, 2)),
                                   "--model", model, "-j", "2"])
    assert res.exit_code == 7, res.output
    assert "accuracy -  (no task scored)  errors 2" in res.stdout
    assert "accuracy 0" not in res.output
    assert "2 task(s) failed: add-00, add-01 (BackendUnavailable: cannot reach" in res.stdout
    assert "every task failed" in res.stderr
    (saved,), _ = load_results(whetstone_home / "evals")
    assert saved.n_scored == 0 and saved.summary()["accuracy"] is None
    for r in saved.results:
        assert r.error_type == "BackendUnavailable" and "Connection refused" in (r.error or "")
    # The error is on the run itself, not only its outcome.
    traces = Library(whetstone_home / "library").traces.query()
    assert len(traces) == 2
    assert all(t.outcome == "error" and t.score is None and "BackendUnavailable" in t.meta[
        "error"] for t in traces)


def _unreachable(request: Request) -> str:
    raise BackendUnavailable("cannot reach http://127.0.0.1:9/v1: connection refused",
                             hint="start the server")


def test_every_solver_fails_the_tasks_of_an_unreachable_backend_the_same_way(
        tmp_path: Path) -> None:
    """The direct solver used to stop the run (exit 4) where the agent scored 0."""
    tasks = read_jsonl(ARITH)[:3]
    backend = ScriptedBackend(responder=_unreachable)
    solvers = {"agent": agent_solver(Agent(backend, checkpoints=None)),
               "direct": direct_solver(backend)}
    for name, solver in solvers.items():
        store = TraceStore(tmp_path / name)
        result = evaluate(tasks, solver, store=store)
        assert not result.partial and result.n == 3 and result.aborted, name
        assert [r.error_type for r in result.results] == ["BackendUnavailable"] * 3, name
        assert all("connection refused" in (r.error or "") for r in result.results), name
        assert result.summary()["accuracy"] is None


def test_an_error_outcome_among_answers_is_left_out_of_the_accuracy(tmp_path: Path) -> None:
    """One dead call in three tasks: 2/2 scored, one failed, not 2/3."""
    tasks = {t.question: t for t in read_jsonl(ARITH)[:3]}

    def reply(request: Request) -> str:
        task = tasks[request.messages[-1].text]
        if task.id == "add-01":
            _unreachable(request)
        return f"Final Answer: {task.expected}"

    agent = Agent(ScriptedBackend(responder=reply), checkpoints=None)
    result = evaluate(list(tasks.values()), agent_solver(agent))
    assert result.accuracy == 1.0 and result.n_scored == 2
    assert [r.task_id for r in result.failed] == ["add-01"]
    assert result.tally() == "2/2, 1 failed"


def test_a_saved_result_whose_task_ended_in_error_without_a_message_is_not_scored() -> None:
    """Files saved before the fix hold "outcome": "error", "error": null, "score": 0.0."""
    old = {"task_set": "s", "scorer": "numeric", "results": [
        {"task_id": "a", "score": 1.0, "outcome": "answered"},
        {"task_id": "b", "score": 0.0, "outcome": "error", "error": None}]}
    r = EvalResult.from_dict(old)
    assert r.accuracy == 1.0 and r.n_errors == 1 and not r.results[1].scored
    assert "no message was saved" in r.errors_line()


def test_compare_where_one_side_ran_out_of_scripted_replies_is_refused_with_7(
        tmp_path: Path, whetstone_home: Path) -> None:
    """``--compare v1 v2`` reported "difference -1.000 ... losses 3" and exited 0."""
    lib = open_library(whetstone_home / "library", create=True)
    lib.commit({"skills/adding/SKILL.md": "---\nname: adding\ndescription: Add two whole "
                "numbers.\n---\n\n# Adding\n\nAdd the numbers.\n"}, method="hand", message="v2")
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps(["Final Answer: 3", "Final Answer: 13", "Final Answer: 23"]))
    res = CliRunner().invoke(cli, ["eval", "--tasks", str(tasks_file(tmp_path, 3)),
                                   "--model", f"scripted:{replies}", "--compare", "v1", "v2"])
    assert res.exit_code == 7, res.output
    assert "comparison refused" in res.stderr and "ScriptExhausted" in res.output
    assert "difference" not in res.stdout and "losses" not in res.stdout
    first, second = sorted(load_results(whetstone_home / "evals")[0],
                           key=lambda r: r.library_version or "")
    assert first.accuracy == 1.0 and first.n_errors == 0
    assert second.aborted and {r.error_type for r in second.results} == {"ScriptExhausted"}


# -- 37.1: the evolvers' reading of failed runs -------------------------------------------------

def _trace(outcome: str, score: float | None = None, **meta: Any) -> Trace:
    return Trace(id=f"t-{outcome}", task="What is 1 + 2?", outcome=outcome,  # type: ignore[arg-type]
                 score=score, steps=(Step(kind="think", module="think", output="x"),),
                 meta={"task_id": "add-00", **meta})


@pytest.mark.horizon
@pytest.mark.nlpg
def test_evolvers_learn_nothing_from_a_failed_run() -> None:
    from whetstone.engine.evolution.pipeline import training_traces
    from whetstone.engine.methods.horizon.controller import record_from_trace
    from whetstone.engine.methods.nlpg.evolver import _score

    failed = _trace("error", error="BackendUnavailable: connection refused")
    limit = _trace("horizon")
    assert training_traces([failed, limit]) == [limit]
    assert _score(failed) is None and _score(limit) == 0.0  # unmeasured, not a 0
    assert record_from_trace(failed) is None and record_from_trace(limit) is not None


@pytest.mark.dynamo
def test_dynamo_check_runs_leave_failed_tasks_out_of_the_training_accuracy() -> None:
    """A check run's failed task used to be an attempt scored 0 (and shown to the analyst)."""
    from whetstone.engine.methods.dynamo.evolver import _Run

    task = read_jsonl(ARITH)[0]
    loop = _Run.__new__(_Run)
    loop.tasks = {task.id: task}
    loop.state = SimpleNamespace(pending={}, agent_runs=0)
    failed = EvalResult("s", "numeric", (TaskResult(task.id, 0.0, outcome="error",
                                                    error="ScriptExhausted: ran out"),))
    loop.context = SimpleNamespace(run_agent=lambda *a, **k: failed,
                                   store=SimpleNamespace(query=lambda q: []))
    assert loop._attempt([task.id], None, "attempts") == {}
    error_trace = _trace("error", error="BackendUnavailable: x")
    loop.context = SimpleNamespace(run_agent=lambda *a, **k: failed,
                                   store=SimpleNamespace(query=lambda q: []))
    assert loop._first_attempts([error_trace]) == {}


def test_the_scoreboard_counts_over_the_scored_tasks() -> None:
    """The pooled table showed ``(2/3)`` beside an accuracy over 2 scored tasks."""
    from scoreboard_harness.page import render_pool

    res = EvalResult("s", "numeric", (TaskResult("a", 1.0), TaskResult("b", 1.0),
                                      TaskResult("c", 0.0, error="BackendUnavailable: x")))
    plan = SimpleNamespace(set=lambda s: SimpleNamespace(test=f"{s}@test"))
    pool = SimpleNamespace(sets=["toy"], rows=["agent"], title="all", name="all")
    page = render_pool(plan, pool, {"toy/agent": SimpleNamespace(result=res)})  # type: ignore[arg-type]
    assert "| agent | 1.000 (2/2, 1 failed) |" in page


# -- 37.2: scripted replies in task order at any -j ------------------------------------------

def test_scripted_replies_go_to_their_tasks_under_the_default_j(
        tmp_path: Path, whetstone_home: Path) -> None:
    """A 4-reply script over 3 tasks (the first calls a tool) gave 0.333, 1.000 and 0.000."""
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps({"replies": [
        "Thought: add\nAction: calculator[1 + 2]", "Final Answer: 3",
        "Final Answer: 13", "Final Answer: 23"], "delay_s": 0.02}))
    tasks = tasks_file(tmp_path, 3)
    for j in ([], ["-j", "4"]):
        for _ in range(2):
            res = CliRunner().invoke(cli, ["eval", "--tasks", str(tasks), "--model",
                                           f"scripted:{replies}", *j])
            assert res.exit_code == 0, res.output
            assert "accuracy 1.000" in res.stdout, res.output
    runs, _ = load_results(whetstone_home / "evals")
    assert len(runs) == 4 and {r.meta["concurrency"] for r in runs} == {1}
    assert all([t.answer for t in r.results] == ["3", "13", "23"] for r in runs)


def test_an_explicit_j_on_a_scripted_list_says_it_runs_one_task_at_a_time(
        caplog: Any) -> None:
    tasks = read_jsonl(ARITH)[:2]
    backend = ScriptedBackend(["Final Answer: 3", "Final Answer: 13"])
    assert backend.capabilities.ordered and backend.capabilities.max_concurrency == 1
    from whetstone.engine.evaluation.runner import with_concurrency

    solver = with_concurrency(direct_solver(backend), 1, ordered=True)
    result = evaluate(tasks, solver, concurrency=4)
    assert result.meta["concurrency"] == 1 and result.accuracy == 1.0
    assert "one at a time" in caplog.text
    # A responder answers from each request's content: concurrency stays.
    assert not ScriptedBackend(responder=lambda r: "x").capabilities.ordered

