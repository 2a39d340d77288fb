"""``whetstone eval`` through click's CliRunner with a scripted solver factory injected."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.commands.eval import eval_cmd
from whetstone.engine.evaluation.direct import direct_solver
from whetstone.engine.evaluation.results import load_results
from whetstone.engine.evaluation.runner import Solver
from whetstone.engine.evaluation.tasks import read_jsonl
from whetstone.engine.types import Request
from whetstone.library_store.traces import TraceStore

REPO = Path(__file__).resolve().parent.parent
ARITH = Path(__file__).parent / "fixtures" / "tasks" / "arith.jsonl"
QUALITY = {"v1": set(range(10)), "v2": set(range(14)) - {2}, None: set(range(20))}


def factory(model: str, library: Path, version: str | None) -> Solver:
    """Builds a scripted 'agent' whose quality depends on the library version."""
    tasks = read_jsonl(ARITH)
    by_question = {t.question: (i, t) for i, t in enumerate(tasks)}

    def respond(req: Request) -> str:
        i, t = by_question[req.messages[-1].text]
        return f"The answer is {int(t.expected) + (0 if i in QUALITY[version] else 1)}."

    return direct_solver(ScriptedBackend(responder=respond), model=model,
                         library_version=version or "current")


def invoke(*args: str, obj: Any = None) -> Any:
    runner = CliRunner()
    return runner.invoke(eval_cmd, list(args), obj={"solver_factory": factory} if obj is None
                         else obj, catch_exceptions=False)


def test_eval_prints_accuracy_interval_tokens_and_latency(whetstone_home: Path) -> None:
    res = invoke("--tasks", str(ARITH), "--model", "scripted:", "--version", "v1")
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "accuracy 0.500" in out and "95% CI [0.299, 0.701] (Wilson)" in out
    assert "(10/20)" in out and "tokens/task" in out and "latency/task" in out
    (saved,), _ = load_results(whetstone_home / "evals")
    assert saved.library_version == "v1" and saved.n == 20 and saved.model == "scripted:"
    # Traces went to the library's trace store, scored.
    traces = TraceStore(whetstone_home / "library" / "traces").query()
    assert len(traces) == 20 and {t.score for t in traces} == {0.0, 1.0}


def test_eval_json_output_and_options(whetstone_home: Path, tmp_path: Path) -> None:
    res = invoke("--tasks", f"{ARITH}:0:10", "--limit", "4", "--seed", "3", "--concurrency", "2",
                 "--scorer", "contains", "--library", str(tmp_path / "lib"), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    (r,) = data["results"]
    assert r["summary"]["n"] == 4 and r["seed"] == 3 and r["scorer"] == "contains"
    assert r["meta"]["concurrency"] == 2
    assert len(TraceStore(tmp_path / "lib" / "traces").query()) == 4


def test_same_seed_gives_the_same_scores(whetstone_home: Path) -> None:
    a = json.loads(invoke("--tasks", str(ARITH), "--seed", "9", "--json").stdout)
    b = json.loads(invoke("--tasks", str(ARITH), "--seed", "9", "--json").stdout)
    sa = [(t["task_id"], t["score"], t["seed"]) for t in a["results"][0]["results"]]
    sb = [(t["task_id"], t["score"], t["seed"]) for t in b["results"][0]["results"]]
    assert sa == sb


def test_compare_prints_the_paired_difference_ci_and_mcnemar(whetstone_home: Path) -> None:
    res = invoke("--tasks", str(ARITH), "--compare", "v1", "v2")
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "v2 - v1 on 20 paired tasks: difference +0.150" in out
    assert "McNemar p = 0.375" in out and "wins 4  losses 1  ties 15" in out
    assert len(load_results(whetstone_home / "evals")[0]) == 2
    data = json.loads(invoke("--tasks", str(ARITH), "--compare", "v1", "v2", "--json").stdout)
    assert data["comparison"]["difference"] == pytest.approx(0.15)
    assert data["comparison"]["mcnemar_p"] == pytest.approx(0.375)


def test_a_broken_task_line_is_reported_and_the_run_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = ARITH.read_text().splitlines()
    path.write_text("\n".join(lines[:2] + ['{"id": "oops", "question": '] + lines[2:5]) + "\n")
    res = invoke("--tasks", str(path))
    assert res.exit_code == 0
    assert f"{path}:3: not valid JSON" in res.stderr
    assert "(5/5)" in res.stdout


@pytest.mark.parametrize("args, obj, code, fragment", [
    ([], None, 2, "no task set given"),
    (["--tasks", "mmlu"], None, 7, "unknown task set 'mmlu'"),
    (["--tasks", "gsm8k@dev:5:5"], None, 7, "selects no task"),
    (["--tasks", str(ARITH), "--scorer", "bleu"], None, 7, "unknown scorer"),
    (["--tasks", str(ARITH), "--version", "v1", "--compare", "v1", "v2"], None, 2,
     "cannot be combined"),
    # Without an injected factory the agent comes from whetstone.engine.api; a bad --methods fails
    # before any model loads.
    (["--tasks", str(ARITH), "--methods", "nope"], {}, 2, "unknown runtime method 'nope'"),
    (["--tasks", str(ARITH), "--methods", "skills", "--method-config", "skills.k=many"], {}, 2,
     "skills.k='many'"),
])
def test_errors_have_messages_hints_and_exit_codes(args: list[str], obj: Any, code: int,
                                                   fragment: str) -> None:
    res = invoke(*args, obj=obj)
    assert res.exit_code == code and fragment in res.stderr and "hint:" in res.stderr


def test_every_task_failing_is_an_error(whetstone_home: Path) -> None:
    def broken_factory(model: str, library: Path, version: str | None) -> Solver:
        def solve(task, seed):  # type: ignore[no-untyped-def]
            raise RuntimeError("model crashed")
        return solve

    res = invoke("--tasks", str(ARITH), obj={"solver_factory": broken_factory})
    assert res.exit_code == 7 and "every task failed (20)" in res.stderr


def test_report_subcommand_writes_html(whetstone_home: Path, tmp_path: Path) -> None:
    invoke("--tasks", str(ARITH), "--compare", "v1", "v2")
    out = tmp_path / "r.html"
    res = invoke("report", "--out", str(out))
    assert res.exit_code == 0 and "2 runs" in res.stdout
    page = out.read_text()
    assert page.count('<img id="plot-') == 3
    # With no results the page says so.
    empty = invoke("report", "--out", str(tmp_path / "e.html"), "--evals", str(tmp_path / "n"))
    assert empty.exit_code == 0 and "No evaluation results yet" in (tmp_path / "e.html").read_text()


_SIGINT_SCRIPT = """
import sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from whetstone.engine.commands.eval import eval_cmd
from whetstone.engine.evaluation.direct import direct_solver
from whetstone.engine.backends.scripted import ScriptedBackend

marker = Path({marker!r})

def factory(model, library, version):
    inner = direct_solver(ScriptedBackend(responder=lambda r: "#### 0"))
    def solve(task, seed):
        time.sleep(0.3)
        result = inner(task, seed)
        with open(marker, "a") as f:  # after solving: a listed task has its result
            f.write(task.id + "\\n")
        return result
    return solve

eval_cmd.main(["--tasks", {tasks!r}], obj={{"solver_factory": factory}})
"""


@pytest.mark.integration
def test_ctrl_c_exits_130_and_saves_the_tasks_scored_so_far(whetstone_home: Path,
                                                            tmp_path: Path) -> None:
    marker = tmp_path / "done.txt"
    script = _SIGINT_SCRIPT.format(repo=str(REPO), marker=str(marker), tasks=str(ARITH))
    env = {**os.environ, "WHETSTONE_HOME": str(whetstone_home)}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and (not marker.exists() or
                                      len(marker.read_text().split()) < 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted; the tasks scored so far are saved" in err
    assert "partial:" in out
    (saved,), _ = load_results(whetstone_home / "evals")
    # Every task solved before the signal is saved; on a busy machine the last one solved may
    # still be on its way to the results when the signal lands.
    solved = len(marker.read_text().split())
    assert saved.partial and solved - 1 <= saved.n < 20 and saved.n >= 2
    assert saved.n_planned == 20


def test_concurrency_auto_follows_the_backend_and_rejects_nonsense() -> None:
    from whetstone.engine.commands.common import Concurrency
    from whetstone.engine.evaluation.runner import solver_concurrency, with_concurrency

    conv = Concurrency()
    assert conv.convert("auto", None, None) is None and conv.convert("3", None, None) == 3
    for bad in ("0", "many"):
        with pytest.raises(click.BadParameter, match="auto"):
            conv.convert(bad, None, None)
    assert solver_concurrency(lambda t, s: None) == 1  # type: ignore[arg-type,return-value]
    assert solver_concurrency(with_concurrency(lambda t, s: None, 8)) == 8  # type: ignore


def test_help_names_every_kind_of_task_set() -> None:
    """Issue 37 item 9: ``eval --help`` listed the packaged sets and .jsonl files, not
    ``bigbench:<task>``; an unknown set's hint did not name it either."""
    from whetstone.engine.errors import EvalError
    from whetstone.engine.evaluation.benchmarks import load_tasks

    res = CliRunner().invoke(eval_cmd, ["--help"], terminal_width=200)
    assert res.exit_code == 0
    assert "bigbench:<task>" in res.output and "whetstone data fetch bigbench" in res.output
    with pytest.raises(EvalError) as info:
        load_tasks("gsm9k")
    assert "bigbench:<task>" in (info.value.hint or "")
