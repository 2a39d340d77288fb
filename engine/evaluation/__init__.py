"""Evaluation: task sets, scorers, runs, paired comparison and the regression gate.

    tasks = load_tasks("gsm8k@dev:0:30")
    result = evaluate(tasks, solver, concurrency=2, seed=0, store=trace_store)
    decision = gate(candidate_result, current_result)          # or run_gate(tasks, a, b)
    decision.to_dict()                                         # goes into the version manifest

A solver is ``(task, seed) -> Trace``; the CLI/API build one around the agent runtime.
"""

from .benchmarks import BENCHMARKS, load_benchmark, load_tasks
from .compare import Comparison, compare
from .direct import direct_solver
from .gate import (
    DEFAULT_RULE,
    Decision,
    decide_again,
    gate,
    parse_rule,
    run_gate,
)
from .report import render_report, write_report
from .results import (
    EvalResult,
    TaskResult,
    default_evals_dir,
    load_result,
    load_results,
)
from .runner import Solver, evaluate, task_seed
from .scorers import BUILTIN as SCORERS
from .scorers import get_scorer, tool_calls_of
from .stats import mcnemar_exact, paired_bootstrap, wilson_interval
from .tasks import (
    TaskRecord,
    TaskSet,
    read_jsonl,
    split_of,
    tasks_from_traces,
    write_jsonl,
)

__all__ = [
    "BENCHMARKS",
    "DEFAULT_RULE",
    "SCORERS",
    "Comparison",
    "Decision",
    "EvalResult",
    "Solver",
    "TaskRecord",
    "TaskResult",
    "TaskSet",
    "compare",
    "decide_again",
    "default_evals_dir",
    "direct_solver",
    "evaluate",
    "gate",
    "get_scorer",
    "load_benchmark",
    "load_result",
    "load_results",
    "load_tasks",
    "mcnemar_exact",
    "paired_bootstrap",
    "parse_rule",
    "read_jsonl",
    "render_report",
    "run_gate",
    "split_of",
    "task_seed",
    "tasks_from_traces",
    "tool_calls_of",
    "wilson_interval",
    "write_jsonl",
    "write_report",
]
