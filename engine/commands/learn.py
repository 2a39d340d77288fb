"""``whetstone learn``: the learner beside the ``serve`` replicas (docs/learning.md).

    whetstone learn --library LIB --model SPEC --method METHOD [--option KEY=VALUE]
        [--every 50] [--share 0.1] [--min-scored 100] [--margin 0.05] [--scorer value]
        [--mcp-config servers.json ...] [--once]

A process of its own: it watches the library's trace store, evolves every ``--every`` new
scored traces, serves an accepted change as a canary and promotes or rolls it back on live
feedback (``engine/evolution/learner.py``). Killed, it leaves serving as it was.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from ..errors import EXIT_INTERRUPTED, ConfigError, LibraryError
from ..evaluation.gate_rules import DEFAULT_RULE
from .common import (
    check_before_loading,
    concurrency_option,
    console,
    handle_errors,
    library_option,
    model_option,
    otel_options,
    scorer_option,
    solver_option,
)
from .tool_options import tool_options


def _method_options(method: str, given: tuple[str, ...]) -> dict[str, Any]:
    """``--option KEY=VALUE`` typed by the evolver's config (``max-examples`` and
    ``max_examples`` alike); ``ConfigError`` naming what is wrong."""
    # lazy: `whetstone --help` imports every command module
    from ..methods.base import options_from_text
    from ..methods.registry import default_registry

    registry = default_registry()
    if method not in registry.names("evolver"):
        raise ConfigError(f"no evolver named {method!r}",
                          hint="evolvers: " + ", ".join(registry.names("evolver")))
    raw: dict[str, str] = {}
    for item in given:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"cannot read --option {item!r}",
                              hint=f"write KEY=VALUE, as `whetstone evolve {method} --KEY "
                                   "VALUE` takes it, e.g. --option max-examples=100")
        raw[key.strip().lstrip("-").replace("-", "_")] = value
    cls = registry.entry("evolver", method).load()
    return options_from_text(cls.config_class, raw, method=method)


def _lower_priority(nice: int, idle: bool) -> None:
    """Let replicas on the same cores answer first: ``nice`` lowers the learner's priority,
    ``idle`` puts it in SCHED_IDLE (it runs only when a core has nothing else to do), where
    the system has it."""
    if nice and hasattr(os, "nice"):
        os.nice(nice)
    if idle and hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError as exc:  # a container may forbid it: the nice value still applies
            _say(f"could not run in the idle class ({exc.strerror}); running at nice {nice}")


def _say(text: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    console(stderr=True).print(f"[{stamp}] {text}", markup=False, soft_wrap=True,
                               highlight=False)


@click.command("learn")
@click.option("--method", required=True,
              help="The evolver that makes each candidate (`whetstone methods` lists them).")
@click.option("--option", "method_options", multiple=True, metavar="KEY=VALUE",
              help="An option of the method, as `whetstone evolve METHOD --KEY VALUE` takes "
                   "it. Repeatable.")
@click.option("--every", type=click.IntRange(min=1), default=50, show_default=True,
              help="Evolve after this many new scored traces (feedback scores or labels).")
@click.option("--share", type=click.FloatRange(min=0, max=0.5, min_open=True), default=0.10,
              show_default=True, help="Share of conversations an accepted change serves as a "
                                      "canary before it may become current.")
@click.option("--min-scored", type=click.IntRange(min=1), default=100, show_default=True,
              help="Promote only after this many (weighted) scored canary requests.")
@click.option("--margin", type=click.FloatRange(min=0, max=1, max_open=True), default=0.05,
              show_default=True, help="Promote when the canary is not worse than the "
                                      "current version by more than this (the interval's "
                                      "lower end).")
@click.option("--min-rollback", type=click.IntRange(min=1), default=20, show_default=True,
              help="Roll back once each arm has this many scored requests and the canary is "
                   "worse (the interval below 0).")
@click.option("--max-scored", type=click.IntRange(min=1), default=1000, show_default=True,
              help="End an undecided canary (expired) after this many scored requests.")
@click.option("--max-key-share", type=click.FloatRange(min=0, max=1, min_open=True),
              default=0.5, show_default=True,
              help="The largest share of an arm's feedback one key may carry.")
@click.option("--min-keys", type=click.IntRange(min=1), default=3, show_default=True,
              help="Decide only on feedback from at least this many keys, and only what "
                   "holds with each key's feedback left out (1: one trusted key decides).")
@click.option("--limit", type=click.IntRange(min=1), default=2000, show_default=True,
              help="Learn from at most the newest N scored traces.")
@click.option("--poll", "poll_s", type=click.FloatRange(min=0.05), default=5.0,
              show_default=True, help="Seconds between two looks at the trace store.")
@click.option("--lease-ttl", type=click.FloatRange(min=1), default=30.0, show_default=True,
              help="Seconds a learner's lease outlives its last heartbeat.")
@click.option("--nice", type=click.IntRange(min=0, max=19), default=10, show_default=True,
              help="Lower the learner's CPU priority by this much, so serving comes first.")
@click.option("--idle/--no-idle", default=True, show_default=True,
              help="Run the learner only on CPU time nothing else wants (Linux's SCHED_IDLE "
                   "class): replicas on the same cores are never kept waiting by it.")
@click.option("--once", is_flag=True,
              help="Take one step (evolve when enough scored traces came in, or judge the "
                   "canary) and exit.")
@model_option
@click.option("--analyst", default=None, help="Analyst model spec (default: the --model).")
@click.option("--gate-tasks", default=None, metavar="SET",
              help="Held-out tasks for the gate (default: the scored traces' dev split).")
@click.option("--gate-rule", default=DEFAULT_RULE, show_default=True,
              help="The gate's rule (docs/gate.md).")
@scorer_option
@click.option("--allow-errors", is_flag=True,
              help="Let the gate decide even when some of its tasks failed.")
@concurrency_option
@click.option("--seed", type=int, default=0, show_default=True)
@solver_option
@library_option
@handle_errors
@otel_options
@tool_options()
def learn(method: str, method_options: tuple[str, ...], every: int, share: float,
          min_scored: int, margin: float, min_rollback: int, max_scored: int,
          max_key_share: float, min_keys: int, limit: int, poll_s: float, lease_ttl: float,
          nice: int, idle: bool, once: bool, model: str, analyst: str | None, gate_tasks: str | None,
          gate_rule: str, scorer: str | None, allow_errors: bool, concurrency: int | None,
          seed: int, solver: str, library_path: Path | None, otel: Any,
          agent_tools: list[Any]) -> None:
    """Learn from live feedback beside the `serve` replicas: evolve every N scored traces,
    serve an accepted change as a canary, promote it or roll it back on live feedback."""
    # lazy: the evolve path loads numpy, yaml and 40 more of our modules
    from ...library_store.learning import LEARNING_DIR
    from ...library_store.lease import FileLease
    from ..api import Engine
    from ..evaluation.benchmarks import load_tasks
    from ..evolution.canary import CanaryRules
    from ..evolution.learner import Learner, LearnerConfig

    options = _method_options(method, method_options)
    check_before_loading(specs=(model, analyst), task_sets=(gate_tasks,), rule=gate_rule)
    config = LearnerConfig(every=every, share=share, poll_s=poll_s, limit=limit,
                           rules=CanaryRules(min_scored=min_scored, margin=margin,
                                             max_key_share=max_key_share, min_keys=min_keys,
                                             min_rollback=min_rollback,
                                             max_scored=max(max_scored, min_scored)))
    _lower_priority(nice, idle)
    err = console(stderr=True)
    with err.status(f"loading {model} …"):
        engine = Engine(model, library=library_path, checkpointing=False, solver=solver,
                        tools=agent_tools, otel=otel)
    gate = load_tasks(gate_tasks) if gate_tasks else None

    def evolve(traces: Any) -> Any:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        return engine.evolve(method, traces=traces, analyst=analyst, gate_tasks=gate,
                             rule=gate_rule, seed=seed, concurrency=concurrency,
                             allow_errors=allow_errors, scorer=scorer, commit=False,
                             candidate_name=f"learn-{stamp}-{os.urandom(2).hex()}",
                             on_phase=_say, **options)

    lease = FileLease(engine.library.root / LEARNING_DIR, ttl_s=lease_ttl)
    learner = Learner(engine.library, lease, evolve, config, sinks=engine.library.trace_sinks,
                      say=_say)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        if once:
            _once(learner, lease)
        else:
            _say(f"learning with {method} on {engine.library.root}: every {every} scored "
                 f"traces, canary on {share:.0%} of conversations")
            learner.run(stop)
    except KeyboardInterrupt:
        stop.set()
        running = learner.state.canary()
        _say("stopped" + (f"; canary {running.id} keeps its share until a learner decides it "
                          "(`whetstone library canary stop` ends it now)" if running else ""))
        sys.exit(EXIT_INTERRUPTED)
    finally:
        lease.release()
        engine.close()


def _once(learner: Any, lease: Any) -> None:
    """One step under the lease (``--once``): refused when another learner holds it."""
    if not lease.acquire():
        who = (lease.current() or {}).get("holder", "another learner")
        raise LibraryError(f"another learner holds this library's lease ({who})",
                           hint="stop it first, or let it learn: one learner per library")
    did = learner.step()
    _say(f"one step: {did.replace('_', ' ')}")


__all__ = ["learn"]
