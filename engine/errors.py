"""The error hierarchy. Every message says what went wrong and what to do next.

This module imports nothing of ours. The CLI maps each class to an exit code (``exit_code``);
the codes that are not errors are the ``EXIT_*`` constants below, and those a method's own
commands exit with (``MethodSpec.exit_codes``). docs/cli.md has the table
(tests/test_docs_cli.py holds it, this module and the methods to each other).
"""

from __future__ import annotations

# Exit codes of outcomes that are not a WhetstoneError.
EXIT_OK = 0
EXIT_NO_ANSWER = 8  # `run`: no whole answer (horizon, budget, time; a reply cut at length)
EXIT_PARTIAL = 11  # the command did its work, minus some items it reported (`library import`)
EXIT_GATE_REFUSED = 12  # a library write's gate refused it: kept as a candidate, nothing live
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT


class WhetstoneError(Exception):
    """Base class. ``hint`` is the next thing the user should do."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if not hint else f"{message}\n  -> {hint}")


def error_text(exc: BaseException) -> str:
    """``Type: message`` for records and listings: a ``WhetstoneError``'s message without its
    hint, any other exception as ``str`` gives it."""
    message = exc.message if isinstance(exc, WhetstoneError) else str(exc)
    return f"{type(exc).__name__}: {message}"


class ConfigError(WhetstoneError):
    """Bad option, spec or configuration supplied by the user."""

    exit_code = 2


class UnknownBackend(ConfigError):
    """A model spec that matches no registered backend."""


class ModelNotInstalled(WhetstoneError):
    """A backend's optional package or packaged weights are missing."""

    exit_code = 3


class ModelLoadError(WhetstoneError):
    """Weights exist but could not be loaded (corrupt part, wrong hash, bad file)."""

    exit_code = 3


class BackendError(WhetstoneError):
    """A backend call failed. ``no_retry``: trying again now will not help, because the
    backend already retried the upstream or the upstream said not to (``x-should-retry:
    false``); a proxy tells its client so, and retries do not multiply down a chain."""

    exit_code = 4
    no_retry: bool = False


class BackendUnavailable(BackendError):
    """The backend could not be reached (server down, connection refused) after retries."""


class BackendTimeout(BackendError):
    """The backend did not answer in time."""


class BackendRejected(BackendError):
    """The upstream refused the request itself with a 4xx (too long for its context, a bad
    field, rate limited): the client's to read. ``status``, the upstream's own error
    (``upstream_message``, ``error_type``, ``param``, ``code``) and its ``Retry-After`` travel
    with it, so a proxy answers its client as the upstream answered it."""

    def __init__(self, message: str, hint: str | None = None, *, status: int,
                 upstream_message: str = "", error_type: str | None = None,
                 param: str | None = None, code: str | None = None,
                 retry_after: str | None = None) -> None:
        super().__init__(message, hint)
        self.status = status
        self.upstream_message = upstream_message or message
        self.error_type = error_type
        self.param = param
        self.code = code
        self.retry_after = retry_after


class ScriptExhausted(BackendError):
    """The ``scripted:`` test double was asked for more completions than it was given."""


class ParseError(WhetstoneError):
    """Model output that could not be parsed. ``raw`` holds the output verbatim."""

    def __init__(self, message: str, raw: str, hint: str | None = None) -> None:
        self.raw = raw
        super().__init__(f"{message}\n--- raw model output ---\n{raw}\n--- end ---", hint)
        self.message = message


class ToolError(WhetstoneError):
    """A tool failed (bad input, crash, timeout). The runtime shows it to the model."""


class LibraryError(WhetstoneError):
    """The library on disk is missing, locked, or inconsistent."""

    exit_code = 5


class ValidationError(LibraryError):
    """A file breaks a rule. ``path`` and ``line`` say where, ``rule`` says which rule."""

    def __init__(self, path: str, rule: str, detail: str, line: int | None = None,
                 hint: str | None = None) -> None:
        self.path = path
        self.line = line
        self.rule = rule
        self.detail = detail
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: [{rule}] {detail}", hint)


class StoreUnavailable(LibraryError):
    """The shared store (PostgreSQL, ``--store``) cannot be reached or dropped the connection
    mid-call; what was being written is retried or reported, never half kept."""


class GateRequired(LibraryError):
    """The library requires every write to pass a gate (``require_gate``), and this one was
    about to go live without one."""


class LeaseLost(LibraryError):
    """A learner no longer holds the library's lease (another learner took it after its
    heartbeat stopped): what it was about to write is not written."""


class EmptyCorpus(LibraryError):
    """An evidence corpus was asked for passages but holds no document."""


class NotFound(WhetstoneError):
    """A named thing (trace, version, skill, task set) does not exist."""

    exit_code = 6


class EvalError(WhetstoneError):
    """A task set or scorer could not be used."""

    exit_code = 7


class TasksFailed(EvalError):
    """A comparison or a gate was asked to decide on runs where tasks failed (solver or
    scorer errors): the decision could turn on which tasks happened to fail."""


class AddressInUse(WhetstoneError):
    """A server could not listen on its address: another process holds the port."""

    exit_code = 10
