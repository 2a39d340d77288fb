"""Issue 29, findings 1 and 2: a task file must not choose code, and a learned tool must not
pass the admission check with a module reached through an attribute, nor hang the host with
what it leaves in ``out/``.

Finding 1: a task's own ``"scorer": "helper.py:score"`` was imported (and its top level run)
by ``whetstone eval`` before any task, in the whetstone process. Finding 2: ``typing.sys``,
``random._os``, ``json.decoder.re.sys``, ``np.ctypeslib``, ``np.load(allow_pickle=True)``
passed ``tools/validate.py``; a FIFO in ``out/`` hung ``whetstone tools test`` forever and left
its temp folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cli
from engine.errors import EvalError
from engine.evaluation.benchmarks import load_tasks
from engine.evaluation.scorers import is_user_scorer

# --- finding 1: a task file's scorer field -------------------------------------------------


def _pwn_files(tmp_path: Path, scorer: str) -> tuple[Path, Path, Path]:
    """The issue's reproduction: a scorer module whose import writes a marker file, a task
    file naming it, and a scripted reply."""
    marker = tmp_path / "PWN"
    helper = tmp_path / "helper.py"
    helper.write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                      "def score(answer, task):\n    return 1.0\n")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t0", "question": "1+1?", "expected": "2"}) + "\n"
                     + json.dumps({"id": "t1", "question": "2+2?", "expected": "4",
                                   "scorer": scorer.replace("HELPER", str(helper))}) + "\n")
    replies = tmp_path / "r.json"
    replies.write_text(json.dumps(["Final answer: 2", "Final answer: 4"]))
    return marker, tasks, replies


@pytest.mark.parametrize("scorer", ["HELPER:score", "importlib:import_module"])
def test_task_file_scorer_is_not_imported(whetstone_home: Path, tmp_path: Path,
                                          scorer: str) -> None:
    marker, tasks, replies = _pwn_files(tmp_path, scorer)
    res = CliRunner().invoke(cli, ["eval", "--tasks", str(tasks), "--model",
                                    f"scripted:{replies}", "-j", "1"])
    assert res.exit_code == EvalError.exit_code, res.output
    assert not marker.exists()
    assert f"{tasks}:2" in res.output and "built-in scorer" in res.output
    assert "--trust-task-scorers" in res.output
    assert not (whetstone_home / "evals").exists()  # stopped before any task ran


def test_cli_scorer_and_the_opt_in_still_run_user_scorers(whetstone_home: Path,
                                                          tmp_path: Path) -> None:
    marker, tasks, replies = _pwn_files(tmp_path, "HELPER:score")
    helper = f"{tmp_path / 'helper.py'}:score"
    res = CliRunner().invoke(cli, ["eval", "--tasks", str(tasks), "--model",
                                    f"scripted:{replies}", "-j", "1", "--scorer", helper])
    assert res.exit_code == 0, res.output
    assert marker.read_text() == "ran" and "accuracy 1.000" in res.output
    marker.unlink()
    res = CliRunner().invoke(cli, ["eval", "--tasks", str(tasks), "--model",
                                    f"scripted:{replies}", "-j", "1", "--trust-task-scorers"])
    assert res.exit_code == 0, res.output
    assert marker.read_text() == "ran"


def test_python_loaders_apply_the_same_rule(tmp_path: Path) -> None:
    marker, tasks, _ = _pwn_files(tmp_path, "HELPER:score")
    with pytest.raises(EvalError, match=r"tasks.jsonl:2: task 't1' names the scorer"):
        load_tasks(str(tasks))
    with pytest.raises(EvalError, match="built-in scorer"):
        load_tasks(f"{tasks}@test")  # a split of the file is the same file
    assert not marker.exists()
    assert load_tasks(str(tasks), trust_scorers=True)[1].scorer.endswith("helper.py:score")


def test_builtin_scorer_names_stay_allowed(tmp_path: Path) -> None:
    lines = [{"id": f"t{i}", "question": "q", "expected": "1", "scorer": s}
             for i, s in enumerate(["exact", "normalized", "numeric:0.01", "NUMERIC", "f1",
                                    "bfcl", "choice", "number", "exact_text"])]
    path = tmp_path / "ok.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert len(load_tasks(str(path))) == len(lines)
    assert not any(is_user_scorer(x["scorer"]) for x in lines)
    assert all(is_user_scorer(s) for s in ["a:b", "x.py:f", "os:system", "numericx:1"])
