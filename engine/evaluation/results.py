"""Evaluation results: per-task scores and their summary, saved as JSON files.

Files live in an evals folder (the CLI passes ``$WHETSTONE_HOME/evals``), one per run, named
``<UTC timestamp>-<task set>.json``; they are never rewritten.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import EvalError
from ..paths import whetstone_home
from .stats import Interval, score_interval

log = logging.getLogger("whetstone.eval")

FORMAT_VERSION = 1


@dataclass(frozen=True)
class TaskResult:
    """One task's outcome. ``error`` ("Type: message") is set when the task failed (the
    solver or the scorer raised, or the run ended in the ``error`` outcome): it is not
    scored, and every summary leaves it out (its ``score`` field stays 0.0 only so the file
    format keeps a number there)."""

    task_id: str
    score: float
    answer: str | None = None
    expected: Any = None
    tokens: int = 0
    latency_s: float = 0.0
    trace_id: str | None = None
    outcome: str = "answered"
    seed: int = 0
    error: str | None = None
    error_type: str | None = None  # the exception's class name, for filtering

    @property
    def scored(self) -> bool:
        return self.error is None and self.outcome != "error"

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TaskResult:
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        if kw.get("outcome") == "error" and not kw.get("error"):
            # Saved before a run's own failure was recorded: failed, with nothing to say why.
            kw["error"] = "the run ended in an error (no message was saved)"
        return cls(**kw)


@dataclass(frozen=True)
class EvalResult:
    """A run of one task set through one solver (one library version of one model).

    ``partial`` is true when the run was interrupted: ``results`` holds the tasks scored before
    it stopped, ``n_planned`` how many were asked for. Tasks that failed (``error``) are kept
    in ``results`` but left out of ``scores``, ``accuracy`` and the interval: a failure is a
    missing measurement, not a wrong answer. ``n_scored`` counts the rest.
    """

    task_set: str
    scorer: str
    results: tuple[TaskResult, ...]
    model: str = ""
    library_version: str | None = None
    seed: int = 0
    started: float = field(default_factory=time.time)
    ended: float | None = None
    partial: bool = False
    n_planned: int = 0
    label: str | None = None  # what the user called this run (e.g. the version compared)
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.results)

    @property
    def scored(self) -> tuple[TaskResult, ...]:
        """The tasks that were scored (no error)."""
        return tuple(r for r in self.results if r.scored)

    @property
    def n_scored(self) -> int:
        return sum(1 for r in self.results if r.scored)

    @property
    def failed(self) -> tuple[TaskResult, ...]:
        """The tasks that failed (solver or scorer error), in run order."""
        return tuple(r for r in self.results if not r.scored)

    @property
    def aborted(self) -> bool:
        """Stopped before any task was scored: there is no accuracy to show."""
        return self.n_scored == 0

    @property
    def scores(self) -> dict[str, float]:
        """Task id -> score, for the scored tasks only."""
        return {r.task_id: r.score for r in self.results if r.scored}

    def interval(self, confidence: float = 0.95) -> Interval:
        """Accuracy (mean score over the scored tasks) with its interval: Wilson for 0/1
        scores, else bootstrap."""
        return score_interval([r.score for r in self.scored], confidence, seed=self.seed)

    @property
    def accuracy(self) -> float:
        """Mean score over the scored tasks (0.0 when none was: check ``aborted``)."""
        n = self.n_scored
        return sum(r.score for r in self.scored) / n if n else 0.0

    @property
    def mean_tokens(self) -> float:
        n = self.n_scored
        return sum(r.tokens for r in self.scored) / n if n else 0.0

    @property
    def mean_latency_s(self) -> float:
        n = self.n_scored
        return sum(r.latency_s for r in self.scored) / n if n else 0.0

    @property
    def n_errors(self) -> int:
        return self.n - self.n_scored

    @property
    def n_length(self) -> int:
        """Tasks whose answer was cut at the length limit (outcome ``length``): scored as
        written, and counted apart so a cut answer never reads as a whole one."""
        return sum(1 for r in self.results if r.outcome == "length")

    def tally(self) -> str:
        """``17/20`` (correct of scored), with ``, 3 failed`` when tasks failed: the count a
        table shows beside the accuracy, over the same tasks the accuracy is."""
        correct = sum(r.score for r in self.scored)
        failed = f", {self.n_errors} failed" if self.n_errors else ""
        return f"{correct:g}/{self.n_scored}{failed}"

    def errors_line(self, most: int = 5) -> str:
        """``3 task(s) failed: t1, t2 (BackendUnavailable: ...); t3 (IndexError: ...)``: the
        failed tasks grouped by their error, ``most`` ids and groups shown, for messages."""
        failed = self.failed
        groups: dict[str, list[str]] = {}
        for r in failed:
            groups.setdefault(r.error or "no error recorded", []).append(r.task_id)
        parts = []
        for error, ids in list(groups.items())[:most]:
            more = f" and {len(ids) - most} more" if len(ids) > most else ""
            parts.append(f"{', '.join(ids[:most])}{more} ({error})")
        if len(groups) > most:
            parts.append(f"{len(groups) - most} other error(s)")
        return f"{len(failed)} task(s) failed: {'; '.join(parts)}"

    @property
    def name(self) -> str:
        """How plots and tables name this run: label, else library version, else model."""
        return self.label or self.library_version or self.model or "unnamed"

    def summary(self) -> dict[str, Any]:
        """The headline numbers, JSON-safe."""
        ci = self.interval()
        return {
            "n": self.n, "n_planned": self.n_planned, "n_scored": self.n_scored,
            "accuracy": ci.mean if self.n_scored else None,
            "ci_low": ci.low, "ci_high": ci.high, "ci_method": ci.method,
            "confidence": ci.confidence, "mean_tokens": self.mean_tokens,
            "mean_latency_s": self.mean_latency_s, "errors": self.n_errors,
            "cut_at_length": self.n_length,
            "failed_tasks": [r.task_id for r in self.failed], "partial": self.partial,
        }

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["results"] = [r.to_dict() for r in self.results]
        d["meta"] = dict(self.meta)
        d["summary"] = self.summary()
        d["format"] = FORMAT_VERSION
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvalResult:
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        kw["results"] = tuple(TaskResult.from_dict(r) for r in d.get("results") or ())
        return cls(**kw)

    def save(self, folder: Path | str) -> Path:
        """Write ``<folder>/<UTC timestamp>-<set>.json`` (a new file; never overwrites)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        stamp = datetime.fromtimestamp(self.started, tz=UTC).strftime("%Y%m%dT%H%M%S")
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(self.task_set).name).strip("_") or "tasks"
        base = f"{stamp}-{slug}"
        if self.label:
            base += "-" + re.sub(r"[^A-Za-z0-9._-]+", "_", self.label)
        text = json.dumps(self.to_dict(), indent=1, ensure_ascii=False, default=str)
        for i in range(1000):
            path = folder / (f"{base}.json" if i == 0 else f"{base}-{i}.json")
            try:
                # "x": exclusive create, so two runs started in the same second never collide.
                with open(path, "x", encoding="utf-8") as f:
                    f.write(text)
                return path
            except FileExistsError:
                continue
        raise EvalError(f"could not find a free file name for {base} in {folder}",
                        hint="clean up the evals folder")


def default_evals_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$WHETSTONE_HOME/evals``."""
    return whetstone_home(os.environ if env is None else env) / "evals"


def load_result(path: Path | str) -> EvalResult:
    """Read one saved result."""
    path = Path(path)
    try:
        return EvalResult.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise EvalError(f"no result file {path}", hint="`whetstone eval` writes them") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise EvalError(f"{path}: not a readable eval result ({exc})",
                        hint="delete or move the file") from exc


def load_results(folder: Path | str) -> tuple[list[EvalResult], list[str]]:
    """Every result in ``folder``, oldest first, and the problems met (unreadable files)."""
    folder = Path(folder)
    out: list[EvalResult] = []
    problems: list[str] = []
    for path in sorted(folder.glob("*.json")) if folder.exists() else []:
        try:
            out.append(load_result(path))
        except EvalError as exc:
            problems.append(exc.message)
            log.warning(exc.message)
    out.sort(key=lambda r: r.started)
    return out, problems
