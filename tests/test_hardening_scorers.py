"""Issue 12, item 7: a user scorer written as ``whetstone eval --help`` says scores what it is
told it gets (the answer text), a run where every task scores 0 is flagged, and the trace is
there for a scorer that asks for it."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

from click.testing import CliRunner

from whetstone.engine.commands.eval import eval_cmd
from whetstone.engine.errors import EvalError
from whetstone.engine.evaluation.runner import Solver, evaluate
from whetstone.engine.evaluation.scorers import get_scorer
from whetstone.engine.evaluation.tasks import TaskRecord
from whetstone.engine.types import Step, Trace

# Ten HumanEval-style tasks: a function to write, and the tests that check it.
FUNCTIONS = {
    "double": ("x", "x * 2", [(2, 4), (5, 10)]),
    "square": ("x", "x * x", [(3, 9), (4, 16)]),
    "negate": ("x", "-x", [(1, -1), (-7, 7)]),
    "inc": ("x", "x + 1", [(0, 1), (9, 10)]),
    "halve": ("x", "x // 2", [(8, 4), (9, 4)]),
    "is_even": ("x", "x % 2 == 0", [(2, True), (3, False)]),
    "last_digit": ("x", "abs(x) % 10", [(123, 3), (-45, 5)]),
    "cube": ("x", "x ** 3", [(2, 8), (3, 27)]),
    "sign": ("x", "(x > 0) - (x < 0)", [(5, 1), (-2, -1)]),
    "twice_plus_one": ("x", "2 * x + 1", [(0, 1), (4, 9)]),
}
WRONG = "cube"  # the one answer that fails its tests


def write_tasks(path: Path) -> Path:
    with open(path, "w") as f:
        for name, (arg, _, cases) in FUNCTIONS.items():
            test = "def check(candidate):\n" + "".join(
                f"    assert candidate({a!r}) == {b!r}\n" for a, b in cases)
            f.write(json.dumps({
                "id": f"HumanEval/{name}", "question": f"def {name}({arg}):\n    ...",
                "expected": None, "scorer": "exact",
                "metadata": {"test": test, "entry_point": name}}) + "\n")
    return path


def answer_for(task: TaskRecord) -> str:
    name = task.metadata["entry_point"]
    arg, body, _ = FUNCTIONS[name]
    if name == WRONG:
        body = "x * 3"
    return f"Here is the function:\n```python\ndef {name}({arg}):\n    return {body}\n```\n"


def factory(model: str, library: Path, version: str | None) -> Solver:
    def solve(task: TaskRecord, seed: int) -> Trace:
        text = answer_for(task)
        return Trace(id=uuid.uuid4().hex, task=task.question, answer=text, outcome="answered",
                     model=model, steps=(Step(kind="think", module="think", output=text),))

    return solve


def scorer_from_help(path: Path) -> Path:
    """The worked example of ``whetstone eval --help``, written out as the user would."""
    help_text = CliRunner().invoke(eval_cmd, ["--help"]).output
    lines = help_text.split("Example, a HumanEval-style", 1)[1].splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("import "))
    code = []
    for ln in lines[start:]:
        if ln.strip().startswith("whetstone eval"):
            break
        code.append(ln[4:] if ln.startswith("    ") else ln.strip())
    path.write_text("\n".join(code) + "\n")
    return path


def test_a_scorer_written_from_the_help_scores_a_code_task_by_running_its_tests(
        tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "humaneval.jsonl")
    scorer = scorer_from_help(tmp_path / "scorer.py")
    assert re.search(r"def passes\(answer, task\)", scorer.read_text())
    res = CliRunner().invoke(eval_cmd, ["--tasks", str(tasks), "--model", "scripted:",
                                        "--scorer", f"{scorer}:passes", "--json"],
                             obj={"solver_factory": factory}, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    (result,) = json.loads(res.stdout)["results"]
    scores = {r["task_id"]: r["score"] for r in result["results"]}
    assert scores.pop(f"HumanEval/{WRONG}") == 0.0
    assert set(scores.values()) == {1.0}  # 9/10, as the same answers pass by hand
    assert "warnings" not in result["meta"]


def test_a_run_where_every_task_scores_zero_is_flagged(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "humaneval.jsonl")
    zero = tmp_path / "zero.py"
    zero.write_text("def never(answer, task):\n    return 0.0\n")
    res = CliRunner().invoke(eval_cmd, ["--tasks", str(tasks), "--model", "scripted:",
                                        "--scorer", f"{zero}:never"],
                             obj={"solver_factory": factory}, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "warning: scorer" in res.stdout and "gave 0 to all 10 tasks" in res.stdout
    assert "eval --help" in res.stdout


def test_a_scorer_that_asks_for_the_trace_gets_it(tmp_path: Path) -> None:
    module = tmp_path / "traced.py"
    log = tmp_path / "seen.txt"
    module.write_text("def score(answer, task, trace=None):\n"
                      f"    with open({str(log)!r}, 'a') as f:\n"
                      "        f.write(type(answer).__name__ + ' ' + type(trace).__name__ + "
                      "'\\n')\n"
                      "    return float('```python' in answer and trace.steps[0].kind == "
                      "'think')\n")
    tasks = [TaskRecord(id=f"HumanEval/{n}", question=n, metadata={"entry_point": n})
             for n in ("double", "square")]
    result = evaluate(tasks, factory("scripted:", tmp_path, None), f"{module}:score")
    assert [r.score for r in result.results] == [1.0, 1.0]
    assert log.read_text().splitlines() == ["str Trace", "str Trace"]


def test_a_scorer_with_the_wrong_signature_or_a_crash_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def one(answer):\n    return 1.0\n"
                   "def crash(answer, task):\n    raise KeyError('test')\n")
    try:
        get_scorer(f"{bad}:one")
    except EvalError as exc:
        assert "(answer, task)" in exc.message
    else:
        raise AssertionError("a one-argument scorer was accepted")
    tasks = [TaskRecord(id="t1", question="q", metadata={"entry_point": "double"})]
    # A crash is that task's error, reported with its type (issue 27: not the run's end).
    result = evaluate(tasks, factory("scripted:", tmp_path, None), f"{bad}:crash")
    (failed,) = result.failed
    assert failed.task_id == "t1" and failed.error_type == "KeyError"
    assert failed.error is not None and failed.error.startswith("KeyError: 'test' (in scorer")
