"""``whetstone eval``: score a library version on a task set, compare two, write the report.

The agent comes from ``whetstone.engine.api.solver_factory``: ``factory(model_spec, library_path,
version) -> solver`` where a solver is ``(task, seed) -> Trace`` (see
``whetstone.engine.evaluation.runner``). Tests inject a scripted one as ``obj={"solver_factory": ...}``,
and the progress bar's clock as ``obj={"clock": ...}``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from ...library_store.store import Library
from ...library_store.traces import TraceStore
from ..errors import ConfigError, EvalError
from ..evaluation.benchmarks import BENCHMARKS, load_tasks
from ..evaluation.bigbench import EXAMPLE_TASK
from ..evaluation.compare import Comparison, compare
from ..evaluation.gate import check_no_errors
from ..evaluation.report import write_report
from ..evaluation.results import (
    EvalResult,
    TaskResult,
    default_evals_dir,
    load_results,
)
from ..evaluation.runner import Solver, evaluate, solver_concurrency
from ..evaluation.scorers import USER_SCORER_HELP
from ..evaluation.tasks import TaskSet
from .common import (
    EXIT_INTERRUPTED,
    EXIT_PARTIAL,
    MethodGroup,
    check_before_loading,
    concurrency_option,
    console,
    default_library_path,
    emit_json,
    executor_options,
    fail,
    handle_errors,
    json_option,
    library_option,
    methods_option,
    model_option,
    otel_options,
    parse_methods,
    solver_option,
)
from .progress import EtaColumn, RateColumn
from .tool_options import tool_options

SolverFactory = Callable[[str, Path, "str | None"], Solver]


def _factory(ctx: click.Context, methods: str, method_config: tuple[str, ...], solver: str,
             tools: list[Any] | None = None) -> SolverFactory:
    """The injected factory (tests), else ``whetstone.engine.api``'s: the agent loop with
    ``--methods`` and ``--tools``/``--mcp`` (its MCP servers stop when the command ends), or
    one direct call (``--solver direct``)."""
    obj = ctx.obj if isinstance(ctx.obj, dict) else {}
    factory = obj.get("solver_factory")
    if factory is not None:
        return factory
    # lazy: numpy and 33 more of our modules; `whetstone --help` imports every command module
    from ..api import solver_factory

    chosen = parse_methods(methods, method_config)
    made = (solver_factory(methods=chosen, solver=solver, tools=tools) if tools is not None
            else solver_factory(methods=chosen, solver=solver))
    ctx.call_on_close(made.close)  # type: ignore[attr-defined]
    return made


def _ray_factory(ctx: click.Context, address: str | None, workers: int | None, methods: str,
                 method_config: tuple[str, ...], solver: str,
                 tools: list[Any] | None) -> SolverFactory:
    """``--executor ray``: the tasks run on the cluster's workers (``engine/scale.py``);
    they stop, and a Ray started here shuts down, when the command ends."""
    # lazy: ray, the scale extra
    from ..scale import RayExecutor

    with console(stderr=True).status("connecting to Ray …"):
        cluster = RayExecutor(address, workers=workers)
    ctx.call_on_close(cluster.close)
    chosen = parse_methods(methods, method_config)
    if tools is None:
        return cluster.eval_factory(methods=chosen, solver=solver)
    return cluster.eval_factory(methods=chosen, solver=solver, tools=tools)


def _run(tasks: TaskSet, solver: Solver, *, label: str, scorer: str | None,
         concurrency: int | None,
         seed: int, store: TraceStore, model: str, version: str | None,
         quiet: bool, run_meta: dict[str, Any],
         clock: Callable[[], float] | None = None) -> EvalResult:
    """One evaluation with a progress bar (ETA, tasks/min and running accuracy) on stderr.
    ``concurrency`` None is ``-j auto``: the solver's backend says how many it decodes at once.
    ``clock``: the bar's time source (default: the console's monotonic clock)."""
    err = console(stderr=True)
    concurrency = solver_concurrency(solver, concurrency)
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("acc {task.fields[acc]}"), RateColumn(),
               TimeElapsedColumn(), TextColumn("eta"), EtaColumn()]
    with Progress(*columns, console=err, disable=quiet, transient=False,
                  get_time=clock) as progress:
        bar = progress.add_task(f"{label} -j {concurrency}", total=len(tasks), acc="-")
        total, scored, failed = [0.0], [0], [0]

        def on_progress(done: int, n: int, r: TaskResult) -> None:
            if r.scored:
                total[0] += r.score
                scored[0] += 1
            else:
                failed[0] += 1
            acc = f"{total[0] / scored[0]:.3f}" if scored[0] else "-"
            progress.update(bar, completed=done,
                            acc=acc + (f" ({failed[0]} failed)" if failed[0] else ""))

        return evaluate(tasks, solver, scorer, concurrency=concurrency, seed=seed,
                        on_progress=on_progress, store=store, model=model,
                        library_version=version, label=version,
                        results_dir=default_evals_dir(), run_meta=run_meta)


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def _print_result(r: EvalResult) -> None:
    out = console()
    out.soft_wrap = True  # long paths and numbers stay on one line for people and grep
    ci = r.interval()
    method = "Wilson" if ci.method == "wilson" else "bootstrap"
    out.print(f"[bold]{r.task_set}[/]  model {r.model or '?'}  library "
              f"{r.library_version or 'current'}  seed {r.seed}  scorer {r.scorer}")
    errors = f"  errors [bold red]{r.n_errors}[/]" if r.n_errors else "  errors 0"
    if r.aborted:
        out.print(f"accuracy -  (no task scored){errors}")
    else:
        correct = f"  ({sum(t.score for t in r.scored):g}/{r.n_scored})" \
            if ci.method == "wilson" else ""
        out.print(f"accuracy [bold]{ci.mean:.3f}[/]  95% CI [{ci.low:.3f}, {ci.high:.3f}] "
                  f"({method}){correct}{errors}")
    wall = (r.ended or r.started) - r.started
    out.print(f"tokens/task {r.mean_tokens:.0f}  latency/task {_fmt_s(r.mean_latency_s)}  "
              f"wall {_fmt_s(wall)}")
    if r.partial:
        out.print(f"[yellow]partial: {r.n} of {r.n_planned} tasks run before the stop[/]")
    if r.n_errors:
        out.print(f"[yellow]{escape(r.errors_line())}; they are left out of the accuracy[/]")
    if r.n_length:
        out.print(f"[yellow]{r.n_length} answer(s) cut at the length limit (outcome length); "
                  "scored as written[/]")
    for warning in r.meta.get("warnings", ()):
        out.print(f"[yellow]warning: {escape(warning)}[/]")
    if "saved_to" in r.meta:
        out.print(f"saved {r.meta['saved_to']}")


def _print_comparison(c: Comparison) -> None:
    out = console()
    out.soft_wrap = True
    p = "n/a (scores not 0/1)" if c.p_value is None else f"{c.p_value:.4g}"
    out.print(f"[bold]{c.b_name} - {c.a_name}[/] on {c.n} paired tasks: difference "
              f"[bold]{c.difference:+.3f}[/]  {c.confidence:.0%} CI [{c.ci_low:+.3f}, "
              f"{c.ci_high:+.3f}] (paired bootstrap)  McNemar p = {p}")
    out.print(f"wins {len(c.wins)}  losses {len(c.losses)}  ties {c.ties}")
    if c.left_out:
        out.print(f"[yellow]{c.left_out} task(s) left out of the pairing (failed in "
                  f"{c.a_name}: {len(c.failed_in_a)}, in {c.b_name}: {len(c.failed_in_b)}; "
                  f"not run in both: {len(c.only_in_a) + len(c.only_in_b)})[/]")


def _finish(results: list[EvalResult]) -> None:
    """Exit with what happened: 130 interrupted, 7 every task failed, 11 (``EXIT_PARTIAL``)
    some tasks failed (the run is saved; the failed ones are listed), else 0."""
    if any(r.partial for r in results):
        err = console(stderr=True)
        err.print("[yellow]interrupted; the tasks scored so far are saved[/]")
        if any(r.meta.get("concurrency", 1) > 1 for r in results):
            # Worker threads cannot be killed; Python waits for the running tasks at exit.
            err.print("[yellow]tasks already running finish first; Ctrl-C again to quit now[/]")
        raise SystemExit(EXIT_INTERRUPTED)
    for r in results:
        if r.n and r.n_errors == r.n:
            first = r.failed[0]
            fail(EvalError(f"every task failed ({r.n}); first: {first.task_id}: {first.error}",
                           hint="check the model and library with `whetstone run` first"))
    if any(r.n_errors for r in results):
        console(stderr=True).print(
            "[yellow]some tasks failed (listed above; each saved with its error): exit "
            f"{EXIT_PARTIAL}[/]", soft_wrap=True)
        raise SystemExit(EXIT_PARTIAL)


_SCORER_EPILOG = """\b
User scorers (--scorer FILE.py:FUNCTION):
""" + USER_SCORER_HELP + """

\b
Example, a HumanEval-style code task scored by running its tests
(scorer.py; the task's metadata holds its tests and entry point):
  import re, subprocess, sys, tempfile
  def passes(answer, task):  # runs model-written code: use a throwaway container
      m = re.search(r"`{3}(?:python)?\\n(.*?)`{3}", answer, re.S)
      code = m.group(1) if m else answer
      test = task.metadata["test"] + f"\\ncheck({task.metadata['entry_point']})\\n"
      with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
          f.write(code + "\\n" + test)
      run = subprocess.run([sys.executable, f.name], capture_output=True, timeout=10)
      return 1.0 if run.returncode == 0 else 0.0
  whetstone eval --tasks humaneval.jsonl --scorer scorer.py:passes
"""


@click.group("eval", cls=MethodGroup, invoke_without_command=True, epilog=_SCORER_EPILOG)
@click.option("--tasks", "-t", "tasks_spec", metavar="SET",
              help="Task set: " + ", ".join(BENCHMARKS) + "; bigbench:<task> (any BIG-bench "
                   f"task folder, e.g. bigbench:{EXAMPLE_TASK}; `whetstone data "
                   "fetch bigbench` first); or a .jsonl file. SET@train|dev|test picks a "
                   "split, SET:START:END a slice.")
@model_option
@library_option
@click.option("--version", "version", default=None, help="Library version (default: current).")
@concurrency_option
@click.option("--seed", type=int, default=0, show_default=True, help="Run seed.")
@click.option("--scorer", default=None,
              help="exact, normalised, numeric[:TOL], contains, value[:TOL], f1, bfcl, or a "
                   "user scorer "
                   "FILE.py:FUNCTION / module:FUNCTION called as FUNCTION(answer, task) with "
                   "the answer text (see below; default: the set's own).")
@click.option("--trust-task-scorers", is_flag=True,
              help="Let a task file's own `scorer` fields name code (FILE.py:FUNCTION / "
                   "module:FUNCTION), imported and run in this process with your rights. "
                   "Without it a task file may name only built-in scorers.")
@click.option("--limit", type=click.IntRange(min=0), default=None, help="First N tasks only.")
@click.option("--compare", "compare_versions", nargs=2, default=None, metavar="V1 V2",
              help="Run two library versions on the same tasks and compare them.")
@click.option("--allow-errors", is_flag=True,
              help="Let --compare decide on runs where tasks failed (solver or scorer "
                   "errors), pairing only the tasks scored in both; without it such a "
                   "comparison is refused.")
@solver_option
@executor_options
@methods_option
@json_option
@click.pass_context
@handle_errors
@tool_options()
@otel_options
def eval_cmd(ctx: click.Context, tasks_spec: str | None, model: str, library_path: Path | None,
             version: str | None, concurrency: int | None, seed: int, scorer: str | None,
             trust_task_scorers: bool, limit: int | None, compare_versions: tuple[str, str] | None, allow_errors: bool,
             solver: str, executor: str, ray_address: str | None, methods: str,
             method_config: tuple[str, ...], as_json: bool, agent_tools: list[Any],
             otel: Any) -> None:
    """Score the agent on a task set: accuracy with a 95% CI, tokens and latency per task.

    A task whose solver or scorer raises, or whose run failed (a model call that could not
    be made), is recorded with its error and left out of the accuracy; the run goes on, is
    saved, and exits 11 to say tasks failed (7 when every task did: no accuracy)."""
    if ctx.invoked_subcommand is not None:
        return
    if not tasks_spec:
        raise ConfigError("no task set given", hint="e.g. whetstone eval --tasks gsm8k:0:30")
    if compare_versions and version:
        raise ConfigError("--version and --compare cannot be combined",
                          hint="--compare V1 V2 names both versions")
    check_before_loading(specs=(model,), scorer=scorer)
    factory = _ray_factory(ctx, ray_address, concurrency, methods, method_config, solver,
                           agent_tools) if executor == "ray" else \
        _factory(ctx, methods, method_config, solver, agent_tools)
    # With --scorer the tasks' own scorer names are never resolved, so none of them can run.
    tasks = load_tasks(tasks_spec, limit=limit,
                       trust_scorers=trust_task_scorers or scorer is not None)
    err = console(stderr=True)
    for problem in tasks.problems:
        err.print(f"[yellow]warning:[/] {escape(str(problem))}", soft_wrap=True)
    if not len(tasks):
        raise EvalError(f"task set {tasks_spec!r} selects no task",
                        hint="check the split and slice bounds")
    library = library_path or default_library_path()
    lib = Library(library)
    store = lib.traces  # bounded as its library.json says, as every writer is
    # lazy: `whetstone --help` imports every command module
    from ...library_store.otel_export import otel_sinks

    for sink in otel_sinks(otel):  # each scored task as spans (issue 39); flushed at the end
        store.sinks.append(sink)
        ctx.call_on_close(sink.close)
    common: dict[str, Any] = {"scorer": scorer, "concurrency": concurrency, "seed": seed,
                              "store": store, "model": model, "quiet": as_json,
                              "run_meta": {"solver": solver, "methods": methods,
                                           **({"executor": "ray"} if executor == "ray"
                                              else {})},
                              "clock": ctx.obj.get("clock") if isinstance(ctx.obj, dict)
                              else None}
    versions = list(compare_versions) if compare_versions else [version]
    for v in versions:  # a mistyped version is found before the model loads
        if v and not v.startswith("candidate:") and lib.is_initialized():
            lib.resolve(v)
    results: list[EvalResult] = []
    for v in versions:
        solve = factory(model, library, v)
        label = f"{tasks_spec} [{v}]" if v else tasks_spec
        results.append(_run(tasks, solve, label=label, version=v, **common))
        if results[-1].partial:
            break
    paired = len(results) == 2 and not any(r.partial for r in results)
    refused: EvalError | None = None
    if paired and not allow_errors:
        try:
            check_no_errors([(str(v), r) for v, r in zip(versions, results, strict=False)],
                            what="the comparison")
        except EvalError as exc:  # reported after the runs are printed: they are saved
            refused, paired = exc, False
    comparison = compare(*results) if paired else None
    if as_json:
        payload: dict[str, Any] = {"results": [r.to_dict() for r in results]}
        if comparison is not None:
            payload["comparison"] = comparison.to_dict()
        emit_json(payload)
    else:
        for r in results:
            _print_result(r)
        if comparison is not None:
            _print_comparison(comparison)
    if refused is not None:
        fail(refused)
    _finish(results)


@eval_cmd.command("report")
@click.option("--out", "out", type=click.Path(path_type=Path), default=None,
              help="HTML file to write (default: $WHETSTONE_HOME/evals/report.html).")
@click.option("--evals", "evals_dir", type=click.Path(path_type=Path), default=None,
              help="Folder of saved results (default: $WHETSTONE_HOME/evals).")
@handle_errors
def report_cmd(out: Path | None, evals_dir: Path | None) -> None:
    """Write a self-contained HTML report of the saved results, with plots."""
    folder = evals_dir or default_evals_dir()
    results, problems = load_results(folder)
    err = console(stderr=True)
    for p in problems:
        err.print(f"[yellow]warning:[/] {escape(str(p))}", soft_wrap=True)
    if not results:
        err.print(f"[yellow]no results in {folder} yet; the report says so[/]")
    path = write_report(results, out or folder / "report.html")
    console().print(f"wrote {path} ({len(results)} runs)", soft_wrap=True)
