"""The contracts every method follows (see docs/architecture.md, "Methods").

An **evolver** learns from traces and returns a ``LibraryPatch``; it never writes the library.
It has a ``name``, a frozen ``config_class`` dataclass of its knobs (built from ``whetstone
evolve NAME`` options or ``Engine.evolve(NAME, **options)``), and::

    fit(traces, library, analyst, labels=None, *, context=None) -> LibraryPatch

``library`` is the library version it learns against (a ``Snapshot``, or its files as
``{path: text}``), ``analyst`` the model that reads the traces, ``labels`` expected answers by
trace id, and ``context`` (an ``EvolveContext``) what an evolver that must *run* the agent
needs: an agent over any library version, the labelled tasks, progress callbacks and a budget.
The caller (``whetstone.engine.evolution.pipeline``) gates the patch and commits it as a new
version, or keeps it as a named candidate.

A **runtime method** acts during a run: an ``whetstone.engine.runtime.Plugin`` (guidance, tools, nodes,
a per-task config, a model-call wrapper), registered by name like evolvers
(``whetstone.engine.methods.registry``).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from whetstone.engine.errors import ConfigError

if TYPE_CHECKING:
    from whetstone.engine.backends.base import Backend
    from whetstone.engine.evaluation.results import EvalResult
    from whetstone.engine.evaluation.runner import Solver
    from whetstone.engine.evaluation.tasks import TaskRecord, TaskSet
    from whetstone.engine.types import Trace
    from whetstone.library_store.store import Library, Snapshot
    from whetstone.library_store.traces import TraceStore
    from whetstone.tools.base import Tool

Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass(frozen=True)
class LibraryPatch:
    """``changes`` maps library-relative paths to new text (None deletes the file); a
    person's write (a rollback, an import) may carry a file's bytes."""

    method: str
    changes: Mapping[str, str | bytes | None]
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)
    costs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.changes

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "changes": dict(self.changes), "message": self.message,
                "details": dict(self.details), "costs": dict(self.costs)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LibraryPatch:
        return cls(d["method"], dict(d["changes"]), d.get("message", ""),
                   dict(d.get("details") or {}), dict(d.get("costs") or {}))


def library_texts(library: Snapshot | Mapping[str, str], prefix: str = "") -> dict[str, str]:
    """The text files under ``prefix`` as ``{library path: text}``, from a snapshot or from a
    mapping that already is one."""
    if isinstance(library, Mapping):
        return {p: t for p, t in library.items() if p.startswith(prefix)}
    return library.texts(prefix)


def _quiet(*_: Any) -> None:
    return None


def _no_tools() -> Sequence[Tool]:
    return ()


@dataclass
class EvolveContext:
    """What ``fit`` may use beyond traces and the analyst (all optional).

    ``make_solver(snapshot)`` is the agent over a library version (None: the current one);
    ``library`` lets an evolver preview a candidate (``library.preview(changes)``) and run the
    agent on it; ``tasks`` are the labelled tasks the evolve was asked to learn from;
    ``on_progress(phase, done, total)`` and ``on_phase(name)`` report progress;
    ``max_agent_runs`` caps the tasks ``run_agent`` may run (None: no cap);
    ``agent_tools()`` are the tools the agent runs with (built-in, the user's functions and
    MCP servers' tools), for an evolver that learns when to call given tools.
    """

    library: Library | None = None
    make_solver: Callable[[Snapshot | None], Solver] | None = None
    tasks: TaskSet | None = None
    store: TraceStore | None = None  # where the runs fit makes are stored (None: not stored)
    model: str = ""
    seed: int = 0
    concurrency: int = 1
    max_agent_runs: int | None = None
    on_progress: Progress = _quiet
    on_phase: Callable[[str], None] = _quiet
    agent_runs: int = 0  # tasks run so far through ``run_agent``
    agent_tools: Callable[[], Sequence[Tool]] = _no_tools

    def run_agent(self, tasks: Sequence[TaskRecord], *, snapshot: Snapshot | None = None,
                  phase: str = "rollouts", trace_meta: Mapping[str, Any] | None = None
                  ) -> EvalResult:
        """Run the agent on ``tasks`` over ``snapshot`` and score each run (Dynamo's
        attempts, NLPG's rollouts). Past ``max_agent_runs`` the rest are not run: the result
        then holds fewer tasks than asked for. Runs over a snapshot (a preview that may never
        be committed) are marked ``meta["evolve_preview"]`` and never become training
        traces; runs over the current version do."""
        # lazy: loads filelock and 54 more of our modules
        from whetstone.engine.evaluation.runner import evaluate

        if self.make_solver is None:
            raise ConfigError("this evolve cannot run the agent (no solver was given)",
                              hint="call it through Engine.evolve or `whetstone evolve`")
        chosen = list(tasks)
        if self.max_agent_runs is not None:
            chosen = chosen[:max(0, self.max_agent_runs - self.agent_runs)]
        self.agent_runs += len(chosen)
        return evaluate(chosen, self.make_solver(snapshot), concurrency=self.concurrency,
                        seed=self.seed, store=self.store, model=self.model or None,
                        task_set=self.tasks.name if self.tasks is not None else None,
                        trace_meta={"evolve": phase, **({"evolve_preview": snapshot.id}
                                                        if snapshot is not None else {}),
                                    **dict(trace_meta or {})},
                        on_progress=lambda done, n, _: self.on_progress(phase, done, n))


@runtime_checkable
class Evolver(Protocol):
    """An evolver (see the module docstring). ``config_class`` is a frozen dataclass. An
    evolver whose changes act only through runtime methods (NLPG's notes through ``nlpg``)
    names them in an optional ``runtime_methods`` tuple: ``Engine.evolve`` then runs its
    rollouts and the gate with those methods on."""

    name: ClassVar[str]
    config_class: ClassVar[type]
    config: Any

    def fit(self, traces: Sequence[Trace], library: Snapshot | Mapping[str, str],
            analyst: Backend, labels: Mapping[str, str] | None = None, *,
            context: EvolveContext | None = None) -> LibraryPatch: ...


class CommandKit(Protocol):
    """What the command line hands a method's commands (``MethodSpec.commands`` is called
    with one), so a method package never imports a face: the options every command shares,
    the error handling that turns ``WhetstoneError`` into its exit code, output, and the
    ``Engine`` and library the other commands would build."""

    def json_option(self, fn: Any) -> Any:
        """``--json``: the command's result as JSON on stdout (parameter ``as_json``)."""

    def library_option(self, fn: Any) -> Any:
        """``--library PATH`` (parameter ``library_path``: None for the default library)."""

    def model_option(self, fn: Any) -> Any:
        """``--model SPEC`` (parameter ``model``)."""

    def handle_errors(self, fn: Any) -> Any:
        """A ``WhetstoneError`` becomes its message, hint and exit code."""

    def console(self, stderr: bool = False) -> Any:
        """A rich console (stderr: for progress and notes, silent under ``--quiet``)."""

    def emit_json(self, obj: Any) -> None:
        """Print ``obj`` as the command's JSON result."""

    def open_library(self, path: Any | None, *, create: bool | None = None) -> Library:
        """The library at ``path`` (None: the default), opened as every face opens it
        (``create=True`` makes a missing one; None: only the default library)."""

    def engine(self, model: str, **options: Any) -> Any:
        """An ``Engine`` over ``model`` (options as ``Engine`` takes them), as ``run`` would
        build it; the caller closes it."""


def knob(default: Any = dataclasses.MISSING, *, help: str = "", min: float | None = None,
         choices: Sequence[str] | None = None, cli: bool = True) -> Any:
    """A config field with what ``whetstone evolve`` / ``--method-config`` show for it:
    ``help``, a lower bound ``min``, the allowed ``choices``; ``cli=False`` keeps it out of the
    command line (Python only)."""
    meta = {"help": help, "min": min, "choices": tuple(choices) if choices else None, "cli": cli}
    return field(default=default, metadata=meta)


def make_config(config_class: type | None, options: Mapping[str, Any], *, method: str) -> Any:
    """``config_class(**options)``, with errors that name the method and its knobs."""
    if config_class is None:
        if options:
            raise ConfigError(f"method {method!r} takes no options, got "
                              f"{', '.join(sorted(options))}")
        return None
    known = {f.name: f for f in dataclasses.fields(config_class)}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(f"unknown option(s) for {method}: {', '.join(unknown)}",
                          hint="options: " + ", ".join(known))
    missing = [n for n, f in known.items() if n not in options
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{method} needs {', '.join(missing)}",
                          hint=f"e.g. {method} with {missing[0]}=...")
    for name, value in options.items():
        meta = known[name].metadata
        if meta.get("choices") and value not in meta["choices"]:
            raise ConfigError(f"{method} {name} must be one of {', '.join(meta['choices'])}, "
                              f"got {value!r}")
        if meta.get("min") is not None and isinstance(value, (int, float)) \
                and value < meta["min"]:
            raise ConfigError(f"{method} {name} must be at least {meta['min']:g}, got {value}")
    return config_class(**options)


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def options_from_text(config_class: type | None, raw: Mapping[str, str], *,
                      method: str) -> dict[str, Any]:
    """Options written as text (``--method-config name.k=3``) typed by the config's fields:
    bool, int, float, str, or None for an optional field given ``none``."""
    if config_class is None:
        return make_config(None, raw, method=method) or {}
    hints = typing.get_type_hints(config_class)
    out: dict[str, Any] = {}
    for key, text in raw.items():
        tp = hints.get(key)
        args = typing.get_args(tp)
        if type(None) in args:
            if text.strip().lower() == "none":
                out[key] = None
                continue
            tp = next((a for a in args if a is not type(None)), str)
        try:
            out[key] = _typed(tp, text.strip())
        except ValueError as exc:
            raise ConfigError(f"{method}.{key}={text!r}: {exc}",
                              hint=f"{method}.{key} takes a {getattr(tp, '__name__', tp)}") \
                from exc
    return out


def _typed(tp: Any, text: str) -> Any:
    if tp is bool:
        if text.lower() not in _TRUE | _FALSE:
            raise ValueError("not true or false")
        return text.lower() in _TRUE
    if tp in (int, float):
        return tp(text)
    return text
