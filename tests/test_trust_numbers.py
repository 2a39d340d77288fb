"""Issue 45 item 4, numbers that are true, each through the command line as a user runs it:
the progress bar's tasks/min, the ``length`` outcome, an evolver's summary, ``whetstone
models`` and ``eval report``."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner
from test_eval_cli import ARITH, factory

from whetstone.cli import cli
from whetstone.engine.evaluation.runner import Solver
from whetstone.engine.evaluation.tasks import TaskRecord
from whetstone.engine.types import Trace


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
