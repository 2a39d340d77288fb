"""The runner: scripted solvers through the scripted backend, stored traces, seeds, Ctrl-C."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import pytest

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import ConfigError, EvalError
from whetstone.engine.evaluation.direct import direct_solver, task_messages
from whetstone.engine.evaluation.results import EvalResult, load_result, load_results
from whetstone.engine.evaluation.runner import Solver, evaluate, task_seed
from whetstone.engine.evaluation.tasks import TaskRecord, read_jsonl
from whetstone.engine.types import Request, Trace
from whetstone.library_store.traces import TraceQuery, TraceStore

ARITH = Path(__file__).parent / "fixtures" / "tasks" / "arith.jsonl"


def arith_solver(correct: set[str] | None = None, version: str = "v1",
                 delay_s: float = 0.0) -> tuple[Solver, ScriptedBackend]:
    """Answers the arithmetic fixture: right on ``correct`` ids (all when None), off by one
    elsewhere."""
    by_question = {t.question: t for t in read_jsonl(ARITH)}

    def respond(req: Request) -> str:
        t = by_question[req.messages[-1].text]
        right = correct is None or t.id in correct
        return f"Adding them: the answer is {int(t.expected) + (0 if right else 1)}."

    backend = ScriptedBackend(responder=respond, delay_s=delay_s)
    return direct_solver(backend, model="scripted", library_version=version), backend


def seeded_solver() -> Solver:
    """Right or wrong by a coin flipped with the request's seed (sampling at temperature > 0)."""
    by_question = {t.question: t for t in read_jsonl(ARITH)}

    def respond(req: Request) -> str:
        t = by_question[req.messages[-1].text]
        right = random.Random(req.seed).random() < 0.5
        return f"#### {int(t.expected) + (0 if right else 7)}"

    return direct_solver(ScriptedBackend(responder=respond), model="scripted")


def test_evaluate_scores_stores_and_summarises(tmp_path: Path) -> None:
    tasks = read_jsonl(ARITH)
    correct = {t.id for t in tasks.tasks[:15]}
    solver, backend = arith_solver(correct)
    store = TraceStore(tmp_path / "traces")
    seen: list[tuple[int, int]] = []
    result = evaluate(tasks, solver, store=store, seed=7,
                      on_progress=lambda done, n, r: seen.append((done, n)))
    assert result.n == 20 and result.accuracy == 0.75 and not result.partial
    assert result.scorer == "numeric"  # the set's default
    assert result.model == "scripted" and result.library_version == "v1"
    assert seen == [(i, 20) for i in range(1, 21)]
    ci = result.interval()
    assert ci.method == "wilson" and ci.low < 0.75 < ci.high
    # Tokens come from the backend's usage; latency is measured.
    assert result.mean_tokens > 0 and all(r.tokens > 0 for r in result.results)
    # The request carried the task's own seed.
    assert backend.requests[0].seed == task_seed(7, "add-00")
    # Every trace is stored with its score, label and eval metadata.
    stored = store.query(TraceQuery(task_set=str(ARITH)))
    assert len(stored) == 20
    by_task = {t.meta["task_id"]: t for t in stored}
    assert by_task["add-00"].score == 1.0 and by_task["add-19"].score == 0.0
    assert by_task["add-00"].label == "3" and by_task["add-00"].meta["scorer"] == "numeric"
    assert by_task["add-00"].meta["eval_run"] == result.meta["run_id"]


def test_same_seed_same_scores_whatever_the_concurrency() -> None:
    tasks = read_jsonl(ARITH)
    runs = [evaluate(tasks, seeded_solver(), seed=s, concurrency=c)
            for s, c in ((1, 1), (1, 4), (1, 1), (2, 1))]
    assert runs[0].scores == runs[1].scores == runs[2].scores
    assert runs[0].scores != runs[3].scores  # another seed, other samples
    assert [r.task_id for r in runs[1].results] == [t.id for t in tasks]  # task order kept
    assert 0 < runs[0].accuracy < 1


def test_concurrency_runs_tasks_at_the_same_time() -> None:
    tasks = read_jsonl(ARITH).tasks[:8]
    active, peak = [0], [0]
    lock = threading.Lock()
    base, _ = arith_solver()

    def solver(task: TaskRecord, seed: int) -> Trace:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            threading.Event().wait(0.05)
            return base(task, seed)
        finally:
            with lock:
                active[0] -= 1

    result = evaluate(tasks, solver, concurrency=4)
    assert result.accuracy == 1.0 and peak[0] > 1


def test_a_solver_crash_fails_that_task_out_of_the_accuracy_and_the_run_goes_on() -> None:
    """Issue 27: a failed task is a missing measurement, not a 0."""
    tasks = read_jsonl(ARITH)
    base, _ = arith_solver()

    def solver(task: TaskRecord, seed: int) -> Trace:
        if task.id == "add-03":
            raise RuntimeError("tool sandbox died")
        return base(task, seed)

    result = evaluate(tasks, solver)
    assert result.n == 20 and result.n_errors == 1 and result.n_scored == 19
    assert result.accuracy == 1.0 and result.interval().mean == 1.0
    assert "add-03" not in result.scores
    bad = next(r for r in result.results if r.task_id == "add-03")
    assert bad.error == "RuntimeError: tool sandbox died" and bad.error_type == "RuntimeError"
    summary = result.summary()
    assert summary["errors"] == 1 and summary["failed_tasks"] == ["add-03"]
    assert summary["n_scored"] == 19 and summary["accuracy"] == 1.0


def test_a_fatal_error_stops_the_run_but_keeps_what_was_scored(tmp_path: Path) -> None:
    tasks = read_jsonl(ARITH)
    base, _ = arith_solver()

    def solver(task: TaskRecord, seed: int) -> Trace:
        if task.id == "add-05":
            raise ConfigError("no such model", hint="check --model")
        return base(task, seed)

    with pytest.raises(ConfigError):
        evaluate(tasks, solver, results_dir=tmp_path / "evals")
    (saved,), _ = load_results(tmp_path / "evals")
    assert saved.partial and saved.n == 5 and "ConfigError" in saved.meta["stopped_by"]


def test_ctrl_c_keeps_the_results_scored_so_far(tmp_path: Path) -> None:
    tasks = read_jsonl(ARITH)
    base, _ = arith_solver()
    store = TraceStore(tmp_path / "traces")

    def solver(task: TaskRecord, seed: int) -> Trace:
        if task.id == "add-04":
            raise KeyboardInterrupt
        return base(task, seed)

    result = evaluate(tasks, solver, store=store, results_dir=tmp_path / "evals")
    assert result.partial and result.n == 4 and result.n_planned == 20
    saved = load_result(result.meta["saved_to"])
    assert saved.partial and [r.task_id for r in saved.results] == [
        "add-00", "add-01", "add-02", "add-03"]
    assert len(store.query()) == 4


def test_ctrl_c_with_concurrency_stops_queued_tasks() -> None:
    tasks = read_jsonl(ARITH)
    solver, backend = arith_solver(delay_s=0.05)

    def interrupt_at_five(done: int, n: int, r: object) -> None:
        if done == 5:
            raise KeyboardInterrupt

    result = evaluate(tasks, solver, concurrency=2, on_progress=interrupt_at_five)
    assert result.partial and result.n == 5
    # Queued tasks were cancelled: only the ones already running finish after the stop.
    threading.Event().wait(0.3)
    settled = len(backend.requests)
    threading.Event().wait(0.3)
    assert len(backend.requests) == settled < 20


def test_results_round_trip_and_never_overwrite(tmp_path: Path) -> None:
    solver, _ = arith_solver()
    result = evaluate(read_jsonl(ARITH).tasks[:3], solver, task_set="arith", label="v1")
    p1, p2 = result.save(tmp_path), result.save(tmp_path)
    assert p1 != p2 and p1.name.endswith("-arith-v1.json")
    back = load_result(p1)
    assert back == result
    data = json.loads(p1.read_text())
    assert data["summary"]["accuracy"] == 1.0 and data["summary"]["ci_method"] == "wilson"
    (tmp_path / "junk.json").write_text("{not json")
    loaded, problems = load_results(tmp_path)
    assert len(loaded) == 2 and len(problems) == 1 and "junk.json" in problems[0]


def test_bad_arguments_are_refused() -> None:
    solver, _ = arith_solver()
    tasks = read_jsonl(ARITH).tasks
    with pytest.raises(EvalError, match="concurrency"):
        evaluate(tasks, solver, concurrency=0)
    with pytest.raises(EvalError, match="unique"):
        evaluate(tasks[:2] + tasks[:1], solver)
    with pytest.raises(EvalError, match="not a Trace"):
        evaluate(tasks[:1], lambda t, s: "42")  # type: ignore[arg-type, return-value]
    with pytest.raises(EvalError, match="unknown scorer"):
        evaluate(tasks[:1], solver, "bleu")


def test_direct_solver_builds_messages_with_evidence_and_image(tmp_path: Path) -> None:
    t = TaskRecord(id="h", question="Who?", evidence="Ada wrote it.", image="x.png",
                   expected="Ada", scorer="contains")
    msgs = task_messages(t, system="Be brief.")
    assert msgs[0].role == "system" and "Be brief." in msgs[0].text
    assert "Ada wrote it." in msgs[0].text
    assert msgs[1].images == ["x.png"] and msgs[1].text == "Who?"
    backend = ScriptedBackend(["It was Ada."])
    result = evaluate([t], direct_solver(backend))
    assert result.accuracy == 1.0 and result.scorer == "contains"
    assert "Ada wrote it." in backend.requests[0].messages[0].text


def test_direct_solver_records_native_tool_calls_as_act_steps() -> None:
    from whetstone.engine.evaluation.benchmarks import load_tasks

    tasks = load_tasks("bfcl-simple:1:2")
    backend = ScriptedBackend([{"text": "", "tool_calls": [
        {"name": "math_factorial", "arguments": {"number": 5}}]}], tool_calls=True)
    result = evaluate(tasks, direct_solver(backend))
    assert result.accuracy == 1.0 and result.scorer == "bfcl"
    assert backend.requests[0].tools[0]["function"]["name"] == "math_factorial"


def test_eval_result_summary_is_json_safe() -> None:
    r = EvalResult(task_set="s", scorer="exact", results=())
    assert json.loads(json.dumps(r.to_dict()))["summary"]["n"] == 0


def test_each_task_is_scored_by_its_own_scorer_unless_one_is_given() -> None:
    tasks = [TaskRecord(id="n", question="2+2?", expected="4", scorer="numeric"),
             TaskRecord(id="c", question="Capital?", expected="Paris", scorer="contains")]
    answers = {"2+2?": "It is 4 apples.", "Capital?": "It is Paris."}
    solver = direct_solver(ScriptedBackend(responder=lambda r: answers[r.messages[-1].text]))
    mixed = evaluate(tasks, solver)
    assert mixed.scores == {"n": 1.0, "c": 1.0} and mixed.scorer == "contains+numeric"
    forced = evaluate(tasks, solver, "exact")
    assert forced.scores == {"n": 0.0, "c": 0.0} and forced.scorer == "exact"
