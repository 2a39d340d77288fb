"""``whetstone traces import``: what it prints. The command itself is in ``traces.py``; the
readers are ``whetstone.library_store.trace_import`` (docs/observability.md)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from whetstone.engine.commands.common import EXIT_PARTIAL, console, emit_json
from whetstone.engine.commands.display import short
from whetstone.engine.evaluation.scorers import get_scorer
from whetstone.engine.evaluation.tasks import TaskRecord
from whetstone.engine.types import Trace
from whetstone.library_store.trace_import import ImportReport, import_traces
from whetstone.library_store.traces import TraceStore

SHOWN_SKIPS = 20  # skipped records listed one per line; the rest are counted


class ScoreOnImport:
    """What ``--scorer`` does to each imported trace with an expected answer (a label): the
    scorer is recorded as the trace's (``meta["scorer"]``: the gate scores its task with it),
    and a trace that came without a score gets this scorer's. A score the source gave (a
    reviewer's, a verdict) is kept."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.scorer = get_scorer(name)
        self.scored = 0
        self.labelled = 0

    def __call__(self, trace: Trace) -> Trace:
        if trace.label is None:
            return trace
        self.labelled += 1
        meta = {**trace.meta, "scorer": self.name}
        if trace.score is not None:
            return trace.with_(meta=meta)
        task = TaskRecord(id=str(trace.meta.get("task_id") or trace.id), question=trace.task,
                          expected=trace.label, scorer="exact")
        self.scored += 1
        return trace.with_(meta=meta, score=self.scorer(trace, task))

    def note(self) -> str:
        return (f"scorer {self.name}: {self.labelled} trace(s) with an expected answer record "
                f"it for the gate; {self.scored} without a score were scored by it")


def run_import(store: TraceStore, files: Sequence[Path], fmt: str, phoenix: str | None,
               project: str | None, as_json: bool, scorer: str | None = None) -> None:
    """Import, print the report, and exit 11 (``EXIT_PARTIAL``) when records were skipped.
    ``scorer``: ``ScoreOnImport``."""
    scoring = ScoreOnImport(scorer) if scorer is not None else None
    report = import_traces(store, files, fmt=fmt, phoenix=phoenix, project=project,
                           prepare=scoring)
    if scoring is not None:
        report.notes.append(scoring.note())
    if as_json:
        emit_json({**report.to_dict(), **({"scorer": {
            "name": scoring.name, "labelled": scoring.labelled, "scored": scoring.scored}}
            if scoring is not None else {})})
    else:
        print_report(report)
    if report.skipped:
        sys.exit(EXIT_PARTIAL)


def print_report(report: ImportReport) -> None:
    """One line of counts, then each skipped record with why, and what the caps did."""
    out = console()
    err = console(stderr=True)
    sources = ", ".join(f"{s} ({f})" for s, f in report.sources.items())
    out.print(f"imported {len(report.imported)} trace(s) from {sources}; "
              f"{report.duplicates} already there; {len(report.skipped)} skipped",
              markup=False, soft_wrap=True)
    for line in report.skipped[:SHOWN_SKIPS]:
        err.print(f"skipped: {short(line, 300)}", markup=False, soft_wrap=True)
    if len(report.skipped) > SHOWN_SKIPS:
        err.print(f"... and {len(report.skipped) - SHOWN_SKIPS} more (--json lists them all)",
                  markup=False)
    if report.truncated:
        out.print(f"{report.truncated} record(s) were cut to the store's record-size cap "
                  "(library.json trace_max_record_bytes)", markup=False)
    if report.evicted or report.kept < len(report.imported):
        out.print(f"the store's size cap (trace_max_bytes) dropped {report.evicted} trace(s) "
                  f"it held before the import and {len(report.imported) - report.kept} of the "
                  f"imported ones: {report.kept} of the {len(report.imported)} imported are "
                  "stored (raise trace_max_bytes in library.json, or import less)",
                  markup=False, soft_wrap=True)
    for note in report.notes:
        err.print(f"note: {note}", markup=False, soft_wrap=True)
