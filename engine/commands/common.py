"""Shared CLI plumbing: options, JSON output, and turning errors into messages and exit codes.

Progress bars, colours and exit codes live here and in the commands, never in the engine.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.segment import Segment
from rich.syntax import Syntax

from ...library_store.pg_connect import STORE_ENV, store_spec
from ..errors import (  # noqa: F401 - EXIT_* re-exported for the commands
    EXIT_INTERRUPTED,
    EXIT_NO_ANSWER,
    EXIT_PARTIAL,
    ConfigError,
    WhetstoneError,
)
from ..methods.base import options_from_text
from ..methods.registry import KnobOption, default_registry
from ..paths import whetstone_home
from ..printing import printable

F = TypeVar("F", bound=Callable[..., Any])

# Exit codes: each WhetstoneError subclass carries its own ``exit_code``; the other outcomes
# are whetstone.engine.errors' EXIT_* constants (re-exported here for the commands). docs/cli.md has
# the table.


QUIET = "whetstone.quiet"  # ctx.meta key: `whetstone -q` was given


def _quiet() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(QUIET))


class _NoStatus:
    """What ``status()`` gives under ``-q``: a spinner that shows nothing."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, *args: Any, **kwargs: Any) -> None:
        return None


# The width of output that goes to a file or a pipe (no terminal, no COLUMNS): wide enough
# that nothing a user copies (a trace id, a candidate's name, a command) is cut or wrapped,
# as it was at rich's default of 80 columns.
PIPED_WIDTH = 10_000


class _CliConsole(Console):
    """A console whose spinners are off under ``whetstone -q``, which draws no wider than its
    text when its output is piped (``PIPED_WIDTH``), and which shows the terminal control
    characters of what it prints written out (``printable``)."""

    def status(self, *args: Any, **kwargs: Any) -> Any:
        return _NoStatus() if _quiet() else super().status(*args, **kwargs)

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if self.width == PIPED_WIDTH:
            # Code and diffs are padded to the console's width: to their longest line here.
            for obj in objects:
                if isinstance(obj, Syntax) and obj.code_width is None:
                    obj.code_width = max((len(line) for line in obj.code.splitlines()),
                                         default=0) + 1
        super().print(*objects, **kwargs)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        # The one place every line a command prints through rich passes (tables, notes,
        # warnings, errors): a skill's description, a trace's task or a model's reply cannot
        # retitle, clear or reorder the terminal. Rich's own control segments (a progress
        # bar's cursor moves) and styles are added after, untouched. (rich is pinned; its
        # tests/test_attack_cli_iv.py test fails if this hook stops being called.)
        return super()._render_buffer(
            s if s.control else Segment(printable(s.text), s.style, s.control) for s in buffer)


def console(stderr: bool = False) -> Console:
    """A rich console; pass ``stderr=True`` for progress and diagnostics, which ``whetstone
    -q`` silences (errors print through ``fail``, never silenced). No emoji codes: text such
    as ``pkg:X:`` (an import path, model output) prints as written. Piped (no terminal and
    no ``COLUMNS``), it is ``PIPED_WIDTH`` wide: lines and tables keep their whole text."""
    out = _CliConsole(stderr=stderr, highlight=False, emoji=False, quiet=stderr and _quiet())
    if not out.is_terminal and not os.environ.get("COLUMNS"):
        out.width = PIPED_WIDTH
    return out


def _error_console() -> Console:
    return _CliConsole(stderr=True, highlight=False, emoji=False)


class _LogHandler(logging.Handler):
    """Log records as the CLI prints its own notes (``warning: ...``), on the stderr of the
    moment (click's test runner swaps it), with the logger's name under ``-v``."""

    def __init__(self, level: int, named: bool) -> None:
        super().__init__(level)
        self.named = named
        self.as_json = False  # one JSON event a line (`evolve --json`: log_events_as_json)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.as_json:
                click.echo(json.dumps({"event": "log", "level": record.levelname.lower(),
                                       "logger": record.name, "text": self.format(record)},
                                      ensure_ascii=False), err=True)
                return
            name = f"{record.name}: " if self.named else ""
            text = escape(name + self.format(record))
            style = "red" if record.levelno >= logging.ERROR else \
                "yellow" if record.levelno >= logging.WARNING else "dim"
            _error_console().print(f"[{style}]{record.levelname.lower()}:[/] {text}",
                                   markup=True, soft_wrap=True)
        except Exception:  # noqa: BLE001 - logging must never crash the command
            self.handleError(record)


_LEVELS = ("debug", "info", "warning", "error", "critical")


@contextlib.contextmanager
def log_events_as_json() -> Iterator[None]:
    """While inside, the command's log records (warnings) go to stderr as JSON events, one a
    line (``{"event": "log", "level": ..., "text": ...}``), like its progress."""
    handlers = [h for h in logging.getLogger("whetstone").handlers if isinstance(h, _LogHandler)]
    for h in handlers:
        h.as_json = True
    try:
        yield
    finally:
        for h in handlers:
            h.as_json = False


def configure_logging(verbose: int, quiet: bool, env_level: str | None) -> int:
    """Set the level of the ``whetstone`` logger (every logger of ours is under it) for one
    command: ``-q`` errors only, ``-v`` info, ``-vv`` debug, else ``WHETSTONE_LOG_LEVEL``,
    else warnings. Returns the level."""
    if verbose and quiet:
        raise ConfigError("-v and -q cannot be combined", hint="give one of them")
    if quiet:
        level = logging.ERROR
    elif verbose:
        level = logging.INFO if verbose == 1 else logging.DEBUG
    elif env_level and env_level.strip():
        name = env_level.strip().lower()
        if name not in _LEVELS:
            raise ConfigError(f"WHETSTONE_LOG_LEVEL={env_level!r} is not a log level",
                              hint=f"use one of {', '.join(_LEVELS)}")
        level = getattr(logging, name.upper())
    else:
        level = logging.WARNING
    logger = logging.getLogger("whetstone")
    for old in [h for h in logger.handlers if isinstance(h, _LogHandler)]:
        logger.removeHandler(old)  # one per process: each command configures its own
    logger.addHandler(_LogHandler(level, named=level <= logging.INFO))
    # The logger's own level only when asked: left alone, it inherits (tests set levels).
    logger.setLevel(level if level != logging.WARNING else logging.NOTSET)
    return level


def emit_json(obj: Any) -> None:
    """Print one JSON document on stdout (for ``--json``)."""
    text = json.dumps(obj, indent=2, ensure_ascii=False, default=str)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (a file name that is not UTF-8): escape it
        text = json.dumps(obj, indent=2, ensure_ascii=True, default=str)
    click.echo(text)


def echo_text(text: str, *, nl: bool = True) -> None:
    """Print a library's or a trace's text as is (a file, a diff) on stdout, its terminal
    control characters written out like ``console()`` writes them (``printable``)."""
    click.echo(printable(text), nl=nl)


def fail(exc: WhetstoneError) -> None:
    """Print an error the way every command does and exit with its code."""
    err = _error_console()  # never silenced by -q
    # Escape: messages hold "[rule]" tags and raw model output that rich must not eat.
    err.print(f"[bold red]error:[/] {escape(exc.message)}", markup=True, soft_wrap=True)
    raw = getattr(exc, "raw", None)  # a ParseError: the model output that could not be read
    if isinstance(raw, str):
        cut = raw if len(raw) <= 2000 else raw[:2000] + " …"
        err.print(f"[dim]model output:[/] {escape(cut)}", markup=True, soft_wrap=True)
    if exc.hint:
        err.print(f"[yellow]hint:[/] {escape(exc.hint)}", markup=True, soft_wrap=True)
    sys.exit(exc.exit_code)


def handle_errors(fn: F) -> F:
    """Turn ``WhetstoneError`` into a message and exit code, and Ctrl-C into exit 130."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except WhetstoneError as exc:
            fail(exc)
        except KeyboardInterrupt:
            _error_console().print("[yellow]interrupted[/]", markup=True)
            sys.exit(EXIT_INTERRUPTED)

    return wrapper  # type: ignore[return-value]


def check_before_loading(*, specs: Sequence[str | None] = (),
                         task_sets: Sequence[str | None] = (), scorer: str | None = None,
                         rule: str | None = None, trace_filter: str | None = None) -> None:
    """Raise now what a typo in these options would raise after the model loaded (seconds
    for the embedded one): each model spec's family, each task set (read), the scorer, the
    gate rule and the trace filter."""
    # lazy: the registry, the task sets and the scorers; `whetstone --help` imports us
    from ...library_store.traces import parse_trace_filter
    from ..backends.registry import default_registry as backends
    from ..evaluation.benchmarks import load_tasks
    from ..evaluation.gate_rules import parse_rule
    from ..evaluation.scorers import get_scorer

    registry = backends()
    for spec in specs:
        if spec:
            registry.entry_for(spec)
    for tasks in task_sets:
        if tasks:
            load_tasks(tasks)
    if scorer:
        get_scorer(scorer)
    if rule:
        parse_rule(rule)
    if trace_filter:
        parse_trace_filter(trace_filter)


def default_library_path() -> Path:
    """``$WHETSTONE_HOME/library``."""
    return whetstone_home() / "library"


def library_option(fn: F) -> F:
    """``--library PATH`` (env ``WHETSTONE_LIBRARY``; default ``$WHETSTONE_HOME/library``)
    and ``--store URL`` (env ``WHETSTONE_STORE``): where the library's shared state lives."""
    fn = click.option(
        "--store", envvar=STORE_ENV, default=None, expose_value=False, callback=_use_store,
        metavar="URL", help="Keep the library's versions, candidates and traces in "
        "PostgreSQL: postgresql://USER@HOST:PORT/DB?schema=NAME (env WHETSTONE_STORE; "
        "default: the library folder itself).")(fn)
    return click.option(
        "--library", "library_path", type=click.Path(path_type=Path), envvar="WHETSTONE_LIBRARY",
        default=None, help="Library directory (default: $WHETSTONE_HOME/library).",
    )(fn)


def _use_store(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--store``: checked now, then set as ``WHETSTONE_STORE`` for the whole command, so
    every library it opens (and every process it starts: Ray workers) uses that store."""
    if value:
        try:
            store_spec(value)
        except WhetstoneError as exc:
            raise click.BadParameter(f"{exc.message}; {exc.hint}", ctx, param) from None
        os.environ[STORE_ENV] = value
    return value


def executor_options(fn: F) -> F:
    """``--executor local|ray`` and ``--ray-address ADDR`` (env ``RAY_ADDRESS``): where the
    agent's runs go (docs/middleware.md, "Past one machine")."""
    fn = click.option(
        "--ray-address", envvar="RAY_ADDRESS", default=None, metavar="HOST:PORT",
        help="The Ray cluster for --executor ray (env RAY_ADDRESS; default: start Ray on "
             "this machine).")(fn)
    return click.option(
        "--executor", type=click.Choice(["local", "ray", "asyncio"]), default="local",
        show_default=True, help="Where the agent's runs (and an evolver's analysts) go: this "
        "process, or a Ray cluster (pip install 'whetstone-engine[scale]'); asyncio is local.",
    )(fn)


def model_option(fn: F) -> F:
    """``--model SPEC`` (env ``WHETSTONE_MODEL``; default ``embedded``)."""
    return click.option(
        "--model", "-m", "model", envvar="WHETSTONE_MODEL", default="embedded", show_default=True,
        help="Model spec (see `whetstone models`).",
    )(fn)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")(fn)


def solver_option(fn: F) -> F:
    """``--solver agent|direct``: answer each task through the agent loop, or with one call in
    the model's chat template (the library's guidance in the system message)."""
    return click.option(
        "--solver", "solver", type=click.Choice(["agent", "direct"]), default="agent",
        show_default=True,
        help="agent: the agent loop; direct: one call with the model's chat template and the "
             "library's guidance (the baseline the agent is read against).")(fn)


def _check_scorer(ctx: click.Context, param: click.Parameter, value: str | None
                  ) -> str | None:
    """A scorer name that does not resolve fails as the options are read, before a model
    loads: an unknown built-in, a missing file or function."""
    if value is not None:
        # lazy: `whetstone --help` imports every command module; scorers load the evaluation
        from ..evaluation.scorers import get_scorer

        try:
            get_scorer(value)
        except WhetstoneError as exc:
            raise click.BadParameter(f"{exc.message} ({exc.hint})", ctx, param) from None
    return value


def scorer_option(fn: F) -> F:
    """``--scorer NAME``: score every task with a scorer the person chose (a built-in name,
    ``FILE.py:FUNCTION`` or ``module:FUNCTION``) instead of each task's own."""
    return click.option(
        "--scorer", default=None, metavar="NAME", callback=_check_scorer,
        help="Score every task with this scorer instead of its own: exact, normalised, "
             "numeric[:TOL], contains, value[:TOL], f1, choice, ... or FILE.py:FUNCTION / "
             "module:FUNCTION (`whetstone eval --help`).")(fn)


_SHORTCUTS = "whetstone.method_shortcuts"  # ctx.meta: {(method, knob): (flag, value)}


class _WithMethodShortcuts:
    """A command with ``--methods`` also takes each installed runtime method's own
    command-line shortcuts for its knobs (``MethodSpec.options``, e.g. a rubric generator's
    ``--rubric-model``), read from the method registry when the command parses or shows its
    help, never when the command line is imported."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)  # type: ignore[misc]
        extra = ctx.meta.get("whetstone.shortcut_params")
        if extra is None:
            extra = ctx.meta["whetstone.shortcut_params"] = _shortcut_params()
        return [*params[:-1], *extra, *params[-1:]]  # --help stays last


class MethodCommand(_WithMethodShortcuts, click.Command):
    """A ``click.Command`` that takes the runtime methods' shortcuts (see above)."""


class MethodGroup(_WithMethodShortcuts, click.Group):
    """A ``click.Group`` that takes the runtime methods' shortcuts (see above)."""


def _shortcut_params() -> list[click.Parameter]:
    return [_shortcut_param(method, opt) for method, opt in default_registry().knob_options()]


def _shortcut_param(method: str, opt: KnobOption) -> click.Option:
    """``opt.flag VALUE``, remembered as ``--method-config <method>.<knob>=VALUE``."""
    def remember(ctx: click.Context, _: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            ctx.meta.setdefault(_SHORTCUTS, {})[(method, opt.knob)] = (opt.flag, value)
        return value

    return click.Option([opt.flag], default=None, metavar=opt.metavar, expose_value=False,
                        callback=remember,
                        help=f"{opt.help} Same as --method-config {method}.{opt.knob}=…")


def methods_option(fn: F) -> F:
    """``--methods a,b`` and ``--method-config NAME.KEY=VALUE``: runtime methods for the run
    (``whetstone methods`` lists them). A command built with ``cls=MethodCommand`` also takes
    the methods' own shortcuts for their knobs."""
    fn = click.option("--method-config", "method_config", multiple=True, metavar="NAME.KEY=V",
                      help="Set one knob of a runtime method; repeat for more.")(fn)
    return click.option("--methods", "methods", default="", metavar="A,B",
                        help="Runtime methods to use besides skills, comma-separated "
                             "(`whetstone methods` lists them).")(fn)


class Concurrency(click.ParamType):
    """``-j``: a positive number, or ``auto`` (as many as the backend decodes together)."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int | None:
        if value is None or value == "auto":
            return None  # resolved against the backend once it is loaded
        try:
            n = int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number or 'auto'", param, ctx)
        if n < 1:
            self.fail(f"{n} is below 1; give a positive number or 'auto'", param, ctx)
        return n


def concurrency_option(fn: F) -> F:
    """``--concurrency/-j N|auto`` (default auto: what the backend decodes together)."""
    return click.option("--concurrency", "-j", type=Concurrency(), default="auto",
                        show_default=True,
                        help="Tasks run at once; auto = the backend's batch (1 for engines "
                             "that decode one sequence at a time).")(fn)


def parse_methods(methods: str, method_config: tuple[str, ...] = ()
                  ) -> list[tuple[str, dict[str, Any]]]:
    """``--methods`` and ``--method-config`` as ``Engine(methods=...)`` takes them; unknown
    names and badly written settings are a ``ConfigError``."""
    names = [n.strip() for n in methods.split(",") if n.strip()]
    raw: dict[str, dict[str, str]] = {n: {} for n in names}
    for item in method_config:
        target, eq, value = item.partition("=")
        name, dot, key = target.strip().partition(".")
        if not eq or not dot or not key:
            raise ConfigError(f"cannot read --method-config {item!r}",
                              hint="write NAME.KEY=VALUE, e.g. skills.k=3")
        if "." in key:  # whetstone.skills.examples: a module's name, not a method's
            short = target.strip().rsplit(".", 2)
            raise ConfigError(f"cannot read --method-config {item!r}: {target.strip()!r} is "
                              "not METHOD.KNOB",
                              hint=f"the method's name and one knob: "
                                   f"{short[-2]}.{short[-1]}={value}")
        if name not in raw and name == "skills":
            # Skill retrieval runs by default; setting its options must not require naming it.
            names.append(name)
            raw[name] = {}
        if name not in raw:
            raise ConfigError(f"--method-config sets {name!r}, which --methods does not list",
                              hint=f"add it: --methods {','.join([*names, name])}")
        raw[name][key] = value
    ctx = click.get_current_context(silent=True)
    shortcuts = ctx.meta.get(_SHORTCUTS, {}) if ctx is not None else {}
    for (method, knob), (flag, value) in shortcuts.items():
        if method not in raw:
            raise ConfigError(f"{flag} sets {method}.{knob}, but --methods does not list "
                              f"{method}", hint=f"add --methods {','.join([*names, method])}")
        raw[method].setdefault(knob, value)  # --method-config, when also given, wins
    registry = default_registry()
    return [(n, options_from_text(registry.entry("runtime", n).load().config_class, raw[n],
                                  method=n)) for n in names]


# -- the skills retrieval options of `serve` and `mcp` ----------------------------------------

_UNSET_SCORE: Any = "default"  # --skills-min-score not given (None is a value: no floor)


class SkillScore(click.ParamType):
    """A cosine floor from -1 to 1, ``none`` (no floor: the top k whatever their score), or
    ``default`` (the skills method's own)."""

    name = "SCORE|none"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> float | str | None:
        if value is None or value == _UNSET_SCORE or isinstance(value, float):
            return value
        if str(value).strip().lower() in ("none", "off"):
            return None
        try:
            score = float(value)
        except ValueError:
            self.fail(f"{value!r} is not a number from -1 to 1 or 'none'", param, ctx)
        if not -1.0 <= score <= 1.0:
            self.fail(f"{score:g} is not a cosine score from -1 to 1", param, ctx)
        return score


def skills_options(k_help: str, score_help: str) -> Callable[[F], F]:
    """``--skills-k`` and ``--skills-min-score``, with the skills method's own defaults."""
    # lazy: loads filelock and 40 more of our modules
    from ..runtime.skills_plugin import SkillsConfig

    defaults = SkillsConfig()

    def add(fn: F) -> F:
        fn = click.option("--skills-min-score", type=SkillScore(), default=_UNSET_SCORE,
                          help=f"{score_help}; 'none': no floor [default: "
                               f"{defaults.min_score}, measured].")(fn)
        return click.option("--skills-k", type=click.IntRange(min=1), default=defaults.k,
                            show_default=True, help=k_help)(fn)
    return add


def skills_config(k: int, min_score: float | str | None) -> dict[str, Any]:
    """The skills options given: ``k``, and ``min_score`` only when it was set."""
    return {"k": k} | ({} if min_score is _UNSET_SCORE else {"min_score": min_score})


def web_options(fn: F) -> F:
    """``--allowed-host``, ``--allowed-origin`` and ``--insecure`` (``serve`` and ``mcp``)."""
    fn = click.option("--insecure", is_flag=True,
                      help="Listen on a non-loopback --host without an API key (anyone who "
                           "can reach the port may use it).")(fn)
    fn = click.option("--allowed-origin", "allowed_origins", multiple=True,
                      help="A browser origin whose pages may call the server "
                           "(https://app.example.com); repeat for more. Default: none but "
                           "the server's own.")(fn)
    return click.option("--allowed-host", "allowed_hosts", multiple=True,
                        help="A Host name clients use besides the loopback names and the "
                             "bound address (NAME for any port, NAME:PORT, or '*' for any); "
                             "repeat for more. Others get 421 (DNS rebinding).")(fn)


def check_exposed_bind(host: str, keys: frozenset[str], insecure: bool, command: str) -> None:
    """Refuse to listen beyond this machine with no API key, unless ``--insecure``."""
    # lazy: the server package, `whetstone --help` imports every command module
    from ..server.hosts import is_loopback

    if keys or insecure or is_loopback(host):
        return
    raise ConfigError(
        f"`whetstone {command} --host {host}` would take requests from the network with no "
        "API key: anyone who can reach the port could use it",
        hint="require a key with --api-key KEY (or --api-keys-file FILE; clients send "
             "'Authorization: Bearer KEY'), listen on 127.0.0.1, or pass --insecure to serve "
             "without one anyway")


def otel_options(fn: F) -> F:
    """``--otel``, ``--otel-content`` and ``--otel-file`` (issue 39), handed to the command as
    one ``otel`` parameter: the ``OtelSettings`` to export with, or False when export is off
    (the default: no span is made and OpenTelemetry is not imported)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, otel: bool, otel_content: bool, otel_file: Path | None,
                **kwargs: Any) -> Any:
        # lazy: `whetstone --help` imports every command module
        from ...library_store.otel_export import otel_settings

        settings = (otel_settings(content=True if otel_content else None, file=otel_file,
                                  otlp=otel) if otel or otel_file is not None else False)
        return fn(*args, otel=settings, **kwargs)

    out: Any = click.option(
        "--otel-file", type=click.Path(path_type=Path, dir_okay=False), default=None,
        help="Also append each trace's spans to this file as OTLP/JSON lines (stays local).",
    )(wrapper)
    out = click.option(
        "--otel-content", is_flag=True, default=False,
        help="Put the task, answer, messages and tool data in the spans (default: only "
             "names, models, token counts, timings; also "
             "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true).")(out)
    return click.option(
        "--otel/--no-otel", envvar="WHETSTONE_OTEL", default=False, show_default=True,
        help="Send each recorded trace as OpenTelemetry spans over OTLP to "
             "OTEL_EXPORTER_OTLP_ENDPOINT (env WHETSTONE_OTEL=1).")(out)
